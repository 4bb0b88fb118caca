//! Tasks for 2026-07-28 clients. That revision has no `tasks` capability: tasks
//! are its `io.modelcontextprotocol/tasks` extension, declared by the client per
//! request. The server decides which `tools/call` becomes a task and answers with
//! a flat `CreateTaskResult` (`resultType: "task"`); `tasks/get` inlines the
//! outcome (`result` or `error`); `tasks/update` and `tasks/cancel` are
//! acknowledged empty; there is no `tasks/list` and no `tasks/result`. plexus
//! serves the extension over handshake-era upstreams' tasks (`params.task`, a
//! nested `{task}`, `ttl` / `pollInterval`, `tasks/result`), and passes a
//! 2026-07-28 upstream's extension results through as they are.
//!
//! A handshake-era task that waits for input asks its client with requests
//! naming the task, sent while a `tasks/result` for it is held. For a
//! 2026-07-28 client, which cannot be sent requests, plexus holds that
//! `tasks/result` itself ([`HeldTasks`]) once `tasks/get` shows the task
//! `input_required`, keeps the requests the upstream sends as the task's
//! `inputRequests`, and answers them from `tasks/update`'s `inputResponses`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use adapters::Reply;
use dashmap::DashMap;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{InputNeeded, Session};
use crate::era::TASKS_EXTENSION as EXTENSION;
use crate::era::{self, RequestMeta};
use crate::jsonrpc::{self, RelayError};
use crate::upstreams::Caller;

/// How long a `tasks/get` on a task the upstream says waits for input waits for
/// the upstream's requests to arrive on the held `tasks/result` (it sends them
/// once that is held); without any, the task is shown `working`.
const REQUESTS_ARRIVE_WITHIN: Duration = Duration::from_secs(2);
/// How long plexus keeps asking for a task's result while its client answers
/// nothing (each `tasks/result` is bounded by the upstream's call timeout).
const HOLD_AT_MOST: Duration = super::CONTINUATION_TTL;

/// The key of a handshake-era task's own result `_meta`; the extension inlines
/// results without it.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Whether a request's client capabilities declare the extension.
pub fn declared(capabilities: &Value) -> bool {
    capabilities
        .get("extensions")
        .and_then(|extensions| extensions.get(EXTENSION))
        .is_some_and(|value| !value.is_null())
}

/// The refusal of a request that needs the extension from a client that did not
/// declare it.
pub fn missing(what: &str) -> RelayError {
    RelayError::MissingCapability {
        required: json!({"extensions": {EXTENSION: {}}}),
        reason: format!(
            "{what} needs the `{EXTENSION}` extension, which this request did not declare"
        ),
    }
}

/// What a 2026-07-28 client is offered: the handshake-era `tasks` slot, where
/// upstreams run tools as tasks, becomes the extension, which is also offered when
/// a 2026-07-28 upstream offers it (`upstream_extension`).
pub fn advertised(mut capabilities: Value, upstream_extension: bool) -> Value {
    let Some(object) = capabilities.as_object_mut() else {
        return capabilities;
    };
    let tools_as_tasks = object
        .remove("tasks")
        .is_some_and(|tasks| tasks.pointer("/requests/tools/call").is_some());
    if tools_as_tasks || upstream_extension {
        object.insert("extensions".into(), json!({ EXTENSION: {} }));
    }
    capabilities
}

/// A handshake-era task's fields under the extension's names.
fn task_fields(task: &Map<String, Value>) -> Map<String, Value> {
    let mut fields = Map::new();
    for (key, value) in task {
        let key = match key.as_str() {
            "ttl" => "ttlMs",
            "pollInterval" => "pollIntervalMs",
            other => other,
        };
        fields.insert(key.to_string(), value.clone());
    }
    // Required by the extension: null is "kept without limit".
    fields.entry("ttlMs").or_insert(Value::Null);
    fields
}

/// A `tools/call` answer for a 2026-07-28 client: a handshake-era
/// `CreateTaskResult` (`{task: {...}}`) becomes the extension's flat one.
pub fn created(reply: Reply) -> Reply {
    let Reply::Result(Value::Object(mut result)) = reply else {
        return reply;
    };
    let task = match result.remove("task") {
        Some(Value::Object(task)) if !result.contains_key("resultType") => task,
        Some(other) => {
            result.insert("task".into(), other);
            return Reply::Result(Value::Object(result));
        }
        None => return Reply::Result(Value::Object(result)),
    };
    let mut flat = task_fields(&task);
    flat.insert("resultType".into(), Value::from("task"));
    if let Some(meta) = result.remove("_meta") {
        flat.insert("_meta".into(), meta);
    }
    Reply::Result(Value::Object(flat))
}

