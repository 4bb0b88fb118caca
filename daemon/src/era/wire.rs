//! The 2026-07-28 wire rules plexus serves: no `initialize`; each request
//! carries its protocol version and the client's capabilities in `_meta` (checked
//! and taken here), every result names its `resultType`, cacheable ones say for
//! how long, and the HTTP headers mirror the body.

use std::sync::Arc;

use adapters::RawObject;
use serde_json::{json, Map, Value};

use super::RequestMeta;
use crate::jsonrpc::RelayError;
use crate::logging::LogLevel;

/// The revision without a handshake that plexus serves.
pub const MODERN_VERSION: &str = "2026-07-28";
/// Every revision plexus serves, newest first (what `server/discover` and -32022 list).
pub const ALL_VERSIONS: &[&str] = &[
    MODERN_VERSION,
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// The extension that brings tasks to 2026-07-28 (declared under `extensions`).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The protocol version a request declares in its `_meta`, if any: present
/// means the client speaks a revision without a handshake.
pub fn declared_version(params: Option<&Value>) -> Option<&Value> {
    params?.get("_meta")?.get(META_PROTOCOL_VERSION)
}

/// Checks the per-request fields: an unserved version is -32022 with the
/// versions plexus serves; missing capabilities are -32602. `taken`: the front
/// took the client's capabilities (an object) out of `_meta` already.
pub fn check_meta(params: Option<&Value>, taken: bool) -> Result<(), RelayError> {
    checked_meta(params, taken).map(drop)
}

/// Checks the per-request fields and takes the client's capabilities out of
/// `params` (unless the front did: `taken`): they belong to the request's scope,
/// and what an upstream is told of them is what plexus relays
/// (`set_client_capabilities`), never the original.
pub fn take_meta(
    params: &mut Option<Value>,
    taken: Option<Arc<Value>>,
) -> Result<RequestMeta, RelayError> {
    let log_level = checked_meta(params.as_ref(), taken.is_some())?;
    let capabilities = taken.unwrap_or_else(|| {
        Arc::new(
            params
                .as_mut()
                .and_then(|p| p.get_mut("_meta"))
                .and_then(Value::as_object_mut)
                .and_then(|meta| meta.shift_remove(META_CLIENT_CAPABILITIES))
                .unwrap_or_else(|| Value::Object(Map::new())),
        )
    });
    Ok(RequestMeta {
        capabilities,
        log_level,
    })
}

/// Checks the per-request fields; the log level they ask for, if any.
fn checked_meta(params: Option<&Value>, taken: bool) -> Result<Option<LogLevel>, RelayError> {
    let meta = params
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object);
    let version = meta.and_then(|m| m.get(META_PROTOCOL_VERSION));
    match version.and_then(Value::as_str) {
        Some(MODERN_VERSION) => {}
        Some(other) => {
            return Err(RelayError::UnsupportedVersion {
                requested: other.to_string(),
                supported: ALL_VERSIONS.to_vec(),
            })
        }
        None => {
            return Err(RelayError::InvalidParams(format!(
                "`_meta.{META_PROTOCOL_VERSION}` must be a string"
            )))
        }
    }
    if !taken
        && !meta
            .and_then(|m| m.get(META_CLIENT_CAPABILITIES))
            .is_some_and(Value::is_object)
    {
        return Err(RelayError::InvalidParams(format!(
            "`_meta.{META_CLIENT_CAPABILITIES}` is required and must be an object"
        )));
    }
    // An unknown level is refused, as `logging/setLevel` refuses it.
    match meta.and_then(|m| m.get(META_LOG_LEVEL)) {
        None | Some(Value::Null) => Ok(None),
        Some(level) => level.as_str().and_then(LogLevel::parse).map(Some).ok_or_else(|| {
            RelayError::InvalidParams(format!(
                "`_meta.{META_LOG_LEVEL}` must be a syslog level name (debug, info, notice, warning, error, critical, alert, emergency)"
            ))
        }),
    }
}

/// [`mark_complete`] for a result relayed unread: its bytes, then what closes it,
/// `"resultType":"complete"` added at its end unless it has a type. `None`: it must
/// be read first (a result that may be cached).
pub fn mark_complete_unread<'a>(method: &str, raw: &'a RawObject) -> Option<[&'a [u8]; 2]> {
    if is_cacheable(method) {
        return None;
    }
    if raw.member("resultType").is_some() {
        return Some([raw.bytes(), b""]);
    }
    // A skimmed result is an object with members: it ends in `}`.
    let open = raw.bytes().strip_suffix(b"}")?;
    Some([open, br#","resultType":"complete"}"#])
}

/// 2026-07-28 results name their type, and cacheable ones say how long they
/// may be cached; handshake-era upstreams send neither.
pub fn mark_complete(method: &str, result: &mut Value) {
    if let Value::Object(result) = result {
        result
            .entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
        if is_cacheable(method) {
            // The catalog changes whenever an upstream does: never cache it, never share it.
            result.entry("ttlMs").or_insert_with(|| Value::from(0));
            result
                .entry("cacheScope")
                .or_insert_with(|| Value::String("private".into()));
        }
    }
}

fn is_cacheable(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
    )
}

/// The answer to `server/discover`.
pub fn discover_result(capabilities: Value, instructions: String) -> Value {
    let info = server_info();
    json!({
        "resultType": "complete",
        "supportedVersions": ALL_VERSIONS,
        "capabilities": capabilities,
        "serverInfo": info,
        "instructions": instructions,
        // The catalog, and with it the capabilities, change as upstreams come and go.
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {META_SERVER_INFO: info},
    })
}

pub fn server_info() -> Value {
    json!({"name": "plexus", "version": env!("CARGO_PKG_VERSION")})
}

/// Adds the subscription id to a notification delivered on a listen stream.
pub fn tag_subscription(mut notification: Value, subscription: &Value) -> Value {
    if let Some(message) = notification.as_object_mut() {
        let params = message
            .entry("params")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(params) = params.as_object_mut() {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(META_SUBSCRIPTION_ID.into(), subscription.clone());
            }
        }
    }
    notification
}

