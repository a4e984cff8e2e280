//! `/dead-letters`: the filter, the rows (selectable one by one or "all
//! matching"), replay at a rate with its progress, and purge behind a
//! confirmation.

use maud::{html, Markup};

use super::layout::{endpoint_link, notification_link, page, state};
use super::views::{DeadFilter, DeadLetters, DEAD_SHOWN};
use crate::console::auth::Role;
use crate::console::jobs::Job;
use crate::ops::endpoints::render::ago;

pub fn dead_letters(v: &DeadLetters, f: &DeadFilter, jobs: &[Job], role: Role) -> Markup {
    let running = jobs.iter().any(|j| j.state == "running");
    let body = html! {
        h1 { "Dead letters" }
        p.muted #dead-summary {
            (v.matching) " matching of " (v.total) " in the queue (read " (v.as_of) ")"
            @if v.matching > DEAD_SHOWN { "; the first " (DEAD_SHOWN) " shown" }
        }
        @if let Some(e) = &v.error { p.error { (e) } }
        (filter_form(v, f))
        @if role == Role::Operator { (actions(v, f)) }
        div #replays data-running=(running) {
            @for j in jobs { (job_line(j)) }
        }
        (rows(v, role))
    };
    page("Dead letters", "/dead-letters", Some(role), body)
}

fn filter_form(v: &DeadLetters, f: &DeadFilter) -> Markup {
    html! {
        form.inline #filter method="get" action="/dead-letters" {
            input name="endpoint" value=(f.endpoint) placeholder="endpoint (origin)" aria-label="Endpoint";
            select name="reason" aria-label="Reason" {
                option value="" { "any reason" }
                @for r in &v.reasons { option value=(r) selected[*r == f.reason] { (r) } }
            }
            input name="since" value=(f.since) placeholder="died within (e.g. 1h)" aria-label="Since" size="12";
            button type="submit" { "Filter" }
        }
    }
}

/// Replay and purge, each with the filter as hidden fields (for "all matching").
fn actions(v: &DeadLetters, f: &DeadFilter) -> Markup {
    let hidden = html! {
        input type="hidden" name="endpoint" value=(f.endpoint);
        input type="hidden" name="reason" value=(f.reason);
        input type="hidden" name="since" value=(f.since);
    };
    html! {
        div.actions {
        span.muted { "The rows ticked below, or all matching: " }
        form.inline #replay data-api="/api/dead-letters/replay" data-select data-after="job" {
            (hidden)
            label { input type="checkbox" name="all"; " all " (v.matching) " matching" }
            label { " at " input name="rate" value="10/s" aria-label="Rate" size="7"; }
            button type="submit" { "Replay" }
            span.msg data-msg {}
        }
        button.danger type="button" #purge-open data-reveal="purge-confirm" { "Purge…" }
        div.note.hidden #purge-confirm {
            form.inline #purge data-api="/api/dead-letters/purge" data-select data-after="purged" {
                (hidden)
                label { input type="checkbox" name="all"; " all " (v.matching) " matching" }
                " Purged dead letters are gone for good. "
                button.danger type="submit" #purge-now { "Purge now" }
                span.msg data-msg {}
            }
        }
        }
    }
}

fn job_line(j: &Job) -> Markup {
    html! {
        div.replay data-state=(j.state) {
            (j.started_at) " " (j.selection)
            @if let Some(r) = &j.rate { " at " (r) }
            ": " (j.state) ", replayed " (j.replayed) ", looked at " (j.seen) " of " (j.total)
            @if let Some(e) = &j.error { " (" (e) ")" }
        }
    }
}

fn rows(v: &DeadLetters, role: Role) -> Markup {
    let now = crate::clock::now_ms().max(0) as u64;
    html! {
        table #dead-letters {
            thead { tr {
                th { @if role == Role::Operator { input type="checkbox" #select-page aria-label="Select all shown"; } }
                th { "Notification" } th { "Endpoint" } th { "Reason" } th.num { "Attempts" }
                th.num { "Last status" } th { "Last error" } th { "Died" }
            } }
            tbody {
                @for d in &v.rows {
                    tr data-id=(d.id) {
                        td { @if role == Role::Operator { input type="checkbox" name="id" value=(d.id) aria-label="Select"; } }
                        td { (notification_link(&d.id)) }
                        td { @if let Some(e) = &d.endpoint { (endpoint_link(e)) } }
                        td { @if let Some(r) = &d.reason { (state("dead")) " " (r) } }
                        td.num { (d.attempts) }
                        td.num { (d.last_status.map_or("-".to_string(), |s| s.to_string())) }
                        td { (d.last_error.as_deref().unwrap_or("")) }
                        td { (ago(now, d.dead_at_ms.map(|t| t.max(0) as u64))) }
                    }
                }
            }
        }
    }
}
