//! The operator commands: `dlq ...` and `status`, one function each.

use std::io::Write;

use anyhow::{bail, Context as _};

use crate::cli::commands::broker_settings;
use crate::cli::{
    DlqExportArgs, DlqFilterArgs, DlqListArgs, DlqPurgeArgs, DlqReplayArgs, GlobalArgs, StatusArgs,
};
use crate::delay::DelayBackend;
use crate::message::dead_letter::{DeadLetter, Filter};
use crate::ops::dlq::{walk, Op, Summary};
use crate::publish::Publisher;
use crate::topology::Topology;

fn filter(ids: &[String], f: &DlqFilterArgs) -> Filter {
    Filter {
        ids: ids.to_vec(),
        reason: f.reason.clone(),
        url_contains: f.url_contains.clone(),
        since: f.since,
    }
}

async fn connect(g: &GlobalArgs, name: &str) -> anyhow::Result<(lapin::Connection, Topology)> {
    let b = broker_settings(g);
    let conn = b
        .url
        .connect(name)
        .await
        .with_context(|| format!("cannot connect to the broker at {}", b.url))?;
    Ok((conn, Topology::new(&b.prefix)))
}

/// `dlq list`: a table, or JSON lines with `--json`.
pub async fn dlq_list(
    g: &GlobalArgs,
    a: &DlqListArgs,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let (conn, t) = connect(g, "redeliver dlq list").await?;
    let mut header = !a.json;
    let mut io = Ok(());
    let s = walk(&conn, &t, &filter(&[], &a.filter), a.limit, Op::Keep, |d| {
        let mut d = d.clone();
        d.redact();
        let d = &d;
        if std::mem::take(&mut header) {
            io = table_header(out);
        }
        if io.is_ok() {
            io = if a.json {
                writeln!(out, "{}", d.to_json_line())
            } else {
                table_row(out, d)
            };
        }
    })
    .await?;
    if header {
        table_header(out)?;
    }
    io?;
    let _ = conn.close(200, "".into()).await;
    Ok(s)
}

/// `dlq show ID`: everything about one dead letter.
pub async fn dlq_show(g: &GlobalArgs, id: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let (conn, t) = connect(g, "redeliver dlq show").await?;
    let mut found = None;
    walk(
        &conn,
        &t,
        &filter(&[id.to_string()], &Default::default()),
        Some(1),
        Op::Keep,
        |d| found = Some(d.clone()),
    )
    .await?;
    let _ = conn.close(200, "".into()).await;
    let Some(mut d) = found else {
        bail!("no dead letter with id {id:?} in {}", t.dead)
    };
    d.redact();
    let mut doc = serde_json::Map::new();
    doc.insert("id".into(), d.id.clone().into());
    let notification = match &d.notification {
        Some(fields) => serde_json::to_value(fields)?,
        None => String::from_utf8_lossy(&d.raw).into_owned().into(),
    };
    doc.insert("notification".into(), notification);
    doc.insert("dead_letter".into(), serde_json::to_value(&d.meta)?);
    writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    Ok(())
}

/// `dlq replay`: republish to the work queue, then remove.
pub async fn dlq_replay(
    g: &GlobalArgs,
    a: &DlqReplayArgs,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let f = filter(&a.ids, &a.filter);
    if f.is_empty() && !a.all {
        bail!("nothing selected: give ids, --all, or a filter (--reason, --url-contains, --since)");
    }
    let b = broker_settings(g);
    let (conn, t) = connect(g, "redeliver dlq replay").await?;
    let publisher = Publisher::new(
        &conn,
        t.clone(),
        b.delay,
        std::time::Duration::from_secs(30),
    )
    .await?;
    let op = if a.dry_run {
        Op::Keep
    } else {
        Op::Replay(&publisher)
    };
    let mut io = Ok(());
    let s = walk(&conn, &t, &f, a.limit, op, |d| {
        if a.dry_run && io.is_ok() {
            io = writeln!(
                out,
                "would replay {} {}",
                d.id,
                d.url.as_deref().unwrap_or("-")
            );
        }
    })
    .await?;
    io?;
    let _ = conn.close(200, "".into()).await;
    if a.dry_run {
        writeln!(out, "{} would be replayed (dry run)", s.selected)?;
    } else {
        writeln!(out, "replayed {}", s.done)?;
    }
    Ok(s)
}

/// `dlq purge`: without `--yes`, only counts.
pub async fn dlq_purge(
    g: &GlobalArgs,
    a: &DlqPurgeArgs,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let (conn, t) = connect(g, "redeliver dlq purge").await?;
    let op = if a.yes { Op::Purge } else { Op::Keep };
    let s = walk(&conn, &t, &filter(&a.ids, &a.filter), None, op, |_| {}).await?;
    let _ = conn.close(200, "".into()).await;
    if a.yes {
        writeln!(out, "purged {}", s.done)?;
    } else {
        writeln!(out, "{} dead letter(s) would be purged; nothing changed. Run again with --yes to delete them.", s.selected)?;
    }
    Ok(s)
}

