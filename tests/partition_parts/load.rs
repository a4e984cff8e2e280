//! The load under the nemesis: a producer that runs `redeliver publish`
//! with a batch of 100 every second through the URL list (each batch its
//! own process, as a user's cron or script would), a receiver on the
//! bridge that fails 30% of attempts, and `redeliver run` workers, each in
//! a namespace of its own, on default flags.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use redeliver::delay::DelayBackend;

use crate::common::receiver::{Recorded, Reply};

/// Notifications per `publish`.
pub const BATCH: usize = 100;
/// The retry schedule every notification carries (no jitter), so the
/// checker knows when each retry is due; past its end the last repeats.
pub const SCHEDULE: [u64; 3] = [1, 2, 3];
/// Enough that a 30% failure rate never exhausts one (0.3^25).
pub const MAX_ATTEMPTS: u32 = 25;
/// `publish`'s default `--confirm-timeout`: no wait of a batch may be
/// longer than that and a reconnect (a pause of at most
/// [`redeliver::ops::produce::MAX_BACKOFF`], and a connect, itself bounded
/// by the same 10 s).
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// How long retry `attempt` (the attempt that failed) waits.
pub fn delay_after(attempt: usize) -> Duration {
    let i = attempt.clamp(1, SCHEDULE.len()) - 1;
    Duration::from_secs(SCHEDULE[i])
}

/// `/gone` answers 410 (a permanent failure: dead-lettered at once); of
/// the rest, 30% answer 500 and the others 200.
pub fn flaky(r: &Recorded) -> Reply {
    if r.path == "/gone" {
        return Reply::status(410);
    }
    if rand::random::<f64>() < 0.30 {
        Reply::status(500)
    } else {
        Reply::status(200)
    }
}

/// Whether id `b{batch}-{i}` targets `/gone` (every 100th).
pub fn is_gone(id: &str) -> bool {
    id.ends_with("-99")
}

/// One `publish` run.
#[derive(Debug)]
pub struct Batch {
    pub n: usize,
    pub started: Instant,
    pub took: Duration,
    /// The longest stretch it waited without confirming or moving on to
    /// another node: between its start, each of its log lines (each says
    /// it moved on) and its end.
    pub longest_wait: Duration,
    pub exit_ok: bool,
    /// The ids it printed: confirmed.
    pub confirmed: Vec<String>,
    pub stderr: String,
}

/// Runs a batch a second until stopped.
pub struct Producer {
    stop: Arc<AtomicBool>,
    runner: JoinHandle<Vec<JoinHandle<Batch>>>,
}

impl Producer {
    pub fn start(urls: &str, prefix: &str, backend: DelayBackend, rx: &str, dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, urls, prefix, rx, dir) = (
            stop.clone(),
            urls.to_string(),
            prefix.to_string(),
            rx.to_string(),
            dir.to_path_buf(),
        );
        let runner = std::thread::spawn(move || {
            let mut batches = vec![];
            let start = Instant::now();
            let mut n = 0;
            while !s.load(Ordering::SeqCst) {
                let cmd = publish_command(&urls, &prefix, backend);
                let file = write_batch(&dir, n, &rx);
                batches.push(std::thread::spawn(move || run_batch(n, cmd, &file)));
                n += 1;
                // One a second, on the second (a slow batch does not shift the rest).
                let next = start + Duration::from_secs(n as u64);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            batches
        });
        Producer { stop, runner }
    }

    /// Starts no more batches, and waits for those running.
    pub fn stop(self) -> Vec<Batch> {
        self.stop.store(true, Ordering::SeqCst);
        let handles = self.runner.join().expect("producer thread");
        handles
            .into_iter()
            .map(|h| h.join().expect("batch thread"))
            .collect()
    }
}

fn publish_command(urls: &str, prefix: &str, backend: DelayBackend) -> Command {
    let mut c = crate::common::redeliver_command();
    c.args(["--amqp-url", urls, "--prefix", prefix])
        .args(["--delay-backend", backend.as_str()])
        // Its warnings mark each move to another node (`longest_wait`).
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1");
    c
}

fn write_batch(dir: &Path, n: usize, rx: &str) -> PathBuf {
    let path = dir.join(format!("batch-{n}.jsonl"));
    let mut text = String::new();
    for i in 0..BATCH {
        let id = format!("b{n}-{i}");
        let url = if is_gone(&id) {
            format!("{rx}/gone")
        } else {
            format!("{rx}/")
        };
        let schedule: Vec<String> = SCHEDULE.iter().map(|s| format!("{s}s")).collect();
        let line = json!({"url": url, "id": id, "body": {"batch": n, "i": i},
            "schedule": schedule, "max_attempts": MAX_ATTEMPTS});
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&path, text).expect("write a batch file");
    path
}

/// Runs one `publish --file`, killed after two minutes (a hang the checker
/// then reports: it took that long and did not exit cleanly).
fn run_batch(n: usize, mut cmd: Command, file: &Path) -> Batch {
    let (out, err) = (file.with_extension("out"), file.with_extension("err"));
    let started = Instant::now();
    let wall = SystemTime::now();
    let mut child: Child = cmd
        .arg("publish")
        .arg("--file")
        .arg(file)
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("batch stdout"))
        .stderr(File::create(&err).expect("batch stderr"))
        .spawn()
        .expect("spawn redeliver publish");
    let exit_ok = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st.success();
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let confirmed = std::fs::read_to_string(&out)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    Batch {
        n,
        started,
        took,
        longest_wait: longest_wait(&stderr, wall, wall + took),
        exit_ok,
        confirmed,
        stderr,
    }
}

/// The longest gap between `start`, the times of the JSON log lines in
/// `stderr` and `end`.
pub fn longest_wait(stderr: &str, start: SystemTime, end: SystemTime) -> Duration {
    let mut marks = vec![start];
    marks.extend(crate::common::cluster::log_lines(stderr).map(|l| l.at));
    marks.push(end);
    marks
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap_or_default())
        .max()
        .unwrap_or_default()
}

/// `redeliver run` processes, worker `k` in namespace `w{k}`, on default
/// flags; each logs (JSON) to `DIR/worker-K.log`.
pub struct Workers {
    procs: Mutex<Vec<Child>>,
    pub logs: PathBuf,
}

impl Workers {
    pub fn start(n: usize, urls: &str, prefix: &str, backend: DelayBackend, dir: &Path) -> Self {
        let procs = (1..=n)
            .map(|k| {
                let log = File::create(dir.join(format!("worker-{k}.log"))).expect("worker log");
                let mut c = Command::new(format!(
                    "{}/tests/partition/net",
                    env!("CARGO_MANIFEST_DIR")
                ));
                c.args(["exec", &format!("w{k}"), env!("CARGO_BIN_EXE_redeliver")])
                    .args(["--amqp-url", urls, "--prefix", prefix])
                    .args(["--delay-backend", backend.as_str(), "run"]);
                for (key, _) in std::env::vars_os() {
                    if key.to_string_lossy().starts_with("REDELIVER_") {
                        c.env_remove(key);
                    }
                }
                c.env("RUST_LOG", "info")
                    .env("NO_COLOR", "1")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("spawn a worker in its namespace")
            })
            .collect();
        Workers {
            procs: Mutex::new(procs),
            logs: dir.to_path_buf(),
        }
    }

    /// The workers' log lines that mention `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let mut out = vec![];
        for e in std::fs::read_dir(&self.logs)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("worker-") {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            out.extend(
                text.lines()
                    .filter(|l| l.contains(needle))
                    .map(|l| format!("{name}: {l}")),
            );
        }
        out
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        for c in procs.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
