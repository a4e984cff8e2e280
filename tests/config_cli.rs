//! The config file through the CLI: `config check` names the line of an
//! error, `config show` shows flags > env > file > defaults and never a
//! secret.

mod common;

use std::process::Output;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn file(text: &str) -> tempfile_path::TempFile {
    tempfile_path::TempFile::new(text)
}

/// The binary with `args` and, of the REDELIVER_* variables, only `env`.
fn redeliver(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = common::redeliver_command();
    c.args(args).envs(env.iter().copied()).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A file under the system temp dir, removed on drop.
mod tempfile_path {
    pub struct TempFile(pub std::path::PathBuf);
    impl TempFile {
        pub fn new(text: &str) -> Self {
            let name = format!("redeliver-{}.toml", uuid::Uuid::new_v4().simple());
            let p = std::env::temp_dir().join(name);
            std::fs::write(&p, text).unwrap();
            TempFile(p)
        }
        pub fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn check_names_the_line_of_each_kind_of_error() {
    let cases = [
        (
            "prefix = \"a\"\n[run]\nconcurency = 3\n",
            ":3:",
            "unknown setting `concurency`",
        ),
        ("[run]\n\nconcurrency = \"many\"\n", ":3:", "invalid value"),
        ("[run]\ntimeout = 5s\n", ":2:", ""),
        (
            "[run]\nsigning-secret = \"whsec_abc\"\n",
            ":2:",
            "not valid base64",
        ),
        (
            "[[route]]\nurl-prefix = \"https://a/\"\nmax-attempts = 0\n",
            ":3:",
            "max-attempts",
        ),
        (
            "[[route]]\n\ntimeout = \"5s\"\n",
            ":1:",
            "needs a `url-prefix`",
        ),
        (
            "[[route]]\nurl-prefix = \"pay.example.com\"\n",
            ":2:",
            "http://",
        ),
        (
            "[run]\nschedule = \"1s\"\njitter = \"full\"\n",
            ":3:",
            "cannot be used with",
        ),
        (
            "[run]\nconcurrency = 8\nprefetch = 4\n",
            ":3:",
            "below --concurrency",
        ),
        ("[run]\nmax-attempts = 0\n", ":2:", "max attempts"),
        ("[run]\nconcurrency = true\n", ":2:", "not true or false"),
        ("[run]\ndeny-private = \"yes\"\n", ":2:", "true or false"),
    ];
    for (toml, line, msg) in cases {
        let f = file(toml);
        let (_, err) = text(&redeliver(&["config", "check", f.path()], &[]));
        assert!(
            err.contains(&format!("{}{line}", f.path())),
            "{toml:?}: {err}"
        );
        assert!(err.contains(msg), "{toml:?}: {err}");
        // The same file given to `run` stops it before it starts.
        let o = redeliver(&["--config", f.path(), "run"], &[]);
        assert!(!o.status.success());
        assert!(text(&o).1.contains(line), "{toml:?}: {}", text(&o).1);
    }
    let good =
        file("prefix = \"p\"\n[run]\nconcurrency = 8\n[[route]]\nurl-prefix = \"https://a/\"\n");
    let o = redeliver(&["config", "check", good.path()], &[]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("ok"));
}

#[test]
fn show_applies_flags_then_env_then_file_then_defaults() {
    let f = file(&format!(
        "prefix = \"from-file\"\namqp-url = \"amqp://u:hunter2@h:5672/%2f\"\n[run]\n\
         concurrency = 7\nprefetch = 700\ntimeout = \"3s\"\nsigning-secret = [\"{SECRET}\"]\n\
         [[route]]\nurl-prefix = \"https://pay.example.com/\"\nsigning-secret = \"{SECRET}\"\n"
    ));
    let env = [("REDELIVER_CONCURRENCY", "9"), ("REDELIVER_TIMEOUT", "4s")];
    let o = redeliver(&["--config", f.path(), "config", "show"], &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("prefix = \"from-file\"  # file, line 1"),
        "{out}"
    );
    assert!(out.contains("concurrency = 9  # env"), "{out}");
    assert!(out.contains("prefetch = 700  # file, line 5"), "{out}");
    assert!(out.contains("timeout = \"4s\"  # env"), "{out}");
    assert!(
        out.contains("confirm-timeout = \"30s\"  # default"),
        "{out}"
    );
    assert!(
        out.contains("url-prefix = \"https://pay.example.com/\""),
        "{out}"
    );
    assert!(
        !out.contains("MfKQ") && !out.contains("hunter2"),
        "secrets leaked: {out}"
    );
    // A flag beats the env and the file.
    let o = redeliver(
        &[
            "--config",
            f.path(),
            "--prefix",
            "from-flag",
            "config",
            "show",
        ],
        &env,
    );
    assert!(
        text(&o).0.contains("prefix = \"from-flag\"  # flag"),
        "{}",
        text(&o).0
    );
}

#[test]
fn a_bad_signing_secret_is_refused_without_echoing_it() {
    let bad = "whsec_not*base64*but-very-secret";
    let o = redeliver(
        &[
            "--amqp-url",
            "amqp://guest:guest@127.0.0.1:1/%2f",
            "run",
            "--signing-secret",
            bad,
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--signing-secret"), "{err}");
    assert!(
        !out.contains("very-secret") && !err.contains("very-secret"),
        "{err}"
    );
}

/// A higher layer wins over a conflicting file setting instead of failing,
/// and `config check` ignores this shell's REDELIVER_* variables.
#[test]
fn flags_and_env_override_conflicting_file_settings() {
    let f = file("[run]\nschedule = \"15s,30s\"\n");
    let o = redeliver(
        &[
            "--config",
            f.path(),
            "config",
            "show",
            "--initial-delay",
            "5s",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("initial-delay = \"5s\"  # flag"), "{out}");
    assert!(out.contains("# schedule (unset)"), "{out}");
    let o = redeliver(
        &["--config", f.path(), "config", "show"],
        &[("REDELIVER_JITTER", "full")],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    let env = [
        ("REDELIVER_CONCURRENCY", "abc"),
        ("REDELIVER_CONFIG", "/nonexistent.toml"),
    ];
    let o = redeliver(&["config", "check", f.path()], &env);
    assert!(o.status.success(), "{}", text(&o).1);
}

/// Only the plugin confirms before its disk write, so only it gets a
/// settle by default.
#[test]
fn retry_settle_defaults_by_delay_backend() {
    use clap::Parser;
    use std::time::Duration;
    let settle = |args: &[&str]| {
        let cli = redeliver::cli::Cli::try_parse_from(args).unwrap();
        let redeliver::cli::Command::Run(a) = &cli.command else {
            panic!("not run")
        };
        let s = redeliver::cli::settings::worker_settings(a, cli.global.delay_backend).unwrap();
        s.retry_settle
    };
    assert_eq!(settle(&["redeliver", "run"]), Duration::from_secs(3));
    let cascade = ["redeliver", "--delay-backend", "cascade", "run"];
    assert_eq!(settle(&cascade), Duration::ZERO);
    let explicit = [&cascade[..], &["--retry-settle", "1s"]].concat();
    assert_eq!(settle(&explicit), Duration::from_secs(1));
}

/// `--isolation` takes `on` or `off`, from a flag, the environment or the
/// file, and refuses anything else with the accepted values.
#[test]
fn isolation_takes_on_or_off() {
    let f = file("[run]\nisolation = \"off\"\n");
    let o = redeliver(&["--config", f.path(), "config", "show"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("isolation = \"off\"  # file, line 2"), "{out}");
    let o = redeliver(&["config", "show"], &[("REDELIVER_ISOLATION", "off")]);
    assert!(
        text(&o).0.contains("isolation = \"off\"  # env"),
        "{}",
        text(&o).0
    );
    let o = redeliver(&["config", "show"], &[]);
    assert!(
        text(&o).0.contains("isolation = \"on\"  # default"),
        "{}",
        text(&o).0
    );
    let o = redeliver(&["run", "--isolation", "maybe"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("expected `on` or `off`"),
        "{}",
        text(&o).1
    );
}

/// `publish --confirm-timeout` is checked before anything is sent, and its
/// help says what a timeout does.
#[test]
fn publish_confirm_timeout_is_checked_and_explained() {
    let o = redeliver(
        &[
            "publish",
            "--url",
            "http://127.0.0.1:9/",
            "--confirm-timeout",
            "500ms",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("must be at least 1s"), "{}", text(&o).1);
    let o = redeliver(&["publish", "--help"], &[]);
    let (out, _) = text(&o);
    assert!(out.contains("--confirm-timeout"), "{out}");
    assert!(out.contains("next node"), "{out}");
    assert!(out.contains("[default: 10s]"), "{out}");
}