/// Whether a handshake-era task has an outcome its `tasks/result` gives at once
/// (a cancelled one has none).
pub fn has_outcome(task: &Map<String, Value>) -> bool {
    matches!(
        task.get("status").and_then(Value::as_str),
        Some("completed" | "failed")
    )
}

/// Whether a `tasks/get` answer is a handshake-era upstream's (a bare task, no
/// result type), which the extension's needs building from.
pub fn is_handshake_task(reply: &Reply) -> bool {
    matches!(reply, Reply::Result(result) if result.get("resultType").is_none() && result.get("taskId").is_some())
}

/// The extension's `tasks/get` answer from a handshake-era task and, once it is
/// final, its `tasks/result` answer: the outcome inlined, a tool result that is an
/// error still `completed` (the extension keeps `failed` for JSON-RPC errors).
pub fn detailed(task: &Map<String, Value>, outcome: Option<Reply>) -> Value {
    let mut detailed = task_fields(task);
    match outcome.map(Reply::into_result) {
        Some(Ok(mut result)) => {
            if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove(RELATED_TASK);
                if meta.is_empty() {
                    result.as_object_mut().map(|r| r.remove("_meta"));
                }
            }
            detailed.insert("status".into(), Value::from("completed"));
            detailed.insert("result".into(), result);
        }
        Some(Err(error)) => {
            detailed.insert("status".into(), Value::from("failed"));
            detailed.insert("error".into(), error);
        }
        None => {}
    }
    Value::Object(detailed)
}

/// `tasks/cancel` and `tasks/update` answer with an empty acknowledgement; an
/// upstream's refusal to cancel a task that already ended (-32602 in the handshake
/// era) is acknowledged too, as the extension wants cancelling to be idempotent.
pub fn acknowledged(reply: Reply) -> Reply {
    match reply {
        Reply::Result(_) => Reply::Result(json!({})),
        Reply::Error(error)
            if error.get("code").and_then(Value::as_i64) == Some(jsonrpc::INVALID_PARAMS) =>
        {
            Reply::Result(json!({}))
        }
        other => other,
    }
}

/// Whether an answer is the extension's (a 2026-07-28 upstream's task), which a
/// handshake-era client needs in its own shape.
pub fn is_extension_answer(reply: &Reply) -> bool {
    matches!(reply, Reply::Result(result) if result.get("resultType").is_some())
}

/// The extension's task fields under the handshake era's names, without what that
/// era's `Task` has no place for (the inlined outcome, pending input).
fn handshake_fields(task: &Map<String, Value>) -> Map<String, Value> {
    let mut fields = Map::new();
    for (key, value) in task {
        let key = match key.as_str() {
            "ttlMs" => "ttl",
            "pollIntervalMs" => "pollInterval",
            "resultType" | "result" | "error" | "inputRequests" => continue,
            other => other,
        };
        fields.insert(key.to_string(), value.clone());
    }
    fields
}

/// A 2026-07-28 upstream's `CreateTaskResult` as a handshake-era client's
/// (`{task: {...}}`); any other answer passes as it is.
pub fn nested(reply: Reply) -> Reply {
    match reply {
        Reply::Result(Value::Object(result))
            if result.get("resultType").and_then(Value::as_str) == Some("task") =>
        {
            let mut created = Map::new();
            if let Some(meta) = result.get("_meta") {
                created.insert("_meta".into(), meta.clone());
            }
            created.insert("task".into(), Value::Object(handshake_fields(&result)));
            Reply::Result(Value::Object(created))
        }
        other => other,
    }
}

/// A 2026-07-28 upstream's `tasks/get` answer as the handshake era's `Task`: a tool
/// error is `failed` there.
pub fn handshake_task(reply: Reply) -> Reply {
    let Reply::Result(Value::Object(detailed)) = reply else {
        return reply;
    };
    let mut task = handshake_fields(&detailed);
    let tool_error = detailed
        .get("result")
        .and_then(|result| result.get("isError"))
        .and_then(Value::as_bool)
        == Some(true);
    if tool_error {
        task.insert("status".into(), Value::from("failed"));
    }
    Reply::Result(Value::Object(task))
}

