//! One configured upstream: its state, its current connection, and the task that
//! starts it, initializes it, lists its catalog and restarts it when it exits.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use adapters::handshake::{self, ClientIdentity, ServerHello};
use adapters::{StdioOptions, UpstreamConnection, UpstreamEvent};
use registry::{Kind, ToolFilter, UpstreamListing};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::UpstreamConfig;
use crate::hub::Hub;
use crate::jsonrpc::RelayError;

/// Where an upstream is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamState {
    Starting,
    Ready,
    BackingOff { until: Instant },
    Stopped,
    Disabled,
}

impl UpstreamState {
    pub fn label(&self) -> &'static str {
        match self {
            UpstreamState::Starting => "starting",
            UpstreamState::Ready => "ready",
            UpstreamState::BackingOff { .. } => "backing_off",
            UpstreamState::Stopped => "stopped",
            UpstreamState::Disabled => "disabled",
        }
    }
}

/// Restart delays: 1 s doubling to 60 s, with jitter so a fleet does not restart in step.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(60);
    /// A run that lasted this long resets the delay.
    pub const HEALTHY_RUN: Duration = Duration::from_secs(60);

    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// The delay before the next start, and the one after it.
    pub fn next_delay(&mut self, jitter_fraction: f64) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        base.mul_f64(1.0 + jitter_fraction.clamp(0.0, 0.25))
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// A configured upstream, shared by the hub, the sessions and its supervising task.
pub struct Upstream {
    pub config: UpstreamConfig,
    state: Mutex<UpstreamState>,
    connection: RwLock<Option<UpstreamConnection>>,
    hello: RwLock<Option<ServerHello>>,
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Upstream {
        let state = if config.enabled {
            UpstreamState::Starting
        } else {
            UpstreamState::Disabled
        };
        Upstream {
            config,
            state: Mutex::new(state),
            connection: RwLock::new(None),
            hello: RwLock::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn state(&self) -> UpstreamState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_state(&self, state: UpstreamState) {
        let mut current = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if current.label() != state.label() {
            tracing::info!(upstream = %self.config.name, from = current.label(), to = state.label(), "upstream state");
        }
        *current = state;
    }

    /// What the upstream said about itself when it was last initialized.
    pub fn hello(&self) -> Option<ServerHello> {
        self.hello
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The live connection, or the error a caller gets while there is none.
    pub fn connection(&self) -> Result<UpstreamConnection, RelayError> {
        let connection = self
            .connection
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match connection.as_ref() {
            Some(connection) if !connection.is_closed() => Ok(connection.clone()),
            _ => {
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
                Err(RelayError::Unavailable {
                    upstream: self.config.name.clone(),
                    state: state.label().to_string(),
                    retry_after_ms,
                })
            }
        }
    }

    fn set_connection(&self, connection: Option<UpstreamConnection>) {
        *self
            .connection
            .write()
            .unwrap_or_else(PoisonError::into_inner) = connection;
    }
}

/// The identity and capabilities plexus presents to upstreams.
pub fn client_identity() -> ClientIdentity {
    ClientIdentity {
        name: "plexus".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        // Roots are answered by plexus itself (an empty list) until clients' roots are relayed.
        capabilities: json!({"roots": {"listChanged": false}}),
    }
}

/// Keeps one upstream running until `shutdown`: start, initialize, list, serve its
/// events, and on exit restart it after a backoff delay.
pub async fn supervise(upstream: Arc<Upstream>, hub: Arc<Hub>, shutdown: CancellationToken) {
    let name = upstream.config.name.clone();
    let mut backoff = Backoff::new();
    let mut first_start = true;
    while !shutdown.is_cancelled() {
        if !first_start {
            hub.metrics()
                .upstream_restarts
                .with_label_values(&[&name])
                .inc();
        }
        first_start = false;
        upstream.set_state(UpstreamState::Starting);
        let started = Instant::now();
        run_once(&upstream, &hub, &shutdown).await;
        hub.metrics().upstream_up.with_label_values(&[&name]).set(0);
        if shutdown.is_cancelled() {
            break;
        }
        if started.elapsed() >= Backoff::HEALTHY_RUN {
            backoff.reset();
        }
        let delay = backoff.next_delay(rand::random::<f64>() * 0.25);
        upstream.set_state(UpstreamState::BackingOff {
            until: Instant::now() + delay,
        });
        tracing::warn!(upstream = %name, delay_ms = delay.as_millis() as u64, "restarting upstream after a delay");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    upstream.set_state(UpstreamState::Stopped);
}

/// One life of the upstream process. Returns when it has exited and been reaped.
async fn run_once(upstream: &Arc<Upstream>, hub: &Arc<Hub>, shutdown: &CancellationToken) {
    let config = &upstream.config;
    let name: Arc<str> = Arc::from(config.name.as_str());
    let options = StdioOptions {
        max_message_bytes: config.max_message_bytes,
        ..StdioOptions::default()
    };
    let (events_tx, events) = mpsc::channel(256);
    let connection =
        match UpstreamConnection::spawn_stdio(name.clone(), &config.launch, &options, events_tx) {
            Ok(connection) => connection,
            Err(error) => {
                tracing::error!(upstream = %name, %error, "upstream could not be started");
                return;
            }
        };
    let identity = client_identity();
    let hello = tokio::select! {
        outcome = tokio::time::timeout(config.init_timeout, handshake::initialize(&connection, &identity)) => outcome,
        _ = shutdown.cancelled() => {
            connection.shutdown().await;
            return;
        }
    };
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(error)) => {
            tracing::error!(upstream = %name, %error, stderr = ?connection.stderr_tail(), "upstream initialize failed");
            connection.shutdown().await;
            return;
        }
        Err(_) => {
            tracing::error!(upstream = %name, timeout_ms = config.init_timeout.as_millis() as u64, "upstream did not answer initialize in time");
            connection.shutdown().await;
            return;
        }
    };
    tracing::info!(
        upstream = %name,
        protocol = %hello.protocol_version,
        server = %hello.server_info,
        "upstream initialized"
    );
    *upstream
        .hello
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(hello.clone());

    match fetch_listing(&connection, config, &hello).await {
        Ok(listing) => hub.publish_listing(listing),
        Err(error) => {
            tracing::warn!(upstream = %name, %error, "listing the upstream's catalog failed")
        }
    }
    upstream.set_connection(Some(connection.clone()));
    upstream.set_state(UpstreamState::Ready);
    hub.metrics()
        .upstream_up
        .with_label_values(&[&config.name])
        .set(1);

    let refresh = Arc::new(Notify::new());
    let refresher = tokio::spawn(refresh_on_demand(
        connection.clone(),
        config.clone(),
        hello,
        hub.clone(),
        refresh.clone(),
    ));
    serve_events(&connection, events, &refresh, shutdown).await;
    refresher.abort();
    upstream.set_connection(None);
    connection.shutdown().await;
}

/// Answers what an upstream sends on its own until the connection closes.
async fn serve_events(
    connection: &UpstreamConnection,
    mut events: mpsc::Receiver<UpstreamEvent>,
    refresh: &Notify,
    shutdown: &CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = connection.closed() => return,
            event = events.recv() => match event {
                Some(event) => event,
                None => return,
            },
        };
        match event {
            UpstreamEvent::Notification(message) => {
                let method = message.get("method").and_then(Value::as_str).unwrap_or("");
                if method.ends_with("/list_changed") {
                    // Coalesced: many notifications while a listing runs cause one more listing.
                    refresh.notify_one();
                } else {
                    tracing::debug!(upstream = %connection.upstream(), method, "upstream notification not relayed");
                }
            }
            UpstreamEvent::Request(message) => answer_upstream_request(connection, message).await,
        }
    }
}

