//! `[daemon]` checked into [`DaemonSettings`]: addresses, budgets, timeouts, the
//! state directory, `auth_tokens`, `allowed_hosts` and `allowed_origins`, the limits,
//! `[daemon.oauth]`; `[daemon.tracing]` in `tracing.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::values::{
    duration_where, expand_variables, is_host_entry, is_origin_entry, secret_value, Zero,
};
use crate::config::raw::{RawDaemon, RawFrontOAuth};
use crate::config::*;

pub(super) fn validate_daemon(
    mut raw: RawDaemon,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> DaemonSettings {
    let mut address = |key: &str, value: Option<String>, default: &str| -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_string());
        text.parse().unwrap_or_else(|_| {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: format!("`{text}` is not an address like `127.0.0.1:7464`"),
            });
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    };
    let listen = address("listen", raw.listen, DEFAULT_LISTEN);
    let admin_listen = address("admin_listen", raw.admin_listen, DEFAULT_ADMIN_LISTEN);
    let name_budget = raw.name_budget.unwrap_or(DEFAULT_NAME_BUDGET);
    if !(16..=1024).contains(&name_budget) {
        issues.push(ConfigIssue {
            key: "daemon.name_budget".into(),
            message: format!("{name_budget} is out of range (16 to 1024)"),
        });
    }
    let page_size = raw.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=10_000).contains(&page_size) {
        issues.push(ConfigIssue {
            key: "daemon.page_size".into(),
            message: format!("{page_size} is out of range (1 to 10000)"),
        });
    }
    let mut duration = |key: &str, value: Option<String>, default: Duration, zero: Zero| {
        value.map_or(default, |text| {
            duration_where(&text, zero).unwrap_or_else(|message| {
                issues.push(ConfigIssue {
                    key: format!("daemon.{key}"),
                    message,
                });
                default
            })
        })
    };
    let drain_timeout = duration(
        "drain_timeout",
        raw.drain_timeout,
        DEFAULT_DRAIN_TIMEOUT,
        Zero::Allowed,
    );
    let session_idle_timeout = duration(
        "session_idle_timeout",
        raw.session_idle_timeout,
        DEFAULT_SESSION_IDLE_TIMEOUT,
        Zero::Refused,
    );
    let state_dir = match raw.state_dir {
        Some(dir) => base.join(dir),
        None => default_state_dir(environment),
    };
    let header_read_timeout = duration(
        "header_read_timeout",
        raw.header_read_timeout,
        DEFAULT_HEADER_READ_TIMEOUT,
        Zero::Refused,
    );
    let body_read_timeout = duration(
        "body_read_timeout",
        raw.body_read_timeout,
        DEFAULT_BODY_READ_TIMEOUT,
        Zero::Refused,
    );
    let first_list_wait = duration(
        "first_list_wait",
        raw.first_list_wait,
        DEFAULT_FIRST_LIST_WAIT,
        Zero::Allowed,
    );
    let pins = base.join(raw.pins.unwrap_or_else(|| PathBuf::from(DEFAULT_PINS_FILE)));
    let mut tokens = Vec::new();
    for (name, value) in raw.auth_tokens {
        let key = format!("daemon.auth_tokens.{name}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            issues.push(ConfigIssue {
                key,
                message: "token names use only letters, digits, `-`, `_` and `.`".into(),
            });
            continue;
        }
        match secret_value(&value, base, environment) {
            Ok(token) if token.len() >= 16 => tokens.push((name, token)),
            // The value itself is never repeated.
            Ok(_) => issues.push(ConfigIssue {
                key,
                message: "a token must be at least 16 characters long".into(),
            }),
            Err(message) => issues.push(ConfigIssue { key, message }),
        }
    }
    let auth_tokens = AuthTokens(tokens);
    let oauth = raw.oauth.map(|table| validate_oauth(table, issues));
    let tracing = super::tracing::validate_tracing(raw.tracing, environment, issues);
    for (key, address) in [("listen", listen), ("admin_listen", admin_listen)] {
        // The admin listener takes static tokens only.
        let guarded = !auth_tokens.is_empty() || (key == "listen" && oauth.is_some());
        if !address.ip().is_loopback() && !guarded {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: format!(
                    "{address} is reachable beyond this machine, and without [daemon] auth_tokens \
                     anyone who reaches it could use every tool; add auth_tokens (and \
                     allowed_hosts), or listen on 127.0.0.1"
                ),
            });
        }
    }
    // `${POD_IP}`: a pod's own address, as a scraper or a peer names it.
    for host in &mut raw.allowed_hosts {
        match expand_variables(host, environment) {
            Ok(expanded) => *host = expanded,
            Err(message) => issues.push(ConfigIssue {
                key: "daemon.allowed_hosts".into(),
                message,
            }),
        }
    }
    for (key, values) in [
        ("allowed_hosts", &raw.allowed_hosts),
        ("allowed_origins", &raw.allowed_origins),
    ] {
        if values.iter().any(|value| value.trim().is_empty()) {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: "entries must not be empty".into(),
            });
        }
    }
    // Entries are compared exactly: a pattern or a URL in the wrong list would
    // never match, and every request it was meant for would be refused.
    // (Empty entries are reported above, once.)
    let given = |entry: &&String| !entry.trim().is_empty();
    for host in raw
        .allowed_hosts
        .iter()
        .filter(given)
        .filter(|host| !is_host_entry(host))
    {
        issues.push(ConfigIssue {
            key: "daemon.allowed_hosts".into(),
            message: format!(
                "`{host}` is not a host name or `name:port` (no scheme, path or wildcard)"
            ),
        });
    }
    for origin in raw
        .allowed_origins
        .iter()
        .filter(given)
        .filter(|origin| !is_origin_entry(origin))
    {
        let message = if origin.trim().eq_ignore_ascii_case("null") {
            // Sent by sandboxed frames and local files: any web page can send it.
            "`null` is the origin any web page can give itself (a sandboxed frame): allowing it would let every page reach plexus".to_string()
        } else {
            format!("`{origin}` is not an origin like `https://ide.example.com` (a scheme and a host, no path or wildcard)")
        };
        issues.push(ConfigIssue {
            key: "daemon.allowed_origins".into(),
            message,
        });
    }
    let mut at_least_one = |key: &str, value: Option<usize>, default: usize| {
        let value = value.unwrap_or(default);
        if value == 0 {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: "must be at least 1".into(),
            });
        }
        value
    };
    // Unset, it is derived from the descriptor limit at start (`descriptors.rs`).
    let max_connections = raw
        .max_connections
        .map(|value| at_least_one("max_connections", Some(value), DEFAULT_MAX_CONNECTIONS));
    let max_sessions = at_least_one("max_sessions", raw.max_sessions, DEFAULT_MAX_SESSIONS);
    let max_sessions_per_principal = at_least_one(
        "max_sessions_per_principal",
        raw.max_sessions_per_principal,
        DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
    );
    let start_concurrency = at_least_one(
        "start_concurrency",
        raw.start_concurrency,
        DEFAULT_START_CONCURRENCY,
    );
    let worker_threads = raw.worker_threads;
    if let Some(threads) =
        worker_threads.filter(|threads| !(1..=MAX_WORKER_THREADS).contains(threads))
    {
        issues.push(ConfigIssue {
            key: "daemon.worker_threads".into(),
            message: format!("{threads} is out of range (1 to {MAX_WORKER_THREADS})"),
        });
    }
    let oauth_client_metadata_url = raw.oauth_client_metadata_url.filter(|url| {
        // A CIMD URL is the client's id: an https URL with a path (draft-ietf-oauth-client-id-metadata-document §3).
        let valid = url
            .strip_prefix("https://")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(host, path)| !host.is_empty() && !path.is_empty());
        if !valid {
            issues.push(ConfigIssue {
                key: "daemon.oauth_client_metadata_url".into(),
                message: format!("`{url}` is not an https URL with a path"),
            });
        }
        valid
    });
    DaemonSettings {
        oauth,
        oauth_client_metadata_url,
        tracing,
        start_concurrency,
        worker_threads,
        auth_tokens,
        allowed_hosts: raw
            .allowed_hosts
            .into_iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect(),
        allowed_origins: raw
            .allowed_origins
            .into_iter()
            .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
            .collect(),
        max_connections,
        header_read_timeout,
        body_read_timeout,
        max_sessions,
        max_sessions_per_principal,
        audit_log: raw.audit_log.map(|path| base.join(path)),
        first_list_wait,
        pins,
        listen,
        admin_listen,
        name_budget,
        page_size,
        expose: raw.expose.unwrap_or_default(),
        state_dir,
        drain_timeout,
        session_idle_timeout,
    }
}

