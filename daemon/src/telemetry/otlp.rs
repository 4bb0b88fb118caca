//! The span exporter: OTLP/HTTP protobuf written straight from the SDK's
//! `SpanData`, posted through [`Poster`].
//!
//! The OTLP crate's exporter builds the collector's message types first (every
//! key and value copied into them, then dropped): half of what tracing cost a
//! request at 100 % sampling. Here each span is written once into the body.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::HttpClient;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::export::Poster;

pub(super) struct Exporter {
    endpoint: http::Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    poster: Arc<Poster>,
    resource: Vec<KeyValue>,
}

impl fmt::Debug for Exporter {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Exporter({})", self.endpoint)
    }
}

impl Exporter {
    /// Posts to `endpoint` (the full `…/v1/traces` URL) with `headers` (the
    /// `OTEL_EXPORTER_OTLP_*HEADERS` list, `key=value,…`, values percent-encoded).
    pub(super) fn new(
        endpoint: &str,
        headers: Option<&str>,
        poster: Arc<Poster>,
    ) -> Result<Exporter, String> {
        let endpoint = endpoint
            .parse::<http::Uri>()
            .map_err(|error| format!("`{endpoint}` is not a URL: {error}"))?;
        let headers = headers
            .unwrap_or_default()
            .split(',')
            .filter(|pair| !pair.trim().is_empty())
            .map(|pair| {
                let (name, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("the header `{pair}` has no `=`"))?;
                let value = percent_encoding::percent_decode_str(value.trim()).decode_utf8_lossy();
                let name = HeaderName::try_from(name.trim())
                    .map_err(|error| format!("the header name `{name}`: {error}"))?;
                let value = HeaderValue::try_from(value.as_ref())
                    .map_err(|error| format!("the header `{name}`'s value: {error}"))?;
                Ok((name, value))
            })
            .collect::<Result<_, String>>()?;
        Ok(Exporter {
            endpoint,
            headers,
            poster,
            resource: Vec::new(),
        })
    }
}

impl SpanExporter for Exporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = encode(&self.resource, &batch);
        let mut request = http::Request::post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(Bytes::from(body))
            .map_err(|error| OTelSdkError::InternalFailure(error.to_string()))?;
        for (name, value) in &self.headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let response = self
            .poster
            .send_bytes(request)
            .await
            .map_err(|error| OTelSdkError::InternalFailure(error.to_string()))?;
        if !response.status().is_success() {
            return Err(OTelSdkError::InternalFailure(format!(
                "the collector answered {} to {} spans",
                response.status(),
                batch.len()
            )));
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource
            .iter()
            .map(|(key, value)| KeyValue::new(key.clone(), value.clone()))
            .collect();
    }
}

/// `ExportTraceServiceRequest { resource_spans: [{ resource, scope_spans: [one
/// per instrumentation scope] }] }`, field numbers from opentelemetry-proto's
/// `trace.proto`, `common.proto` and `resource.proto`.
pub(super) fn encode(resource: &[KeyValue], spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 320);
    nested(&mut out, 1, |out| {
        nested(out, 1, |out| {
            for attribute in resource {
                nested(out, 1, |out| key_value(out, attribute));
            }
        });
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in spans {
            if !scopes.contains(&&span.instrumentation_scope) {
                scopes.push(&span.instrumentation_scope);
            }
        }
        for scope in scopes {
            nested(out, 2, |out| {
                nested(out, 1, |out| {
                    string(out, 1, scope.name());
                    if let Some(version) = scope.version() {
                        string(out, 2, version);
                    }
                    for attribute in scope.attributes() {
                        nested(out, 3, |out| key_value(out, attribute));
                    }
                });
                for span in spans
                    .iter()
                    .filter(|span| &span.instrumentation_scope == scope)
                {
                    nested(out, 2, |out| write_span(out, span));
                }
                if let Some(schema) = scope.schema_url() {
                    string(out, 3, schema);
                }
            });
        }
    });
    out
}

