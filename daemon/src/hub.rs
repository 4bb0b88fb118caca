//! The hub: every configured upstream, the current catalog snapshot, and the
//! one path by which a session's request reaches an upstream.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use adapters::{ConnectionError, Reply};
use dashmap::DashMap;
use registry::{Catalog, CatalogOptions, CatalogWarning, Kind, UpstreamListing};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::fanout::Fanout;
use crate::jsonrpc::{self, RelayError};
use crate::metrics::Metrics;
use crate::upstream::{self, empty_listing, Upstream, UpstreamState};

pub struct Hub {
    upstreams: BTreeMap<String, Arc<Upstream>>,
    listings: Mutex<Listings>,
    catalog: watch::Sender<Arc<Catalog>>,
    catalog_options: CatalogOptions,
    /// Where each upstream's last listing is kept, so it stays listed across restarts.
    catalog_dir: PathBuf,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Progress tokens plexus gave upstreams, to the session and token they stand for.
    progress: DashMap<String, ProgressRoute>,
    next_token: AtomicU64,
    next_session: AtomicU64,
    /// Called with (configured, ready) whenever an upstream's state changes.
    status_listener: Mutex<Option<StatusListener>>,
    /// Routing of upstream messages to sessions.
    pub(crate) fanout: Fanout,
    /// Task ids handed to clients, to their upstream and creating session.
    pub(crate) task_routes: DashMap<String, crate::tasks::TaskRoute>,
    /// 2026-07-28 requests paused on input from their client, by `requestState`.
    pub(crate) continuations: DashMap<String, crate::bridge::Continuation>,
}

#[derive(Default)]
struct Listings {
    by_upstream: BTreeMap<String, UpstreamListing>,
    /// Warnings already logged, so each is logged once, not at every rebuild.
    reported: HashSet<String>,
}

struct ProgressRoute {
    sink: mpsc::Sender<Value>,
    client_token: Value,
    activity: Arc<Notify>,
}

/// What a relayed request carries besides its method and params.
#[derive(Clone, Copy)]
pub struct CallContext<'a> {
    /// The downstream session the call belongs to (requests the upstream sends
    /// while serving it are attributed to it).
    pub session: u64,
    /// The session that owns per-session instances: the session itself, or for a
    /// 2026-07-28 request served inside a stdio connection, that connection's.
    pub owner: u64,
    /// The upstream's own tool name, for per-tool deadlines.
    pub tool: Option<&'a str>,
    /// Where messages related to this call go (its progress, requests the upstream
    /// sends while serving it): the request's own stream, or the session's.
    pub related: &'a mpsc::Sender<Value>,
    /// `Mcp-Param-*` headers the tool's schema asks for (sent to HTTP upstreams).
    pub headers: &'a [(String, String)],
}

