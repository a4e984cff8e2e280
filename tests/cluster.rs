//! On the local three-node cluster (`tests/broker/ctl cluster up`, ports
//! `REDELIVER_TEST_CLUSTER_PORT` and the two after it): three real worker
//! processes, each given the whole URL list, deliver, retry and
//! dead-letter as on one node, over replicated queues; and the node-loss
//! scenario: 5,000 notifications to a flaky receiver while the node that
//! leads the work queue is killed with `kill -9` and brought back, then
//! another (topped up to 1,500 unfinished before it, on a machine slow
//! enough to have finished them). On the cascade, every notification must
//! end delivered or dead-lettered. On the plugin backend, a retry that falls due while the
//! work queue has no leader is lost (the plugin routes due messages once,
//! untracked, as upstream does): every lost one must have fallen due in
//! such a window, and every other one must arrive. The figures (lost,
//! duplicates, how long deliveries paused, how long until every worker
//! consumed again) are printed:
//! `REDELIVER_TEST_RABBITMQ=4 cargo test --test cluster -- --nocapture`.
//! And 5,000 dead letters keep their order through `dlq` walks read
//! through a node that does not lead the dead-letter queue.
//!
//! On RabbitMQ 4.x only (`tests/run` runs them in the 4.3.6 pass): 3.10.8's
//! quorum queues strand the deliveries of a consumer cancelled by a lane
//! rotation once its node is killed (docs/cluster.md, "When a node dies").
//! The tests share the cluster and run one at a time (a node kill would
//! disturb the others); the cluster goes down after the last one.

mod common;

use analysis::{
    assert_none_lost, dead_letter_order_is_kept, duplicates_away_from_kills,
    lost_outside_elections, replicated_everywhere, report,
};

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use common::chaos::{flaky, load, preload, settle_on, Fleet, Tally};
use common::cluster;
use common::dead_letters::ids_of;
use common::harness::{let_quorum_queues_age, stdout, wait_until_async};
use common::receiver::{Receiver, Reply};
use common::TestApp;
use kills::{two_leader_kills, Kill};
use redeliver::delay::DelayBackend;
use serde_json::Value;

const WORKERS: usize = 3;
/// Per worker: with the receiver's pace, about 170 attempts/s in all, so
/// the load (about 7,700 attempts) lasts through both node kills.
const CONCURRENCY: usize = 4;
/// How long the receiver takes for each request.
const PACE: Duration = Duration::from_millis(20);
/// How long a killed node stays down.
const OUTAGE: Duration = Duration::from_secs(8);
/// After a kill, how long a due plugin retry may be lost: until the work
/// queue has a new leader that the routing node knows (measured: deliveries
/// flow again within about 1-2 s; generous, to stay a bound).
const ELECTION: Duration = Duration::from_secs(10);
/// How long before a kill an attempt may start a duplicate. The stand-in
/// forgets a routed message 2-3 s after routing it, and a node killed
/// inside that window routes it again after its restart: 3.5 s, after the
/// longest delay (1 s), with slack for a busy machine's ack and confirm lag.
const BEFORE_KILL: Duration = Duration::from_millis(5_000);

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static FINISHED: AtomicUsize = AtomicUsize::new(0);
/// The tests in this file: the last to finish takes the cluster down.
const TESTS: usize = 6;

/// Takes the cluster down when the last test ends, passed or failed.
struct ClusterGuard;

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if common::last_to_finish("cluster", TESTS, &FINISHED) {
            let _ = std::panic::catch_unwind(|| cluster::ctl(&["down"]));
        }
    }
}

async fn cluster_up() -> String {
    tokio::task::spawn_blocking(cluster::up).await.unwrap()
}

/// `status --json` read through the management API of node `via`.
fn status(app: &TestApp, via: usize) -> Value {
    let mgmt = cluster::management_url(via);
    let out = app.cli(&["status", "--json", "--management-url", &mgmt]);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("status: {e}: {out:?}"))
}

/// The node (1-3) that leads `queue` (`work`, `dead` or `hold`), asked
/// through node `via`.
fn leader(app: &TestApp, queue: &str, via: usize) -> Option<usize> {
    let s = status(app, via);
    let q = match queue {
        "work" => &s["lanes"]["lanes"][0],
        _ => &s[queue],
    };
    cluster::node_number(q["placement"]["leader"].as_str()?)
}

/// /ok answers 200; /flaky 500 twice, then 200; /gone 410; /down 503.
fn pipeline_receiver(r: &common::receiver::Recorded) -> Reply {
    match r.path.as_str() {
        "/flaky" if r.nth <= 2 => Reply::status(500),
        "/gone" => Reply::status(410),
        "/down" => Reply::status(503),
        _ => Reply::status(200),
    }
}

