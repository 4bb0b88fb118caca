//! The hub: every configured upstream, the current catalog snapshot, and the
//! one path by which a session's request reaches an upstream.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use adapters::{ConnectionError, Reply};
use registry::{Catalog, CatalogOptions, CatalogWarning, Kind, UpstreamListing};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::jsonrpc::RelayError;
use crate::metrics::Metrics;
use crate::upstream::{self, Upstream, UpstreamState};

pub struct Hub {
    upstreams: BTreeMap<String, Arc<Upstream>>,
    listings: Mutex<Listings>,
    catalog: watch::Sender<Arc<Catalog>>,
    catalog_options: CatalogOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Default)]
struct Listings {
    by_upstream: BTreeMap<String, UpstreamListing>,
    /// Warnings already logged, so each is logged once, not at every rebuild.
    reported: HashSet<String>,
}

impl Hub {
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Arc<Hub> {
        let upstreams = config
            .upstreams
            .iter()
            .map(|(name, upstream)| (name.clone(), Arc::new(Upstream::new(upstream.clone()))))
            .collect();
        let (catalog, _) = watch::channel(Arc::new(Catalog::empty()));
        Arc::new(Hub {
            upstreams,
            listings: Mutex::new(Listings::default()),
            catalog,
            catalog_options: CatalogOptions {
                name_budget: config.daemon.name_budget,
                page_size: config.daemon.page_size,
            },
            metrics,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// Starts a supervising task for every enabled upstream.
    pub fn start(self: &Arc<Self>) {
        for upstream in self.upstreams.values() {
            if !upstream.config.enabled {
                tracing::info!(upstream = %upstream.name(), "upstream disabled in config");
                continue;
            }
            self.tasks.spawn(upstream::supervise(
                upstream.clone(),
                self.clone(),
                self.shutdown.clone(),
            ));
        }
    }

    /// Stops every upstream and waits until each process group is reaped.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.upstreams.values()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Catalog>> {
        self.catalog.subscribe()
    }

    /// Replaces one upstream's listing and publishes a new snapshot.
    pub fn publish_listing(&self, listing: UpstreamListing) {
        let mut listings = self.listings.lock().unwrap_or_else(PoisonError::into_inner);
        listings
            .by_upstream
            .insert(listing.upstream.to_string(), listing);
        let ordered: Vec<UpstreamListing> = listings.by_upstream.values().cloned().collect();
        let (catalog, warnings) = Catalog::build(&ordered, &self.catalog_options);
        for warning in warnings {
            let text = warning.to_string();
            if listings.reported.insert(text.clone()) {
                let reason = match warning {
                    CatalogWarning::Collision { .. } => "collision",
                    CatalogWarning::InvalidEntry { .. } => "invalid_entry",
                    CatalogWarning::SchemaPatched { .. } => "schema_patched",
                };
                self.metrics
                    .catalog_warnings
                    .with_label_values(&[reason])
                    .inc();
                tracing::warn!(reason, "{text}");
            }
        }
        for kind in Kind::ALL {
            self.metrics
                .catalog_entries
                .with_label_values(&[kind.label()])
                .set(catalog.len(kind) as i64);
        }
        self.catalog.send_replace(Arc::new(catalog));
    }

    /// Sends a request to an upstream under plexus's own id and waits, within the
    /// upstream's call deadline, for its answer.
    pub async fn forward(
        &self,
        upstream_name: &str,
        method: &str,
        params: Option<Value>,
    ) -> Result<Reply, RelayError> {
        let started = Instant::now();
        let outcome = self.forward_inner(upstream_name, method, params).await;
        let label = match &outcome {
            Ok(Reply::Result(_)) => "ok",
            Ok(Reply::Error(_)) => "upstream_error",
            Err(RelayError::Unavailable { .. }) => "unavailable",
            Err(RelayError::Timeout { .. }) => "timeout",
            Err(RelayError::FailedMidCall { .. }) => "failed",
            Err(RelayError::TooLarge { .. }) => "too_large",
            Err(_) => "error",
        };
        self.metrics
            .relay_requests
            .with_label_values(&[upstream_name, method, label])
            .inc();
        self.metrics
            .relay_duration
            .with_label_values(&[upstream_name, method])
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    async fn forward_inner(
        &self,
        upstream_name: &str,
        method: &str,
        params: Option<Value>,
    ) -> Result<Reply, RelayError> {
        let upstream =
            self.upstreams
                .get(upstream_name)
                .ok_or_else(|| RelayError::Unavailable {
                    upstream: upstream_name.to_string(),
                    state: "removed".into(),
                    retry_after_ms: None,
                })?;
        let connection = upstream.connection()?;
        let deadline = upstream.config.call_timeout;
        // On timeout the request future is dropped, which cancels it upstream.
        match tokio::time::timeout(deadline, connection.request(method, params)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(ConnectionError::Closed)) => Err(RelayError::FailedMidCall {
                upstream: upstream_name.to_string(),
                reason: "the upstream's connection closed".into(),
            }),
            Ok(Err(ConnectionError::NotSent)) => Err(RelayError::Unavailable {
                upstream: upstream_name.to_string(),
                state: upstream.state().label().to_string(),
                retry_after_ms: Some(1000),
            }),
            Ok(Err(ConnectionError::TooLarge { limit })) => Err(RelayError::TooLarge {
                upstream: upstream_name.to_string(),
                limit,
            }),
            Err(_) => Err(RelayError::Timeout {
                upstream: upstream_name.to_string(),
                after: deadline,
            }),
        }
    }

    /// Upstream names and states, for `/readyz` and status.
    pub fn states(&self) -> Vec<(String, UpstreamState)> {
        self.upstreams
            .values()
            .map(|upstream| (upstream.name().to_string(), upstream.state()))
            .collect()
    }
}
