//! Every metric plexus exports, each defined once. Labels are bounded: upstream
//! names, method names and fixed outcome words, never arguments or session ids.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// Relayed requests by upstream, method and outcome (`ok`, `upstream_error`, or a plexus error kind).
    pub relay_requests: IntCounterVec,
    /// Time from receiving a relayed request to having its answer.
    pub relay_duration: HistogramVec,
    /// 1 while an upstream is connected and initialized.
    pub upstream_up: IntGaugeVec,
    /// Upstream process starts after the first.
    pub upstream_restarts: IntCounterVec,
    /// 1 for the state each upstream is in, 0 for the others.
    pub upstream_state: IntGaugeVec,
    /// Calls being served by, and waiting for, each upstream.
    pub upstream_in_flight: IntGaugeVec,
    pub upstream_pending: IntGaugeVec,
    /// Running per-session instances of each `share = "session"` upstream.
    pub upstream_session_instances: IntGaugeVec,
    /// Lines on an upstream's stdout that were not JSON-RPC and were dropped.
    pub upstream_dropped_lines: IntCounterVec,
    /// Entries in the current catalog by kind.
    pub catalog_entries: IntGaugeVec,
    /// Entries changed or left out while building the catalog, by reason.
    pub catalog_warnings: IntCounterVec,
    /// Downstream sessions open by front (`http`, `stdio`).
    pub sessions_active: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let relay_requests = IntCounterVec::new(
            Opts::new(
                "plexus_relay_requests_total",
                "Relayed requests by upstream, method and outcome.",
            ),
            &["upstream", "method", "outcome"],
        )?;
        let relay_duration = HistogramVec::new(
            HistogramOpts::new(
                "plexus_relay_request_duration_seconds",
                "Latency of relayed requests, from receipt to answer.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 120.0,
            ]),
            &["upstream", "method"],
        )?;
        let upstream_up = IntGaugeVec::new(
            Opts::new(
                "plexus_upstream_up",
                "1 while the upstream is connected and initialized.",
            ),
            &["upstream"],
        )?;
        let upstream_restarts = IntCounterVec::new(
            Opts::new(
                "plexus_upstream_restarts_total",
                "Upstream starts after the first.",
            ),
            &["upstream"],
        )?;
        let upstream_state = IntGaugeVec::new(
            Opts::new(
                "plexus_upstream_state",
                "1 for the state the upstream is in, 0 for the others.",
            ),
            &["upstream", "state"],
        )?;
        let upstream_in_flight = IntGaugeVec::new(
            Opts::new(
                "plexus_upstream_in_flight",
                "Calls being served by the upstream.",
            ),
            &["upstream"],
        )?;
        let upstream_pending = IntGaugeVec::new(
            Opts::new(
                "plexus_upstream_pending",
                "Calls waiting for a free slot of the upstream.",
            ),
            &["upstream"],
        )?;
        let upstream_session_instances = IntGaugeVec::new(
            Opts::new(
                "plexus_upstream_session_instances",
                "Running per-session instances of the upstream.",
            ),
            &["upstream"],
        )?;
        let upstream_dropped_lines = IntCounterVec::new(
            Opts::new(
                "plexus_upstream_dropped_lines_total",
                "Non-JSON-RPC lines dropped from the upstream's stdout.",
            ),
            &["upstream"],
        )?;
        let catalog_entries = IntGaugeVec::new(
            Opts::new("plexus_catalog_entries", "Entries in the current catalog."),
            &["kind"],
        )?;
        let catalog_warnings = IntCounterVec::new(
            Opts::new(
                "plexus_catalog_warnings_total",
                "Catalog entries patched, left out or rejected as collisions.",
            ),
            &["reason"],
        )?;
        let sessions_active = IntGaugeVec::new(
            Opts::new("plexus_sessions_active", "Open downstream sessions."),
            &["front"],
        )?;
        registry.register(Box::new(relay_requests.clone()))?;
        registry.register(Box::new(relay_duration.clone()))?;
        registry.register(Box::new(upstream_up.clone()))?;
        registry.register(Box::new(upstream_restarts.clone()))?;
        registry.register(Box::new(upstream_state.clone()))?;
        registry.register(Box::new(upstream_in_flight.clone()))?;
        registry.register(Box::new(upstream_pending.clone()))?;
        registry.register(Box::new(upstream_session_instances.clone()))?;
        registry.register(Box::new(upstream_dropped_lines.clone()))?;
        registry.register(Box::new(catalog_entries.clone()))?;
        registry.register(Box::new(catalog_warnings.clone()))?;
        registry.register(Box::new(sessions_active.clone()))?;
        Ok(Metrics {
            registry,
            relay_requests,
            relay_duration,
            upstream_up,
            upstream_restarts,
            upstream_state,
            upstream_in_flight,
            upstream_pending,
            upstream_session_instances,
            upstream_dropped_lines,
            catalog_entries,
            catalog_warnings,
            sessions_active,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
