//! The operator commands: `dlq ...` and `status`, one function each.

use std::io::Write;

use anyhow::{bail, Context as _};

use crate::cli::args::{
    DlqExportArgs, DlqFilterArgs, DlqListArgs, DlqPurgeArgs, GlobalArgs, StatusArgs,
};
use crate::cli::settings::broker_settings;
use crate::message::dead_letter::Filter;
use crate::ops::dlq::{walk, Op, Summary};
use crate::ops::render::{table_header, table_row};
use crate::topology::Topology;

pub(super) fn filter(ids: &[String], f: &DlqFilterArgs) -> Filter {
    Filter {
        ids: ids.to_vec(),
        reason: f.reason.clone(),
        url_contains: f.url_contains.clone(),
        endpoint: f.endpoint.clone(),
        since: f.since,
    }
}

pub(super) async fn connect(
    g: &GlobalArgs,
    name: &str,
) -> anyhow::Result<(lapin::Connection, Topology)> {
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
    out: &mut (impl Write + ?Sized),
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
pub async fn dlq_show(
    g: &GlobalArgs,
    id: &str,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
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

/// `dlq purge`: without `--yes`, counts what would go and fails, so a
/// script's `redeliver dlq purge && ...` never goes on as if it purged.
pub async fn dlq_purge(
    g: &GlobalArgs,
    a: &DlqPurgeArgs,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<Summary> {
    let (conn, t) = connect(g, "redeliver dlq purge").await?;
    let op = if a.yes { Op::Purge } else { Op::Keep };
    let s = walk(&conn, &t, &filter(&a.ids, &a.filter), None, op, |_| {}).await?;
    let _ = conn.close(200, "".into()).await;
    if !a.yes {
        writeln!(
            out,
            "{} dead letter(s) would be purged; nothing changed.",
            s.selected
        )?;
        bail!("dlq purge deletes for good: run it again with --yes to delete them");
    }
    writeln!(out, "purged {}", s.done)?;
    Ok(s)
}

/// `dlq export`: JSON lines to stdout or `--out`.
pub async fn dlq_export(
    g: &GlobalArgs,
    a: &DlqExportArgs,
    out: &mut (impl Write + ?Sized),
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
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<crate::ops::status::Status> {
    let b = broker_settings(g);
    let s = crate::ops::status::status(&b, a.management_url.as_deref())
        .await
        .with_context(|| format!("cannot read status from {}", b.url))?;
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&s)?)?;
        return Ok(s);
    }
    crate::ops::render::status(&s, out)?;
    Ok(s)
}
