//! A downstream session: one MCP client, whichever front it came through. It
//! answers the lifecycle and list methods from the catalog snapshot and routes
//! everything else to the owning upstream by table lookup.

mod audit_lines;
mod client_bound;
mod dispatch;
mod forward;
mod held_tasks;
mod in_flight;
mod lists;
mod routing;
mod scoped;
mod search;
mod task_extension;

pub use scoped::Continuations;

use audit_lines::SessionAudit;
use client_bound::ClientBoundRequests;
use dispatch::Dispatch;
use forward::Forwarder;
use in_flight::InFlight;
use lists::Lister;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use adapters::{Reply, UpstreamConnection};
use registry::Kind;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client_message::ClientMessage;
use crate::era::bridge::{InputNeeded, ScopeChannels};
use crate::era::{self, Era, RequestMeta};
use crate::fanout::Client;
use crate::hub::{CallContext, Hub};
use crate::jsonrpc::{self, Envelope, RelayError};
use crate::logging::LogLevel;
use crate::telemetry;

/// Protocol revisions plexus serves to clients, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
pub const LATEST_VERSION: &str = "2025-11-25";
/// Messages a session sends outside any request's stream, queued for its client.
const OUTBOUND_QUEUE: usize = 64;
/// Upstream requests (sampling, elicitation, roots) that may wait on one client at
/// once, or on one 2026-07-28 request's retry; beyond, an upstream's next one is
/// refused at once, so a flood of them holds no more.
const MAX_CLIENT_BOUND: usize = 128;
/// Resources one session may be subscribed to: any URI under an upstream's
/// namespace routes, so without a bound one client could grow the session's set
/// (and the upstreams' subscription counts) for as long as it stays.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 1000;

/// What a client told plexus in `initialize`.
#[derive(Clone, Debug, Default)]
pub struct ClientHello {
    pub protocol_version: Option<String>,
    /// Shared: every call to a 2026-07-28 upstream reads them.
    pub capabilities: Arc<Value>,
}

impl ClientHello {
    /// Whether it declared a capability (`sampling`, `elicitation`, `roots`).
    fn has_capability(&self, path: &[&str]) -> bool {
        let mut value: &Value = &self.capabilities;
        for key in path {
            match value.get(key) {
                Some(inner) if !inner.is_null() => value = inner,
                _ => return false,
            }
        }
        true
    }
}

pub struct Session {
    id: u64,
    /// The session's id as its requests' SERVER spans name it.
    span_tag: crate::telemetry::SessionTag,
    /// Whose per-session upstream instances this session's calls use: its own, or
    /// for the scope of a 2026-07-28 request, the connection's it arrived on.
    owner: u64,
    hub: Arc<Hub>,
    hello: Mutex<ClientHello>,
    /// Requests being served, by the JSON text of the client's id, so a cancel can reach them.
    in_flight: InFlight,
    /// Messages plexus sends on its own, outside any request's stream.
    outbound: mpsc::Sender<Value>,
    closed: CancellationToken,
    /// The level set by `logging/setLevel`; no log messages until then.
    log_level: Mutex<Option<LogLevel>>,
    /// Exposed URIs this client subscribed to.
    subscriptions: Mutex<HashSet<String>>,
    /// Server-to-client requests awaiting this client's answer, by the id plexus gave them.
    client_bound: ClientBoundRequests,
    /// Set on the scope of one 2026-07-28 request: where upstream requests go
    /// instead of to the client.
    inputs: Option<mpsc::Sender<Box<InputNeeded>>>,
    /// A session the HTTP front makes for one request that came without one.
    stateless: bool,
    /// The era its client speaks: a 2026-07-28 request's scope (and the stateless
    /// session it runs under) is modern; a session opened by a front is handshake-era
    /// (its own 2026-07-28 requests each run in a scope).
    era: Era,
    /// The front's 2026-07-28 requests paused on input from their client.
    paused: Arc<Continuations>,
    /// Its principal, and the view of the catalog it sees (kept across reloads by
    /// name: the view's new definition applies at once).
    identity: Identity,
    /// Its lists (only its first waits for starting upstreams).
    lister: Lister,
    /// Closed because plexus is shutting down: requests still running are told so.
    shutting_down: AtomicBool,
}

