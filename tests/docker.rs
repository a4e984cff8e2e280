//! Static checks of docker/ (no Docker engine needed): the compose file, both
//! Dockerfiles and the command lines given to the worker image. A renamed
//! flag, a moved file or a broken version pin fails `cargo test` instead of
//! the first `docker compose up`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use redeliver::cli::Cli;
use serde_yaml_ng::Value;

/// A Dockerfile instruction: (KEYWORD, arguments).
type Instr = (String, String);

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn compose() -> Value {
    let text = read(&path("docker/compose.yml"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("docker/compose.yml: {e}"))
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// Only the list form of `command` is accepted: compose splits the string
/// form with shell rules, which quoted JSON bodies easily trip on.
fn strings(v: &Value, what: &str) -> Vec<String> {
    let seq = v.as_sequence();
    let seq = seq.unwrap_or_else(|| panic!("{what}: not a list: {v:?}"));
    seq.iter().map(|s| s.as_str().expect(what).into()).collect()
}

/// A service's environment. Only the map form is read, and so allowed.
fn environment(svc: &Value) -> HashMap<String, String> {
    let env = &svc["environment"];
    assert!(env.is_null() || env.is_mapping(), "environment: use a map");
    let env = env.as_mapping().into_iter().flatten();
    env.map(|(k, v)| (text(k), text(v))).collect()
}

/// Instructions with `\` continuations joined and comments dropped.
fn instructions(p: &Path) -> Vec<Instr> {
    let (mut out, mut cur) = (Vec::new(), String::new());
    for line in read(p).lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        cur.push_str(line.trim_end_matches('\\'));
        cur.push(' ');
        if !line.ends_with('\\') {
            let (op, args) = cur.trim().split_once(' ').unwrap_or((cur.trim(), ""));
            out.push((op.to_ascii_uppercase(), args.trim().to_owned()));
            cur.clear();
        }
    }
    out
}

/// `${NAME}` replaced with its `ARG NAME=default`.
fn expand(ins: &[Instr], s: &str) -> String {
    let mut s = s.to_owned();
    for (_, arg) in ins.iter().filter(|(op, _)| op == "ARG") {
        if let Some((k, v)) = arg.split_once('=') {
            s = s.replace(&format!("${{{k}}}"), v);
        }
    }
    s
}

/// Stages as (name, ENTRYPOINT, CMD), which must be in exec (JSON) form: the
/// shell form runs under `/bin/sh -c`, which does not pass SIGTERM on.
fn stages(ins: &[Instr]) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for (op, args) in ins {
        let json = || serde_json::from_str(args).unwrap_or_else(|e| panic!("{op} {args}: {e}"));
        let name = args.split_whitespace().nth(2).unwrap_or_default(); // FROM image AS name
        match op.as_str() {
            "FROM" => out.push((name.to_owned(), vec![], vec![])),
            "ENTRYPOINT" => out.last_mut().expect("FROM first").1 = json(),
            "CMD" => out.last_mut().expect("FROM first").2 = json(),
            _ => {}
        }
    }
    out
}

/// The environment variables `redeliver SUB` reads: global options and SUB's.
fn env_names(sub: &str) -> Vec<String> {
    let cli = Cli::command();
    let mut args: Vec<_> = cli.get_arguments().collect();
    if let Some(sub) = cli.find_subcommand(sub) {
        args.extend(sub.get_arguments());
    }
    let names = args.iter().filter_map(|a| a.get_env());
    names.map(|e| e.to_string_lossy().into_owned()).collect()
}

/// The four services exist; the worker runs three replicas without fixed
/// host ports (they would collide); the services that talk AMQP wait for the
/// broker's healthcheck; the worker signs with the secret the receiver checks.
#[test]
fn compose_defines_the_demo() {
    let c = compose();
    let svc = |name: &str| c["services"][name].clone();
    for name in ["rabbitmq", "worker", "receiver", "publisher"] {
        assert!(svc(name).is_mapping(), "service {name} missing");
    }
    assert_eq!(svc("worker")["deploy"]["replicas"].as_u64(), Some(3));
    assert!(svc("worker")["ports"].is_null(), "fixed ports on replicas");
    assert!(!strings(&svc("rabbitmq")["healthcheck"]["test"], "healthcheck").is_empty());
    for name in ["worker", "publisher"] {
        let condition = text(&svc(name)["depends_on"]["rabbitmq"]["condition"]);
        assert_eq!(condition, "service_healthy", "{name} depends_on rabbitmq");
    }
    assert_eq!(text(&svc("publisher")["restart"]), "no");
    let secret = environment(&svc("worker")).remove("REDELIVER_SIGNING_SECRET");
    assert!(secret.as_ref().is_some_and(|s| s.starts_with("whsec_")));
    let receiver = environment(&svc("receiver")).remove("WEBHOOK_SECRET");
    assert_eq!(secret, receiver, "worker and receiver secrets differ");
}

