//! JSON-RPC messages as plexus answers them, and the one place where plexus's own
//! failures become JSON-RPC error objects (the codes are listed in README.md, "Errors").

use std::time::Duration;

use serde_json::{json, Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
pub const RESOURCE_NOT_FOUND: i64 = -32002;
pub const UPSTREAM_UNAVAILABLE: i64 = -33001;
pub const UPSTREAM_TIMEOUT: i64 = -33002;
pub const UPSTREAM_FAILED: i64 = -33003;
pub const OVERLOADED: i64 = -33004;
pub const MESSAGE_TOO_LARGE: i64 = -33005;
pub const QUARANTINED: i64 = -33006;
pub const SHUTTING_DOWN: i64 = -33007;
/// 2026-07-28: the HTTP headers do not match the body, or required ones are missing.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: the request needs a client capability its `_meta` did not declare.
pub const MISSING_CAPABILITY: i64 = -32021;
/// 2026-07-28: the request's protocol version is not one plexus serves.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A client's message with its envelope checked.
#[derive(Debug)]
pub enum Envelope {
    Request {
        /// A string or an integer.
        id: Value,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// The client's answer to a request sent to it.
    Response { id: Value, reply: adapters::Reply },
}

/// Why a message is not one JSON-RPC can take, and the id to answer under (null
/// where there is none to trust).
#[derive(Debug, PartialEq)]
pub struct NotJsonRpc {
    pub id: Value,
    pub reason: &'static str,
}

impl NotJsonRpc {
    /// The `-32600` answer.
    pub fn answer(self) -> Value {
        error_response(self.id, &RelayError::InvalidRequest(self.reason.into()))
    }
}

impl Envelope {
    /// Checks `message`'s envelope: an object with `jsonrpc` "2.0", and a request
    /// (a string `method` and a string or integer `id`), a notification, or a
    /// response (an `id` with `result` or `error`).
    pub fn of(message: Value) -> Result<Envelope, NotJsonRpc> {
        let not = |id: Option<Value>, reason| NotJsonRpc {
            id: id.unwrap_or(Value::Null),
            reason,
        };
        let Value::Object(mut object) = message else {
            return Err(not(None, "a message must be a JSON object"));
        };
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(not(object.remove("id"), "`jsonrpc` must be \"2.0\""));
        }
        let method = match object.remove("method") {
            Some(Value::String(method)) => Some(method),
            Some(_) => return Err(not(object.remove("id"), "`method` must be a string")),
            None => None,
        };
        let params = object.remove("params");
        match (method, object.remove("id")) {
            (Some(_), Some(id)) if !(id.is_string() || id.is_i64() || id.is_u64()) => {
                Err(not(None, "a request id must be a string or an integer"))
            }
            (Some(method), Some(id)) => Ok(Envelope::Request { id, method, params }),
            (Some(method), None) => Ok(Envelope::Notification { method, params }),
            (None, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
                let reply = match (object.remove("result"), object.remove("error")) {
                    (Some(result), _) => adapters::Reply::Result(result),
                    (None, error) => adapters::Reply::Error(error.unwrap_or(Value::Null)),
                };
                Ok(Envelope::Response { id, reply })
            }
            (None, id) => Err(not(id, "not a request, notification or response")),
        }
    }
}

/// Everything plexus itself can answer with instead of an upstream's reply.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum RelayError {
    #[error("parse error: {0}")]
    Parse(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("method not found: {0}")]
    MethodNotFound(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    #[error("unknown prompt: {0}")]
    UnknownPrompt(String),
    #[error("resource not found: {0}")]
    UnknownResource(String),
    #[error("upstream `{upstream}` is unavailable ({state})")]
    Unavailable {
        upstream: String,
        state: String,
        retry_after_ms: Option<u64>,
    },
    /// A hosted upstream refused plexus (401, a Bearer challenge) and holds no
    /// usable token: a person must log in.
    #[error("upstream `{upstream}` needs a login: run `plexus login {upstream}`")]
    NeedsLogin { upstream: String },
    #[error("upstream `{upstream}` did not answer within {}ms", .after.as_millis())]
    Timeout { upstream: String, after: Duration },
    #[error("upstream `{upstream}` failed during the call: {reason}")]
    FailedMidCall { upstream: String, reason: String },
    #[error(
        "upstream `{upstream}` is overloaded ({in_flight} calls in flight and {pending} waiting)"
    )]
    Overloaded {
        upstream: String,
        in_flight: usize,
        pending: usize,
    },
    #[error("upstream `{upstream}` sent a message (or a line of output) longer than {limit} bytes, its max_message_bytes; plexus dropped it")]
    TooLarge { upstream: String, limit: usize },
    #[error("a message exceeded {limit} bytes")]
    RequestTooLarge { limit: usize },
    #[error("plexus is shutting down")]
    ShuttingDown,
    #[error("upstream `{upstream}` was removed or replaced by a configuration reload, and this call outlasted its drain time")]
    Drained { upstream: String },
    #[error("unsupported protocol version `{requested}`")]
    UnsupportedVersion {
        requested: String,
        supported: Vec<&'static str>,
    },
    #[error("header mismatch: {0}")]
    HeaderMismatch(String),
    /// `required` is a client-capabilities object naming what is missing.
    #[error("{reason}")]
    MissingCapability { required: Value, reason: String },
    /// Refused at the door: no valid token, a foreign Host or Origin, a malformed request.
    #[error("{reason}")]
    AccessDenied {
        kind: &'static str,
        reason: &'static str,
    },
    /// Opening one more session would pass `max_sessions` (in total or for the principal).
    #[error("too many open sessions ({open} of {limit} {scope}); end unused sessions (HTTP DELETE) or raise [daemon] {key}")]
    TooManySessions {
        open: usize,
        limit: usize,
        scope: &'static str,
        key: &'static str,
    },
    #[error("this session is subscribed to {limit} resources, the most one session may be; unsubscribe from some first")]
    TooManySubscriptions { limit: usize },
    /// An entry held back because its schema changed (or was never approved).
    #[error("{noun} `{name}` of upstream `{upstream}` is quarantined: {why}")]
    Quarantined {
        noun: &'static str,
        name: String,
        upstream: String,
        original: String,
        why: String,
        change: std::sync::Arc<Value>,
    },
}

