//! The command line: clap arguments, the TOML config file, `config
//! check/show`, and one library function per subcommand. `main.rs` parses
//! with these and calls one of the functions; nothing below this layer
//! knows about the command line.

pub mod args;
pub mod commands;
pub mod config_cmd;
pub mod endpoint;
pub mod errors;
pub mod file;
pub mod history;
pub mod merge;
pub mod ops;
mod replay;
mod route;
pub mod settings;
mod toml;

pub use args::*;

use std::ffi::OsString;
use std::io::Write;

use tokio_util::sync::CancellationToken;

/// Runs the parsed command: the one call `main.rs` makes. `argv` is the
/// raw command line (`config show` reports where each value came from);
/// `shutdown` stops `run` and `demo` gracefully (the binary cancels it on
/// SIGINT/SIGTERM; the library never listens for signals itself).
pub async fn execute(
    cli: &Cli,
    argv: Vec<OsString>,
    shutdown: CancellationToken,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let g = &cli.global;
    match &cli.command {
        Command::Run(a) => commands::run(g, a, shutdown).await,
        Command::Publish(a) => commands::publish(g, a).await,
        Command::Dlq(DlqCommand::List(a)) => ops::dlq_list(g, a, out).await.map(drop),
        Command::Dlq(DlqCommand::Show { id }) => ops::dlq_show(g, id, out).await,
        Command::Dlq(DlqCommand::Replay(a)) => {
            replay::dlq_replay(g, a, shutdown, out).await.map(drop)
        }
        Command::Dlq(DlqCommand::Purge(a)) => ops::dlq_purge(g, a, out).await.map(drop),
        Command::Dlq(DlqCommand::Export(a)) => ops::dlq_export(g, a, out).await.map(drop),
        Command::Status(a) => ops::status(g, a, out).await.map(drop),
        Command::Endpoint(c) => endpoint::execute(g, c, out).await,
        Command::Demo => commands::demo(g, shutdown, out).await,
        Command::Bench(a) => commands::bench(g, a, out).await,
        Command::Config(ConfigCommand::Check { file }) => config_cmd::check(file, out),
        Command::Config(ConfigCommand::Show(_)) => config_cmd::show(argv, out),
        Command::Console(a) => history::console(g, a, shutdown).await,
        Command::History(HistoryCommand::Show { id, console }) => {
            history::show(id, console, out).await
        }
        Command::History(HistoryCommand::List(a)) => history::list(a, out).await,
    }
}