/// Who a session is: the principal that opened it and the view it sees.
#[derive(Clone, Debug)]
pub struct Identity {
    pub principal: Arc<str>,
    /// None: the whole catalog.
    pub view: Option<Arc<str>>,
}

impl Identity {
    /// An open loopback listener's or the stdio front's client, seeing `view`.
    pub fn local(view: Option<Arc<str>>) -> Identity {
        Identity {
            principal: Arc::from(crate::access::LOCAL_PRINCIPAL),
            view,
        }
    }
}

/// The result of handling one incoming message.
pub enum Handled {
    /// Send this response.
    Respond(jsonrpc::Answer),
    /// Nothing to send (a notification, a response, or a cancelled request).
    Nothing,
}

impl Session {
    /// Creates a session; messages plexus sends on its own (list changes) arrive on the receiver.
    pub fn new(
        hub: Arc<Hub>,
        paused: Arc<Continuations>,
        identity: Identity,
    ) -> (Arc<Session>, mpsc::Receiver<Value>) {
        let (outbound, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        let session = Session::build(hub, paused, None, None, false, identity, outbound);
        session.register();
        session.hub.spawn(announce_catalog_changes(session.clone()));
        (session, receiver)
    }

    fn register(self: &Arc<Self>) {
        let weak: std::sync::Weak<dyn Client> = Arc::downgrade(self) as _;
        self.hub.register_session(weak, self.id);
    }

    /// A session for one HTTP request that came without a session: a 2026-07-28
    /// client's. It announces nothing; each request in it gets its own scope.
    ///
    /// `nowhere` is its queue for messages outside a request's stream: one whose
    /// receiver is gone, shared by every such session, since a request without a
    /// session has no stream but its own.
    pub fn stateless(
        hub: Arc<Hub>,
        paused: Arc<Continuations>,
        identity: Identity,
        nowhere: &mpsc::Sender<Value>,
    ) -> Arc<Session> {
        Session::build(hub, paused, None, None, true, identity, nowhere.clone())
    }

    /// The scope of one 2026-07-28 request: it carries that request's declared
    /// capabilities and log level, and upstream requests caused by the request
    /// arrive on `inputs` instead of going to the client.
    pub fn scope(&self, meta: RequestMeta) -> (Arc<Session>, ScopeChannels) {
        let (inputs, input_receiver) = mpsc::channel(MAX_CLIENT_BOUND);
        let owner = (!self.stateless).then_some(self.owner);
        let (outbound, events) = mpsc::channel(OUTBOUND_QUEUE);
        let scope = Session::build(
            self.hub.clone(),
            self.paused.clone(),
            owner,
            Some(inputs),
            false,
            self.identity.clone(),
            outbound,
        );
        *scope.hello.lock().unwrap_or_else(PoisonError::into_inner) = ClientHello {
            protocol_version: Some(era::MODERN_VERSION.to_string()),
            capabilities: meta.capabilities,
        };
        *scope
            .log_level
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = meta.log_level;
        scope.register();
        (
            scope,
            ScopeChannels {
                events,
                inputs: input_receiver,
            },
        )
    }

    fn build(
        hub: Arc<Hub>,
        paused: Arc<Continuations>,
        owner: Option<u64>,
        inputs: Option<mpsc::Sender<Box<InputNeeded>>>,
        stateless: bool,
        identity: Identity,
        outbound: mpsc::Sender<Value>,
    ) -> Arc<Session> {
        let id = hub.open_session();
        let era = if stateless || inputs.is_some() {
            Era::Modern
        } else {
            Era::Handshake
        };
        Arc::new(Session {
            id,
            span_tag: crate::telemetry::SessionTag::new(id),
            owner: owner.unwrap_or(id),
            hub,
            hello: Mutex::new(ClientHello::default()),
            in_flight: InFlight::default(),
            outbound,
            closed: CancellationToken::new(),
            log_level: Mutex::new(None),
            subscriptions: Mutex::new(HashSet::new()),
            client_bound: ClientBoundRequests::new(id),
            inputs,
            stateless,
            era,
            paused,
            identity,
            lister: Lister::default(),
            shutting_down: AtomicBool::new(false),
        })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The catalog this client sees: its view, or the whole.
    pub fn catalog(&self) -> Arc<registry::Catalog> {
        self.hub.catalog_for(self.view())
    }

    pub fn view(&self) -> Option<&str> {
        self.identity.view.as_deref()
    }

    pub fn paused(&self) -> &Arc<Continuations> {
        &self.paused
    }

    /// The era its client speaks, fixed when it was made.
    pub fn era(&self) -> Era {
        self.era
    }

    /// Whether it has had its handshake (`initialize`).
    pub fn initialized(&self) -> bool {
        self.hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .protocol_version
            .is_some()
    }

    /// Ends the session because plexus is shutting down: requests still running are
    /// answered -33007.
    pub fn close_for_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        self.close();
    }

    /// Ends the session: in-flight requests are cancelled, announcements stop.
    pub fn close(&self) {
        if self.closed.is_cancelled() {
            return;
        }
        self.closed.cancel();
        // A stateless session is never registered: its requests run in scopes that are.
        if !self.stateless {
            let subscriptions: Vec<String> = self.lock_subscriptions().drain().collect();
            self.hub.end_session(self.id, subscriptions);
        }
        // Upstreams waiting on this client learn it is gone instead of waiting out their deadline.
        for request in self.client_bound.drain() {
            let error =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client session ended"});
            self.hub.spawn(request.answer(Reply::Error(error)));
        }
        self.in_flight.cancel_all();
    }

    pub fn protocol_version(&self) -> Option<String> {
        self.hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .protocol_version
            .clone()
    }

    /// The negotiated version as one of the versions plexus speaks (it is always one).
    fn protocol_version_name(&self) -> Option<&'static str> {
        let hello = self.hello.lock().unwrap_or_else(PoisonError::into_inner);
        let version = hello.protocol_version.as_deref()?;
        era::ALL_VERSIONS
            .iter()
            .find(|known| **known == version)
            .copied()
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends an upstream's request to this client under a fresh id (the scope of a
    /// 2026-07-28 request pauses it instead, as an input request); whether it went.
    pub fn forward_to_client(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        params: Option<Value>,
        trace: Option<&crate::telemetry::CallTrace>,
    ) -> bool {
        // A 2026-07-28 scope asks in a round of its own (`ClientBoundRequests::ask`, its wait traced there).
        if let Some(inputs) = &self.inputs {
            return inputs
                .try_send(Box::new(InputNeeded {
                    connection,
                    upstream_id,
                    method: method.to_string(),
                    params,
                }))
                .is_ok();
        }
        self.client_bound
            .forward(sink, connection, upstream_id, method, params, trace)
    }

    /// An upstream cancelled a request it had sent this client: pass the cancel on.
    pub fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value) {
        if let Some(id) = self.client_bound.withdraw(upstream, upstream_id) {
            self.notify(jsonrpc::notification(
                "notifications/cancelled",
                Some(json!({"requestId": id, "reason": "the upstream withdrew its request"})),
            ));
        }
    }

