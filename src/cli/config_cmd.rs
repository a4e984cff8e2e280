//! `redeliver config check FILE` and `redeliver config show`.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::cli::file::{known_keys, ConfigFile};
use crate::cli::merge::{arg_id, merged_matches};
use crate::config::{expiry_warning, redact_url, ProxySetting, SigningSecret};
use std::time::SystemTime;

/// Validates a file; the error names the line.
pub fn check(path: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let f = ConfigFile::load(path)?;
    writeln!(
        out,
        "{}: ok ({} global settings, {} run settings, {} routes)",
        path.display(),
        f.global.len(),
        f.run.len(),
        f.routes.iter().count()
    )?;
    for w in secret_warnings(&f, SystemTime::now()) {
        writeln!(out, "warning: {w}")?;
    }
    Ok(())
}

/// Expired secrets, and secrets that expire within 24 h, in `[run]` and
/// in the routes; each named by where it is and its fingerprint.
fn secret_warnings(f: &ConfigFile, now: SystemTime) -> Vec<String> {
    let run = f.run.iter().filter(|s| s.key == "signing-secret");
    let run = run.flat_map(|s| {
        let each = s.values.iter().flat_map(|v| v.split(','));
        let parsed = each.filter_map(|v| v.parse().ok());
        parsed.map(|secret| (format!("line {}", s.line), secret))
    });
    let routes = f.routes.iter().flat_map(|r| {
        let secrets = r.secrets.iter().flatten().cloned();
        secrets.map(|secret| (format!("route {}", r.url_prefix), secret))
    });
    run.chain(routes)
        .filter_map(|(at, s): (String, SigningSecret)| {
            expiry_warning(&s, now).map(|w| format!("{at}: {w}"))
        })
        .collect()
}

/// Prints what `run` would use, as TOML with each value's source. `argv`
/// is this process's command line; `config show` is read as `run`.
pub fn show(argv: Vec<OsString>, out: &mut dyn Write) -> anyhow::Result<()> {
    let at = argv
        .windows(2)
        .rposition(|w| w[0] == "config" && w[1] == "show")
        .context("`config show` not found on the command line")?;
    let mut run_argv = argv;
    run_argv.splice(at..at + 2, [OsString::from("run")]);
    let (own, merged, file) = merged_matches(run_argv)?;
    let file = file.unwrap_or_default();
    writeln!(
        out,
        "# The settings of `redeliver run`: flags > env > file > defaults."
    )?;
    print_section(out, &own, &merged, &file, None)?;
    let (Some(("run", own_run)), Some(("run", run))) = (own.subcommand(), merged.subcommand())
    else {
        return Ok(());
    };
    writeln!(out, "\n[run]")?;
    print_section(out, own_run, run, &file, Some("run"))?;
    for r in file.routes.iter() {
        writeln!(out, "\n[[route]]\nurl-prefix = {}", quote(&r.url_prefix))?;
        if let Some(s) = &r.secrets {
            writeln!(out, "signing-secret = {}", redacted_list(s.len()))?;
        }
        if let Some(s) = &r.schedule {
            let s: Vec<String> = s
                .iter()
                .map(|d| humantime::format_duration(*d).to_string())
                .collect();
            writeln!(out, "schedule = {}", quote(&s.join(",")))?;
        }
        if let Some(n) = r.max_attempts {
            writeln!(out, "max-attempts = {n}")?;
        }
        if let Some(t) = r.timeout {
            writeln!(
                out,
                "timeout = {}",
                quote(&humantime::format_duration(t).to_string())
            )?;
        }
        if let Some(b) = &r.success_body {
            writeln!(out, "success-body = {}", quote(b))?;
        }
        print_route_limits(out, r)?;
    }
    Ok(())
}

/// A route's per-endpoint settings, for `config show`.
fn print_route_limits(out: &mut dyn Write, r: &crate::config::Route) -> anyhow::Result<()> {
    if let Some(n) = r.concurrency {
        writeln!(out, "concurrency = {n}")?;
    }
    if let Some(rate) = r.rate {
        writeln!(out, "rate = {}", quote(&rate.to_string()))?;
    }
    if let Some(n) = r.breaker_failures {
        writeln!(out, "breaker-failures = {n}")?;
    }
    if let Some(d) = r.max_age {
        let d = humantime::format_duration(d).to_string();
        writeln!(out, "max-age = {}", quote(&d))?;
    }
    let files = [
        ("client-cert", &r.tls.client_cert),
        ("client-key", &r.tls.client_key),
        ("ca-roots", &r.tls.ca_roots),
    ];
    for (key, path) in files {
        if let Some(p) = path {
            writeln!(out, "{key} = {}", quote(&p.display().to_string()))?;
        }
    }
    Ok(())
}

fn print_section(
    out: &mut dyn Write,
    own: &ArgMatches,
    merged: &ArgMatches,
    file: &ConfigFile,
    section: Option<&str>,
) -> anyhow::Result<()> {
    let in_file = if section.is_some() {
        &file.run
    } else {
        &file.global
    };
    for key in known_keys(section) {
        let Some(id) = arg_id(&key) else { continue };
        let values: Vec<String> = match merged.get_raw(&id) {
            Some(v) => v.map(|s| s.to_string_lossy().into_owned()).collect(),
            None if key == "amqp-url" => {
                let url = quote(&redact_url(crate::config::DEFAULT_AMQP_URL));
                writeln!(out, "{key} = {url}  # default")?;
                continue;
            }
            None => {
                writeln!(out, "# {key} (unset)")?;
                continue;
            }
        };
        let source = match own.value_source(&id) {
            Some(ValueSource::CommandLine) => "flag".to_string(),
            Some(ValueSource::EnvVariable) => "env".to_string(),
            _ => match in_file.iter().find(|s| s.key == key) {
                Some(s) => format!("file, line {}", s.line),
                None => "default".to_string(),
            },
        };
        let value = shown(&key, &values);
        writeln!(out, "{key} = {value}  # {source}")?;
    }
    Ok(())
}

/// A setting's value as `config show` prints it: URLs without their
/// password, secrets not at all.
fn shown(key: &str, values: &[String]) -> String {
    let each = |f: &dyn Fn(&String) -> String| values.iter().map(f).collect::<Vec<_>>().join(", ");
    match key {
        "proxy" => each(&|v| match v.parse::<ProxySetting>() {
            Ok(p) => quote(&p.to_string()),
            Err(_) => quote("<invalid>"),
        }),
        "amqp-url" => each(&|v| quote(&redact_url(v))),
        "signing-secret" => redacted_list(values.len()),
        _ if values.len() == 1 => literal(&values[0]),
        _ => format!("[{}]", each(&|v| literal(v))),
    }
}

/// Numbers and booleans bare, everything else a TOML string.
fn literal(v: &str) -> String {
    if v.parse::<f64>().is_ok() || v == "true" || v == "false" {
        v.to_string()
    } else {
        quote(v)
    }
}

fn quote(v: &str) -> String {
    toml_edit::Value::from(v).to_string().trim().to_string()
}

fn redacted_list(n: usize) -> String {
    format!("[{}]", vec!["\"whsec_***\""; n].join(", "))
}
