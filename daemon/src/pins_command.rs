//! `plexus pins status | diff [UPSTREAM] | approve UPSTREAM[/NAME] | reset UPSTREAM`:
//! against the running daemon (its admin listener, through the control path, so an
//! approval is listed to connected sessions at once), or, when no daemon of this
//! config listens, against the pin file itself, which a `serve --stdio` daemon
//! (it has no listener) watches and reads again as it changes.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use http::Method;
use registry::fingerprint;
use serde_json::{json, Value};

use crate::admin_client::{self, AdminClientError};
use crate::app::STDIO_RUNTIME_PREFIX;
use crate::catalog_host::write_atomically;
use crate::cli::{self, AdminArgs, PinsAction, EXIT_BAD_CONFIG};
use crate::config::{self, Config, SchemaPolicy};
use crate::pins::format::{PinError, PinFile, UpstreamRecord};
use crate::pins::{view, Policy};

enum PinsCommand {
    Status,
    Diff(Option<String>),
    /// `UPSTREAM` or `UPSTREAM/NAME` (a tool or prompt name, a resource URI or template).
    Approve(String),
    Reset(String),
}

#[derive(Debug, thiserror::Error)]
enum PinsCommandError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Pins(#[from] PinError),
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Daemon(AdminClientError),
}

/// Where the answer came from, and the answer (JSON).
struct Answer {
    pub live: bool,
    pub body: Value,
}

/// `plexus pins …`: text for people (JSON with `--json`) on stdout; exit 1 when
/// refused (nothing pending, an unknown name, an unreadable pin file), 64 when the
/// configuration cannot be read.
pub fn run(action: PinsAction, daemon: &AdminArgs, json: bool) -> ExitCode {
    let command = match action {
        PinsAction::Status => PinsCommand::Status,
        PinsAction::Diff { upstream } => PinsCommand::Diff(upstream),
        PinsAction::Approve { target } => PinsCommand::Approve(target),
        PinsAction::Reset { upstream } => PinsCommand::Reset(upstream),
    };
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    let asked = answer(
        &command,
        &daemon.config.path,
        daemon.admin,
        &cli::environment,
    );
    match runtime.block_on(asked) {
        Ok(answer) => {
            let text = if json {
                format!("{}\n", answer.body)
            } else {
                cli::for_terminal(&render(&command, &answer)).into_owned()
            };
            let _ = std::io::stdout().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(PinsCommandError::Config(error)) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(1)
        }
    }
}

/// The daemon's answer, or the pin file's when no daemon of this config listens.
async fn answer(
    command: &PinsCommand,
    config_path: &Path,
    admin: Option<SocketAddr>,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Answer, PinsCommandError> {
    let loaded = config::load(config_path, environment);
    let address = match admin {
        Some(address) => Some(address.to_string()),
        None => admin_client::admin_address(config_path, environment).ok(),
    };
    // A daemon at the admin address serving another pin file: its address and file.
    let mut other = None;
    if let Some(address) = address {
        // An address `--admin` names is the daemon meant; one found from the config
        // may be the default port, where another config's daemon can listen.
        let theirs = match (&loaded, admin) {
            (Ok(config), None) => match pin_file_of(&address).await {
                Ok(theirs) => theirs.filter(|theirs| !same_file(theirs, &config.daemon.pins)),
                Err(PinsCommandError::Daemon(AdminClientError::NotListening { .. })) => None,
                Err(error) => return Err(error),
            },
            _ => None,
        };
        match theirs {
            Some(theirs) => other = Some((address, theirs.display().to_string())),
            None => match live(command, &address).await {
                Ok(body) => return Ok(Answer { live: true, body }),
                // Nobody listens: the file is ours to read and change.
                Err(PinsCommandError::Daemon(AdminClientError::NotListening { .. })) => {}
                Err(error) => return Err(error),
            },
        }
    }
    let config = loaded.map_err(|error| PinsCommandError::Config(error.to_string()))?;
    let mut body = offline(command, &config)?;
    // Read after the change: they hold it (they watch the file) from now on.
    body["stdio_daemons"] = json!(stdio_daemons(&config.daemon.state_dir, &config.daemon.pins));
    if let Some((address, file)) = &other {
        body["other_daemon"] = json!({"admin": address, "file": file});
    }
    Ok(Answer { live: false, body })
}

/// The pin file the daemon at `address` serves (`GET /pins`), if it says and the
/// path is absolute (older daemons named it as configured, relative to their own
/// working directory).
async fn pin_file_of(address: &str) -> Result<Option<PathBuf>, PinsCommandError> {
    let (status, text) = admin_client::request(address, Method::GET, "/pins", None)
        .await
        .map_err(PinsCommandError::Daemon)?;
    if status != 200 {
        return Ok(None);
    }
    Ok(serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|answer| answer["file"].as_str().map(PathBuf::from))
        .filter(|file| file.is_absolute()))
}

/// Whether two paths name one file (it may not exist yet: then by their names).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
    }
}

/// The pids of the running `serve --stdio` daemons whose pin file is `pins`, from
/// their `stdio-<pid>.json` in `state_dir` (one left by a killed daemon is skipped).
fn stdio_daemons(state_dir: &Path, pins: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(STDIO_RUNTIME_PREFIX) && name.ends_with(".json")
        })
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let runtime: Value = serde_json::from_str(&text).ok()?;
            let pid = u32::try_from(runtime["pid"].as_u64()?).ok()?;
            let holds = same_file(Path::new(runtime["pins"].as_str()?), pins);
            (holds && running(pid)).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether a process `pid` exists (signal 0 checks without sending anything).
