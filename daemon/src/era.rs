//! The 2026-07-28 wire era as plexus serves it: no `initialize`; each request
//! carries its protocol version and the client's capabilities in `_meta`, every
//! result names its `resultType`, and the HTTP headers mirror the body.

use std::sync::Arc;

use adapters::{RawObject, Reply};
use serde_json::{json, Map, Value};

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

/// Which revision a client speaks, decided once where its request arrives (a
/// front, or a scope's creation) and carried down to the code that answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// `initialize` once, then a session (2024-11-05 to 2025-11-25).
    Handshake,
    /// 2026-07-28: no handshake; every request declares its version in `_meta`.
    Modern,
}

impl Era {
    /// The era of a message arriving in a session: a client that never
    /// initialized and declares a version per request (or asks `server/discover`)
    /// speaks 2026-07-28.
    pub fn of_message(initialized: bool, message: &Value) -> Era {
        let modern = !initialized
            && (message.get("method").and_then(Value::as_str) == Some("server/discover")
                || declared_version(message.get("params")).is_some());
        if modern {
            Era::Modern
        } else {
            Era::Handshake
        }
    }
}

/// The per-request context a 2026-07-28 client sends in `_meta`.
#[derive(Clone, Debug)]
pub struct RequestMeta {
    pub capabilities: Arc<Value>,
    pub log_level: Option<LogLevel>,
}

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

/// Puts `capabilities` in a request's `_meta` as the client's.
pub fn set_client_capabilities(params: &mut Option<Value>, capabilities: Value) {
    let params = params.get_or_insert_with(|| Value::Object(serde_json::Map::new()));
    let Value::Object(params) = params else {
        return;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(META_CLIENT_CAPABILITIES.to_string(), capabilities);
    }
}

/// Whether a request to a 2026-07-28 upstream needs the tasks extension declared:
/// a task method, or a handshake-era `tools/call` with a `task` parameter (which
/// that revision has no field for, so it is taken out).
pub fn handshake_task_request(method: &str, params: &mut Option<Value>) -> bool {
    if method.starts_with("tasks/") {
        return true;
    }
    method == "tools/call"
        && params
            .as_mut()
            .and_then(Value::as_object_mut)
            .and_then(|params| params.remove("task"))
            .is_some()
}

/// Adds the tasks extension to a client-capabilities object.
pub fn declare_tasks_extension(capabilities: &mut Value) {
    if let Value::Object(capabilities) = capabilities {
        let extensions = capabilities
            .entry("extensions")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(extensions) = extensions {
            extensions
                .entry(TASKS_EXTENSION)
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
}

/// Removes the per-request fields before a request goes to a handshake-era
/// upstream: it negotiated once at `initialize`, and some servers reject a
/// version in `_meta` they did not negotiate.
pub fn strip_request_meta(params: &mut Option<Value>) {
    let Some(Value::Object(params)) = params else {
        return;
    };
    let emptied = match params.get_mut("_meta") {
        Some(Value::Object(meta)) => {
            // One pass, and the fields that stay keep their order.
            meta.retain(|key, _| {
                ![
                    META_PROTOCOL_VERSION,
                    META_CLIENT_INFO,
                    META_CLIENT_CAPABILITIES,
                    META_LOG_LEVEL,
                ]
                .contains(&key.as_str())
            });
            meta.is_empty()
        }
        _ => false,
    };
    if emptied {
        params.shift_remove("_meta");
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

/// An upstream's error as a 2026-07-28 client must see it: that revision retired
/// -32002 (resource not found) for -32602; anything else passes unchanged.
pub fn modern_upstream_error(error: &mut Value) {
    if let Some(code) = error.get_mut("code") {
        if code.as_i64() == Some(crate::jsonrpc::RESOURCE_NOT_FOUND) {
            *code = Value::from(crate::jsonrpc::INVALID_PARAMS);
        }
    }
}

/// A handshake-era client must get an `elicitationId` with every URL-mode
/// elicitation, which a 2026-07-28 input request has no field for: plexus mints
/// one (and tells the client it completed once the upstream has moved on).
pub fn mint_elicitation_id(method: &str, params: &mut Option<Value>) -> Option<String> {
    if method != "elicitation/create" {
        return None;
    }
    let params = params.as_mut()?.as_object_mut()?;
    // An empty id (what some 2026-07-28 servers put in the field they do not
    // have) names nothing either.
    let named = params
        .get("elicitationId")
        .and_then(Value::as_str)
        .is_some_and(|id| !id.is_empty());
    if params.get("mode").and_then(Value::as_str) != Some("url") || named {
        return None;
    }
    let bits: u128 = rand::random();
    let id = format!("plexus-elicitation-{bits:032x}");
    params.insert("elicitationId".into(), Value::String(id.clone()));
    Some(id)
}

/// A handshake-era upstream's request as a 2026-07-28 input request: the fields
/// that revision has no place for (the URL elicitation's id, task augmentation)
/// are left out; the client's answer reaches the upstream under its own request id.
pub fn to_input_request(method: &str, params: &mut Option<Value>) {
    if let Some(params) = params.as_mut().and_then(Value::as_object_mut) {
        params.remove("task");
        if method == "elicitation/create" {
            params.remove("elicitationId");
        }
    }
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

/// `reply` naming plexus as the server that gave it: a 2026-07-28 upstream may put
/// its own `serverInfo` in each result's `_meta`, and the client, which talks to
/// plexus, would take every upstream's name for its server's, call by call. An
/// unread result gets its `_meta` written anew, the rest left unread.
pub fn answering_as_plexus(reply: Reply) -> Reply {
    let named = |meta: &mut Map<String, Value>| match meta.get_mut(META_SERVER_INFO) {
        Some(info) => {
            *info = server_info();
            true
        }
        None => false,
    };
    match reply {
        Reply::Result(Value::Object(mut result)) => {
            if let Some(Value::Object(meta)) = result.get_mut("_meta") {
                named(meta);
            }
            Reply::Result(Value::Object(result))
        }
        Reply::Unread(raw) => {
            let mentioned = raw
                .member("_meta")
                .filter(|meta| memchr::memmem::find(meta, META_SERVER_INFO.as_bytes()).is_some());
            let Some(Ok(Value::Object(mut meta))) = mentioned.map(serde_json::from_slice::<Value>)
            else {
                return Reply::Unread(raw);
            };
            if !named(&mut meta) {
                return Reply::Unread(raw);
            }
            let changed = serde_json::to_vec(&meta)
                .ok()
                .and_then(|written| raw.with_member("_meta", &written));
            Reply::Unread(changed.unwrap_or(raw))
        }
        other => other,
    }
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
    fn stripping_keeps_other_meta_and_drops_an_emptied_one() {
        let mut params = Some(
            json!({"name": "x", "_meta": {META_PROTOCOL_VERSION: MODERN_VERSION, META_CLIENT_CAPABILITIES: {}, "progressToken": 3}}),
        );
        strip_request_meta(&mut params);
        assert_eq!(
            params,
            Some(json!({"name": "x", "_meta": {"progressToken": 3}}))
        );
        let mut params = Some(json!({"_meta": {META_PROTOCOL_VERSION: MODERN_VERSION}}));
        strip_request_meta(&mut params);
        assert_eq!(params, Some(json!({})));
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
