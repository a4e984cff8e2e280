//! Chaos-test machinery: a fleet of real `redeliver run` processes that can
//! be killed with SIGKILL and restarted, a flaky receiver, a pipelined
//! preload, and the final accounting (delivered, dead, lost, duplicates).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use serde_json::json;

use redeliver::delay::DelayBackend;

use super::app::{command_for, TestApp};
use super::harness::{sigterm, wait_exit};
use super::receiver::{Receiver, Recorded, Reply};
use super::{ctl, ctl_output};

/// A private node for the chaos scenarios (one at a time, see `tests/chaos.rs`).
pub const PORT: u16 = 5689;
/// How long the receiver sits on a "hanging" request: past the worker's timeout.
pub const HANG: Duration = Duration::from_secs(3);

/// 30% answer 500, 5% hang past the timeout (then 504), the rest 200;
/// `/gone` answers 410, which dead-letters at once.
pub fn flaky(r: &Recorded) -> Reply {
    if r.path == "/gone" {
        return Reply::status(410);
    }
    let x: f64 = rand::random();
    if x < 0.30 {
        Reply::status(500)
    } else if x < 0.35 {
        Reply::status(504).delay(HANG)
    } else {
        Reply::status(200)
    }
}

/// Whether [`load`] sent id `id` to `/gone` (every 100th).
pub fn is_gone(id: &str) -> bool {
    id.trim_start_matches("c-")
        .parse::<usize>()
        .is_ok_and(|i| i % 100 == 99)
}

/// Notifications with ids `c-<i>` for `i` in `range`; every 100th targets `/gone`.
pub fn load(rx: &Receiver, range: std::ops::Range<usize>) -> Vec<(String, serde_json::Value)> {
    range
        .map(|i| {
            let id = format!("c-{i}");
            let path = if i % 100 == 99 { "/gone" } else { "/" };
            let body = json!({"url": rx.url(path), "id": id, "body": {"i": i}});
            (id, body)
        })
        .collect()
}

/// Publishes the whole load to the intake exchange as any AMQP producer
/// would, pipelined, and waits for every confirm.
pub async fn preload(app: &TestApp, load: &[(String, serde_json::Value)]) {
    let b = app.broker();
    let conn = b.url.connect("chaos preload").await.unwrap();
    let t = redeliver::delay::declare_topology(&b, &conn).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::with_capacity(load.len());
    for (_, body) in load {
        let props = BasicProperties::default().with_delivery_mode(2);
        let payload = body.to_string();
        let c = ch
            .basic_publish(
                t.intake.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                payload.as_bytes(),
                props,
            )
            .await
            .unwrap();
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack(), "preload confirmed");
    }
    let _ = conn.close(200, "".into()).await;
}

/// Real worker processes; their logs go to `target/chaos/PREFIX/`.
pub struct Fleet {
    url: String,
    prefix: String,
    backend: DelayBackend,
    args: Vec<String>,
    procs: Vec<Child>,
    logs: PathBuf,
    spawned: usize,
    pub kills: usize,
}

impl Fleet {
    /// `n` workers of `app`'s prefix (`redeliver run ARGS`).
    pub fn start(app: &TestApp, n: usize, args: &[&str]) -> Fleet {
        let logs = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/chaos")
            .join(&app.prefix);
        std::fs::create_dir_all(&logs).unwrap();
        let mut f = Fleet {
            url: app.url.clone(),
            prefix: app.prefix.clone(),
            backend: app.backend,
            args: args.iter().map(|s| s.to_string()).collect(),
            procs: vec![],
            logs,
            spawned: 0,
            kills: 0,
        };
        for _ in 0..n {
            let c = f.spawn();
            f.procs.push(c);
        }
        f
    }

