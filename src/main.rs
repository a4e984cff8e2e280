use clap::Parser;
use redeliver::cli::{Cli, Command};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    redeliver::telemetry::init();
    let result = match &cli.command {
        Command::Run(args) => {
            redeliver::app::run(&cli.global, args, redeliver::app::shutdown_on_signals()).await
        }
        Command::Publish(args) => redeliver::app::publish(&cli.global, args).await,
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