/// `dlq export`: JSON lines to stdout or `--out`.
pub async fn dlq_export(
    g: &GlobalArgs,
    a: &DlqExportArgs,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let mut sink: Box<dyn Write + '_> = match &a.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => Box::new(out),
    };
    let (conn, t) = connect(g, "redeliver dlq export").await?;
    let mut io = Ok(());
    let s = walk(&conn, &t, &filter(&[], &a.filter), None, Op::Keep, |d| {
        let mut d = d.clone();
        if !a.include_secrets {
            d.redact();
        }
        if io.is_ok() {
            io = writeln!(sink, "{}", d.to_json_line());
        }
    })
    .await?;
    io?;
    sink.flush()?;
    let _ = conn.close(200, "".into()).await;
    if a.out.is_some() {
        eprintln!("exported {}", s.selected);
    }
    Ok(s)
}

/// `status`.
pub async fn status(
    g: &GlobalArgs,
    a: &StatusArgs,
    out: &mut impl Write,
) -> anyhow::Result<crate::ops::status::Status> {
    let b = broker_settings(g);
    let s = crate::ops::status::status(&b, a.management_url.as_deref())
        .await
        .with_context(|| format!("cannot read status from {}", b.url))?;
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&s)?)?;
        return Ok(s);
    }
    let unacked = |q: &crate::ops::status::QueueStatus| {
        q.unacked
            .map(|n| n.to_string())
            .unwrap_or_else(|| "? (needs --management-url)".into())
    };
    writeln!(out, "prefix         {}  ({})", s.prefix, s.broker)?;
    for q in [&s.work, &s.dead] {
        if q.exists {
            writeln!(
                out,
                "{:<14} ready {}  unacked {}  consumers {}",
                q.name,
                q.ready,
                unacked(q),
                q.consumers
            )?;
        } else {
            writeln!(out, "{:<14} not declared yet", q.name)?;
        }
    }
    // With the cascade the plugin only matters while it still holds
    // messages from before a migration, so its absence is no alarm.
    let avail = match (s.retry_exchange_type_available, s.delay_backend) {
        (true, _) => "available",
        (false, b) if b == DelayBackend::Cascade.as_str() => {
            "not installed (not needed by the cascade)"
        }
        (false, _) => "MISSING (enable rabbitmq_delayed_message_exchange)",
    };
    writeln!(
        out,
        "delay backend  {}: x-delayed-message {avail}",
        s.delay_backend
    )?;
    if let Some(n) = s.plugin_delayed {
        writeln!(out, "plugin holds   {n} delayed messages for this prefix")?;
    }
    if s.hold.exists {
        let h = &s.hold;
        writeln!(
            out,
            "hold           {} ready {}  held {}  holders {}",
            h.name,
            h.ready,
            unacked(h),
            h.consumers
        )?;
    }
    if !s.cascade.is_empty() {
        let waiting: u64 = s.cascade.iter().map(|l| u64::from(l.messages)).sum();
        writeln!(
            out,
            "cascade        {waiting} waiting in {} queues",
            s.cascade.len()
        )?;
        for l in s.cascade.iter().filter(|l| l.messages > 0) {
            let ttl =
                humantime::format_duration(std::time::Duration::from_millis(l.ttl_ms)).to_string();
            writeln!(out, "  {:<40} ({ttl:>11})  {}", l.queue, l.messages)?;
        }
    }
    Ok(s)
}

pub(crate) fn table_header(out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<36}  {:<40}  {:>3}  {:<16}  {:>6}  {:<32}  DEAD AT",
        "ID", "URL", "ATT", "REASON", "STATUS", "LAST ERROR"
    )
}

pub(crate) fn table_row(out: &mut impl Write, d: &DeadLetter) -> std::io::Result<()> {
    let m = &d.meta;
    let dead_at = m
        .dead_at
        .and_then(|ms| u64::try_from(ms).ok())
        .map(|ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        })
        .unwrap_or_else(|| "-".into());
    writeln!(
        out,
        "{:<36}  {:<40}  {:>3}  {:<16}  {:>6}  {:<32}  {dead_at}",
        cut(&d.id, 36),
        cut(d.url.as_deref().unwrap_or("-"), 40),
        m.attempts,
        m.reason.as_deref().unwrap_or("-"),
        m.last_status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into()),
        cut(m.last_error.as_deref().unwrap_or("-"), 32),
    )
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}
