//! OpenTelemetry: spans on the MCP semantic conventions and the
//! `mcp.*.operation.duration` histograms, exported over OTLP/HTTP (protobuf).
//!
//! Set up once as the daemon starts ([`start`]) when `[daemon.tracing]` or the
//! `OTEL_*` variables name an endpoint; otherwise [`active`] is None and every
//! hook is one load and a branch: no span, no clock read, no `_meta` rewritten.
//! Spans: `spans.rs`; the W3C `traceparent` in `_meta` and headers: `propagate.rs`.

mod export;
mod names;
mod otlp;
mod propagate;
mod spans;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::metrics::{BoundHistogram, Histogram, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    self as sdktrace, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tokio_util::task::TaskTracker;

pub use propagate::{http_parent, within};
pub use spans::{
    client_round, client_span, server_call, waited, CallTrace, ClientRound, ClientSpan, SessionTag,
    Wait,
};

use crate::config::{Sampler, TracingSettings};

/// The exporters and instruments, present only when configured.
pub struct Telemetry {
    tracer: Option<SdkTracer>,
    histograms: Option<Histograms>,
}

pub(super) struct Histograms {
    pub(super) server: Series,
    pub(super) client: Series,
}

/// At most this many attribute sets are bound per histogram; beyond, a duration is
/// recorded through the SDK's own lookup (its series are capped at 2,000 anyway).
const MAX_BOUND: usize = 1024;

/// A histogram and its series bound by attribute set: the SDK's `record` hashes
/// the attributes with SipHash on every call (1.4 thousand instructions for a tool
/// call's five); one lookup here with foldhash costs a few hundred.
pub(super) struct Series {
    histogram: Histogram<f64>,
    bound: Mutex<HashMap<SeriesKey, BoundHistogram<f64>, foldhash::fast::RandomState>>,
}

/// An attribute set as the key of its bound series. Only the values are hashed (the
/// keys of a histogram's sets are a few, in the same order), and a text is first
/// compared by address: the names of methods, tools and versions are shared, not
/// copies, so a set found again is equal without reading its texts.
struct SeriesKey(Vec<KeyValue>);

impl std::hash::Hash for SeriesKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.0.len());
        for attribute in &self.0 {
            match &attribute.value {
                opentelemetry::Value::String(text) => state.write(text.as_str().as_bytes()),
                _ => attribute.hash(state),
            }
        }
    }
}

impl PartialEq for SeriesKey {
    fn eq(&self, other: &SeriesKey) -> bool {
        let same = |a: &str, b: &str| std::ptr::eq(a, b) || a == b;
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|(a, b)| {
                same(a.key.as_str(), b.key.as_str())
                    && match (&a.value, &b.value) {
                        (opentelemetry::Value::String(a), opentelemetry::Value::String(b)) => {
                            same(a.as_str(), b.as_str())
                        }
                        _ => a == b,
                    }
            })
    }
}

impl Eq for SeriesKey {}

impl Series {
    fn new(histogram: Histogram<f64>) -> Series {
        Series {
            histogram,
            bound: Mutex::new(HashMap::default()),
        }
    }

    pub(super) fn record(&self, seconds: f64, attributes: Vec<KeyValue>) {
        let Ok(mut bound) = self.bound.lock() else {
            return self.histogram.record(seconds, &attributes);
        };
        let key = SeriesKey(attributes);
        if let Some(series) = bound.get(&key) {
            return series.record(seconds);
        }
        if bound.len() >= MAX_BOUND {
            return self.histogram.record(seconds, &key.0);
        }
        let series = self.histogram.bind(&key.0);
        series.record(seconds);
        bound.insert(key, series);
    }
}

static ACTIVE: OnceLock<Telemetry> = OnceLock::new();

/// What is exporting, if anything.
pub fn active() -> Option<&'static Telemetry> {
    ACTIVE.get()
}

