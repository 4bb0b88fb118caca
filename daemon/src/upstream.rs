//! Configured upstreams and their running instances. An instance is one process
//! with its supervising task: start, initialize, list, serve events, ping, and on
//! exit restart with backoff until the restart budget is spent (then `failed`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use adapters::handshake::{self, ClientIdentity, ServerHello};
use adapters::stdio::ConnectionStats;
use adapters::{
    ConnectionError, HttpOptions, Reply, StdioOptions, UpstreamConnection, UpstreamEvent,
};
use dashmap::DashMap;
use registry::{Kind, ToolFilter, UpstreamListing};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Launch, RestartSettings, Share, Start, UpstreamConfig};
use crate::hub::Hub;
use crate::jsonrpc::RelayError;

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
}

impl UpstreamState {
    pub const LABELS: [&'static str; 8] = [
        "idle",
        "starting",
        "ready",
        "backing_off",
        "failed",
        "stopping",
        "stopped",
        "disabled",
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
        }
    }
}

/// What to do after an instance exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartDecision {
    After(Duration),
    GiveUp,
}

/// Exponential backoff with jitter and a cap, and a budget of exits per window.
#[derive(Debug)]
pub struct RestartPolicy {
    settings: RestartSettings,
    next_delay: Duration,
    recent_exits: VecDeque<Instant>,
}

impl RestartPolicy {
    /// A run that lasted this long resets the delay.
    pub const HEALTHY_RUN: Duration = Duration::from_secs(60);

    pub fn new(settings: RestartSettings) -> RestartPolicy {
        RestartPolicy {
            settings,
            next_delay: settings.backoff,
            recent_exits: VecDeque::new(),
        }
    }

    /// Records an exit at `now` after a run of `ran_for`; `jitter` in 0..=0.25.
    pub fn on_exit(&mut self, now: Instant, ran_for: Duration, jitter: f64) -> RestartDecision {
        if ran_for >= Self::HEALTHY_RUN {
            self.next_delay = self.settings.backoff;
        }
        self.recent_exits.push_back(now);
        while self
            .recent_exits
            .front()
            .is_some_and(|exit| now.duration_since(*exit) > self.settings.window)
        {
            self.recent_exits.pop_front();
        }
        if self.recent_exits.len() > self.settings.max_restarts {
            return RestartDecision::GiveUp;
        }
        let delay = self.next_delay;
        self.next_delay = (self.next_delay * 2).min(self.settings.backoff_max);
        RestartDecision::After(delay.mul_f64(1.0 + jitter.clamp(0.0, 0.25)))
    }

    /// A fresh start (an operator's retry, or a clean idle stop).
    pub fn reset(&mut self) {
        self.next_delay = self.settings.backoff;
        self.recent_exits.clear();
    }
}

/// Bounds the calls one upstream has in flight and waiting.
pub struct Limiter {
    permits: Arc<Semaphore>,
    /// The semaphore's size, to tell how many permits are out.
    max_in_flight: usize,
    waiting: AtomicUsize,
    max_pending: usize,
}

impl Limiter {
    fn new(max_in_flight: usize, max_pending: usize) -> Limiter {
        Limiter {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            waiting: AtomicUsize::new(0),
            max_pending,
        }
    }

    /// A slot for one call, waiting in line when all are taken; `None` when the line is full.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_pending {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // The counter is decremented even if this future is dropped while waiting.
        let _waiting = DecrementOnDrop(&self.waiting);
        self.permits.clone().acquire_owned().await.ok()
    }

    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    pub fn pending(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

struct DecrementOnDrop<'a>(&'a AtomicUsize);

