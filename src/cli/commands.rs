//! The commands, one library function each; `main.rs` only calls these.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, Write};

use anyhow::{bail, Context as _};
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::cli::args::{GlobalArgs, PublishArgs, RunArgs};
use crate::cli::settings::{broker_settings, worker_settings};
use crate::config::{expiry_warning, AmqpUrl, Routes, SigningSecret};
use crate::deliver::AddressPolicy;
use crate::deliver::{Egress, HttpDeliverer};
use crate::message::trace::TraceContext;
use crate::ops::produce::{publish_all, ProduceOptions};
use crate::publish::{prepare, Prepared};
use crate::telemetry::trace::{ProducerSpan, Tracing};

/// `redeliver demo`: against the local test node unless a URL is given;
/// that node is started first when nothing answers on its port. Stops
/// early (still deleting its queues) when `shutdown` is cancelled.
pub async fn demo(
    g: &GlobalArgs,
    shutdown: CancellationToken,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut b = broker_settings(g);
    if g.amqp_url.is_none() {
        crate::ops::local_node::ensure_running(out).await?;
        b.url = AmqpUrl::new(crate::ops::local_node::url());
    }
    crate::ops::demo::demo(&b, out, shutdown).await
}

/// `redeliver bench`: against the local test node unless a URL is given
/// (started first when nothing answers, as for `demo`).
/// The table goes to `out`, progress to stderr.
pub async fn bench(
    g: &GlobalArgs,
    args: &crate::cli::args::BenchArgs,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut broker = broker_settings(g);
    let mut broker_pid = None;
    if g.amqp_url.is_none() {
        crate::ops::local_node::ensure_running(&mut std::io::stderr()).await?;
        broker.url = AmqpUrl::new(crate::ops::local_node::url());
        broker_pid = crate::ops::local_node::pid();
    } else if crate::ops::local_node::is_named_by(&broker.url) {
        // An --amqp-url that names the local node is measured like it.
        broker_pid = crate::ops::local_node::pid();
    }
    let opts = crate::bench::BenchOptions {
        broker,
        phases: args.phase.clone(),
        n: args.n.map(|n| n as usize),
        concurrency: args.concurrency.into(),
        quick: args.quick,
        worker_exe: std::env::current_exe().context("finding this executable")?,
        baseline_exe: args.baseline_exe.clone(),
        cluster_url: args.cluster_url.clone().map(AmqpUrl::new),
        broker_pid,
    };
    let report = crate::bench::run(&opts, &mut std::io::stderr()).await?;
    report.write_table(out)?;
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Warns of secrets that expired or expire within 24 h, and refuses to
/// start when every secret of the worker or of a route has expired: it
/// would send every request unsigned.
fn check_expiries(secrets: &[SigningSecret], routes: &Routes) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now();
    let sets = std::iter::once(("--signing-secret".to_string(), secrets));
    let routes = routes.iter().filter_map(|r| {
        let s = r.secrets.as_deref()?;
        Some((format!("route {}", r.url_prefix), s))
    });
    for (what, set) in sets.chain(routes) {
        for w in set.iter().filter_map(|s| expiry_warning(s, now)) {
            tracing::warn!("{what}: {w}");
        }
        if !set.is_empty() && set.iter().all(|s| !s.in_use(now)) {
            bail!("{what}: every signing secret has expired; give a current one");
        }
    }
    Ok(())
}

/// `redeliver run`.
pub async fn run(
    g: &GlobalArgs,
    args: &RunArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut settings = worker_settings(args, g.delay_backend)?;
    // Already checked when the command line was parsed; read for its routes.
    if let Some(path) = &g.config {
        settings.routes = crate::cli::file::ConfigFile::load(path)?.routes;
    }
    let secrets = crate::config::parse_secrets(&args.signing_secret)?;
    check_expiries(&secrets, &settings.routes)?;
    let policy = AddressPolicy::new(args.deny_private, args.allow_cidr.clone());
    let handler = HttpDeliverer::with_policy(args.timeout, settings.concurrency, policy)
        .context("building the HTTP client")?
        .with_signing(secrets, settings.routes.clone())
        .with_egress(&Egress {
            proxy: args.proxy.as_deref().unwrap_or_default().parse()?,
            no_proxy: args.no_proxy.clone(),
        })?;
    // The admin endpoint outlives the worker's drain, so `/readyz` answers
    // 503 (not "connection refused") while in-flight deliveries finish.
    let admin_stop = CancellationToken::new();
    let _stop_admin = admin_stop.clone().drop_guard();
    if let Some(addr) = &args.admin_addr {
        crate::telemetry::admin::spawn(addr, settings.health.clone(), admin_stop).await?;
    }
    settings.tracing = Tracing::from_env("redeliver")
        .context("setting up trace export (OTEL_EXPORTER_OTLP_ENDPOINT)")?;
    let tracing = settings.tracing.clone();
    let ran = crate::worker::run(&broker_settings(g), settings, handler, shutdown).await;
    tracing.shutdown().await;
    ran?;
    Ok(())
}

