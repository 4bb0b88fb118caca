//! The fields one era requires and the other lacks (docs/protocol.md, "Fields one
//! era requires and the other lacks"): what plexus adds, removes or mints for
//! each as a message crosses from one era to the other.

use adapters::{RawObject, Reply};
use serde_json::{Map, Value};

use super::wire::{
    server_info, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION,
    META_SERVER_INFO, TASKS_EXTENSION,
};

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
            let Some(mut meta) = meta_naming_a_server(&raw) else {
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

/// The handshake era has no result types: a complete result loses its `resultType`.
/// One that came unread loses it unread (one copy of its text, no reading).
pub fn without_complete_type(reply: &mut Reply) {
    match reply {
        Reply::Result(Value::Object(result))
            if result.get("resultType").and_then(Value::as_str) == Some("complete") =>
        {
            result.remove("resultType");
        }
        Reply::Unread(raw) if is_complete(raw.member("resultType")) => {
            *reply = match raw.without_member("resultType") {
                Some(rest) => Reply::Unread(rest),
                None => Reply::Result(Value::Object(Map::new())),
            };
        }
        _ => {}
    }
}

/// The handshake era names the server once, in `initialize`: a result loses the
/// `serverInfo` a 2026-07-28 upstream may put in its `_meta` (and the `_meta` itself
/// when nothing else is left in it), as the same server would answer in that era.
pub fn without_server_info(reply: &mut Reply) {
    match reply {
        Reply::Result(Value::Object(result)) => {
            let Some(Value::Object(meta)) = result.get_mut("_meta") else {
                return;
            };
            if meta.remove(META_SERVER_INFO).is_some() && meta.is_empty() {
                result.remove("_meta");
            }
        }
        Reply::Unread(raw) => {
            let Some(mut meta) = meta_naming_a_server(raw) else {
                return;
            };
            if meta.remove(META_SERVER_INFO).is_none() {
                return;
            }
            if meta.is_empty() {
                *reply = match raw.without_member("_meta") {
                    Some(rest) => Reply::Unread(rest),
                    // `_meta` was the result's only member.
                    None => Reply::Result(Value::Object(Map::new())),
                };
            } else if let Some(rest) = serde_json::to_vec(&meta)
                .ok()
                .and_then(|written| raw.with_member("_meta", &written))
            {
                *reply = Reply::Unread(rest);
            }
        }
        _ => {}
    }
}

/// An unread result's `_meta`, read, when its text mentions a `serverInfo` (else
/// the result stays unread).
fn meta_naming_a_server(raw: &RawObject) -> Option<Map<String, Value>> {
    let meta = raw
        .member("_meta")
        .filter(|meta| memchr::memmem::find(meta, META_SERVER_INFO.as_bytes()).is_some())?;
    match serde_json::from_slice(meta) {
        Ok(Value::Object(meta)) => Some(meta),
        _ => None,
    }
}

/// Whether an unread `resultType` member's text says `complete` (written plainly:
/// an escaped spelling is read, and judged, by whoever reads the result).
pub fn is_complete(result_type: Option<&[u8]>) -> bool {
    result_type == Some(&b"\"complete\""[..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::era::MODERN_VERSION;
    use serde_json::json;

    #[test]
    fn a_handshake_result_loses_server_info_read_or_unread() {
        let info = json!({"name": "plexus", "version": "1"});
        let mut read =
            Reply::Result(json!({"content": [], "_meta": {META_SERVER_INFO: info, "k": 1}}));
        without_server_info(&mut read);
        assert_eq!(
            read.into_result().ok(),
            Some(json!({"content": [], "_meta": {"k": 1}}))
        );
        let mut alone = Reply::Result(json!({"content": [], "_meta": {META_SERVER_INFO: info}}));
        without_server_info(&mut alone);
        assert_eq!(alone.into_result().ok(), Some(json!({"content": []})));
        let text = format!(r#"{{"content":[],"_meta":{{"{META_SERVER_INFO}":{info}}}}}"#);
        let Some(raw) = adapters::RawObject::skim(text.into_bytes()) else {
            panic!("not an object");
        };
        let mut unread = Reply::Unread(raw);
        without_server_info(&mut unread);
        let Reply::Unread(rest) = &unread else {
            panic!("read: {unread:?}");
        };
        assert_eq!(rest.bytes(), br#"{"content":[]}"#);
        let untouched = r#"{"content":[],"_meta":{"k":1}}"#;
        let Some(raw) = adapters::RawObject::skim(untouched.as_bytes().to_vec()) else {
            panic!("not an object");
        };
        let mut unread = Reply::Unread(raw);
        without_server_info(&mut unread);
        let Reply::Unread(rest) = &unread else {
            panic!("read: {unread:?}");
        };
        assert_eq!(rest.bytes(), untouched.as_bytes());
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
}
