//! The command line: its clap types, and what the commands' runners share (exit
//! codes, the process environment, the async runtime, text for a terminal).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// EX_USAGE: the configuration is wrong.
pub(crate) const EXIT_BAD_CONFIG: u8 = 64;
/// EX_UNAVAILABLE: no daemon answered.
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// EX_NOPERM: the daemon refused the credentials (`plexus connect`).
pub(crate) const EXIT_NO_PERMISSION: u8 = 77;

/// What `plexus --version` shows: the crate's version and the git commit it was
/// built from (`build.rs`; "unknown" when built without git).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PLEXUS_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "plexus",
    version = VERSION,
    about = "A multiplexing MCP proxy and aggregator daemon"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve {
        #[command(flatten)]
        config: ConfigArgs,
        /// Serve one client on stdin/stdout instead of the HTTP listeners.
        #[arg(long)]
        stdio: bool,
        /// With --stdio: serve this view of the catalog (a `[views.NAME]`).
        #[arg(long, requires = "stdio")]
        view: Option<String>,
    },
    /// Validate a configuration file and exit (0 when valid).
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
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
    #[command(mut_arg("config", |arg| arg.help(
        "The configuration file the daemon runs (it names the admin listener)"
    )))]
    Reload {
        #[command(flatten)]
        daemon: AdminArgs,
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
    /// Ask the running daemon's admin listener for `/healthz`: exit 0 when it answers
    /// 200, 1 when it answers otherwise, 69 when no daemon answers within 5 s (a
    /// container's health check: the image has no curl).
    Health {
        #[command(flatten)]
        daemon: AdminArgs,
    },
    /// For packagers: shell completions or the man pages, generated from this
    /// command line.
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: Generated,
    },
    /// Internal: kills the process groups the daemon names on stdin once that pipe
    /// closes (the daemon starts it; it outlives a crash of the daemon by a moment).
    #[command(hide = true)]
    Keeper,
    /// The running daemon's upstreams, sessions and configuration: a table, or JSON
    /// with --json (exit 69 when no daemon answers).
    Status {
        #[command(flatten)]
        daemon: AdminArgs,
        #[arg(long)]
        json: bool,
    },
    /// Start an upstream again now, even from `failed`: a serving one is replaced by
    /// a successor that starts first while its calls drain. Prints the outcome as
    /// JSON once known (exit 1 when the successor did not start and the running
    /// instance serves on, 69 when no daemon answers).
    Restart {
        upstream: String,
        #[command(flatten)]
        daemon: AdminArgs,
    },
    /// Log in to a hosted upstream that wants OAuth: opens the authorization URL
    /// with $BROWSER (else prints it, or a device code), stores the tokens
    /// (encrypted, in state_dir) and tells the running daemon, which brings the
    /// upstream up. With --status: each hosted upstream and whether it holds a login.
    Login {
        /// The upstream's name in the configuration.
        #[arg(required_unless_present = "status")]
        upstream: Option<String>,
        /// List the hosted upstreams, which hold a login and which need one.
        #[arg(long, conflicts_with = "upstream")]
        status: bool,
        /// Use the device grant (a URL and a code to enter on any device) when
        /// the server offers it, as on a machine with no browser.
        #[arg(long, conflicts_with = "status")]
        device: bool,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Forget a hosted upstream's tokens and tell the running daemon (the upstream
    /// waits in `needs_login`).
    Logout {
        upstream: String,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Schema pins: where each upstream stands, what changed, approve or reset. Asks
    /// the running daemon, or works on the pin file when none runs.
    #[command(mut_arg("config", |arg| arg.help(
        "The configuration file (it names the pin file and the admin listener)"
    )))]
    Pins {
        #[command(subcommand)]
        action: PinsAction,
        #[command(flatten)]
        daemon: AdminArgs,
        /// JSON, for scripts.
        #[arg(long, global = true)]
        json: bool,
    },
}