/// `[daemon.oauth]`: an issuer and an audience that are absolute URLs, a
/// `jwks_uri` if given that is one too, a principal claim that is not empty.
/// Claims of views are added by the views' check.
fn validate_oauth(table: toml::Table, issues: &mut Vec<ConfigIssue>) -> FrontOAuth {
    let raw = match table.try_into::<RawFrontOAuth>() {
        Ok(raw) => raw,
        Err(error) => {
            // The keys that were read are not checked: the one error says enough.
            issues.push(ConfigIssue {
                key: "daemon.oauth".into(),
                message: error.message().to_string(),
            });
            return FrontOAuth {
                issuer: String::new(),
                audience: String::new(),
                jwks_uri: None,
                principal_claim: DEFAULT_PRINCIPAL_CLAIM.to_string(),
                scopes: Vec::new(),
                view_claims: Vec::new(),
            };
        }
    };
    let mut url = |key: &str, value: Option<String>, required: bool| {
        let key = format!("daemon.oauth.{key}");
        match value {
            None if required => {
                issues.push(ConfigIssue {
                    key,
                    message: "is required: tokens are checked against it".into(),
                });
                String::new()
            }
            None => String::new(),
            Some(value) => {
                if let Err(problem) = oauth_url(&value) {
                    issues.push(ConfigIssue {
                        key,
                        message: format!("`{value}` {problem}"),
                    });
                }
                value
            }
        }
    };
    let issuer = url("issuer", raw.issuer, true);
    let audience = url("audience", raw.audience, true);
    let jwks_uri = raw
        .jwks_uri
        .map(|value| url("jwks_uri", Some(value), false));
    let principal_claim = raw
        .principal_claim
        .unwrap_or_else(|| DEFAULT_PRINCIPAL_CLAIM.to_string());
    if principal_claim.trim().is_empty() {
        issues.push(ConfigIssue {
            key: "daemon.oauth.principal_claim".into(),
            message: "must name a claim (the default is `sub`)".into(),
        });
    }
    if raw
        .scopes
        .iter()
        .any(|scope| scope.trim().is_empty() || scope.contains(' '))
    {
        issues.push(ConfigIssue {
            key: "daemon.oauth.scopes".into(),
            message: "a scope is one word, not empty".into(),
        });
    }
    FrontOAuth {
        issuer,
        audience,
        jwks_uri,
        principal_claim,
        scopes: raw.scopes,
        view_claims: Vec::new(),
    }
}