/// What the handshake era's `tasks/result` answers for a finished 2026-07-28 task
/// (its `tasks/get` answer): the result, with the related-task `_meta` that era
/// requires, or the error; `None` while it runs.
pub fn final_outcome(detailed: &Value, task_id: &str) -> Option<Reply> {
    match detailed.get("status").and_then(Value::as_str)? {
        "completed" => {
            let mut result = detailed.get("result").cloned().unwrap_or_else(|| json!({}));
            if let Value::Object(result) = &mut result {
                let meta = result
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(meta) = meta {
                    meta.insert(RELATED_TASK.into(), json!({ "taskId": task_id }));
                }
            }
            Some(Reply::Result(result))
        }
        "failed" => Some(Reply::Error(detailed.get("error").cloned().unwrap_or_else(
            || json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the task failed"}),
        ))),
        "cancelled" => Some(Reply::Error(json!({
            "code": jsonrpc::INVALID_PARAMS,
            "message": format!("task `{task_id}` was cancelled"),
        }))),
        _ => None,
    }
}

/// Handshake-era tasks of 2026-07-28 clients whose `tasks/result` plexus holds,
/// by the task id the client knows.
#[derive(Default)]
pub struct HeldTasks {
    held: DashMap<String, Arc<Held>>,
}

/// One held task: the upstream's requests not answered yet, each under a key.
pub struct Held {
    pending: Mutex<Vec<(String, InputNeeded)>>,
    next_key: AtomicU64,
    arrived: Notify,
    /// Ends the held `tasks/result` (the front closes, or the task is forgotten).
    stop: CancellationToken,
    hub: Arc<crate::hub::Hub>,
}

impl HeldTasks {
    pub fn get(&self, task: &str) -> Option<Arc<Held>> {
        self.held.get(task).map(|held| held.clone())
    }

    /// Ends every held `tasks/result` (the front is closing).
    pub fn clear(&self) {
        for held in self.held.iter() {
            held.stop.cancel();
        }
        self.held.clear();
    }
}

impl Held {
    fn add(&self, input: InputNeeded) {
        let key = format!(
            "{}-{}",
            input.method.replace('/', "-"),
            self.next_key.fetch_add(1, Ordering::Relaxed) + 1
        );
        self.lock().push((key, input));
        self.arrived.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, InputNeeded)>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The extension's `inputRequests`: each pending request under its key.
    fn input_requests(&self) -> Map<String, Value> {
        let mut requests = Map::new();
        for (key, input) in self.lock().iter() {
            let mut params = input.params.clone();
            era::to_input_request(&input.method, &mut params);
            // It names the upstream's task id; the task is the one asked about.
            if let Some(meta) = params
                .as_mut()
                .and_then(|params| params.get_mut("_meta"))
                .and_then(Value::as_object_mut)
            {
                meta.remove(RELATED_TASK);
            }
            let mut request = json!({ "method": input.method });
            if let Some(params) = params {
                request["params"] = params;
            }
            requests.insert(key.clone(), request);
        }
        requests
    }

