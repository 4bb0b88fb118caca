//! The `plexus` binary: parse the command line, start logging, load the config
//! (exit 64 when it is invalid), run, and drain on SIGTERM or SIGINT.

mod admin;
mod app;
mod catalog_host;
mod config;
mod control;
mod era;
mod fanout;
mod http_front;
mod hub;
mod jsonrpc;
mod listener;
mod logging;
mod metrics;
mod progress;
mod reload_command;
mod session;
mod stdio_front;
mod systemd;
mod tasks;
mod upstreams;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

/// EX_USAGE: the configuration is wrong.
const EXIT_BAD_CONFIG: u8 = 64;
/// EX_UNAVAILABLE: no daemon answered.
const EXIT_UNAVAILABLE: u8 = 69;

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
    /// Ask the running daemon to reload its configuration; prints the outcome as
    /// JSON (exit 0 when applied, 1 when rejected or partial, 69 when no daemon answers).
    Reload {
        /// The configuration file the daemon runs (it names the admin listener).
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
        /// The admin listener, when the file cannot tell.
        #[arg(long)]
        admin: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
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
        Command::Reload { config, admin } => reload(&config, admin.as_deref()),
        Command::Serve { config, stdio } => {
            let (loaded, sha256) = match config::read(&config, &environment) {
                Ok(loaded) => loaded,
                Err(error) => {
                    tracing::error!("{error}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            let Some(runtime) = runtime() else {
                return ExitCode::FAILURE;
            };
            // Read before the runtime starts; None unless systemd started us (Type=notify).
            let notifier = systemd::Notifier::from_environment(&environment).map(Arc::new);
            let loaded = app::Loaded {
                config: loaded,
                path: config,
                sha256,
                environment,
            };
            let outcome = runtime.block_on(async move {
                if stdio {
                    app::serve_stdio(loaded).await
                } else {
                    app::serve_http(loaded, notifier).await
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

/// The process environment, as config expansion reads it.
fn environment(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            None
        }
    }
}

/// `plexus reload`: the daemon's JSON answer on stdout.
fn reload(config: &std::path::Path, admin: Option<&str>) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(reload_command::reload(config, admin, &environment)) {
        Ok((status, body)) => {
            println!("{}", body.trim_end());
            let applied = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|answer| answer.get("outcome")?.as_str().map(|o| o == "applied"))
                .unwrap_or(false);
            if status == 200 && applied {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_UNAVAILABLE)
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
