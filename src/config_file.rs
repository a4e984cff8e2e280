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

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};
use toml_edit::{Document, Item, Value};

use crate::cli::Cli;
use crate::routes::Routes;

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
        let at = |line, message| ConfigError::At {
            path: path.to_owned(),
            line,
            message,
        };
        let doc = Document::parse(text.clone()).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(&text, s.start));
            at(line, e.message().to_string())
        })?;
        let mut file = ConfigFile {
            path: path.to_owned(),
            ..ConfigFile::default()
        };
        let mut routes = vec![];
        for (key, item) in doc.iter() {
            let line = item.span().map_or(1, |s| line_of(&text, s.start));
            match (key, item) {
                ("run", Item::Table(t)) => {
                    for (k, v) in t.iter() {
                        let line = v.span().map_or(line, |s| line_of(&text, s.start));
                        file.run.push(setting(k, v, line).map_err(|m| at(line, m))?);
                    }
                }
                ("route", Item::ArrayOfTables(a)) => {
                    for t in a.iter() {
                        let line = t.span().map_or(line, |s| line_of(&text, s.start));
                        routes.push(
                            crate::config_route::route(t, &text)
                                .map_err(|(l, m)| at(l.unwrap_or(line), m))?,
                        );
                    }
                }
                ("run" | "route", _) => {
                    return Err(at(
                        line,
                        format!(
                            "`{key}` must be a [{key}] table{}",
                            if key == "route" {
                                " array ([[route]])"
                            } else {
                                ""
                            }
                        ),
                    ))
                }
                _ => file
                    .global
                    .push(setting(key, item, line).map_err(|m| at(line, m))?),
            }
        }
        file.routes = Routes::new(routes);
        file.check().map_err(|(line, m)| at(line, m))?;
        Ok(file)
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
            if let Err(e) = Cli::try_parse_from_checked(argv) {
                return Err((
                    s.line,
                    format!("`{}`: {}", s.key, first_line(&e.to_string())),
                ));
            }
            if s.key == "signing-secret" {
                for v in &s.values {
                    v.parse::<crate::signing::SigningSecret>()
                        .map_err(|e| (s.line, format!("`signing-secret`: {e}")))?;
                }
            }
        }
        Ok(())
    }
}

impl Cli {
    /// `try_parse_from` without clap's exit on `--help`.
    fn try_parse_from_checked(argv: Vec<OsString>) -> Result<Cli, clap::Error> {
        <Cli as clap::Parser>::try_parse_from(argv)
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
fn args_of(s: &Setting) -> Vec<OsString> {
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
    let values = match item {
        Item::Value(Value::Array(a)) => a.iter().map(scalar).collect::<Result<Vec<_>, _>>(),
        Item::Value(v) => scalar(v).map(|s| vec![s]),
        _ => Err("a table here is not a setting".to_string()),
    }
    .map_err(|e| format!("`{key}`: {e}"))?;
    Ok(Setting {
        key: key.to_string(),
        values,
        line,
    })
}

pub(crate) fn scalar(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.value().clone()),
        Value::Integer(i) => Ok(i.value().to_string()),
        Value::Float(f) => Ok(f.value().to_string()),
        Value::Boolean(b) => Ok(b.value().to_string()),
        _ => Err("expected a string, number or boolean".to_string()),
    }
}

pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim_start_matches("error: ")
}

/// Parses the command line, then fills in the config file's settings for
/// every flag that neither the command line nor the environment set, and
/// parses again. Returns the file too (its routes), when there is one.
pub fn parse_args(argv: Vec<OsString>) -> Result<(Cli, Option<ConfigFile>), clap::Error> {
    let (_, matches, file) = merged_matches(argv)?;
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
    Ok((cli, file))
}

/// The command line's own matches, the matches with the file merged in,
/// and the file.
pub fn merged_matches(
    argv: Vec<OsString>,
) -> Result<(ArgMatches, ArgMatches, Option<ConfigFile>), clap::Error> {
    let matches = Cli::command().try_get_matches_from(&argv)?;
    let path = matches.get_one::<PathBuf>("config").cloned();
    let file = match path {
        Some(p) => Some(
            ConfigFile::load(&p)
                .map_err(|e| Cli::command().error(clap::error::ErrorKind::ValueValidation, e))?,
        ),
        None => None,
    };
    let Some(f) = &file else {
        return Ok((matches.clone(), matches, None));
    };
    let mut extra = unset(&matches, &f.global);
    if let Some(("run", sub)) = matches.subcommand() {
        extra.extend(unset(sub, &f.run));
    }
    // Before a `--`, after which everything is positional.
    let at = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let mut full = argv;
    full.splice(at..at, extra);
    let merged = Cli::command().try_get_matches_from(full)?;
    Ok((matches, merged, file))
}

/// The file's flags for the settings still at their defaults.
fn unset(m: &ArgMatches, settings: &[Setting]) -> Vec<OsString> {
    settings
        .iter()
        .filter(|s| {
            let source = arg_id(&s.key).and_then(|id| m.value_source(&id));
            matches!(source, None | Some(ValueSource::DefaultValue))
        })
        .flat_map(args_of)
        .collect()
}

/// The clap id of the flag with this long name, in any (sub)command.
pub(crate) fn arg_id(long: &str) -> Option<String> {
    let cmd = Cli::command();
    let found = cmd
        .get_arguments()
        .chain(cmd.get_subcommands().flat_map(|c| c.get_arguments()))
        .find(|a| a.get_long() == Some(long))
        .map(|a| a.get_id().to_string());
    found
}