/// The providers, flushed and stopped by [`Exporting::finish`] as the daemon exits.
pub struct Exporting {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
    tasks: TaskTracker,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OpenTelemetry exporter's TLS: {0}")]
    Tls(String),
    #[error("cannot export OpenTelemetry spans to {endpoint}: {reason}")]
    SpanExporter { endpoint: String, reason: String },
    #[error("cannot export OpenTelemetry data to {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Starts exporting as `settings` say (nothing when they name no endpoint). Call
/// within the runtime: the exporters' posts run on it.
pub fn start(settings: &TracingSettings) -> Result<Option<Exporting>, TelemetryError> {
    if settings.traces_endpoint.is_none() && settings.metrics_endpoint.is_none() {
        return Ok(None);
    }
    let tasks = TaskTracker::new();
    let poster = Arc::new(
        export::Poster::new(tokio::runtime::Handle::current(), tasks.clone())
            .map_err(TelemetryError::Tls)?,
    );
    let resource = Resource::builder_empty()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let traces = match &settings.traces_endpoint {
        None => None,
        Some(endpoint) => {
            let headers = std::env::var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_HEADERS"))
                .ok();
            let exporter = otlp::Exporter::new(endpoint, headers.as_deref(), poster.clone())
                .map_err(|reason| TelemetryError::SpanExporter {
                    endpoint: endpoint.clone(),
                    reason,
                })?;
            Some(
                SdkTracerProvider::builder()
                    .with_span_processor(
                        BatchSpanProcessor::builder(exporter)
                            .with_batch_config(batch_config())
                            .build(),
                    )
                    .with_sampler(sampler(settings.sampler))
                    .with_resource(resource.clone())
                    .build(),
            )
        }
    };
    let metrics = match &settings.metrics_endpoint {
        None => None,
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_shared_http_client(poster)
                .with_endpoint(endpoint.clone())
                .with_protocol(Protocol::HttpBinary)
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    endpoint: endpoint.clone(),
                    source,
                })?;
            Some(
                SdkMeterProvider::builder()
                    .with_reader(PeriodicReader::builder(exporter).build())
                    .with_resource(resource)
                    .build(),
            )
        }
    };
    let histograms = metrics.as_ref().map(|provider| {
        let meter = provider.meter("plexus");
        // The conventions' advice: seconds, with buckets for calls from 10 ms to minutes.
        let boundaries = vec![
            0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ];
        let histogram = |name: &'static str, description: &'static str| {
            Series::new(
                meter
                    .f64_histogram(name)
                    .with_unit("s")
                    .with_description(description)
                    .with_boundaries(boundaries.clone())
                    .build(),
            )
        };
        Histograms {
            server: histogram(
                "mcp.server.operation.duration",
                "MCP requests served to clients",
            ),
            client: histogram(
                "mcp.client.operation.duration",
                "MCP requests made of upstreams",
            ),
        }
    });
    let telemetry = Telemetry {
        tracer: traces.as_ref().map(|provider| provider.tracer("plexus")),
        histograms,
    };
    // Set once per process: a second start (tests in one process) keeps the first.
    let _ = ACTIVE.set(telemetry);
    tracing::info!(
        traces = settings.traces_endpoint.as_deref().unwrap_or("off"),
        metrics = settings.metrics_endpoint.as_deref().unwrap_or("off"),
        service = settings.service_name,
        "OpenTelemetry export on"
    );
    Ok(Some(Exporting {
        traces,
        metrics,
        tasks,
    }))
}

impl Exporting {
    /// Flushes what is queued and stops the exporters (off the runtime's workers:
    /// the SDK blocks while its own threads post through the runtime).
    pub async fn finish(self) {
        let Exporting {
            traces,
            metrics,
            tasks,
        } = self;
        let stopped = tokio::task::spawn_blocking(move || {
            if let Some(traces) = traces {
                let _ = traces.shutdown_with_timeout(Duration::from_secs(5));
            }
            if let Some(metrics) = metrics {
                let _ = metrics.shutdown_with_timeout(Duration::from_secs(5));
            }
        });
        let _ = stopped.await;
        tasks.close();
        tasks.wait().await;
    }
}

/// Spans wait for the export thread in a queue of 8,192 (the SDK's default 2,048,
/// unless `OTEL_BSP_MAX_QUEUE_SIZE` says): at 6,000 calls a second, two spans each,
/// 2,048 is 170 ms, and an export thread held up that long on a busy machine
/// would see spans dropped. Exports still go in batches of 512.
fn batch_config() -> sdktrace::BatchConfig {
    let config = sdktrace::BatchConfigBuilder::default();
    match std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE") {
        Some(_) => config.build(),
        None => config.with_max_queue_size(8192).build(),
    }
}

fn sampler(sampler: Sampler) -> sdktrace::Sampler {
    use sdktrace::Sampler as Sdk;
    match sampler {
        Sampler::AlwaysOn => Sdk::AlwaysOn,
        Sampler::AlwaysOff => Sdk::AlwaysOff,
        Sampler::TraceIdRatio(ratio) => Sdk::TraceIdRatioBased(ratio),
        Sampler::ParentBasedAlwaysOn => Sdk::ParentBased(Box::new(Sdk::AlwaysOn)),
        Sampler::ParentBasedAlwaysOff => Sdk::ParentBased(Box::new(Sdk::AlwaysOff)),
        Sampler::ParentBasedTraceIdRatio(ratio) => {
            Sdk::ParentBased(Box::new(Sdk::TraceIdRatioBased(ratio)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_series_key_is_its_attributes_whether_shared_or_copied() {
        let state = foldhash::fast::RandomState::default();
        let set = |tool: opentelemetry::StringValue| {
            SeriesKey(vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", tool),
                KeyValue::new("plexus.retries", 2),
            ])
        };
        let shared = set("echo".into());
        let copied = set("echo".to_string().into());
        assert!(shared == copied);
        assert_eq!(state.hash_one(&shared), state.hash_one(&copied));
        let mut other = set("echo".into());
        other.0[1] = KeyValue::new("gen_ai.tool.name", "echo2");
        assert!(shared != other);
        other.0[1] = KeyValue::new("gen_ai.prompt.name", "echo");
        assert!(shared != other);
        other.0[1] = KeyValue::new("gen_ai.tool.name", "echo");
        other.0[2] = KeyValue::new("plexus.retries", 3);
        assert!(shared != other);
        other.0.pop();
        assert!(shared != other);
    }
}
