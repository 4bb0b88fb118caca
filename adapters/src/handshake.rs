//! The handshake-era start of an upstream session (`initialize`, then
//! `notifications/initialized`) and listing with upstream pagination.

use serde_json::{json, Value};

use crate::rpc::{ConnectionError, Reply};
use crate::stdio::UpstreamConnection;

/// Protocol revisions with an `initialize` handshake, oldest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The revision plexus asks upstreams for.
pub const PREFERRED_VERSION: &str = "2025-11-25";

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
    /// Whether the upstream advertised a capability (`tools`, `prompts`, `resources`, ...).
    pub fn has_capability(&self, name: &str) -> bool {
        self.capabilities
            .get(name)
            .is_some_and(|value| !value.is_null())
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
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
    let result = match connection.request("initialize", Some(params)).await? {
        Reply::Result(result) => result,
        Reply::Error(error) => {
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

/// Pages through a list method (`tools/list`, ...) and returns every entry.
///
/// Stops after `max_pages` pages, so an upstream that hands out cursors forever
/// cannot hold the catalog hostage.
pub async fn list_all(
    connection: &UpstreamConnection,
    method: &str,
    result_key: &str,
    max_pages: usize,
) -> Result<Vec<Value>, HandshakeError> {
    let mut entries = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..max_pages {
        let params = cursor.take().map(|cursor| json!({ "cursor": cursor }));
        let mut result = match connection.request(method, params).await? {
            Reply::Result(result) => result,
            Reply::Error(error) => {
                return Err(HandshakeError::Refused {
                    method: method.into(),
                    error,
                })
            }
        };
        match result.get_mut(result_key).map(Value::take) {
            Some(Value::Array(page)) => entries.extend(page),
            Some(_) => {
                return Err(HandshakeError::Malformed {
                    method: method.into(),
                    reason: format!("`{result_key}` is not an array"),
                })
            }
            None => {}
        }
        match result.get_mut("nextCursor").map(Value::take) {
            Some(next) if !next.is_null() && next != "" => cursor = Some(next),
            _ => return Ok(entries),
        }
    }
    tracing::warn!(
        upstream = %connection.upstream(),
        method,
        max_pages,
        "upstream pagination did not end; keeping the pages read so far"
    );
    Ok(entries)
}