/// Why `value` cannot be an issuer, an audience or a JWKS address: http(s), a
/// host, no fragment; plain http only to loopback, where no one can listen in.
fn oauth_url(value: &str) -> Result<(), &'static str> {
    let url = url::Url::parse(value).map_err(|_| "is not an absolute URL (https://...)")?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host");
    }
    if url.fragment().is_some() {
        return Err("must not have a fragment (#...)");
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if url.host_str().is_some_and(is_loopback_name) => Ok(()),
        "http" => Err("must be https (plain http only on loopback)"),
        _ => Err("is not an http(s) URL"),
    }
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `$STATE_DIRECTORY` under systemd, else `$XDG_STATE_HOME/plexus`, else `~/.local/state/plexus`.
pub fn default_state_dir(environment: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = environment("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may pass several, separated by colons; the first is ours.
        let first = dir.split(':').next().unwrap_or(&dir).to_string();
        return PathBuf::from(first);
    }
    if let Some(dir) = environment("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("plexus");
    }
    let home = environment("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/state/plexus")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dir_follows_systemd_then_xdg_then_home() {
        let systemd =
            |key: &str| (key == "STATE_DIRECTORY").then(|| "/var/lib/plexus:/other".to_string());
        assert_eq!(
            default_state_dir(&systemd),
            PathBuf::from("/var/lib/plexus")
        );
        let xdg = |key: &str| (key == "XDG_STATE_HOME").then(|| "/home/u/.state".to_string());
        assert_eq!(
            default_state_dir(&xdg),
            PathBuf::from("/home/u/.state/plexus")
        );
        let home = |key: &str| (key == "HOME").then(|| "/home/u".to_string());
        assert_eq!(
            default_state_dir(&home),
            PathBuf::from("/home/u/.local/state/plexus")
        );
    }
}
