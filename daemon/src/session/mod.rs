//! A downstream session: one MCP client, whichever front it came through. It
//! answers the lifecycle and list methods from the catalog snapshot and routes
//! everything else to the owning upstream by table lookup.

mod bridge;
mod client_bound;
mod held_tasks;
mod task_extension;

pub use bridge::Continuations;

use client_bound::ClientBound;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use adapters::{Reply, UpstreamConnection, WrittenMember};
use registry::{Catalog, Kind};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client_message::{self, ClientMessage};
use crate::era::{self, RequestMeta};
use crate::fanout::Client;
use crate::hub::{CallContext, Hub};
use crate::jsonrpc::{self, Envelope, RelayError};
use crate::logging::LogLevel;
use crate::upstreams::UpstreamState;

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
/// How long a paused call waits for the client's retry before it is cancelled
/// (`bridge`), and how long a held task's result is asked for without news from
/// its client (`task_extension`): here, so neither child imports the other for it.
pub const CONTINUATION_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// What a client told plexus in `initialize`.
#[derive(Clone, Debug, Default)]
pub struct ClientHello {
    pub protocol_version: Option<String>,
    /// Shared: every call to a 2026-07-28 upstream reads them.
    pub capabilities: Arc<Value>,
}

/// A request an upstream sent while serving a 2026-07-28 client's request: it
/// becomes an input request in that request's result.
pub struct InputNeeded {
    pub connection: UpstreamConnection,
    pub upstream_id: Value,
    pub method: String,
    pub params: Option<Value>,
}

pub struct Session {
    id: u64,
    /// Whose per-session upstream instances this session's calls use: its own, or
    /// for the scope of a 2026-07-28 request, the connection's it arrived on.
    owner: u64,
    hub: Arc<Hub>,
    hello: Mutex<ClientHello>,
    /// Requests being served, by the JSON text of the client's id, so a cancel can reach them.
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    /// Messages plexus sends on its own, outside any request's stream.
    outbound: mpsc::Sender<Value>,
    closed: CancellationToken,
    /// The level set by `logging/setLevel`; no log messages until then.
    log_level: Mutex<Option<LogLevel>>,
    /// Exposed URIs this client subscribed to.
    subscriptions: Mutex<HashSet<String>>,
    /// Server-to-client requests awaiting this client's answer, by the id plexus gave them.
    client_bound: Mutex<HashMap<String, ClientBound>>,
    next_client_bound: AtomicU64,
    /// Set on the scope of one 2026-07-28 request: where upstream requests go
    /// instead of to the client.
    inputs: Option<mpsc::Sender<Box<InputNeeded>>>,
    /// A session the HTTP front makes for one request that came without one.
    stateless: bool,
    /// The front's 2026-07-28 requests paused on input from their client.
    paused: Arc<Continuations>,
    /// Its principal, and the view of the catalog it sees (kept across reloads by
    /// name: the view's new definition applies at once).
    identity: Identity,
    /// Whether it listed anything yet (only its first list waits for starting upstreams).
    listed: AtomicBool,
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

/// What a request scope delivers: messages for the client, and upstream requests.
pub struct ScopeChannels {
    pub events: mpsc::Receiver<Value>,
    /// Boxed: a channel's first block holds 32 of them.
    pub inputs: mpsc::Receiver<Box<InputNeeded>>,
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
        self.hub.fanout.register_session(weak, self.id);
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
        Arc::new(Session {
            id,
            owner: owner.unwrap_or(id),
            hub,
            hello: Mutex::new(ClientHello::default()),
            in_flight: Mutex::new(HashMap::new()),
            outbound,
            closed: CancellationToken::new(),
            log_level: Mutex::new(None),
            subscriptions: Mutex::new(HashSet::new()),
            client_bound: Mutex::new(HashMap::new()),
            next_client_bound: AtomicU64::new(0),
            inputs,
            stateless,
            paused,
            identity,
            listed: AtomicBool::new(false),
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

    /// A request scope of a 2026-07-28 client: it cannot be sent requests.
    pub fn is_scope(&self) -> bool {
        self.inputs.is_some()
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
            self.hub.fanout.end_session(self.id, subscriptions);
        }
        // Upstreams waiting on this client learn it is gone instead of waiting out their deadline.
        let pending: Vec<_> = self
            .client_bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (_, request) in pending {
            let error =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client session ended"});
            self.hub.spawn(request.answer(Reply::Error(error)));
        }
        for (_, token) in self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
        {
            token.cancel();
        }
    }

    pub fn protocol_version(&self) -> Option<String> {
        self.hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .protocol_version
            .clone()
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Handles one parsed JSON-RPC message from the client. Messages related to a
    /// request (its progress, requests an upstream sends while serving it) go to
    /// `related` when given (the request's own HTTP stream), else to the session's
    /// outbound queue.
    pub async fn handle(
        &self,
        message: impl Into<ClientMessage>,
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
                self.handle_request(id, method, params, arguments, capabilities, related)
                    .await
            }
            Ok(Envelope::Notification { method, params }) => {
                self.handle_notification(&method, params);
                Handled::Nothing
            }
            Ok(Envelope::Response { id, reply }) => {
                self.answer_client_bound(&id, reply).await;
                Handled::Nothing
            }
            Err(not) => Handled::Respond(not.answer().into()),
        }
    }

