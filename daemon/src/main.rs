//! The `plexus` binary: parse the command line, start logging, load the config
//! (exit 64 when it is invalid), run, and drain on SIGTERM or SIGINT.

mod access;
mod admin;
mod admin_client;
mod app;
mod audit;
mod catalog_host;
mod client_message;
mod config;
mod connect_command;
mod control;
mod descriptors;
mod era;
mod explore_command;
mod fanout;
mod http_front;
mod hub;
mod jsonrpc;
mod listener;
mod logging;
mod memory;
mod metrics;
mod own_stdio;
mod pins;
mod pins_command;
mod progress;
mod repoll;
mod session;
mod status;
mod stdio_front;
mod systemd;
mod tasks;
mod upstreams;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

/// EX_USAGE: the configuration is wrong.
const EXIT_BAD_CONFIG: u8 = 64;
/// EX_UNAVAILABLE: no daemon answered.
const EXIT_UNAVAILABLE: u8 = 69;
/// EX_NOPERM: the daemon refused the credentials (`plexus connect`).
const EXIT_NO_PERMISSION: u8 = 77;

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
        /// With --stdio: serve this view of the catalog (a `[views.NAME]`).
        #[arg(long, requires = "stdio")]
        view: Option<String>,
    },
    /// Validate a configuration file and exit (0 when valid).
    CheckConfig {
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
    },
    /// List what an upstream (a configured name, or a naked URI such as
    /// mcp+uvx://pkg or an http(s) URL) serves, without a daemon.
    Explore {
        target: String,
        #[command(flatten)]
        options: ExploreOptions,
    },
    /// One tool's definition, as the upstream sends it.
    Schema {
        target: String,
        tool: String,
        #[command(flatten)]
        options: ExploreOptions,
    },
    /// Both hashes of every entry and the catalog fingerprint (what plexus pins).
    Hash {
        target: String,
        #[command(flatten)]
        options: ExploreOptions,
    },
    /// Call one tool with JSON arguments and print its result. The tool and its
    /// arguments may instead end a naked URI's query: `mcp+uvx://pkg?tool=NAME&arg=value`.
    Call {
        target: String,
        /// Omitted when the target's query names `tool=`.
        tool: Option<String>,
        /// The arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        #[command(flatten)]
        options: ExploreOptions,
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
    /// A stdio bridge to a running daemon, for clients that only launch commands:
    /// MCP on stdin/stdout, relayed to its HTTP front; it reconnects if the daemon
    /// restarts. Logs go to stderr.
    Connect {
        /// The daemon's MCP endpoint [default: the running daemon of --config, else
        /// http://127.0.0.1:7464/mcp]
        url: Option<String>,
        /// The configuration the running daemon uses (its daemon.json names the URL).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// A file holding the bearer token (else $PLEXUS_TOKEN).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Serve this view of the catalog (`/mcp/VIEW`).
        #[arg(long)]
        view: Option<String>,
    },
    /// Internal: kills the process groups the daemon names on stdin once that pipe
    /// closes (the daemon starts it; it outlives a crash of the daemon by a moment).
    #[command(hide = true)]
    Keeper,
    /// The running daemon's upstreams, sessions and configuration: a table, or JSON
    /// with --json (exit 69 when no daemon answers).
    Status {
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
        /// The admin listener, when the file cannot tell.
        #[arg(long)]
        admin: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Start an upstream again now, even from `failed`: a serving one is replaced by
    /// a successor that starts first while its calls drain. Prints the outcome as
    /// JSON once known (exit 1 when the successor did not start and the running
    /// instance serves on, 69 when no daemon answers).
    Restart {
        upstream: String,
        #[arg(long, short, default_value = "config.toml")]
        config: PathBuf,
        #[arg(long)]
        admin: Option<String>,
    },
    /// Schema pins: where each upstream stands, what changed, approve or reset. Asks
    /// the running daemon, or works on the pin file when none runs.
    Pins {
        #[command(subcommand)]
        action: PinsAction,
        /// The configuration file (it names the pin file and the admin listener).
        #[arg(long, short, default_value = "config.toml", global = true)]
        config: PathBuf,
        /// The admin listener, when the file cannot tell.
        #[arg(long, global = true)]
        admin: Option<String>,
        /// JSON, for scripts.
        #[arg(long, global = true)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PinsAction {
    /// Each upstream's pin: pinned, changed (waiting for approval) or unapproved.
    Status,
    /// Field by field, what changed since each upstream was pinned.
    Diff { upstream: Option<String> },
    /// Pin what was seen: UPSTREAM for its whole catalog, UPSTREAM/NAME for one entry.
    Approve { target: String },
    /// Forget an upstream's pin: its catalog is pinned afresh when next seen.
    Reset { upstream: String },
}

#[derive(clap::Args)]
struct ExploreOptions {
    /// Where a configured upstream's name is looked up.
    #[arg(long, short, default_value = "config.toml")]
    config: PathBuf,
    /// Indented JSON, for people.
    #[arg(long)]
    pretty: bool,
}

/// What an explore command asks of its target.
enum Exploration {
    Explore,
    Schema(String),
    Hash,
    Call(String, CallArguments),
}

enum CallArguments {
    Json(String),
    /// From the target's query, typed by the tool's schema.
    Query(Vec<(String, String)>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Keeper = cli.command {
        // No logging, no runtime: it only waits for its input to end.
        adapters::keeper::run_keeper(std::io::stdin().lock());
        return ExitCode::SUCCESS;
    }
    // The one-shot commands print JSON; only their problems belong in the log.
    let quiet = matches!(
        cli.command,
        Command::Explore { .. }
            | Command::Schema { .. }
            | Command::Hash { .. }
            | Command::Call { .. }
            | Command::Pins { .. }
            | Command::Status { .. }
            | Command::Restart { .. }
    );
    init_tracing(if quiet { "warn" } else { "info" });
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
        Command::Keeper => ExitCode::SUCCESS,
        Command::Connect {
            url,
            config,
            token_file,
            view,
        } => {
            let target = match connect_command::target(
                url,
                config.as_deref(),
                view.as_deref(),
                token_file.as_deref(),
                &environment,
            ) {
                Ok(target) => target,
                Err(error) => {
                    eprintln!("{error}");
                    return ExitCode::from(EXIT_UNAVAILABLE);
                }
            };
            // A bridge reads no catalog: its large blocks are messages from the start.
            memory::fix_thresholds_for_messages();
            let Some(runtime) = runtime() else {
                return ExitCode::FAILURE;
            };
            match runtime.block_on(connect_command::run(target)) {
                connect_command::Ended::ClientLeft => ExitCode::SUCCESS,
                // Said on stderr when it happened.
                connect_command::Ended::Refused => ExitCode::from(EXIT_NO_PERMISSION),
            }
        }
        Command::Reload { config, admin } => reload(&config, admin.as_deref()),
        Command::Status {
            config,
            admin,
            json,
        } => admin_command(&config, admin.as_deref(), AdminCommand::Status { json }),
        Command::Restart {
            upstream,
            config,
            admin,
        } => admin_command(&config, admin.as_deref(), AdminCommand::Restart(upstream)),
        Command::Pins {
            action,
            config,
            admin,
            json,
        } => {
            let command = match action {
                PinsAction::Status => pins_command::PinsCommand::Status,
                PinsAction::Diff { upstream } => pins_command::PinsCommand::Diff(upstream),
                PinsAction::Approve { target } => pins_command::PinsCommand::Approve(target),
                PinsAction::Reset { upstream } => pins_command::PinsCommand::Reset(upstream),
            };
            pins(&command, &config, admin.as_deref(), json)
        }
        Command::Explore { target, options } => explore(&target, &options, Exploration::Explore),
        Command::Schema {
            target,
            tool,
            options,
        } => explore(&target, &options, Exploration::Schema(tool)),
        Command::Hash { target, options } => explore(&target, &options, Exploration::Hash),
        Command::Call {
            target,
            tool: Some(tool),
            arguments,
            options,
        } => explore(
            &target,
            &options,
            Exploration::Call(tool, CallArguments::Json(arguments)),
        ),
        Command::Call {
            target,
            tool: None,
            options,
            ..
        } => match explore_command::split_tool_query(&target) {
            Ok(Some(query)) => explore(
                &query.target,
                &options,
                Exploration::Call(query.tool, CallArguments::Query(query.arguments)),
            ),
            Ok(None) => {
                let report = serde_json::json!({"error": "name the tool: `plexus call TARGET TOOL '{json}'`, or end a naked URI's query with `tool=NAME&arg=value…`", "target": target});
                let _ = writeln!(std::io::stderr(), "{report}");
                ExitCode::FAILURE
            }
            Err(error) => {
                let report = serde_json::json!({"error": error.to_string(), "target": target});
                let _ = writeln!(std::io::stderr(), "{report}");
                ExitCode::FAILURE
            }
        },
        Command::Serve {
            config,
            stdio,
            view,
        } => {
            let (loaded, sha256) = match config::read(&config, &environment) {
                Ok(loaded) => loaded,
                Err(error) => {
                    tracing::error!("{error}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            if let Some(name) = view
                .as_deref()
                .filter(|name| !loaded.views.contains_key(*name))
            {
                tracing::error!(
                    "{}: there is no view `{name}` ([views.{name}])",
                    config.display()
                );
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
            // Before the runtime's threads start allocating.
            memory::fix_thresholds_for_reading();
            let Some(runtime) = runtime_with(loaded.daemon.worker_threads) else {
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
                    app::serve_stdio(loaded, view).await
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
    runtime_with(None)
}

/// The runtime with `worker_threads` workers; None: tokio's default, one per core
/// unless `TOKIO_WORKER_THREADS` says otherwise.
fn runtime_with(worker_threads: Option<usize>) -> Option<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads {
        builder.worker_threads(threads);
    }
    match builder.enable_all().build() {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            None
        }
    }
}

/// The explore commands: JSON on stdout, or a JSON error on stderr and exit 1.
fn explore(target: &str, options: &ExploreOptions, what: Exploration) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(async {
        let explored = explore_command::open(target, &options.config, &environment).await?;
        let answer = match what {
            Exploration::Explore => Ok(explored.explore()),
            Exploration::Schema(tool) => explored.schema(&tool),
            Exploration::Hash => Ok(explored.hash()),
            Exploration::Call(tool, CallArguments::Query(pairs)) => {
                match explored.typed_arguments(&tool, &pairs) {
                    Ok(arguments) => explored.call(&tool, arguments).await,
                    Err(error) => Err(error),
                }
            }
            Exploration::Call(tool, CallArguments::Json(arguments)) => {
                match serde_json::from_str(&arguments) {
                    Ok(arguments @ serde_json::Value::Object(_)) => {
                        explored.call(&tool, arguments).await
                    }
                    _ => Err(explore_command::ExploreError::Target(format!(
                        "the arguments must be a JSON object, not `{arguments}`"
                    ))),
                }
            }
        };
        explored.close().await;
        answer
    });
    match outcome {
        Ok(answer) => {
            let text = if options.pretty {
                serde_json::to_string_pretty(&answer)
            } else {
                serde_json::to_string(&answer)
            };
            // A closed pipe (`| head`) is the reader's choice, not a failure to report.
            let _ = writeln!(std::io::stdout(), "{}", text.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(error) => {
            let report = serde_json::json!({"error": error.to_string(), "target": target});
            let _ = writeln!(std::io::stderr(), "{report}");
            ExitCode::FAILURE
        }
    }
}

/// Text for people, for a terminal: it carries upstreams' words (stderr lines,
/// descriptions), and a control character in them (an escape that retitles,
/// repaints or writes the clipboard) is shown escaped, not sent to the terminal.
/// Line breaks and tabs stay.
fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.contains(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// `plexus reload`: the daemon's JSON answer on stdout.
fn reload(config: &std::path::Path, admin: Option<&str>) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let answer = runtime.block_on(admin_client::reload(config, admin, &environment));
    exit_after(answer.map(|(status, body)| {
        println!("{}", body.trim_end());
        let applied = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|answer| answer.get("outcome")?.as_str().map(|o| o == "applied"))
            .unwrap_or(false);
        status == 200 && applied
    }))
}

/// The exit code of a command that asked the running daemon: 0 when the daemon
/// agreed, 1 when it answered otherwise, `EXIT_UNAVAILABLE` when it could not be asked.
fn exit_after(answered: Result<bool, impl std::fmt::Display>) -> ExitCode {
    match answered {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_UNAVAILABLE)
        }
    }
}

enum AdminCommand {
    Status { json: bool },
    Restart(String),
}

/// `plexus status` and `plexus restart`: one request to the running daemon.
fn admin_command(config: &std::path::Path, admin: Option<&str>, command: AdminCommand) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let exchange = async {
        let address = match admin {
            Some(address) => address.to_string(),
            None => admin_client::admin_address(config, &environment)?,
        };
        let (method, path) = match &command {
            AdminCommand::Status { .. } => (http::Method::GET, "/status".to_string()),
            AdminCommand::Restart(upstream) => {
                (http::Method::POST, format!("/upstreams/{upstream}/restart"))
            }
        };
        admin_client::request(&address, method, &path, None).await
    };
    exit_after(runtime.block_on(exchange).map(|(status, body)| {
        let text = match &command {
            AdminCommand::Status { json: false } if status == 200 => {
                match serde_json::from_str(&body) {
                    Ok(status) => for_terminal(&status::text(&status)).into_owned(),
                    Err(_) => body,
                }
            }
            _ => format!("{}\n", body.trim_end()),
        };
        let _ = std::io::stdout().write_all(text.as_bytes());
        (200..300).contains(&status)
    }))
}

/// `plexus pins …`: text for people (JSON with `--json`) on stdout; exit 1 when
/// refused (nothing pending, an unknown name, an unreadable pin file), 64 when the
/// configuration cannot be read.
fn pins(
    command: &pins_command::PinsCommand,
    config: &std::path::Path,
    admin: Option<&str>,
    json: bool,
) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(pins_command::run(command, config, admin, &environment)) {
        Ok(answer) => {
            let text = if json {
                format!("{}\n", answer.body)
            } else {
                for_terminal(&pins_command::render(command, &answer)).into_owned()
            };
            let _ = std::io::stdout().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(pins_command::PinsCommandError::Config(error)) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(1)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_for_a_terminal_shows_control_characters_escaped() {
        let plain = "plexus 0.1.0\n\tready";
        assert!(matches!(for_terminal(plain), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            for_terminal("a\u{1b}]0;title\u{7}b\u{9b}2J\u{7f}c\n"),
            "a\\u{1b}]0;title\\u{7}b\\u{9b}2J\\u{7f}c\n"
        );
    }
}
