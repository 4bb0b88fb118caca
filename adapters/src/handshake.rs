//! The start of an upstream session, in either era: `server/discover` for
//! 2026-07-28 (after which every request carries its own `_meta`), or the
//! handshake (`initialize`, then `notifications/initialized`); and listing with
//! upstream pagination.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::connection::UpstreamConnection;
use crate::rpc::ConnectionError;

/// Protocol revisions with an `initialize` handshake, oldest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The revision plexus asks handshake-era upstreams for.
pub const PREFERRED_VERSION: &str = "2025-11-25";

/// The revision without a handshake.
pub const MODERN_VERSION: &str = "2026-07-28";

/// Which era plexus speaks to an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// Probe with `server/discover`; fall back to `initialize` on anything but a
    /// modern answer.
    Auto,
    /// `initialize` only.
    Handshake,
    /// 2026-07-28 only.
    Modern,
}

/// What plexus tells an upstream about itself.
#[derive(Clone, Debug)]
pub struct ClientIdentity {
    pub name: String,
    pub version: String,
    /// The client capabilities plexus can serve for this upstream.
    pub capabilities: Value,
}

/// What the upstream answered to `initialize`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerHello {
    pub protocol_version: String,
    pub capabilities: Value,
    pub server_info: Value,
    pub instructions: Option<String>,
}

impl ServerHello {
    /// Whether the upstream speaks 2026-07-28 (no session; `_meta` on every request).
    pub fn is_modern(&self) -> bool {
        self.protocol_version == MODERN_VERSION
    }

    /// Whether the upstream advertised a capability (`tools`, `prompts`, `resources`, ...).
    pub fn has_capability(&self, name: &str) -> bool {
        self.capabilities
            .get(name)
            .is_some_and(|value| !value.is_null())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error("the upstream refused `{method}`: {error}")]
    Refused { method: String, error: Value },
    #[error("the upstream's `{method}` answer is malformed: {reason}")]
    Malformed { method: String, reason: String },
    #[error("the upstream answered protocol version `{0}`, which plexus does not speak")]
    UnsupportedVersion(String),
}

impl HandshakeError {
    /// Whether this is an `initialize` refused for its version (-32022) by a
    /// server that lists 2026-07-28 among those it supports.
    fn names_modern_version(&self) -> bool {
        let HandshakeError::Refused { method, error } = self else {
            return false;
        };
        method == "initialize" && refused_naming_modern_version(error)
    }
}

/// Whether `error` is a refusal for the version asked (-32022) whose
/// `data.supported` lists 2026-07-28: a server of that revision speaking.
fn refused_naming_modern_version(error: &Value) -> bool {
    error.get("code").and_then(Value::as_i64) == Some(UNSUPPORTED_PROTOCOL_VERSION)
        && error
            .pointer("/data/supported")
            .and_then(Value::as_array)
            .is_some_and(|versions| versions.iter().any(|v| v == MODERN_VERSION))
}

/// The code a server of 2026-07-28 refuses a version with.
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// Starts a session in the era `protocol` allows. In auto mode a probe that is
/// not answered within `probe_timeout` counts as a handshake-era upstream.
pub async fn connect(
    connection: &UpstreamConnection,
    identity: &ClientIdentity,
    protocol: UpstreamProtocol,
    probe_timeout: Duration,
) -> Result<ServerHello, HandshakeError> {
    match protocol {
        UpstreamProtocol::Handshake => initialize(connection, identity).await,
        UpstreamProtocol::Modern => {
            discover(connection, identity)
                .await?
                .ok_or_else(|| HandshakeError::Refused {
                    method: "server/discover".into(),
                    error: json!({"message": "the upstream does not serve 2026-07-28"}),
                })
        }
        UpstreamProtocol::Auto => {
            // Kept, not dropped, when its time is up: a server still loading answers
            // it late, and dropping it would send a cancel before any session.
            let mut probe = std::pin::pin!(discover(connection, identity));
            match tokio::time::timeout(probe_timeout, &mut probe).await {
                Ok(Ok(Some(hello))) => Ok(hello),
                Ok(Ok(None)) => initialize(connection, identity).await,
                // An older HTTP server may refuse a request that is not `initialize`
                // at the HTTP level (400 without a session). A refused credential
                // (401, 403) says nothing of the era: it is the answer, so a login
                // can follow it.
                Ok(Err(HandshakeError::Connection(ConnectionError::HttpStatus {
                    status, ..
                }))) if !matches!(status, 401 | 403) => initialize(connection, identity).await,
                Ok(Err(error)) => Err(error),
                Err(_) => match initialize(connection, identity).await {
                    // A server of 2026-07-28 alone, slow to answer the probe: it
                    // names the version it serves, and its answer to the probe is due.
                    Err(refused) if refused.names_modern_version() => probe.await?.ok_or(refused),
                    handshake => handshake,
                },
            }
        }
    }
}

/// The per-request fields plexus sends a 2026-07-28 upstream.
fn request_meta(identity: &ClientIdentity) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        Value::from(MODERN_VERSION),
    );
    meta.insert(
        "io.modelcontextprotocol/clientInfo".into(),
        json!({"name": identity.name, "version": identity.version}),
    );
    meta.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        identity.capabilities.clone(),
    );
    meta
}

