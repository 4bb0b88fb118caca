//! A request to an upstream as written on its line or in its body: the params
//! (values, or one member kept as the client wrote it) with the `_meta` fields a
//! 2026-07-28 upstream gets on every request, and the trace context of plexus's
//! span for the request, merged in.

use serde_json::{Map, Value};

use crate::raw_object::WrittenMember;

/// A request's params: values, or JSON passed through as it was written (a
/// relay's call, never parsed into values).
#[derive(Debug)]
pub(crate) enum Params {
    Values(Option<Value>),
    /// An object of values (without the member's key) and one member as written.
    WithMember(Map<String, Value>, WrittenMember),
}

impl Params {
    /// The params' object of values, if they are one.
    pub(crate) fn values(&self) -> Option<&Map<String, Value>> {
        match self {
            Params::Values(values) => values.as_ref().and_then(Value::as_object),
            Params::WithMember(values, _) => Some(values),
        }
    }

    /// Whether `_meta` fields (the connection's, a trace context) can be merged in:
    /// absent params, or an object whose `_meta` (if any) is an object too.
    pub(crate) fn takes_meta(&self) -> bool {
        match self {
            Params::Values(None) => true,
            Params::Values(Some(Value::Object(values))) | Params::WithMember(values, _) => {
                values.get("_meta").is_none_or(Value::is_object)
            }
            Params::Values(Some(_)) => false,
        }
    }
}

/// The `_meta` fields every request to a 2026-07-28 upstream carries, each kept
/// written too (`"key":value`): a request's line gets them as bytes, not built
/// from values again for each request.
#[derive(Debug)]
pub(crate) struct MetaFields {
    fields: Map<String, Value>,
    /// `"key":value` of each field, in the fields' order.
    written: Vec<Box<[u8]>>,
}

impl MetaFields {
    pub(crate) fn new(fields: Map<String, Value>) -> MetaFields {
        let written = fields
            .iter()
            .map(|(key, value)| {
                let mut member = Vec::new();
                crate::json_out::write_str(&mut member, key);
                member.push(b':');
                crate::json_out::write_value(&mut member, value);
                member.into_boxed_slice()
            })
            .collect();
        MetaFields { fields, written }
    }

    pub(crate) fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }
}

/// The W3C trace context (SEP-414) of plexus's own span for a request: the
/// request carries it upstream in `_meta`, over any `traceparent` (and, when
/// it has one, `tracestate`) of its own; an HTTP upstream gets a header too.
#[derive(Debug, Clone)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// `traceparent` as W3C writes it; an empty `tracestate` is none.
    pub fn new(traceparent: String, tracestate: String) -> TraceContext {
        TraceContext {
            traceparent,
            tracestate: (!tracestate.is_empty()).then_some(tracestate),
        }
    }

    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// Whether the request's own `_meta` member `key` gives way to this context.
    fn replaces(&self, key: &str) -> bool {
        key == "traceparent" || (key == "tracestate" && self.tracestate.is_some())
    }
}

/// What a request's `_meta` gets besides its own members: the connection's
/// per-request fields (where the request has none of its own) and the trace
/// context (over the request's own).
#[derive(Clone, Copy, Default)]
pub(crate) struct Merge<'a> {
    pub(crate) fields: Option<&'a MetaFields>,
    pub(crate) trace: Option<&'a TraceContext>,
}

impl Merge<'_> {
    fn is_empty(&self) -> bool {
        self.fields.is_none() && self.trace.is_none()
    }

    /// `{`, the request's own `_meta` members, the fields it does not carry, the
    /// trace context, `}`.
    fn write(&self, out: &mut Vec<u8>, own: &Map<String, Value>) {
        let replaced = |key: &str| self.trace.is_some_and(|trace| trace.replaces(key));
        out.push(b'{');
        let mut first = true;
        let mut separate = |out: &mut Vec<u8>| {
            if !first {
                out.push(b',');
            }
            first = false;
        };
        for (key, value) in own {
            if replaced(key) {
                continue;
            }
            separate(out);
            crate::json_out::write_str(out, key);
            out.push(b':');
            crate::json_out::write_value(out, value);
        }
        if let Some(fields) = self.fields {
            for (key, written) in fields.fields.keys().zip(&fields.written) {
                if own.contains_key(key) || replaced(key) {
                    continue;
                }
                separate(out);
                out.extend_from_slice(written);
            }
        }
        if let Some(trace) = self.trace {
            separate(out);
            out.extend_from_slice(br#""traceparent":"#);
            crate::json_out::write_str(out, &trace.traceparent);
            if let Some(state) = &trace.tracestate {
                out.extend_from_slice(br#","tracestate":"#);
                crate::json_out::write_str(out, state);
            }
        }
        out.push(b'}');
    }
}

/// A `_meta` field's value as a request carries it: the request's own (a caller's
/// log level) wins over the connection's fields, if it has any.
pub(crate) fn meta_field<'a>(
    values: Option<&'a Map<String, Value>>,
    meta: Option<&'a MetaFields>,
    key: &str,
) -> Option<&'a Value> {
    values
        .and_then(|values| values.get("_meta"))
        .and_then(Value::as_object)
        .and_then(|own| own.get(key))
        .or_else(|| meta?.fields.get(key))
}

