//! The `plexus` binary: parse the command line, start logging, run the command
//! (`plexus::run`) and exit with its code.

use std::process::ExitCode;

use clap::Parser;
use plexus::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(level) = cli.command.log_level() {
        init_tracing(level);
    }
    plexus::run(cli.command)
}

/// Logs go to stderr: in stdio mode stdout is the protocol.
fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PLEXUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
