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
        self.resource = attributes_of(resource);
    }
}

fn attributes_of(resource: &Resource) -> Vec<KeyValue> {
    resource
        .iter()
        .map(|(key, value)| KeyValue::new(key.clone(), value.clone()))
        .collect()
}

/// `ExportTraceServiceRequest { resource_spans: [{ resource, scope_spans: [one
/// per instrumentation scope] }] }`, field numbers from opentelemetry-proto's
/// `trace.proto`, `common.proto` and `resource.proto`.
pub(super) fn encode(resource: &[KeyValue], spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 320);
    nested(&mut out, 1, |out| {
        nested(out, 1, |out| {
            for attribute in resource {
                write_attribute(out, 1, attribute);
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
                        write_attribute(out, 3, attribute);
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
        write_attribute(out, 9, attribute);
    }
    if span.dropped_attributes_count > 0 {
        varint_field(out, 10, u64::from(span.dropped_attributes_count));
    }
    for event in &span.events.events {
        nested(out, 11, |out| {
            fixed64(out, 1, nanos(event.timestamp));
            string(out, 2, &event.name);
            for attribute in &event.attributes {
                write_attribute(out, 3, attribute);
            }
            if event.dropped_attributes_count > 0 {
                varint_field(out, 4, u64::from(event.dropped_attributes_count));
            }
        });
    }
    let dropped_events = span.events.dropped_count;
    if dropped_events > 0 {
        varint_field(out, 12, u64::from(dropped_events));
    }
    for link in &span.links.links {
        nested(out, 13, |out| {
            let linked = &link.span_context;
            bytes(out, 1, &linked.trace_id().to_bytes());
            bytes(out, 2, &linked.span_id().to_bytes());
            let state = linked.trace_state().header();
            if !state.is_empty() {
                string(out, 3, &state);
            }
            for attribute in &link.attributes {
                write_attribute(out, 4, attribute);
            }
            if link.dropped_attributes_count > 0 {
                varint_field(out, 5, u64::from(link.dropped_attributes_count));
            }
            flags(out, 6, linked.trace_flags(), linked.is_remote());
        });
    }
    if span.links.dropped_count > 0 {
        varint_field(out, 14, u64::from(span.links.dropped_count));
    }
    // Present even when unset, as the OTLP crate writes it.
    nested(out, 15, |out| match &span.status {
        Status::Unset => {}
        Status::Ok => varint_field(out, 3, 1),
        Status::Error { description } => {
            string(out, 2, description);
            varint_field(out, 3, 2);
        }
    });
    flags(out, 16, context.trace_flags(), span.parent_span_is_remote);
}

/// The W3C flags, and that whether the parent is remote is known (and if it is).
fn flags(out: &mut Vec<u8>, field: u32, trace: opentelemetry::trace::TraceFlags, remote: bool) {
    let mut flags = u32::from(trace.to_u8()) | 0x100;
    if remote {
        flags |= 0x200;
    }
    key(out, field, 5);
    out.extend_from_slice(&flags.to_le_bytes());
}

/// A `KeyValue` as field `field`. A scalar value's length is known before it is
/// written, so the attribute goes in place; an array goes through [`nested`].
fn write_attribute(out: &mut Vec<u8>, field: u32, attribute: &KeyValue) {
    // The AnyValue's length: one byte of tag (its fields are all below 16), then the value.
    let value = match &attribute.value {
        Value::String(text) => delimited_len(text.as_str().len()),
        Value::Bool(_) => 2,
        Value::I64(number) => 1 + varint_len(*number as u64),
        Value::F64(_) => 9,
        _ => return nested(out, field, |out| key_value(out, attribute)),
    };
    let name = attribute.key.as_str();
    key(out, field, 2);
    varint(
        out,
        (delimited_len(name.len()) + delimited_len(value)) as u64,
    );
    string(out, 1, name);
    key(out, 2, 2);
    varint(out, value as u64);
    any_value(out, &attribute.value);
}

/// A length-delimited field of `len` bytes whose field number is below 16.
fn delimited_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
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

    /// Spans with everything OTLP carries: both kinds of parent, a trace state,
    /// events and links with dropped counts, every value type, each status, and
    /// two instrumentation scopes.
    fn every_kind_of_span() -> Vec<SpanData> {
        use opentelemetry::trace::{
            Event, Link, SpanContext, SpanId, TraceFlags, TraceId, TraceState,
        };
        use opentelemetry::StringValue;
        use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
        use std::time::Duration;

        let context = |span: u64, remote: bool, state: &[(&str, &str)]| {
            SpanContext::new(
                TraceId::from_bytes([7; 16]),
                SpanId::from_bytes(span.to_be_bytes()),
                TraceFlags::SAMPLED,
                remote,
                TraceState::from_key_value(state.iter().copied()).unwrap(),
            )
        };
        let at = |millis: u64| UNIX_EPOCH + Duration::from_millis(1_780_000_000_000 + millis);
        let values = vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new(
                "gen_ai.tool.name",
                StringValue::from(Arc::<str>::from("échø")),
            ),
            KeyValue::new("empty", ""),
            KeyValue::new("flag", false),
            KeyValue::new("count", -42_i64),
            KeyValue::new("ratio", 0.25),
            KeyValue::new(
                "names",
                Value::Array(Array::String(vec!["a".into(), "".into()])),
            ),
            KeyValue::new("flags", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new(
                "ints",
                Value::Array(Array::I64(vec![i64::MIN, 0, i64::MAX])),
            ),
            KeyValue::new("floats", Value::Array(Array::F64(vec![-1.5, f64::MAX]))),
            // Lengths of two and three bytes as varints.
            KeyValue::new("x".repeat(200), "y".repeat(20_000)),
        ];
        let scope = InstrumentationScope::builder("plexus")
            .with_version("1.2.3")
            .with_schema_url("https://opentelemetry.io/schemas/1.37.0")
            .with_attributes([KeyValue::new("scope.key", "value")])
            .build();
        let other = InstrumentationScope::builder("other").build();
        let mut events = SpanEvents::default();
        events
            .events
            .push(Event::new("first", at(3), values[..3].to_vec(), 2));
        events
            .events
            .push(Event::new("second", at(4), Vec::new(), 0));
        events.dropped_count = 5;
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            context(9, true, &[("vendor", "x")]),
            values[3..5].to_vec(),
            1,
        ));
        links
            .links
            .push(Link::new(context(10, false, &[]), Vec::new(), 0));
        links.dropped_count = 3;
        let span =
            |id: u64, parent: u64, kind: SpanKind, status: Status, scope: &InstrumentationScope| {
                SpanData {
                    span_context: context(
                        id,
                        false,
                        if id == 1 {
                            &[("rojo", "00f067aa0ba902b7")]
                        } else {
                            &[]
                        },
                    ),
                    parent_span_id: SpanId::from_bytes(parent.to_be_bytes()),
                    parent_span_is_remote: parent == 100,
                    span_kind: kind,
                    name: format!("span {id}").into(),
                    start_time: at(id),
                    end_time: at(id + 10),
                    attributes: if id == 1 { values.clone() } else { Vec::new() },
                    dropped_attributes_count: u32::from(id == 1) * 7,
                    events: if id == 1 {
                        events.clone()
                    } else {
                        SpanEvents::default()
                    },
                    links: if id == 2 {
                        links.clone()
                    } else {
                        SpanLinks::default()
                    },
                    status,
                    instrumentation_scope: scope.clone(),
                }
            };
        vec![
            span(1, 100, SpanKind::Server, Status::Unset, &scope),
            span(2, 1, SpanKind::Client, Status::error("-32603"), &scope),
            span(3, 0, SpanKind::Internal, Status::Ok, &other),
            span(4, 2, SpanKind::Producer, Status::error(""), &scope),
            span(5, 2, SpanKind::Consumer, Status::Unset, &other),
        ]
    }

    #[test]
    fn spans_are_written_as_the_otlp_crate_writes_them() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
        use prost::Message;

        let resource = Resource::builder_empty()
            .with_service_name("plexus")
            .with_attribute(KeyValue::new("service.version", "0.1.0"))
            .build();
        let spans = every_kind_of_span();
        let written = encode(&attributes_of(&resource), &spans);
        let read = ExportTraceServiceRequest::decode(written.as_slice()).unwrap();
        // The crate's own mapping of the same spans, message by message.
        let expected = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans, &(&resource).into()),
        };
        assert_eq!(read, expected);
        assert_eq!(read.resource_spans[0].scope_spans.len(), 2);
        assert_eq!(read.resource_spans[0].scope_spans[0].spans.len(), 3);
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