    /// Handles one parsed JSON-RPC message from the client, a request of `era`
    /// (as its front decided). Messages related to a request (its progress,
    /// requests an upstream sends while serving it) go to `related` when given (the
    /// request's own HTTP stream), else to the session's outbound queue.
    pub async fn handle(
        &self,
        message: impl Into<ClientMessage>,
        era: Era,
        related: Option<&mpsc::Sender<Value>>,
    ) -> Handled {
        let ClientMessage {
            message,
            arguments,
            capabilities,
        } = message.into();
        match jsonrpc::Envelope::of(message) {
            Ok(Envelope::Request { id, method, params }) => {
                let related = related.unwrap_or(&self.outbound);
                let traced =
                    telemetry::server_call(&method, params.as_ref(), &id, &self.span_tag, || {
                        match era {
                            Era::Modern => Some(era::MODERN_VERSION),
                            _ => self.protocol_version_name(),
                        }
                    });
                if let Some(traced) = traced {
                    // Boxed: the untraced request's future stays the size it was.
                    return Box::pin(async move {
                        let dispatcher = Dispatch::new(self, related);
                        let dispatch = std::pin::pin!(dispatcher.request(
                            id,
                            method,
                            params,
                            arguments,
                            capabilities,
                            era
                        ));
                        let handled = traced.serve(dispatch).await;
                        traced.end(match &handled {
                            Handled::Respond(answer) => Some(answer),
                            Handled::Nothing => None,
                        });
                        handled
                    })
                    .await;
                }
                Dispatch::new(self, related)
                    .request(id, method, params, arguments, capabilities, era)
                    .await
            }
            Ok(Envelope::Notification { method, params }) => {
                self.notification(&method, params);
                Handled::Nothing
            }
            Ok(Envelope::Response { id, reply }) => {
                self.client_bound.answer(&id, reply, &self.audit()).await;
                Handled::Nothing
            }
            Err(not) => Handled::Respond(not.answer().into()),
        }
    }