/// `server/discover`: Some when the upstream serves 2026-07-28, None when its
/// answer marks it as handshake era (an error, or only handshake versions).
pub async fn discover(
    connection: &UpstreamConnection,
    identity: &ClientIdentity,
) -> Result<Option<ServerHello>, HandshakeError> {
    let meta = request_meta(identity);
    let params = json!({ "_meta": meta });
    let mut answer = connection
        .request("server/discover", Some(params.clone()))
        .await?
        .into_result();
    // A -32022 that lists 2026-07-28, the version asked, comes from a server of
    // that revision: it is asked once more, as the error invites, rather than
    // taken for a handshake-era server (which never sends -32022).
    if answer.as_ref().is_err_and(refused_naming_modern_version) {
        tracing::debug!(
            "server/discover was refused for its version by a server that lists it; asking again"
        );
        answer = connection
            .request("server/discover", Some(params))
            .await?
            .into_result();
    }
    let result = match answer {
        Ok(result) => result,
        Err(_) => return Ok(None),
    };
    let versions = result
        .get("supportedVersions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let modern = versions.iter().any(|v| v == MODERN_VERSION);
    if !modern {
        return Ok(None);
    }
    let server_info = result
        .get("serverInfo")
        .or_else(|| {
            result
                .get("_meta")
                .and_then(|m| m.get("io.modelcontextprotocol/serverInfo"))
        })
        .cloned()
        .unwrap_or(Value::Null);
    connection.set_request_meta(meta);
    Ok(Some(ServerHello {
        protocol_version: MODERN_VERSION.into(),
        capabilities: result
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| json!({})),
        server_info,
        instructions: result
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_string),
    }))
}

/// Runs `initialize` and sends `notifications/initialized`.
pub async fn initialize(
    connection: &UpstreamConnection,
    identity: &ClientIdentity,
) -> Result<ServerHello, HandshakeError> {
    let params = json!({
        "protocolVersion": PREFERRED_VERSION,
        "capabilities": identity.capabilities,
        "clientInfo": {"name": identity.name, "version": identity.version},
    });
    let result = match connection
        .request("initialize", Some(params))
        .await?
        .into_result()
    {
        Ok(result) => result,
        Err(error) => {
            return Err(HandshakeError::Refused {
                method: "initialize".into(),
                error,
            })
        }
    };
    let malformed = |reason: &str| HandshakeError::Malformed {
        method: "initialize".into(),
        reason: reason.into(),
    };
    let protocol_version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("no protocolVersion"))?
        .to_string();
    if !HANDSHAKE_VERSIONS.contains(&protocol_version.as_str()) {
        return Err(HandshakeError::UnsupportedVersion(protocol_version));
    }
    let hello = ServerHello {
        protocol_version,
        capabilities: result
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| json!({})),
        server_info: result.get("serverInfo").cloned().unwrap_or(Value::Null),
        instructions: result
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    connection.notify("notifications/initialized", None).await?;
    Ok(hello)
}

/// Every entry of a paginated list, and each page's cache hints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listed {
    pub entries: Vec<Value>,
    /// Per page, its `ttlMs` and `cacheScope` as sent (2026-07-28; handshake-era
    /// pages have none), for the caller to interpret.
    pub hints: Vec<Map<String, Value>>,
}

/// How much of one upstream list plexus reads: an upstream that hands out cursors
/// forever, or pages without end, cannot hold the catalog hostage or take the
/// daemon's memory.
#[derive(Clone, Copy, Debug)]
pub struct ListLimits {
    pub max_pages: usize,
    /// The entries' JSON, in bytes, over every page.
    pub max_bytes: usize,
}

/// Pages through a list method (`tools/list`, ...) and returns every entry, up to
/// `limits` (then what was read so far, and a warning); a cursor given twice ends
/// the walk too (the pages would repeat).
pub async fn list_all(
    connection: &UpstreamConnection,
    method: &str,
    result_key: &str,
    limits: ListLimits,
) -> Result<Listed, HandshakeError> {
    let mut listed = Listed::default();
    let mut cursor: Option<Value> = None;
    let mut cursors: HashSet<String> = HashSet::new();
    let mut bytes = 0usize;
    for _ in 0..limits.max_pages {
        let params = cursor.take().map(|cursor| json!({ "cursor": cursor }));
        let mut result = match connection.request(method, params).await?.into_result() {
            Ok(result) => result,
            Err(error) => {
                return Err(HandshakeError::Refused {
                    method: method.into(),
                    error,
                })
            }
        };
        listed.hints.push(
            ["ttlMs", "cacheScope"]
                .into_iter()
                .filter_map(|key| Some((key.to_string(), result.get(key)?.clone())))
                .collect(),
        );
        match result.get_mut(result_key).map(Value::take) {
            Some(Value::Array(page)) => {
                for entry in page {
                    bytes = bytes.saturating_add(crate::json_out::serialized_len(&entry));
                    if bytes > limits.max_bytes {
                        tracing::warn!(
                            upstream = %connection.upstream(),
                            method,
                            max_bytes = limits.max_bytes,
                            kept = listed.entries.len(),
                            "the upstream's list is longer than plexus reads; keeping the entries before"
                        );
                        return Ok(listed);
                    }
                    listed.entries.push(entry);
                }
            }
            Some(_) => {
                return Err(HandshakeError::Malformed {
                    method: method.into(),
                    reason: format!("`{result_key}` is not an array"),
                })
            }
            None => {}
        }
        match result.get_mut("nextCursor").map(Value::take) {
            Some(next) if !next.is_null() && next != "" => {
                if !cursors.insert(next.to_string()) {
                    tracing::warn!(
                        upstream = %connection.upstream(),
                        method,
                        "the upstream's pagination gave a cursor twice; keeping the pages read so far"
                    );
                    return Ok(listed);
                }
                cursor = Some(next);
            }
            _ => return Ok(listed),
        }
    }
    tracing::warn!(
        upstream = %connection.upstream(),
        method,
        max_pages = limits.max_pages,
        "upstream pagination did not end; keeping the pages read so far"
    );
    Ok(listed)
}
