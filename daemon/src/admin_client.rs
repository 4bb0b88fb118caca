//! The client side of the admin listener: `plexus reload`, `plexus status`,
//! `plexus restart` and `plexus health` (one request each), and what `plexus pins` asks. The running
//! daemon is found through the admin listener the config file names, or the
//! `daemon.json` in its state directory.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::app::RUNTIME_FILE;
use crate::cli::{self, AdminArgs, EXIT_UNAVAILABLE};
use crate::{config, status};

#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    #[error("cannot find the daemon's admin listener: {0}")]
    NoAddress(String),
    #[error("no daemon listens at {address}: {reason}")]
    NotListening { address: String, reason: String },
    #[error("cannot reach the daemon at {address}: {reason}")]
    Unreachable { address: String, reason: String },
}

/// How long the daemon may take to answer: a changed upstream is warmed first.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// How long `plexus health` waits: a health check must answer quickly or fail.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// What `plexus reload`, `plexus status`, `plexus restart` and `plexus health` ask
/// the running daemon.
pub enum AdminCommand {
    Reload,
    Status { json: bool },
    Restart(String),
    Health,
}

/// One request to the running daemon; its answer on stdout (a table for `status`
/// without `--json`, else the daemon's JSON). Exit 0 when the daemon agreed (for
/// `reload`: the change was applied), 1 when it answered otherwise,
/// `EXIT_UNAVAILABLE` when it could not be asked.
pub fn run(daemon: &AdminArgs, command: AdminCommand) -> ExitCode {
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    let exchange = async {
        let address = match daemon.admin {
            Some(address) => address.to_string(),
            None => admin_address(&daemon.config.path, &cli::environment)?,
        };
        let (method, path) = match &command {
            AdminCommand::Reload => (http::Method::POST, "/reload".to_string()),
            AdminCommand::Status { .. } => (http::Method::GET, "/status".to_string()),
            AdminCommand::Restart(upstream) => {
                (http::Method::POST, format!("/upstreams/{upstream}/restart"))
            }
            AdminCommand::Health => (http::Method::GET, "/healthz".to_string()),
        };
        if let AdminCommand::Health = command {
            return tokio::time::timeout(HEALTH_TIMEOUT, request(&address, method, &path, None))
                .await
                .unwrap_or_else(|_| {
                    Err(AdminClientError::Unreachable {
                        address,
                        reason: format!("no answer within {HEALTH_TIMEOUT:?}"),
                    })
                });
        }
        request(&address, method, &path, None).await
    };
    exit_after(runtime.block_on(exchange).map(|(status, body)| {
        if let AdminCommand::Reload = command {
            println!("{}", body.trim_end());
            let applied = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|answer| answer.get("outcome")?.as_str().map(|o| o == "applied"))
                .unwrap_or(false);
            return status == 200 && applied;
        }
        let text = match &command {
            AdminCommand::Status { json: false } if status == 200 => {
                match serde_json::from_str(&body) {
                    Ok(status) => cli::for_terminal(&status::text(&status)).into_owned(),
                    Err(_) => body,
                }
            }
            _ => format!("{}\n", body.trim_end()),
        };
        let _ = std::io::stdout().write_all(text.as_bytes());
        (200..300).contains(&status)
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

/// One request to the admin listener at `address`: the HTTP status and the body.
pub async fn request(
    address: &str,
    method: http::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, String), AdminClientError> {
    let unreachable = |reason: String| AdminClientError::Unreachable {
        address: address.to_string(),
        reason,
    };
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|error| AdminClientError::NotListening {
            address: address.to_string(),
            reason: error.to_string(),
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| unreachable(error.to_string()))?;
    // The connection is driven while the exchange runs, and aborted with it.
    let mut driving = tokio::task::JoinSet::new();
    driving.spawn(connection);
    let bytes = body.map(|body| body.to_string()).unwrap_or_default();
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, address)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|error| unreachable(error.to_string()))?;
    let exchange = async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| unreachable("no answer in time".into()))?
        .map_err(|error| unreachable(error.to_string()))
}

/// The admin address: `[daemon] admin_listen` unless it is absent or port 0 (then
/// the running daemon's `daemon.json`). The file is read leniently: the point of
/// a reload may be to report that the file is broken.
pub fn admin_address(
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, AdminClientError> {
    let text = std::fs::read_to_string(config_path).map_err(|error| {
        AdminClientError::NoAddress(format!("cannot read {}: {error}", config_path.display()))
    })?;
    let admin_listen = daemon_key(&text, "admin_listen")
        .unwrap_or_else(|| config::DEFAULT_ADMIN_LISTEN.to_string());
    if let Ok(address) = admin_listen.parse::<SocketAddr>() {
        if address.port() != 0 {
            return Ok(address.to_string());
        }
    }
    runtime_field(config_path, environment, "admin_listen").map_err(|error| match error {
        AdminClientError::NoAddress(reason) => AdminClientError::NoAddress(format!(
            "{} names no fixed admin port and {reason}",
            config_path.display()
        )),
        other => other,
    })
}

/// The running daemon's MCP endpoint, from `daemon.json` in the state directory
/// `config_path` names.
pub fn daemon_url(
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, AdminClientError> {
    runtime_field(config_path, environment, "url")
}

/// One field of the running daemon's `daemon.json`.
fn runtime_field(
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    field: &str,
) -> Result<String, AdminClientError> {
    let runtime = runtime_file(config_path, environment)?;
    let body = std::fs::read_to_string(&runtime).map_err(|error| {
        AdminClientError::NoAddress(format!(
            "{} cannot be read ({error}); is the daemon running?",
            runtime.display()
        ))
    })?;
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value.get(field)?.as_str().map(str::to_string))
        .ok_or_else(|| AdminClientError::NoAddress(format!("{} has no {field}", runtime.display())))
}

/// Where the daemon of `config_path` writes `daemon.json`.
fn runtime_file(
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, AdminClientError> {
    let text = std::fs::read_to_string(config_path).map_err(|error| {
        AdminClientError::NoAddress(format!("cannot read {}: {error}", config_path.display()))
    })?;
    let base = config_path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let state_dir = match daemon_key(&text, "state_dir") {
        Some(dir) => base.join(PathBuf::from(dir)),
        None => config::default_state_dir(environment),
    };
    Ok(state_dir.join(RUNTIME_FILE))
}

/// A string key of `[daemon]`: from the parsed TOML, or, when the file does not
/// parse, from a line of the form `key = "value"`.
fn daemon_key(text: &str, key: &str) -> Option<String> {
    match toml::from_str::<toml::Table>(text) {
        Ok(table) => table.get("daemon")?.get(key)?.as_str().map(str::to_string),
        Err(_) => text.lines().find_map(|line| {
            let (name, value) = line.split_once('=')?;
            (name.trim() == key).then(|| value.trim().trim_matches('"').to_string())
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn daemon_keys_are_found_in_good_and_broken_files() {
        let good = "[daemon]\nadmin_listen = \"127.0.0.1:9\"\n";
        assert_eq!(daemon_key(good, "admin_listen").unwrap(), "127.0.0.1:9");
        let broken = "[daemon]\nadmin_listen = \"127.0.0.1:9\"\n[upstreams.a\n";
        assert_eq!(daemon_key(broken, "admin_listen").unwrap(), "127.0.0.1:9");
        assert_eq!(daemon_key(good, "state_dir"), None);
    }
}
