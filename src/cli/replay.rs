//! `dlq replay`: the paced replay (`ops::dlq::replay`) with its progress
//! on the terminal, or a line every 10 s when stderr is not one.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use super::ops::{connect, filter};
use crate::cli::args::{DlqReplayArgs, GlobalArgs};
use crate::cli::settings::broker_settings;
use crate::ops::dlq::{replay, walk, Op, ReplayOptions, ReplayProgress, Summary};
use crate::policy::Rate;
use crate::publish::Publisher;

/// How long one republish may wait for its confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Without a terminal, a progress line this often.
const LINE_EVERY: Duration = Duration::from_secs(10);

/// `dlq replay`: republish to the work queue at `--rate`, then remove.
/// `stop` (SIGINT/SIGTERM) ends it cleanly; the rest stays, in order.
pub async fn dlq_replay(
    g: &GlobalArgs,
    a: &DlqReplayArgs,
    stop: CancellationToken,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<Summary> {
    let f = filter(&a.ids, &a.filter);
    if f.is_empty() && !a.all {
        bail!("nothing selected: give ids, --all, or a filter (--reason, --endpoint, --url-contains, --since)");
    }
    if a.dry_run {
        return dry_run(g, a, &f, out).await;
    }
    let (conn, t) = connect(g, "redeliver dlq replay").await?;
    let publisher =
        Publisher::new(&conn, t.clone(), broker_settings(g).delay, CONFIRM_TIMEOUT).await?;
    let opts = ReplayOptions {
        rate: a.rate,
        batch: a.batch as usize,
        stop: stop.clone(),
    };
    let mut reporter = Reporter::new(a.rate);
    let result = replay(&conn, &t, &f, a.limit, &publisher, &opts, |p| {
        reporter.update(p)
    })
    .await;
    reporter.finish();
    let _ = conn.close(200, "".into()).await;
    let s = result?;
    writeln!(out, "replayed {}", s.done)?;
    if s.seen < s.total && stop.is_cancelled() {
        bail!(
            "stopped after replaying {}: the rest stay in the dead-letter queue, in order; \
             run the same command again to continue",
            s.done
        );
    }
    if s.seen < s.total {
        bail!(
            "looked at {} of the {} dead letters there were at the start (another consumer or \
             dlq command holds the rest); run the same command again to continue",
            s.seen,
            s.total
        );
    }
    Ok(s)
}

/// Lists what would be replayed, then the count and how long `--rate`
/// would make it take.
async fn dry_run(
    g: &GlobalArgs,
    a: &DlqReplayArgs,
    f: &crate::message::dead_letter::Filter,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<Summary> {
    let (conn, t) = connect(g, "redeliver dlq replay").await?;
    let mut io = Ok(());
    let s = walk(&conn, &t, f, a.limit, Op::Keep, |d| {
        if io.is_ok() {
            let url = d.url.as_deref().unwrap_or("-");
            io = writeln!(out, "would replay {} {url}", d.id);
        }
    })
    .await?;
    io?;
    let _ = conn.close(200, "".into()).await;
    write!(out, "{} would be replayed (dry run)", s.selected)?;
    if let Some(r) = a.rate {
        let took = time_to_go(s.selected, per_second(r));
        write!(out, "; at {r} that takes about {}", short(took))?;
    }
    writeln!(out)?;
    Ok(s)
}

/// A bar on a terminal; otherwise a line on stderr every [`LINE_EVERY`].
struct Reporter {
    terminal: bool,
    bar: Option<ProgressBar>,
    rate: Option<Rate>,
    last_line: Instant,
}

impl Reporter {
    fn new(rate: Option<Rate>) -> Self {
        Reporter {
            terminal: std::io::stderr().is_terminal(),
            bar: None,
            rate,
            last_line: Instant::now(),
        }
    }

    fn update(&mut self, p: &ReplayProgress) {
        if self.terminal {
            let bar = self.bar.get_or_insert_with(|| new_bar(p.total));
            bar.set_position(p.seen as u64);
            bar.set_message(progress_line(p, self.rate));
        } else if self.last_line.elapsed() >= LINE_EVERY {
            self.last_line = Instant::now();
            eprintln!("dlq replay: {}", progress_line(p, self.rate));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

fn new_bar(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    let style = ProgressStyle::with_template("{bar:30} {pos}/{len} looked at  {msg}");
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar
}

/// `replayed 800, left 1200, 200.0/s, about 6s to go`. "Left" is what the
/// replay has not looked at yet (with a filter, not all of it matches).
fn progress_line(p: &ReplayProgress, rate: Option<Rate>) -> String {
    let left = p.total.saturating_sub(p.seen);
    let secs = p.elapsed.as_secs_f64();
    let observed = if secs > 0.0 {
        p.replayed as f64 / secs
    } else {
        0.0
    };
    let pace = rate.map_or(observed, per_second);
    format!(
        "replayed {}, left {left}, {observed:.1}/s, about {} to go",
        p.replayed,
        short(time_to_go(left, pace))
    )
}

fn per_second(r: Rate) -> f64 {
    f64::from(r.n) / r.per.as_secs_f64()
}

/// How long `left` take at `per_sec` (zero when the pace is unknown yet).
fn time_to_go(left: usize, per_sec: f64) -> Duration {
    if per_sec <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(left as f64 / per_sec)
}

/// Whole seconds: `2m 5s`.
fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs_f64().round() as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_gives_what_is_left_and_the_time_to_go_at_the_rate() {
        let p = ReplayProgress {
            total: 2_000,
            seen: 800,
            replayed: 800,
            elapsed: Duration::from_secs(4),
        };
        let rate: Rate = "200/s".parse().unwrap();
        assert_eq!(
            progress_line(&p, Some(rate)),
            "replayed 800, left 1200, 200.0/s, about 6s to go"
        );
        // Without --rate, the pace seen so far.
        let q = ReplayProgress {
            replayed: 400,
            seen: 400,
            ..p
        };
        assert_eq!(
            progress_line(&q, None),
            "replayed 400, left 1600, 100.0/s, about 16s to go"
        );
        assert_eq!(time_to_go(10, 0.0), Duration::ZERO);
        assert_eq!(short(Duration::from_millis(125_400)), "2m 5s");
    }
}
