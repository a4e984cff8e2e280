//! What the cluster tests check of a run: replication and dead-letter
//! order, and for the node-loss test the ids lost outside an election's
//! window, duplicates away from the kills, and its report.

use super::*;

/// The lost ids whose last retry did not fall due within [`ELECTION`]
/// after a kill (or the second before it: a routed copy in flight to the
/// leader when it died).
pub(super) fn lost_outside_elections(
    fleet: &Fleet,
    lost: &[String],
    kills: &[&Kill],
) -> Vec<String> {
    let due = cluster::retries_due(fleet.logs());
    let last = |id: &String| due.get(id).and_then(|d| d.iter().max().copied());
    lost.iter()
        .filter(|id| {
            !last(id).is_some_and(|at| due_around(at, kills, Duration::from_secs(1), ELECTION))
        })
        .cloned()
        .collect()
}

/// On the cascade nothing is lost; on the plugin backend only retries that
/// fell due around a kill (`unexplained`: the others, from
/// [`lost_outside_elections`]).
pub(super) fn assert_none_lost(backend: DelayBackend, t: &Tally, unexplained: &[String]) {
    match backend {
        DelayBackend::Cascade => assert!(
            t.lost.is_empty(),
            "lost {}: {:?}",
            t.lost.len(),
            &t.lost[..t.lost.len().min(20)]
        ),
        DelayBackend::Plugin => assert!(
            unexplained.is_empty(),
            "lost outside a leader election: {unexplained:?}"
        ),
    }
}

/// Whether `at` lies within `before` ahead of a kill or `after` behind it.
pub(super) fn due_around(
    at: std::time::SystemTime,
    kills: &[&Kill],
    before: Duration,
    after: Duration,
) -> bool {
    kills.iter().any(|k| around(at, k.wall, before, after))
}

/// Whether `at` lies within `before` ahead of `center` or `after` behind
/// it: on the wall clock (the workers' logs) or on [`Instant`]s (the
/// receiver's requests).
pub(super) fn around<T>(at: T, center: T, before: Duration, after: Duration) -> bool
where
    T: Copy + PartialOrd + std::ops::Add<Duration, Output = T>,
{
    at + before >= center && at <= center + after
}

/// The ids delivered more than once that had no attempt from [`BEFORE_KILL`]
/// before a kill to [`ELECTION`] after it. A kill duplicates what was
/// unacked: acks are not confirmed, so those still on their way to the
/// killed node, or to a queue without a leader, are lost and the broker
/// delivers again (seen: a worker's 12 deliveries of its last 160 ms);
/// a retry whose confirm the kill cut short leaves its original to be
/// tried again; with the plugin, the killed node may route again what it
/// routed just before. How many is the load's figure (every worker's
/// prefetch bounds it), but a duplicate away from every kill is a bug.
pub(super) fn duplicates_away_from_kills(rx: &Receiver, kills: &[&Kill]) -> Vec<String> {
    let requests = rx.requests();
    let mut ok: std::collections::HashMap<String, usize> = Default::default();
    for r in requests.iter().filter(|r| r.reply == 200) {
        *ok.entry(r.id()).or_default() += 1;
    }
    let near = |at: Instant| {
        kills
            .iter()
            .any(|k| around(at, k.at, BEFORE_KILL, ELECTION))
    };
    let mut stray: Vec<String> = ok
        .into_iter()
        .filter(|(id, n)| *n > 1 && !requests.iter().any(|r| &r.id() == id && near(r.at)))
        .map(|(id, _)| id)
        .collect();
    stray.sort();
    stray
}

pub(super) fn report(
    backend: DelayBackend,
    rx: &Receiver,
    fleet: &Fleet,
    (kills, progress): (&[&Kill], &kills::Progress),
    t: &Tally,
    took: Duration,
) {
    let requests = rx.requests();
    println!(
        "cluster node loss ({}): {} notifications in {:.1} s: delivered {}, dead {}, lost {}, \
         attempts {}, duplicate successes {}, logs in {}; {progress}",
        backend.as_str(),
        t.delivered.len() + t.dead.len() + t.lost.len(),
        took.as_secs_f64(),
        t.delivered.len(),
        t.dead.len(),
        t.lost.len(),
        t.attempts,
        t.duplicates,
        fleet.logs().display()
    );
    for k in kills {
        let flow = match cluster::stall_after(&requests, k.at, Duration::from_secs(20)) {
            Some(s) => format!(
                "longest pause in deliveries {:.2} s, ending {:.2} s after the kill",
                s.longest_pause.as_secs_f64(),
                s.flowing_again_after.as_secs_f64()
            ),
            None => "no delivery in the 20 s after it".into(),
        };
        let (lost, back) = cluster::workers_back(fleet.logs(), k.wall, Duration::from_secs(15));
        let back = match (lost, back) {
            (0, _) => "no worker was connected to it".into(),
            (n, Some(d)) => format!(
                "{n} worker(s) lost their session, all consuming again {:.2} s after the kill",
                d.as_secs_f64()
            ),
            (n, None) => format!("{n} worker(s) lost their session, not all consuming again"),
        };
        println!("  kill -9 of node {}: {flow}; {back}", k.node);
    }
}

/// The work, dead-letter (and, for the cascade, hold) queues are quorum
/// queues with a member on every node.
pub(super) fn replicated_everywhere(app: &TestApp, backend: DelayBackend) {
    let s = status(app, 1);
    let mut placements = vec![&s["dead"]["placement"]];
    if backend == DelayBackend::Cascade {
        placements.push(&s["hold"]["placement"]);
    }
    let lanes = s["lanes"]["lanes"].as_array().expect("lanes");
    assert_eq!(lanes.len(), usize::from(redeliver::config::DEFAULT_LANES));
    placements.extend(lanes.iter().map(|l| &l["placement"]));
    for p in placements {
        assert_eq!(p["kind"], "quorum", "{p}");
        assert_eq!(p["members"].as_array().map(Vec::len), Some(3), "{p}");
    }
    assert_eq!(s["cluster"].as_array().map(Vec::len), Some(3), "{s}");
    assert!(
        s["node"].as_str().and_then(cluster::node_number).is_some(),
        "{s}"
    );
}

/// `dlq list`, a limited list, and a `show` leave the dead letters in the
/// order the first list showed.
pub(super) fn dead_letter_order_is_kept(app: &TestApp) {
    let first = ids_of(&stdout(&app.cli(&["dlq", "list", "--json"])));
    assert_eq!(first.len(), 10);
    let limited = ids_of(&stdout(
        &app.cli(&["dlq", "list", "--json", "--limit", "3"]),
    ));
    assert_eq!(limited, first[..3]);
    let shown = stdout(&app.cli(&["dlq", "show", &first[5]]));
    assert!(shown.contains(&first[5]), "{shown}");
    let again = ids_of(&stdout(&app.cli(&["dlq", "list", "--json"])));
    assert_eq!(again, first, "the same order after three walks");
}