/// `redeliver publish`: validates everything first, then publishes with
/// confirms and prints each confirmed id on stdout. A lost connection or a
/// confirm timeout moves on to the next node of the URL list
/// ([`crate::ops::produce`]), from the first unconfirmed notification.
pub async fn publish(g: &GlobalArgs, args: &PublishArgs) -> anyhow::Result<()> {
    let notifications = match &args.file {
        Some(path) => read_lines(path, args.max_message_bytes)?,
        None => vec![prepare(&single_json(args)?, args.max_message_bytes)?],
    };
    if args.delay.is_some_and(|d| d > crate::policy::MAX_DELAY) {
        bail!("--delay can be at most 4294967295 ms (~49.7 days), the delayed-message limit");
    }
    let opts = ProduceOptions {
        delay: args.delay,
        confirm_timeout: args.confirm_timeout,
        ..ProduceOptions::default()
    };
    let tracing = Tracing::from_env("redeliver-publish")
        .context("setting up trace export (OTEL_EXPORTER_OTLP_ENDPOINT)")?;
    let parent = match &args.traceparent {
        Some(tp) => TraceContext::parse(tp, args.tracestate.as_deref()),
        None => None,
    };
    let mut notifications = notifications;
    let mut spans = producer_spans(&tracing, parent.as_ref(), &mut notifications, g);
    let mut out = std::io::stdout().lock();
    let published = publish_all(&broker_settings(g), &notifications, &opts, |id| {
        if let Some(s) = spans.get_mut(id).and_then(|s| s.pop_front()) {
            s.confirmed();
        }
        writeln!(out, "{id}")
    })
    .await;
    drop(spans);
    tracing.shutdown().await;
    published?;
    Ok(())
}

/// A `publish` span per notification (under `parent`), whose context its
/// headers carry; off, `parent` itself is carried. By id, in file order:
/// confirms come in that order, and a file may repeat an id.
fn producer_spans(
    tracing: &Tracing,
    parent: Option<&TraceContext>,
    all: &mut [Prepared],
    g: &GlobalArgs,
) -> HashMap<String, VecDeque<ProducerSpan>> {
    let intake = crate::topology::Topology::new(&g.prefix).intake;
    let mut spans: HashMap<String, VecDeque<ProducerSpan>> = HashMap::new();
    for n in all.iter_mut() {
        let span = tracing.publish(parent, &n.id, &intake);
        n.trace = span.context().cloned();
        spans.entry(n.id.clone()).or_default().push_back(span);
    }
    spans
}

fn read_lines(path: &std::path::Path, max_bytes: usize) -> anyhow::Result<Vec<Prepared>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line =
            line.with_context(|| format!("{}: cannot read line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        if is_invalid_dead_letter(&line) {
            tracing::warn!(
                line = i + 1,
                "skipped: an exported `invalid` dead letter holds no notification to publish"
            );
            continue;
        }
        let n = prepare(&line, max_bytes)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        out.push(n);
    }
    Ok(out)
}

/// A `dlq export` line of a message that never was a notification.
fn is_invalid_dead_letter(line: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Line {
        dead_letter: Option<Dead>,
    }
    #[derive(serde::Deserialize)]
    struct Dead {
        raw_body: Option<String>,
    }
    serde_json::from_str::<Line>(line)
        .is_ok_and(|l| l.dead_letter.is_some_and(|d| d.raw_body.is_some()))
}

/// The JSON object for `publish --url ...`.
fn single_json(a: &PublishArgs) -> anyhow::Result<String> {
    let mut o: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
    o.insert("v", raw(&crate::message::FORMAT_VERSION)?);
    o.insert("url", raw(&a.url.as_deref().context("--url is required")?)?);
    let body = match (&a.body, &a.body_file) {
        (Some(b), _) => Some(b.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        (None, None) => None,
    };
    if let Some(b) = body {
        // The exact text, so a signed or byte-compared body arrives unchanged.
        let text =
            RawValue::from_string(b.trim().to_string()).context("the body is not valid JSON")?;
        o.insert("body", text);
    }
    if let Some(id) = &a.id {
        o.insert("id", raw(id)?);
    }
    let mut headers = BTreeMap::new();
    for h in &a.headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header {h:?} is not `Name: value`")
        };
        headers.insert(k.trim().to_string(), v.trim().to_string());
    }
    if !headers.is_empty() {
        o.insert("headers", raw(&headers)?);
    }
    if let Some(m) = &a.method {
        o.insert("method", raw(m)?);
    }
    if let Some(n) = a.max_attempts {
        o.insert("max_attempts", raw(&n)?);
    }
    if let Some(s) = &a.schedule {
        let entries: Vec<&str> = s.split(',').map(str::trim).collect();
        o.insert("schedule", raw(&entries)?);
    }
    if let Some(s) = &a.success_body {
        o.insert("success_body", raw(s)?);
    }
    if let Some(d) = a.max_age {
        o.insert("max_age", raw(&humantime::format_duration(d).to_string())?);
    }
    Ok(serde_json::to_string(&o)?)
}

fn raw<T: serde::Serialize + ?Sized>(v: &T) -> anyhow::Result<Box<RawValue>> {
    Ok(serde_json::value::to_raw_value(v)?)
}
