//! Phase 11: duplicate deliveries under crashes, with and without the
//! retry settle.
//!
//! A failed delivery's retry copy is published (with a publisher confirm)
//! before its original is acked. With `--retry-settle 3s` (the plugin
//! backend's default) the original stays unacked 3 s after that confirm,
//! because the upstream delayed-message plugin confirms before it writes to
//! disk; a crash inside those 3 s makes
//! the broker deliver the original again, a duplicate the endpoint sees.
//! With `0s` the window is only the confirm's round trip. Each run preloads
//! notifications that fail once and then succeed, crashes once while the
//! retry traffic flows (a worker `kill -9`, or a restart of the local test
//! node), waits until every notification succeeded, and counts what the
//! sink received beyond one failed first attempt and one success per id.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::load;
use super::options::Phase;
use super::phases::Bench;
use super::procs::WorkerProc;
use super::sink::{Mode, PerId, Sink};
use crate::ops::local_node;

/// The crash comes once the sink failed this share of the run's first
/// attempts: originals are failing, their retry copies are being
/// published and confirmed, and with a settle the recent ones are held, as
/// in the steady retry traffic of a failing endpoint. Half, not less: at
/// [`PACE`] the run has then lasted about as long as the 3 s settle, so what is
/// held is the settle's worth, not all the run has seen so far.
const CRASH_AT: f64 = 0.5;

/// After every notification succeeded, the run ends only once the sink has
/// had no request for this long: duplicates still travelling (a
/// redelivered original's own retry, 1 ms later) are counted too.
const QUIET: Duration = Duration::from_millis(1500);

/// How long the sink takes to answer, so that a run lasts long enough
/// for a broker restart (whose clean stop takes seconds before it closes
/// connections) to land in it: at the default concurrency of 32, at most 800 a
/// second. The duplicates a settle causes grow with this pace.
const PACE: Duration = Duration::from_millis(40);

/// The settles compared: the plugin backend's default (3 s, from the
/// confirm-window phase), the 2 s default before it, and none.
fn settles() -> [String; 3] {
    [super::options::plugin_settle(), "2s".into(), "0s".into()]
}

/// What goes wrong mid-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    /// SIGKILL of the only worker; a fresh one takes over.
    WorkerKill,
    /// `tests/broker/ctl restart` of the local node; the worker reconnects.
    BrokerRestart,
}

impl Crash {
    fn label(self) -> &'static str {
        match self {
            Crash::WorkerKill => "worker kill -9",
            Crash::BrokerRestart => "broker restart",
        }
    }
}

/// Requests beyond one failed first attempt and one success per id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Duplicates {
    /// The same id's attempt 1 seen again (an original delivered twice).
    first: u64,
    /// More than one 200 for the same id.
    ok: u64,
}

impl Duplicates {
    fn total(self) -> u64 {
        self.first + self.ok
    }
}

impl Bench {
    /// Every crash at every settle; the broker-restart rows only where the
    /// bench may restart the broker (see [`Self::restart_refused`]).
    pub(super) async fn crash(&mut self) -> anyhow::Result<()> {
        let n = self.sizes.crash_n;
        let refused = self.restart_refused();
        for crash in [Crash::WorkerKill, Crash::BrokerRestart] {
            if let (Crash::BrokerRestart, Some(why)) = (crash, refused) {
                writeln!(std::io::stderr(), "bench: no broker-restart rows: {why}")?;
                for settle in settles() {
                    let name = format!("duplicates, {}, settle {settle}", crash.label());
                    self.push(Phase::Crash, name, None, "msg");
                }
                continue;
            }
            let mut totals = vec![];
            let [default, ..] = settles();
            for settle in settles() {
                let d = self.crash_run(crash, &settle, n).await?;
                self.push_duplicates(crash, &settle, n, d);
                totals.push(d.total() as f64);
            }
            // What the settle costs in duplicates, the figure to choose by.
            // The first settle's (the default's) against none, the last.
            let added = totals.first().zip(totals.last()).map(|(s, z)| s - z);
            let name = format!("duplicates the {default} settle adds, {}", crash.label());
            self.push(Phase::Crash, name, added, "msg");
        }
        Ok(())
    }

