//! The config file (`--config FILE`, TOML): the same settings as the flags,
//! under the flags' long names, plus per-URL-prefix `[[route]]` overrides.
//!
//! ```toml
//! amqp-url = "amqp://worker:secret@rabbit:5672/%2f"   # global settings
//! prefix = "payments"
//! [run]                                               # `redeliver run`
//! concurrency = 64
//! schedule = "15s,15s,30s,3m,10m,20m,30m,30m,30m,60m,3h,3h,3h,6h,6h"
//! signing-secret = ["whsec_..."]
//! [[route]]                                           # longest prefix wins
//! url-prefix = "https://pay.example.com/"
//! timeout = "5s"
//! success-body = "SUCCESS"
//! ```
//!
//! Precedence is flags > env > file > defaults. The file's values are fed
//! through the CLI's own parser, for settings that neither a flag nor the
//! environment set, so a file value is checked exactly like the flag.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use toml_edit::{Document, Item};

use crate::cli::args::Cli;
use crate::cli::toml::{line_of, values};
use crate::config::Routes;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    At {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One setting: its long flag name, its values as text, and its line.
#[derive(Clone, Debug)]
pub struct Setting {
    pub key: String,
    pub values: Vec<String>,
    pub line: usize,
}

/// A parsed, checked config file.
#[derive(Clone, Debug, Default)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub global: Vec<Setting>,
    pub run: Vec<Setting>,
    pub routes: Routes,
}

impl ConfigFile {
    /// Reads, parses and checks every setting; errors name the line.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let at = |(line, message)| ConfigError::At {
            path: path.to_owned(),
            line,
            message,
        };
        let doc = Document::parse(text.clone()).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(&text, s.start));
            at((line, e.message().to_string()))
        })?;
        let mut file = ConfigFile {
            path: path.to_owned(),
            ..ConfigFile::default()
        };
        let mut routes = vec![];
        for (key, item) in doc.iter() {
            file.read_item(key, item, &text, &mut routes).map_err(at)?;
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = routes.iter().find(|r| !seen.insert(r.url_prefix.clone())) {
            let m = format!(
                "two [[route]] tables have the url-prefix {}",
                dup.url_prefix
            );
            return Err(at((1, m)));
        }
        file.routes = Routes::new(routes);
        file.check().map_err(at)?;
        Ok(file)
    }

    /// One top-level key: a global setting, the `[run]` table or a
    /// `[[route]]` table. An error is its line and message.
    fn read_item(
        &mut self,
        key: &str,
        item: &Item,
        text: &str,
        routes: &mut Vec<crate::config::Route>,
    ) -> Result<(), (usize, String)> {
        let line_at = |span: Option<std::ops::Range<usize>>, or: usize| {
            span.map_or(or, |s| line_of(text, s.start))
        };
        let line = line_at(item.span(), 1);
        match (key, item) {
            ("run", Item::Table(t)) => {
                for (k, v) in t.iter() {
                    let line = line_at(v.span(), line);
                    self.run.push(setting(k, v, line).map_err(|m| (line, m))?);
                }
            }
            ("route", Item::ArrayOfTables(a)) => {
                for t in a.iter() {
                    let line = line_at(t.span(), line);
                    let base = self.path.parent().unwrap_or(Path::new("."));
                    let r = crate::cli::route::route(t, text, base);
                    routes.push(r.map_err(|(l, m)| (l.unwrap_or(line), m))?);
                }
            }
            ("run", _) => return Err((line, "`run` must be a [run] table".into())),
            ("route", _) => {
                let m = "`route` must be a [route] table array ([[route]])";
                return Err((line, m.into()));
            }
            _ => self
                .global
                .push(setting(key, item, line).map_err(|m| (line, m))?),
        }
        Ok(())
    }

    /// Every key must be a flag of its section, and its value must pass
    /// that flag's parser. Each is parsed alone, so an error names its line.
    fn check(&self) -> Result<(), (usize, String)> {
        for (s, section) in self
            .global
            .iter()
            .map(|s| (s, None))
            .chain(self.run.iter().map(|s| (s, Some("run"))))
        {
            let known = known_keys(section);
            if !known.iter().any(|k| k == &s.key) {
                let where_ =
                    section.map_or("at the top level".to_string(), |t| format!("in [{t}]"));
                return Err((
                    s.line,
                    format!(
                        "unknown setting `{}` {where_} (known: {})",
                        s.key,
                        known.join(", ")
                    ),
                ));
            }
            let mut argv: Vec<OsString> = vec!["redeliver".into()];
            argv.extend(args_of(s));
            argv.push("run".into());
            if section.is_some() {
                // Run settings go after the subcommand.
                let flags = argv.drain(1..argv.len() - 1).collect::<Vec<_>>();
                argv.extend(flags);
            }
            check_kind(s).map_err(|m| (s.line, format!("`{}`: {m}", s.key)))?;
            if let Err(e) = without_env().try_get_matches_from(argv) {
                return Err((
                    s.line,
                    format!("`{}`: {}", s.key, first_line(&e.to_string())),
                ));
            }
            if s.key == "signing-secret" {
                for v in s.values.iter().flat_map(|v| v.split(',')) {
                    v.parse::<crate::config::SigningSecret>()
                        .map_err(|e| (s.line, format!("`signing-secret`: {e}")))?;
                }
            }
        }
        self.check_together()
    }

    /// The settings together: conflicts between them (`schedule` with
    /// `jitter`), and what `run` itself refuses (a prefetch below the
    /// concurrency, an impossible policy). The error names the line of the
    /// setting it is about, or else of the first `[run]` setting.
    fn check_together(&self) -> Result<(), (usize, String)> {
        let mut argv: Vec<OsString> = vec!["redeliver".into()];
        argv.extend(self.global.iter().flat_map(args_of));
        argv.push("run".into());
        argv.extend(self.run.iter().flat_map(args_of));
        let all: Vec<&Setting> = self.global.iter().chain(&self.run).collect();
        let line_for = |msg: &str| {
            let named = all.iter().filter(|s| msg.contains(&format!("--{}", s.key)));
            named
                .map(|s| s.line)
                .max()
                .or(self.run.first().map(|s| s.line))
                .unwrap_or(1)
        };
        let matches = without_env().try_get_matches_from(argv).map_err(|e| {
            let m = first_line(&e.to_string()).to_string();
            (line_for(&m), m)
        })?;
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
            .map_err(|e| (1, e.to_string()))?;
        if let crate::cli::args::Command::Run(a) = &cli.command {
            if let Err(e) = crate::cli::settings::worker_settings(a, cli.global.delay_backend) {
                let m = format!("{e:#}");
                return Err((line_for(&m), m));
            }
        }
        Ok(())
    }
}

