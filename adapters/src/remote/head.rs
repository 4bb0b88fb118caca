//! What a POST carrying a request says about it in headers: for 2026-07-28, its
//! version, method and name mirrored from its body.

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::request_line::{meta_field, Merge};

const PROTOCOL_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// What a POST carrying a request says about it in headers.
#[derive(Default)]
pub(super) struct Head {
    /// For a 2026-07-28 request: the version its `_meta` names, and the
    /// `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` headers that mirror its body.
    pub(super) modern_version: Option<HeaderValue>,
    pub(super) method: Option<HeaderValue>,
    pub(super) name: Option<HeaderValue>,
    pub(super) params: Vec<(HeaderName, HeaderValue)>,
    pub(super) initialize: bool,
    /// The W3C `traceparent` of the request's `_meta`, mirrored into a header in
    /// either era (SEP-414), for HTTP middle boxes that read only headers.
    pub(super) traceparent: Option<HeaderValue>,
}

impl Head {
    /// `merge`: the connection's per-request fields, which the request carries
    /// unless it has its own, and the trace context, over its own.
    pub(super) fn of(method: &str, params: Option<&Map<String, Value>>, merge: Merge) -> Head {
        let initialize = method == "initialize";
        let traceparent = match merge.trace {
            Some(trace) => Some(trace.traceparent()),
            None => params.and_then(|params| params.get("_meta")?.get("traceparent")?.as_str()),
        }
        .and_then(|value| HeaderValue::from_str(value).ok());
        let modern_version = meta_field(params, merge.fields, PROTOCOL_VERSION_META)
            .and_then(Value::as_str)
            .and_then(|version| HeaderValue::from_str(version).ok());
        if modern_version.is_none() {
            return Head {
                initialize,
                traceparent,
                ..Head::default()
            };
        }
        let name_key = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
            _ => None,
        };
        let name = name_key
            .and_then(|key| params?.get(key)?.as_str())
            .and_then(header_value_for);
        Head {
            modern_version,
            method: HeaderValue::from_str(method).ok(),
            name,
            params: Vec::new(),
            initialize,
            traceparent,
        }
    }

    /// Adds the `Mcp-Param-*` headers (a 2026-07-28 request only; names and values
    /// that are not valid HTTP are dropped, and the upstream says what is missing).
    pub(super) fn with_params(mut self, headers: Vec<(String, String)>) -> Head {
        if self.modern_version.is_some() {
            self.params = headers
                .into_iter()
                .filter_map(|(name, value)| {
                    Some((
                        HeaderName::from_bytes(name.as_bytes()).ok()?,
                        HeaderValue::from_str(&value).ok()?,
                    ))
                })
                .collect();
        }
        self
    }
}

/// A header value for `text`: as it is when plain ASCII, else base64 in the
/// `=?base64?…?=` form 2026-07-28 defines.
fn header_value_for(text: &str) -> Option<HeaderValue> {
    let printable = text.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let padded = text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']);
    let looks_encoded = text.starts_with("=?base64?") && text.ends_with("?=");
    let plain = printable && !padded && !looks_encoded;
    if plain {
        return HeaderValue::from_str(text).ok();
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(text);
    HeaderValue::from_str(&format!("=?base64?{encoded}?=")).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::request_line::{MetaFields, TraceContext};

    fn plain_params() -> Map<String, Value> {
        Map::from_iter([("name".to_string(), Value::from("echo"))])
    }

    #[test]
    fn modern_requests_mirror_their_body_in_headers() {
        let params = serde_json::json!({
            "name": "héllo",
            "_meta": {PROTOCOL_VERSION_META: "2026-07-28"},
        });
        let Value::Object(params) = params else {
            unreachable!()
        };
        let head = Head::of("tools/call", Some(&params), Merge::default());
        assert_eq!(head.modern_version.unwrap(), "2026-07-28");
        assert_eq!(head.method.unwrap(), "tools/call");
        assert_eq!(head.name.unwrap(), "=?base64?aMOpbGxv?=");
        let plain = Head::of("tools/call", Some(&plain_params()), Merge::default());
        assert!(plain.modern_version.is_none() && plain.name.is_none());
        assert!(Head::of("initialize", None, Merge::default()).initialize);
        // The connection's per-request fields name the version when the request does not.
        let fields =
            Map::from_iter([(PROTOCOL_VERSION_META.to_string(), Value::from("2026-07-28"))]);
        let fields = MetaFields::new(fields);
        let merge = Merge {
            fields: Some(&fields),
            trace: None,
        };
        let head = Head::of("tools/call", Some(&plain_params()), merge);
        assert_eq!(head.modern_version.unwrap(), "2026-07-28");
        assert_eq!(head.name.unwrap(), "echo");
        assert_eq!(
            header_value_for(" padded").unwrap(),
            "=?base64?IHBhZGRlZA==?="
        );
        assert_eq!(header_value_for("us-west1").unwrap(), "us-west1");
    }

    #[test]
    fn the_traceparent_header_is_the_trace_context_else_the_requests_own() {
        let own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let params = serde_json::json!({"_meta": {"traceparent": own}});
        let params = params.as_object();
        let head = Head::of("tools/call", params, Merge::default());
        assert_eq!(head.traceparent.unwrap(), own);
        let plexus = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let trace = TraceContext::new(plexus.to_string(), String::new());
        let merge = Merge {
            fields: None,
            trace: Some(&trace),
        };
        assert_eq!(Head::of("ping", params, merge).traceparent.unwrap(), plexus);
        assert_eq!(Head::of("ping", None, merge).traceparent.unwrap(), plexus);
        assert!(Head::of("ping", None, Merge::default())
            .traceparent
            .is_none());
    }

    #[test]
    fn hostile_names_are_mirrored_as_themselves_or_base64_of_themselves() {
        let seed = serde_json::json!({"name": "héllo", "uri": "file:///a b", "taskId": "t",
            "_meta": {PROTOCOL_VERSION_META: "2026-07-28", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}});
        let cases = mutations::value_mutants(&seed, 3_000, 0x4EAE);
        mutations::check("Head::of", &cases, 64, |bytes| {
            let Ok(Value::Object(params)) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            for method in ["tools/call", "resources/read", "tasks/get"] {
                let head = Head::of(method, Some(&params), Merge::default());
                let key = match method {
                    "tools/call" => "name",
                    "resources/read" => "uri",
                    _ => "taskId",
                };
                let Some(name) = head.name else { continue };
                let sent = name.to_str().unwrap();
                let text = params[key].as_str().unwrap();
                let decoded = match sent
                    .strip_prefix("=?base64?")
                    .and_then(|s| s.strip_suffix("?="))
                {
                    Some(encoded) if sent != text => String::from_utf8(
                        base64::engine::general_purpose::STANDARD
                            .decode(encoded)
                            .unwrap(),
                    )
                    .unwrap(),
                    _ => sent.to_string(),
                };
                assert_eq!(decoded, text);
            }
        });
    }
}
