use super::*;

fn tokens() -> Tokens {
    Tokens {
        operator: Some(SecretString::from("op-secret")),
        viewer: Some(SecretString::from("read-secret")),
    }
}

fn browser(role: Role, origin: &'static str) -> Ask<'static> {
    Ask {
        session: Some(role),
        origin: Some(origin),
        host: Some("127.0.0.1:8080"),
        ..Ask::default()
    }
}

#[test]
fn nothing_given_is_401_and_a_wrong_token_too() {
    let t = tokens();
    assert_eq!(
        decide(&t, &Ask::default(), Access::Read),
        Verdict::Unauthorized
    );
    let wrong = Ask {
        bearer: Some("op-secreT"),
        ..Ask::default()
    };
    assert_eq!(decide(&t, &wrong, Access::Read), Verdict::Unauthorized);
}

#[test]
fn a_bearer_token_gives_its_role_and_needs_no_origin() {
    let t = tokens();
    let op = Ask {
        bearer: Some("op-secret"),
        ..Ask::default()
    };
    assert_eq!(
        decide(&t, &op, Access::Change),
        Verdict::Allow(Role::Operator)
    );
    let viewer = Ask {
        bearer: Some("read-secret"),
        ..Ask::default()
    };
    assert_eq!(
        decide(&t, &viewer, Access::Read),
        Verdict::Allow(Role::Viewer)
    );
    assert!(matches!(
        decide(&t, &viewer, Access::Change),
        Verdict::Forbidden(_)
    ));
}

#[test]
fn a_session_changes_only_from_its_own_origin() {
    let t = tokens();
    let own = browser(Role::Operator, "http://127.0.0.1:8080");
    assert_eq!(
        decide(&t, &own, Access::Change),
        Verdict::Allow(Role::Operator)
    );
    for other in ["http://evil.example", "http://127.0.0.1:8081", "null"] {
        let ask = browser(Role::Operator, other);
        assert!(
            matches!(decide(&t, &ask, Access::Change), Verdict::Forbidden(_)),
            "{other}"
        );
        assert_eq!(
            decide(&t, &ask, Access::Read),
            Verdict::Allow(Role::Operator)
        );
    }
    let no_origin = Ask {
        origin: None,
        ..browser(Role::Operator, "")
    };
    assert!(matches!(
        decide(&t, &no_origin, Access::Change),
        Verdict::Forbidden(_)
    ));
    let viewer = browser(Role::Viewer, "http://127.0.0.1:8080");
    assert!(matches!(
        decide(&t, &viewer, Access::Change),
        Verdict::Forbidden(_)
    ));
}

#[test]
fn an_open_console_takes_scripts_and_its_own_pages_but_not_other_sites() {
    let open = Tokens::default();
    let local = Ask {
        host: Some("127.0.0.1:8080"),
        ..Ask::default()
    };
    assert_eq!(
        decide(&open, &local, Access::Change),
        Verdict::Allow(Role::Operator)
    );
    // A rebound name: its Origin matches its Host, but neither is loopback.
    let rebound = Ask {
        origin: Some("http://evil.example:8080"),
        host: Some("evil.example:8080"),
        ..Ask::default()
    };
    assert_eq!(decide(&open, &rebound, Access::Read), Verdict::Unauthorized);
    for h in ["localhost:8080", "[::1]:8080", "127.0.0.1", "LOCALHOST"] {
        assert!(loopback_host(Some(h)), "{h}");
    }
    for h in [
        "evil.example",
        "10.0.0.1:8080",
        "localhost.evil.example:80",
        "",
    ] {
        assert!(!loopback_host(Some(h)), "{h}");
    }
    let other = Ask {
        origin: Some("http://evil.example"),
        host: Some("127.0.0.1:8080"),
        ..Ask::default()
    };
    assert!(matches!(
        decide(&open, &other, Access::Change),
        Verdict::Forbidden(_)
    ));
}

#[test]
fn sessions_and_cookies() {
    let s = Sessions::default();
    let now = Instant::now();
    let id = s.open(Role::Viewer, now);
    assert_eq!(id.len(), 43, "32 random bytes");
    assert_eq!(s.role(&id, now), Some(Role::Viewer));
    assert_eq!(s.role(&id, now + SESSION_TTL), None, "expired");
    let header = format!("a=b; {COOKIE}={id}; c=d");
    assert_eq!(session_id(&header), Some(id.as_str()));
    s.close(&id);
    assert_eq!(s.role(&id, now), None);
    let c = cookie("x", true);
    assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("Secure"));
    assert!(!cookie("x", false).contains("Secure"));
}