    /// `capabilities`: the request's `_meta` client capabilities, when the front
    /// took them out (see [`ClientMessage`]).
    async fn handle_request(
        &self,
        id: Value,
        method: String,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
        capabilities: Option<Arc<Value>>,
        related: &mpsc::Sender<Value>,
    ) -> Handled {
        let key = id.to_string();
        let token = CancellationToken::new();
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if in_flight.contains_key(&key) {
                return invalid(id, "a request with this id is already in flight");
            }
            in_flight.insert(key.clone(), token.clone());
        }
        // Removes the entry however this ends, a dropped future (a client gone) included.
        let _registered = InFlightEntry {
            session: self,
            key: &key,
        };
        // A client that never initialized and declares a version per request speaks 2026-07-28.
        let modern = self.protocol_version().is_none()
            && (method == "server/discover" || era::declared_version(params.as_ref()).is_some());
        // A 2026-07-28 request's `_meta` is checked as it is taken.
        let checked = if modern {
            Ok(())
        } else {
            check_meta_member(params.as_ref())
        };
        if let Err(error) = checked.and_then(|()| check_arguments(&method, params.as_ref())) {
            return failed(id, &error, modern);
        }
        // Pinned where it is: `select!` moves what it is given, and this future holds
        // the whole of the request's handling (kilobytes).
        let outcome = {
            let serving = std::pin::pin!(async {
                if modern {
                    self.serve_modern(&id, &method, params, arguments, capabilities, related)
                        .await
                        .map(Served::Reply)
                } else if let Some(kind) = list_kind(&method) {
                    self.list_serialized(kind, params, &id)
                        .await
                        .map(Served::Page)
                } else {
                    self.dispatch(&method, params, arguments, related)
                        .await
                        .map(Served::Reply)
                }
            });
            tokio::select! {
                outcome = serving => Some(outcome),
                _ = token.cancelled() => None,
            }
        };
        match outcome {
            Some(Ok(Served::Page(answer))) => Handled::Respond(answer),
            Some(Ok(Served::Reply(Reply::Unread(raw)))) => {
                let marked = if modern {
                    era::mark_complete_unread(&method, &raw)
                } else {
                    Some([raw.bytes(), b""])
                };
                match marked {
                    Some(parts) => Handled::Respond(jsonrpc::Answer::result_written(
                        &id,
                        parts[0].len() + parts[1].len(),
                        |out| parts.iter().for_each(|part| out.extend_from_slice(part)),
                    )),
                    None => match Reply::Unread(raw).into_result() {
                        Ok(mut result) => {
                            era::mark_complete(&method, &mut result);
                            Handled::Respond(jsonrpc::result_response(id, result).into())
                        }
                        Err(error) => {
                            Handled::Respond(jsonrpc::error_object_response(id, error).into())
                        }
                    },
                }
            }
            Some(Ok(Served::Reply(Reply::Result(mut result)))) => {
                if modern {
                    era::mark_complete(&method, &mut result);
                }
                Handled::Respond(jsonrpc::result_response(id, result).into())
            }
            Some(Ok(Served::Reply(Reply::Error(mut error)))) => {
                if modern {
                    era::modern_upstream_error(&mut error);
                }
                Handled::Respond(jsonrpc::error_object_response(id, error).into())
            }
            Some(Err(error)) => failed(id, &error, modern),
            // Ended with its session (plexus shutting down, or the session deleted or
            // expired): the client still gets an answer.
            None if self.closed.is_cancelled() => {
                let error = if self.shutting_down.load(Ordering::Relaxed) || self.hub.is_stopping()
                {
                    RelayError::ShuttingDown
                } else {
                    RelayError::InvalidRequest("the session ended while this request ran".into())
                };
                failed(id, &error, modern)
            }
            // A cancelled request gets no response (the client said it no longer wants one).
            None => Handled::Nothing,
        }
    }

    fn handle_notification(&self, method: &str, params: Option<Value>) {
        match method {
            "notifications/initialized" => self.hub.fanout.client_initialized(self),
            "notifications/cancelled" => {
                let Some(request_id) = params.as_ref().and_then(|p| p.get("requestId")) else {
                    return;
                };
                let key = request_id.to_string();
                if let Some(token) = self
                    .in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                {
                    token.cancel();
                }
            }
            "notifications/roots/list_changed" => self.hub.fanout.roots_changed(self.id),
            other => tracing::debug!(method = other, "client notification ignored"),
        }
    }

