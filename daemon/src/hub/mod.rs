//! The hub: the owner of the upstream set, the catalog host, the fan-out, the pins
//! and the routes kept for sessions, with what the daemon and its sessions ask of
//! them. The one relay path (`forward`) is in `relay`, the pump of supervisor
//! events in `pump`.

mod pump;
mod relay;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use adapters::Reply;
use registry::{Catalog, CatalogOptions};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use relay::CallContext;

use crate::catalog_host::CatalogHost;
use crate::config::{Config, ConfigDiff, DaemonSettings};
use crate::fanout::{Client, Fanout, TaskHolderGuard};
use crate::jsonrpc::RelayError;
use crate::logging::LogLevel;
use crate::metrics::Metrics;
use crate::pins::{Pins, Policy};
use crate::progress::ProgressRoutes;
use crate::tasks::TaskRoutes;
use crate::upstreams::{
    ApplyReport, Caller, RestartOutcome, StartSlots, Supervision, Upstream, UpstreamSet,
    UpstreamState,
};
use pump::{judged, pump};

pub struct Hub {
    upstreams: Arc<UpstreamSet>,
    catalog: Arc<CatalogHost>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    /// Cancelled as a shutdown begins, before the fronts drain: a listen stream is
    /// no work in flight, and left open it would hold the drain to its deadline.
    streams: CancellationToken,
    tasks: TaskTracker,
    /// Progress tokens plexus gave upstreams, to the call and token they stand for.
    progress: Arc<ProgressRoutes>,
    next_session: AtomicU64,
    /// Called with (configured, ready) whenever an upstream's state changes.
    status_listener: Mutex<Option<StatusListener>>,
    /// Routing of upstream messages to sessions.
    fanout: Arc<Fanout>,
    /// Task ids handed to clients, to their upstream and creating session.
    task_routes: Arc<TaskRoutes>,
    /// Each upstream's pinned fingerprints; fresh listings are checked against them.
    pins: Pins,
    /// Principal (token name) → the view it is bound to.
    view_bindings: std::sync::RwLock<BTreeMap<String, String>>,
    /// Whether a view is bound to access tokens' claims (`[views.x] claims`).
    claim_bound_views: std::sync::atomic::AtomicBool,
    /// The audit trail.
    audit: Arc<crate::audit::Audit>,
    /// `[daemon] first_list_wait`, applied live.
    first_list_wait: Mutex<Duration>,
    /// `[daemon] start_concurrency`, applied live (the supervisors share it).
    start_slots: Arc<StartSlots>,
    /// The configuration file in force and the SHA-256 of its bytes (for status).
    config_identity: Mutex<(String, String)>,
}

/// How many supervisor events may wait for the pump.
const EVENT_QUEUE: usize = 4096;

pub fn catalog_options(daemon: &DaemonSettings) -> CatalogOptions {
    CatalogOptions {
        name_budget: daemon.name_budget,
        page_size: daemon.page_size,
        expose: daemon.expose,
    }
}

