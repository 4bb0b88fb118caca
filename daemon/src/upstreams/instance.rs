//! A configured upstream (its settings, limits and counters, which outlive any one
//! process) and its instances: the shared one, and one per session where
//! `share = "session"`. Calls find their connection here; the supervisor
//! (`supervise`) drives each instance's life.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use adapters::handshake::{ClientIdentity, ServerHello};
use adapters::stdio::ConnectionStats;
use adapters::UpstreamConnection;
use dashmap::DashMap;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::limiter::Limiter;
use super::login::Login;
use super::supervisor;
use super::Supervision;
use crate::config::{Share, Start, UpstreamConfig};
use crate::jsonrpc::RelayError;
use crate::logging::LogLevel;

/// Where an instance is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamState {
    /// Not running, and started on demand (lazy and per-session upstreams).
    Idle,
    Starting,
    Ready,
    BackingOff {
        until: Instant,
    },
    /// Restarted too often; no more starts until an explicit retry.
    Failed,
    Stopping,
    Stopped,
    Disabled,
    /// A hosted upstream refused plexus (401, a Bearer challenge) and no stored
    /// token works: waits for `plexus login NAME`.
    NeedsLogin,
}

impl UpstreamState {
    pub const LABELS: [&'static str; 9] = [
        "idle",
        "starting",
        "ready",
        "backing_off",
        "failed",
        "stopping",
        "stopped",
        "disabled",
        "needs_login",
    ];

    pub fn label(&self) -> &'static str {
        match self {
            UpstreamState::Idle => "idle",
            UpstreamState::Starting => "starting",
            UpstreamState::Ready => "ready",
            UpstreamState::BackingOff { .. } => "backing_off",
            UpstreamState::Failed => "failed",
            UpstreamState::Stopping => "stopping",
            UpstreamState::Stopped => "stopped",
            UpstreamState::Disabled => "disabled",
            UpstreamState::NeedsLogin => "needs_login",
        }
    }
}

/// One running (or startable) process of an upstream.
pub struct Instance {
    /// The upstream's name, for logs and errors.
    pub(super) name: Arc<str>,
    /// The session a per-session instance serves: what it says on its own is that
    /// session's alone.
    pub(super) owner: Option<u64>,
    /// Stop as soon as the listing is published (the discovery run of per-session upstreams).
    pub(super) stop_after_listing: bool,
    /// Started by the first call that needs it, whatever the upstream's `start`.
    on_demand: bool,
    pub(super) state: watch::Sender<UpstreamState>,
    connection: RwLock<Option<UpstreamConnection>>,
    pub(super) hello: RwLock<Option<ServerHello>>,
    pub(super) retry: Notify,
    pub(super) demand: Notify,
    last_used: std::sync::Mutex<Instant>,
    pub(super) stop: CancellationToken,
    /// Calls in flight, with the session each came from, to attribute the
    /// requests this upstream sends back.
    callers: std::sync::Mutex<Vec<Caller>>,
    next_caller: std::sync::atomic::AtomicU64,
    /// Why the last start failed, for a reload's report.
    last_error: std::sync::Mutex<Option<String>>,
    /// What `plexus status` shows of the instance's past.
    history: std::sync::Mutex<History>,
}

/// An instance's past, for `plexus status`.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// When it entered its current state.
    pub since: Option<Instant>,
    /// How often it was started again after an exit.
    pub restarts: u64,
    /// How its last run ended (an exit status, a closed connection), and the stderr
    /// lines it left.
    pub last_exit: Option<String>,
    pub stderr_tail: Vec<String>,
}

/// A call in flight on an instance.
#[derive(Clone, Debug)]
pub struct Caller {
    id: u64,
    pub session: u64,
    /// The call's own stream, where requests caused by it are sent.
    pub related: Option<mpsc::Sender<Value>>,
    /// The id the upstream knows the call by: an HTTP upstream's request sent on
    /// this call's response stream names it, which attributes it to this call.
    pub upstream_id: Option<u64>,
    /// The call's CLIENT span, when traced: the parent of its rounds with the client.
    pub trace: Option<crate::telemetry::CallTrace>,
}

