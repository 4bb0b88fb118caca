//! Every metric plexus exports, each defined once. Labels are bounded: upstream
//! names, method names and fixed outcome words, never arguments or session ids.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::recent_calls::RecentCalls;

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
    /// OAuth token refreshes by upstream and outcome (`ok`, `invalid_grant`, `error`).
    pub oauth_refreshes: IntCounterVec,
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
    /// Time to build and publish one catalog snapshot (and its views).
    pub catalog_rebuild: Histogram,
    /// Downstream sessions open by front (`http`, `stdio`).
    pub sessions_active: IntGaugeVec,
    pub config_reloads: IntCounterVec,
    pub config_last_reload_successful: IntGauge,
    pub config_last_reload_timestamp: Gauge,
    pub config_info: IntGaugeVec,
    pub schema_changes: IntCounterVec,
    pub schema_checks: IntCounterVec,
    pub catalog_fingerprint_info: IntGaugeVec,
    pub quarantined_entries: IntGaugeVec,
    pub audit_dropped: prometheus::IntCounter,
    pub upstream_stderr_lines: IntCounterVec,
    pub upstream_stderr_suppressed: IntCounterVec,
    /// Requests refused at the door of the MCP front, by reason.
    pub http_refused_requests: IntCounterVec,
    /// Each listener's connection cap (set at start from the descriptor budget).
    pub listener_max_connections: IntGaugeVec,
    pub listener_connections: IntGaugeVec,
    /// Each upstream's last 15 minutes of calls, for the console.
    pub recent: RecentCalls,
    /// The last reload's outcome and when it finished (Unix time), for the console.
    last_reload: Mutex<Option<(String, f64)>>,
    /// Requests this node sent to the node holding their session or paused round.
    pub cluster_forwarded: IntCounterVec,
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
        let oauth_refreshes = IntCounterVec::new(
            Opts::new(
                "plexus_oauth_refresh_total",
                "OAuth token refreshes of hosted upstreams, by outcome.",
            ),
            &["upstream", "outcome"],
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
        let catalog_rebuild = Histogram::with_opts(
            HistogramOpts::new(
                "plexus_catalog_rebuild_seconds",
                "Time to build and publish one catalog snapshot and its views.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5,
            ]),
        )?;
        let sessions_active = IntGaugeVec::new(
            Opts::new("plexus_sessions_active", "Open downstream sessions."),
            &["front"],
        )?;
        let config_reloads = IntCounterVec::new(
            Opts::new(
                "plexus_config_reloads_total",
                "Configuration reloads by outcome (applied, partial, rejected).",
            ),
            &["outcome"],
        )?;
        let config_last_reload_successful = IntGauge::new(
            "plexus_config_last_reload_successful",
            "1 when the last reload applied the whole file, 0 when it was rejected or partial.",
        )?;
        let config_last_reload_timestamp = Gauge::new(
            "plexus_config_last_reload_timestamp_seconds",
            "When the configuration was last loaded or reloaded (Unix time).",
        )?;
        let config_info = IntGaugeVec::new(
            Opts::new(
                "plexus_config_info",
                "1, labelled with the SHA-256 of the configuration file in force.",
            ),
            &["sha256"],
        )?;
        let schema_changes = IntCounterVec::new(
            Opts::new(
                "plexus_schema_changes_total",
                "Changes found against an upstream's pinned catalog, by class (breaking, security, cosmetic).",
            ),
            &["upstream", "class"],
        )?;
        let schema_checks = IntCounterVec::new(
            Opts::new(
                "plexus_schema_checks_total",
                "Listings checked against the pins, by outcome (pinned, unchanged, changed, unapproved, pin_file_unreadable).",
            ),
            &["upstream", "outcome"],
        )?;
        let catalog_fingerprint_info = IntGaugeVec::new(
            Opts::new(
                "plexus_catalog_fingerprint_info",
                "1, labelled with the fingerprint of the upstream's current catalog.",
            ),
            &["upstream", "fingerprint"],
        )?;
        let quarantined_entries = IntGaugeVec::new(
            Opts::new(
                "plexus_quarantined_entries",
                "Entries of an upstream held back until approved (changed or new since pinned, or never approved).",
            ),
            &["upstream"],
        )?;
        registry.register(Box::new(quarantined_entries.clone()))?;
        let audit_dropped = prometheus::IntCounter::with_opts(Opts::new(
            "plexus_audit_dropped_total",
            "Audit log lines dropped because the writer was behind (a slow disk).",
        ))?;
        registry.register(Box::new(audit_dropped.clone()))?;
        let upstream_stderr_lines = IntCounterVec::new(
            Opts::new(
                "plexus_upstream_stderr_lines_total",
                "Lines an upstream wrote on stderr (all of them are kept in its status tail).",
            ),
            &["upstream"],
        )?;
        let upstream_stderr_suppressed = IntCounterVec::new(
            Opts::new(
                "plexus_upstream_stderr_suppressed_total",
                "Stderr lines left out of the log by the per-upstream rate limit.",
            ),
            &["upstream"],
        )?;
        let http_refused_requests = IntCounterVec::new(
            Opts::new(
                "plexus_http_refused_requests_total",
                "Requests the MCP front refused before reading them (`unauthorized`, `forbidden`, `bad_request`).",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(http_refused_requests.clone()))?;
        let listener_max_connections = IntGaugeVec::new(
            Opts::new(
                "plexus_listener_max_connections",
                "Connections each listener takes at once (`mcp`, `admin`); from [daemon] max_connections or the descriptor limit.",
            ),
            &["listener"],
        )?;
        registry.register(Box::new(listener_max_connections.clone()))?;
        let cluster_forwarded = IntCounterVec::new(
            Opts::new(
                "plexus_cluster_forwarded_requests_total",
                "Requests sent on to the [cluster] node holding their session or paused round, by outcome (`ok`, `unreachable`, `unresponsive`, `failed`).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(cluster_forwarded.clone()))?;
        let listener_connections = IntGaugeVec::new(
            Opts::new(
                "plexus_listener_connections",
                "Connections a listener holds open now (mcp, admin), out of plexus_listener_max_connections.",
            ),
            &["listener"],
        )?;
        registry.register(Box::new(listener_connections.clone()))?;
        registry.register(Box::new(upstream_stderr_lines.clone()))?;
        registry.register(Box::new(upstream_stderr_suppressed.clone()))?;
        registry.register(Box::new(schema_changes.clone()))?;
        registry.register(Box::new(schema_checks.clone()))?;
        registry.register(Box::new(catalog_fingerprint_info.clone()))?;
        registry.register(Box::new(config_reloads.clone()))?;
        registry.register(Box::new(config_last_reload_successful.clone()))?;
        registry.register(Box::new(config_last_reload_timestamp.clone()))?;
        registry.register(Box::new(config_info.clone()))?;
        // What operators expect of any daemon: resident memory, CPU seconds, open
        // descriptors, start time (`process_*`), and which build runs.
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let build_info = IntGaugeVec::new(
            Opts::new("plexus_build_info", "1, labelled with the running version."),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        registry.register(Box::new(build_info))?;
        // Set once: the runtime's workers never change while it runs.
        let worker_threads = IntGauge::new(
            "plexus_runtime_worker_threads",
            "Worker threads of the async runtime ([daemon] worker_threads, else one per core).",
        )?;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            worker_threads.set(i64::try_from(runtime.metrics().num_workers()).unwrap_or(i64::MAX));
        }
        registry.register(Box::new(worker_threads))?;
        registry.register(Box::new(relay_requests.clone()))?;
        registry.register(Box::new(relay_duration.clone()))?;
        registry.register(Box::new(upstream_up.clone()))?;
        registry.register(Box::new(upstream_restarts.clone()))?;
        registry.register(Box::new(upstream_state.clone()))?;
        registry.register(Box::new(oauth_refreshes.clone()))?;
        registry.register(Box::new(upstream_in_flight.clone()))?;
        registry.register(Box::new(upstream_pending.clone()))?;
        registry.register(Box::new(upstream_session_instances.clone()))?;
        registry.register(Box::new(upstream_dropped_lines.clone()))?;
        registry.register(Box::new(catalog_entries.clone()))?;
        registry.register(Box::new(catalog_warnings.clone()))?;
        registry.register(Box::new(catalog_rebuild.clone()))?;
        registry.register(Box::new(sessions_active.clone()))?;
        Ok(Metrics {
            registry,
            relay_requests,
            relay_duration,
            upstream_up,
            upstream_restarts,
            upstream_state,
            oauth_refreshes,
            upstream_in_flight,
            upstream_pending,
            upstream_session_instances,
            upstream_dropped_lines,
            catalog_entries,
            catalog_warnings,
            catalog_rebuild,
            sessions_active,
            config_reloads,
            config_last_reload_successful,
            config_last_reload_timestamp,
            config_info,
            schema_changes,
            schema_checks,
            catalog_fingerprint_info,
            quarantined_entries,
            audit_dropped,
            upstream_stderr_lines,
            upstream_stderr_suppressed,
            http_refused_requests,
            listener_max_connections,
            listener_connections,
            recent: RecentCalls::default(),
            last_reload: Mutex::new(None),
            cluster_forwarded,
        })
    }

    /// Drops every series labelled with a removed upstream's name.
    pub fn forget_upstream(&self, name: &str) {
        forget(&self.relay_requests, name);
        forget(&self.relay_duration, name);
        forget(&self.upstream_up, name);
        forget(&self.upstream_restarts, name);
        forget(&self.upstream_state, name);
        forget(&self.oauth_refreshes, name);
        forget(&self.upstream_in_flight, name);
        forget(&self.upstream_pending, name);
        forget(&self.upstream_session_instances, name);
        forget(&self.upstream_dropped_lines, name);
        forget(&self.schema_changes, name);
        forget(&self.schema_checks, name);
        forget(&self.catalog_fingerprint_info, name);
        forget(&self.quarantined_entries, name);
        forget(&self.upstream_stderr_lines, name);
        forget(&self.upstream_stderr_suppressed, name);
        self.recent.forget(name);
    }

    /// The one fingerprint series of `upstream`: its current catalog's.
    pub fn catalog_fingerprint(&self, upstream: &str, fingerprint: &str) {
        forget(&self.catalog_fingerprint_info, upstream);
        self.catalog_fingerprint_info
            .with_label_values(&[upstream, fingerprint])
            .set(1);
    }

    /// Records a load of the file whose hash is `sha256` (the previous hash's series goes).
    pub fn config_loaded(&self, sha256: &str) {
        self.config_info.reset();
        self.config_info.with_label_values(&[sha256]).set(1);
    }

    /// Counts a reload attempt and stamps its time.
    pub fn reload_finished(&self, outcome: &str, now_seconds: f64) {
        self.config_reloads.with_label_values(&[outcome]).inc();
        self.config_last_reload_successful
            .set(i64::from(outcome == "applied"));
        self.config_last_reload_timestamp.set(now_seconds);
        *self
            .last_reload
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((outcome.to_string(), now_seconds));
    }

    /// The last reload's outcome (`applied`, `partial`, `rejected`) and its Unix time.
    pub fn last_reload(&self) -> Option<(String, f64)> {
        self.last_reload
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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

/// Removes the series of `vec` whose `upstream` label is `name`, whatever its other labels.
fn forget<T: MetricVecBuilder>(vec: &MetricVec<T>, name: &str) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|pair| (pair.name(), pair.value()))
                .collect();
            if labels.get("upstream") == Some(&name) {
                let _ = vec.remove(&labels);
            }
        }
    }
}
