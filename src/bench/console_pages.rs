//! Phase 18: the web console's pages with a full house: an index of 1
//! million attempts (20,000 with `--quick`), all within the last hour so
//! the charts and the endpoints' figures read their fullest, and 10,000
//! dead letters (500) in the queue. Each page is asked 20 times after a
//! first view (which starts the background reads); the figure is its
//! slowest server time, from the `Server-Timing` header the console sets.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use super::history_index::row_at;
use super::options::Phase;
use super::phases::Bench;
use crate::config::BrokerSettings;
use crate::console::{index, Console, ConsoleSettings};
use crate::history::HistorySettings;
use crate::message::state::{long_string, H_ATTEMPT, H_DEAD_AT, H_DEAD_REASON, H_LAST_STATUS};
use crate::topology::Topology;

/// Requests per page.
const ASKS: usize = 20;
const TOKEN: &str = "bench-console-token";

impl Bench {
    pub(super) async fn console_pages(&mut self) -> anyhow::Result<()> {
        let (attempts, dead) = match self.opts.quick {
            true => (20_000, 500),
            false => (1_000_000, 10_000),
        };
        let mut broker = self.opts.broker.clone();
        broker.prefix = self.prefix("console");
        let dir = std::env::temp_dir().join(format!(
            "redeliver-bench-console-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let measured = pages(&broker, &dir, attempts, dead).await;
        let _ = std::fs::remove_dir_all(&dir);
        super::load::remove(&self.conn, &broker.prefix).await;
        let ch = self.conn.create_channel().await?;
        let _ = ch
            .queue_delete(
                crate::history::stream_name(&broker.prefix).as_str().into(),
                Default::default(),
            )
            .await;
        let _ = ch.close(200, "done".into()).await;
        let (walk_s, slowest) = measured?;
        let p = Phase::ConsolePages;
        self.push(p, "attempts indexed", Some(attempts as f64), "rec");
        self.push(p, "dead letters in the queue", Some(dead as f64), "msg");
        self.push(
            p,
            "dead-letter walk (background, per 10 s at most)",
            Some(walk_s * 1_000.0),
            "ms",
        );
        for (page, ms) in slowest {
            let name = format!("{page}, slowest of {ASKS} (server time)");
            self.push_target(p, name, Some(ms), "ms", "≤ 200", |m| m <= 200.0);
        }
        Ok(())
    }
}

/// Fills the index and the queue, starts a console, times every page.
async fn pages(
    broker: &BrokerSettings,
    dir: &std::path::Path,
    attempts: usize,
    dead: usize,
) -> anyhow::Result<(f64, Vec<(&'static str, f64)>)> {
    let at = dir.to_path_buf();
    tokio::task::spawn_blocking(move || fill_index(&at, attempts)).await??;
    let conn = broker.url.connect("redeliver bench console").await?;
    crate::delay::declare_topology(broker, &conn).await?;
    fill_dead(&conn, &Topology::new(&broker.prefix), dead).await?;
    let _ = conn.close(200, "filled".into()).await;
    let s = ConsoleSettings {
        listen: "127.0.0.1:0".parse()?,
        data: dir.to_path_buf(),
        token: Some(SecretString::from(TOKEN)),
        read_token: None,
        history: HistorySettings::default(),
    };
    let console = Console::bind(s).await?;
    let base = format!("http://{}", console.local_addr());
    let stop = CancellationToken::new();
    let (b, st) = (broker.clone(), stop.clone());
    let served = tokio::spawn(async move { console.serve(&b, st).await });
    let result = time_pages(&base, broker).await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
    result
}

fn fill_index(dir: &std::path::Path, n: usize) -> anyhow::Result<()> {
    let mut c = index::open(dir)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    // Spread over the last 59 minutes, oldest first.
    let step = (59 * 60_000) as f64 / n as f64;
    let start = now - 59 * 60_000;
    for from in (0..n).step_by(1_000) {
        let rows: Vec<_> = (from..(from + 1_000).min(n))
            .map(|i| row_at(i, start + (i as f64 * step) as i64))
            .collect();
        index::ingest(&mut c, &rows, (from + 1_000) as u64)?;
    }
    Ok(())
}

/// `n` dead letters as a worker writes them, 40 endpoints, three reasons.
async fn fill_dead(conn: &lapin::Connection, t: &Topology, n: usize) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let now = crate::clock::now_ms();
    for i in 0..n {
        let reason = ["max-attempts", "permanent-status", "expired"][i % 3];
        let body = serde_json::json!({"id": format!("dead-{i}"), "url": format!("https://merchant-{}.example/hooks", i % 40), "body": {"i": i}});
        let mut h = FieldTable::default();
        h.insert(H_ATTEMPT.into(), AMQPValue::LongLongInt(15));
        h.insert(H_DEAD_REASON.into(), long_string(reason));
        h.insert(
            H_DEAD_AT.into(),
            AMQPValue::LongLongInt(now - (i as i64) * 1_000),
        );
        h.insert(H_LAST_STATUS.into(), AMQPValue::LongInt(500));
        let props = BasicProperties::default()
            .with_headers(h)
            .with_message_id(format!("dead-{i}").into());
        let opts = BasicPublishOptions::default();
        let confirm = ch
            .basic_publish(
                "".into(),
                t.dead.as_str().into(),
                opts,
                body.to_string().as_bytes(),
                props,
            )
            .await?;
        if i % 500 == 499 || i == n - 1 {
            confirm.await?;
        }
    }
    ch.wait_for_confirms().await?;
    let _ = ch.close(200, "filled".into()).await;
    Ok(())
}

/// Every page: one view to start the reads, then [`ASKS`] timed ones.
async fn time_pages(
    base: &str,
    broker: &BrokerSettings,
) -> anyhow::Result<(f64, Vec<(&'static str, f64)>)> {
    let started = Instant::now();
    let list = crate::console::live::read_dead(broker, &Default::default()).await;
    let walk_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        list.error.is_none(),
        "the dead-letter walk: {:?}",
        list.error
    );
    // A search answers with a redirect: its own time is the figure.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let endpoint = "/endpoints/https%3A%2F%2Fmerchant%2D7%2Eexample%3A443";
    let pages: [(&'static str, String); 8] = [
        ("overview /", "/".into()),
        ("endpoints /endpoints", "/endpoints".into()),
        ("one endpoint", endpoint.into()),
        // This id and the searched one exist from 12,729 attempts on
        // (notification n-k has attempts 3k..3k+2).
        ("notification", "/notifications/n-4242".into()),
        ("dead letters", "/dead-letters".into()),
        (
            "dead letters filtered",
            "/dead-letters?reason=expired&since=1h".into(),
        ),
        ("search by id", "/search?q=n-3137".into()),
        (
            "API dead letters",
            "/api/dead-letters?reason=expired".into(),
        ),
    ];
    let mut out = vec![];
    for (name, path) in pages {
        let url = format!("{base}{path}");
        ask(&http, &url).await?;
        let mut slowest: f64 = 0.0;
        for _ in 0..ASKS {
            slowest = slowest.max(ask(&http, &url).await?);
        }
        out.push((name, slowest));
    }
    Ok((walk_s, out))
}

/// One request; its server time in ms.
async fn ask(http: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let r = http.get(url).bearer_auth(TOKEN).send().await?;
    anyhow::ensure!(
        r.status().is_success() || r.status().is_redirection(),
        "{url}: HTTP {}",
        r.status()
    );
    let timing = r
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let _ = r.bytes().await?;
    timing
        .split("dur=")
        .nth(1)
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{url}: no Server-Timing"))
}