    /// Whether the client declared a capability in `initialize` (`sampling`, `elicitation`, `roots`).
    pub fn has_capability(&self, path: &[&str]) -> bool {
        let hello = self.hello.lock().unwrap_or_else(PoisonError::into_inner);
        let mut value: &Value = &hello.capabilities;
        for key in path {
            match value.get(key) {
                Some(inner) if !inner.is_null() => value = inner,
                _ => return false,
            }
        }
        true
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
        if let Err(error) = self.hub.fanout.subscription(self.id, route, true).await {
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

    /// A 2026-07-28 request: its `_meta` is checked, and it runs in a scope of its own.
    async fn serve_modern(
        &self,
        id: &Value,
        method: &str,
        mut params: Option<Value>,
        arguments: Option<WrittenMember>,
        capabilities: Option<Arc<Value>>,
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let meta = era::take_meta(&mut params, capabilities)?;
        match method {
            "server/discover" => {
                let catalog = self.catalog();
                let upstream_extension = self
                    .hub
                    .fanout
                    .offers_tasks_extension(|upstream| catalog.shows_upstream(upstream));
                Ok(Reply::Result(era::discover_result(
                    task_extension::advertised(self.capabilities(), upstream_extension),
                    self.instructions(),
                )))
            }
            "tasks/get" | "tasks/update" | "tasks/cancel"
                if !task_extension::declared(&meta.capabilities) =>
            {
                Err(task_extension::missing(&format!("`{method}`")))
            }
            "subscriptions/listen" => bridge::listen(self, id, params, meta, related).await,
            // Replaced in this revision by `_meta` log levels and `subscriptions/listen`;
            // it has no handshake and no ping.
            "logging/setLevel"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "initialize"
            | "ping"
            // The tasks extension has neither: `tasks/get` inlines the outcome.
            | "tasks/list"
            | "tasks/result" => Err(RelayError::MethodNotFound(method.to_string())),
            _ => bridge::serve(self, method, params, arguments, meta, related).await,
        }
    }

    /// Serves a request; a tool call's `arguments`, when given, are not in `params`.
    pub(crate) async fn dispatch(
        &self,
        method: &str,
        mut params: Option<Value>,
        arguments: Option<WrittenMember>,
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let audited = matches!(method, "tools/call" | "prompts/get" | "resources/read")
            && self.hub.audit().enabled();
        if !audited {
            return self
                .dispatch_unaudited(method, params, arguments, related)
                .await;
        }
        // The trail hashes the arguments (a skim found them in params, an object).
        if let (Some(arguments), Some(Value::Object(object))) = (arguments, params.as_mut()) {
            client_message::put_back(object, &arguments)?;
        }
        // What the trail says of the request, taken before it is consumed.
        let catalog = self.catalog();
        let (name, arguments) = match method {
            "resources/read" => (params.as_ref().and_then(|p| p.get("uri")), None),
            _ => (
                params.as_ref().and_then(|p| p.get("name")),
                params.as_ref().and_then(|p| p.get("arguments")),
            ),
        };
        let name = name.and_then(Value::as_str).unwrap_or_default().to_string();
        let route = match method {
            "tools/call" => catalog.route_tool(&name),
            "prompts/get" => catalog.route_prompt(&name),
            _ => catalog.route_resource(&name),
        };
        let arguments = crate::audit::arguments_hash(arguments);
        let started = std::time::Instant::now();
        let reply = self.dispatch_unaudited(method, params, None, related).await;
        let response_bytes = match &reply {
            Ok(Reply::Result(result)) => adapters::json_out::serialized_len(result),
            Ok(Reply::Unread(raw)) => raw.bytes().len(),
            Ok(Reply::Error(error)) => adapters::json_out::serialized_len(error),
            Err(_) => 0,
        };
        if let Some(mut line) = self.audit_line("request") {
            line.field("method", method)
                .field("name", &name)
                .field("upstream", route.as_ref().map(|r| &*r.upstream))
                .field("original", route.as_ref().map(|r| &r.original))
                .field("arguments_sha256", &arguments)
                .field("outcome", crate::audit::outcome(&reply))
                .field("duration_ms", started.elapsed().as_secs_f64() * 1000.0)
                .field("response_bytes", response_bytes);
            self.hub.audit().write(line);
        }
        reply
    }

    /// A line of the trail for `event`, saying who acted: principal, view and the
    /// session's keyed hash; `None` when nothing is audited.
    fn audit_line(&self, event: &str) -> Option<crate::audit::Line> {
        let audit = self.hub.audit();
        let mut line = audit.line(event)?;
        line.field("principal", &*self.identity.principal)
            .field("view", self.view())
            .field("session", audit.session_tag(self.owner));
        Some(line)
    }

    /// A request this client was sent on an upstream's behalf, and how it answered.
    pub(crate) fn audit_client_request(
        &self,
        upstream: Option<&str>,
        method: &str,
        sent: std::time::Instant,
        reply: &Result<Reply, RelayError>,
    ) {
        let Some(mut line) = self.audit_line("client_request") else {
            return;
        };
        line.field("method", method)
            .field("upstream", upstream)
            .field("outcome", crate::audit::outcome(reply))
            .field("duration_ms", sent.elapsed().as_secs_f64() * 1000.0);
        self.hub.audit().write(line);
    }

    async fn dispatch_unaudited(
        &self,
        method: &str,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        if let Some(kind) = list_kind(method) {
            return self.list(kind, params).await.map(Reply::Result);
        }
        match method {
            "initialize" => Ok(Reply::Result(self.initialize(params))),
            "ping" => Ok(Reply::Result(json!({}))),
            "tools/call" => {
                let (mut params, name) = take_string(params, "name")?;
                let (catalog, route) = self
                    .route_waiting(&name, under_prefix(&name), |catalog, name| {
                        catalog.route_tool(name).or_else(|| {
                            catalog
                                .route_unlisted_tool(name)
                                .filter(|_| catalog.held(Kind::Tools, name).is_none())
                        })
                    })
                    .await;
                let route =
                    route.ok_or_else(|| self.unrouted_name(&catalog, Kind::Tools, &name))?;
                // What the tool's schema mirrors into headers, for an HTTP upstream.
                let designated = catalog.param_headers(&name);
                let arguments = match arguments {
                    Some(arguments) if !designated.is_empty() => {
                        client_message::put_back(&mut params, &arguments)?;
                        None
                    }
                    arguments => arguments,
                };
                let headers: Vec<(String, String)> = designated
                    .iter()
                    .filter_map(|designated| {
                        let value = designated.value_in(params.get("arguments"))?;
                        Some((
                            designated.header_name(),
                            registry::headers::encode_header_value(&value),
                        ))
                    })
                    .collect();
                let params = if self.is_scope() {
                    task_extension::as_task_if_wanted(
                        params,
                        catalog.task_support(&name),
                        &self.declared_capabilities(),
                    )?
                } else {
                    params
                };
                self.forward_named(
                    method,
                    params,
                    arguments.as_ref(),
                    &route,
                    &headers,
                    related,
                )
                .await
            }
            "prompts/get" => {
                let (params, name) = take_string(params, "name")?;
                let (catalog, route) = self
                    .route_waiting(&name, under_prefix(&name), Catalog::route_prompt)
                    .await;
                let route =
                    route.ok_or_else(|| self.unrouted_name(&catalog, Kind::Prompts, &name))?;
                self.forward_named(method, params, None, &route, &[], related)
                    .await
            }
            "resources/read" => {
                let (params, uri) = take_string(params, "uri")?;
                let (catalog, route) = self
                    .route_waiting(&uri, in_namespace(&uri), Catalog::route_resource)
                    .await;
                let route = route.ok_or_else(|| unrouted(&catalog, Kind::Resources, &uri))?;
                let params = with_string(params, "uri", &route.original);
                let call = self.call_context(None, related);
                let reply = self
                    .forward_with_input(&route.upstream, method, params, call)
                    .await?;
                Ok(expose_content_uris(&catalog, &route.upstream, reply))
            }
            "completion/complete" => self.complete(params, related).await,
            "tasks/get" | "tasks/update" | "tasks/cancel" if self.is_scope() => {
                task_extension::serve(self, method, params, related).await
            }
            "tasks/get" | "tasks/result" | "tasks/cancel" => {
                task_extension::serve(self, method, params, related).await
            }
            "tasks/list" => self.hub.list_tasks(self.call_context(None, related)).await,
            "logging/setLevel" => {
                let level = params
                    .as_ref()
                    .and_then(|p| p.get("level"))
                    .and_then(Value::as_str)
                    .and_then(LogLevel::parse)
                    .ok_or_else(|| {
                        RelayError::InvalidParams("`level` must be a syslog level name".into())
                    })?;
                *self
                    .log_level
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(level);
                self.hub.fanout.log_levels_changed().await;
                Ok(Reply::Result(json!({})))
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let catalog = self.catalog();
                let (_, uri) = take_string(params, "uri")?;
                let subscribe = method == "resources/subscribe";
                // A held resource cannot be subscribed to; one subscribed before it
                // was held can still be let go.
                let route = match catalog.route_resource(&uri) {
                    Some(route) => route,
                    None => match catalog.held(Kind::Resources, &uri) {
                        Some(held) if !subscribe => held.route,
                        _ => return Err(unrouted(&catalog, Kind::Resources, &uri)),
                    },
                };
                if subscribe {
                    self.subscribe(&uri, &route).await?;
                } else if self.lock_subscriptions().remove(&uri) {
                    self.hub.fanout.subscription(self.id, &route, false).await?;
                }
                Ok(Reply::Result(json!({})))
            }
            other => Err(RelayError::MethodNotFound(other.to_string())),
        }
    }

    /// `completion/complete`, routed by the prompt name or resource template in `ref`.
    async fn complete(
        &self,
        params: Option<Value>,
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        let catalog = self.catalog();
        let reference = params
            .get_mut("ref")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| RelayError::InvalidParams("`ref` must be an object".into()))?;
        let kind = reference
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (key, route) = match kind.as_str() {
            "ref/prompt" => {
                let name = reference
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let route = catalog
                    .route_prompt(name)
                    .ok_or_else(|| unrouted(&catalog, Kind::Prompts, name))?;
                ("name", route)
            }
            "ref/resource" => {
                let uri = reference
                    .get("uri")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let route = catalog
                    .route_template(uri)
                    .or_else(|| catalog.route_resource(uri))
                    .ok_or_else(|| unrouted(&catalog, Kind::ResourceTemplates, uri))?;
                ("uri", route)
            }
            other => {
                return Err(RelayError::InvalidParams(format!(
                    "unknown ref type `{other}`"
                )))
            }
        };
        reference.insert(key.into(), Value::String(route.original.clone()));
        let call = self.call_context(None, related);
        self.hub
            .forward(
                &route.upstream,
                "completion/complete",
                Some(Value::Object(params)),
                call,
            )
            .await
    }

    /// Relays a request naming a tool or prompt, under the upstream's own name.
    async fn forward_named(
        &self,
        method: &str,
        params: Map<String, Value>,
        arguments: Option<&WrittenMember>,
        route: &registry::Route,
        headers: &[(String, String)],
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let is_tool = method == "tools/call";
        let params = with_string(params, "name", &route.original);
        let mut call = self.call_context(is_tool.then_some(route.original.as_str()), related);
        call.headers = headers;
        call.arguments = arguments;
        // A tool's result usually passes as the upstream wrote it.
        call.result_unread = is_tool;
        let reply = self
            .forward_with_input(&route.upstream, method, params, call)
            .await?;
        // A task-augmented call answers with a task whose id must name its upstream.
        Ok(if is_tool {
            let reply = expose_linked_uris(&self.catalog(), &route.upstream, reply);
            let reply = self
                .hub
                .task_routes
                .expose(&route.upstream, Some(self.id), reply);
            if self.is_scope() {
                task_extension::created(reply)
            } else {
                task_extension::nested(reply)
            }
        } else {
            reply
        })
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

    fn initialize(&self, params: Option<Value>) -> Value {
        let params = params.unwrap_or(Value::Null);
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        // Answer the client's version when plexus speaks it, else the newest plexus speaks.
        let version = requested
            .filter(|v| SUPPORTED_VERSIONS.contains(v))
            .unwrap_or(LATEST_VERSION)
            .to_string();
        *self.hello.lock().unwrap_or_else(PoisonError::into_inner) = ClientHello {
            protocol_version: Some(version.clone()),
            capabilities: Arc::new(params.get("capabilities").cloned().unwrap_or(Value::Null)),
        };
        json!({
            "protocolVersion": version,
            "capabilities": self.capabilities(),
            "serverInfo": {"name": "plexus", "version": env!("CARGO_PKG_VERSION")},
            "instructions": self.instructions(),
        })
    }

    /// What plexus can relay from the upstreams this client's view shows.
    fn capabilities(&self) -> Value {
        let catalog = self.catalog();
        self.hub
            .fanout
            .capabilities(|upstream| catalog.shows_upstream(upstream))
    }

    /// Tells the client which upstreams stand behind the names it sees.
    fn instructions(&self) -> String {
        let mut lines =
            vec!["plexus aggregates these MCP servers; names carry their prefix:".to_string()];
        // From the snapshot: instructions changed since they were pinned are held back.
        let catalog = self.catalog();
        for upstream in self.hub.upstreams().values() {
            // A view's hidden upstreams are not named at all.
            if !upstream.config().enabled || !catalog.shows_upstream(upstream.name()) {
                continue;
            }
            let mut line = format!("- {}", upstream.name());
            if let Some(text) = catalog.instructions(upstream.name()) {
                line.push_str(": ");
                line.push_str(text.trim());
            }
            lines.push(line);
        }
        lines.join("\n")
    }

    /// A handshake-era client's list page as the bytes of its `result`: the
    /// catalog's own JSON spliced in, never parsed into values and written again.
    async fn list_serialized(
        &self,
        kind: Kind,
        params: Option<Value>,
        id: &Value,
    ) -> Result<jsonrpc::Answer, RelayError> {
        self.wait_for_first_list().await;
        let catalog = self.catalog();
        let page = catalog
            .page(kind, cursor_of(&params))
            .map_err(|error| RelayError::InvalidParams(error.to_string()))?;
        let size = page.items.json_size_hint() + 64;
        Ok(jsonrpc::Answer::result_written(id, size, |out| {
            out.push(b'{');
            // A result key is a plain identifier: no escaping needed.
            out.push(b'"');
            out.extend_from_slice(kind.result_key().as_bytes());
            out.extend_from_slice(b"\":");
            page.items.write_json_array(out);
            if let Some(next) = page.next_cursor {
                out.extend_from_slice(br#","nextCursor":"#);
                let _ = serde_json::to_writer(&mut *out, &next);
            }
            out.push(b'}');
        }))
    }

    /// Only a session's first list waits for upstreams still starting.
    async fn wait_for_first_list(&self) {
        if !self.listed.swap(true, Ordering::Relaxed) {
            self.hub.wait_for_first_listings().await;
        }
    }

    /// Routes `key` (a tool or prompt name, a resource URI) with `route` in the
    /// session's catalog, and returns the catalog with the route, if any. A key that
    /// routes nowhere yet and may `belong` (by its prefix) to an upstream this session
    /// may see that is still on its first start (nothing listed, not even from its
    /// cache) waits for that upstream's first listing as a first list does (up to
    /// `first_list_wait`), and is routed in the catalog it makes: a client that just
    /// launched plexus does not see its first call fail.
    async fn route_waiting(
        &self,
        key: &str,
        belongs: impl Fn(&str) -> bool,
        route: impl Fn(&Catalog, &str) -> Option<registry::Route>,
    ) -> (Arc<Catalog>, Option<registry::Route>) {
        let catalog = self.catalog();
        if let Some(found) = route(&catalog, key) {
            return (catalog, Some(found));
        }
        let upstreams = self.hub.upstreams();
        let starting: Vec<&str> = upstreams
            .values()
            .filter(|upstream| {
                belongs(&upstream.config().prefix)
                    && catalog.shows_upstream(upstream.name())
                    && self.hub.awaits_first_listing(upstream)
            })
            .map(|upstream| upstream.name())
            .collect();
        if starting.is_empty() {
            return (catalog, None);
        }
        self.hub
            .wait_for_first_listings_of(|upstream| starting.contains(&upstream))
            .await;
        let catalog = self.catalog();
        let found = route(&catalog, key);
        (catalog, found)
    }

    /// The error for a tool or prompt name that routes nowhere. A name under the
    /// prefix of an upstream this session may see that has no listing yet (its
    /// first start is still under way, backing off, or failed) is about that
    /// upstream: the caller hears its state (-33001), not that the name is unknown.
    fn unrouted_name(&self, catalog: &registry::Catalog, kind: Kind, name: &str) -> RelayError {
        let unknown = unrouted(catalog, kind, name);
        if !matches!(
            unknown,
            RelayError::UnknownTool(_) | RelayError::UnknownPrompt(_)
        ) {
            return unknown;
        }
        for upstream in self.hub.upstreams().values() {
            let config = upstream.config();
            if registry::names::is_under_prefix(name, &config.prefix)
                && config.enabled
                && catalog.shows_upstream(upstream.name())
                && upstream.shared.state() != UpstreamState::Ready
                && !self.hub.lists(upstream.name())
            {
                return upstream.shared.unavailable();
            }
        }
        unknown
    }

    async fn list(&self, kind: Kind, params: Option<Value>) -> Result<Value, RelayError> {
        self.wait_for_first_list().await;
        let catalog = self.catalog();
        let page = catalog
            .page(kind, cursor_of(&params))
            .map_err(|error| RelayError::InvalidParams(error.to_string()))?;
        let mut result = Map::with_capacity(4);
        result.insert(kind.result_key().into(), Value::Array(page.items.to_vec()));
        if let Some(next) = page.next_cursor {
            result.insert("nextCursor".into(), Value::String(next));
        }
        if self.is_scope() {
            // What is true of the merge: its shortest-lived part's lifetime, and
            // shareable only if every part is, and the caller does not pick the view.
            let mut cache = page.cache;
            cache.public &= !self.hub.catalog_depends_on_caller();
            result.insert("ttlMs".into(), Value::from(cache.ttl_ms));
            result.insert("cacheScope".into(), Value::from(cache.scope()));
        }
        Ok(Value::Object(result))
    }
}

/// Whether an upstream of this prefix may expose `name`: one under its prefix, or
/// any name for an upstream without one.
fn under_prefix(name: &str) -> impl Fn(&str) -> bool + '_ {
    move |prefix| prefix.is_empty() || registry::names::is_under_prefix(name, prefix)
}

/// Whether an upstream of this prefix may expose `uri`: one in its URI namespace,
/// or any URI for an upstream without a prefix (its URIs are exposed unchanged).
fn in_namespace(uri: &str) -> impl Fn(&str) -> bool + '_ {
    let namespace = registry::uris::split_namespace(uri).map(|(namespace, _)| namespace);
    move |prefix| {
        prefix.is_empty()
            || namespace.is_some_and(|namespace| {
                registry::uris::uri_namespace(prefix).as_deref() == Some(namespace)
            })
    }
}

/// The error for a name or URI that routes nowhere: held back by the pins (-33006,
/// with the change), or unknown.
fn unrouted(catalog: &registry::Catalog, kind: Kind, key: &str) -> RelayError {
    match catalog.held(kind, key) {
        Some(held) => RelayError::quarantined(kind, key, held),
        None => match kind {
            Kind::Tools => RelayError::UnknownTool(key.to_string()),
            Kind::Prompts => RelayError::UnknownPrompt(key.to_string()),
            Kind::Resources | Kind::ResourceTemplates => {
                RelayError::UnknownResource(key.to_string())
            }
        },
    }
}

/// Ends a session however the task holding it ends.
pub struct CloseOnDrop(pub Arc<Session>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Removes a request from the session's in-flight table when it ends, however it ends.
struct InFlightEntry<'a> {
    session: &'a Session,
    key: &'a str,
}

impl Drop for InFlightEntry<'_> {
    fn drop(&mut self) {
        self.session
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.key);
    }
}