/// An object of params with `merge` merged into its own `_meta` (added at its
/// end when it has none); without its closing brace when `open`, for one more
/// member to follow.
fn write_params(out: &mut Vec<u8>, values: &Map<String, Value>, merge: Merge, open: bool) {
    if merge.is_empty() {
        crate::json_out::write_map(out, values);
        if open {
            out.pop();
            if !values.is_empty() {
                out.push(b',');
            }
        }
        return;
    }
    out.push(b'{');
    let mut has_meta = false;
    for (index, (key, value)) in values.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        crate::json_out::write_str(out, key);
        out.push(b':');
        has_meta |= key == "_meta";
        match value {
            // A `_meta` that is not an object has nowhere to put them.
            Value::Object(own) if key == "_meta" => merge.write(out, own),
            _ => crate::json_out::write_value(out, value),
        }
    }
    if !has_meta {
        if !values.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(br#""_meta":"#);
        merge.write(out, &Map::new());
    }
    out.push(if open { b',' } else { b'}' });
}

/// `{"jsonrpc":"2.0","id":…,"method":…,"params":…}` and a newline, written in
/// one pass (no map built for the envelope). `merge`: the `_meta` fields of a
/// 2026-07-28 upstream and the trace context, merged into params that are an
/// object (or absent); params of another kind go as they are, for the upstream
/// to judge.
pub(crate) fn encode_request(id: u64, method: &str, params: Params, merge: Merge) -> Vec<u8> {
    let mut line = Vec::with_capacity(match &params {
        Params::WithMember(_, member) => member.text().len() + 192,
        Params::Values(_) => 128,
    });
    line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    // Writing numbers, strings and values to memory cannot fail.
    let _ = serde_json::to_writer(&mut line, &id);
    line.extend_from_slice(br#","method":"#);
    let _ = serde_json::to_writer(&mut line, method);
    match &params {
        Params::Values(None) => {
            if !merge.is_empty() {
                line.extend_from_slice(br#","params":"#);
                write_params(&mut line, &Map::new(), merge, false);
            }
        }
        Params::Values(Some(Value::Object(values))) => {
            line.extend_from_slice(br#","params":"#);
            write_params(&mut line, values, merge, false);
        }
        Params::Values(Some(params)) => {
            line.extend_from_slice(br#","params":"#);
            crate::json_out::write_value(&mut line, params);
        }
        Params::WithMember(values, member) => {
            line.extend_from_slice(br#","params":"#);
            // The object's closing brace gives way to one more member.
            write_params(&mut line, values, merge, true);
            crate::json_out::write_str(&mut line, member.key());
            line.push(b':');
            line.extend_from_slice(member.text());
            line.push(b'}');
        }
    }
    line.extend_from_slice(b"}\n");
    line
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    #[test]
    fn requests_are_encoded_as_one_line() {
        let line = "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}\n";
        let bytes = encode_request(
            7,
            "tools/call",
            Params::Values(Some(json!({"name":"echo"}))),
            Merge::default(),
        );
        assert_eq!(String::from_utf8(bytes).unwrap(), line);
        // One member as written, spacing kept, after the values.
        let arguments =
            WrittenMember::new("arguments", Bytes::from_static(b"{ \"text\": \"x\" }")).unwrap();
        let values = json!({"name": "echo", "_meta": {"progressToken": 1}});
        let Value::Object(values) = values else {
            unreachable!()
        };
        let bytes = encode_request(
            7,
            "tools/call",
            Params::WithMember(values, arguments.clone()),
            Merge::default(),
        );
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"_meta\":{\"progressToken\":1},\"arguments\":{ \"text\": \"x\" }}}\n"
        );
        let bytes = encode_request(
            7,
            "tools/call",
            Params::WithMember(Map::new(), arguments),
            Merge::default(),
        );
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"arguments\":{ \"text\": \"x\" }}}\n"
        );
        let bytes = encode_request(8, "ping\"", Params::Values(None), Merge::default());
        assert_eq!(
            serde_json::from_slice::<Value>(&bytes).unwrap(),
            json!({"jsonrpc": "2.0", "id": 8, "method": "ping\""})
        );
    }

    #[test]
    fn per_request_meta_fields_are_merged_into_the_requests_own() {
        let fields = json!({"v": "2026-07-28", "info": {"name": "plexus"}, "level": "info"});
        let Value::Object(fields) = fields else {
            unreachable!()
        };
        let meta = MetaFields::new(fields);
        let line = |params: Params| {
            let merge = Merge {
                fields: Some(&meta),
                trace: None,
            };
            let bytes = encode_request(1, "m", params, merge);
            assert_eq!(bytes.last(), Some(&b'\n'));
            serde_json::from_slice::<Value>(&bytes).unwrap()
        };
        let object = |value: Value| match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let all = json!({"v": "2026-07-28", "info": {"name": "plexus"}, "level": "info"});
        // No params, params without `_meta`, an empty `_meta`.
        assert_eq!(line(Params::Values(None))["params"], json!({"_meta": all}));
        assert_eq!(
            line(Params::Values(Some(json!({"name": "x"}))))["params"],
            json!({"name": "x", "_meta": all})
        );
        assert_eq!(
            line(Params::Values(Some(json!({"_meta": {}}))))["params"],
            json!({"_meta": all})
        );
        // The request's own fields win and keep their place; the rest are added.
        let own = json!({"_meta": {"level": "debug", "progressToken": 3}, "name": "x"});
        assert_eq!(
            line(Params::Values(Some(own.clone())))["params"],
            json!({"name": "x", "_meta": {"level": "debug", "progressToken": 3,
                   "v": "2026-07-28", "info": {"name": "plexus"}}})
        );
        // With a member as written, and with no values at all.
        let arguments = WrittenMember::new("arguments", Bytes::from_static(b"{\"a\":1}")).unwrap();
        assert_eq!(
            line(Params::WithMember(object(own), arguments.clone()))["params"]["_meta"]["v"],
            json!("2026-07-28")
        );
        assert_eq!(
            line(Params::WithMember(Map::new(), arguments))["params"],
            json!({"_meta": all, "arguments": {"a": 1}})
        );
        // Params that are not an object, or a `_meta` that is not one, go as they are.
        assert_eq!(line(Params::Values(Some(json!([1]))))["params"], json!([1]));
        assert_eq!(
            line(Params::Values(Some(json!({"_meta": 5}))))["params"],
            json!({"_meta": 5})
        );
        // What goes as it is takes none of them.
        assert!(!Params::Values(Some(json!([1]))).takes_meta());
        assert!(!Params::Values(Some(json!({"_meta": 5}))).takes_meta());
        assert!(Params::Values(Some(json!({"_meta": {}}))).takes_meta());
        assert!(Params::Values(None).takes_meta());
        let values = json!({"_meta": {"v": "own"}});
        assert_eq!(
            meta_field(values.as_object(), Some(&meta), "v"),
            Some(&json!("own"))
        );
        assert_eq!(
            meta_field(None, Some(&meta), "v"),
            Some(&json!("2026-07-28"))
        );
    }

    #[test]
    fn the_trace_context_replaces_the_requests_own_and_leaves_the_rest() {
        let fields = json!({"v": "2026-07-28", "traceparent": "connection's"});
        let Value::Object(fields) = fields else {
            unreachable!()
        };
        let fields = MetaFields::new(fields);
        let plexus = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let line = |params: Params, fields: Option<&MetaFields>, state: &str| {
            let trace = TraceContext::new(plexus.to_string(), state.to_string());
            let merge = Merge {
                fields,
                trace: Some(&trace),
            };
            let bytes = encode_request(1, "m", params, merge);
            serde_json::from_slice::<Value>(&bytes).unwrap()["params"].clone()
        };
        // None of its own: `_meta` is added, params too.
        assert_eq!(
            line(Params::Values(None), None, ""),
            json!({"_meta": {"traceparent": plexus}})
        );
        // The client's context gives way; its other keys stay, in their place.
        let own = json!({"name": "x", "_meta": {"progressToken": 3,
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "client=1", "baggage": "k=v"}});
        assert_eq!(
            line(Params::Values(Some(own.clone())), Some(&fields), ""),
            json!({"name": "x", "_meta": {"progressToken": 3, "tracestate": "client=1",
                "baggage": "k=v", "v": "2026-07-28", "traceparent": plexus}})
        );
        // A trace state of plexus's span replaces the client's.
        assert_eq!(
            line(Params::Values(Some(own.clone())), None, "plexus=2")["_meta"]["tracestate"],
            json!("plexus=2")
        );
        // With a member as written.
        let arguments = WrittenMember::new("arguments", Bytes::from_static(b"{\"a\":1}")).unwrap();
        let Value::Object(values) = own else {
            unreachable!()
        };
        let written = line(Params::WithMember(values, arguments), None, "");
        assert_eq!(written["_meta"]["traceparent"], json!(plexus));
        assert_eq!(written["arguments"], json!({"a": 1}));
        // Params that are not an object, or a `_meta` that is not one, go as they are.
        assert_eq!(line(Params::Values(Some(json!([1]))), None, ""), json!([1]));
        assert_eq!(
            line(Params::Values(Some(json!({"_meta": 5}))), None, ""),
            json!({"_meta": 5})
        );
    }
}