    fn spawn(&mut self) -> Child {
        self.spawned += 1;
        let log = File::create(self.logs.join(format!("worker-{}.log", self.spawned))).unwrap();
        command_for(&self.url, &self.prefix, self.backend)
            .arg("run")
            .args(&self.args)
            // `CHAOS_LOG` to see more (deferrals are logged at debug).
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            // `CHAOS_PARK_AFTER` (a duration) to run a scenario with
            // `--breaker-park-after` on; off, the default, otherwise.
            .env(
                "REDELIVER_BREAKER_PARK_AFTER",
                std::env::var("CHAOS_PARK_AFTER").unwrap_or_else(|_| "off".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn redeliver run")
    }

    /// SIGKILL worker `i` (no chance to ack, nack or close), then start a
    /// fresh one in its place.
    pub fn kill9_and_restart(&mut self, i: usize) {
        let c = &mut self.procs[i];
        c.kill().expect("kill -9 a worker");
        let _ = c.wait();
        self.kills += 1;
        self.procs[i] = self.spawn();
    }

    /// True while every worker process is still running.
    pub fn all_running(&mut self) -> bool {
        self.procs
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM to all, then waits (graceful shutdown), returning the statuses.
    pub fn stop(&mut self) -> Vec<ExitStatus> {
        self.procs.iter().for_each(sigterm);
        let out = self
            .procs
            .iter_mut()
            .map(|c| wait_exit(c, Duration::from_secs(30)))
            .collect();
        self.procs.clear();
        out
    }

    /// Lines across all worker logs that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> usize {
        let mut n = 0;
        for e in std::fs::read_dir(&self.logs).unwrap().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            n += text.lines().filter(|l| l.contains(needle)).count();
        }
        n
    }

    pub fn logs(&self) -> &PathBuf {
        &self.logs
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `rabbitmqctl eval EXPR` on the chaos node, parsed as an integer.
pub fn eval_int(expr: &str) -> Option<i64> {
    eval_int_on(PORT, expr)
}

/// `rabbitmqctl eval EXPR` on the node on `port`, parsed as an integer.
pub fn eval_int_on(port: u16, expr: &str) -> Option<i64> {
    let out = ctl_output(port, &["rabbitmqctl", "eval", expr]);
    out.trim().parse().ok()
}

/// Ready + unacked messages in a queue of the node on `port` (of its
/// cluster, when it has one).
pub fn queue_messages_on(port: u16, queue: &str) -> Option<u64> {
    let out = ctl_output(
        port,
        &["rabbitmqctl", "-q", "list_queues", "name", "messages"],
    );
    // `<prefix>.work` also counts its lanes, `<prefix>.work.<k>`.
    let lanes = format!("{queue}.");
    let counts = out.lines().filter_map(|l| {
        let mut it = l.split_whitespace();
        let name = it.next()?;
        let ours = name == queue || (queue.ends_with(".work") && name.starts_with(&lanes));
        ours.then(|| it.next()?.parse::<u64>().ok())?
    });
    counts.fold(None, |sum, n| Some(sum.unwrap_or(0) + n))
}

/// Messages the stand-in re-routed right after its last start (an upper
/// bound on the duplicates the restart caused on the delayed path).
pub fn overdue_at_start() -> u64 {
    eval_int("redeliver_delayed_store:overdue_at_start().").unwrap_or(0) as u64
}

/// Where every notification ended up.
#[derive(Debug, Default)]
pub struct Tally {
    pub delivered: HashSet<String>,
    pub dead: HashMap<String, String>,
    /// Successful deliveries beyond the first, per id, plus dead letters
    /// beyond the first (an id dead-lettered twice is a duplicate too).
    pub duplicates: usize,
    pub attempts: usize,
    pub lost: Vec<String>,
}

impl Tally {
    fn from_receivers(rxs: &[&Receiver]) -> Tally {
        let mut t = Tally::default();
        for r in rxs.iter().flat_map(|rx| rx.requests()) {
            t.attempts += 1;
            if r.reply == 200 && !t.delivered.insert(r.id()) {
                t.duplicates += 1;
            }
        }
        t
    }

    fn accounted(&self, ids: &[String]) -> usize {
        ids.iter()
            .filter(|id| self.delivered.contains(*id) || self.dead.contains_key(*id))
            .count()
    }

    /// `/gone` answers 410: those ids ([`is_gone`]), and only those, end
    /// as permanent-status dead letters.
    pub fn assert_only_gone_are_permanent(&self) {
        for (id, reason) in &self.dead {
            assert_eq!(
                reason == "permanent-status",
                is_gone(id),
                "{id} dead as {reason}"
            );
        }
    }
}

/// Waits until every id is delivered or dead, and the work queue and the
/// stand-in's store are empty twice in a row (so late duplicates are in).
/// Returns the tally; `lost` holds the ids that never arrived anywhere.
///
/// `workers`: how many run. Each keeps one delay probe in the stand-in's
/// store for 1 s of every 5 (`--delay-probe-every`), so once every id is
/// accounted for and the lanes are empty, up to that many held messages
/// are probes, not work. (Asking for none held twice in a row, with a
/// `rabbitmqctl` VM booted per read, ran the hanging scenario to its 240 s
/// deadline on a loaded machine: 3 probes held up to 3 s of every 5.)
pub async fn settle(
    app: &TestApp,
    ids: &[String],
    rxs: &[&Receiver],
    within: Duration,
    workers: usize,
) -> Tally {
    let probes = i64::try_from(workers).unwrap_or(i64::MAX);
    settle_among(app, ids, rxs, within, &[PORT], (None, probes)).await
}

/// [`settle`] on the nodes on `ports`, one cluster: the work queue is
/// counted through the first, the stand-in's stores of all of them. With
/// `idle`, it also ends once nothing is queued or held and the receivers
/// got no request for that long: where ids can be lost, it need not wait
/// for `within`.
pub async fn settle_on(
    app: &TestApp,
    ids: &[String],
    rxs: &[&Receiver],
    within: Duration,
    ports: &[u16],
    idle: Option<Duration>,
) -> Tally {
    settle_among(app, ids, rxs, within, ports, (idle, 0)).await
}

/// [`settle_on`], with `probes` held messages taken for the workers' delay
/// probes (see [`settle`]).
async fn settle_among(
    app: &TestApp,
    ids: &[String],
    rxs: &[&Receiver],
    within: Duration,
    ports: &[u16],
    (idle, probes): (Option<Duration>, i64),
) -> Tally {
    let deadline = Instant::now() + within;
    let work = app.name("work");
    let mut dead: HashMap<String, String> = HashMap::new();
    let mut dead_twice = 0;
    let mut quiet = 0;
    loop {
        for d in app.drain_dead().await {
            let id = d.str(redeliver::message::state::H_ID).unwrap_or_default();
            let reason = d
                .str(redeliver::message::state::H_DEAD_REASON)
                .unwrap_or_default();
            if dead.insert(id, reason).is_some() {
                dead_twice += 1;
            }
        }
        let mut t = Tally::from_receivers(rxs);
        t.dead = dead.clone();
        t.duplicates += dead_twice;
        let last_request = rxs
            .iter()
            .filter_map(|r| r.requests().last().map(|q| q.at))
            .max();
        let idle_now = idle.is_some_and(|i| last_request.is_none_or(|at| at.elapsed() >= i));
        let accounted = t.accounted(ids) == ids.len() || idle_now;
        let past = Instant::now() > deadline;
        // The broker is asked only once the receivers say it may be over:
        // each ask boots an Erlang VM per node (`rabbitmqctl`), and asked
        // every second they took a core of this two-core machine from the
        // tests beside.
        let (queued, held) = if accounted || past {
            stores(&work, ports).await
        } else {
            (None, None)
        };
        let done = accounted && queued == Some(0) && held.is_some_and(|h| h <= probes);
        quiet = if done { quiet + 1 } else { 0 };
        if quiet >= 2 || past {
            t.lost = ids
                .iter()
                .filter(|id| !t.delivered.contains(*id) && !t.dead.contains_key(*id))
                .cloned()
                .collect();
            if quiet < 2 {
                println!("not settled: queued {queued:?}, held {held:?}");
            }
            return t;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Ready and unacked messages in `work` (through the first node) and the
/// stand-in's held retries on every node.
async fn stores(work: &str, ports: &[u16]) -> (Option<u64>, Option<i64>) {
    let (w, ports) = (work.to_string(), ports.to_vec());
    tokio::task::spawn_blocking(move || {
        let held = ports
            .iter()
            .map(|p| eval_int_on(*p, "redeliver_delayed_store:held_count()."));
        (queue_messages_on(ports[0], &w), held.sum::<Option<i64>>())
    })
    .await
    .unwrap()
}

/// Brings the chaos node up (fresh prefix per scenario keeps them apart).
pub fn node_up() -> String {
    ctl(PORT, &["up"])
}
