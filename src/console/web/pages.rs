//! The overview, endpoints and notification pages, laid out from their
//! view models (`views.rs`). The dead letters' page is `dead_page.rs`.

use maud::{html, Markup};

use super::layout::{endpoint_actions, endpoint_link, notification_link, page, snippet, state};
use super::views::{Chart, EndpointRow, Notification, Overview};
use crate::console::auth::Role;
use crate::history::record::Attempt;

/// `/`.
pub fn overview(o: &Overview, role: Role) -> Markup {
    let (delivered, retried, dead) = o.chart.totals();
    let [active, paused, disabled, open] = o.by_state;
    let body = html! {
        h1 { "Overview" }
        @if let Some(e) = &o.error { p.error { (e) } }
        div.cards {
            div.card #backlog { b { (o.backlog) } span { "backlog (work queue)" } }
            div.card #dlq-depth { b { (o.dead) } span { "dead letters" } }
            div.card #workers { b { (o.workers) } span { "workers reporting (" (o.consumers) " consumers)" } }
            div.card { b { (delivered) } span { "delivered, last hour" } }
            div.card { b { (retried) } span { "retried, last hour" } }
            div.card { b { (dead) } span { "dead, last hour" } }
        }
        h2 { "Per minute, last hour" }
        (chart(&o.chart))
        h2 { "Delay backend" }
        @if o.backends.is_empty() { p.muted { "no worker reports a delay probe" } }
        @for (name, st, stalled) in &o.backends {
            p { (name) " " (state(st)) @if *stalled { " — retries wait on a stalled backend" } }
        }
        h2 { "Endpoints by state" }
        p #by-state {
            (state("active")) " " (active) "  " (state("paused")) " " (paused) "  "
            (state("disabled")) " " (disabled) "  " (state("breaker-open")) " " (open)
        }
        h2 { "Failing most (last 5 minutes)" }
        @if o.failing.is_empty() { p.muted { "no endpoint failing now" } } @else {
            (endpoint_table(&o.failing, role))
        }
    };
    page("Overview", "/", Some(role), body)
}

/// Stacked bars, one per minute: delivered, retried, dead.
fn chart(c: &Chart) -> Markup {
    const W: i64 = 16;
    const H: i64 = 140;
    let scale = |n: i64| n * H / c.max;
    html! {
        svg #chart width=(W * c.bars.len() as i64) height=(H) viewBox={ "0 0 " (W * c.bars.len() as i64) " " (H) } role="img" aria-label="attempts per minute" {
            @for (i, b) in c.bars.iter().enumerate() {
                @let x = i as i64 * W;
                @let (d, r, x_) = (scale(b.delivered), scale(b.retry), scale(b.dead));
                rect.delivered x=(x) y=(H - d) width=(W - 2) height=(d) { title { (b.delivered) " delivered" } }
                rect.retry x=(x) y=(H - d - r) width=(W - 2) height=(r) { title { (b.retry) " retried" } }
                rect.dead x=(x) y=(H - d - r - x_) width=(W - 2) height=(x_) { title { (b.dead) " dead" } }
            }
        }
        p.legend.muted { (super::views::CHART_MINUTES) " minutes ago → now · " }
        p.legend.muted { i.delivered {} "delivered" i.retry {} "retried" i.dead {} "dead" " · tallest minute: " (c.max) }
    }
}

/// `/endpoints`.
pub fn endpoints(rows: &[EndpointRow], role: Role) -> Markup {
    let body = html! {
        h1 { "Endpoints" }
        p.muted { "Every endpoint a live worker saw in the last 10 minutes, and every target paused or disabled. Changes reach every worker within 2 s." }
        @if rows.is_empty() { p.muted { "no endpoint yet" } } @else { (endpoint_table(rows, role)) }
    };
    page("Endpoints", "/endpoints", Some(role), body)
}

fn endpoint_table(rows: &[EndpointRow], role: Role) -> Markup {
    html! {
        table #endpoints {
            thead { tr {
                th { "Endpoint" } th { "State" } th.num { "Success (1 h)" } th.num { "Attempts" }
                th.num { "p50" } th.num { "p99" } th { "Last error" } th { "Paused until" } th { "Reason" } th.num { "Waiting" } th {}
            } }
            tbody {
                @for r in rows {
                    tr data-endpoint=(r.endpoint) {
                        td { (endpoint_link(&r.endpoint)) }
                        td.endpoint-state { (state(r.state)) }
                        td.num { (r.success) } td.num { (r.attempts) }
                        td.num { (r.p50) } td.num { (r.p99) }
                        td { (r.last_error) } td { (r.paused_until) } td { (r.reason) }
                        td.num { (r.waiting) }
                        td { (endpoint_actions(&r.endpoint, r.state, role)) }
                    }
                }
            }
        }
    }
}

/// `/endpoints/{origin}`: its line and its recent attempts.
pub fn endpoint(row: &EndpointRow, recent: &[Attempt], role: Role) -> Markup {
    let body = html! {
        h1 { "Endpoint " (row.endpoint) }
        (endpoint_table(std::slice::from_ref(row), role))
        h2 { "Recent attempts" }
        @if recent.is_empty() { p.muted { "none in the history" } } @else {
            table #attempts {
                thead { tr { th { "Started" } th { "Notification" } th.num { "Attempt" } th { "Outcome" } th.num { "Status" } th.num { "Duration" } th { "Error" } } }
                tbody {
                    @for a in recent {
                        tr {
                            td { (a.started_at) } td { (notification_link(&a.notification_id)) }
                            td.num { (a.attempt) }
                            td { (state(outcome(a))) }
                            td.num { (a.status.map_or("-".to_string(), |s| s.to_string())) }
                            td.num { (a.duration_ms) " ms" }
                            td { (a.error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    };
    page(&row.endpoint, "/endpoints", Some(role), body)
}

fn outcome(a: &Attempt) -> &'static str {
    use crate::history::record::Outcome;
    match a.outcome {
        Outcome::Delivered => "delivered",
        Outcome::Retry => "retry",
        Outcome::Dead => "dead",
    }
}

/// `/notifications/{id}`: every attempt in order.
/// `running`: a replay is under way, whose progress the page follows.
pub fn notification(n: &Notification, running: bool, role: Role) -> Markup {
    let body = html! {
        h1 { "Notification " code #notification-id { (n.id) } }
        p { "Target " code { (n.url) } }
        @if n.dead && role == Role::Operator {
            form.inline #replay data-api="/api/dead-letters/replay" data-after="job" {
                input type="hidden" name="ids" value=(n.id);
                button type="submit" { "Replay" }
                span.msg data-msg {}
            }
            div #replays data-running=(running) {}
        }
        table #attempts {
            thead { tr { th.num { "Attempt" } th { "Started" } th { "Outcome" } th.num { "Status" } th.num { "Duration" } th { "Error" } th { "Response body" } th { "Next retry" } th { "Trace id" } } }
            tbody {
                @for a in &n.attempts {
                    tr.attempt {
                        td.num { (a.attempt) } td { (a.started_at) }
                        td { (state(a.outcome)) @if !a.dead_reason.is_empty() { " (" (a.dead_reason) ")" } }
                        td.num.status { (a.status) } td.num { (a.duration) }
                        td { (a.error) } td.response { (snippet(&a.response)) }
                        td { (a.next_retry) } td { code { (a.trace_id) } }
                    }
                }
            }
        }
        h2 { "Request body" }
        (snippet(n.request_body.as_deref().unwrap_or("")))
    };
    page(&format!("Notification {}", n.id), "", Some(role), body)
}
