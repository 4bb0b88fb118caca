//! The supervisor: one task per instance, a small state machine (idle → starting
//! → ready → backing off or failed → stopped) that starts the process, initializes
//! and lists it, serves what it sends, pings it, and restarts it with backoff. It
//! reports what happens as [`SupervisorEvent`]s and never calls up.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use adapters::handshake::{self, ServerHello};
use adapters::stdio::ConnectionStats;
use adapters::{
    ConnectionError, Events, HttpOptions, Reply, StdioOptions, UpstreamConnection, UpstreamEvent,
};
use registry::{CacheHint, Kind, ToolFilter, UpstreamListing};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::instance::{client_identity, Instance, Upstream, UpstreamState};
use super::restart::{RestartDecision, RestartPolicy};
use super::schedule;
use super::SupervisorEvent;
use crate::config::{Launch, UpstreamConfig};

impl Upstream {
    /// Sends an event up; the receiver is gone only at shutdown, when nobody listens.
    async fn report(&self, event: SupervisorEvent) {
        let _ = self.supervision.events.send(event).await;
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
    /// A hosted upstream refused plexus and no stored token works.
    NeedsLogin,
}

/// Keeps one instance running until it is stopped.
pub async fn supervise(instance: Arc<Instance>, upstream: Arc<Upstream>) {
    let mut policy = RestartPolicy::new(upstream.config().restart);
    let mut wait_for_demand = instance.state() == UpstreamState::Idle;
    loop {
        if wait_for_demand {
            set_state(&instance, &upstream, UpstreamState::Idle).await;
            tokio::select! {
                _ = instance.demand.notified() => {}
                _ = instance.retry.notified() => {}
                _ = instance.stop.cancelled() => break,
            }
        }
        wait_for_demand = false;
        set_state(&instance, &upstream, UpstreamState::Starting).await;
        let started = Instant::now();
        match run_once(&instance, &upstream).await {
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
            RunEnd::NeedsLogin => {
                // No restarts: only a login (which asks for a retry) helps.
                set_state(&instance, &upstream, UpstreamState::NeedsLogin).await;
                tokio::select! {
                    _ = instance.retry.notified() => policy.reset(),
                    _ = instance.stop.cancelled() => break,
                }
                continue;
            }
            RunEnd::Failed => {}
        }
        if instance.stop.is_cancelled() {
            break;
        }
        let config = upstream.config();
        policy.update(config.restart);
        match policy.on_exit(
            Instant::now(),
            started.elapsed(),
            rand::random::<f64>() * 0.25,
        ) {
            RestartDecision::After(delay) => {
                set_state(
                    &instance,
                    &upstream,
                    UpstreamState::BackingOff {
                        until: Instant::now() + delay,
                    },
                )
                .await;
                tracing::warn!(upstream = %config.name, delay_ms = delay.as_millis() as u64, "restarting upstream after a delay");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = instance.retry.notified() => policy.reset(),
                    _ = instance.stop.cancelled() => break,
                }
            }
            RestartDecision::GiveUp => {
                set_state(&instance, &upstream, UpstreamState::Failed).await;
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
        instance.record(|history| history.restarts += 1);
        upstream
            .report(SupervisorEvent::Restarted {
                upstream: upstream.name().into(),
                generation: upstream.generation(),
            })
            .await;
    }
    set_state(&instance, &upstream, UpstreamState::Stopped).await;
}

async fn set_state(instance: &Instance, upstream: &Upstream, state: UpstreamState) {
    let previous = instance.state.send_replace(state);
    if previous.label() != state.label() {
        instance.record(|history| history.since = Some(Instant::now()));
        tracing::info!(upstream = %instance.name, from = previous.label(), to = state.label(), "upstream state");
        // The upstream's state is its shared instance's; a session's own comes and
        // goes with that session.
        if instance.owner().is_none() {
            upstream
                .report(SupervisorEvent::State {
                    upstream: upstream.name().into(),
                    generation: upstream.generation(),
                    state,
                })
                .await;
        }
    }
}

/// One life of the upstream process. Returns once it has exited and been reaped.
async fn run_once(instance: &Arc<Instance>, upstream: &Arc<Upstream>) -> RunEnd {
    let config = &upstream.config();
    let name = instance.name.clone();
    let (events_tx, events) = mpsc::channel(256);
    // Progress goes straight to the call's stream from the task that read it, so a
    // call's last progress is there before its result, which takes the reply's path.
    let progress = upstream.supervision.progress.clone();
    let from = name.clone();
    let owner = instance.owner();
    let events_tx = Events::new(events_tx).with_tap(Arc::new(move |message| {
        let is_progress =
            message.get("method").and_then(Value::as_str) == Some("notifications/progress");
        if is_progress {
            progress.route(message, &from, owner);
        }
        is_progress
    }));
    // Held from the spawn (or connect) until the upstream is initialized and listed.
    let slot = tokio::select! {
        slot = upstream.supervision.starts.acquire() => slot,
        _ = instance.stop.cancelled() => return RunEnd::Stopped,
    };
    let connection = tokio::select! {
        connected = open_connection(&name, config, upstream.stats.clone(), upstream.supervision.keeper.clone(), events_tx) => connected,
        _ = instance.stop.cancelled() => return RunEnd::Stopped,
    };
    let connection = match connection {
        Ok(connection) => connection,
        Err(error) => {
            tracing::error!(upstream = %name, %error, "upstream could not be started");
            instance.fail(format!("could not be started: {error}"));
            return RunEnd::Failed;
        }
    };
    let login = upstream.login().cloned();
    if let Some(login) = &login {
        login.start(&connection).await;
    }
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
            set_state(instance, upstream, UpstreamState::Stopping).await;
            connection.shutdown().await;
            return RunEnd::Stopped;
        }
    };
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(error)) if login.is_some() && super::login::wants_login(&error) => {
            let refreshed = match &login {
                Some(login) => login.answer_refusal().await,
                None => false,
            };
            let end = if refreshed {
                RunEnd::Restart
            } else {
                let error = adapters::error_chain(&error);
                tracing::warn!(upstream = %name, %error, "the upstream wants an OAuth login: run `plexus login {name}`");
                instance.fail(format!("it needs a login: run `plexus login {name}`"));
                RunEnd::NeedsLogin
            };
            return end_run(instance, &connection, end).await;
        }
        Ok(Err(error)) => {
            let error = adapters::error_chain(&error);
            tracing::error!(upstream = %name, %error, stderr = ?connection.stderr_tail(), "upstream initialize failed");
            instance.fail(format!("initialize failed: {error}"));
            return end_run(instance, &connection, RunEnd::Failed).await;
        }
        Err(_) => {
            tracing::error!(upstream = %name, timeout_ms = config.init_timeout.as_millis() as u64, "upstream did not answer initialize in time; stopping it");
            instance.fail("it did not answer initialize in time".into());
            return end_run(instance, &connection, RunEnd::Failed).await;
        }
    };
    tracing::info!(upstream = %name, protocol = %hello.protocol_version, server = %hello.server_info, "upstream initialized");
    *instance
        .hello
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(hello.clone());

    // Every instance's listing goes through the catalog and the pin check, a
    // session's own too: what it lists is what its session is served, held or not.
    upstream.remember_capabilities(hello.capabilities.clone());
    publish_listing(&connection, upstream, &hello).await;
    drop(slot);
    if instance.stop_after_listing {
        set_state(instance, upstream, UpstreamState::Stopping).await;
        connection.shutdown().await;
        return RunEnd::Idle;
    }
    instance.touch();
    instance.set_connection(Some(connection.clone()));
    if let Some(login) = &login {
        login.started();
    }
    set_state(instance, upstream, UpstreamState::Ready).await;
    let level = *upstream.supervision.log_level.borrow();
    if let Some(level) = level {
        instance.apply_log_level(level).await;
    }

    let modern = hello.is_modern();
    let unhealthy = CancellationToken::new();
    let refresh = Arc::new(Notify::new());
    // The run's helpers end with it: the set is shut down (aborted and awaited) below.
    let mut helpers = JoinSet::new();
    helpers.spawn(refresh_on_demand(
        connection.clone(),
        upstream.clone(),
        hello,
        refresh.clone(),
    ));
    if modern {
        helpers.spawn(listen_for_changes(
            connection.clone(),
            upstream.listen_uris.subscribe(),
        ));
    }
    if !config.health_interval.is_zero() {
        helpers.spawn(health_checks(
            connection.clone(),
            config.health_interval,
            config.health_timeout,
            unhealthy.clone(),
        ));
    }
    let idle_after = upstream.on_demand().then_some(config.idle_timeout);
    let end = serve_events(
        (instance, upstream),
        &connection,
        events,
        &refresh,
        &unhealthy,
        idle_after,
    )
    .await;
    helpers.shutdown().await;
    instance.set_connection(None);
    set_state(instance, upstream, UpstreamState::Stopping).await;
    end_run(instance, &connection, end).await
}