async fn three_workers_deliver_retry_and_dead_letter(backend: DelayBackend) {
    let _one = ONE_AT_A_TIME.lock().await;
    let _down = ClusterGuard;
    let urls = cluster_up().await;
    let app = TestApp::on(&urls, "pipeline", backend);
    let rx = Receiver::start(pipeline_receiver).await;
    let args = [
        "--concurrency",
        "8",
        "--timeout",
        "2s",
        "--schedule",
        "300ms,600ms",
        "--max-attempts",
        "3",
    ];
    let fleet = Fleet::start(&app, WORKERS, &args);
    let mut notes = vec![];
    for (path, n) in [("/ok", 30), ("/flaky", 10), ("/gone", 5), ("/down", 5)] {
        for i in 0..n {
            notes.push(serde_json::json!({"url": rx.url(path), "id": format!("{path}-{i}")}));
        }
    }
    app.publish(&notes).await;
    let delivered = |prefix: &str| {
        let ok = rx
            .requests()
            .into_iter()
            .filter(|r| r.reply == 200 && r.id().starts_with(prefix));
        ok.map(|r| r.id())
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    // Both ends: the last /down may be dead-lettered before the last
    // /flaky's third attempt (CI: 9 of 10 delivered at the tenth dead
    // letter, on the cascade).
    let done = wait_until_async(Duration::from_secs(60), async || {
        (delivered("/ok"), delivered("/flaky")) == (30, 10) && app.queue_len("dead").await == 10
    })
    .await;
    assert!(
        done,
        "all delivered and 10 dead letters within 60 s (have {:?} delivered, {} dead)",
        (delivered("/ok"), delivered("/flaky")),
        app.queue_len("dead").await
    );
    assert_eq!(
        (delivered("/ok"), delivered("/flaky")),
        (30, 10),
        "all delivered"
    );
    assert!(
        rx.requests()
            .iter()
            .filter(|r| r.path == "/flaky")
            .all(|r| r.nth <= 3),
        "each /flaky notification took exactly 3 attempts"
    );
    let reasons = stdout(&app.cli(&["dlq", "list", "--json"]));
    let reason_of = |id: &str| {
        let row = reasons
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap());
        let row = row.into_iter().find(|r| r["id"] == id).unwrap();
        row["dead_letter"]["reason"].as_str().unwrap().to_string()
    };
    assert_eq!(reason_of("/gone-0"), "permanent-status");
    assert_eq!(reason_of("/down-4"), "max-attempts");
    replicated_everywhere(&app, backend);
    dead_letter_order_is_kept(&app);
    drop(fleet);
    notes.clear();
}

/// The chaos receiver, with every answer taking [`PACE`] at least.
fn paced_flaky(r: &common::receiver::Recorded) -> Reply {
    let reply = flaky(r);
    let pace = reply.delay.max(PACE);
    reply.delay(pace)
}

/// The node-loss workers' flags, past `--concurrency`. No per-endpoint
/// isolation: the settle takes 10 s idle as lost, which holds only while
/// the longest wait is a retry delay (1 s); a stalled endpoint's deferrals
/// wait up to a minute.
const NODE_LOSS_FLAGS: [&str; 12] = [
    "--isolation",
    "off",
    "--timeout",
    "1s",
    "--schedule",
    "50ms,100ms,200ms,500ms,1s",
    "--max-attempts",
    "15",
    "--shutdown-grace",
    "5s",
    // Each backend's own `--retry-settle` (the plugin's 2 s), and a small
    // room (the default is 1,024 past the concurrency): with the plugin,
    // settling originals fill it and the lanes rotate through the kills,
    // as a busy worker's do at the default room.
    "--prefetch",
    "100",
];

