use redeliver::cli::{commands as app, config_cmd, file as config_file, ops};
use redeliver::cli::{Command, ConfigCommand, DlqCommand};
use redeliver::telemetry::{self, LogFormat};

/// mimalloc rather than glibc malloc: a delivery allocates and frees many
/// small buffers across threads (AMQP frames, HTTP requests, log lines), and
/// glibc's malloc/free showed as ~11% of the worker's CPU in a profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let argv: Vec<_> = std::env::args_os().collect();
    // Flags, then env, then the --config file, then defaults.
    let cli = match config_file::parse_args(argv.clone()) {
        Ok((cli, _)) => cli,
        Err(e) => e.exit(),
    };
    let format = cli.global.log_format.unwrap_or_else(LogFormat::detect);
    match cli.command {
        Command::Demo => telemetry::init_with_default(format, "warn,lapin=off"),
        _ => telemetry::init(format),
    }
    let g = &cli.global;
    let out = &mut std::io::stdout().lock();
    let result = match &cli.command {
        Command::Run(a) => app::run(g, a, app::shutdown_on_signals()).await,
        Command::Publish(a) => app::publish(g, a).await,
        Command::Dlq(DlqCommand::List(a)) => ops::dlq_list(g, a, out).await.map(drop),
        Command::Dlq(DlqCommand::Show { id }) => ops::dlq_show(g, id, out).await,
        Command::Dlq(DlqCommand::Replay(a)) => ops::dlq_replay(g, a, out).await.map(drop),
        Command::Dlq(DlqCommand::Purge(a)) => ops::dlq_purge(g, a, out).await.map(drop),
        Command::Dlq(DlqCommand::Export(a)) => ops::dlq_export(g, a, out).await.map(drop),
        Command::Status(a) => ops::status(g, a, out).await.map(drop),
        Command::Demo => app::demo(g).await,
        Command::Bench(a) => app::bench(g, a, out).await,
        Command::Config(ConfigCommand::Check { file }) => config_cmd::check(file, out),
        Command::Config(ConfigCommand::Show(_)) => config_cmd::show(argv, out),
    };
    if let Err(e) = result {
        if app::is_broken_pipe(&e) {
            return;
        }
        let line = app::error_line(&e);
        eprintln!("error: {line}");
        if let Some(hint) = app::hint(&line) {
            eprintln!("hint: {hint}");
        }
        std::process::exit(1);
    }
}