/// Stops the connection and records how the run ended, with the stderr it left
/// (read after the process is reaped, so its last lines are in).
async fn end_run(instance: &Instance, connection: &UpstreamConnection, end: RunEnd) -> RunEnd {
    let exit = connection.shutdown().await;
    let stderr_tail = connection.stderr_tail();
    instance.record(|history| {
        history.last_exit = Some(match end {
            RunEnd::Failed => format!("ended unexpectedly ({exit})"),
            _ => format!("stopped ({exit})"),
        });
        history.stderr_tail = stderr_tail;
    });
    end
}

/// Starts the upstream's process, or connects to its URL; what it sends on its
/// own arrives on `events`.
pub async fn open_connection(
    name: &Arc<str>,
    config: &UpstreamConfig,
    stats: Arc<ConnectionStats>,
    keeper: Option<Arc<adapters::keeper::Keeper>>,
    events: Events,
) -> Result<UpstreamConnection, String> {
    match &config.launch {
        Launch::Stdio(spec) => {
            let options = StdioOptions {
                max_message_bytes: config.max_message_bytes,
                stop_grace: config.stop_grace,
                stats,
                keeper,
                ..StdioOptions::default()
            };
            UpstreamConnection::spawn_stdio(name.clone(), spec, &options, events)
                .map_err(|error| error.to_string())
        }
        Launch::Http(endpoint) => {
            let options = HttpOptions {
                max_message_bytes: config.max_message_bytes,
                connect_timeout: config.init_timeout.min(HTTP_CONNECT_TIMEOUT),
                stats,
            };
            UpstreamConnection::connect_http(name.clone(), endpoint, &options, events)
                .await
                .map_err(|error| adapters::error_chain(&error))
        }
    }
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
                Ok(Reply::Result(_) | Reply::Unread(_)) => {
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
    (instance, upstream): (&Arc<Instance>, &Arc<Upstream>),
    connection: &UpstreamConnection,
    mut events: mpsc::Receiver<UpstreamEvent>,
    refresh: &Notify,
    unhealthy: &CancellationToken,
    idle_after: Option<Duration>,
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
                    upstream
                        .report(SupervisorEvent::Notification {
                            upstream: upstream.name().into(),
                            session: instance.owner,
                            message,
                        })
                        .await;
                }
            }
            UpstreamEvent::Request { message, origin } => {
                upstream
                    .report(SupervisorEvent::Request {
                        upstream: upstream.clone(),
                        instance: instance.clone(),
                        connection: connection.clone(),
                        message,
                        origin,
                    })
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
                tracing::error!(upstream = %connection.upstream(), error = %adapters::error_chain(&error), "a health ping failed; restarting the upstream");
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
    upstream: Arc<Upstream>,
    hello: ServerHello,
    refresh: Arc<Notify>,
) {
    let mut last = Instant::now();
    loop {
        // Read each time: a reload changes the interval without a restart.
        let interval = upstream.config().schema_check_interval;
        let check = schedule::next_check(&refresh, interval, last).await;
        tracing::debug!(upstream = %upstream.name(), ?check, "listing the upstream's catalog again");
        publish_listing(&connection, &upstream, &hello).await;
        last = Instant::now();
    }
}