impl Command {
    /// The default log filter: None for the keeper, which logs nothing.
    pub fn log_level(&self) -> Option<&'static str> {
        match self {
            Command::Keeper => None,
            // The one-shot commands print JSON; only their problems belong in the log.
            Command::Explore { .. }
            | Command::Schema { .. }
            | Command::Hash { .. }
            | Command::Call { .. }
            | Command::Pins { .. }
            | Command::Status { .. }
            | Command::Restart { .. }
            | Command::Login { .. }
            | Command::Logout { .. }
            | Command::Health { .. }
            | Command::Generate { .. } => Some("warn"),
            Command::Serve { .. }
            | Command::CheckConfig { .. }
            | Command::Reload { .. }
            | Command::Connect { .. } => Some("info"),
        }
    }
}

#[derive(Subcommand)]
pub enum PinsAction {
    /// Each upstream's pin: pinned, changed (waiting for approval) or unapproved.
    Status,
    /// Field by field, what changed since each upstream was pinned.
    Diff { upstream: Option<String> },
    /// Pin what was seen: UPSTREAM for its whole catalog, UPSTREAM/NAME for one entry.
    Approve { target: String },
    /// Forget an upstream's pin: its catalog is pinned afresh when next seen.
    Reset { upstream: String },
}

#[derive(Subcommand)]
pub enum Generated {
    /// A shell's completion script, on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The man pages: plexus.1 and one per command (plexus-serve.1, ...), into DIR.
    Man {
        #[arg(long, value_name = "DIR", default_value = ".")]
        out_dir: PathBuf,
    },
}

/// `--config FILE`, `config.toml` unless given. Global, so that `plexus pins`
/// takes it before or after its action.
#[derive(clap::Args)]
pub struct ConfigArgs {
    /// The configuration file.
    #[arg(
        id = "config",
        long = "config",
        short = 'c',
        value_name = "CONFIG",
        default_value = "config.toml",
        global = true
    )]
    pub path: PathBuf,
}

/// The running daemon's configuration file, and `--admin` for when the file cannot
/// tell where its admin listener is.
#[derive(clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The admin listener, when the file cannot tell.
    #[arg(long, global = true, value_parser = admin_address)]
    pub admin: Option<SocketAddr>,
}

/// `--admin`: an address (`127.0.0.1:7465`, `[::1]:7465`) or a name and port
/// (`localhost:7465`), resolved here; of a name's addresses the first IPv4 one, as
/// the admin listener's default (`127.0.0.1`) is. Anything else is a usage error.
fn admin_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let addresses: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|error| format!("not an address or HOST:PORT ({error})"))?
        .collect();
    addresses
        .iter()
        .find(|address| address.is_ipv4())
        .or(addresses.first())
        .copied()
        .ok_or_else(|| "the name resolves to no address".to_string())
}

#[derive(clap::Args)]
#[command(mut_arg("config", |arg| arg.help("Where a configured upstream's name is looked up")))]
pub struct ExploreOptions {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Indented JSON, for people.
    #[arg(long)]
    pub pretty: bool,
}

/// The process environment, as config expansion reads it.
pub(crate) fn environment(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

pub(crate) fn runtime() -> Option<tokio::runtime::Runtime> {
    runtime_with(None)
}

/// The runtime with `worker_threads` workers; None: tokio's default, one per core
/// unless `TOKIO_WORKER_THREADS` says otherwise.
pub(crate) fn runtime_with(worker_threads: Option<usize>) -> Option<tokio::runtime::Runtime> {
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

/// Text for people, for a terminal: it carries upstreams' words (stderr lines,
/// descriptions), and a control character in them (an escape that retitles,
/// repaints or writes the clipboard) is shown escaped, not sent to the terminal.
/// Line breaks and tabs stay.
pub(crate) fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn admin_is_an_address_or_a_name_and_port() {
        assert_eq!(
            admin_address("[::1]:7465").unwrap(),
            "[::1]:7465".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(admin_address("localhost:7465").unwrap().port(), 7465);
        for bad in [
            "",
            "nonsense",
            "127.0.0.1",
            "localhost:port",
            "127.0.0.1:70000",
        ] {
            assert!(admin_address(bad).is_err(), "{bad}");
        }
    }

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
