//! The `plexus` binary: parse the command line, start logging, load the config
//! (exit 64 when it is invalid), run, and drain on SIGTERM or SIGINT.

mod admin;
mod app;
mod bridge;
mod catalog_host;
mod config;
mod era;
mod fanout;
mod http_front;
mod hub;
mod jsonrpc;
mod listener;
mod logging;
mod metrics;
mod session;
mod stdio_front;
mod systemd;
mod tasks;
mod upstreams;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// EX_USAGE: the configuration is wrong.
const EXIT_BAD_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "plexus",
    version,
    about = "A multiplexing MCP proxy and aggregator daemon"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Serve {
        /// The configuration file.
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
        /// Serve one client on stdin/stdout instead of the HTTP listeners.
        #[arg(long)]
        stdio: bool,
    },
    /// Validate a configuration file and exit (0 when valid).
    CheckConfig {
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let environment = |key: &str| std::env::var(key).ok();
    match cli.command {
        Command::CheckConfig { config } => match config::load(&config, &environment) {
            Ok(loaded) => {
                let enabled = loaded.upstreams.values().filter(|u| u.enabled).count();
                println!(
                    "{}: valid ({} upstreams, {} enabled)",
                    config.display(),
                    loaded.upstreams.len(),
                    enabled
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error}");
                ExitCode::from(EXIT_BAD_CONFIG)
            }
        },
        Command::Serve { config, stdio } => {
            let loaded = match config::load(&config, &environment) {
                Ok(loaded) => loaded,
                Err(error) => {
                    tracing::error!("{error}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "cannot start the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            // Read before the runtime starts; None unless systemd started us (Type=notify).
            let notifier = systemd::Notifier::from_environment(&environment).map(Arc::new);
            let outcome = runtime.block_on(async move {
                let shutdown = CancellationToken::new();
                tokio::spawn(shutdown_on_signal(shutdown.clone()));
                if stdio {
                    app::serve_stdio(loaded, shutdown).await
                } else {
                    app::serve_http(loaded, shutdown, notifier).await
                }
            });
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!("{error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs go to stderr: in stdio mode stdout is the protocol.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PLEXUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

async fn shutdown_on_signal(shutdown: CancellationToken) {
    let (Ok(mut terminate), Ok(mut interrupt), Ok(mut hangup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
            _ = hangup.recv() => {
                // Without a handler SIGHUP would kill the daemon; reloading is not built yet.
                tracing::warn!("SIGHUP received: configuration reload is not supported yet; keeping the running config");
                continue;
            }
        }
        break;
    }
    shutdown.cancel();
}