/// What a request was served with: an upstream's or plexus's reply, or a list
/// page's answer serialised already.
enum Served {
    Reply(Reply),
    Page(jsonrpc::Answer),
}

/// The kind a list method lists.
fn list_kind(method: &str) -> Option<Kind> {
    match method {
        "tools/list" => Some(Kind::Tools),
        "prompts/list" => Some(Kind::Prompts),
        "resources/list" => Some(Kind::Resources),
        "resources/templates/list" => Some(Kind::ResourceTemplates),
        _ => None,
    }
}

fn cursor_of(params: &Option<Value>) -> Option<&str> {
    params.as_ref()?.get("cursor")?.as_str()
}

/// plexus's own error for a request, in the client's era.
fn failed(id: Value, error: &RelayError, modern: bool) -> Handled {
    let error = if modern {
        error.to_modern_error_object()
    } else {
        error.to_error_object()
    };
    Handled::Respond(jsonrpc::error_object_response(id, error).into())
}

fn invalid(id: Value, reason: &'static str) -> Handled {
    Handled::Respond(jsonrpc::NotJsonRpc { id, reason }.answer().into())
}

/// The schema makes a request's `_meta` an object; an upstream may drop a request
/// unanswered when it is not (an SDK that cannot read a request may not know its id
/// either).
fn check_meta_member(params: Option<&Value>) -> Result<(), RelayError> {
    object_or_null(params, "_meta")
}