/// The CLI without its environment variables: a file is checked on its
/// own, whatever `REDELIVER_*` this shell has set.
fn without_env() -> clap::Command {
    fn strip(c: clap::Command) -> clap::Command {
        c.mut_args(|a| a.env(clap::builder::Resettable::Reset))
    }
    let mut cmd = strip(Cli::command());
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, strip);
    }
    cmd
}

/// A switch (`deny-private`) takes `true` or `false`; anything else takes a
/// value, not a boolean.
fn check_kind(s: &Setting) -> Result<(), String> {
    let cmd = Cli::command();
    let arg = cmd
        .get_arguments()
        .chain(cmd.get_subcommands().flat_map(|c| c.get_arguments()))
        .find(|a| a.get_long() == Some(s.key.as_str()));
    let switch = arg.is_some_and(|a| matches!(a.get_action(), clap::ArgAction::SetTrue));
    let boolean = s.values.iter().all(|v| v == "true" || v == "false");
    match (switch, boolean) {
        (true, false) => Err("expects true or false".into()),
        (false, true) => Err("expects a value, not true or false".into()),
        _ => Ok(()),
    }
}

/// The long names allowed in a section: the global flags at the top level,
/// `run`'s own in `[run]`. `config` itself is not a setting of the file.
pub fn known_keys(section: Option<&str>) -> Vec<String> {
    let cmd = Cli::command();
    let globals = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| a.get_long())
        .map(str::to_string)
        .filter(|l| l != "config");
    match section {
        None => globals.collect(),
        Some(sub) => cmd
            .find_subcommand(sub)
            .map(|c| {
                c.get_arguments()
                    .filter(|a| !a.is_global_set())
                    .filter_map(|a| a.get_long())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// `--key=value` per value; `true` is the bare flag, `false` nothing.
pub(super) fn args_of(s: &Setting) -> Vec<OsString> {
    s.values
        .iter()
        .filter(|v| v.as_str() != "false")
        .map(|v| {
            if v == "true" {
                format!("--{}", s.key)
            } else {
                format!("--{}={v}", s.key)
            }
            .into()
        })
        .collect()
}

fn setting(key: &str, item: &Item, line: usize) -> Result<Setting, String> {
    let values = values(item)
        .unwrap_or_else(|| Err("a table here is not a setting".to_string()))
        .map_err(|e| format!("`{key}`: {e}"))?;
    Ok(Setting {
        key: key.to_string(),
        values,
        line,
    })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim_start_matches("error: ")
}