async fn node_loss_under_load(backend: DelayBackend) {
    let _one = ONE_AT_A_TIME.lock().await;
    let _down = ClusterGuard;
    let urls = cluster_up().await;
    let app = TestApp::on(&urls, "nodeloss", backend);
    let rx = Receiver::start(paced_flaky).await;
    let load = load(&rx, 0..5_000);
    preload(&app, &load).await;
    let mut ids: Vec<String> = load.into_iter().map(|(id, _)| id).collect();
    let_quorum_queues_age().await;
    let c = CONCURRENCY.to_string();
    let args = [&["--concurrency", c.as_str()][..], &NODE_LOSS_FLAGS].concat();
    let started = Instant::now();
    let mut fleet = Fleet::start(&app, WORKERS, &args);
    // Under load before the first kill: every worker consuming (a busy CI
    // machine's were still declaring the cascade's 120 queues 3 s after
    // their start, and the kill met no load) and deliveries flowing.
    assert!(
        app.wait_consumer_count("work", WORKERS as u32).await,
        "the workers did not start consuming"
    );
    let flowing = wait_until_async(Duration::from_secs(60), async || rx.requests().len() >= 100);
    assert!(flowing.await, "no deliveries before the first kill");
    let ([k1, k2], progress) = two_leader_kills(&app, &rx, &mut ids).await;
    // 10 s idle, nothing queued or held (the longest retry delay is 1 s): lost.
    let idle = Some(Duration::from_secs(10));
    let within = Duration::from_secs(120);
    let t = settle_on(&app, &ids, &[&rx], within, &cluster::ports(), idle).await;
    let elapsed = started.elapsed();
    let running = fleet.all_running();
    report(backend, &rx, &fleet, (&[&k1, &k2], &progress), &t, elapsed);
    for k in [&k1, &k2] {
        let flowing = cluster::stall_after(&rx.requests(), k.at, Duration::from_secs(20));
        assert!(
            flowing.is_some(),
            "node {} was killed under load ({progress})",
            k.node
        );
    }
    let unexplained = lost_outside_elections(&fleet, &t.lost, &[&k1, &k2]);
    let statuses = tokio::task::spawn_blocking(move || (fleet.stop(), fleet))
        .await
        .unwrap()
        .0;
    assert_none_lost(backend, &t, &unexplained);
    t.assert_only_gone_are_permanent();
    let stray = duplicates_away_from_kills(&rx, &[&k1, &k2]);
    assert!(
        stray.is_empty(),
        "{} of {} duplicates with no attempt around a kill: {:?}",
        stray.len(),
        t.duplicates,
        &stray[..stray.len().min(20)]
    );
    assert!(running, "no worker died on its own");
    assert!(
        statuses.iter().all(|s| s.success()),
        "clean shutdowns: {statuses:?}"
    );
}

/// 5,000 dead letters, more than two of `dlq`'s windows, declared through
/// node 1 (which leads the queue) and read through node 3: a list, a
/// limited list, a `show` and a purge of one leave the rest in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_keep_their_order_across_walks() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _down = ClusterGuard;
    cluster_up().await;
    let app = TestApp::on(&cluster::url(1), "dlqorder", DelayBackend::Cascade);
    let now = common::dead_letters::now_ms();
    let ids: Vec<String> = (0..5_000).map(|i| format!("d-{i:05}")).collect();
    let items: Vec<_> = ids
        .iter()
        .map(|id| common::dead_letters::dead(id, "http://127.0.0.1:9/x", "max-attempts", now))
        .collect();
    app.publish_to_queue("dead", &items).await;
    let via3 = |args: &[&str]| {
        let out = app
            .command_via(&cluster::url(3))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
    };
    assert_eq!(
        ids_of(&via3(&["dlq", "list", "--json"])),
        ids,
        "the first walk"
    );
    assert_eq!(
        ids_of(&via3(&["dlq", "list", "--json", "--limit", "3"])),
        ids[..3]
    );
    assert!(via3(&["dlq", "show", "d-04500"]).contains("d-04500"));
    via3(&["dlq", "purge", "--yes", "d-02000"]);
    let rest: Vec<String> = ids.iter().filter(|i| *i != "d-02000").cloned().collect();
    assert_eq!(
        ids_of(&via3(&["dlq", "list", "--json"])),
        rest,
        "after four walks"
    );
    assert_eq!(
        leader(&app, "dead", 1),
        Some(1),
        "node 1 leads, node 3 read"
    );
}

#[path = "cluster_parts/analysis.rs"]
mod analysis;
#[path = "cluster_parts/endpoints.rs"]
mod endpoints;
#[path = "cluster_parts/kills.rs"]
mod kills;
#[path = "cluster_parts/logs.rs"]
mod logs;

mod plugin {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn three_workers_deliver_retry_and_dead_letter() {
        super::three_workers_deliver_retry_and_dead_letter(DelayBackend::Plugin).await
    }

    /// Retries the killed node held wait until it is back: every id
    /// arrives once it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn node_loss_under_load() {
        super::node_loss_under_load(DelayBackend::Plugin).await
    }
}

mod cascade {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn three_workers_deliver_retry_and_dead_letter() {
        super::three_workers_deliver_retry_and_dead_letter(DelayBackend::Cascade).await
    }

    /// Every queue of the cascade is a quorum queue: nothing waits for the
    /// killed node, and nothing is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn node_loss_under_load() {
        super::node_loss_under_load(DelayBackend::Cascade).await
    }
}