fn running(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        // Someone else's process: it exists.
        Err(errno) => errno == nix::errno::Errno::EPERM,
    }
}

fn split_target(target: &str) -> (&str, Option<&str>) {
    // Upstream names are `[a-z0-9-]`: the first `/` ends one (a URI's own follow).
    match target.split_once('/') {
        Some((upstream, name)) if !name.is_empty() => (upstream, Some(name)),
        _ => (target.trim_end_matches('/'), None),
    }
}

async fn live(command: &PinsCommand, address: &str) -> Result<Value, PinsCommandError> {
    let (method, path, body) = match command {
        PinsCommand::Status => (Method::GET, "/pins".to_string(), None),
        PinsCommand::Diff(None) => (Method::GET, "/pins/diff".to_string(), None),
        PinsCommand::Diff(Some(upstream)) => {
            (Method::GET, format!("/pins/diff?upstream={upstream}"), None)
        }
        PinsCommand::Approve(target) => {
            let (upstream, name) = split_target(target);
            (
                Method::POST,
                "/pins/approve".to_string(),
                Some(json!({"upstream": upstream, "name": name})),
            )
        }
        PinsCommand::Reset(upstream) => (
            Method::POST,
            "/pins/reset".to_string(),
            Some(json!({ "upstream": upstream })),
        ),
    };
    let (status, text) = admin_client::request(address, method, &path, body.as_ref())
        .await
        .map_err(PinsCommandError::Daemon)?;
    let answer: Value =
        serde_json::from_str(&text).unwrap_or_else(|_| json!({"error": text.trim()}));
    if status == 200 {
        Ok(answer)
    } else {
        let error = answer["error"].as_str().unwrap_or("no reason given");
        Err(PinsCommandError::Refused(format!(
            "{error} (HTTP {status})"
        )))
    }
}

fn offline(command: &PinsCommand, config: &Config) -> Result<Value, PinsCommandError> {
    let path = &config.daemon.pins;
    let mut file = PinFile::read(path)?;
    let write = |file: &PinFile| {
        write_atomically(path, &file.to_bytes(), 0o600).map_err(|source| PinError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    let mut answer = match command {
        PinsCommand::Status => {
            let held = |name: &str, record: &UpstreamRecord| {
                let policy = Policy::of(config.upstreams.get(name)?);
                Some(held_by_policy(record, policy))
            };
            view::status(&file, &held)
        }
        PinsCommand::Diff(upstream) => view::diff(&file, upstream.as_deref())?,
        PinsCommand::Approve(target) => {
            let (upstream, name) = split_target(target);
            let approval = file.approve(upstream, name)?;
            write(&file)?;
            json!({"upstream": upstream, "approval": approval})
        }
        PinsCommand::Reset(upstream) => {
            file.reset(upstream)?;
            write(&file)?;
            json!({"upstream": upstream, "reset": true})
        }
    };
    answer["file"] = json!(path.display().to_string());
    Ok(answer)
}

/// How many entries the daemon would hold back, judged from the file.
fn held_by_policy(record: &UpstreamRecord, policy: Policy) -> usize {
    match (&record.pinned, &record.pending) {
        (None, Some(pending)) if policy.strict => pending.entries.len(),
        (Some(pinned), Some(pending)) if policy.on_change == SchemaPolicy::Block => {
            fingerprint::drift(&pinned.snapshot(), &pending.snapshot())
                .entries
                .len()
        }
        _ => 0,
    }
}

/// The answer for people.
fn render(command: &PinsCommand, answer: &Answer) -> String {
    let body = &answer.body;
    let file = body["file"].as_str().unwrap_or("the pin file");
    let stdio: Vec<String> = body["stdio_daemons"]
        .as_array()
        .map(|pids| pids.iter().map(Value::to_string).collect())
        .unwrap_or_default();
    let source = if answer.live {
        "the running daemon".to_string()
    } else if !stdio.is_empty() {
        format!(
            "{file} (watched by the running `plexus serve --stdio` daemon, pid {})",
            stdio.join(", ")
        )
    } else {
        let other = match (
            body["other_daemon"]["admin"].as_str(),
            body["other_daemon"]["file"].as_str(),
        ) {
            (Some(address), Some(theirs)) => {
                format!(" but the one at {address}, which serves another pin file, {theirs}")
            }
            _ => String::new(),
        };
        format!("{file} (no daemon running{other})")
    };
    match command {
        PinsCommand::Status => format!("{}from {source}\n", view::status_text(body)),
        PinsCommand::Diff(_) => view::diff_text(body),
        PinsCommand::Approve(_) => {
            let approval = &body["approval"];
            let changes = approval["changes"].as_array().map_or(0, Vec::len);
            let approved = match approval["approved"].as_str() {
                Some("*") | None => "the whole catalog".to_string(),
                Some(name) => format!("`{name}`"),
            };
            let effect = if answer.live {
                "it is listed to connected clients now"
            } else if !stdio.is_empty() {
                "the daemon reads the file as it changes and lists it to its client then"
            } else {
                "the daemon exposes it when it next starts"
            };
            format!(
                "approved {approved} of upstream `{}` ({changes} change{}) in {source}; {effect}\n",
                body["upstream"].as_str().unwrap_or("?"),
                if changes == 1 { "" } else { "s" },
            )
        }
        PinsCommand::Reset(upstream) => format!(
            "forgot the pin of upstream `{upstream}` in {source}; its catalog is pinned afresh when next seen\n"
        ),
    }
}