    /// A client's notification: its handshake done, a cancel, its roots changed.
    fn notification(&self, method: &str, params: Option<Value>) {
        match method {
            "notifications/initialized" => self.hub.client_initialized(self),
            "notifications/cancelled" => {
                let Some(request_id) = params.as_ref().and_then(|p| p.get("requestId")) else {
                    return;
                };
                self.in_flight.cancel(&request_id.to_string());
            }
            "notifications/roots/list_changed" => self.hub.roots_changed(self),
            other => tracing::debug!(method = other, "client notification ignored"),
        }
    }

    /// Whether the client declared a capability in `initialize` (`sampling`, `elicitation`, `roots`).
    pub fn has_capability(&self, path: &[&str]) -> bool {
        self.hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .has_capability(path)
    }

    /// Sends a message outside any request's stream (logging, resource updates).
    pub fn notify(&self, message: Value) {
        if self.outbound.try_send(message).is_err() {
            tracing::debug!(session = self.id, "outbound queue full; message dropped");
        }
    }

    pub fn outbound(&self) -> &mpsc::Sender<Value> {
        &self.outbound
    }

    pub fn log_level(&self) -> Option<LogLevel> {
        *self
            .log_level
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn is_subscribed(&self, uri: &str) -> bool {
        self.lock_subscriptions().contains(uri)
    }

    /// Subscribes the session to `uri`, and through `route` its upstream; whether
    /// it is new. One the upstream refuses is not kept: it takes no place in the
    /// bound.
    pub(crate) async fn subscribe(
        &self,
        uri: &str,
        route: &registry::Route,
    ) -> Result<bool, RelayError> {
        if !self.add_subscription(uri)? {
            return Ok(false);
        }
        if let Err(error) = self
            .hub
            .subscription(self.id, &self.outbound, route, true)
            .await
        {
            self.lock_subscriptions().remove(uri);
            return Err(error);
        }
        Ok(true)
    }

    /// Adds `uri` to the session's subscriptions; whether it is new there.
    fn add_subscription(&self, uri: &str) -> Result<bool, RelayError> {
        let mut subscriptions = self.lock_subscriptions();
        if subscriptions.contains(uri) {
            return Ok(false);
        }
        if subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(RelayError::TooManySubscriptions {
                limit: MAX_SUBSCRIPTIONS,
            });
        }
        Ok(subscriptions.insert(uri.to_string()))
    }

