//! What flows from upstreams to sessions: server-to-client requests (to the one
//! session whose call caused them), log messages (to sessions that set a level),
//! resource updates (to subscribed sessions), and the reference counts and levels
//! plexus keeps upstream on the sessions' behalf. `Fanout` and the sessions it
//! knows are here; server-to-client requests in `requests`, what upstreams say on
//! their own and the log level in `notifications`, reference counts in
//! `subscriptions`.

mod notifications;
mod requests;
mod subscriptions;

pub(crate) use requests::required_capability;
pub use requests::TaskHolderGuard;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use adapters::UpstreamConnection;
use dashmap::DashMap;
use registry::{Catalog, Kind, Route};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::catalog_host::CatalogHost;
use crate::jsonrpc::RelayError;
use crate::logging::LogLevel;
use crate::tasks::{TaskOwner, TaskRoutes};
use crate::upstreams::{Caller, Upstream, UpstreamSet};

/// What the fan-out needs of a downstream session (implemented by `Session`).
pub trait Client: Send + Sync {
    fn id(&self) -> u64;
    /// The scope of one 2026-07-28 request rather than a connected client.
    fn is_scope(&self) -> bool;
    /// Who opened it (the front's authenticated principal).
    fn principal(&self) -> Arc<str>;
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
    /// Sends an upstream's request to the client on `sink`, traced under `trace`
    /// (the call it belongs to); false if it cannot take it.
    fn forward_to_client(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        params: Option<Value>,
        trace: Option<&crate::telemetry::CallTrace>,
    ) -> bool;
    /// An upstream withdrew one of its requests.
    fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value);
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

    /// Who the tasks a session's request creates belong to: a connected client
    /// is told of their status; a 2026-07-28 request's scope, which ends with
    /// its answer, leaves them to its principal's listens.
    pub fn task_owner(&self, session: Option<u64>) -> TaskOwner {
        match session.and_then(|id| self.session(id)) {
            Some(client) => TaskOwner {
                session: (!client.is_scope()).then(|| client.id()),
                principal: Some(client.principal()),
            },
            None => TaskOwner {
                session,
                principal: None,
            },
        }
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
            // Never heard from and nothing cached (a first `serve --stdio` answers
            // `initialize` before its upstreams start): capabilities cannot be added
            // later in a session, so announce what the upstream may have. A request
            // it then lacks fails alone; a capability left out would go unused all
            // session long (clients gate logging and completion on it).
            if known.is_null() {
                logging = true;
                completions = true;
                subscribe = true;
                continue;
            }
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