/// Lists the upstream and reports the listing, tagged with its generation.
async fn publish_listing(
    connection: &UpstreamConnection,
    upstream: &Upstream,
    hello: &ServerHello,
) {
    let config = upstream.config();
    match fetch_listing(connection, &config, hello).await {
        Ok(listing) => {
            // Hashing a large listing is CPU work: off the runtime's workers.
            let hashed = tokio::task::spawn_blocking(move || {
                let security = listing.security_digests();
                (listing, security)
            })
            .await;
            let Ok((listing, security)) = hashed else {
                tracing::error!(upstream = %config.name, "hashing the upstream's listing failed");
                return;
            };
            let (installed, listed) = oneshot::channel();
            upstream
                .report(SupervisorEvent::Listing {
                    generation: upstream.generation(),
                    listing: Box::new(listing),
                    security: Box::new(security),
                    capabilities: upstream.known_capabilities(),
                    hello: Box::new(hello.clone()),
                    installed,
                })
                .await;
            // Gone only when the pump is (shutdown), or the listing was refused.
            let _ = listed.await;
        }
        Err(error) => {
            tracing::warn!(upstream = %config.name, error = %adapters::error_chain(&error), "listing the upstream's catalog failed")
        }
    }
}

/// Most pages plexus reads from one upstream list.
const MAX_LIST_PAGES: usize = 1000;
/// How long connecting to an HTTP upstream (and an HTTP+SSE `endpoint` event) may take.
const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `server/discover` probe may go unanswered before the upstream counts as handshake era.
pub const DISCOVER_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// An empty listing of `config`'s upstream, ready to be filled.
pub fn empty_listing(config: &UpstreamConfig) -> UpstreamListing {
    UpstreamListing::empty(
        Arc::from(config.name.as_str()),
        config.prefix.clone(),
        ToolFilter::new(config.allow_tools.clone(), config.deny_tools.clone()),
    )
}

