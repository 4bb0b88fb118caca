//! 2026-07-28 requests, each served in a scope of its own: a first attempt
//! starts there, and one an upstream asks the client something during is paused
//! through the era layer (`era::bridge`) until the client's retry resumes it.
//! Also `subscriptions/listen`, the revision's one long-lived request, and the
//! front's table of what waits on its 2026-07-28 clients ([`Continuations`]).

use std::sync::Arc;

use adapters::{Reply, WrittenMember};
use registry::Kind;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::dispatch::Dispatch;
use super::held_tasks::HeldTasks;
use super::task_extension;
use super::{CloseOnDrop, Session};
use crate::era::bridge::{self, PausedCalls};
use crate::era::{self, RequestMeta};
use crate::hub::Hub;
use crate::jsonrpc::{self, RelayError};

/// What waits on a front's 2026-07-28 clients: requests paused on their input,
/// and handshake-era tasks whose input plexus asks for on their behalf.
pub struct Continuations {
    pub calls: Arc<PausedCalls>,
    pub tasks: HeldTasks,
}

impl Continuations {
    /// Their tasks run on the hub's tracker, awaited at shutdown.
    pub fn new(hub: &Hub) -> Continuations {
        Continuations {
            calls: Arc::new(PausedCalls::new(hub.tracker().clone())),
            tasks: HeldTasks::default(),
        }
    }

    /// Releases every paused call and held task and their upstream requests (the
    /// front is closing).
    pub fn clear(&self) {
        self.calls.clear();
        self.tasks.clear();
    }
}

impl bridge::Scope for Session {
    fn close(&self) {
        Session::close(self);
    }
}

/// Serves one 2026-07-28 request other than discovery and listening: a first
/// attempt starts it in a scope of its own; a retry resumes the paused call.
pub async fn serve(
    parent: &Session,
    method: &str,
    params: Option<Value>,
    arguments: Option<WrittenMember>,
    meta: RequestMeta,
    related: &mpsc::Sender<Value>,
) -> Result<Reply, RelayError> {
    bridge::check_retry_members(params.as_ref())?;
    let hub = parent.hub().clone();
    let paused = parent.paused().calls.clone();
    let principal = &parent.identity.principal;
    if let Some(resumed) = paused.resume(method, &params, related, principal).await {
        return resumed;
    }
    let attempt = bridge::FirstAttempt::of(method, &params, principal.clone());
    let (scope, channels) = parent.scope(meta);
    if scope.log_level().is_some_and(|wanted| {
        hub.current_log_level()
            .is_none_or(|current| wanted < current)
    }) {
        hub.log_levels_changed().await;
    }
    hub.offer_roots(&*scope).await;
    let work = {
        let scope = scope.clone();
        let method = method.to_string();
        async move {
            let sink = scope.outbound().clone();
            Dispatch::new(&scope, &sink)
                .serve(&method, params, arguments)
                .await
        }
    };
    paused.start(scope, channels, work, attempt, related).await
}

/// `subscriptions/listen`: list changes, resource updates and task status for
/// the kinds, URIs and task ids the client names, each tagged with the request's id, until the client
/// goes away or a shutdown begins (the stream ends before the fronts drain).
pub async fn listen(
    parent: &Session,
    id: &Value,
    params: Option<Value>,
    meta: RequestMeta,
    related: &mpsc::Sender<Value>,
) -> Result<Reply, RelayError> {
    let hub = parent.hub().clone();
    let filter = params
        .as_ref()
        .and_then(|p| p.get("notifications"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let wants = |key: &str| filter.get(key).and_then(Value::as_bool) == Some(true);
    let mut kinds = Vec::new();
    let mut honoured = Map::new();
    for (key, kind) in [
        ("toolsListChanged", &[Kind::Tools][..]),
        ("promptsListChanged", &[Kind::Prompts][..]),
        (
            "resourcesListChanged",
            &[Kind::Resources, Kind::ResourceTemplates][..],
        ),
    ] {
        if wants(key) {
            kinds.extend_from_slice(kind);
            honoured.insert(key.into(), Value::Bool(true));
        }
    }
    // The tasks extension's rule for a listen naming tasks.
    if filter.contains_key("taskIds") && !era::tasks::declared(&meta.capabilities) {
        return Err(era::tasks::missing("a listen for task status"));
    }
    let (scope, mut channels) = parent.scope(meta);
    let _closing = CloseOnDrop(scope.clone());
    let catalog = scope.catalog();
    let mut uris = Vec::new();
    if let Some(Value::Array(requested)) = filter.get("resourceSubscriptions") {
        for uri in requested.iter().filter_map(Value::as_str) {
            let Some(route) = catalog.route_resource(uri) else {
                continue;
            };
            // One refused (upstream, or beyond the session's bound) is not
            // honoured: the acknowledgement names those that are.
            match scope.subscribe(uri, &route).await {
                Ok(true) => uris.push(Value::String(uri.to_string())),
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(%error, uri, "a listen stream's subscription was refused");
                }
            }
        }
    }
    if filter.contains_key("resourceSubscriptions") {
        honoured.insert("resourceSubscriptions".into(), Value::Array(uris));
    }
    if let Some(requested) = filter.get("taskIds") {
        let listened = task_extension::listen(&scope, requested);
        honoured.insert("taskIds".into(), Value::Array(listened));
    }
    let acknowledged = jsonrpc::notification(
        "notifications/subscriptions/acknowledged",
        Some(json!({ "notifications": honoured })),
    );
    if related
        .send(era::tag_subscription(acknowledged, id))
        .await
        .is_err()
    {
        return Err(RelayError::InvalidRequest("the client went away".into()));
    }
    let mut catalogs = hub.subscribe();
    let mut last = catalogs.borrow_and_update().view(scope.view());
    loop {
        tokio::select! {
            _ = hub.streams_ending() => break,
            changed = catalogs.changed() => {
                if changed.is_err() {
                    break;
                }
                let current = catalogs.borrow_and_update().view(scope.view());
                let mut methods: Vec<&str> = kinds
                    .iter()
                    .filter(|kind| last.digest(**kind) != current.digest(**kind))
                    .map(|kind| kind.list_changed_method())
                    .collect();
                methods.dedup();
                last = current;
                for method in methods {
                    let message = era::tag_subscription(jsonrpc::notification(method, None), id);
                    if related.send(message).await.is_err() {
                        return Err(RelayError::InvalidRequest("the client went away".into()));
                    }
                }
            }
            Some(message) = channels.events.recv() => {
                let told = match message.get("method").and_then(Value::as_str) {
                    Some("notifications/resources/updated") => Some(message),
                    Some("notifications/tasks/status" | "notifications/tasks") => {
                        task_extension::status(&scope, &message, related).await
                    }
                    // Log messages belong to requests, not to this stream.
                    _ => None,
                };
                if let Some(message) = told {
                    if related.send(era::tag_subscription(message, id)).await.is_err() {
                        return Err(RelayError::InvalidRequest("the client went away".into()));
                    }
                }
            }
        }
    }
    Ok(Reply::Result(json!({
        "resultType": "complete",
        "_meta": {era::META_SUBSCRIPTION_ID: id},
    })))
}