/// The body member `Mcp-Name` mirrors, for the methods that require it.
pub fn mirrored_name<'a>(method: &str, params: Option<&'a Value>) -> Option<Option<&'a str>> {
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        // The tasks extension routes its methods by task.
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return None,
    };
    Some(params.and_then(|p| p.get(key)).and_then(Value::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_log_level_is_refused() {
        for level in [json!("loud"), json!(3), json!({})] {
            let params = json!({"_meta": {META_PROTOCOL_VERSION: MODERN_VERSION, META_CLIENT_CAPABILITIES: {}, META_LOG_LEVEL: level}});
            assert!(
                matches!(check_meta(Some(&params), false), Err(RelayError::InvalidParams(m)) if m.contains(META_LOG_LEVEL)),
                "{level}"
            );
        }
        let params = json!({"_meta": {META_PROTOCOL_VERSION: MODERN_VERSION, META_CLIENT_CAPABILITIES: {}, META_LOG_LEVEL: "warning"}});
        assert!(check_meta(Some(&params), false).is_ok());
    }

    #[test]
    fn meta_is_checked_version_first() {
        let ok = json!({"name": "x", "_meta": {META_PROTOCOL_VERSION: MODERN_VERSION, META_CLIENT_CAPABILITIES: {"sampling": {}}, META_LOG_LEVEL: "info", "progressToken": 1}});
        assert!(check_meta(Some(&ok), false).is_ok());
        let mut params = Some(ok);
        let Ok(meta) = take_meta(&mut params, None) else {
            panic!("valid meta refused");
        };
        assert_eq!(*meta.capabilities, json!({"sampling": {}}));
        assert_eq!(meta.log_level, LogLevel::parse("info"));
        // The capabilities were taken; the rest of `_meta` stays, in order.
        assert_eq!(
            serde_json::to_string(&params).ok(),
            serde_json::to_string(&json!({"name": "x", "_meta": {META_PROTOCOL_VERSION: MODERN_VERSION, META_LOG_LEVEL: "info", "progressToken": 1}})).ok()
        );

        let error_of = |params: Value| match take_meta(&mut Some(params.clone()), None) {
            Ok(_) => panic!("accepted {params}"),
            Err(error) => error.to_error_object(),
        };
        let error = error_of(
            json!({"_meta": {META_PROTOCOL_VERSION: "1900-01-01", META_CLIENT_CAPABILITIES: {}}}),
        );
        assert_eq!(error["code"], -32022);
        assert_eq!(error["data"]["requested"], "1900-01-01");
        assert_eq!(error["data"]["supported"][0], MODERN_VERSION);

        let error = error_of(json!({"_meta": {META_PROTOCOL_VERSION: MODERN_VERSION}}));
        assert_eq!(error["code"], -32602);

        // Capabilities a front took out already count as present, and are the ones used.
        let taken = Arc::new(json!({"roots": {}}));
        let mut params = Some(json!({"_meta": {META_PROTOCOL_VERSION: MODERN_VERSION}}));
        assert!(check_meta(params.as_ref(), true).is_ok());
        let Ok(meta) = take_meta(&mut params, Some(taken.clone())) else {
            panic!("taken capabilities refused");
        };
        assert!(Arc::ptr_eq(&meta.capabilities, &taken));
        // The version is still checked first.
        let mut params = Some(json!({"_meta": {META_PROTOCOL_VERSION: "1900-01-01"}}));
        assert!(take_meta(&mut params, Some(taken)).is_err());
    }

    #[test]
    fn unread_results_get_their_type_spliced_in() {
        let mark = |method: &str, text: &str| {
            let raw = RawObject::skim(text.to_string())?;
            let [head, tail] = mark_complete_unread(method, &raw)?;
            Some(String::from_utf8_lossy(&[head, tail].concat()).into_owned())
        };
        assert_eq!(
            mark("tools/call", r#"{"content": [] }"#).as_deref(),
            Some(r#"{"content": [] ,"resultType":"complete"}"#)
        );
        let typed = r#"{"resultType":"input_required","inputRequests":{}}"#;
        assert_eq!(mark("tools/call", typed).as_deref(), Some(typed));
        // A type only nested is no type: spliced in at the top.
        assert_eq!(
            mark("tools/call", r#"{"structuredContent":{"resultType":"x"}}"#).as_deref(),
            Some(r#"{"structuredContent":{"resultType":"x"},"resultType":"complete"}"#)
        );
        // What must be read first: a cacheable result; an empty object, a duplicate
        // member and a non-object are not even skimmed.
        assert_eq!(mark("resources/read", r#"{"contents":[]}"#), None);
        for unskimmed in ["{ }", r#"{"task":1,"task":2}"#, "[]"] {
            assert!(
                RawObject::skim(unskimmed.to_string()).is_none(),
                "{unskimmed}"
            );
        }
    }

    #[test]
    fn results_are_marked_complete_unless_typed() {
        let mut plain = json!({"content": []});
        mark_complete("tools/call", &mut plain);
        assert_eq!(plain, json!({"content": [], "resultType": "complete"}));
        let mut typed = json!({"resultType": "input_required"});
        mark_complete("tools/call", &mut typed);
        assert_eq!(typed["resultType"], "input_required");
        let mut listed = json!({"tools": []});
        mark_complete("tools/list", &mut listed);
        assert_eq!(listed["ttlMs"], 0);
        assert_eq!(listed["cacheScope"], "private");
    }
}