/// The same of a tool call's or a prompt's `arguments`. Arguments left unread
/// (`ClientMessage`) are an object: only an object is left so.
fn check_arguments(method: &str, params: Option<&Value>) -> Result<(), RelayError> {
    if !matches!(method, "tools/call" | "prompts/get") {
        return Ok(());
    }
    object_or_null(params, "arguments")
}

/// The params' member `key`, if present, is an object; `null` passes, as absent.
fn object_or_null(params: Option<&Value>, key: &str) -> Result<(), RelayError> {
    match params.and_then(|params| params.get(key)) {
        Some(value) if !value.is_object() && !value.is_null() => Err(RelayError::InvalidParams(
            format!("`{key}` must be an object"),
        )),
        _ => Ok(()),
    }
}

/// Takes the params object and one required string member of it.
fn take_string(
    params: Option<Value>,
    key: &str,
) -> Result<(Map<String, Value>, String), RelayError> {
    let Some(Value::Object(params)) = params else {
        return Err(RelayError::InvalidParams("params must be an object".into()));
    };
    let value = params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RelayError::InvalidParams(format!("`{key}` must be a string")))?
        .to_string();
    Ok((params, value))
}

/// Rewrites the routed name in place; everything else is relayed as sent.
fn with_string(mut params: Map<String, Value>, key: &str, value: &str) -> Value {
    params.insert(key.into(), Value::String(value.to_string()));
    Value::Object(params)
}

