//! `plexus login NAME`, `plexus logout NAME` and `plexus login --status`: a
//! person's OAuth login to a hosted upstream of the config file. The flow is the
//! explore commands' (the browser through `$BROWSER`, else the URL or device code
//! on stderr; the redirect taken on a loopback port); the tokens go to the store
//! in `state_dir/oauth`, and the running daemon is told through its admin
//! listener, which starts the upstream with them without a restart.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use adapters::oauth::{self, TokenStore};
use serde_json::Value;

use crate::admin_client::{admin_address, request};
use crate::cli::{self, EXIT_BAD_CONFIG};
use crate::config::{self, Config, Launch, UpstreamConfig};
use crate::explore_command;

/// How a login or logout ended, for the exit code.
enum Told {
    /// The daemon took it up (its answer is printed).
    Daemon(bool),
    /// No daemon answers: the tokens wait in the store for its next start.
    NoDaemon,
}

/// The config and the upstream `name`, which must be a hosted one that logs in.
fn hosted(config_path: &Path, name: &str) -> Result<(Config, UpstreamConfig, String), String> {
    let mut loaded =
        config::load(config_path, &cli::environment).map_err(|error| error.to_string())?;
    let upstream = loaded
        .upstreams
        .remove(name)
        .ok_or_else(|| format!("`{name}` is not an upstream of {}", config_path.display()))?;
    let url = match &upstream.launch {
        Launch::Http(endpoint)
            if !endpoint
                .headers
                .iter()
                .any(|(header, _)| header.eq_ignore_ascii_case("authorization")) =>
        {
            endpoint.url.clone()
        }
        _ => {
            return Err(format!(
                "`{name}` does not log in with OAuth: it is not an http(s) upstream, or it configures an Authorization header"
            ))
        }
    };
    Ok((loaded, upstream, url))
}

fn store_of(config: &Config, url: &str) -> TokenStore {
    TokenStore::for_server(&config.daemon.state_dir.join("oauth"), url)
}

/// Forgets the tokens held for `url`, keeping the client registrations (reused).
fn forget_tokens(store: &TokenStore) -> Result<(), String> {
    let mut stored = store.load();
    stored.tokens = None;
    store
        .save(&stored)
        .map_err(|error| adapters::error_chain(&error))
}

/// Tells the running daemon the store changed (`login` or `logout`).
async fn tell_daemon(config_path: &Path, name: &str, action: &str) -> Told {
    let Ok(address) = admin_address(config_path, &cli::environment) else {
        return Told::NoDaemon;
    };
    let path = format!("/upstreams/{name}/{action}");
    match request(&address, http::Method::POST, &path, None).await {
        Ok((status, body)) => {
            let _ = writeln!(std::io::stdout(), "{}", body.trim_end());
            Told::Daemon((200..300).contains(&status))
        }
        Err(_) => Told::NoDaemon,
    }
}

fn report(name: &str, told: Told, what: &str) -> ExitCode {
    match told {
        Told::Daemon(true) => ExitCode::SUCCESS,
        Told::Daemon(false) => ExitCode::from(1),
        Told::NoDaemon => {
            eprintln!("plexus: {what} for `{name}`; no daemon answered: it takes them up at its next start");
            ExitCode::SUCCESS
        }
    }
}

/// `plexus login NAME [--device]`.
pub fn login(name: &str, config_path: &Path, device: bool) -> ExitCode {
    let (config, _, url) = match hosted(config_path, name) {
        Ok(found) => found,
        Err(reason) => {
            eprintln!("plexus login: {reason}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    // A login is a new authorization, not the old token refreshed.
    if let Err(reason) = forget_tokens(&store_of(&config, &url)) {
        eprintln!("plexus login: {reason}");
        return ExitCode::FAILURE;
    }
    let told = runtime.block_on(async {
        let explored = explore_command::open_with(name, config_path, &cli::environment, device)
            .await
            .map_err(|error| error.to_string())?;
        explored.close().await;
        Ok::<_, String>(tell_daemon(config_path, name, "login").await)
    });
    match told {
        Ok(told) => report(name, told, "logged in; the tokens are stored"),
        Err(reason) => {
            eprintln!("plexus login: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// `plexus logout NAME`.
pub fn logout(name: &str, config_path: &Path) -> ExitCode {
    let (config, _, url) = match hosted(config_path, name) {
        Ok(found) => found,
        Err(reason) => {
            eprintln!("plexus logout: {reason}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let Err(reason) = forget_tokens(&store_of(&config, &url)) {
        eprintln!("plexus logout: {reason}");
        return ExitCode::FAILURE;
    }
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    let told = runtime.block_on(tell_daemon(config_path, name, "logout"));
    report(name, told, "logged out")
}

/// `plexus login --status`: each hosted upstream, whether a login is held (never
/// a token), and the daemon's state of it when one answers.
pub fn status(config_path: &Path) -> ExitCode {
    let loaded = match config::load(config_path, &cli::environment) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("plexus login: {error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let states = cli::runtime().and_then(|runtime| {
        runtime.block_on(async {
            let address = admin_address(config_path, &cli::environment).ok()?;
            let (_, body) = request(&address, http::Method::GET, "/status", None)
                .await
                .ok()?;
            serde_json::from_str::<Value>(&body).ok()
        })
    });
    let now = oauth::now();
    let mut out = String::from("UPSTREAM\tLOGIN\tEXPIRES\tDAEMON\n");
    for (name, upstream) in &loaded.upstreams {
        let Ok((_, _, url)) = hosted(config_path, name) else {
            continue;
        };
        let _ = upstream;
        let stored = store_of(&loaded, &url).load();
        let (login, expires) = match &stored.tokens {
            Some(tokens) => (
                "held",
                tokens
                    .expires_at
                    .map(|at| format!("in {} s", at.saturating_sub(now)))
                    .unwrap_or_else(|| "never".into()),
            ),
            None => ("needed", "-".into()),
        };
        let state = states
            .as_ref()
            .and_then(|status| daemon_state(status, name))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!("{name}\t{login}\t{expires}\t{state}\n"));
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    ExitCode::SUCCESS
}

/// The state `/status` gives the upstream `name`.
fn daemon_state(status: &Value, name: &str) -> Option<String> {
    let upstreams = status.get("upstreams")?;
    let entry = match upstreams {
        Value::Array(list) => list
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some(name))?,
        Value::Object(map) => map.get(name)?,
        _ => return None,
    };
    entry
        .get("state")
        .and_then(Value::as_str)
        .map(str::to_string)
}