fn write_span(out: &mut Vec<u8>, span: &SpanData) {
    let context = &span.span_context;
    bytes(out, 1, &context.trace_id().to_bytes());
    bytes(out, 2, &context.span_id().to_bytes());
    let state = context.trace_state().header();
    if !state.is_empty() {
        string(out, 3, &state);
    }
    if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes(out, 4, &span.parent_span_id.to_bytes());
    }
    string(out, 5, &span.name);
    let kind = match span.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    varint_field(out, 6, kind);
    fixed64(out, 7, nanos(span.start_time));
    fixed64(out, 8, nanos(span.end_time));
    for attribute in &span.attributes {
        nested(out, 9, |out| key_value(out, attribute));
    }
    if span.dropped_attributes_count > 0 {
        varint_field(out, 10, u64::from(span.dropped_attributes_count));
    }
    for event in &span.events.events {
        nested(out, 11, |out| {
            fixed64(out, 1, nanos(event.timestamp));
            string(out, 2, &event.name);
            for attribute in &event.attributes {
                nested(out, 3, |out| key_value(out, attribute));
            }
        });
    }
    let dropped_events = span.events.dropped_count;
    if dropped_events > 0 {
        varint_field(out, 12, u64::from(dropped_events));
    }
    for link in &span.links.links {
        nested(out, 13, |out| {
            bytes(out, 1, &link.span_context.trace_id().to_bytes());
            bytes(out, 2, &link.span_context.span_id().to_bytes());
            for attribute in &link.attributes {
                nested(out, 4, |out| key_value(out, attribute));
            }
        });
    }
    match &span.status {
        Status::Unset => {}
        Status::Ok => nested(out, 15, |out| varint_field(out, 3, 1)),
        Status::Error { description } => nested(out, 15, |out| {
            string(out, 2, description);
            varint_field(out, 3, 2);
        }),
    }
    // The W3C flags, and that whether the parent is remote is known (and if it is).
    let mut flags = u32::from(context.trace_flags().to_u8()) | 0x100;
    if span.parent_span_is_remote {
        flags |= 0x200;
    }
    key(out, 16, 5);
    out.extend_from_slice(&flags.to_le_bytes());
}

fn key_value(out: &mut Vec<u8>, attribute: &KeyValue) {
    string(out, 1, attribute.key.as_str());
    nested(out, 2, |out| any_value(out, &attribute.value));
}

/// `AnyValue`: string 1, bool 2, int 3, double 4, array 5.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(text) => string(out, 1, text.as_str()),
        Value::Bool(flag) => varint_field(out, 2, u64::from(*flag)),
        // An int64 is its two's complement as a varint.
        Value::I64(number) => varint_field(out, 3, *number as u64),
        Value::F64(number) => fixed64(out, 4, number.to_bits()),
        Value::Array(array) => nested(out, 5, |out| match array {
            Array::Bool(values) => values
                .iter()
                .for_each(|v| nested(out, 1, |out| any_value(out, &Value::Bool(*v)))),
            Array::I64(values) => values
                .iter()
                .for_each(|v| nested(out, 1, |out| any_value(out, &Value::I64(*v)))),
            Array::F64(values) => values
                .iter()
                .for_each(|v| nested(out, 1, |out| any_value(out, &Value::F64(*v)))),
            Array::String(values) => values
                .iter()
                .for_each(|v| nested(out, 1, |out| string(out, 1, v.as_str()))),
            _ => {}
        }),
        _ => string(out, 1, &value.to_string()),
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(out, u64::from(field << 3 | wire_type));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    key(out, field, 0);
    varint(out, value);
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    key(out, field, 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn string(out: &mut Vec<u8>, field: u32, value: &str) {
    bytes(out, field, value.as_bytes());
}

/// A length-delimited field whose content `write` appends; its length, known
/// once written, is put in front of it.
fn nested(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    key(out, field, 2);
    let start = out.len();
    write(out);
    let mut prefix = [0u8; 10];
    let mut used = 0;
    let mut value = (out.len() - start) as u64;
    while value >= 0x80 {
        prefix[used] = (value as u8) | 0x80;
        value >>= 7;
        used += 1;
    }
    prefix[used] = value as u8;
    used += 1;
    // One move of the content (a `splice` cost four times as much, per field).
    let end = out.len();
    out.resize(end + used, 0);
    out.copy_within(start..end, start + used);
    out[start..start + used].copy_from_slice(&prefix[..used]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_field_is_prefixed_by_its_length_however_long() {
        let mut out = Vec::new();
        nested(&mut out, 1, |out| string(out, 2, &"x".repeat(200)));
        // key 1/LEN, length 203 as a varint (0xcb 0x01), then key 2/LEN, 200 (0xc8 0x01).
        assert_eq!(&out[..5], &[0x0a, 0xcb, 0x01, 0x12, 0xc8]);
        assert_eq!(out.len(), 3 + 203);
    }

    #[test]
    fn headers_are_read_percent_decoded() {
        let poster = Arc::new(
            Poster::new(
                tokio::runtime::Runtime::new().unwrap().handle().clone(),
                tokio_util::task::TaskTracker::new(),
            )
            .unwrap(),
        );
        let exporter = Exporter::new(
            "http://127.0.0.1:4318/v1/traces",
            Some("api-key=a%20b , x-team=plexus,"),
            poster.clone(),
        )
        .unwrap();
        assert_eq!(
            exporter.headers,
            [
                (
                    HeaderName::from_static("api-key"),
                    HeaderValue::from_static("a b")
                ),
                (
                    HeaderName::from_static("x-team"),
                    HeaderValue::from_static("plexus")
                ),
            ]
        );
        assert!(Exporter::new("http://127.0.0.1:4318", Some("no-equals"), poster).is_err());
    }
}