impl Drop for DecrementOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One running (or startable) process of an upstream.
pub struct Instance {
    /// The upstream's name, for logs and errors.
    name: Arc<str>,
    /// Whether this instance's listings feed the catalog (per-session ones do not).
    publishes_listing: bool,
    /// Stop as soon as the listing is published (the discovery run of per-session upstreams).
    stop_after_listing: bool,
    state: watch::Sender<UpstreamState>,
    connection: RwLock<Option<UpstreamConnection>>,
    hello: RwLock<Option<ServerHello>>,
    retry: Notify,
    demand: Notify,
    last_used: std::sync::Mutex<Instant>,
    stop: CancellationToken,
    /// Calls in flight, with the session each came from, to attribute the
    /// requests this upstream sends back.
    callers: std::sync::Mutex<Vec<Caller>>,
    next_caller: std::sync::atomic::AtomicU64,
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
}

impl Caller {
    /// A session with no particular call (a request that arrived between calls).
    pub fn for_session(session: u64) -> Caller {
        Caller {
            id: u64::MAX,
            session,
            related: None,
            upstream_id: None,
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
    fn new(name: Arc<str>, initial: UpstreamState, stop: CancellationToken) -> Instance {
        Instance {
            name,
            publishes_listing: true,
            stop_after_listing: false,
            state: watch::channel(initial).0,
            connection: RwLock::new(None),
            hello: RwLock::new(None),
            retry: Notify::new(),
            demand: Notify::new(),
            last_used: std::sync::Mutex::new(Instant::now()),
            stop,
            callers: std::sync::Mutex::new(Vec::new()),
            next_caller: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Records a call in flight, sent upstream under `upstream_id`, until the
    /// guard is dropped.
    pub fn track_call(
        &self,
        session: u64,
        related: mpsc::Sender<Value>,
        upstream_id: u64,
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

    fn has_call_from(&self, session: u64) -> bool {
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

    fn live_connection(&self) -> Option<UpstreamConnection> {
        let connection = self
            .connection
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        connection.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    fn set_connection(&self, connection: Option<UpstreamConnection>) {
        *self
            .connection
            .write()
            .unwrap_or_else(PoisonError::into_inner) = connection;
    }

    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn idle_since(&self) -> Instant {
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

    /// The error a call gets while this instance has no live connection.
    pub fn unavailable(&self) -> RelayError {
        let state = self.state();
        let retry_after_ms = match state {
            UpstreamState::BackingOff { until } => Some(
                until
                    .saturating_duration_since(Instant::now())
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
            ),
            UpstreamState::Starting => Some(1000),
            _ => None,
        };
        RelayError::Unavailable {
            upstream: self.name.to_string(),
            state: state.label().to_string(),
            retry_after_ms,
        }
    }

    /// The connection for a call. An eager instance that is not ready fails fast; an
    /// on-demand instance is started and waited for, within `init_timeout`.
    pub async fn connection_for_call(
        &self,
        on_demand: bool,
        init_timeout: Duration,
    ) -> Result<UpstreamConnection, RelayError> {
        self.touch();
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        let startable = matches!(self.state(), UpstreamState::Idle | UpstreamState::Starting);
        if !on_demand || !startable {
            return Err(self.unavailable());
        }
        self.demand.notify_one();
        let mut states = self.state.subscribe();
        let waited = tokio::time::timeout(init_timeout, async {
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
    pub config: Arc<UpstreamConfig>,
    pub shared: Arc<Instance>,
    sessions: DashMap<u64, Arc<Instance>>,
    pub limiter: Limiter,
    pub stats: Arc<ConnectionStats>,
    /// What the upstream last advertised in `initialize` (kept across restarts and on disk).
    known_capabilities: RwLock<Value>,
    /// For a 2026-07-28 upstream: the (upstream's own) resource URIs clients are
    /// subscribed to, which its listen stream names.
    pub listen_uris: watch::Sender<BTreeSet<String>>,
}

impl Upstream {
    pub fn new(config: UpstreamConfig, shutdown: &CancellationToken) -> Upstream {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let initial = if !config.enabled {
            UpstreamState::Disabled
        } else if config.start == Start::Lazy || config.share == Share::Session {
            UpstreamState::Idle
        } else {
            UpstreamState::Starting
        };
        let mut shared = Instance::new(name, initial, shutdown.child_token());
        shared.stop_after_listing = config.share == Share::Session;
        Upstream {
            limiter: Limiter::new(config.max_in_flight, config.max_pending),
            config: Arc::new(config),
            shared: Arc::new(shared),
            sessions: DashMap::new(),
            stats: Arc::new(ConnectionStats::default()),
            known_capabilities: RwLock::new(Value::Null),
            listen_uris: watch::Sender::new(BTreeSet::new()),
        }
    }

    /// Whether `session` has a call in flight on any instance of this upstream.
    pub fn has_call_from(&self, session: u64) -> bool {
        self.shared.has_call_from(session)
            || self
                .sessions
                .iter()
                .any(|instance| instance.value().has_call_from(session))
    }

    /// Whether the shared instance speaks 2026-07-28 (per-request `_meta`, no session).
    pub fn speaks_per_request(&self) -> bool {
        self.shared.hello().is_some_and(|hello| hello.is_modern())
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

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether calls start the instance they need (instead of failing while it is down).
    pub fn on_demand(&self) -> bool {
        self.config.start == Start::Lazy || self.config.share == Share::Session
    }

    /// The instance serving `session`: the shared one, or that session's own.
    pub fn instance_for(self: &Arc<Self>, session: u64, hub: &Arc<Hub>) -> Arc<Instance> {
        if self.config.share == Share::Shared {
            return self.shared.clone();
        }
        self.sessions
            .entry(session)
            .or_insert_with(|| {
                let mut instance = Instance::new(
                    Arc::from(self.config.name.as_str()),
                    UpstreamState::Idle,
                    self.shared.stop.child_token(),
                );
                instance.publishes_listing = false;
                let instance = Arc::new(instance);
                hub.spawn(supervise(instance.clone(), self.clone(), hub.clone()));
                instance
            })
            .clone()
    }

    /// The instance a session already has of this per-session upstream.
    pub fn existing_instance(&self, session: u64) -> Option<Arc<Instance>> {
        self.sessions
            .get(&session)
            .map(|entry| entry.value().clone())
    }

    /// Stops the instance a session had of this upstream, if any.
    pub fn end_session(&self, session: u64) {
        if let Some((_, instance)) = self.sessions.remove(&session) {
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

/// How one run of an instance ended.
#[derive(Debug, PartialEq, Eq)]
enum RunEnd {
    /// Stopped on request (shutdown, session end): no restart.
    Stopped,
    /// Idle for `idle_timeout` (or done discovering): stopped cleanly, restarts on demand.
    Idle,
    /// An operator asked for a restart.
    Restart,
    /// The process exited, failed to start, or stopped answering.
    Failed,
}

/// Keeps one instance running until it is stopped.
pub async fn supervise(instance: Arc<Instance>, upstream: Arc<Upstream>, hub: Arc<Hub>) {
    let config = upstream.config.clone();
    let mut policy = RestartPolicy::new(config.restart);
    let mut wait_for_demand = instance.state() == UpstreamState::Idle;
    loop {
        if wait_for_demand {
            set_state(&instance, &hub, UpstreamState::Idle);
            tokio::select! {
                _ = instance.demand.notified() => {}
                _ = instance.retry.notified() => {}
                _ = instance.stop.cancelled() => break,
            }
        }
        wait_for_demand = false;
        set_state(&instance, &hub, UpstreamState::Starting);
        let started = Instant::now();
        match run_once(&instance, &upstream, &hub).await {
            RunEnd::Stopped => break,
            RunEnd::Idle => {
                policy.reset();
                wait_for_demand = true;
                continue;
            }
            RunEnd::Restart => {
                policy.reset();
                continue;
            }
            RunEnd::Failed => {}
        }
        if instance.stop.is_cancelled() {
            break;
        }
        match policy.on_exit(
            Instant::now(),
            started.elapsed(),
            rand::random::<f64>() * 0.25,
        ) {
            RestartDecision::After(delay) => {
                set_state(
                    &instance,
                    &hub,
                    UpstreamState::BackingOff {
                        until: Instant::now() + delay,
                    },
                );
                tracing::warn!(upstream = %config.name, delay_ms = delay.as_millis() as u64, "restarting upstream after a delay");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = instance.retry.notified() => policy.reset(),
                    _ = instance.stop.cancelled() => break,
                }
            }
            RestartDecision::GiveUp => {
                set_state(&instance, &hub, UpstreamState::Failed);
                tracing::error!(
                    upstream = %config.name,
                    max_restarts = config.restart.max_restarts,
                    window_s = config.restart.window.as_secs(),
                    "upstream restarted too often; it stays failed until a reload or POST /upstreams/{}/restart",
                    config.name
                );
                tokio::select! {
                    _ = instance.retry.notified() => policy.reset(),
                    _ = instance.stop.cancelled() => break,
                }
            }
        }
        hub.metrics()
            .upstream_restarts
            .with_label_values(&[&config.name])
            .inc();
    }
    set_state(&instance, &hub, UpstreamState::Stopped);
}

fn set_state(instance: &Instance, hub: &Hub, state: UpstreamState) {
    let previous = instance.state.send_replace(state);
    if previous.label() != state.label() {
        tracing::info!(upstream = %instance.name, from = previous.label(), to = state.label(), "upstream state");
        if instance.publishes_listing {
            hub.on_state_change(&instance.name, state);
        }
    }
}

/// One life of the upstream process. Returns once it has exited and been reaped.
async fn run_once(instance: &Arc<Instance>, upstream: &Arc<Upstream>, hub: &Arc<Hub>) -> RunEnd {
    let config = &upstream.config;
    let name = instance.name.clone();
    let (events_tx, events) = mpsc::channel(256);
    let connection = match &config.launch {
        Launch::Stdio(spec) => {
            let options = StdioOptions {
                max_message_bytes: config.max_message_bytes,
                stop_grace: config.stop_grace,
                stats: upstream.stats.clone(),
                ..StdioOptions::default()
            };
            UpstreamConnection::spawn_stdio(name.clone(), spec, &options, events_tx)
                .map_err(|error| error.to_string())
        }
        Launch::Http(endpoint) => {
            let options = HttpOptions {
                max_message_bytes: config.max_message_bytes,
                connect_timeout: config.init_timeout.min(HTTP_CONNECT_TIMEOUT),
                stats: upstream.stats.clone(),
            };
            let connecting =
                UpstreamConnection::connect_http(name.clone(), endpoint, &options, events_tx);
            tokio::select! {
                connected = connecting => connected.map_err(|error| error.to_string()),
                _ = instance.stop.cancelled() => return RunEnd::Stopped,
            }
        }
    };
    let connection = match connection {
        Ok(connection) => connection,
        Err(error) => {
            tracing::error!(upstream = %name, %error, "upstream could not be started");
            return RunEnd::Failed;
        }
    };
    let identity = client_identity();
    // A handshake-era upstream that ignores the probe costs at most this much of its start.
    let probe_timeout = config.init_timeout.min(DISCOVER_PROBE_TIMEOUT);
    let start = handshake::connect(
        &connection,
        &identity,
        config.protocol.for_adapter(),
        probe_timeout,
    );
    let hello = tokio::select! {
        outcome = tokio::time::timeout(config.init_timeout, start) => outcome,
        _ = instance.stop.cancelled() => {
            set_state(instance, hub, UpstreamState::Stopping);
            connection.shutdown().await;
            return RunEnd::Stopped;
        }
    };
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(error)) => {
            tracing::error!(upstream = %name, %error, stderr = ?connection.stderr_tail(), "upstream initialize failed");
            connection.shutdown().await;
            return RunEnd::Failed;
        }
        Err(_) => {
            tracing::error!(upstream = %name, timeout_ms = config.init_timeout.as_millis() as u64, "upstream did not answer initialize in time; stopping it");
            connection.shutdown().await;
            return RunEnd::Failed;
        }
    };
    tracing::info!(upstream = %name, protocol = %hello.protocol_version, server = %hello.server_info, "upstream initialized");
    *instance
        .hello
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(hello.clone());

    if instance.publishes_listing {
        upstream.remember_capabilities(hello.capabilities.clone());
        match fetch_listing(&connection, config, &hello).await {
            Ok(listing) => hub.publish_listing(listing),
            Err(error) => {
                tracing::warn!(upstream = %name, %error, "listing the upstream's catalog failed")
            }
        }
    }
    if instance.stop_after_listing {
        set_state(instance, hub, UpstreamState::Stopping);
        connection.shutdown().await;
        return RunEnd::Idle;
    }
    instance.touch();
    instance.set_connection(Some(connection.clone()));
    set_state(instance, hub, UpstreamState::Ready);
    if let Some(level) = hub.current_log_level() {
        hub.apply_log_level(instance, level).await;
    }

    let modern = hello.is_modern();
    let unhealthy = CancellationToken::new();
    let refresh = Arc::new(Notify::new());
    let mut helpers = Vec::new();
    if instance.publishes_listing {
        helpers.push(tokio::spawn(refresh_on_demand(
            connection.clone(),
            config.clone(),
            hello,
            hub.clone(),
            refresh.clone(),
        )));
    }
    if modern && instance.publishes_listing {
        helpers.push(tokio::spawn(listen_for_changes(
            connection.clone(),
            upstream.listen_uris.subscribe(),
        )));
    }
    if !config.health_interval.is_zero() {
        helpers.push(tokio::spawn(health_checks(
            connection.clone(),
            config.health_interval,
            config.health_timeout,
            unhealthy.clone(),
        )));
    }
    let idle_after = upstream.on_demand().then_some(config.idle_timeout);
    let end = serve_events(
        (instance, upstream),
        &connection,
        events,
        &refresh,
        &unhealthy,
        idle_after,
        hub,
    )
    .await;
    for helper in helpers {
        helper.abort();
    }
    instance.set_connection(None);
    set_state(instance, hub, UpstreamState::Stopping);
    connection.shutdown().await;
    end
}

/// A 2026-07-28 upstream sends list changes and resource updates only on a
/// `subscriptions/listen` stream: keep one open, reopened whenever the set of
/// subscribed URIs changes. Its notifications arrive with the upstream's other
/// messages.
async fn listen_for_changes(
    connection: UpstreamConnection,
    mut uris: watch::Receiver<BTreeSet<String>>,
) {
    loop {
        let current: Vec<String> = uris.borrow_and_update().iter().cloned().collect();
        let params = json!({"notifications": {
            "toolsListChanged": true,
            "promptsListChanged": true,
            "resourcesListChanged": true,
            "resourceSubscriptions": current,
        }});
        // Dropping the request (a changed set) cancels the stream upstream.
        let listening = connection.request("subscriptions/listen", Some(params));
        tokio::select! {
            outcome = listening => match outcome {
                Ok(Reply::Error(error)) => {
                    tracing::debug!(upstream = %connection.upstream(), %error, "upstream refused subscriptions/listen");
                    // Asking again only helps once there is something new to ask for.
                    if uris.changed().await.is_err() {
                        return;
                    }
                }
                Ok(Reply::Result(_)) => {
                    tracing::debug!(upstream = %connection.upstream(), "upstream ended its listen stream; reopening");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(_) => return,
            },
            changed = uris.changed() => if changed.is_err() { return },
        }
    }
}

/// Serves what the upstream sends on its own until the run ends.
async fn serve_events(
    (instance, upstream): (&Instance, &Upstream),
    connection: &UpstreamConnection,
    mut events: mpsc::Receiver<UpstreamEvent>,
    refresh: &Notify,
    unhealthy: &CancellationToken,
    idle_after: Option<Duration>,
    hub: &Hub,
) -> RunEnd {
    loop {
        let idle_deadline = idle_after.map(|idle| instance.idle_since() + idle);
        let event = tokio::select! {
            _ = instance.stop.cancelled() => return RunEnd::Stopped,
            _ = instance.retry.notified() => {
                tracing::info!(upstream = %instance.name, "restart requested");
                return RunEnd::Restart;
            }
            _ = unhealthy.cancelled() => return RunEnd::Failed,
            _ = connection.closed() => return RunEnd::Failed,
            _ = sleep_until_or_forever(idle_deadline) => {
                if connection.in_flight() > 0 {
                    // A call longer than the idle timeout is use, not idleness.
                    instance.touch();
                } else if idle_deadline == idle_after.map(|idle| instance.idle_since() + idle) {
                    tracing::info!(upstream = %instance.name, "stopping idle upstream");
                    return RunEnd::Idle;
                }
                continue;
            }
            event = events.recv() => match event {
                Some(event) => event,
                None => return RunEnd::Failed,
            },
        };
        match event {
            UpstreamEvent::Notification(message) => {
                let method = message.get("method").and_then(Value::as_str).unwrap_or("");
                if method.ends_with("/list_changed") {
                    // Coalesced: many notifications while a listing runs cause one more listing.
                    refresh.notify_one();
                } else {
                    hub.route_notification(&instance.name, &message);
                }
            }
            UpstreamEvent::Request { message, origin } => {
                hub.route_upstream_request(upstream, instance, connection, message, origin)
                    .await
            }
        }
    }
}

async fn sleep_until_or_forever(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Pings on a timer; an upstream that stops answering is restarted.
async fn health_checks(
    connection: UpstreamConnection,
    interval: Duration,
    timeout: Duration,
    unhealthy: CancellationToken,
) {
    let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        ticks.tick().await;
        match tokio::time::timeout(timeout, connection.request("ping", None)).await {
            Ok(Ok(_)) => {}
            // A closed connection ends the run anyway.
            Ok(Err(
                ConnectionError::Closed
                | ConnectionError::NotSent
                | ConnectionError::Unreachable { .. },
            )) => return,
            Ok(Err(error)) => {
                tracing::error!(upstream = %connection.upstream(), %error, "a health ping failed; restarting the upstream");
                unhealthy.cancel();
                return;
            }
            Err(_) => {
                tracing::error!(upstream = %connection.upstream(), timeout_ms = timeout.as_millis() as u64, "upstream did not answer a health ping; restarting it");
                unhealthy.cancel();
                return;
            }
        }
    }
}

async fn refresh_on_demand(
    connection: UpstreamConnection,
    config: Arc<UpstreamConfig>,
    hello: ServerHello,
    hub: Arc<Hub>,
    refresh: Arc<Notify>,
) {
    loop {
        refresh.notified().await;
        match fetch_listing(&connection, &config, &hello).await {
            Ok(listing) => hub.publish_listing(listing),
            Err(error) => {
                tracing::warn!(upstream = %config.name, %error, "re-listing the upstream's catalog failed")
            }
        }
    }
}

/// Most pages plexus reads from one upstream list.
const MAX_LIST_PAGES: usize = 1000;
/// How long connecting to an HTTP upstream (and an HTTP+SSE `endpoint` event) may take.
const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `server/discover` probe may go unanswered before the upstream counts as handshake era.
const DISCOVER_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// An empty listing of `config`'s upstream, ready to be filled.
pub fn empty_listing(config: &UpstreamConfig) -> UpstreamListing {
    UpstreamListing {
        upstream: Arc::from(config.name.as_str()),
        prefix: config.prefix.clone(),
        tool_filter: ToolFilter::new(config.allow_tools.clone(), config.deny_tools.clone()),
        tools: Vec::new(),
        prompts: Vec::new(),
        resources: Vec::new(),
        resource_templates: Vec::new(),
    }
}

/// Lists every kind the upstream advertised.
async fn fetch_listing(
    connection: &UpstreamConnection,
    config: &UpstreamConfig,
    hello: &ServerHello,
) -> Result<UpstreamListing, handshake::HandshakeError> {
    let mut listing = empty_listing(config);
    for kind in Kind::ALL {
        let capability = match kind {
            Kind::Tools => "tools",
            Kind::Prompts => "prompts",
            Kind::Resources | Kind::ResourceTemplates => "resources",
        };
        if !hello.has_capability(capability) {
            continue;
        }
        let entries = match handshake::list_all(
            connection,
            kind.list_method(),
            kind.result_key(),
            MAX_LIST_PAGES,
        )
        .await
        {
            Ok(entries) => entries,
            // Servers with resources but no templates answer `resources/templates/list` with -32601.
            Err(handshake::HandshakeError::Refused { .. }) if kind == Kind::ResourceTemplates => {
                Vec::new()
            }
            Err(error) => return Err(error),
        };
        match kind {
            Kind::Tools => listing.tools = entries,
            Kind::Prompts => listing.prompts = entries,
            Kind::Resources => listing.resources = entries,
            Kind::ResourceTemplates => listing.resource_templates = entries,
        }
    }
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RestartSettings {
        RestartSettings {
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_restarts: 5,
            window: Duration::from_secs(120),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_loop_backs_off_then_gives_up() {
        let mut policy = RestartPolicy::new(settings());
        let mut delays = Vec::new();
        // Each run dies at once; the clock moves by each delay, as the supervisor sleeps it.
        let decision = loop {
            match policy.on_exit(Instant::now(), Duration::from_millis(10), 0.0) {
                RestartDecision::After(delay) => {
                    delays.push(delay.as_secs());
                    tokio::time::advance(delay).await;
                }
                give_up => break give_up,
            }
        };
        assert_eq!(delays, vec![1, 2, 4, 8, 16]);
        assert_eq!(decision, RestartDecision::GiveUp);
        policy.reset();
        assert_eq!(
            policy.on_exit(Instant::now(), Duration::ZERO, 0.0),
            RestartDecision::After(Duration::from_secs(1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn exits_spread_beyond_the_window_never_give_up_and_long_runs_reset_the_delay() {
        let mut policy = RestartPolicy::new(settings());
        for _ in 0..20 {
            let decision = policy.on_exit(Instant::now(), Duration::from_secs(61), 0.0);
            assert_eq!(decision, RestartDecision::After(Duration::from_secs(1)));
            tokio::time::advance(Duration::from_secs(61)).await;
        }
        let mut capped = RestartPolicy::new(RestartSettings {
            max_restarts: 100,
            ..settings()
        });
        let delays: Vec<u64> = (0..9)
            .map(
                |_| match capped.on_exit(Instant::now(), Duration::ZERO, 0.0) {
                    RestartDecision::After(delay) => delay.as_secs(),
                    RestartDecision::GiveUp => 0,
                },
            )
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(
            capped.on_exit(Instant::now(), Duration::ZERO, 0.25),
            RestartDecision::After(Duration::from_secs(75))
        );
    }

    #[tokio::test]
    async fn the_limiter_queues_up_to_max_pending_then_refuses() {
        let limiter = Arc::new(Limiter::new(2, 1));
        let first = limiter.acquire().await;
        let second = limiter.acquire().await;
        assert!(first.is_some() && second.is_some());
        assert_eq!(limiter.in_flight(), 2);
        let waiting = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire().await.is_some() })
        };
        while limiter.pending() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(limiter.acquire().await.is_none(), "the line is full");
        drop(first);
        assert!(waiting.await.unwrap_or(false));
        assert_eq!(limiter.pending(), 0);
    }
}