    /// Why the broker-restart rows are left out, if they are. A restart
    /// needs `tests/broker/ctl` and the node it runs; under `--quick` (CI's
    /// `tests/bench.rs`) that node is shared with tests running beside the
    /// bench, which a restart would break.
    pub(super) fn restart_refused(&self) -> Option<&'static str> {
        if self.opts.quick {
            Some("--quick runs on the local test node shared with other tests")
        } else if self.opts.broker_pid.is_none() {
            Some("the broker is not this checkout's local test node (tests/broker/ctl)")
        } else {
            None
        }
    }

    fn push_duplicates(&mut self, crash: Crash, settle: &str, n: usize, d: Duplicates) {
        let p = Phase::Crash;
        let run = format!("{}, settle {settle}", crash.label());
        self.push(
            p,
            format!("duplicates, {run}"),
            Some(d.total() as f64),
            "msg",
        );
        let name = format!("duplicate first attempts, {run}");
        self.push(p, name, Some(d.first as f64), "msg");
        let name = format!("duplicate successes, {run}");
        self.push(p, name, Some(d.ok as f64), "msg");
        let share = 100.0 * d.total() as f64 / n as f64;
        self.push(p, format!("duplicates ÷ n ({n}), {run}"), Some(share), "%");
    }

    /// One run under a fresh prefix, deleted afterwards also when a step
    /// failed; fails when a notification never succeeded.
    async fn crash_run(
        &mut self,
        crash: Crash,
        settle: &str,
        n: usize,
    ) -> anyhow::Result<Duplicates> {
        self.sink.reset(Mode {
            fail_first: true,
            per_id: true,
            latency: PACE,
            ..Mode::default()
        });
        let prefix = self.prefix("crash");
        let items = self.items(n, "/ok", |_| None, |i, _| format!(r#"{{"i":{i}}}"#));
        let loaded = load::preload(&self.conn, &self.opts.broker, &prefix, items).await;
        let ran = match loaded {
            Ok(_) => self.crash_drain(&prefix, crash, settle, n).await,
            Err(e) => Err(e),
        };
        load::remove(&self.conn, &prefix).await;
        ran?;
        duplicates(&self.sink.per_id(), n)
            .with_context(|| format!("{}, settle {settle}", crash.label()))
    }

    /// The worker's arguments: as in the retry phase, the default flags
    /// (breaker included: a quick 500 never opens it), a 1 ms schedule and
    /// `settle`; the one endpoint earns the whole concurrency, so [`PACE`]
    /// sets the rate.
    fn crash_args(concurrency: usize, settle: &str) -> Vec<String> {
        let mut args = Self::concurrency_args(concurrency);
        for (k, v) in [("--schedule", "1ms"), ("--retry-settle", settle)] {
            args.extend([k.to_string(), v.to_string()]);
        }
        args
    }

    /// Runs a worker on `prefix`, crashes once, and waits until every one
    /// of the `n` notifications succeeded and the sink went quiet. Says on
    /// stderr how far the run was when the crash came.
    async fn crash_drain(
        &mut self,
        prefix: &str,
        crash: Crash,
        settle: &str,
        n: usize,
    ) -> anyhow::Result<()> {
        let args = Self::crash_args(self.sizes.concurrency, settle);
        let within = Duration::from_secs(120) + PACE * n as u32 / 4;
        let deadline = Instant::now() + within;
        let mut worker = self.spawner.spawn(prefix, &args, false)?;
        let at = (n as f64 * CRASH_AT).ceil() as u64;
        wait(&self.sink, &mut worker, deadline, |s| s.seen().failed >= at).await?;
        let crashed_at = match crash {
            Crash::WorkerKill => {
                let r = requests(&self.sink);
                worker.kill().await?;
                worker = self.spawner.spawn(prefix, &args, false)?;
                r
            }
            Crash::BrokerRestart => self.restart_broker().await?,
        };
        let run = format!("{}, settle {settle}", crash.label());
        writeln!(
            std::io::stderr(),
            "bench: {run}: the crash came after {crashed_at} of {} requests",
            2 * n
        )?;
        wait(&self.sink, &mut worker, deadline, |s| {
            s.ids_ok() >= n as u64
        })
        .await?;
        quiet(&self.sink).await;
        worker.stop().await?;
        Ok(())
    }

    /// Restarts the local node, then reconnects the bench's own connection
    /// and reads the node's new process id. Returns the requests the sink
    /// had received when the node closed the bench's connection: `ctl
    /// restart` takes seconds to reach that point, so the moment it
    /// started would say little.
    async fn restart_broker(&mut self) -> anyhow::Result<u64> {
        let (conn, sink) = (&self.conn, &self.sink);
        let closed = async {
            while conn.status().connected() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            requests(sink)
        };
        let (restarted, at) = tokio::join!(local_node::restart(), closed);
        restarted?;
        let url = &self.opts.broker.url;
        self.conn = url.connect("redeliver bench").await.with_context(|| {
            format!("cannot reconnect to the broker at {url} after its restart")
        })?;
        self.opts.broker_pid = local_node::pid();
        Ok(at)
    }
}

/// Requests the sink received so far, whatever their answer.
fn requests(sink: &Sink) -> u64 {
    let s = sink.seen();
    s.ok + s.failed
}

/// Polls the sink until `done`; fails when the worker exited on its own
/// (it must survive a broker restart) or `deadline` passed.
async fn wait(
    sink: &Sink,
    worker: &mut WorkerProc,
    deadline: Instant,
    done: impl Fn(&Sink) -> bool,
) -> anyhow::Result<()> {
    while !done(sink) {
        if let Some(status) = worker.exited() {
            anyhow::bail!("the worker exited with {status}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out: only {} distinct notifications had succeeded",
            sink.ids_ok()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Waits until the sink has received no request for [`QUIET`].
async fn quiet(sink: &Sink) {
    let mut last = (requests(sink), Instant::now());
    while last.1.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = requests(sink);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
}

/// The duplicates the sink counted per id; an error naming the count when
/// a notification never succeeded (a loss, which no crash may cause).
fn duplicates(ids: &HashMap<String, PerId>, n: usize) -> anyhow::Result<Duplicates> {
    let succeeded = ids.values().filter(|c| c.ok > 0).count();
    anyhow::ensure!(
        succeeded >= n,
        "lost: only {succeeded} of {n} notifications ever succeeded"
    );
    Ok(ids.values().fold(Duplicates::default(), |d, c| Duplicates {
        first: d.first + u64::from(c.first.saturating_sub(1)),
        ok: d.ok + u64::from(c.ok.saturating_sub(1)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_settle_is_compared_first_as_a_flag_value() {
        let [default, ..] = settles();
        let parsed = humantime::parse_duration(&default).unwrap();
        assert_eq!(parsed, crate::config::DEFAULT_RETRY_SETTLE, "{default}");
    }

    #[test]
    fn crash_args_set_the_settle_and_the_retry_path() {
        let args = Bench::crash_args(32, "2s").join(" ");
        assert!(args.contains("--retry-settle 2s"), "{args}");
        assert!(args.contains("--schedule 1ms"), "{args}");
        assert!(
            !args.contains("--breaker-failures"),
            "the default breaker: {args}"
        );
        assert!(
            !args.contains("--endpoint-concurrency"),
            "the defaults: {args}"
        );
    }

    fn per_id(counts: &[(u32, u32)]) -> HashMap<String, PerId> {
        let each = counts.iter().enumerate();
        each.map(|(i, &(first, ok))| (format!("b-{i}"), PerId { first, ok }))
            .collect()
    }

    #[test]
    fn duplicates_are_requests_beyond_one_failure_and_one_success() {
        let d = duplicates(&per_id(&[(1, 1), (2, 2), (2, 1), (1, 3)]), 4).unwrap();
        assert_eq!(d, Duplicates { first: 2, ok: 3 });
        assert_eq!(d.total(), 5);
    }

    #[test]
    fn a_notification_that_never_succeeded_is_a_loss() {
        let e = duplicates(&per_id(&[(1, 1), (1, 0)]), 2).unwrap_err();
        assert!(e.to_string().contains("only 1 of 2"), "{e}");
        let e = duplicates(&per_id(&[(1, 1)]), 2).unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
    }
}
