//! The dashboard and the alert rules against real data: Debian's
//! Prometheus scrapes a real `redeliver run` worker (default flags) that
//! delivers real traffic, with retries, a breaker that opens and dead
//! letters; then every PromQL expression of `monitoring/grafana/redeliver.json`
//! and `monitoring/alerts.yml` runs through Prometheus's HTTP API. A query
//! that errors or returns no series (a misspelled name, an empty panel)
//! fails the test, and so does a rule Prometheus cannot evaluate.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::app::TestApp;
use common::metrics::{free_port, run_with_admin, scrape};
use common::receiver::{Receiver, Recorded, Reply};
use redeliver::delay::DelayBackend;
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A Prometheus scraping the worker every second, with the alert rules
/// loaded; killed and its data removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    fn start(name: &str, worker_admin: u16) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("redeliver-prom-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: redeliver\n    static_configs:\n      - targets: ['127.0.0.1:{worker_admin}']\n",
            rules = repo("monitoring/alerts.yml").display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config");
        let port = free_port();
        let log = std::fs::File::create(dir.join("log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus is not installed: apt-get install prometheus (.ci/run does)");
        Prometheus { child, dir, port }
    }

    /// An instant query's series, or the error Prometheus gave.
    async fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let answer = reqwest::Client::new()
            .get(url)
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let text = answer.text().await.map_err(|e| e.to_string())?;
        let body: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(body["error"].to_string());
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let text = reqwest::get(url).await.ok()?.text().await.ok()?;
        serde_json::from_str(&text).ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every `expr` of the dashboard, its variables replaced as Grafana would
/// for "all instances" over a short range.
fn dashboard_queries() -> Vec<String> {
    let text =
        std::fs::read_to_string(repo("monitoring/grafana/redeliver.json")).expect("dashboard");
    let json: Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    collect_exprs(&json, &mut out);
    out.iter()
        .map(|q| {
            q.replace("$__rate_interval", "1m")
                .replace("$__interval", "15s")
                .replace("$job", "redeliver")
                .replace("$instance", ".*")
        })
        .collect()
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            m.values().for_each(|x| collect_exprs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

/// (alert name, expr) of every rule.
fn rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("monitoring/alerts.yml")).expect("alerts.yml");
    let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("alerts YAML");
    let mut out = Vec::new();
    for g in y["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
            let expr = r["expr"].as_str().unwrap_or("").to_string();
            out.push((name.to_string(), expr));
        }
    }
    out
}

/// The metric names an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("redeliver_") || w.starts_with("process_") || *w == "up")
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Traffic for the whole test: most notifications succeed, one in ten
/// is answered 500 once (a retry), one in ten goes to a receiver that
/// always answers 503: each of those dead-letters after its one attempt,
/// and ten in a row open its breaker. (With 3 attempts, a dead letter
/// needed one to reach its third before the breaker opened: after that,
/// its deliveries are deferred unattempted, and only probes attempt.)
async fn traffic(app: &TestApp, ok: &Receiver, down: &Receiver, until: Instant) {
    let mut i = 0;
    while Instant::now() < until {
        let mut batch = Vec::new();
        for _ in 0..10 {
            let (rx, attempts) = if i % 10 == 9 { (down, 1) } else { (ok, 3) };
            let id = format!("m-{i}");
            batch.push(serde_json::json!({"url": rx.url("/"), "id": id, "schedule": ["1s"], "max_attempts": attempts}));
            i += 1;
        }
        app.publish(&batch).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Each series' value is a number other than NaN for at least one series.
fn any_number(series: &[Value]) -> bool {
    series.iter().any(|s| {
        s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| !v.is_nan())
    })
}

async fn every_panel_and_rule_has_data(backend: DelayBackend) {
    let app = TestApp::new("monitoring", backend);
    let ok = Receiver::start(|r: &Recorded| match r.nth == 1 && r.id().ends_with('5') {
        true => Reply::status(500),
        false => Reply::status(200),
    })
    .await;
    let down = Receiver::start(|_: &Recorded| Reply::status(503)).await;
    let (_w, admin) = run_with_admin(&app, &[]);
    let prom = Prometheus::start(&app.name("p"), admin);
    let feeding = traffic(&app, &ok, &down, Instant::now() + Duration::from_secs(25));
    let watched = async {
        // Data for every panel: an opened breaker, dead letters, a probe.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = scrape(admin).await.unwrap_or_default();
            let ready = text.contains("to=\"open\"")
                && text.contains("outcome=\"dead\"")
                && text.contains("redeliver_delay_probe_seconds_bucket");
            if ready || Instant::now() > deadline {
                return ready;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (_, ready) = tokio::join!(feeding, watched);
    assert!(
        ready,
        "the worker showed a breaker opening, a dead letter and a probe"
    );
    check_dashboard(&prom).await;
    check_rules(&prom).await;
}

async fn check_dashboard(prom: &Prometheus) {
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} dashboard queries", queries.len());
    let mut bad = Vec::new();
    for q in &queries {
        match prom.query(q).await {
            Err(e) => bad.push(format!("{q}\n  error: {e}")),
            Ok(s) if s.is_empty() => bad.push(format!("{q}\n  no series")),
            Ok(s) if !any_number(&s) => bad.push(format!("{q}\n  only NaN: {s:?}")),
            Ok(_) => {}
        }
    }
    assert!(
        bad.is_empty(),
        "dashboard queries without data:\n{}",
        bad.join("\n")
    );
}

async fn check_rules(prom: &Prometheus) {
    let rules = rules();
    assert!(rules.len() >= 5, "{} rules", rules.len());
    let mut bad = Vec::new();
    for (name, expr) in &rules {
        if let Err(e) = prom.query(expr).await {
            bad.push(format!("{name}: {e}"));
        }
        for m in metric_names(expr) {
            match prom.query(&m).await {
                Ok(s) if !s.is_empty() => {}
                other => bad.push(format!("{name}: {m} has no series ({other:?})")),
            }
        }
    }
    // Prometheus loaded and evaluated every rule without an error.
    let loaded = prom.get("/api/v1/rules").await.unwrap_or_default();
    let evaluated: Vec<&Value> = loaded["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(evaluated.len(), rules.len(), "{loaded}");
    for r in evaluated {
        if r["health"] != "ok" {
            bad.push(format!(
                "{}: health {} {}",
                r["name"], r["health"], r["lastError"]
            ));
        }
    }
    assert!(bad.is_empty(), "rules:\n{}", bad.join("\n"));
}

/// `monitoring/check`: promtool checks the rules, runs each rule's unit
/// tests (firing and not firing) and checks the compose stack's config.
#[test]
fn promtool_checks_the_rules_and_their_tests() {
    let out = Command::new(repo("monitoring/check"))
        .output()
        .expect("monitoring/check runs");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The dashboard's JSON is what Grafana imports: a uid, a title, panels.
#[test]
fn the_dashboard_is_importable_json() {
    let text =
        std::fs::read_to_string(repo("monitoring/grafana/redeliver.json")).expect("dashboard");
    let json: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["uid"], "redeliver");
    assert!(json["panels"].as_array().is_some_and(|p| p.len() >= 10));
    assert!(Path::new(&repo("monitoring/alerts.yml")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_panel_and_rule_has_data_plugin() {
    every_panel_and_rule_has_data(DelayBackend::Plugin).await
}