impl Caller {
    /// No call: `session` itself, where a request goes that no call claims when the
    /// session is the daemon's only client.
    pub fn of_session(session: u64) -> Caller {
        Caller {
            id: 0,
            session,
            related: None,
            upstream_id: None,
            trace: None,
        }
    }
}

/// Removes a call from its instance's callers when it ends.
pub struct CallerGuard<'a> {
    instance: &'a Instance,
    id: u64,
}

impl Drop for CallerGuard<'_> {
    fn drop(&mut self) {
        self.instance
            .callers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|caller| caller.id != self.id);
    }
}

impl Instance {
    pub(super) fn new(name: Arc<str>, initial: UpstreamState, stop: CancellationToken) -> Instance {
        Instance {
            name,
            owner: None,
            stop_after_listing: false,
            on_demand: false,
            state: watch::channel(initial).0,
            connection: RwLock::new(None),
            hello: RwLock::new(None),
            retry: Notify::new(),
            demand: Notify::new(),
            last_used: std::sync::Mutex::new(Instant::now()),
            stop,
            callers: std::sync::Mutex::new(Vec::new()),
            next_caller: std::sync::atomic::AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
            history: std::sync::Mutex::new(History::default()),
        }
    }

    /// The session this instance serves alone (per-session upstreams).
    pub fn owner(&self) -> Option<u64> {
        self.owner
    }

