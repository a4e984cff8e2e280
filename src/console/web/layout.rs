//! The frame every page shares (navigation, search, sign-out), the
//! sign-in form, and the small pieces the pages repeat. maud escapes
//! every value spliced into the markup: nothing here opts out of it.

use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use crate::console::auth::Role;

/// The pages the navigation names: path and label.
const NAV: [(&str, &str); 3] = [
    ("/", "Overview"),
    ("/endpoints", "Endpoints"),
    ("/dead-letters", "Dead letters"),
];

/// A page: its title, which navigation entry is current, and its body.
pub fn page(title: &str, here: &str, role: Option<Role>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · redeliver" }
                link rel="stylesheet" href="/assets/console.css";
                link rel="icon" href="data:,";
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "redeliver" }
                    @for (path, label) in NAV {
                        a href=(path) class=[(path == here).then_some("here")] { (label) }
                    }
                    form method="get" action="/search" role="search" {
                        input type="search" name="q" placeholder="notification id, webhook-id or endpoint" aria-label="Search";
                        button type="submit" { "Search" }
                    }
                    @if let Some(role) = role {
                        @if role == Role::Viewer { span.muted { "read-only" } }
                        form method="post" action="/logout" { button type="submit" { "Sign out" } }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The sign-in form: one password field for the token.
pub fn login(wrong: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Sign in · redeliver" }
                link rel="stylesheet" href="/assets/console.css";
                link rel="icon" href="data:,";
            }
            body {
                form.login method="post" action="/login" {
                    h1 { "redeliver console" }
                    @if wrong { p.error { "That token is not one this console takes." } }
                    label for="token" { "Token" }
                    input #token type="password" name="token" autocomplete="current-password" autofocus required;
                    button type="submit" { "Sign in" }
                }
            }
        }
    }
}

/// A page that says what was not found.
pub fn not_found(what: &str, role: Option<Role>) -> Markup {
    page(
        "Not found",
        "",
        role,
        html! { h1 { "Not found" } p { (what) } },
    )
}

/// A state as a coloured word.
pub fn state(s: &str) -> Markup {
    html! { span class={ "state state-" (s) } { (s) } }
}

/// A path segment (an id, an origin) for a link.
pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

/// `/endpoints/{origin}`.
pub fn endpoint_link(origin: &str) -> Markup {
    html! { a href={ "/endpoints/" (seg(origin)) } { (origin) } }
}

/// `/notifications/{id}`.
pub fn notification_link(id: &str) -> Markup {
    html! { a href={ "/notifications/" (seg(id)) } { (id) } }
}

/// The operator's forms for one target: pause (reason, duration), resume,
/// disable (reason), enable. Viewers get none.
pub fn endpoint_actions(target: &str, state: &str, role: Role) -> Markup {
    if role == Role::Viewer {
        return html! {};
    }
    html! {
        @if state == "paused" {
            (action(target, "resume", "Resume", html! {}))
        } @else if state == "disabled" {
            (action(target, "enable", "Enable", html! {}))
        } @else {
            (action(target, "pause", "Pause", html! {
                input name="reason" placeholder="reason" aria-label="Pause reason" size="12";
                input name="for" placeholder="for (e.g. 1h)" aria-label="Pause for" size="9";
            }))
            (action(target, "disable", "Disable", html! {
                input name="reason" placeholder="reason" aria-label="Disable reason" size="12";
            }))
        }
    }
}

fn action(target: &str, what: &str, label: &str, extra: Markup) -> Markup {
    html! {
        form.inline data-api={ "/api/endpoints/" (what) } data-target=(target) {
            input type="hidden" name="target" value=(target);
            (extra)
            button type="submit" class=[(what == "disable").then_some("danger")] { (label) }
            span.msg data-msg {}
        }
    }
}

/// Text kept as the receiver sent it, shown as text (escaped).
pub fn snippet(text: &str) -> Markup {
    if text.is_empty() {
        return html! { span.muted { "-" } };
    }
    html! { pre { (text) } }
}
