//! Merging the config file into the command line: the file's settings
//! become flags for every setting that neither the command line nor the
//! environment set, and the whole is parsed again, so a file value is
//! checked exactly like the flag (see `file.rs` for the file itself).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};

use crate::cli::args::Cli;
use crate::cli::file::{args_of, ConfigFile, Setting};

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
    // `config check FILE` checks its own file, whatever --config says.
    let checking = matches!(
        matches.subcommand(),
        Some(("config", c)) if c.subcommand_name() == Some("check")
    );
    let path = matches
        .get_one::<PathBuf>("config")
        .cloned()
        .filter(|_| !checking);
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
    let given = |id: &str| {
        matches!(
            m.try_get_raw(id).ok().flatten().and(m.value_source(id)),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    settings
        .iter()
        .filter(|s| {
            let source = arg_id(&s.key).and_then(|id| m.value_source(&id));
            matches!(source, None | Some(ValueSource::DefaultValue))
        })
        // A file `schedule` yields to a flag or env `--jitter`, and the
        // other way round: the higher layer wins instead of conflicting.
        .filter(|s| !conflicts_of(&s.key).iter().any(|id| given(id)))
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

/// The ids of the flags that conflict with the flag `long` (in `run`).
fn conflicts_of(long: &str) -> Vec<String> {
    let mut cmd = Cli::command();
    cmd.build();
    let Some(run) = cmd.find_subcommand("run") else {
        return vec![];
    };
    let Some(arg) = run.get_arguments().find(|a| a.get_long() == Some(long)) else {
        return vec![];
    };
    run.get_arg_conflicts_with(arg)
        .iter()
        .map(|a| a.get_id().to_string())
        .collect()
}