/// Gives `contents[].uri` of a read result the namespaced form the client used.
fn expose_content_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    in_result(
        reply,
        "contents",
        |content| content.get_mut("uri"),
        catalog,
        upstream,
    )
}

/// Gives the resource links and embedded resources of a tool result the exposed
/// form of their URIs, so a read of them routes back to the upstream they came from.
fn expose_linked_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    in_result(
        reply,
        "content",
        |block| match block.get("type").and_then(Value::as_str) {
            Some("resource_link") => block.get_mut("uri"),
            Some("resource") => block.get_mut("resource").and_then(|r| r.get_mut("uri")),
            _ => None,
        },
        catalog,
        upstream,
    )
}

/// Exposes the URI that `uri_of` finds in each element of the result's `list` array.
fn in_result(
    reply: adapters::Reply,
    list: &str,
    uri_of: impl Fn(&mut Value) -> Option<&mut Value>,
    catalog: &Catalog,
    upstream: &str,
) -> adapters::Reply {
    let adapters::Reply::Result(mut result) = reply else {
        return reply;
    };
    if let Some(Value::Array(elements)) = result.get_mut(list) {
        for element in elements {
            if let Some(Value::String(uri)) = uri_of(element) {
                *uri = catalog.expose_uri(upstream, uri);
            }
        }
    }
    Reply::Result(result)
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
        if session.protocol_version().is_none() {
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
    fn is_scope(&self) -> bool {
        Session::is_scope(self)
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
    ) -> bool {
        Session::forward_to_client(self, sink, connection, upstream_id, method, params)
    }
    fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value) {
        Session::withdraw_client_bound(self, upstream, upstream_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_and_arguments_must_be_objects_or_null() {
        let refused = |method: &str, params: Value| {
            check_meta_member(Some(&params))
                .and_then(|()| check_arguments(method, Some(&params)))
                .err()
                .map(|error| error.to_string())
        };
        for meta in [json!(1), json!([]), json!("x"), json!(true)] {
            let params = json!({"name": "a__b", "arguments": {}, "_meta": meta});
            let message = refused("tools/call", params.clone());
            assert!(
                message
                    .as_deref()
                    .is_some_and(|m| m.contains("`_meta` must be an object")),
                "{params}: {message:?}"
            );
            assert!(refused("tools/list", json!({"_meta": meta})).is_some());
        }
        for arguments in [json!(1), json!([]), json!("x")] {
            for method in ["tools/call", "prompts/get"] {
                let message = refused(method, json!({"name": "a__b", "arguments": arguments}));
                assert!(
                    message
                        .as_deref()
                        .is_some_and(|m| m.contains("`arguments` must be an object")),
                    "{method} {arguments}: {message:?}"
                );
            }
            // Elsewhere `arguments` means something else (completion's is an object
            // anyway) and is the upstream's to judge.
            assert_eq!(
                refused(
                    "resources/read",
                    json!({"uri": "x", "arguments": arguments})
                ),
                None
            );
        }
        // A large call's arguments that are not an object are read with the message
        // (only an object is left unread), so they are judged like any others.
        for (text, ok) in [
            (format!("\"{}\"", "l".repeat(2048)), false),
            (format!("[{}1]", "1,".repeat(1024)), false),
            (format!("{{\"text\":\"{}\"}}", "o".repeat(2048)), true),
        ] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a__b","arguments":{text}}}}}"#
            );
            let Ok(read) = ClientMessage::read(bytes::Bytes::from(line)) else {
                panic!("unreadable: {text:.40}");
            };
            assert_eq!(read.arguments.is_some(), ok, "{text:.40}");
            let outcome = refused("tools/call", read.message["params"].clone());
            assert_eq!(outcome.is_none(), ok, "{text:.40}: {outcome:?}");
        }
        // What passes: objects, null, absence, and params that are not an object
        // (refused where they are read, with their own message).
        for params in [
            json!({"name": "a__b", "arguments": {"x": 1}, "_meta": {"progressToken": 1}}),
            json!({"name": "a__b", "arguments": null, "_meta": null}),
            json!({"name": "a__b"}),
            json!([1]),
        ] {
            assert_eq!(refused("tools/call", params.clone()), None, "{params}");
        }
        assert!(check_meta_member(None).is_ok());
        assert!(check_arguments("tools/call", None).is_ok());
    }

    #[test]
    fn params_rewrite_keeps_every_other_member() {
        let params = json!({"name": "fixture__echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": 7, "x": 1}});
        let Value::Object(map) = params else {
            unreachable!()
        };
        let rewritten = with_string(map, "name", "echo");
        assert_eq!(
            rewritten,
            json!({"name": "echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": 7, "x": 1}})
        );
    }
}
