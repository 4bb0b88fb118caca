//! The hub: the owner of the upstream set and of the catalog host, the one path
//! by which a session's request reaches an upstream (`forward`), and the pump
//! that hands what supervisors report to the catalog, the metrics and the fan-out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use adapters::handshake::ServerHello;
use adapters::{ConnectionError, Reply, WrittenMember};
use registry::fingerprint::ListingSnapshot;
use registry::{Catalog, CatalogOptions, Route, ToolFilter, UpstreamListing};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog_host::CatalogHost;
use crate::config::{Config, ConfigDiff, DaemonSettings};
use crate::fanout::Fanout;
use crate::jsonrpc::RelayError;
use crate::metrics::Metrics;
use crate::pins::{Pins, Policy};
use crate::progress::ProgressRoutes;
use crate::tasks::TaskRoutes;
use crate::upstreams::{
    empty_listing, ApplyReport, RestartOutcome, SetHooks, StartSlots, Supervision, SupervisorEvent,
    Upstream, UpstreamSet, UpstreamState,
};

pub struct Hub {
    upstreams: Arc<UpstreamSet>,
    catalog: Arc<CatalogHost>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Progress tokens plexus gave upstreams, to the call and token they stand for.
    progress: Arc<ProgressRoutes>,
    next_session: AtomicU64,
    /// Called with (configured, ready) whenever an upstream's state changes.
    status_listener: Mutex<Option<StatusListener>>,
    /// Routing of upstream messages to sessions.
    pub fanout: Arc<Fanout>,
    /// Task ids handed to clients, to their upstream and creating session.
    pub task_routes: Arc<TaskRoutes>,
    /// Each upstream's pinned fingerprints; fresh listings are checked against them.
    pins: Pins,
    /// Principal (token name) → the view it is bound to.
    view_bindings: std::sync::RwLock<BTreeMap<String, String>>,
    /// The audit trail.
    audit: Arc<crate::audit::Audit>,
    /// `[daemon] first_list_wait`, applied live.
    first_list_wait: Mutex<Duration>,
    /// `[daemon] start_concurrency`, applied live (the supervisors share it).
    start_slots: Arc<StartSlots>,
    /// The configuration file in force and the SHA-256 of its bytes (for status).
    config_identity: Mutex<(String, String)>,
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
    /// The caller relays the result as the upstream wrote it unless it must change
    /// it, so it may come unread ([`Reply::Unread`]).
    pub result_unread: bool,
    /// A tool call's arguments as the client wrote them, not among the params:
    /// passed on unread.
    pub arguments: Option<&'a WrittenMember>,
}

/// How many supervisor events may wait for the pump.
const EVENT_QUEUE: usize = 4096;

pub fn catalog_options(daemon: &DaemonSettings) -> CatalogOptions {
    CatalogOptions {
        name_budget: daemon.name_budget,
        page_size: daemon.page_size,
    }
}

