//! What flows from upstreams to sessions: server-to-client requests (to the one
//! session whose call caused them), log messages (to sessions that set a level),
//! resource updates (to subscribed sessions), and the reference counts and levels
//! plexus keeps upstream on the sessions' behalf.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use adapters::{Reply, UpstreamConnection};
use dashmap::DashMap;
use registry::{Catalog, Kind, Route};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::catalog_host::CatalogHost;
use crate::jsonrpc::{self, RelayError};
use crate::logging::LogLevel;
use crate::tasks::TaskRoutes;
use crate::upstreams::{Caller, Instance, Upstream, UpstreamSet};

/// What the fan-out needs of a downstream session (implemented by `Session`).
pub trait Client: Send + Sync {
    fn id(&self) -> u64;
    /// The scope of one 2026-07-28 request rather than a connected client.
    fn is_scope(&self) -> bool;
    fn log_level(&self) -> Option<LogLevel>;
    fn has_capability(&self, path: &[&str]) -> bool;
    fn is_subscribed(&self, uri: &str) -> bool;
    /// Whether the client's view shows this upstream (its logs reach only those that do).
    fn shows_upstream(&self, upstream: &str) -> bool;
    /// The capabilities the client declared (its `initialize`, or a 2026-07-28
    /// request's `_meta`).
    fn declared_capabilities(&self) -> Arc<Value>;
    /// A message of plexus's own for the client (logs, updates, list changes).
    fn notify(&self, message: Value);
    fn outbound(&self) -> &mpsc::Sender<Value>;
    /// Sends an upstream's request to the client on `sink`; false if it cannot take it.
    fn forward_to_client(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        params: Option<Value>,
    ) -> bool;
    /// An upstream withdrew one of its requests.
    fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value);
}

/// The request a change to a session's subscriptions sends upstream.
pub struct SubscriptionRequest {
    pub method: &'static str,
    pub params: Value,
    /// A subscribe the reference count took: undone if the upstream does not take it.
    counted: bool,
}

/// A request an upstream sent, as plexus routes it.
struct UpstreamRequest<'a> {
    /// The upstream's id, under which the answer goes back.
    id: Value,
    method: &'a str,
    params: Option<Value>,
    /// plexus's id of the request whose HTTP response stream carried it.
    origin: Option<u64>,
}

/// Routing of upstream messages to sessions, and what plexus keeps upstream on
/// the sessions' behalf.
pub struct Fanout {
    upstreams: Arc<UpstreamSet>,
    catalog: Arc<CatalogHost>,
    task_routes: Arc<TaskRoutes>,
    tasks: TaskTracker,
    /// The level plexus sets on upstreams: the most verbose any session asked for
    /// (instances that become ready read it from here).
    log_level: watch::Sender<Option<LogLevel>>,
    sessions: DashMap<u64, Weak<dyn Client>>,
    /// Subscribers per (upstream, original URI): subscribe upstream on the first, unsubscribe after the last.
    subscriptions: Mutex<HashMap<(String, String), usize>>,
    /// Upstream connections that asked a session for its roots, told when they change.
    roots_askers: Mutex<HashMap<u64, Vec<(String, UpstreamConnection)>>>,
    /// URL-mode elicitations, by upstream, the session whose own instance asked
    /// (per-session upstreams) and the elicitation id it chose, to the session they
    /// were sent to: two upstreams, or two sessions' instances of one, may choose
    /// one id, and neither may complete the other's.
    elicitations: DashMap<(String, Option<u64>, String), u64>,
    /// Upstreams whose `roots/list` plexus answered when no client could.
    roots_for_nobody: Mutex<Vec<(String, UpstreamConnection)>>,
    /// Who holds a handshake-era task's `tasks/result`, by upstream and the
    /// upstream's task id: the task's requests (which name it in `_meta`) are theirs.
    task_holders: DashMap<(String, String), Caller>,
    /// The daemon serves one client (`serve --stdio`): a request no call claims is
    /// that client's, with nothing to guess.
    one_client: AtomicBool,
}

