//! Who may read and who may change, decided in one pure function
//! ([`decide`]) from what a request carries, beside the sessions the
//! sign-in form opens.
//!
//! - A bearer token (scripts, `redeliver history`) is checked alone: it is
//!   no ambient credential, so a cross-site page cannot send it.
//! - A session cookie is one: a change made with it must also carry an
//!   `Origin` that is the console's own, or another site could post a
//!   form to it (the cookie's `SameSite=Strict` is the first wall, this
//!   the second).
//! - A console given no token (loopback only) is open to every local
//!   user, but a browser's change must still come from its own pages.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use secrecy::{ExposeSecret, SecretString};

/// The session cookie's name.
pub const COOKIE: &str = "redeliver_console";
/// A session ends this long after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `--read-token`: sees everything, changes nothing.
    Viewer,
    /// `--token`: may also pause, replay and purge.
    Operator,
}

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Change,
}

/// What a request carries, read from its headers.
#[derive(Debug, Default)]
pub struct Ask<'a> {
    pub bearer: Option<&'a str>,
    /// The role of the session its cookie names, if that session is live.
    pub session: Option<Role>,
    pub origin: Option<&'a str>,
    pub host: Option<&'a str>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow(Role),
    /// 401: no credential, or a wrong one.
    Unauthorized,
    /// 403: a credential that may not do this.
    Forbidden(&'static str),
}

/// The tokens a console was given.
#[derive(Clone, Default)]
pub struct Tokens {
    pub operator: Option<SecretString>,
    pub viewer: Option<SecretString>,
}

impl Tokens {
    /// No token at all: a loopback console open to its machine.
    pub fn open(&self) -> bool {
        self.operator.is_none() && self.viewer.is_none()
    }

    /// The role a token gives (compared in constant time).
    pub fn role_of(&self, given: &str) -> Option<Role> {
        let is = |t: &Option<SecretString>| {
            t.as_ref()
                .is_some_and(|t| same(given.as_bytes(), t.expose_secret().as_bytes()))
        };
        match (is(&self.operator), is(&self.viewer)) {
            (true, _) => Some(Role::Operator),
            (_, true) => Some(Role::Viewer),
            _ => None,
        }
    }
}

/// The verdict on `ask` for `access`.
pub fn decide(tokens: &Tokens, ask: &Ask<'_>, access: Access) -> Verdict {
    let role = if let Some(given) = ask.bearer {
        match tokens.role_of(given) {
            Some(r) => r,
            None => return Verdict::Unauthorized,
        }
    } else {
        // An open console answers only requests sent to a loopback name:
        // a web page cannot reach it through a name of its own that it
        // points at 127.0.0.1 (DNS rebinding).
        let open = tokens.open() && loopback_host(ask.host);
        let Some(role) = ask.session.or(open.then_some(Role::Operator)) else {
            return Verdict::Unauthorized;
        };
        // A browser's change must come from the console's own pages; a
        // script on an open console sends no Origin at all.
        let browser_less = ask.session.is_none() && ask.origin.is_none();
        if access == Access::Change && !browser_less && !own_origin(ask.origin, ask.host) {
            return Verdict::Forbidden("a change must come from the console's own pages (Origin)");
        }
        role
    };
    match (access, role) {
        (Access::Change, Role::Viewer) => Verdict::Forbidden("a read-only token changes nothing"),
        _ => Verdict::Allow(role),
    }
}

/// `Host` is `localhost`, `127.0.0.1` or `[::1]`, with any port.
pub fn loopback_host(host: Option<&str>) -> bool {
    let Some(h) = host else {
        return false;
    };
    let name = match h.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => h.rsplit_once(':').map_or(h, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Origin: http://HOST` names the host the request was sent to.
pub fn own_origin(origin: Option<&str>, host: Option<&str>) -> bool {
    match (origin, host) {
        (Some(o), Some(h)) => o
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(h)),
        _ => false,
    }
}

/// Equal bytes, compared as SHA-256 digests in constant time: neither
/// the contents nor the length of a token leak through timing.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

/// Sessions kept at most; the oldest go first past it.
const MAX_SESSIONS: usize = 10_000;

/// The live sessions, by the random id their cookie holds.
#[derive(Default)]
pub struct Sessions(Mutex<HashMap<String, (Role, Instant)>>);

impl Sessions {
    /// Opens a session; its id, for the cookie.
    pub fn open(&self, role: Role, now: Instant) -> String {
        let mut id = [0u8; 32];
        rand::fill(&mut id);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id);
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, (_, at)| now.duration_since(*at) < SESSION_TTL);
            while m.len() >= MAX_SESSIONS {
                let oldest = m
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => drop(m.remove(&k)),
                    None => break,
                }
            }
            m.insert(id.clone(), (role, now));
        }
        id
    }

    pub fn role(&self, id: &str, now: Instant) -> Option<Role> {
        let m = self.0.lock().ok()?;
        let (role, at) = m.get(id)?;
        (now.duration_since(*at) < SESSION_TTL).then_some(*role)
    }

    pub fn close(&self, id: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(id);
        }
    }
}

/// The session id in a `Cookie` header.
pub fn session_id(cookie_header: &str) -> Option<&str> {
    cookie_header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// The `Set-Cookie` value of a session: never readable by scripts, never
/// sent by another site's request, and only over https when served so.
pub fn cookie(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let max_age = SESSION_TTL.as_secs();
    format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn expired_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