impl Hub {
    /// A hub with no upstreams yet: `apply` the diff from nothing to start them.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Arc<Hub> {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (events, receiver) = mpsc::channel(EVENT_QUEUE);
        let (log_level, log_level_receiver) = watch::channel(None);
        let progress = Arc::new(ProgressRoutes::default());
        let start_slots = Arc::new(StartSlots::new(config.daemon.start_concurrency));
        let supervision = Supervision {
            events,
            log_level: log_level_receiver,
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
            progress: progress.clone(),
            keeper: start_keeper(),
            starts: start_slots.clone(),
        };
        let upstreams = Arc::new(UpstreamSet::new(supervision));
        let catalog = Arc::new(CatalogHost::new(
            catalog_options(&config.daemon),
            config.daemon.state_dir.join("catalog"),
            metrics.clone(),
        ));
        let task_routes = Arc::new(TaskRoutes::default());
        let fanout = Arc::new(Fanout::new(
            upstreams.clone(),
            catalog.clone(),
            task_routes.clone(),
            tasks.clone(),
            log_level,
        ));
        let audit = crate::audit::Audit::new(metrics.clone());
        let pins = Pins::load(&config.daemon.pins, metrics.clone(), audit.clone());
        let hub = Arc::new(Hub {
            pins,
            upstreams,
            catalog,
            metrics,
            shutdown,
            tasks,
            progress,
            next_session: AtomicU64::new(0),
            status_listener: Mutex::new(None),
            fanout,
            task_routes,
            view_bindings: std::sync::RwLock::new(BTreeMap::new()),
            audit,
            first_list_wait: Mutex::new(config.daemon.first_list_wait),
            start_slots,
            config_identity: Mutex::new((String::new(), String::new())),
        });
        hub.tasks.spawn(pump(Arc::downgrade(&hub), receiver));
        hub
    }

    /// Brings the upstreams to a new configuration (see `UpstreamSet::apply`), and
    /// judges every upstream's catalog again under its (possibly new) pin policy (but
    /// those it added, judged as they entered, unless the pin file was read again); a
    /// pin file that could not be read is read again.
    pub async fn apply(&self, diff: ConfigDiff, drain_timeout: Duration) -> ApplyReport {
        let report = self.upstreams.apply(diff, self, drain_timeout).await;
        let reread = self.pins.reread_if_unreadable();
        let pins_reread = reread.is_some();
        for (name, snapshot) in reread.unwrap_or_default() {
            self.pins.observe(&name, &snapshot, self.policy(&name));
        }
        for name in self.upstreams().keys() {
            // An upstream this apply added was judged as it entered, under its
            // policy and the pins as they read then: judging it again would read
            // its whole listing once more.
            if pins_reread || !report.added.contains(name) {
                self.requarantine(name);
            }
        }
        self.report_status();
        report
    }

    /// The pin policy of the upstream `name` (the default one if it is gone).
    fn policy(&self, name: &str) -> Policy {
        match self.upstreams.get(name) {
            Some(upstream) => Policy::of(&upstream.config()),
            None => Policy {
                strict: false,
                on_change: crate::config::SchemaPolicy::Block,
            },
        }
    }

    /// Judges again what of `name`'s installed listing is held, and publishes it.
    fn requarantine(&self, name: &str) {
        let policy = self.policy(name);
        let rebuilt = self.catalog.update_quarantine(name, |listing| {
            judged(listing, None, |snapshot| {
                self.pins.evaluate(name, snapshot, policy)
            })
        });
        if rebuilt {
            self.share_pinned_texts(name);
        }
    }

    /// The pins of `name` take its catalog part's texts (a part just built has
    /// texts of its own).
    fn share_pinned_texts(&self, name: &str) {
        if let Some(part) = self.catalog.part(name) {
            let texts: Vec<_> = part.entry_texts().collect();
            self.pins.share_texts(name, &texts);
        }
    }

    /// Where each upstream's pin stands, with how many of its entries are held now.
    pub fn pins_status(&self) -> Result<Value, crate::pins::file::PinError> {
        let file = self.pins.file()?;
        let catalog = self.catalog();
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for kind in registry::Kind::ALL {
            for entry in catalog.held_entries(kind).values() {
                *held.entry(&entry.route.upstream).or_default() += 1;
            }
        }
        let mut status =
            crate::pins::view::status(&file, &|name, _| Some(held.get(name).copied().unwrap_or(0)));
        status["file"] = json!(self.pins.path().display().to_string());
        Ok(status)
    }

    /// What approving would accept, field by field.
    pub fn pins_diff(&self, upstream: Option<&str>) -> Result<Value, crate::pins::file::PinError> {
        crate::pins::view::diff(&self.pins.file()?, upstream)
    }

    /// Approves what is pending for `upstream` (all of it, or the entries named
    /// `name`); what was held and is now approved is listed at once.
    pub fn approve_pin(
        &self,
        upstream: &str,
        name: Option<&str>,
    ) -> Result<crate::pins::file::Approval, crate::pins::file::PinError> {
        let approval = self.pins.approve(upstream, name)?;
        self.requarantine(upstream);
        Ok(approval)
    }

    /// Forgets `upstream`'s pin: its current listing is a first sight again.
    pub fn reset_pin(&self, upstream: &str) -> Result<(), crate::pins::file::PinError> {
        self.pins.reset(upstream, self.policy(upstream))?;
        self.requarantine(upstream);
        Ok(())
    }

    /// Settings of the daemon that apply live: the catalog's naming budget and page size.
    pub fn apply_daemon_settings(&self, daemon: &DaemonSettings) {
        self.catalog.set_options(catalog_options(daemon));
        self.start_slots.resize(daemon.start_concurrency);
        *self
            .first_list_wait
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = daemon.first_list_wait;
    }

    /// Waits (up to `first_list_wait`) while an enabled upstream that starts with the
    /// daemon is still starting and has nothing listed yet, not even from its cache:
    /// a client's first list then shows its tools, for clients that never list again.
    pub async fn wait_for_first_listings(&self) {
        self.wait_for_first_listings_of(|_| true).await
    }

    /// As [`Hub::wait_for_first_listings`], for the upstreams `which` names only.
    pub async fn wait_for_first_listings_of(&self, which: impl Fn(&str) -> bool) {
        let within = *self
            .first_list_wait
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let deadline = Instant::now() + within;
        let mut catalogs = self.subscribe();
        loop {
            let waiting = self
                .upstreams()
                .values()
                .any(|upstream| which(upstream.name()) && self.awaits_first_listing(upstream));
            if !waiting {
                return;
            }
            // A listing arriving ends the wait at once; a state change (a start that
            // failed) is seen at the next look.
            tokio::select! {
                _ = catalogs.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    /// Whether `upstream` is enabled, starts with the daemon, is still starting and
    /// has nothing listed yet, not even from its cache.
    pub fn awaits_first_listing(&self, upstream: &Upstream) -> bool {
        upstream.config().enabled
            && !upstream.on_demand()
            && matches!(
                upstream.shared.state(),
                UpstreamState::Starting | UpstreamState::Idle
            )
            && !self.catalog.lists(upstream.name())
    }

    /// Runs a task that shutdown waits for.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Stops every upstream and waits until each process group is reaped and every
    /// task has ended.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Whether plexus is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Completes when plexus starts shutting down.
    pub async fn stopping(&self) {
        self.shutdown.cancelled().await
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn audit(&self) -> &Arc<crate::audit::Audit> {
        &self.audit
    }

    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Records which file is in force (at start and after each applied reload).
    pub fn set_config_identity(&self, path: &std::path::Path, sha256: &str) {
        *self
            .config_identity
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            (path.display().to_string(), sha256.to_string());
    }

    /// The configuration file in force and its SHA-256.
    pub fn config_identity(&self) -> (String, String) {
        self.config_identity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The upstreams now, as one consistent snapshot.
    pub fn upstreams(&self) -> Arc<BTreeMap<String, Arc<Upstream>>> {
        self.upstreams.snapshot()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.current()
    }

    /// Changes with every listing installed or judged anew, published or not.
    pub fn listings_installed(&self) -> watch::Receiver<u64> {
        self.catalog.installed()
    }

    /// Changes once each write of the pin file has finished.
    pub fn pin_files_written(&self) -> watch::Receiver<u64> {
        self.pins.writes()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<crate::catalog_host::Snapshot>> {
        self.catalog.subscribe()
    }

    /// The whole catalog, or the named view of it.
    pub fn catalog_for(&self, view: Option<&str>) -> Arc<Catalog> {
        self.catalog.view(view)
    }

    /// New views and their token bindings (at start and on reload).
    pub fn apply_views(&self, views: &BTreeMap<String, crate::config::ViewConfig>) {
        self.catalog.set_views(
            views
                .iter()
                .map(|(name, config)| (name.clone(), config.view.clone()))
                .collect(),
        );
        let bindings = views
            .iter()
            .flat_map(|(name, config)| {
                config
                    .tokens
                    .iter()
                    .map(move |token| (token.clone(), name.clone()))
            })
            .collect();
        *self
            .view_bindings
            .write()
            .unwrap_or_else(PoisonError::into_inner) = bindings;
    }

    /// Whether one URL's catalog differs by caller: a token bound to a view sees
    /// that view wherever it asks, so no list may be shared across callers.
    pub fn catalog_depends_on_caller(&self) -> bool {
        !self
            .view_bindings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The view a request of `principal` sees: the one its token is bound to, else
    /// the one its path names (which must exist), else the whole catalog.
    pub fn view_of(
        &self,
        principal: &str,
        requested: Option<&str>,
    ) -> Result<Option<Arc<str>>, String> {
        let bindings = self
            .view_bindings
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(bound) = bindings.get(principal) {
            return Ok(Some(Arc::from(bound.as_str())));
        }
        match requested {
            None => Ok(None),
            Some(name) if self.catalog.has_view(name) => Ok(Some(Arc::from(name))),
            Some(name) => Err(format!("there is no view `{name}`")),
        }
    }

    /// A new downstream session's id.
    pub fn open_session(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether `upstream` has a listing in the catalog (fresh, or kept from an earlier run).
    pub fn lists(&self, upstream: &str) -> bool {
        self.catalog.lists(upstream)
    }

    /// The upstream of that name, or the error a call to it gets.
    pub fn upstream_named(&self, name: &str) -> Result<Arc<Upstream>, RelayError> {
        self.upstreams.named(name)
    }

    /// Registers who hears about state changes (systemd's STATUS line).
    pub fn on_status(&self, listener: StatusListener) {
        *self
            .status_listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(listener);
        self.report_status();
    }

    fn on_state_change(&self, name: &str, state: UpstreamState) {
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
            let upstreams = self.upstreams();
            let ready = upstreams
                .values()
                .filter(|u| u.shared.state() == UpstreamState::Ready)
                .count();
            listener(upstreams.len(), ready);
        }
    }

    /// An operator's restart (see `UpstreamSet::restart`); None when there is no
    /// such enabled upstream.
    pub async fn restart(&self, name: &str, drain_timeout: Duration) -> Option<RestartOutcome> {
        let outcome = self.upstreams.restart(name, self, drain_timeout).await;
        self.report_status();
        outcome
    }

    /// One supervisor event, in the order supervisors sent them.
    fn handle(self: &Arc<Self>, event: SupervisorEvent) {
        match event {
            SupervisorEvent::State {
                upstream,
                generation,
                state,
            } => {
                if self.upstreams.is_current(&upstream, generation) {
                    self.on_state_change(&upstream, state);
                }
            }
            SupervisorEvent::Listing {
                generation,
                listing,
                capabilities,
                hello,
                installed,
            } => {
                // A removed or replaced upstream's late listing is neither kept nor shown.
                if self.catalog.accepts(&listing.upstream, generation) {
                    let name = listing.upstream.clone();
                    let policy = self.policy(&name);
                    self.catalog.save(&listing, &capabilities);
                    self.catalog.install(generation, *listing, |listing| {
                        judged(listing, Some(&hello), |snapshot| {
                            self.pins.observe(&name, snapshot, policy)
                        })
                    });
                    self.share_pinned_texts(&name);
                }
                let _ = installed.send(());
            }
            SupervisorEvent::Notification {
                upstream,
                session,
                message,
            } => self.fanout.route_notification(&upstream, session, &message),
            SupervisorEvent::Request {
                upstream,
                instance,
                connection,
                message,
                origin,
            } => {
                let id = message.get("id").cloned().unwrap_or(Value::Null);
                if let Some(reply) = self.fanout.route_upstream_request(
                    &upstream,
                    &instance,
                    &connection,
                    message,
                    origin,
                ) {
                    self.tasks.spawn(async move {
                        if connection.respond(id, reply).await.is_err() {
                            tracing::debug!(upstream = %connection.upstream(), "upstream closed before plexus answered it");
                        }
                    });
                }
            }
            SupervisorEvent::Restarted {
                upstream,
                generation,
            } => {
                if self.upstreams.is_current(&upstream, generation) {
                    self.metrics
                        .upstream_restarts
                        .with_label_values(&[&upstream])
                        .inc();
                }
            }
        }
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
            Ok(Reply::Result(_) | Reply::Unread(_)) => "ok",
            Ok(Reply::Error(_)) => "upstream_error",
            Err(error) => error.kind(),
        };
        if self.upstreams.get(upstream_name).is_some() {
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
        let mut upstream = self.upstream_named(upstream_name)?;
        if self.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        let _permit = loop {
            let config = upstream.config();
            let permit =
                upstream
                    .limiter()
                    .acquire()
                    .await
                    .ok_or_else(|| RelayError::Overloaded {
                        upstream: upstream_name.to_string(),
                        in_flight: config.max_in_flight,
                        pending: config.max_pending,
                    })?;
            // A restart or reload put a successor in its place while this call
            // waited: the call goes there, not to an instance about to stop.
            match upstream
                .retired()
                .then(|| self.upstreams.get(upstream_name))
            {
                Some(Some(next)) if next.generation() != upstream.generation() => upstream = next,
                _ => break permit,
            }
        };
        let config = upstream.config();
        let base = call
            .tool
            .and_then(|tool| config.tool_timeouts.get(tool))
            .copied()
            .unwrap_or(config.call_timeout);
        let instance = upstream.instance_for(call.owner);
        // A starting upstream is waited for within the call's own deadline (a client
        // that just launched plexus must not see its first call fail); an on-demand
        // start has its own budget.
        let on_demand = upstream.on_demand() || instance.on_demand();
        let wait = if on_demand { config.init_timeout } else { base };
        let connection = instance.connection_for_call(on_demand, wait).await?;

        // Upstreams negotiated their revision once; the per-request fields are the client's.
        crate::era::strip_request_meta(&mut params);
        // A 2026-07-28 upstream is told what the calling client can do, not what
        // plexus can (it may refuse a tool the client could not serve: -32021).
        if connection.is_per_request() {
            let mut capabilities = self.fanout.relayable_capabilities(call.session);
            // A handshake-era client's task (its `task` parameter, or a task method
            // on a task it created) is the tasks extension to this upstream.
            if crate::era::handshake_task_request(method, &mut params) {
                crate::era::declare_tasks_extension(&mut capabilities);
            }
            crate::era::set_client_capabilities(&mut params, capabilities);
        }
        // The client's progress token never reaches a shared upstream: plexus's own does.
        let progress = self.progress.register(
            &mut params,
            call.related,
            upstream.name_arc(),
            instance.owner(),
        );
        // The request gets its upstream-side id first, so whatever the upstream sends
        // while serving it (over HTTP, on this request's own stream) is attributed
        // to this call, and through it to this session.
        let request = match call.arguments {
            Some(arguments) => connection.prepare_with_member(method, params, arguments.clone()),
            None => connection.prepare(method, params),
        };
        let mut request = request.with_headers(call.headers.to_vec());
        if call.result_unread {
            request = request.result_unread();
        }
        let _caller = instance.track_call(call.session, call.related.clone(), request.id());
        let activity = progress.as_ref().map(|route| route.activity.clone());

        let call_started = Instant::now();
        let hard_deadline = call_started + base.max(config.max_call_timeout);
        let mut deadline = call_started + base;
        let request = request.send();
        tokio::pin!(request);
        let outcome = loop {
            tokio::select! {
                outcome = &mut request => break Ok(outcome.and_then(Reply::checked)),
                _ = tokio::time::sleep_until(deadline) => break Err(false),
                _ = upstream.drained() => break Err(true),
                _ = wait_for(activity.as_deref()) => {
                    // Progress shows the call is alive: give it another full deadline, up to the cap.
                    deadline = (Instant::now() + base).min(hard_deadline);
                }
            }
        };
        drop(progress);
        match outcome {
            Ok(Ok(reply)) => Ok(crate::era::answering_as_plexus(reply)),
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
            Ok(Err(error @ ConnectionError::InvalidReply { .. })) => {
                tracing::warn!(upstream = upstream_name, method, %error, "its call failed");
                Err(RelayError::FailedMidCall {
                    upstream: upstream_name.to_string(),
                    reason: error.to_string(),
                })
            }
            Ok(Err(
                error @ (ConnectionError::HttpStatus { .. }
                | ConnectionError::Broken { .. }
                | ConnectionError::Malformed { .. }),
            )) => Err(RelayError::FailedMidCall {
                upstream: upstream_name.to_string(),
                reason: error.to_string(),
            }),
            // Dropping `request` (at the end of this scope) sends the cancel upstream.
            Err(true) => Err(RelayError::Drained {
                upstream: upstream_name.to_string(),
            }),
            Err(false) => Err(RelayError::Timeout {
                upstream: upstream_name.to_string(),
                after: call_started.elapsed(),
            }),
        }
    }

    /// Counts a session's subscription to a resource (see `Fanout::subscription`)
    /// and sends what that asks of the upstream through [`Hub::forward`], like any
    /// request: under its limits and deadline, counted in the relay metrics.
    /// `related` is where requests the upstream sends while serving it go.
    pub async fn subscription(
        self: &Arc<Self>,
        session: u64,
        related: &mpsc::Sender<Value>,
        route: &Route,
        subscribe: bool,
    ) -> Result<(), RelayError> {
        let Some(request) = self.fanout.subscription(session, route, subscribe)? else {
            return Ok(());
        };
        let call = CallContext {
            session,
            owner: session,
            tool: None,
            related,
            headers: &[],
            result_unread: false,
            arguments: None,
        };
        let outcome = match self
            .forward(
                &route.upstream,
                request.method,
                Some(request.params.clone()),
                call,
            )
            .await
        {
            Ok(Reply::Result(_) | Reply::Unread(_)) => Ok(()),
            Ok(Reply::Error(error)) => Err(refused(route, request.method, &error)),
            Err(error) => Err(error),
        };
        if outcome.is_err() {
            self.fanout.subscription_failed(route, &request);
        }
        outcome
    }

    /// Forgets a session: its own instances are stopped and its subscriptions
    /// released upstream (in the background: the session is gone).
    pub fn end_session(self: &Arc<Self>, session: u64, subscriptions: Vec<String>) {
        let routes = self.fanout.end_session(session, subscriptions);
        if routes.is_empty() {
            return;
        }
        let hub = self.clone();
        self.tasks.spawn(async move {
            // Nothing the upstream sends while serving these has a client to reach.
            let (nobody, _) = mpsc::channel(1);
            for route in routes {
                let _ = hub.subscription(session, &nobody, &route, false).await;
            }
        });
    }

    /// `tasks/get`, `tasks/result`, `tasks/cancel`: routed by the task id.
    pub async fn forward_task_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        let exposed = params
            .get("taskId")
            .and_then(Value::as_str)
            .ok_or_else(|| RelayError::InvalidParams("`taskId` must be a string".into()))?
            .to_string();
        let (upstream, original) = self
            .task_routes
            .route(&exposed, |name| self.upstreams.get(name).is_some())
            .ok_or_else(|| RelayError::InvalidParams(format!("unknown task `{exposed}`")))?;
        params.insert("taskId".into(), Value::String(original));
        let session = call.session;
        let reply = self
            .forward(&upstream, method, Some(Value::Object(params)), call)
            .await?;
        Ok(self.task_routes.expose(&upstream, Some(session), reply))
    }

    /// `tasks/list`: every upstream that lists tasks, merged, ids exposed.
    pub async fn list_tasks(self: &Arc<Self>, call: CallContext<'_>) -> Result<Reply, RelayError> {
        let mut tasks = Vec::new();
        let listing: Vec<String> = self
            .upstreams()
            .values()
            .filter(|upstream| {
                upstream
                    .known_capabilities()
                    .get("tasks")
                    .and_then(|tasks| tasks.get("list"))
                    .is_some()
            })
            .map(|upstream| upstream.name().to_string())
            .collect();
        for upstream in listing {
            let context = CallContext {
                session: call.session,
                owner: call.owner,
                tool: None,
                related: call.related,
                headers: &[],
                result_unread: false,
                arguments: None,
            };
            match self
                .forward(&upstream, "tasks/list", Some(json!({})), context)
                .await
            {
                Ok(reply) => {
                    if let Reply::Result(mut result) =
                        self.task_routes.expose(&upstream, None, reply)
                    {
                        if let Some(Value::Array(found)) = result.get_mut("tasks").map(Value::take)
                        {
                            tasks.extend(found);
                        }
                    }
                }
                // One upstream being down leaves the others' tasks listed.
                Err(error) => {
                    tracing::debug!(upstream, %error, "listing an upstream's tasks failed")
                }
            }
        }
        Ok(Reply::Result(json!({ "tasks": tasks })))
    }

    /// Upstream names and the states of their shared instances.
    pub fn states(&self) -> Vec<(String, UpstreamState)> {
        self.upstreams()
            .values()
            .map(|upstream| {
                (
                    upstream.name().to_string(),
                    upstream.shared.reported_state(),
                )
            })
            .collect()
    }

    /// Brings the gauges and counters that mirror live state up to date (before a scrape).
    pub fn refresh_metrics(&self) {
        for upstream in self.upstreams().values() {
            let name = upstream.name();
            let limiter = upstream.limiter();
            self.metrics
                .upstream_in_flight
                .with_label_values(&[name])
                .set(limiter.in_flight() as i64);
            self.metrics
                .upstream_pending
                .with_label_values(&[name])
                .set(limiter.pending() as i64);
            self.metrics
                .upstream_session_instances
                .with_label_values(&[name])
                .set(upstream.session_instances() as i64);
            // Counters mirrored from the connection's own, which outlive its restarts.
            for (counter, value) in [
                (
                    &self.metrics.upstream_dropped_lines,
                    &upstream.stats.dropped_stdout_lines,
                ),
                (
                    &self.metrics.upstream_stderr_lines,
                    &upstream.stats.stderr_lines,
                ),
                (
                    &self.metrics.upstream_stderr_suppressed,
                    &upstream.stats.stderr_suppressed,
                ),
            ] {
                let counter = counter.with_label_values(&[name]);
                counter.inc_by(value.load(Ordering::Relaxed).saturating_sub(counter.get()));
            }
        }
    }
}

/// The keeper process (this binary, `plexus keeper`), which kills the upstreams'
/// process groups if the daemon dies without stopping them.
fn start_keeper() -> Option<Arc<adapters::keeper::Keeper>> {
    let program = std::env::current_exe()
        .map_err(
            |error| tracing::warn!(%error, "cannot find plexus's own binary to start its keeper"),
        )
        .ok()?;
    match adapters::keeper::Keeper::spawn(&program, &["keeper"]) {
        Ok(keeper) => Some(Arc::new(keeper)),
        Err(error) => {
            tracing::warn!(%error, "cannot start the keeper; upstreams may outlive a crash of plexus");
            None
        }
    }
}

/// An upstream refused a request plexus made on a session's behalf.
fn refused(route: &Route, method: &str, error: &Value) -> RelayError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("an error");
    RelayError::InvalidParams(format!(
        "upstream `{}` refused {method}: {message}",
        route.upstream
    ))
}

/// Hears (upstreams configured, upstreams ready) at every state change.
pub type StatusListener = Box<dyn Fn(usize, usize) + Send + Sync>;

async fn wait_for(activity: Option<&Notify>) {
    match activity {
        Some(activity) => activity.notified().await,
        None => std::future::pending().await,
    }
}

/// `listing`'s entries and instructions lent to `judge` as a snapshot (the entries
/// moved there and back, never copied: a large listing's tree of values is several
/// times its text), with what the server said of itself if it was listed afresh (a
/// listing kept from an earlier run has no name or version).
fn judged<T>(
    listing: &mut UpstreamListing,
    hello: Option<&ServerHello>,
    judge: impl FnOnce(&ListingSnapshot) -> T,
) -> T {
    let text = |key: &str| {
        hello
            .and_then(|hello| hello.server_info.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let snapshot = ListingSnapshot {
        server_name: text("name"),
        server_version: text("version"),
        instructions: match hello {
            Some(hello) => hello.instructions.clone(),
            None => listing.instructions.clone(),
        },
        tools: std::mem::take(&mut listing.tools),
        prompts: std::mem::take(&mut listing.prompts),
        resources: std::mem::take(&mut listing.resources),
        resource_templates: std::mem::take(&mut listing.resource_templates),
    };
    let judgement = judge(&snapshot);
    listing.tools = snapshot.tools;
    listing.prompts = snapshot.prompts;
    listing.resources = snapshot.resources;
    listing.resource_templates = snapshot.resource_templates;
    judgement
}

/// Hands supervisor events to the hub until shutdown.
async fn pump(hub: Weak<Hub>, mut events: mpsc::Receiver<SupervisorEvent>) {
    let Some(stopping) = hub.upgrade().map(|hub| hub.shutdown.clone()) else {
        return;
    };
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = stopping.cancelled() => None,
        };
        let (Some(event), Some(hub)) = (event, hub.upgrade()) else {
            return;
        };
        hub.handle(event);
    }
}

impl SetHooks for Hub {
    fn entered(&self, upstream: &Arc<Upstream>) -> bool {
        let name = upstream.name();
        self.on_state_change(name, upstream.shared.state());
        if self.catalog.lists(name) {
            return true;
        }
        let config = upstream.config();
        if let Some(package) = &config.unversioned_package {
            tracing::warn!(upstream = %name, package = %package, "the package names no exact version: whatever the registry serves next will run (pin it, e.g. `{package}@1.2.3`; the version running is recorded in the pin file)");
        }
        if !config.enabled {
            return false;
        }
        match self.catalog.load(empty_listing(&config)) {
            Some((listing, capabilities)) => {
                upstream.remember_capabilities(capabilities);
                // Kept from an earlier run: held as the pins say until it is listed afresh.
                let policy = Policy::of(&config);
                self.catalog
                    .install(upstream.generation(), listing, |listing| {
                        judged(listing, None, |snapshot| {
                            self.pins.evaluate(name, snapshot, policy)
                        })
                    });
                // An upstream that starts late (on demand, or after failing) would
                // otherwise keep its pins' copy of these texts until it lists.
                self.share_pinned_texts(name);
                true
            }
            None => false,
        }
    }

    fn updated(&self, upstream: &Arc<Upstream>) {
        let config = upstream.config();
        self.catalog.rename(
            upstream.name(),
            &config.prefix,
            ToolFilter::new(config.allow_tools.clone(), config.deny_tools.clone()),
        );
        self.requarantine(upstream.name());
    }

    fn batch(&self, open: bool) {
        if open {
            self.catalog.hold();
        } else {
            self.catalog.release();
        }
    }

    fn removed(&self, name: &str, generation: u64) {
        self.catalog.remove(name, generation);
        self.metrics.forget_upstream(name);
        self.fanout.forget_upstream(name);
        self.task_routes.forget_upstream(name);
        self.pins.forget(name);
    }
}