impl Fanout {
    pub fn new(
        upstreams: Arc<UpstreamSet>,
        catalog: Arc<CatalogHost>,
        task_routes: Arc<TaskRoutes>,
        tasks: TaskTracker,
        log_level: watch::Sender<Option<LogLevel>>,
    ) -> Fanout {
        Fanout {
            upstreams,
            catalog,
            task_routes,
            tasks,
            log_level,
            sessions: DashMap::new(),
            subscriptions: Mutex::new(HashMap::new()),
            roots_askers: Mutex::new(HashMap::new()),
            elicitations: DashMap::new(),
            roots_for_nobody: Mutex::new(Vec::new()),
            task_holders: DashMap::new(),
            one_client: AtomicBool::new(false),
        }
    }

    /// From now on the daemon serves one client, and only one (`serve --stdio`).
    pub fn serve_one_client(&self) {
        self.one_client.store(true, Ordering::Relaxed);
    }

    /// The daemon's only client, if it serves one (`serve --stdio`) and that
    /// client declared `capability`.
    fn only_client_with(&self, capability: &[&str]) -> Option<u64> {
        if !self.one_client.load(Ordering::Relaxed) {
            return None;
        }
        match self.live_sessions().as_slice() {
            [only] if only.has_capability(capability) => Some(only.id()),
            _ => None,
        }
    }

    fn upstreams(&self) -> Arc<std::collections::BTreeMap<String, Arc<Upstream>>> {
        self.upstreams.snapshot()
    }

    fn upstream_named(&self, name: &str) -> Result<Arc<Upstream>, RelayError> {
        self.upstreams
            .get(name)
            .ok_or_else(|| RelayError::Unavailable {
                upstream: name.to_string(),
                state: "removed".into(),
                retry_after_ms: None,
            })
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.current()
    }

    /// Purges what is kept under a removed upstream's name.
    pub fn forget_upstream(&self, name: &str) {
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(upstream, _), _| upstream != name);
        for askers in self
            .roots_askers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values_mut()
        {
            askers.retain(|(upstream, _)| upstream != name);
        }
        self.roots_for_nobody
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(upstream, _)| upstream != name);
    }
}

/// Which client capability a server-to-client request needs, if any.
pub(crate) fn required_capability(
    method: &str,
    params: Option<&Value>,
) -> Option<Vec<&'static str>> {
    match method {
        "sampling/createMessage" => Some(if params.is_some_and(|p| p.get("tools").is_some()) {
            vec!["sampling", "tools"]
        } else {
            vec!["sampling"]
        }),
        "elicitation/create" => Some(
            if params.and_then(|p| p.get("mode")).and_then(Value::as_str) == Some("url") {
                vec!["elicitation", "url"]
            } else {
                vec!["elicitation"]
            },
        ),
        "roots/list" => Some(vec!["roots"]),
        _ => None,
    }
}

fn error(code: i64, message: String) -> Reply {
    Reply::Error(json!({"code": code, "message": message}))
}

impl Fanout {
    pub fn register_session(&self, session: Weak<dyn Client>, id: u64) {
        self.sessions.insert(id, session);
    }

    /// What a 2026-07-28 upstream is told the client of session `id` can do: its own
    /// declared capabilities, as far as plexus relays them (sampling, elicitation,
    /// roots), never plexus's.
    pub fn relayable_capabilities(&self, id: u64) -> Value {
        let Some(declared) = self
            .session(id)
            .map(|session| session.declared_capabilities())
        else {
            return Value::Object(Map::new());
        };
        let mut relayable = Map::new();
        for key in ["sampling", "elicitation", "roots"] {
            if let Some(capability) = declared.get(key).filter(|value| !value.is_null()) {
                relayable.insert(key.to_string(), capability.clone());
            }
        }
        // The tasks extension: plexus routes the task methods it brings.
        if let Some(tasks) = declared
            .get("extensions")
            .and_then(|extensions| extensions.get(crate::era::TASKS_EXTENSION))
        {
            relayable.insert(
                "extensions".into(),
                json!({ crate::era::TASKS_EXTENSION: tasks.clone() }),
            );
        }
        Value::Object(relayable)
    }

