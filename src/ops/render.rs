//! What operators read: the `status` report and the dead-letter table, as
//! text. The JSON forms are the types' own `Serialize`.

use std::io::{self, Write};

use crate::config::DelayBackend;
use crate::delay::report::ProbeState;
use crate::message::dead_letter::DeadLetter;
use crate::ops::status::{QueueStatus, Status};

/// `status` as text: the prefix's queues, the delay backend, the holder
/// and the cascade's waiting messages.
pub fn status(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    writeln!(out, "prefix         {}  ({})", s.prefix, s.broker)?;
    cluster(s, out)?;
    lanes(s, out)?;
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
            placement(q, out)?;
        } else {
            writeln!(out, "{:<14} not declared yet", q.name)?;
        }
    }
    delay_backend(s, out)?;
    endpoints(s, out)?;
    let events = crate::ops::events_status::line(&s.events);
    writeln!(out, "events         {events}")?;
    cascade(s, out)
}

/// One line per lane: its depth, consumers and leader; then the old
/// single work queue while the workers drain it.
fn lanes(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    let legacy = s.lanes.legacy.iter().map(|q| (q, " (draining)"));
    for (q, note) in s.lanes.lanes.iter().map(|q| (q, "")).chain(legacy) {
        let leader = q.placement.as_ref().and_then(|p| p.leader.as_deref());
        writeln!(
            out,
            "lane           {}  ready {}  unacked {}  consumers {}  leader {}{note}",
            q.name,
            q.ready,
            unacked(q),
            q.consumers,
            leader.unwrap_or("?")
        )?;
    }
    let per_node = [
        ("lane leaders", &s.lane_leaders),
        ("workers", &s.workers_by_node),
    ];
    for (label, by) in per_node {
        if !by.is_empty() {
            let each: Vec<String> = by.iter().map(|(n, c)| format!("{n} {c}")).collect();
            writeln!(out, "{label:<14} {}", each.join(", "))?;
        }
    }
    Ok(())
}

/// One line: endpoints by state (`redeliver endpoint list` has them all).
fn endpoints(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    let Some(e) = &s.endpoints else {
        return writeln!(
            out,
            "endpoints      ? (the endpoint state could not be read)"
        );
    };
    writeln!(
        out,
        "endpoints      {} active, {} paused, {} disabled, {} breaker open ({} worker(s) reporting)",
        e.active, e.paused, e.disabled, e.breaker_open, e.workers
    )?;
    writeln!(out, "parked         {} in the parking queues", s.parked)?;
    for (endpoint, n) in &e.parked {
        writeln!(out, "  parked       {endpoint}  {n}")?;
    }
    Ok(())
}

/// The node this report came through and, from the management API, the
/// cluster's nodes.
fn cluster(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    let node = s.node.as_deref().unwrap_or("? (needs --management-url)");
    writeln!(out, "connected to   {}  node {node}", s.connected)?;
    if let Some(nodes) = s.cluster.as_ref().filter(|n| !n.is_empty()) {
        let each: Vec<String> = nodes
            .iter()
            .map(|n| format!("{} {}", n.name, if n.running { "running" } else { "DOWN" }))
            .collect();
        writeln!(
            out,
            "cluster        {} node(s): {}",
            nodes.len(),
            each.join(", ")
        )?;
    }
    Ok(())
}

/// A queue's type, leader and members, when the management API told them.
fn placement(q: &QueueStatus, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    let Some(p) = &q.placement else {
        return Ok(());
    };
    let leader = p.leader.as_deref().unwrap_or("none");
    if p.members.is_empty() {
        return writeln!(out, "{:<14} {} on {leader}", "", p.kind);
    }
    let down: Vec<&str> = p
        .members
        .iter()
        .filter(|m| !p.online.contains(m))
        .map(String::as_str)
        .collect();
    let down = match down.is_empty() {
        true => String::new(),
        false => format!("; offline: {}", down.join(", ")),
    };
    writeln!(
        out,
        "{:<14} {}, leader {leader}, members {}{down}",
        "",
        p.kind,
        p.members.join(", ")
    )
}

fn unacked(q: &QueueStatus) -> String {
    q.unacked
        .map(|n| n.to_string())
        .unwrap_or_else(|| "? (needs --management-url)".into())
}

fn delay_backend(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
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
    probes(s, out)
}

/// What the workers' delay probes report, one line per backend.
fn probes(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    if s.delay_probes.is_empty() {
        return writeln!(
            out,
            "delay probes   no worker reported in the last 90 s (none running, or --delay-probe-every 0s)"
        );
    }
    for p in &s.delay_probes {
        let since = p
            .since_ms
            .map(|ms| {
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                format!(" since {}", humantime::format_rfc3339_seconds(t))
            })
            .unwrap_or_default();
        let state = match p.state {
            ProbeState::Stalled => format!(
                "STALLED{since} ({} of {} workers; retries through it are held; see docs/operations.md)",
                p.stalled_workers, p.workers
            ),
            ProbeState::Routing => format!("routing ({} workers)", p.workers),
            ProbeState::Unknown => format!("unknown ({} workers; no probe back yet)", p.workers),
        };
        writeln!(
            out,
            "{:<14} {state}",
            format!("probe {}", p.backend.as_str())
        )?;
        if p.failover_workers > 0 {
            writeln!(
                out,
                "{:<14} new delays go through the cascade on {} workers",
                "failover", p.failover_workers
            )?;
        }
    }
    Ok(())
}

fn cascade(s: &Status, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
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
        placement(h, out)?;
    }
    if !s.cascade.is_empty() {
        let waiting: u64 = s.cascade.iter().map(|l| u64::from(l.messages)).sum();
        writeln!(
            out,
            "cascade        {waiting} waiting in {} queues",
            s.cascade.len()
        )?;
        if !s.cascade_leaders.is_empty() {
            let each: Vec<String> = s
                .cascade_leaders
                .iter()
                .map(|(node, n)| format!("{node} {n}"))
                .collect();
            writeln!(out, "               leaders: {}", each.join(", "))?;
        }
        for l in s.cascade.iter().filter(|l| l.messages > 0) {
            let ttl =
                humantime::format_duration(std::time::Duration::from_millis(l.ttl_ms)).to_string();
            writeln!(out, "  {:<40} ({ttl:>11})  {}", l.queue, l.messages)?;
        }
    }
    Ok(())
}

pub fn table_header(out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    writeln!(
        out,
        "{:<36}  {:<40}  {:>3}  {:<16}  {:>6}  {:<32}  DEAD AT",
        "ID", "URL", "ATT", "REASON", "STATUS", "LAST ERROR"
    )
}

pub fn table_row(out: &mut (impl Write + ?Sized), d: &DeadLetter) -> io::Result<()> {
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
