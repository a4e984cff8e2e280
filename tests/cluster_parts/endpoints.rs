//! The shared endpoint state on the cluster: a pause outlives the node
//! that led its stream.

use std::time::Duration;

use common::endpoints::{all_delivered, in_force, origin};
use common::harness::{assert_quiet_for, let_quorum_queues_age, wait_until_async};
use common::metrics::free_port;
use common::process::Proc;

use super::*;

/// The pause is written through node 1, which leads the stream; node 1 is
/// then killed with -9. A worker started on nodes 2 and 3 while it is down
/// holds the paused endpoint's notifications from its first delivery, and
/// the resume, once node 1 is back, delivers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_survives_a_node_kill() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _down = ClusterGuard;
    cluster_up().await;
    let others = format!("{},{}", cluster::url(2), cluster::url(3));
    let app = TestApp::on(&others, "ep-nodekill", DelayBackend::Cascade);
    let rx = Receiver::start(|_| Reply::status(200)).await;
    let target = origin(&rx);
    let paused = app
        .command_via(&cluster::url(1))
        .args(["endpoint", "pause", &target])
        .output()
        .unwrap();
    assert!(paused.status.success(), "{paused:?}");
    let stream = app.name("endpoint-state");
    let queues = common::ctl_output(
        cluster::port(1),
        &["rabbitmqctl", "list_queues", "name", "leader"],
    );
    let led = queues
        .lines()
        .find(|l| l.starts_with(&format!("{stream}\t")));
    assert!(
        led.is_some_and(|l| l.ends_with(&cluster::node_name(1))),
        "node 1 leads the stream: {queues}"
    );
    let_quorum_queues_age().await;
    tokio::task::spawn_blocking(|| cluster::kill(1))
        .await
        .unwrap();
    let admin = free_port();
    let mut run = app.command();
    run.args(["run", "--admin-addr", &format!("127.0.0.1:{admin}")]);
    let _worker = Proc::spawn(run);
    // Its first session may wait for the stream's new leader.
    let held = wait_until_async(Duration::from_secs(60), async || {
        in_force(admin, "paused", 1.0).await
    })
    .await;
    assert!(held, "the pause was not in force without node 1");
    let ids = app.publish(&rx.notifications("k", 10)).await;
    assert_quiet_for(Duration::from_secs(5), "paused", || rx.count()).await;
    assert_eq!(rx.count(), 0);
    tokio::task::spawn_blocking(|| cluster::start(1))
        .await
        .unwrap();
    let resumed = app.cli(&["endpoint", "resume", &target]);
    assert!(resumed.status.success(), "{resumed:?}");
    assert!(all_delivered(&rx, &ids, Duration::from_secs(75)).await);
}