/// Every command line the worker image gets (the Dockerfile's ENTRYPOINT+CMD,
/// each compose `command`) parses with the real CLI, and every REDELIVER_*
/// variable set beside it is read by that subcommand: a misspelt one would be
/// silently ignored. Variable values are not applied to the parse.
#[test]
fn worker_command_lines_parse() {
    let c = compose();
    let stages = stages(&instructions(&path("docker/Dockerfile")));
    let (_, entrypoint, cmd) = stages.last().expect("no stage").clone();
    assert_eq!(entrypoint, ["redeliver"], "the last (default) stage");
    let mut lines = vec![("Dockerfile".to_owned(), cmd.clone(), HashMap::new())];
    let worker_image = c["services"]["worker"]["image"].as_str();
    for (name, svc) in c["services"].as_mapping().expect("services") {
        let (name, build) = (text(name), &svc["build"]);
        let target = build["target"].as_str().unwrap_or("worker");
        let built = text(&build["dockerfile"]) == "docker/Dockerfile" && target == "worker";
        if built || (worker_image.is_some() && svc["image"].as_str() == worker_image) {
            let args = match &svc["command"] {
                Value::Null => cmd.clone(),
                v => strings(v, &name),
            };
            lines.push((name, args, environment(svc)));
        }
    }
    let names: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
    let both = ["worker", "publisher"].iter().all(|n| names.contains(n));
    assert!(both, "worker and publisher must be checked: {names:?}");
    let mut failures = Vec::new();
    for (name, args, env) in &lines {
        let argv = [vec!["redeliver".to_owned()], args.clone()].concat();
        if let Err(e) = Cli::try_parse_from(&argv) {
            failures.push(format!("{name}: {argv:?}\n{e}"));
        }
        let sub = args.first().map(String::as_str).unwrap_or_default();
        let known = env_names(sub);
        for var in env.keys().filter(|k| k.starts_with("REDELIVER_")) {
            if !known.contains(var) {
                failures.push(format!("{name}: `redeliver {sub}` does not read {var}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// What the builds read exists: COPY/ADD sources in each build context;
/// compose's contexts (relative to docker/), Dockerfiles (relative to their
/// context) and targets; the ignore file that keeps target/ out of the context.
#[test]
fn build_inputs_exist() {
    let docker = path("docker");
    for (file, context) in [("Dockerfile", ".."), ("rabbitmq/Dockerfile", "rabbitmq")] {
        for (op, args) in instructions(&docker.join(file)) {
            // Local sources only: not URLs, not `--from=` copies between stages.
            if !(op == "COPY" || op == "ADD") || args.contains("--from=") {
                continue;
            }
            let mut words: Vec<&str> = args.split_whitespace().collect();
            words.retain(|w| !w.starts_with("--") && !w.contains("://"));
            words.pop(); // the destination
            for src in words {
                assert!(
                    docker.join(context).join(src).exists(),
                    "docker/{file}: {src}"
                );
            }
        }
    }
    for (name, svc) in compose()["services"].as_mapping().expect("services") {
        let build = &svc["build"];
        let Some(context) = build["context"].as_str().or(build.as_str()) else {
            continue;
        };
        let dockerfile = build["dockerfile"].as_str().unwrap_or("Dockerfile");
        let dockerfile = docker.join(context).join(dockerfile);
        assert!(dockerfile.is_file(), "{name:?}: {dockerfile:?}");
        if let Some(target) = build["target"].as_str() {
            let stages = stages(&instructions(&dockerfile));
            assert!(stages.iter().any(|s| s.0 == target), "{name:?}: {target}");
        }
    }
    let ignore = read(&docker.join("Dockerfile.dockerignore"));
    assert!(ignore.lines().any(|l| l.trim_end_matches('/') == "target"));
}

/// A plugin build supports one RabbitMQ minor series, and its release asset
/// is `vX/rabbitmq_delayed_message_exchange-X.ez`: bumping one without the
/// other fails here rather than at node boot.
#[test]
fn rabbitmq_and_plugin_are_one_series() {
    let ins = instructions(&path("docker/rabbitmq/Dockerfile"));
    let from = ins.iter().rfind(|i| i.0 == "FROM").expect("FROM");
    let from = expand(&ins, &from.1);
    let broker = from.strip_prefix("rabbitmq:").expect("the official image");
    let broker = broker.split('-').next().unwrap_or_default();
    let add = ins
        .iter()
        .find(|i| i.0 == "ADD")
        .expect("ADD of the plugin");
    let add = expand(&ins, &add.1);
    let repo = "https://github.com/rabbitmq/rabbitmq-delayed-message-exchange";
    let asset = add.split_once(&format!("{repo}/releases/download/v"));
    let asset = asset.expect("a release asset").1.split_whitespace().next();
    let (tag, file) = asset.unwrap_or_default().split_once('/').expect("vX/FILE");
    assert_eq!(file, format!("rabbitmq_delayed_message_exchange-{tag}.ez"));
    let series = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    assert_eq!(series(broker), series(tag), "broker {broker}, plugin {tag}");
    let enable = "enable --offline rabbitmq_management rabbitmq_delayed_message_exchange";
    let enabled = ins.iter().any(|(op, a)| op == "RUN" && a.contains(enable));
    assert!(enabled, "the plugin is not enabled");
}

/// Prometheus and Grafana come with `--profile monitoring` only, and every
/// file they mount exists: the rules, the scrape config, the dashboard and
/// its provisioning.
#[test]
fn monitoring_is_a_profile_and_its_mounts_exist() {
    let c = compose();
    for name in ["prometheus", "grafana"] {
        let svc = &c["services"][name];
        assert_eq!(
            strings(&svc["profiles"], name),
            vec!["monitoring".to_string()]
        );
        let mounts = strings(&svc["volumes"], name);
        assert!(!mounts.is_empty(), "{name} mounts its files");
        for m in mounts {
            let host = m.split(':').next().unwrap_or("");
            let p = path("docker").join(host);
            assert!(p.exists(), "{name}: {} is missing", p.display());
        }
    }
    let prom = read(&path("monitoring/prometheus.yml"));
    assert!(prom.contains("job_name: redeliver") && prom.contains("/etc/prometheus/alerts.yml"));
}