impl RelayError {
    /// The refusal of `exposed` (a name or URI of `kind`), held back by the pins.
    pub fn quarantined(kind: registry::Kind, exposed: &str, held: registry::Held) -> RelayError {
        let registry::Held { route, change } = held;
        let class = change
            .get("class")
            .and_then(Value::as_str)
            .unwrap_or("security");
        let upstream = route.upstream.to_string();
        let why = match class {
            "unapproved" => format!(
                "nothing of the upstream is approved yet (pin = \"strict\"); \
                 approve it with `plexus pins approve {upstream}`"
            ),
            "pin_file_unreadable" => format!(
                "the pin file cannot be read ({}); mend it and reload the configuration",
                change
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown reason")
            ),
            _ => {
                let reasons: Vec<&str> = change
                    .get("fields")
                    .and_then(Value::as_array)
                    .map(|fields| {
                        fields
                            .iter()
                            .filter_map(|field| field.get("reason").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                format!(
                    "its definition changed since it was pinned ({class}: {}); review it with \
                     `plexus pins diff {upstream}` and approve it with `plexus pins approve {upstream}/{}`",
                    reasons.join(", "),
                    route.original
                )
            }
        };
        RelayError::Quarantined {
            noun: kind.entry_noun(),
            name: exposed.to_string(),
            upstream,
            original: route.original,
            why,
            change,
        }
    }
}

impl RelayError {
    fn code(&self) -> i64 {
        match self {
            RelayError::Parse(_) => PARSE_ERROR,
            RelayError::InvalidRequest(_) => INVALID_REQUEST,
            RelayError::MethodNotFound(_) => METHOD_NOT_FOUND,
            RelayError::InvalidParams(_)
            | RelayError::UnknownTool(_)
            | RelayError::UnknownPrompt(_) => INVALID_PARAMS,
            RelayError::UnknownResource(_) => RESOURCE_NOT_FOUND,
            RelayError::Unavailable { .. } | RelayError::NeedsLogin { .. } => UPSTREAM_UNAVAILABLE,
            RelayError::Timeout { .. } => UPSTREAM_TIMEOUT,
            RelayError::FailedMidCall { .. } => UPSTREAM_FAILED,
            RelayError::Overloaded { .. } => OVERLOADED,
            RelayError::TooLarge { .. } | RelayError::RequestTooLarge { .. } => MESSAGE_TOO_LARGE,
            RelayError::ShuttingDown | RelayError::Drained { .. } => SHUTTING_DOWN,
            RelayError::UnsupportedVersion { .. } => UNSUPPORTED_PROTOCOL_VERSION,
            RelayError::HeaderMismatch(_) => HEADER_MISMATCH,
            RelayError::MissingCapability { .. } => MISSING_CAPABILITY,
            RelayError::Quarantined { .. } => QUARANTINED,
            RelayError::AccessDenied { .. } => INVALID_REQUEST,
            RelayError::TooManySessions { .. } | RelayError::TooManySubscriptions { .. } => {
                OVERLOADED
            }
        }
    }

    /// A short word for logs and the `outcome` metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            RelayError::Parse(_) => "parse_error",
            RelayError::InvalidRequest(_) => "invalid_request",
            RelayError::MethodNotFound(_) => "method_not_found",
            RelayError::InvalidParams(_) => "invalid_params",
            RelayError::UnknownTool(_) | RelayError::UnknownPrompt(_) => "unknown_name",
            RelayError::UnknownResource(_) => "unknown_resource",
            RelayError::Unavailable { .. } => "upstream_unavailable",
            RelayError::NeedsLogin { .. } => "needs_login",
            RelayError::Timeout { .. } => "upstream_timeout",
            RelayError::FailedMidCall { .. } => "upstream_failed",
            RelayError::Overloaded { .. } => "overloaded",
            RelayError::TooLarge { .. } | RelayError::RequestTooLarge { .. } => "message_too_large",
            RelayError::ShuttingDown => "shutting_down",
            RelayError::Drained { .. } => "upstream_removed",
            RelayError::UnsupportedVersion { .. } => "unsupported_version",
            RelayError::HeaderMismatch(_) => "header_mismatch",
            RelayError::MissingCapability { .. } => "missing_capability",
            RelayError::Quarantined { .. } => "quarantined",
            RelayError::AccessDenied { kind, .. } => kind,
            RelayError::TooManySessions { .. } => "too_many_sessions",
            RelayError::TooManySubscriptions { .. } => "too_many_subscriptions",
        }
    }

    /// `error.data` for plexus's own codes: which upstream, in what state, and
    /// whether trying again can help.
    fn data(&self) -> Option<Value> {
        let (kind, upstream, state, retryable, retry_after_ms) = match self {
            RelayError::Unavailable {
                upstream,
                state,
                retry_after_ms,
            } => (
                "upstream_unavailable",
                Some(upstream),
                Some(state.as_str()),
                // Retrying helps exactly when there is a time to retry after.
                retry_after_ms.is_some(),
                *retry_after_ms,
            ),
            RelayError::NeedsLogin { upstream } => {
                return Some(json!({
                    "kind": "upstream_unavailable",
                    "upstream": upstream,
                    "state": "needs_login",
                    "retryable": false,
                    "retry_after_ms": null,
                    "login": format!("plexus login {upstream}"),
                }))
            }
            RelayError::Timeout { upstream, .. } => {
                ("upstream_timeout", Some(upstream), None, true, None)
            }
            RelayError::FailedMidCall { upstream, .. } => {
                ("upstream_failed", Some(upstream), None, true, None)
            }
            RelayError::Overloaded { upstream, .. } => {
                ("overloaded", Some(upstream), None, true, Some(100))
            }
            RelayError::TooLarge { upstream, .. } => {
                ("message_too_large", Some(upstream), None, false, None)
            }
            RelayError::RequestTooLarge { .. } => ("message_too_large", None, None, false, None),
            RelayError::ShuttingDown => ("shutting_down", None, None, true, None),
            RelayError::Drained { upstream } => (
                "upstream_removed",
                Some(upstream),
                Some("removed"),
                true,
                None,
            ),
            RelayError::UnknownResource(uri) => return Some(json!({ "uri": uri })),
            RelayError::MissingCapability { required, .. } => {
                return Some(json!({ "requiredCapabilities": required }))
            }
            RelayError::AccessDenied { kind, .. } => return Some(json!({ "kind": kind })),
            RelayError::TooManySessions { .. } => {
                ("too_many_sessions", None, None, true, Some(1000))
            }
            RelayError::TooManySubscriptions { .. } => {
                ("too_many_subscriptions", None, None, false, None)
            }
            RelayError::Quarantined {
                upstream,
                original,
                change,
                ..
            } => {
                return Some(json!({
                    "kind": "quarantined",
                    "upstream": upstream,
                    "state": "quarantined",
                    "retryable": false,
                    "retry_after_ms": null,
                    "entry": original,
                    "change": &**change,
                }))
            }
            RelayError::UnsupportedVersion {
                requested,
                supported,
            } => return Some(json!({ "supported": supported, "requested": requested })),
            _ => return None,
        };
        Some(json!({
            "kind": kind,
            "upstream": upstream,
            "state": state,
            "retryable": retryable,
            "retry_after_ms": retry_after_ms,
        }))
    }

    pub fn to_error_object(&self) -> Value {
        self.error_object(self.code())
    }

    /// The error object a 2026-07-28 client gets: that revision retired -32002
    /// (resource not found) in favour of -32602.
    pub fn to_modern_error_object(&self) -> Value {
        match self.code() {
            RESOURCE_NOT_FOUND => self.error_object(INVALID_PARAMS),
            code => self.error_object(code),
        }
    }

    fn error_object(&self, code: i64) -> Value {
        let mut error = Map::with_capacity(3);
        error.insert("code".into(), Value::from(code));
        error.insert("message".into(), Value::from(self.to_string()));
        if let Some(data) = self.data() {
            error.insert("data".into(), data);
        }
        Value::Object(error)
    }
}

/// A success response under the downstream id.
/// A response ready to send: a JSON value, or bytes serialised already (a list
/// page spliced from the catalog's own JSON, never parsed into values).
#[derive(Debug)]
pub enum Answer {
    Value(Value),
    Serialized(Vec<u8>),
}

impl From<Value> for Answer {
    fn from(value: Value) -> Answer {
        Answer::Value(value)
    }
}

impl Answer {
    /// A result response whose `result` is serialised already; the same bytes
    /// [`result_response`] would give for it.
    pub fn serialized_result(id: &Value, result: &[u8]) -> Answer {
        Answer::result_written(id, result.len(), |out| out.extend_from_slice(result))
    }

