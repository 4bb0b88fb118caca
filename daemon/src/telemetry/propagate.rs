//! W3C trace context (SEP-414): read from a request's `params._meta` or its HTTP
//! `traceparent` header; for a request sent upstream, handed to the connection
//! to write into its `_meta` (and an HTTP upstream's header); for one sent to
//! the client, written into its `params._meta`. Only `traceparent` and
//! `tracestate` are ever written; every other `_meta` key stays as it came.

use std::future::Future;
use std::pin::Pin;

use adapters::TraceContext;
use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};

/// The context a client's HTTP request names in its `traceparent` header, when
/// exporting (None otherwise: the header is not even looked at).
pub fn http_parent(headers: &HeaderMap) -> Option<Context> {
    super::active()?.tracer.as_ref()?;
    let header = headers.get("traceparent")?;
    let _ = header.to_str().ok()?;
    let context = TraceContextPropagator::new().extract(&Headers(headers));
    context.has_active_span().then_some(context)
}

/// Polls `work` with `context` current, through a pointer: a future wrapped by value
/// is copied whole into its wrapper, and a request's is tens of kilobytes.
pub async fn within<F: Future>(context: Context, mut work: Pin<&mut F>) -> F::Output {
    std::future::poll_fn(|cx| {
        let _current = context.clone().attach();
        work.as_mut().poll(cx)
    })
    .await
}

/// The context a request's `_meta` names, if it names a valid one.
pub(super) fn meta_parent(params: Option<&Value>) -> Option<Context> {
    let meta = params?.get("_meta")?.as_object()?;
    meta.get("traceparent")?.as_str()?;
    let context = TraceContextPropagator::new().extract(&Meta(meta));
    context.has_active_span().then_some(context)
}

/// `context`'s span as a request to an upstream carries it.
pub(super) fn carried(context: &Context) -> Option<TraceContext> {
    let span = context.span();
    let span = span.span_context();
    span.is_valid()
        .then(|| TraceContext::new(traceparent(span), span.trace_state().header()))
}

/// Writes `context`'s span into `params._meta` (made an object if there were no params).
pub(super) fn inject(context: &Context, params: &mut Option<Value>) {
    let params = params.get_or_insert_with(|| Value::Object(Map::new()));
    let Some(params) = params.as_object_mut() else {
        return;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let Some(trace) = carried(context) else {
        return;
    };
    meta.insert("traceparent".into(), Value::from(trace.traceparent()));
    // An empty `tracestate` is none: a client's own stays as it sent it.
    if let Some(state) = trace.tracestate() {
        meta.insert("tracestate".into(), Value::from(state));
    }
}

/// `00-<trace id>-<span id>-<flags>` in lower-case hex, written into place:
/// through the formatter it cost as much as the rest of the CLIENT span's start.
fn traceparent(span: &opentelemetry::trace::SpanContext) -> String {
    let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
    let written = hex::encode_to_slice(span.trace_id().to_bytes(), &mut text[3..35])
        .and_then(|()| hex::encode_to_slice(span.span_id().to_bytes(), &mut text[36..52]))
        .and_then(|()| hex::encode_to_slice([span.trace_flags().to_u8()], &mut text[53..55]));
    match (written, std::str::from_utf8(&text)) {
        (Ok(()), Ok(text)) => text.to_string(),
        _ => String::new(),
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

struct Meta<'a>(&'a Map<String, Value>);

impl Extractor for Meta<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.as_str()
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use serde_json::json;

    #[test]
    fn a_meta_traceparent_is_read_and_written_leaving_other_keys_alone() {
        let params = json!({"_meta": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "progressToken": 7,
            "baggage": "k=v"
        }});
        let parent = meta_parent(Some(&params)).unwrap();
        let span = parent.span();
        assert_eq!(
            span.span_context().trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        let child = Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("1111111111111111").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ));
        assert_eq!(
            carried(&child).unwrap().traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
        );
        assert!(carried(&Context::new()).is_none());
        let mut params = Some(params);
        inject(&child, &mut params);
        assert_eq!(
            params.unwrap()["_meta"],
            json!({
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01",
                "progressToken": 7,
                "baggage": "k=v"
            })
        );
        assert!(meta_parent(Some(&json!({"_meta": {"traceparent": "nonsense"}}))).is_none());
    }

    #[test]
    fn a_hostile_traceparent_is_read_or_ignored_and_never_panics() {
        let seeds: [&[u8]; 2] = [
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"ff-00000000000000000000000000000000-0000000000000000-00",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0x7ACE);
        mutations::check("a traceparent", &cases, 64, |bytes| {
            let traceparent = String::from_utf8_lossy(bytes);
            let params = json!({"_meta": {"traceparent": traceparent, "tracestate": traceparent}});
            if let Some(parent) = meta_parent(Some(&params)) {
                // A context read is a valid one, and is written back as one.
                let span = parent.span();
                assert!(span.span_context().is_valid());
                let mut written = Some(json!({}));
                inject(&parent, &mut written);
                assert!(meta_parent(written.as_ref()).is_some());
            }
        });
    }
}