/// Lists every kind the upstream advertised.
pub async fn fetch_listing(
    connection: &UpstreamConnection,
    config: &UpstreamConfig,
    hello: &ServerHello,
) -> Result<UpstreamListing, handshake::HandshakeError> {
    let mut listing = empty_listing(config);
    listing.instructions = hello.instructions.clone();
    for kind in Kind::ALL {
        let capability = match kind {
            Kind::Tools => "tools",
            Kind::Prompts => "prompts",
            Kind::Resources | Kind::ResourceTemplates => "resources",
        };
        if !hello.has_capability(capability) {
            continue;
        }
        let listed = match handshake::list_all(
            connection,
            kind.list_method(),
            kind.result_key(),
            handshake::ListLimits {
                max_pages: MAX_LIST_PAGES,
                max_bytes: config.max_list_bytes,
            },
        )
        .await
        {
            Ok(listed) => listed,
            // Servers with resources but no templates answer `resources/templates/list` with -32601.
            Err(handshake::HandshakeError::Refused { .. }) if kind == Kind::ResourceTemplates => {
                continue
            }
            Err(error) => return Err(error),
        };
        let hints = listed.hints.iter().map(CacheHint::of_result);
        listing.cache[kind.index()] = Some(CacheHint::merged(hints));
        let (entries, repeated) = registry::fingerprint::first_of_each(kind, listed.entries);
        if !repeated.is_empty() {
            tracing::warn!(
                upstream = %config.name,
                kind = kind.label(),
                names = ?repeated,
                "the upstream lists entries under a name it already listed; only the first of each is kept"
            );
        }
        match kind {
            Kind::Tools => listing.tools = entries,
            Kind::Prompts => listing.prompts = entries,
            Kind::Resources => listing.resources = entries,
            Kind::ResourceTemplates => listing.resource_templates = entries,
        }
    }
    Ok(listing)
}