impl Hub {
    /// A hub with no upstreams yet: `apply` the diff from nothing to start them.
    /// `shutdown` is the daemon's (a child of its root): cancelled, every
    /// upstream stops.
    pub fn new(config: &Config, metrics: Arc<Metrics>, shutdown: CancellationToken) -> Arc<Hub> {
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
            logins: Arc::new(crate::upstreams::login::Logins::new(
                config,
                metrics.oauth_refreshes.clone(),
            )),
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
            streams: shutdown.child_token(),
            shutdown,
            tasks,
            progress,
            next_session: AtomicU64::new(0),
            status_listener: Mutex::new(None),
            fanout,
            task_routes,
            view_bindings: std::sync::RwLock::new(BTreeMap::new()),
            claim_bound_views: std::sync::atomic::AtomicBool::new(false),
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
    /// pin file that could not be read, or that another writer changed, is read again.
    pub async fn apply(&self, diff: ConfigDiff, drain_timeout: Duration) -> ApplyReport {
        let report = self.upstreams.apply(diff, self, drain_timeout).await;
        let reread = self.pins.reread_if_changed();
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

    /// Reads the pin file again if another writer changed it (a peer sharing it, a
    /// ConfigMap updated beside an unchanged config), and judges every upstream again.
    pub fn recheck_pins(&self) {
        let Some(reread) = self.pins.reread_if_changed() else {
            return;
        };
        for (name, snapshot) in reread {
            self.pins.observe(&name, &snapshot, self.policy(&name));
        }
        for name in self.upstreams().keys() {
            self.requarantine(name);
        }
        self.report_status();
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
            // Watched before they are looked at, so no change falls in between.
            let mut waiting: Vec<_> = self
                .upstreams()
                .values()
                .filter(|upstream| which(upstream.name()))
                .map(|upstream| (upstream.shared.state_changes(), upstream.clone()))
                .filter(|(_, upstream)| self.awaits_first_listing(upstream))
                .map(|(states, _)| states)
                .collect();
            if waiting.is_empty() {
                return;
            }
            // A listing arriving, or a state change of one waited for (a start that
            // failed), ends this look; the set is looked at again after each.
            let state_changed = futures::future::select_all(
                waiting.iter_mut().map(|states| Box::pin(states.changed())),
            );
            tokio::select! {
                _ = catalogs.changed() => {}
                _ = state_changed => {}
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
            // Published, not merely installed: a request routes in what is published,
            // and one that stopped waiting in between would find nothing there.
            && !self.catalog.publishes(upstream.name())
    }

    /// The tracker of the tasks shutdown waits for.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tasks
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
        // After the upstreams stopped: no listing comes after this.
        self.catalog.flush().await;
    }

    /// Whether plexus is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Completes when plexus starts shutting down.
    pub async fn stopping(&self) {
        self.shutdown.cancelled().await
    }

    /// Ends the long-lived streams (`subscriptions/listen`): a shutdown is beginning,
    /// and their clients open them again elsewhere (another node) or once plexus is back.
    pub fn end_streams(&self) {
        self.streams.cancel();
    }

    /// Completes when the long-lived streams are to end ([`Hub::end_streams`], or the
    /// shutdown itself).
    pub async fn streams_ending(&self) {
        self.streams.cancelled().await
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
        self.claim_bound_views.store(
            views.values().any(|config| !config.claims.is_empty()),
            Ordering::Relaxed,
        );
    }

    /// Whether one URL's catalog differs by caller: a token bound to a view sees
    /// that view wherever it asks, so no list may be shared across callers.
    pub fn catalog_depends_on_caller(&self) -> bool {
        self.claim_bound_views.load(Ordering::Relaxed)
            || !self
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
        self.view_named(requested)
    }

    /// The view a path names (which must exist), else the whole catalog: what an
    /// access token's principal bound to no view by its claims sees.
    pub fn view_named(&self, requested: Option<&str>) -> Result<Option<Arc<str>>, String> {
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

    /// Whether `upstream` has a listing in the published catalog (fresh, or kept from an earlier run).
    pub fn lists(&self, upstream: &str) -> bool {
        self.catalog.publishes(upstream)
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

    /// Sessions are seen by the fan-out from now on (until `end_session`).
    pub fn register_session(&self, session: Weak<dyn Client>, id: u64) {
        self.fanout.register_session(session, id);
    }

    /// From now on the daemon serves one client, and only one (`serve --stdio`).
    pub fn serve_one_client(&self) {
        self.fanout.serve_one_client();
    }

    /// See `Fanout::client_initialized`.
    pub fn client_initialized(&self, session: &dyn Client) {
        self.fanout.client_initialized(session);
    }

    /// See `Fanout::roots_changed`.
    pub fn roots_changed(&self, session: &dyn Client) {
        self.fanout.roots_changed(session);
    }

    /// See `Fanout::offer_roots`.
    pub async fn offer_roots(&self, scope: &dyn Client) {
        self.fanout.offer_roots(scope).await;
    }

    /// See `Fanout::log_levels_changed`.
    pub async fn log_levels_changed(&self) {
        self.fanout.log_levels_changed().await;
    }

    /// The level plexus sets on upstreams now.
    pub fn current_log_level(&self) -> Option<LogLevel> {
        self.fanout.current_log_level()
    }

    /// See `Fanout::capabilities`.
    pub fn capabilities(&self, shown: impl Fn(&str) -> bool) -> Value {
        self.fanout.capabilities(shown)
    }

    /// See `Fanout::offers_tasks_extension`.
    pub fn offers_tasks_extension(&self, shown: impl Fn(&str) -> bool) -> bool {
        self.fanout.offers_tasks_extension(shown)
    }

    /// Task ids in an upstream's reply, exposed as the ids clients see (see
    /// `TaskRoutes::expose`).
    pub fn expose_tasks(&self, upstream: &str, session: Option<u64>, reply: Reply) -> Reply {
        let owner = self.fanout.task_owner(session);
        self.task_routes.expose(upstream, owner, reply)
    }

    /// The principal a task was handed to, while plexus keeps its route.
    pub fn task_principal(&self, exposed: &str) -> Option<Arc<str>> {
        self.task_routes.principal(exposed)
    }

    /// A 2026-07-28 listen (its scope `session`) hears of the task `exposed`
    /// until the scope ends.
    pub fn listen_to_task(&self, exposed: &str, session: u64) {
        self.task_routes.listen(exposed, session);
    }

    /// The upstream and its own id of the task a client knows as `exposed`, if that
    /// upstream is still configured.
    pub fn task_route(&self, exposed: &str) -> Option<(String, String)> {
        self.task_routes
            .route(exposed, |name| self.upstreams.get(name).is_some())
    }

    /// See `Fanout::hold_task`.
    pub fn hold_task(&self, upstream: &str, task: &str, holder: Caller) -> TaskHolderGuard {
        self.fanout.hold_task(upstream, task, holder)
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
    // A unit test's binary is not plexus (it has no `keeper`), and starts no child.
    if cfg!(test) {
        return None;
    }
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

/// Hears (upstreams configured, upstreams ready) at every state change.
pub type StatusListener = Box<dyn Fn(usize, usize) + Send + Sync>;

#[cfg(test)]
mod tests;