    /// Waits up to `within` for at least one request; whether there is one.
    async fn wait_for_requests(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let arrived = self.arrived.notified();
            if !self.lock().is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return !self.lock().is_empty();
            }
        }
    }

    /// Passes the answers whose keys are pending to the upstream, under its own
    /// request ids; other keys are ignored, as the extension asks.
    pub async fn answer(&self, responses: &Map<String, Value>) {
        let answered: Vec<(InputNeeded, Value)> = {
            let mut pending = self.lock();
            let mut answered = Vec::new();
            let mut kept = Vec::new();
            for (key, input) in pending.drain(..) {
                match responses.get(&key) {
                    Some(response) => answered.push((input, response.clone())),
                    None => kept.push((key, input)),
                }
            }
            *pending = kept;
            answered
        };
        for (input, response) in answered {
            if input
                .connection
                .respond(input.upstream_id, Reply::Result(response))
                .await
                .is_err()
            {
                tracing::debug!("the upstream went away before the client answered it");
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The task ended or was given up: release what its upstream still asks.
        self.stop.cancel();
        let pending = std::mem::take(
            self.pending
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (_, input) in pending {
            let error =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client did not answer"});
            self.hub.spawn(async move {
                let _ = input
                    .connection
                    .respond(input.upstream_id, Reply::Error(error))
                    .await;
            });
        }
    }
}

impl Session {
    /// The held task `task`, holding its `tasks/result` upstream from now on if
    /// nothing does yet; its requests reach a scope with this request's
    /// capabilities.
    fn hold_task(&self, task: &str) -> Arc<Held> {
        let tasks = &self.paused().tasks;
        let held = match tasks.held.entry(task.to_string()) {
            dashmap::mapref::entry::Entry::Occupied(held) => return held.get().clone(),
            dashmap::mapref::entry::Entry::Vacant(vacant) => vacant
                .insert(Arc::new(Held {
                    pending: Mutex::new(Vec::new()),
                    next_key: AtomicU64::new(0),
                    arrived: Notify::new(),
                    stop: CancellationToken::new(),
                    hub: self.hub().clone(),
                }))
                .clone(),
        };
        let (scope, channels) = self.scope(RequestMeta {
            capabilities: crate::fanout::Client::declared_capabilities(self),
            log_level: self.log_level(),
        });
        let paused = self.paused().clone();
        let task = task.to_string();
        let holding = held.clone();
        self.hub().spawn(async move {
            hold_result(&scope, channels, &holding, &task).await;
            paused
                .tasks
                .held
                .remove_if(&task, |_, held| Arc::ptr_eq(held, &holding));
            scope.close();
        });
        held
    }
}

/// Holds `tasks/result` of a handshake-era task upstream until it answers with the
/// task's outcome, keeping the requests the upstream sends meanwhile; asked again
/// when one times out, for up to [`HOLD_AT_MOST`] without news from the client.
async fn hold_result(
    scope: &Arc<Session>,
    mut channels: super::ScopeChannels,
    held: &Held,
    task: &str,
) {
    let sink = scope.outbound().clone();
    // The upstream's requests name the task: they are this scope's, whatever
    // else is in flight on the upstream.
    let hub = scope.hub();
    let _holding = hub
        .task_routes
        .route(task, |name| hub.upstreams().contains_key(name))
        .map(|(upstream, original)| {
            hub.fanout
                .hold_task(&upstream, &original, Caller::of_session(scope.id))
        });
    let started = Instant::now();
    while started.elapsed() < HOLD_AT_MOST {
        let result = scope.hub().forward_task_request(
            "tasks/result",
            Some(json!({ "taskId": task })),
            scope.call_context(None, &sink),
        );
        tokio::pin!(result);
        let outcome = loop {
            tokio::select! {
                outcome = &mut result => break outcome,
                Some(input) = channels.inputs.recv() => held.add(*input),
                // Progress and logs have no stream to go to: the client polls.
                Some(_) = channels.events.recv() => {}
                () = held.stop.cancelled() => return,
            }
        };
        if !matches!(outcome, Err(RelayError::Timeout { .. })) {
            return;
        }
    }
}

impl Session {
    /// A 2026-07-28 client's `tasks/get` of a handshake-era task that waits for
    /// input: `input_required` with the requests the upstream sent on the held
    /// `tasks/result`, or `working` while it has sent none plexus could pass on.
    pub(super) async fn task_waiting_for_input(
        &self,
        exposed: &str,
        task: &Map<String, Value>,
    ) -> Value {
        let held = self.hold_task(exposed);
        let mut detailed = task_fields(task);
        if held.wait_for_requests(REQUESTS_ARRIVE_WITHIN).await {
            detailed.insert("inputRequests".into(), Value::Object(held.input_requests()));
        } else {
            detailed.insert("status".into(), Value::from("working"));
            detailed.remove("statusMessage");
        }
        Value::Object(detailed)
    }
}

impl Session {
    /// A 2026-07-28 client's `tasks/update`, when the task is a handshake-era
    /// upstream's (that era has no such method, so it is plexus's to serve): the
    /// answers go to the requests the held task's upstream sent; `None` for a
    /// 2026-07-28 upstream's task, which takes it itself.
    pub(super) async fn update_handshake_task(
        &self,
        params: &Option<Value>,
        related: &tokio::sync::mpsc::Sender<Value>,
    ) -> Result<Option<Reply>, RelayError> {
        let exposed = params
            .as_ref()
            .and_then(|params| params.get("taskId"))
            .and_then(Value::as_str)
            .ok_or_else(|| RelayError::InvalidParams("`taskId` must be a string".into()))?;
        let responses = params
            .as_ref()
            .and_then(|params| params.get("inputResponses"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(held) = self.paused().tasks.get(exposed) {
            held.answer(&responses).await;
            return Ok(Some(Reply::Result(json!({}))));
        }
        let hub = self.hub();
        let handshake = hub
            .task_routes
            .route(exposed, |name| hub.upstreams().contains_key(name))
            .and_then(|(upstream, _)| hub.upstreams().get(&upstream).cloned())
            .is_some_and(|upstream| upstream.speaks_handshake());
        if !handshake {
            return Ok(None);
        }
        // Nothing of it waits on plexus: an update of a task that exists is
        // acknowledged, one of an unknown task gets the upstream's refusal.
        let reply = hub
            .forward_task_request(
                "tasks/get",
                params.clone(),
                self.call_context(None, related),
            )
            .await?;
        Ok(Some(match reply {
            Reply::Result(_) => Reply::Result(json!({})),
            error => error,
        }))
    }
}

/// Whether a handshake-era task waits for its client's input.
pub fn waits_for_input(task: &Map<String, Value>) -> bool {
    task.get("status").and_then(Value::as_str) == Some("input_required")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_task_becomes_the_extensions_flat_task() {
        let nested = Reply::Result(json!({
            "task": {"taskId": "u:1", "status": "working", "ttl": 60000, "pollInterval": 500,
                     "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z"},
            "_meta": {"k": 1},
        }));
        let Reply::Result(flat) = created(nested) else {
            panic!("not a result");
        };
        assert_eq!(flat["resultType"], "task");
        assert_eq!(flat["taskId"], "u:1");
        assert_eq!(flat["ttlMs"], 60000);
        assert_eq!(flat["pollIntervalMs"], 500);
        assert!(flat.get("task").is_none() && flat.get("ttl").is_none());
        assert_eq!(flat["_meta"]["k"], 1);
        // An ordinary result and a 2026-07-28 task pass as they are.
        let plain = Reply::Result(json!({"content": []}));
        assert_eq!(created(plain.clone()), plain);
        let modern = Reply::Result(json!({"resultType": "task", "taskId": "x", "ttlMs": null}));
        assert_eq!(created(modern.clone()), modern);
    }

    #[test]
    fn a_finished_task_inlines_its_outcome() {
        let task = json!({"taskId": "u:1", "status": "failed", "ttl": null})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let errored_tool = Reply::Result(json!({
            "content": [], "isError": true,
            "_meta": {RELATED_TASK: {"taskId": "1"}},
        }));
        let got = detailed(&task, Some(errored_tool));
        assert_eq!(got["status"], "completed");
        assert_eq!(got["result"]["isError"], true);
        assert!(got["result"].get("_meta").is_none(), "{got}");
        let failed = detailed(
            &task,
            Some(Reply::Error(json!({"code": -32603, "message": "x"}))),
        );
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"]["code"], -32603);
        assert!(failed.get("ttl").is_none() && failed["ttlMs"].is_null());
    }

    #[test]
    fn the_tasks_slot_becomes_the_extension() {
        let offered = advertised(
            json!({"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}}}),
            false,
        );
        assert!(offered.get("tasks").is_none());
        assert!(declared(&offered));
        let none = advertised(json!({"tools": {}, "tasks": {"list": {}}}), false);
        assert!(none.get("tasks").is_none() && none.get("extensions").is_none());
        assert!(declared(&advertised(json!({"tools": {}}), true)));
        assert_eq!(
            acknowledged(Reply::Result(json!({"status": "cancelled"}))),
            Reply::Result(json!({}))
        );
        assert_eq!(
            acknowledged(Reply::Error(json!({"code": -32602, "message": "terminal"}))),
            Reply::Result(json!({}))
        );
    }

    #[test]
    fn an_extension_task_reaches_a_handshake_client_in_its_shape() {
        let flat = Reply::Result(
            json!({"resultType": "task", "taskId": "u:1", "status": "working", "ttlMs": 1000, "pollIntervalMs": 50}),
        );
        let Reply::Result(created) = nested(flat) else {
            panic!("not a result");
        };
        assert_eq!(created["task"]["ttl"], 1000);
        assert_eq!(created["task"]["pollInterval"], 50);
        assert!(created["task"].get("resultType").is_none());
        let done = json!({"resultType": "complete", "taskId": "u:1", "status": "completed", "ttlMs": null,
                          "result": {"content": [], "isError": true}});
        let Reply::Result(task) = handshake_task(Reply::Result(done.clone())) else {
            panic!("not a result");
        };
        assert_eq!(task["status"], "failed");
        assert!(task.get("result").is_none() && task["ttl"].is_null());
        let Some(Reply::Result(outcome)) = final_outcome(&done, "u:1") else {
            panic!("no outcome");
        };
        assert_eq!(outcome["isError"], true);
        assert_eq!(outcome["_meta"][RELATED_TASK]["taskId"], "u:1");
        assert_eq!(final_outcome(&json!({"status": "working"}), "u:1"), None);
    }
}