/// Requests an upstream sends to its client are answered by plexus itself for now.
async fn answer_upstream_request(connection: &UpstreamConnection, message: Value) {
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let reply = match method {
        "ping" => adapters::Reply::Result(json!({})),
        "roots/list" => adapters::Reply::Result(json!({"roots": []})),
        other => {
            tracing::warn!(upstream = %connection.upstream(), method = other, "upstream request plexus cannot relay");
            adapters::Reply::Error(json!({
                "code": crate::jsonrpc::METHOD_NOT_FOUND,
                "message": format!("plexus does not relay `{other}` to clients"),
            }))
        }
    };
    if connection.respond(id, reply).await.is_err() {
        tracing::debug!(upstream = %connection.upstream(), "upstream closed before plexus answered it");
    }
}

async fn refresh_on_demand(
    connection: UpstreamConnection,
    config: UpstreamConfig,
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

/// Lists every kind the upstream advertised.
async fn fetch_listing(
    connection: &UpstreamConnection,
    config: &UpstreamConfig,
    hello: &ServerHello,
) -> Result<UpstreamListing, handshake::HandshakeError> {
    let mut listing = UpstreamListing {
        upstream: Arc::from(config.name.as_str()),
        prefix: config.prefix.clone(),
        tool_filter: ToolFilter::new(config.allow_tools.clone(), config.deny_tools.clone()),
        tools: Vec::new(),
        prompts: Vec::new(),
        resources: Vec::new(),
        resource_templates: Vec::new(),
    };
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

    #[test]
    fn backoff_doubles_to_a_cap_and_resets() {
        let mut backoff = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| backoff.next_delay(0.0).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        backoff.reset();
        assert_eq!(backoff.next_delay(0.0), Duration::from_secs(1));
        let jittered = backoff.next_delay(0.25);
        assert_eq!(jittered, Duration::from_millis(2500));
    }
}