    pub(crate) fn lock_subscriptions(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The session's side of the trail.
    fn audit(&self) -> SessionAudit<'_> {
        SessionAudit::new(
            self.hub.audit(),
            &self.identity.principal,
            self.view(),
            self.owner,
        )
    }

    /// Relays this session's routed requests; their related messages go to `related`.
    fn forwarder<'a>(&'a self, related: &'a mpsc::Sender<Value>) -> Forwarder<'a> {
        Forwarder {
            hub: &self.hub,
            era: self.era,
            base: self.call_context(None, related),
            hello: &self.hello,
            client: &self.client_bound,
            audit: self.audit(),
        }
    }

    fn call_context<'a>(
        &'a self,
        tool: Option<&'a str>,
        related: &'a mpsc::Sender<Value>,
    ) -> CallContext<'a> {
        CallContext {
            session: self.id,
            owner: self.owner,
            tool,
            related,
            headers: &[],
            result_unread: false,
            arguments: None,
        }
    }
}

/// Ends a session however the task holding it ends.
pub struct CloseOnDrop(pub Arc<Session>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Sends one `list_changed` per kind whose content changed, coalescing bursts.
async fn announce_catalog_changes(session: Arc<Session>) {
    let mut catalogs = session.hub.subscribe();
    let mut last = catalogs.borrow_and_update().view(session.view());
    loop {
        tokio::select! {
            _ = session.closed.cancelled() => return,
            changed = catalogs.changed() => if changed.is_err() { return },
        }
        // Only what changed in this client's view is announced.
        let current = catalogs.borrow_and_update().view(session.view());
        if !session.initialized() {
            // Not initialized yet: it will list what is current when it asks.
            last = current;
            continue;
        }
        let mut methods: Vec<&str> = Kind::ALL
            .into_iter()
            .filter(|kind| last.digest(*kind) != current.digest(*kind))
            .map(Kind::list_changed_method)
            .collect();
        methods.dedup();
        for method in methods {
            if session
                .outbound
                .try_send(jsonrpc::notification(method, None))
                .is_err()
            {
                tracing::debug!(
                    method,
                    "session's outbound queue is full; list change not announced"
                );
            }
        }
        last = current;
    }
}

impl Client for Session {
    fn id(&self) -> u64 {
        Session::id(self)
    }
    /// A request scope of a 2026-07-28 client: it cannot be sent requests.
    fn is_scope(&self) -> bool {
        self.inputs.is_some()
    }
    fn principal(&self) -> Arc<str> {
        self.identity.principal.clone()
    }
    fn log_level(&self) -> Option<LogLevel> {
        Session::log_level(self)
    }
    fn has_capability(&self, path: &[&str]) -> bool {
        Session::has_capability(self, path)
    }
    fn is_subscribed(&self, uri: &str) -> bool {
        Session::is_subscribed(self, uri)
    }
    fn shows_upstream(&self, upstream: &str) -> bool {
        self.identity.view.is_none() || self.catalog().shows_upstream(upstream)
    }
    fn declared_capabilities(&self) -> Arc<Value> {
        self.hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .capabilities
            .clone()
    }
    fn notify(&self, message: Value) {
        Session::notify(self, message)
    }
    fn outbound(&self) -> &mpsc::Sender<Value> {
        Session::outbound(self)
    }
    fn forward_to_client(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        params: Option<Value>,
        trace: Option<&crate::telemetry::CallTrace>,
    ) -> bool {
        Session::forward_to_client(self, sink, connection, upstream_id, method, params, trace)
    }
    fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value) {
        Session::withdraw_client_bound(self, upstream, upstream_id)
    }
}

#[cfg(test)]
mod tests;
