//! The dead-letter replays the console runs, kept in memory so a page
//! reloaded (or opened by a colleague) shows how far each has got. A
//! console restart forgets them; the replay itself stops cleanly with the
//! console, and what it did not replay stays in the dead-letter queue.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

use crate::ops::dlq::ReplayProgress;

/// Replays remembered (the oldest finished ones are forgotten first).
const KEPT: usize = 20;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Job {
    pub id: String,
    pub started_at: String,
    /// What was asked for, as a person reads it.
    pub selection: String,
    pub rate: Option<String>,
    /// Dead letters in the queue at the start, looked at, replayed.
    pub total: usize,
    pub seen: usize,
    pub replayed: usize,
    /// `running`, `done`, `stopped` or `failed`.
    pub state: &'static str,
    pub error: Option<String>,
}

#[derive(Default)]
pub struct Jobs(Mutex<VecDeque<Job>>);

impl Jobs {
    /// Registers a running replay; its id.
    pub fn start(&self, selection: String, rate: Option<String>) -> String {
        let id = format!("replay-{}", uuid::Uuid::new_v4().simple());
        let job = Job {
            id: id.clone(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            selection,
            rate,
            total: 0,
            seen: 0,
            replayed: 0,
            state: "running",
            error: None,
        };
        if let Ok(mut jobs) = self.0.lock() {
            while jobs.len() >= KEPT {
                match jobs.iter().position(|j| j.state != "running") {
                    Some(i) => drop(jobs.remove(i)),
                    None => break,
                }
            }
            jobs.push_back(job);
        }
        id
    }

    fn with(&self, id: &str, f: impl FnOnce(&mut Job)) {
        if let Ok(mut jobs) = self.0.lock() {
            if let Some(j) = jobs.iter_mut().find(|j| j.id == id) {
                f(j);
            }
        }
    }

    pub fn progress(&self, id: &str, p: &ReplayProgress) {
        self.with(id, |j| {
            (j.total, j.seen, j.replayed) = (p.total, p.seen, p.replayed);
        });
    }

    /// Ends a replay: `replayed` of `total`, stopped early or not.
    pub fn finish(&self, id: &str, replayed: usize, stopped: bool, error: Option<String>) {
        self.with(id, |j| {
            j.replayed = replayed;
            j.state = match (&error, stopped) {
                (Some(_), _) => "failed",
                (None, true) => "stopped",
                (None, false) => "done",
            };
            j.error = error;
        });
    }

    /// Ends a replay that failed, keeping the count it reached (those
    /// were confirmed and removed).
    pub fn fail(&self, id: &str, error: String) {
        self.with(id, |j| {
            j.state = "failed";
            j.error = Some(error);
        });
    }

    /// Newest first.
    pub fn list(&self) -> Vec<Job> {
        self.0
            .lock()
            .map(|j| j.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_replay_is_followed_from_start_to_end() {
        let jobs = Jobs::default();
        let id = jobs.start("3 selected".into(), Some("10/s".into()));
        let p = ReplayProgress {
            total: 10,
            seen: 4,
            replayed: 3,
            elapsed: Duration::from_secs(1),
        };
        jobs.progress(&id, &p);
        assert_eq!(jobs.list()[0].replayed, 3);
        assert_eq!(jobs.list()[0].state, "running");
        jobs.finish(&id, 5, false, None);
        assert_eq!((jobs.list()[0].state, jobs.list()[0].replayed), ("done", 5));
        let running = jobs.start("still running".into(), None);
        for _ in 0..KEPT + 3 {
            let x = jobs.start("x".into(), None);
            jobs.finish(&x, 0, true, None);
        }
        assert_eq!(jobs.list().len(), KEPT, "done ones are forgotten first");
        assert!(jobs.list().iter().all(|j| j.id != id));
        assert!(
            jobs.list().iter().any(|j| j.id == running),
            "a running one is kept"
        );
    }
}