impl Hub {
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Arc<Hub> {
        let shutdown = CancellationToken::new();
        let upstreams = config
            .upstreams
            .iter()
            .map(|(name, upstream)| {
                (
                    name.clone(),
                    Arc::new(Upstream::new(upstream.clone(), &shutdown)),
                )
            })
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
            catalog_dir: config.daemon.state_dir.join("catalog"),
            metrics,
            shutdown,
            tasks: TaskTracker::new(),
            progress: DashMap::new(),
            next_token: AtomicU64::new(0),
            next_session: AtomicU64::new(0),
            status_listener: Mutex::new(None),
            fanout: Fanout::default(),
            task_routes: DashMap::new(),
            continuations: DashMap::new(),
        })
    }

    /// Publishes the last-known listings and starts a supervising task per enabled upstream.
    pub fn start(self: &Arc<Self>) {
        for upstream in self.upstreams.values() {
            let name = upstream.name();
            if !upstream.config.enabled {
                tracing::info!(upstream = %name, "upstream disabled in config");
                continue;
            }
            let cached = self.load_cached_listing(upstream);
            if upstream.on_demand() && !cached {
                // Nothing known about its catalog yet: start it once to list it.
                upstream.shared.retry();
            }
            self.spawn(upstream::supervise(
                upstream.shared.clone(),
                upstream.clone(),
                self.clone(),
            ));
        }
    }

    /// Runs a task that shutdown waits for.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Stops every upstream and waits until each process group is reaped.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        // Paused calls will not be retried now: release them and their upstream requests.
        self.continuations.clear();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Completes when plexus starts shutting down.
    pub async fn stopping(&self) {
        self.shutdown.cancelled().await
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

    /// A new downstream session's id.
    pub fn open_session(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The upstream of that name, or the error a call to it gets.
    pub fn upstream_named(&self, name: &str) -> Result<&Arc<Upstream>, RelayError> {
        self.upstreams
            .get(name)
            .ok_or_else(|| RelayError::Unavailable {
                upstream: name.to_string(),
                state: "removed".into(),
                retry_after_ms: None,
            })
    }

    /// Registers who hears about state changes (systemd's STATUS line).
    pub fn on_status(&self, listener: StatusListener) {
        *self
            .status_listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(listener);
        self.report_status();
    }

    pub fn on_state_change(&self, name: &str, state: UpstreamState) {
        let up = i64::from(state == UpstreamState::Ready);
        self.metrics.upstream_up.with_label_values(&[name]).set(up);
        for label in UpstreamState::LABELS {
            self.metrics
                .upstream_state
                .with_label_values(&[name, label])
                .set(i64::from(label == state.label()));
        }
        self.report_status();
    }

    fn report_status(&self) {
        let listener = self
            .status_listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(listener) = listener.as_ref() {
            let ready = self
                .upstreams
                .values()
                .filter(|u| u.shared.state() == UpstreamState::Ready)
                .count();
            listener(self.upstreams.len(), ready);
        }
    }

    /// Asks an upstream to start again now (after `failed`, during a backoff, or while running).
    pub fn retry(&self, name: &str) -> bool {
        match self.upstreams.get(name) {
            Some(upstream) if upstream.config.enabled => {
                tracing::info!(upstream = name, "restart requested by an operator");
                upstream.shared.retry();
                true
            }
            _ => false,
        }
    }

    /// Replaces one upstream's listing, keeps it on disk, and publishes a new snapshot.
    pub fn publish_listing(&self, listing: UpstreamListing) {
        self.save_listing(&listing);
        self.install_listing(listing);
    }

    fn install_listing(&self, listing: UpstreamListing) {
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

    fn cache_path(&self, upstream: &str) -> PathBuf {
        self.catalog_dir.join(format!("{upstream}.json"))
    }

    fn save_listing(&self, listing: &UpstreamListing) {
        let capabilities = self
            .upstreams
            .get(&*listing.upstream)
            .map(|upstream| upstream.known_capabilities())
            .unwrap_or(Value::Null);
        let body = json!({
            "capabilities": capabilities,
            "tools": listing.tools,
            "prompts": listing.prompts,
            "resources": listing.resources,
            "resourceTemplates": listing.resource_templates,
        });
        if let Err(error) = write_atomically(&self.cache_path(&listing.upstream), &body) {
            tracing::warn!(upstream = %listing.upstream, %error, "could not keep the upstream's listing on disk");
        }
    }

    /// Publishes the listing kept from an earlier run, if there is one.
    fn load_cached_listing(&self, upstream: &Upstream) -> bool {
        let Ok(text) = std::fs::read_to_string(self.cache_path(upstream.name())) else {
            return false;
        };
        let Ok(Value::Object(mut body)) = serde_json::from_str::<Value>(&text) else {
            tracing::warn!(upstream = %upstream.name(), "ignoring an unreadable cached listing");
            return false;
        };
        if let Some(capabilities) = body.remove("capabilities") {
            upstream.remember_capabilities(capabilities);
        }
        let mut take = |key: &str| match body.remove(key) {
            Some(Value::Array(entries)) => entries,
            _ => Vec::new(),
        };
        let mut listing = empty_listing(&upstream.config);
        listing.tools = take("tools");
        listing.prompts = take("prompts");
        listing.resources = take("resources");
        listing.resource_templates = take("resourceTemplates");
        tracing::info!(upstream = %upstream.name(), tools = listing.tools.len(), "listing the upstream's last-known catalog until it starts");
        self.install_listing(listing);
        true
    }

    /// Sends a request to an upstream under plexus's own id and waits, within the
    /// call's deadline (extended by progress, up to the hard maximum), for its answer.
    pub async fn forward(
        self: &Arc<Self>,
        upstream_name: &str,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let started = Instant::now();
        let outcome = self
            .forward_inner(upstream_name, method, params, call)
            .await;
        let label = match &outcome {
            Ok(Reply::Result(_)) => "ok",
            Ok(Reply::Error(_)) => "upstream_error",
            Err(error) => error.kind(),
        };
        if self.upstreams.contains_key(upstream_name) {
            self.metrics
                .relay_requests
                .with_label_values(&[upstream_name, method, label])
                .inc();
            self.metrics
                .relay_duration
                .with_label_values(&[upstream_name, method])
                .observe(started.elapsed().as_secs_f64());
        }
        outcome
    }

    async fn forward_inner(
        self: &Arc<Self>,
        upstream_name: &str,
        method: &str,
        mut params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let upstream = self.upstream_named(upstream_name)?;
        if self.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        let config = &upstream.config;
        let _permit = upstream
            .limiter
            .acquire()
            .await
            .ok_or_else(|| RelayError::Overloaded {
                upstream: upstream_name.to_string(),
                in_flight: config.max_in_flight,
                pending: config.max_pending,
            })?;
        let instance = upstream.instance_for(call.owner, self);
        let connection = instance
            .connection_for_call(upstream.on_demand(), config.init_timeout)
            .await?;

        // Upstreams negotiated their revision once; the per-request fields are the client's.
        crate::era::strip_request_meta(&mut params);
        // The client's progress token never reaches a shared upstream: plexus's own does.
        let progress = self.rewrite_progress_token(&mut params, call.related);
        // The request gets its upstream-side id first, so whatever the upstream sends
        // while serving it (over HTTP, on this request's own stream) is attributed
        // to this call, and through it to this session.
        let request = connection
            .prepare(method, params)
            .with_headers(call.headers.to_vec());
        let _caller = instance.track_call(call.session, call.related.clone(), request.id());
        let activity = progress.as_ref().map(|route| route.activity.clone());

        let base = call
            .tool
            .and_then(|tool| config.tool_timeouts.get(tool))
            .copied()
            .unwrap_or(config.call_timeout);
        let call_started = Instant::now();
        let hard_deadline = call_started + base.max(config.max_call_timeout);
        let mut deadline = call_started + base;
        let request = request.send();
        tokio::pin!(request);
        let outcome = loop {
            tokio::select! {
                outcome = &mut request => break Ok(outcome),
                _ = tokio::time::sleep_until(deadline) => break Err(()),
                _ = wait_for(activity.as_deref()) => {
                    // Progress shows the call is alive: give it another full deadline, up to the cap.
                    deadline = (Instant::now() + base).min(hard_deadline);
                }
            }
        };
        if let Some(route) = progress {
            self.progress.remove(&route.token);
        }
        match outcome {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(ConnectionError::Closed)) => Err(RelayError::FailedMidCall {
                upstream: upstream_name.to_string(),
                reason: "the upstream exited or its connection closed".into(),
            }),
            Ok(Err(ConnectionError::NotSent | ConnectionError::Unreachable { .. })) => {
                Err(instance.unavailable())
            }
            Ok(Err(ConnectionError::TooLarge { limit })) => Err(RelayError::TooLarge {
                upstream: upstream_name.to_string(),
                limit,
            }),
            Ok(Err(
                error @ (ConnectionError::HttpStatus { .. } | ConnectionError::Broken { .. }),
            )) => Err(RelayError::FailedMidCall {
                upstream: upstream_name.to_string(),
                reason: error.to_string(),
            }),
            // Dropping `request` (at the end of this scope) sends the cancel upstream.
            Err(()) => Err(RelayError::Timeout {
                upstream: upstream_name.to_string(),
                after: call_started.elapsed(),
            }),
        }
    }

    fn rewrite_progress_token(
        &self,
        params: &mut Option<Value>,
        sink: &mpsc::Sender<Value>,
    ) -> Option<RegisteredProgress> {
        let meta = params.as_mut()?.get_mut("_meta")?.as_object_mut()?;
        let client_token = meta.remove("progressToken")?;
        let token = format!(
            "plexus-{}",
            self.next_token.fetch_add(1, Ordering::Relaxed) + 1
        );
        meta.insert("progressToken".into(), Value::String(token.clone()));
        let activity = Arc::new(Notify::new());
        self.progress.insert(
            token.clone(),
            ProgressRoute {
                sink: sink.clone(),
                client_token,
                activity: activity.clone(),
            },
        );
        Some(RegisteredProgress { token, activity })
    }

    /// Sends an upstream's progress notification to the session whose call it is
    /// about, under that client's own token.
    pub fn route_progress(&self, message: &Value) {
        let Some(params) = message.get("params").and_then(Value::as_object) else {
            return;
        };
        let Some(token) = params.get("progressToken").and_then(Value::as_str) else {
            return;
        };
        let Some(route) = self.progress.get(token) else {
            tracing::debug!(token, "progress for a call that is no longer in flight");
            return;
        };
        let mut params: Map<String, Value> = params.clone();
        params.insert("progressToken".into(), route.client_token.clone());
        route.activity.notify_one();
        let notification =
            jsonrpc::notification("notifications/progress", Some(Value::Object(params)));
        if route.sink.try_send(notification).is_err() {
            tracing::debug!("session's outbound queue is full; progress dropped");
        }
    }

    /// Upstream names and the states of their shared instances.
    pub fn states(&self) -> Vec<(String, UpstreamState)> {
        self.upstreams
            .values()
            .map(|upstream| (upstream.name().to_string(), upstream.shared.state()))
            .collect()
    }

    /// Brings the gauges and counters that mirror live state up to date (before a scrape).
    pub fn refresh_metrics(&self) {
        for upstream in self.upstreams.values() {
            let name = upstream.name();
            self.metrics
                .upstream_in_flight
                .with_label_values(&[name])
                .set(upstream.limiter.in_flight() as i64);
            self.metrics
                .upstream_pending
                .with_label_values(&[name])
                .set(upstream.limiter.pending() as i64);
            self.metrics
                .upstream_session_instances
                .with_label_values(&[name])
                .set(upstream.session_instances() as i64);
            let dropped = upstream.stats.dropped_stdout_lines.load(Ordering::Relaxed);
            let counter = self
                .metrics
                .upstream_dropped_lines
                .with_label_values(&[name]);
            counter.inc_by(dropped.saturating_sub(counter.get()));
        }
    }
}

/// Hears (upstreams configured, upstreams ready) at every state change.
pub type StatusListener = Box<dyn Fn(usize, usize) + Send + Sync>;

struct RegisteredProgress {
    token: String,
    activity: Arc<Notify>,
}

async fn wait_for(activity: Option<&Notify>) {
    match activity {
        Some(activity) => activity.notified().await,
        None => std::future::pending().await,
    }
}

/// Writes a file by renaming a complete temporary one over it.
pub fn write_atomically(path: &Path, body: &Value) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(
        ".{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    std::fs::write(&temporary, serde_json::to_vec(body).unwrap_or_default())?;
    std::fs::rename(&temporary, path)
}