    /// [`Answer::serialized_result`] with the result written by `write` straight
    /// into the answer, which is sized for `size` bytes of it: a list page is
    /// neither grown nor copied on its way out.
    pub fn result_written(id: &Value, size: usize, write: impl FnOnce(&mut Vec<u8>)) -> Answer {
        let mut out = Vec::with_capacity(size + 64);
        out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        adapters::json_out::write_value(&mut out, id);
        out.extend_from_slice(br#","result":"#);
        write(&mut out);
        out.push(b'}');
        Answer::Serialized(out)
    }

    /// Appends the answer's JSON to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        match self {
            Answer::Value(value) => adapters::json_out::write_value(out, value),
            Answer::Serialized(bytes) => out.extend_from_slice(bytes),
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Answer::Value(value) => adapters::json_out::to_vec(&value),
            Answer::Serialized(bytes) => bytes,
        }
    }

    /// The answer as a value (batches hold values); serialised bytes are parsed.
    pub fn into_value(self) -> Value {
        match self {
            Answer::Value(value) => value,
            Answer::Serialized(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// `error.code`, if the answer is an error response (serialised ones never are).
    pub fn error_code(&self) -> Option<i64> {
        match self {
            Answer::Value(value) => value.get("error")?.get("code")?.as_i64(),
            Answer::Serialized(_) => None,
        }
    }
}

pub fn result_response(id: Value, result: Value) -> Value {
    response(id, "result", result)
}

/// An error response from an error object (an upstream's, relayed as it was).
pub fn error_object_response(id: Value, error: Value) -> Value {
    response(id, "error", error)
}

/// The values are moved in: `json!` would copy them through `to_value`.
fn response(id: Value, member: &str, body: Value) -> Value {
    let mut response = Map::with_capacity(3);
    response.insert("jsonrpc".into(), Value::String("2.0".into()));
    response.insert("id".into(), id);
    response.insert(member.into(), body);
    Value::Object(response)
}

pub fn error_response(id: Value, error: &RelayError) -> Value {
    error_object_response(id, error.to_error_object())
}

pub fn notification(method: &str, params: Option<Value>) -> Value {
    let mut notification = Map::with_capacity(3);
    notification.insert("jsonrpc".into(), Value::String("2.0".into()));
    notification.insert("method".into(), Value::String(method.into()));
    if let Some(params) = params {
        notification.insert("params".into(), params);
    }
    Value::Object(notification)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_told_apart_and_the_broken_ones_say_why() {
        let reason = |message: Value| Envelope::of(message).err().map(|not| (not.id, not.reason));
        assert!(matches!(
            Envelope::of(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
            Ok(Envelope::Request { method, .. }) if method == "ping"
        ));
        assert!(matches!(
            Envelope::of(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Ok(Envelope::Notification { .. })
        ));
        assert!(matches!(
            Envelope::of(
                json!({"jsonrpc": "2.0", "id": "s", "error": {"code": 1, "message": "m"}})
            ),
            Ok(Envelope::Response {
                reply: adapters::Reply::Error(_),
                ..
            })
        ));
        assert_eq!(
            reason(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])),
            Some((Value::Null, "a message must be a JSON object"))
        );
        assert_eq!(
            reason(json!({"jsonrpc": "1.0", "id": 3, "method": "ping"})),
            Some((json!(3), "`jsonrpc` must be \"2.0\""))
        );
        assert_eq!(
            reason(json!({"jsonrpc": "2.0", "id": 4, "method": 5})),
            Some((json!(4), "`method` must be a string"))
        );
        for id in [
            json!(null),
            json!(1.5),
            json!({"a": 1}),
            json!([1]),
            json!(true),
        ] {
            assert_eq!(
                reason(json!({"jsonrpc": "2.0", "id": id, "method": "ping"})),
                Some((Value::Null, "a request id must be a string or an integer"))
            );
        }
        assert_eq!(
            reason(json!({"jsonrpc": "2.0", "id": 6})),
            Some((json!(6), "not a request, notification or response"))
        );
    }

    #[test]
    fn a_serialized_result_is_the_bytes_of_the_same_response_as_a_value() {
        let result = json!({"tools": [{"name": "a__b", "inputSchema": {"type": "object"}}], "nextCursor": "x\"y"});
        for id in [json!(7), json!("req-\u{e9}"), Value::Null] {
            let serialized =
                Answer::serialized_result(&id, &serde_json::to_vec(&result).unwrap_or_default());
            let expected =
                serde_json::to_vec(&result_response(id, result.clone())).unwrap_or_default();
            assert_eq!(serialized.into_bytes(), expected);
        }
    }

    #[test]
    fn plexus_errors_carry_codes_and_data() {
        let error = RelayError::Unavailable {
            upstream: "time".into(),
            state: "starting".into(),
            retry_after_ms: Some(1000),
        }
        .to_error_object();
        assert_eq!(error["code"], -33001);
        assert_eq!(error["data"]["upstream"], "time");
        assert_eq!(error["data"]["state"], "starting");
        assert_eq!(error["data"]["retry_after_ms"], 1000);
        assert_eq!(error["data"]["kind"], "upstream_unavailable");
        assert_eq!(
            RelayError::UnknownTool("x".into()).to_error_object()["code"],
            -32602
        );
        assert_eq!(
            RelayError::MethodNotFound("x".into()).to_error_object()["code"],
            -32601
        );
        assert!(RelayError::MethodNotFound("x".into())
            .to_error_object()
            .get("data")
            .is_none());
    }
}
