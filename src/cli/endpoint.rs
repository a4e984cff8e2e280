//! `redeliver endpoint ...`, one function per subcommand. Bad input (a
//! resume of what is not paused, a target nobody knows) exits 2.

use std::io::Write;

use crate::cli::args::{
    EndpointCommand, EndpointDisableArgs, EndpointPauseArgs, EndpointShowArgs, GlobalArgs,
};
use crate::cli::errors::Usage;
use crate::cli::settings::broker_settings;
use crate::control::book::Mode;
use crate::control::view::Row;
use crate::message::target::Target;
use crate::ops::endpoints::{self, render, Changed, EndpointError, Op};

/// Runs one `endpoint` subcommand.
pub async fn execute(
    g: &GlobalArgs,
    c: &EndpointCommand,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    match c {
        EndpointCommand::List(a) => list(g, a.json, out).await,
        EndpointCommand::Show(a) => show(g, a, out).await,
        EndpointCommand::Pause(a) => pause(g, a, out).await,
        EndpointCommand::Resume(a) => change(g, &a.target, Op::Resume, out).await,
        EndpointCommand::Disable(a) => disable(g, a, out).await,
        EndpointCommand::Enable(a) => change(g, &a.target, Op::Enable, out).await,
    }
}

/// `endpoint list`: a table, or JSON lines.
pub async fn list(
    g: &GlobalArgs,
    json: bool,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let o = endpoints::overview(&broker_settings(g))
        .await
        .map_err(usage)?;
    if !json {
        render::list(&o, out)?;
        return Ok(());
    }
    for r in &o.rows {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    }
    Ok(())
}

/// `endpoint show ORIGIN`.
pub async fn show(
    g: &GlobalArgs,
    a: &EndpointShowArgs,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let o = endpoints::overview(&broker_settings(g))
        .await
        .map_err(usage)?;
    let key = o.book.get(&a.target);
    // A target no live worker saw lately may still have a history.
    let quiet = key.map(|k| Row {
        endpoint: a.target.to_string(),
        state: k.control.name(o.now_ms),
        control: (k.control != Mode::Active).then(|| k.control.clone()),
        failing_since_ms: k.failing_since_ms,
        failures_since: k.failures,
        last_success_ms: k.last_success_ms,
        ..Row::default()
    });
    let Some(row) = o.row(&a.target).cloned().or(quiet) else {
        return Err(usage(EndpointError::Unknown(a.target.to_string())));
    };
    if a.json {
        let mut v = serde_json::to_value(&row)?;
        v["history"] = serde_json::to_value(key.map(|k| &k.history))?;
        writeln!(out, "{v}")?;
        return Ok(());
    }
    render::show(&o, &row, key, out)?;
    Ok(())
}

async fn pause(
    g: &GlobalArgs,
    a: &EndpointPauseArgs,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let until_ms = a.for_.map(|d| now_ms() + d.as_millis() as u64);
    let op = Op::Pause {
        reason: a.reason.clone(),
        until_ms,
    };
    change(g, &a.target, op, out).await
}

async fn disable(
    g: &GlobalArgs,
    a: &EndpointDisableArgs,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let op = Op::Disable {
        reason: a.reason.clone(),
    };
    change(g, &a.target, op, out).await
}

/// Makes the change and says what it did, and what still holds.
async fn change(
    g: &GlobalArgs,
    target: &Target,
    op: Op,
    out: &mut (impl Write + ?Sized),
) -> anyhow::Result<()> {
    let held = matches!(op, Op::Pause { .. } | Op::Disable { .. });
    let changed = endpoints::change(&broker_settings(g), target, op)
        .await
        .map_err(usage)?;
    say(&changed, target, out)?;
    if held && !changed.seen {
        eprintln!("note: no live worker has seen {target} in the last 10 minutes; it applies as soon as notifications for it arrive");
    }
    Ok(())
}

fn say(c: &Changed, target: &Target, out: &mut (impl Write + ?Sized)) -> std::io::Result<()> {
    let now = now_ms();
    let state = c.after.as_ref().map_or("active", |k| k.control.name(now));
    writeln!(
        out,
        "{target} is {state} (record {}); every worker of the prefix applies it within 2 s",
        c.record.id
    )?;
    if let Some((by, control)) = &c.still_under {
        writeln!(out, "note: {target} is still {} by {by}", control.name(now))?;
    }
    Ok(())
}

/// Bad input exits 2; anything else is an error like any other.
fn usage(e: EndpointError) -> anyhow::Error {
    match e.is_usage() {
        true => anyhow::Error::new(Usage(e.to_string())),
        false => anyhow::Error::new(e),
    }
}

fn now_ms() -> u64 {
    crate::clock::now_ms().max(0) as u64
}
