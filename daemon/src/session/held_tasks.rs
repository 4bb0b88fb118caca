//! Handshake-era tasks of 2026-07-28 clients that wait for input: plexus holds
//! their `tasks/result` upstream ([`HeldTasks`]), keeps the requests the upstream
//! sends on it, and answers them from the client's `tasks/update`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

use adapters::Reply;
use dashmap::DashMap;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Session;
use crate::era::bridge::{InputNeeded, ScopeChannels, CONTINUATION_TTL};
use crate::era::tasks::RELATED_TASK;
use crate::era::{self, RequestMeta};
use crate::jsonrpc::RelayError;
use crate::upstreams::Caller;

/// How long plexus keeps asking for a task's result while its client answers
/// nothing (each `tasks/result` is bounded by the upstream's call timeout).
const HOLD_AT_MOST: Duration = CONTINUATION_TTL;

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
    pub(super) fn input_requests(&self) -> Map<String, Value> {
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
    pub(super) async fn wait_for_requests(&self, within: Duration) -> bool {
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
            self.hub.spawn(input.unanswered());
        }
    }
}

/// The held task `task`, holding its `tasks/result` upstream from now on if
/// nothing does yet; its requests reach a scope with this request's
/// capabilities.
pub(super) fn hold(session: &Session, task: &str) -> Arc<Held> {
    let tasks = &session.paused().tasks;
    let held = match tasks.held.entry(task.to_string()) {
        dashmap::mapref::entry::Entry::Occupied(held) => return held.get().clone(),
        dashmap::mapref::entry::Entry::Vacant(vacant) => vacant
            .insert(Arc::new(Held {
                pending: Mutex::new(Vec::new()),
                next_key: AtomicU64::new(0),
                arrived: Notify::new(),
                stop: CancellationToken::new(),
                hub: session.hub().clone(),
            }))
            .clone(),
    };
    let (scope, channels) = session.scope(RequestMeta {
        capabilities: crate::fanout::Client::declared_capabilities(session),
        log_level: session.log_level(),
    });
    let paused = session.paused().clone();
    let task = task.to_string();
    let holding = held.clone();
    session.hub().spawn(async move {
        hold_result(&scope, channels, &holding, &task).await;
        paused
            .tasks
            .held
            .remove_if(&task, |_, held| Arc::ptr_eq(held, &holding));
        scope.close();
    });
    held
}

/// Holds `tasks/result` of a handshake-era task upstream until it answers with the
/// task's outcome, keeping the requests the upstream sends meanwhile; asked again
/// when one times out, for up to [`HOLD_AT_MOST`] without news from the client.
async fn hold_result(scope: &Arc<Session>, mut channels: ScopeChannels, held: &Held, task: &str) {
    let sink = scope.outbound().clone();
    // The upstream's requests name the task: they are this scope's, whatever
    // else is in flight on the upstream.
    let hub = scope.hub();
    let _holding = hub.task_route(task).map(|(upstream, original)| {
        hub.hold_task(&upstream, &original, Caller::of_session(scope.id))
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

/// A 2026-07-28 client's `tasks/update`, when the task is a handshake-era
/// upstream's (that era has no such method, so it is plexus's to serve): the
/// answers go to the requests the held task's upstream sent; `None` for a
/// 2026-07-28 upstream's task, which takes it itself.
pub(super) async fn update(
    session: &Session,
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
    if let Some(held) = session.paused().tasks.get(exposed) {
        held.answer(&responses).await;
        return Ok(Some(Reply::Result(json!({}))));
    }
    let hub = session.hub();
    let handshake = hub
        .task_route(exposed)
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
            session.call_context(None, related),
        )
        .await?;
    Ok(Some(match reply {
        Reply::Result(_) => Reply::Result(json!({})),
        error => error,
    }))
}