    pub fn history(&self) -> History {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn record(&self, change: impl FnOnce(&mut History)) {
        change(&mut self.history.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Why the last start failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The running process's id (stdio upstreams) and its stderr tail.
    pub fn process(&self) -> (Option<u32>, Vec<String>) {
        match self.live_connection() {
            Some(connection) => (connection.pid(), connection.stderr_tail()),
            None => (None, Vec::new()),
        }
    }

    /// Records a call in flight, sent upstream under `upstream_id`, until the
    /// guard is dropped.
    pub fn track_call(
        &self,
        session: u64,
        related: mpsc::Sender<Value>,
        upstream_id: u64,
        trace: Option<crate::telemetry::CallTrace>,
    ) -> CallerGuard<'_> {
        let id = self.next_caller.fetch_add(1, Ordering::Relaxed);
        self.callers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Caller {
                id,
                session,
                related: Some(related),
                upstream_id: Some(upstream_id),
                trace,
            });
        CallerGuard { instance: self, id }
    }

    /// The calls in flight now.
    pub fn callers(&self) -> Vec<Caller> {
        self.callers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn state(&self) -> UpstreamState {
        *self.state.borrow()
    }

    /// The state's changes from now on.
    pub fn state_changes(&self) -> watch::Receiver<UpstreamState> {
        self.state.subscribe()
    }

    /// The state as callers and operators are told it: a ready instance whose
    /// connection has closed is stopping already (its supervisor says so a moment
    /// later), so `/readyz` never calls an upstream ready once its calls fail.
    pub fn reported_state(&self) -> UpstreamState {
        let state = self.state();
        if state == UpstreamState::Ready && self.live_connection().is_none() {
            UpstreamState::Stopping
        } else {
            state
        }
    }

    /// Whether a call starts this instance when it is idle.
    pub fn on_demand(&self) -> bool {
        self.on_demand
    }

    pub(super) fn has_call_from(&self, session: u64) -> bool {
        self.callers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|caller| caller.session == session)
    }

    pub fn hello(&self) -> Option<ServerHello> {
        self.hello
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether there is a hello and it satisfies `test`; nothing copied (calls ask per request).
    pub fn hello_is(&self, test: impl FnOnce(&ServerHello) -> bool) -> bool {
        self.hello
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(test)
    }

    pub(super) fn live_connection(&self) -> Option<UpstreamConnection> {
        let connection = self
            .connection
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        connection.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    pub(super) fn set_connection(&self, connection: Option<UpstreamConnection>) {
        *self
            .connection
            .write()
            .unwrap_or_else(PoisonError::into_inner) = connection;
    }

    pub(super) fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    pub(super) fn idle_since(&self) -> Instant {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the supervisor to start now: after a failure, during a backoff, or to
    /// restart a running instance.
    pub fn retry(&self) {
        self.retry.notify_one();
    }

    /// Sets `level` on this instance if it is ready and logs: `logging/setLevel`, or
    /// for a 2026-07-28 upstream the level every request carries.
    pub async fn apply_log_level(&self, level: LogLevel) {
        let logs = self.hello_is(|hello| hello.has_capability("logging"));
        if !logs || self.state() != UpstreamState::Ready {
            return;
        }
        let Some(connection) = self.live_connection() else {
            return;
        };
        if connection.is_per_request() {
            connection.set_request_meta_field(
                "io.modelcontextprotocol/logLevel",
                Some(Value::from(level.as_str())),
            );
            return;
        }
        let params = json!({"level": level.as_str()});
        if let Err(error) = connection.request("logging/setLevel", Some(params)).await {
            tracing::debug!(error = %adapters::error_chain(&error), "setting an upstream's log level failed");
        }
    }

    /// Records why a start failed.
    pub(super) fn fail(&self, reason: String) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    /// Waits until the instance is ready; the reason it is not, if it fails or
    /// `within` runs out first.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let mut states = self.state.subscribe();
        let waited = tokio::time::timeout(within, async {
            loop {
                let state = *states.borrow_and_update();
                match state {
                    UpstreamState::Ready => return Ok(()),
                    UpstreamState::Idle | UpstreamState::Starting => {}
                    other => {
                        let reason = self
                            .last_error
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone()
                            .unwrap_or_else(|| "see the log".into());
                        return Err(format!("it went to `{}`: {reason}", other.label()));
                    }
                }
                if states.changed().await.is_err() {
                    return Err("its supervisor ended".into());
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| Err(format!("it was not ready within {} s", within.as_secs())))
    }

    /// The error a call gets while this instance has no live connection.
    pub fn unavailable(&self) -> RelayError {
        let state = self.reported_state();
        if state == UpstreamState::NeedsLogin {
            return RelayError::NeedsLogin {
                upstream: self.name.to_string(),
            };
        }
        // When trying again can help, and after how long; a failed or disabled
        // upstream waits for an operator (retry_after_ms null, retryable false).
        let retry_after_ms = match state {
            UpstreamState::BackingOff { until } => Some(
                until
                    .saturating_duration_since(Instant::now())
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
            ),
            UpstreamState::Failed | UpstreamState::Disabled => None,
            _ => Some(1000),
        };
        RelayError::Unavailable {
            upstream: self.name.to_string(),
            state: state.label().to_string(),
            retry_after_ms,
        }
    }

    /// The connection for a call. An instance that is starting is waited for, within
    /// `wait` (the call's own deadline, or the start budget of an on-demand start);
    /// an idle on-demand instance is started and waited for; one that is backing off,
    /// failed or stopped fails at once with its state.
    pub async fn connection_for_call(
        &self,
        on_demand: bool,
        wait: Duration,
    ) -> Result<UpstreamConnection, RelayError> {
        let on_demand = on_demand || self.on_demand;
        self.touch();
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        match self.state() {
            UpstreamState::Starting => {}
            UpstreamState::Idle if on_demand => self.demand.notify_one(),
            _ => return Err(self.unavailable()),
        }
        let mut states = self.state.subscribe();
        let waited = tokio::time::timeout(wait, async {
            loop {
                match *states.borrow_and_update() {
                    UpstreamState::Ready => {
                        if let Some(connection) = self.live_connection() {
                            return Ok(connection);
                        }
                    }
                    UpstreamState::Idle | UpstreamState::Starting => {}
                    _ => return Err(self.unavailable()),
                }
                if states.changed().await.is_err() {
                    return Err(self.unavailable());
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| Err(self.unavailable()))
    }
}

/// A configured upstream: its settings, its shared instance, per-session instances,
/// and the limits and counters that outlive any one process.
pub struct Upstream {
    name: Arc<str>,
    /// Which configuration of this name it is: a replacement has a higher one, so a
    /// draining predecessor can never publish over its successor.
    generation: u64,
    /// Swapped in place by a reload that changes no process setting.
    config: RwLock<Arc<UpstreamConfig>>,
    pub shared: Arc<Instance>,
    sessions: DashMap<u64, Arc<Instance>>,
    /// How many `sessions` holds: every session's end asks every upstream, and most
    /// have none to stop (a 2026-07-28 request is a session of its own).
    session_count: AtomicUsize,
    /// Replaced when a reload changes the limits; calls already admitted keep theirs.
    limiter: RwLock<Arc<Limiter>>,
    pub stats: Arc<ConnectionStats>,
    /// What the upstream last advertised in `initialize` (kept across restarts and on disk).
    known_capabilities: RwLock<Value>,
    /// For a 2026-07-28 upstream: the (upstream's own) resource URIs clients are
    /// subscribed to, which its listen stream names.
    pub listen_uris: watch::Sender<BTreeSet<String>>,
    /// Cancelled when a removed or replaced upstream's drain time runs out: the calls
    /// it still has end with -33007.
    drained: CancellationToken,
    /// Set once it has left the set and drains: a call admitted after that goes to
    /// its successor, if it has one, never to an instance about to stop.
    retired: AtomicBool,
    /// The OAuth login of a hosted upstream that configures no `Authorization`.
    login: Option<Arc<Login>>,
    pub(super) supervision: Arc<Supervision>,
}

impl Upstream {
    pub fn new(config: UpstreamConfig, generation: u64, supervision: Arc<Supervision>) -> Upstream {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let initial = if !config.enabled {
            UpstreamState::Disabled
        } else if config.start == Start::Lazy || config.share == Share::Session {
            UpstreamState::Idle
        } else {
            UpstreamState::Starting
        };
        let login = Login::of(&config, &supervision.logins).map(Arc::new);
        let mut shared = Instance::new(name.clone(), initial, supervision.shutdown.child_token());
        shared.stop_after_listing = config.share == Share::Session;
        Upstream {
            name,
            generation,
            limiter: RwLock::new(Arc::new(Limiter::new(
                config.max_in_flight,
                config.max_pending,
            ))),
            config: RwLock::new(Arc::new(config)),
            shared: Arc::new(shared),
            sessions: DashMap::new(),
            session_count: AtomicUsize::new(0),
            stats: Arc::new(ConnectionStats::default()),
            known_capabilities: RwLock::new(Value::Null),
            listen_uris: watch::Sender::new(BTreeSet::new()),
            drained: CancellationToken::new(),
            retired: AtomicBool::new(false),
            login,
            supervision,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The OAuth login, for a hosted upstream that may need one.
    pub fn login(&self) -> Option<&Arc<Login>> {
        self.login.as_ref()
    }

    /// The settings in force now.
    pub fn config(&self) -> Arc<UpstreamConfig> {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn limiter(&self) -> Arc<Limiter> {
        self.limiter
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies settings that need no new process (see `config::UpstreamChange`).
    pub fn update_in_place(&self, config: UpstreamConfig) {
        let current = self.config();
        if (current.max_in_flight, current.max_pending)
            != (config.max_in_flight, config.max_pending)
        {
            *self.limiter.write().unwrap_or_else(PoisonError::into_inner) =
                Arc::new(Limiter::new(config.max_in_flight, config.max_pending));
        }
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
    }

    /// Starts supervising the shared instance; `listing_known` says whether the
    /// catalog already lists it (from disk), else an on-demand upstream runs once
    /// to be listed.
    pub fn start(self: &Arc<Self>, listing_known: bool) {
        if !self.config().enabled {
            tracing::info!(upstream = %self.name, "upstream disabled in config");
            return;
        }
        if self.on_demand() && !listing_known {
            self.shared.retry();
        }
        self.supervision
            .tasks
            .spawn(supervisor(self.shared.clone(), self.clone()));
    }

    /// Sets `level` on the shared instance.
    pub async fn apply_log_level(&self, level: LogLevel) {
        self.shared.apply_log_level(level).await;
    }

    /// An operator's restart of the shared instance.
    pub fn restart(&self) {
        self.shared.retry();
    }

    /// Stops every instance; the supervisors stop their processes.
    pub fn stop(&self) {
        // Per-session instances' tokens are children of the shared one's.
        self.shared.stop.cancel();
    }

    /// Waits until no admitted call remains, up to `timeout`; then the calls left
    /// end with -33007 and every instance stops.
    pub async fn drain(&self, timeout: Duration) {
        // Before the wait for idleness: a call that takes a slot after it sees this.
        self.retired.store(true, Ordering::Release);
        let limiter = self.limiter();
        if tokio::time::timeout(timeout, limiter.idle()).await.is_err() {
            tracing::warn!(upstream = %self.name, calls = limiter.in_flight(), "drain time ran out; ending the calls left");
        }
        self.drained.cancel();
        self.stop();
    }

    /// Whether it has left the set (removed, or replaced by a reload or a restart).
    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Completes when the drain time of a removed or replaced upstream has run out.
    pub async fn drained(&self) {
        self.drained.cancelled().await
    }

    /// Whether `session` has a call in flight on any instance of this upstream.
    pub fn has_call_from(&self, session: u64) -> bool {
        self.shared.has_call_from(session)
            || self
                .sessions
                .iter()
                .any(|instance| instance.value().has_call_from(session))
    }

    /// Whether the upstream speaks the handshake era (so a handshake-era client's
    /// call is never answered input_required): every instance of it speaks the era
    /// its shared (or discovery) instance chose, as the config makes them choose alike.
    pub fn speaks_handshake(&self) -> bool {
        self.shared.hello_is(|hello| !hello.is_modern())
    }

    /// Whether the shared instance speaks 2026-07-28 (per-request `_meta`, no session).
    pub fn speaks_per_request(&self) -> bool {
        self.shared.hello_is(ServerHello::is_modern)
    }

    pub fn known_capabilities(&self) -> Value {
        self.known_capabilities
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn remember_capabilities(&self, capabilities: Value) {
        *self
            .known_capabilities
            .write()
            .unwrap_or_else(PoisonError::into_inner) = capabilities;
    }

    /// Whether calls start the instance they need (instead of failing while it is down).
    pub fn on_demand(&self) -> bool {
        let config = self.config();
        config.start == Start::Lazy || config.share == Share::Session
    }

    /// The instance serving `session`, whatever era its client speaks: the shared
    /// one, or that session's own (`share = "session"`).
    pub fn instance_for(self: &Arc<Self>, session: u64) -> Arc<Instance> {
        if self.config().share == Share::Shared {
            return self.shared.clone();
        }
        self.sessions
            .entry(session)
            .or_insert_with(|| {
                self.session_count.fetch_add(1, Ordering::Relaxed);
                self.spawn_instance(session)
            })
            .clone()
    }

    /// A session's own instance, started on demand and stopped with the shared one.
    fn spawn_instance(self: &Arc<Self>, owner: u64) -> Arc<Instance> {
        let mut instance = Instance::new(
            self.name.clone(),
            UpstreamState::Idle,
            self.shared.stop.child_token(),
        );
        instance.owner = Some(owner);
        instance.on_demand = true;
        let instance = Arc::new(instance);
        self.supervision
            .tasks
            .spawn(supervisor(instance.clone(), self.clone()));
        instance
    }

    /// The instance a session already has of this per-session upstream.
    pub fn existing_instance(&self, session: u64) -> Option<Arc<Instance>> {
        self.sessions
            .get(&session)
            .map(|entry| entry.value().clone())
    }

    /// Stops the instance a session had of this upstream, if any.
    pub fn end_session(&self, session: u64) {
        if self.session_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some((_, instance)) = self.sessions.remove(&session) {
            self.session_count.fetch_sub(1, Ordering::Relaxed);
            instance.stop.cancel();
        }
    }

    pub fn session_instances(&self) -> usize {
        self.sessions.len()
    }
}

/// The identity and capabilities plexus presents to upstreams.
pub fn client_identity() -> ClientIdentity {
    ClientIdentity {
        name: "plexus".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        // What plexus can relay to clients that declare it in turn; requests for a
        // capability the calling client lacks are refused with a clear error.
        capabilities: json!({
            "roots": {"listChanged": true},
            "sampling": {"tools": {}},
            "elicitation": {"form": {}, "url": {}},
        }),
    }
}
