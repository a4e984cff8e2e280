//! The node-loss test's kills, and its load kept going until the second.

use std::collections::HashSet;
use std::fmt;

use super::*;

/// Notifications left unfinished at the second kill, at least: about
/// 15 s of the fleet's pace (110-170 attempts/s, 1.6 attempts each).
const KEEP: usize = 1_500;

/// One node kill: which node, when, and what it did to the deliveries.
pub(super) struct Kill {
    pub(super) node: usize,
    pub(super) at: Instant,
    pub(super) wall: std::time::SystemTime,
}

/// Kills node `n` for [`OUTAGE`], then brings it back.
async fn kill_for_a_while(n: usize) -> Kill {
    let (at, wall) = tokio::task::spawn_blocking(move || cluster::kill(n))
        .await
        .unwrap();
    // The outage's own length, not a wait for something.
    tokio::time::sleep(OUTAGE).await;
    tokio::task::spawn_blocking(move || cluster::start(n))
        .await
        .unwrap();
    Kill { node: n, at, wall }
}

/// Kills the node leading the work queue's first lane, then (once it is
/// back) the one leading it then, each after 3 s under load (the chaos's
/// own pace), with the load topped up before the second ([`keep_going`]).
pub(super) async fn two_leader_kills(
    app: &TestApp,
    rx: &Receiver,
    ids: &mut Vec<String>,
) -> ([Kill; 2], Progress) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = leader(app, "work", 1).expect("the work queue has a leader");
    let k1 = kill_for_a_while(first).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let via = first % 3 + 1;
    let now = leader(app, "work", via).expect("the work queue has a leader");
    let second = if now == first { via } else { now };
    let progress = keep_going(app, rx, ids).await;
    ([k1, kill_for_a_while(second).await], progress)
}

/// How far the load had got just before the second kill.
pub(super) struct Progress {
    outstanding: usize,
    added: usize,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} notifications unfinished before the second kill, {} of them added then",
            self.outstanding + self.added,
            self.added
        )
    }
}

/// Tops the load up to [`KEEP`] unfinished notifications (ids after the
/// others', published as the first were). A slow CI machine's node restart
/// took so long that the 5,000 were done before the second kill, which then
/// met no load at all.
async fn keep_going(app: &TestApp, rx: &Receiver, ids: &mut Vec<String>) -> Progress {
    let finished: HashSet<String> = rx
        .requests()
        .iter()
        .filter(|r| r.reply == 200 || r.reply == 410)
        .map(|r| r.id())
        .collect();
    let outstanding = ids.iter().filter(|id| !finished.contains(*id)).count();
    let added = KEEP.saturating_sub(outstanding);
    if added > 0 {
        let more = load(rx, ids.len()..ids.len() + added);
        preload(app, &more).await;
        ids.extend(more.into_iter().map(|(id, _)| id));
    }
    Progress { outstanding, added }
}