    fn session(&self, id: u64) -> Option<Arc<dyn Client>> {
        self.sessions.get(&id).and_then(|weak| weak.upgrade())
    }

    fn live_sessions(&self) -> Vec<Arc<dyn Client>> {
        self.sessions
            .iter()
            .filter_map(|entry| entry.value().upgrade())
            .collect()
    }

    /// Forgets a session: its own instances are stopped; the routes of the
    /// subscriptions it held are returned, for the caller to release each.
    pub fn end_session(&self, session: u64, subscriptions: Vec<String>) -> Vec<Route> {
        self.task_routes.forget_session(session);
        self.sessions.remove(&session);
        self.roots_askers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&session);
        self.elicitations.retain(|_, owner| *owner != session);
        for upstream in self.upstreams().values() {
            upstream.end_session(session);
        }
        let catalog = self.catalog();
        subscriptions
            .iter()
            .filter_map(|uri| {
                catalog
                    .route_resource(uri)
                    .or_else(|| catalog.held(Kind::Resources, uri).map(|held| held.route))
            })
            .collect()
    }

    /// Counts a session's subscription to a resource, and says what it asks of the
    /// upstream: the first subscribes there and the last unsubscribes; a per-session
    /// upstream's belong to that session's own instance; a 2026-07-28 upstream is
    /// told by its listen stream here. The request itself is the caller's to send
    /// (the one relay path), and a failed subscribe its to undo
    /// ([`Fanout::subscription_failed`]).
    pub fn subscription(
        &self,
        session: u64,
        route: &Route,
        subscribe: bool,
    ) -> Result<Option<SubscriptionRequest>, RelayError> {
        let upstream = self.upstream_named(&route.upstream)?;
        let request = |counted: bool| {
            Some(SubscriptionRequest {
                method: if subscribe {
                    "resources/subscribe"
                } else {
                    "resources/unsubscribe"
                },
                params: json!({"uri": route.original}),
                counted: counted && subscribe,
            })
        };
        if upstream.config().share == crate::config::Share::Session {
            // Nothing to unsubscribe from an instance that no longer runs.
            return match upstream.existing_instance(session) {
                Some(_) => Ok(request(false)),
                None if subscribe => Err(RelayError::Unavailable {
                    upstream: route.upstream.to_string(),
                    state: "idle".into(),
                    retry_after_ms: Some(1000),
                }),
                None => Ok(None),
            };
        }
        let key = (route.upstream.to_string(), route.original.clone());
        let send = {
            let mut counts = self
                .subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let count = counts.entry(key.clone()).or_insert(0);
            if subscribe {
                *count += 1;
                *count == 1
            } else {
                *count = count.saturating_sub(1);
                let last = *count == 0;
                if last {
                    counts.remove(&key);
                }
                last
            }
        };
        if !send {
            return Ok(None);
        }
        if upstream.speaks_per_request() {
            // 2026-07-28 has no resources/subscribe: the upstream's listen stream names the URIs.
            let uris = self
                .subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .keys()
                .filter(|(name, _)| **name == *route.upstream)
                .map(|(_, uri)| uri.clone())
                .collect();
            upstream.listen_uris.send_replace(uris);
            return Ok(None);
        }
        Ok(request(true))
    }

    /// The upstream did not take a subscribe [`Fanout::subscription`] asked for:
    /// not subscribed after all, so the next subscriber tries again.
    pub fn subscription_failed(&self, route: &Route, request: &SubscriptionRequest) {
        if request.counted {
            self.subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(route.upstream.to_string(), route.original.clone()));
        }
    }

    /// After a session set its level: sets the most verbose level any session wants on
    /// every upstream that logs.
    pub async fn log_levels_changed(&self) {
        let wanted = self
            .live_sessions()
            .iter()
            .filter_map(|s| s.log_level())
            .min();
        // Instances that become ready later read the level from here.
        let changed = self.log_level.send_if_modified(|current| {
            let changed = *current != wanted;
            *current = wanted;
            changed
        });
        if let (true, Some(level)) = (changed, wanted) {
            for upstream in self.upstreams().values() {
                upstream.apply_log_level(level).await;
            }
        }
    }

    pub fn current_log_level(&self) -> Option<LogLevel> {
        *self.log_level.borrow()
    }

    /// Relays a notification an upstream sent on its own (progress never comes
    /// here: the supervisor's tap routes it as it is read). One from a per-session
    /// instance (`owner`) goes to that session alone: the process is its own.
    pub fn route_notification(&self, upstream: &str, owner: Option<u64>, message: &Value) {
        let owned_by = |session: &Arc<dyn Client>| owner.is_none_or(|owner| owner == session.id());
        let method = message.get("method").and_then(Value::as_str).unwrap_or("");
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        match method {
            "notifications/message" => {
                let Some(level) = params
                    .get("level")
                    .and_then(Value::as_str)
                    .and_then(LogLevel::parse)
                else {
                    return;
                };
                let mut params = params.as_object().cloned().unwrap_or_default();
                // The client sees which upstream spoke.
                let logger = match params.get("logger").and_then(Value::as_str) {
                    Some(logger) => format!("{upstream}/{logger}"),
                    None => upstream.to_string(),
                };
                params.insert("logger".into(), Value::String(logger));
                let message = jsonrpc::notification(method, Some(Value::Object(params)));
                let source = self.upstream_named(upstream).ok();
                for session in self.live_sessions() {
                    // A 2026-07-28 request hears only from upstreams serving it.
                    let concerned = !session.is_scope()
                        || source
                            .as_ref()
                            .is_some_and(|source| source.has_call_from(session.id()));
                    if concerned
                        && owned_by(&session)
                        && session.shows_upstream(upstream)
                        && session.log_level().is_some_and(|wanted| level >= wanted)
                    {
                        session.notify(message.clone());
                    }
                }
            }
            "notifications/resources/updated" => {
                let Some(original) = params.get("uri").and_then(Value::as_str) else {
                    return;
                };
                let exposed = self.catalog().expose_uri(upstream, original);
                let mut params: Map<String, Value> =
                    params.as_object().cloned().unwrap_or_default();
                params.insert("uri".into(), Value::String(exposed.clone()));
                let message = jsonrpc::notification(method, Some(Value::Object(params)));
                for session in self.live_sessions() {
                    if owned_by(&session) && session.is_subscribed(&exposed) {
                        session.notify(message.clone());
                    }
                }
            }
            "notifications/elicitation/complete" => {
                let Some(id) = params.get("elicitationId").and_then(Value::as_str) else {
                    return;
                };
                if let Some((_, session)) =
                    self.elicitations
                        .remove(&(upstream.to_string(), owner, id.to_string()))
                {
                    if let Some(session) = self.session(session) {
                        session.notify(message.clone());
                    }
                }
            }
            "notifications/tasks/status" => {
                let mut params = params;
                let mut owner = None;
                crate::tasks::rewrite_task_ids(&mut params, &|id| {
                    Some(crate::tasks::expose_task_id(upstream, id))
                });
                if let Some(id) = params.get("taskId").and_then(Value::as_str) {
                    owner = self.task_routes.owner(id);
                }
                if let Some(session) = owner
                    .and_then(|id| self.session(id))
                    .filter(|session| owned_by(session))
                {
                    session.notify(jsonrpc::notification(method, Some(params)));
                }
            }
            "notifications/cancelled" => {
                // An upstream withdrew one of its requests: tell the client that holds it.
                if let Some(request_id) = params.get("requestId") {
                    for session in self.live_sessions().iter().filter(|s| owned_by(s)) {
                        session.withdraw_client_bound(upstream, request_id);
                    }
                }
            }
            _ => tracing::debug!(upstream, method, "upstream notification not relayed"),
        }
    }

    /// Answers, or passes to the right client, a request an upstream sent;
    /// `origin` is plexus's id of the request whose HTTP stream carried it.
    /// The answer plexus gives itself, or None when a client will answer.
    pub fn route_upstream_request(
        &self,
        upstream: &Upstream,
        instance: &Instance,
        connection: &UpstreamConnection,
        message: Value,
        origin: Option<u64>,
    ) -> Option<Reply> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let params = message.get("params").cloned();
        if method == "ping" {
            return Some(Reply::Result(json!({})));
        }
        let request = UpstreamRequest {
            id,
            method: &method,
            params,
            origin,
        };
        self.pass_to_client(upstream, instance, connection, request)
    }

    /// Returns the answer plexus gives itself, or None when a client will answer.
    fn pass_to_client(
        &self,
        upstream: &Upstream,
        instance: &Instance,
        connection: &UpstreamConnection,
        request: UpstreamRequest<'_>,
    ) -> Option<Reply> {
        let UpstreamRequest {
            id,
            method,
            params,
            origin,
        } = request;
        let name = upstream.name();
        let Some(capability) = required_capability(method, params.as_ref()) else {
            return Some(error(
                jsonrpc::METHOD_NOT_FOUND,
                format!("plexus does not relay `{method}` to clients"),
            ));
        };
        let callers = instance.callers();
        // Sent on the response stream of one of plexus's requests: it belongs to
        // that request's call, however many sessions have calls in flight.
        let originating = origin.and_then(|origin| {
            callers
                .iter()
                .find(|caller| caller.upstream_id == Some(origin))
                .cloned()
        });
        // A stream's request that no call claims (plexus's own request, or a call
        // that has ended) is judged as if no call were in flight.
        let unclaimed = if origin.is_some() {
            &[][..]
        } else {
            &callers[..]
        };
        // A handshake-era task's request names its task: it is for whoever holds
        // that task's `tasks/result`, whatever else is in flight.
        let holder = related_task(params.as_ref()).and_then(|task| {
            self.task_holders
                .get(&(name.to_string(), task.to_string()))
                .map(|holder| holder.clone())
        });
        let target = match originating.or(holder) {
            Some(call) => call,
            None => match self.caller_of(name, method, &capability, connection, unclaimed) {
                Ok(call) => call,
                Err(reply) => return Some(reply),
            },
        };
        let Some(session) = self.session(target.session) else {
            return Some(error(
                jsonrpc::INTERNAL_ERROR,
                "the client session has ended".into(),
            ));
        };
        if !session.has_capability(&capability) {
            return Some(error(
                jsonrpc::METHOD_NOT_FOUND,
                format!(
                    "the client did not declare the `{}` capability",
                    capability.join(".")
                ),
            ));
        }
        if method == "roots/list" {
            let mut askers = self
                .roots_askers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let asked = askers.entry(session.id()).or_default();
            if !asked.iter().any(|(upstream, _)| upstream == name) {
                asked.push((name.to_string(), connection.clone()));
            }
        }
        if method == "elicitation/create" {
            if let Some(elicitation) = params
                .as_ref()
                .and_then(|p| p.get("elicitationId"))
                .and_then(Value::as_str)
            {
                self.elicitations.insert(
                    (name.to_string(), instance.owner(), elicitation.to_string()),
                    session.id(),
                );
            }
        }
        let sink = target.related.as_ref().unwrap_or(session.outbound());
        if session.forward_to_client(sink, connection.clone(), id, method, params) {
            None
        } else {
            Some(error(
                jsonrpc::INTERNAL_ERROR,
                "the client's queue is full or closed".into(),
            ))
        }
    }

    /// Marks `holder` as the one waiting on `tasks/result` of the upstream's task
    /// `task`, until the guard drops.
    pub fn hold_task(
        self: &Arc<Self>,
        upstream: &str,
        task: &str,
        holder: Caller,
    ) -> TaskHolderGuard {
        let key = (upstream.to_string(), task.to_string());
        self.task_holders.insert(key.clone(), holder);
        TaskHolderGuard {
            fanout: Arc::downgrade(self),
            key,
        }
    }

    /// The call a request belongs to when nothing names it, judged from the calls
    /// in flight; or the answer plexus gives in its place.
    fn caller_of(
        &self,
        name: &str,
        method: &str,
        capability: &[&str],
        connection: &UpstreamConnection,
        callers: &[Caller],
    ) -> Result<Caller, Reply> {
        match callers {
            [] => {
                // The daemon's only client is the one to ask: there is no other.
                if let Some(session) = self.only_client_with(capability) {
                    return Ok(Caller::of_session(session));
                }
                // No call in flight: nothing says which client the request is for, and
                // plexus never guesses (a shared upstream would get one client's roots
                // or sampling on behalf of all).
                if method == "roots/list" {
                    // Many servers ask right after connecting: answer for now, and tell
                    // the upstream when a client with roots arrives, so it asks again.
                    let mut waiting = self
                        .roots_for_nobody
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    // One entry per upstream, however often it asks: its latest connection.
                    waiting.retain(|(upstream, _)| upstream != name);
                    waiting.push((name.to_string(), connection.clone()));
                    return Err(Reply::Result(json!({"roots": []})));
                }
                Err(error(
                    jsonrpc::INTERNAL_ERROR,
                    format!("no client call to upstream `{name}` is in flight, so plexus has no client to ask for `{method}` (it never guesses which client a request is for)"),
                ))
            }
            [only] => Ok(only.clone()),
            several => {
                let mut sessions: Vec<u64> = several.iter().map(|call| call.session).collect();
                sessions.dedup();
                if sessions.len() > 1 {
                    tracing::warn!(
                        upstream = name,
                        method,
                        sessions = sessions.len(),
                        "cannot tell which session an upstream request belongs to"
                    );
                    return Err(error(
                        jsonrpc::INTERNAL_ERROR,
                        format!(
                            "plexus cannot tell which of {} client sessions `{method}` is for; configure upstream `{name}` with share = \"session\"",
                            sessions.len()
                        ),
                    ));
                }
                // One session with several calls: its session stream, not one call's.
                let mut call = several[0].clone();
                call.related = None;
                Ok(call)
            }
        }
    }

    /// A client finished initializing: upstreams that were told "no roots" before any
    /// client could answer are told the roots changed, so they ask this one.
    pub fn client_initialized(&self, session: &dyn Client) {
        for connection in self.roots_waiters(session) {
            self.tasks.spawn(async move {
                let _ = connection
                    .notify("notifications/roots/list_changed", None)
                    .await;
            });
        }
    }

    /// A 2026-07-28 request from a client with roots: upstreams told "no roots" are
    /// told the roots changed before the request goes out, so the roots request
    /// they send next arrives while this request is in flight and reaches this client.
    pub async fn offer_roots(&self, scope: &dyn Client) {
        for connection in self.roots_waiters(scope) {
            let _ = connection
                .notify("notifications/roots/list_changed", None)
                .await;
        }
    }

    fn roots_waiters(&self, session: &dyn Client) -> Vec<UpstreamConnection> {
        if !session.has_capability(&["roots"]) {
            return Vec::new();
        }
        self.roots_for_nobody
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .map(|(_, connection)| connection)
            .collect()
    }

    /// A client's roots changed: tell the upstreams that asked it.
    pub fn roots_changed(&self, session: u64) {
        let askers = self
            .roots_askers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .cloned()
            .unwrap_or_default();
        for (_, connection) in askers {
            self.tasks.spawn(async move {
                let _ = connection
                    .notify("notifications/roots/list_changed", None)
                    .await;
            });
        }
    }

    /// The capabilities plexus can relay from the upstreams `shown` accepts, for
    /// `initialize` and `server/discover`.
    pub fn capabilities(&self, shown: impl Fn(&str) -> bool) -> Value {
        let mut logging = false;
        let mut completions = false;
        let mut subscribe = false;
        let mut tasks: Option<Value> = None;
        for upstream in self
            .upstreams()
            .values()
            .filter(|upstream| shown(upstream.name()))
        {
            let known = upstream.known_capabilities();
            if let Some(upstream_tasks) = known.get("tasks").filter(|t| t.is_object()) {
                // The union of what upstreams support; calls route to the one that has it.
                let merged = tasks.get_or_insert_with(|| json!({}));
                merge_objects(merged, upstream_tasks);
            }
            // A 2026-07-28 upstream's tasks extension, in the handshake era's terms
            // (no `list`: the extension has no `tasks/list`).
            if known
                .get("extensions")
                .and_then(|extensions| extensions.get(crate::era::TASKS_EXTENSION))
                .is_some_and(|value| !value.is_null())
            {
                let merged = tasks.get_or_insert_with(|| json!({}));
                merge_objects(
                    merged,
                    &json!({"cancel": {}, "requests": {"tools": {"call": {}}}}),
                );
            }
            logging |= known.get("logging").is_some_and(|v| !v.is_null());
            completions |= known.get("completions").is_some_and(|v| !v.is_null());
            subscribe |= known
                .get("resources")
                .and_then(|r| r.get("subscribe"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
        }
        let mut capabilities = json!({
            "tools": {"listChanged": true},
            "prompts": {"listChanged": true},
            "resources": {"listChanged": true, "subscribe": subscribe},
        });
        if logging {
            capabilities["logging"] = json!({});
        }
        if completions {
            capabilities["completions"] = json!({});
        }
        if let Some(tasks) = tasks {
            capabilities["tasks"] = tasks;
        }
        capabilities
    }

    /// Whether a 2026-07-28 upstream `shown` accepts offers the tasks extension.
    pub fn offers_tasks_extension(&self, shown: impl Fn(&str) -> bool) -> bool {
        self.upstreams()
            .values()
            .filter(|upstream| shown(upstream.name()))
            .any(|upstream| {
                upstream
                    .known_capabilities()
                    .get("extensions")
                    .and_then(|extensions| extensions.get(crate::era::TASKS_EXTENSION))
                    .is_some_and(|value| !value.is_null())
            })
    }
}

/// Forgets a task's holder when its `tasks/result` ends.
pub struct TaskHolderGuard {
    fanout: Weak<Fanout>,
    key: (String, String),
}

impl Drop for TaskHolderGuard {
    fn drop(&mut self) {
        if let Some(fanout) = self.fanout.upgrade() {
            fanout.task_holders.remove(&self.key);
        }
    }
}

/// The task a server-to-client request names (2025-11-25's related-task `_meta`).
fn related_task(params: Option<&Value>) -> Option<&str> {
    params?
        .get("_meta")?
        .get("io.modelcontextprotocol/related-task")?
        .get("taskId")?
        .as_str()
}

/// Adds every member of `from` that `into` lacks, recursively.
fn merge_objects(into: &mut Value, from: &Value) {
    let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) else {
        return;
    };
    for (key, value) in from {
        match into.get_mut(key) {
            Some(existing) => merge_objects(existing, value),
            None => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_requests_need_the_matching_client_capability() {
        assert_eq!(
            required_capability("sampling/createMessage", None),
            Some(vec!["sampling"])
        );
        let with_tools = json!({"messages": [], "tools": []});
        assert_eq!(
            required_capability("sampling/createMessage", Some(&with_tools)),
            Some(vec!["sampling", "tools"])
        );
        let url = json!({"mode": "url", "url": "https://example.invalid"});
        assert_eq!(
            required_capability("elicitation/create", Some(&url)),
            Some(vec!["elicitation", "url"])
        );
        assert_eq!(required_capability("roots/list", None), Some(vec!["roots"]));
        assert_eq!(required_capability("tasks/get", None), None);
    }
}
