//! The bridge between eras for 2026-07-28 clients. Such a client cannot be sent
//! requests: when a handshake-era upstream asks for sampling, elicitation or
//! roots while serving the client's request, plexus answers the client with an
//! input-required result and keeps the upstream call waiting. The client's retry
//! names the paused call by `requestState`; its `inputResponses` go to the
//! upstream as the answers, and the retry receives what follows (the final
//! result, or the next input-required result).
//!
//! Also `subscriptions/listen`, the revision's one long-lived request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use adapters::{Reply, WrittenMember};
use dashmap::DashMap;
use registry::Kind;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{CloseOnDrop, InputNeeded, ScopeChannels, Session, CONTINUATION_TTL};
use crate::era::{self, RequestMeta};
use crate::jsonrpc::{self, RelayError};

/// Marks a `requestState` plexus issued, as opposed to one an upstream issued.
const STATE_PREFIX: &str = "plexus.";
/// How long after an upstream's request to the client another may still join its
/// round, and how long a round may be gathered in all.
const GATHER_QUIET: Duration = Duration::from_millis(20);
const GATHER_AT_MOST: Duration = Duration::from_millis(200);

/// Requests paused on input from a 2026-07-28 client, by `requestState`; each
/// is dropped (and its upstream call cancelled) when not retried within
/// [`CONTINUATION_TTL`].
#[derive(Default)]
pub struct Continuations {
    paused: DashMap<String, Continuation>,
    /// Handshake-era tasks whose input plexus asks for on their behalf.
    pub tasks: super::held_tasks::HeldTasks,
    /// Cancelled by `clear`: the expiry timers end with the front.
    closed: CancellationToken,
}

impl Continuations {
    fn take(&self, state: &str) -> Option<Continuation> {
        self.paused
            .remove(state)
            .map(|(_, continuation)| continuation)
    }

    fn keep(self: &Arc<Self>, state: String, continuation: Continuation, ttl: bool) {
        self.paused.insert(state.clone(), continuation);
        if !ttl {
            return;
        }
        let expiring = Arc::downgrade(self);
        let closed = self.closed.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(CONTINUATION_TTL) => {}
                _ = closed.cancelled() => return,
            }
            if let Some(paused) = expiring.upgrade() {
                if paused.paused.remove(&state).is_some() {
                    tracing::info!("a paused request was not retried in time; cancelled");
                }
            }
        });
    }

    /// Releases every paused call and its upstream requests (the front is closing).
    pub fn clear(&self) {
        self.closed.cancel();
        self.paused.clear();
        self.tasks.clear();
    }
}

/// A request paused on input from a 2026-07-28 client.
struct Continuation {
    scope: Arc<Session>,
    work: Work,
    channels: ScopeChannels,
    /// Upstream requests the client has been asked to answer, by input key.
    pending: Vec<(String, InputNeeded)>,
    next_key: u64,
    method: String,
    target: Option<String>,
    /// The progress token of the attempt that started the call: the upstream's
    /// progress is announced under it, and each retry's own token replaces it.
    first_token: Option<Value>,
}

impl Drop for Continuation {
    fn drop(&mut self) {
        // Abandoned (expired, cancelled, or shut down): stop the upstream call and
        // release the upstream's pending requests instead of leaving them to time out.
        self.work.abort();
        self.scope.close();
        for (_, input) in self.pending.drain(..) {
            let error =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client did not answer"});
            self.scope.hub().spawn(async move {
                let _ = input
                    .connection
                    .respond(input.upstream_id, Reply::Error(error))
                    .await;
            });
        }
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
    check_retry_members(params.as_ref())?;
    let hub = parent.hub().clone();
    let paused = parent.paused().clone();
    let state = params
        .as_ref()
        .and_then(|p| p.get("requestState"))
        .and_then(Value::as_str)
        .filter(|state| state.starts_with(STATE_PREFIX))
        .map(str::to_string);
    if let Some(state) = state {
        let mut continuation = paused.take(&state).ok_or_else(|| {
            RelayError::InvalidParams("`requestState` is unknown or has expired".into())
        })?;
        if continuation.method != method || continuation.target != target_of(method, &params) {
            // Put it back: a stray retry must not cancel the real one.
            let message = format!(
                "`requestState` belongs to a `{}` request, not this one",
                continuation.method
            );
            paused.keep(state, continuation, false);
            return Err(RelayError::InvalidParams(message));
        }
        let responses = params
            .as_ref()
            .and_then(|p| p.get("inputResponses"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        continuation.answer(responses).await;
        let token = progress_token(&params);
        return continuation.drive(&paused, related, token).await;
    }
    let target = target_of(method, &params);
    let first_token = progress_token(&params);
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
        Work::InPlace(Mutex::new(Box::pin(async move {
            let sink = scope.outbound().clone();
            scope.dispatch(&method, params, arguments, &sink).await
        })))
    };
    Continuation {
        scope,
        work,
        channels,
        pending: Vec::new(),
        next_key: 0,
        method: method.to_string(),
        target,
        first_token: first_token.clone(),
    }
    .drive(&paused, related, first_token)
    .await
}

/// A retry's members as the schema has them: `requestState` a string,
/// `inputResponses` an object. Passed on otherwise, an upstream's SDK refuses the
/// request with an error that does not say which member is wrong.
fn check_retry_members(params: Option<&Value>) -> Result<(), RelayError> {
    let member = |name| params.and_then(|params| params.get(name));
    if member("requestState").is_some_and(|state| !state.is_string()) {
        return Err(RelayError::InvalidParams(
            "`requestState` must be a string".into(),
        ));
    }
    if member("inputResponses").is_some_and(|responses| !responses.is_object()) {
        return Err(RelayError::InvalidParams(
            "`inputResponses` must be an object".into(),
        ));
    }
    Ok(())
}

fn progress_token(params: &Option<Value>) -> Option<Value> {
    params.as_ref()?.get("_meta")?.get("progressToken").cloned()
}

/// The member a retry must repeat to resume a paused call: the tool or prompt
/// name, or the resource URI.
fn target_of(method: &str, params: &Option<Value>) -> Option<String> {
    era::mirrored_name(method, params.as_ref())
        .flatten()
        .map(str::to_string)
}

impl Continuation {
    /// Runs the call until it completes or needs input; relays its progress and
    /// log messages to the current attempt's stream meanwhile.
    async fn drive(
        mut self,
        paused: &Arc<Continuations>,
        related: &mpsc::Sender<Value>,
        token: Option<Value>,
    ) -> Result<Reply, RelayError> {
        if !self.pending.is_empty() {
            // The retry left some requests unanswered: ask for them again.
            return Ok(self.pause(paused));
        }
        loop {
            tokio::select! {
                biased;
                outcome = &mut self.work => {
                    while let Ok(message) = self.channels.events.try_recv() {
                        if let Some(message) = self.for_attempt(message, token.as_ref()) {
                            let _ = related.send(message).await;
                        }
                    }
                    return outcome;
                }
                Some(input) = self.channels.inputs.recv() => {
                    if !may_ask_for_input(&self.method) {
                        refuse_input(*input, &self.method).await;
                        continue;
                    }
                    self.add_pending(*input);
                    self.gather_inputs().await;
                    return Ok(self.pause(paused));
                }
                Some(message) = self.channels.events.recv() => {
                    if let Some(message) = self.for_attempt(message, token.as_ref()) {
                        let _ = related.send(message).await;
                    }
                }
            }
        }
    }

    /// Progress of the call, under the current attempt's token (none if it asked for none).
    fn for_attempt(&self, mut message: Value, token: Option<&Value>) -> Option<Value> {
        if message_method(&message) != Some("notifications/progress") {
            return Some(message);
        }
        let Some(params) = message.get_mut("params") else {
            return Some(message);
        };
        if params.get("progressToken") == self.first_token.as_ref() {
            params["progressToken"] = token?.clone();
        }
        Some(message)
    }

    /// Takes the requests the upstream sends together with the first: a handshake-era
    /// server's requests mark no round, so those that follow within a moment of
    /// quiet (`GATHER_QUIET`, `GATHER_AT_MOST` in all) go out in the same round, and
    /// the client sees every question it is asked at once rather than one per retry.
    async fn gather_inputs(&mut self) {
        let until = tokio::time::Instant::now() + GATHER_AT_MOST;
        loop {
            let quiet = (tokio::time::Instant::now() + GATHER_QUIET).min(until);
            match tokio::time::timeout_at(quiet, self.channels.inputs.recv()).await {
                Ok(Some(more)) => self.add_pending(*more),
                Ok(None) | Err(_) => return,
            }
        }
    }

    fn add_pending(&mut self, input: InputNeeded) {
        self.next_key += 1;
        let key = format!("{}-{}", input.method.replace('/', "-"), self.next_key);
        self.pending.push((key, input));
    }

    /// Stores the call and answers the attempt with what it needs.
    fn pause(mut self, paused: &Arc<Continuations>) -> Reply {
        // The call goes on between attempts, so it needs a task of its own now.
        self.work.detach();
        let mut requests = Map::new();
        for (key, input) in &self.pending {
            let mut request = Map::new();
            request.insert("method".into(), Value::String(input.method.clone()));
            let mut params = input.params.clone();
            crate::era::to_input_request(&input.method, &mut params);
            if let Some(params) = params {
                request.insert("params".into(), params);
            }
            requests.insert(key.clone(), Value::Object(request));
        }
        let bits: u128 = rand::random();
        let state = format!("{STATE_PREFIX}{bits:032x}");
        paused.keep(state.clone(), self, true);
        Reply::Result(json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": state,
        }))
    }

    /// Passes the client's answers to the upstreams that asked; unanswered
    /// requests stay pending.
    async fn answer(&mut self, mut responses: Map<String, Value>) {
        let pending = std::mem::take(&mut self.pending);
        for (key, input) in pending {
            match responses.remove(&key) {
                Some(response) => {
                    if input
                        .connection
                        .respond(input.upstream_id, Reply::Result(response))
                        .await
                        .is_err()
                    {
                        tracing::debug!("the upstream went away before the client answered it");
                    }
                }
                None => self.pending.push((key, input)),
            }
        }
    }
}

/// Whether a 2026-07-28 request may be answered `input_required`: the revision
/// allows it on `tools/call`, `prompts/get` and `resources/read` alone, so a
/// request another one is serving (a completion, a list) cannot be paused for it.
fn may_ask_for_input(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

/// Answers an upstream's request to the client that the call it was given to cannot
/// carry, rather than leaving it to the upstream's deadline.
async fn refuse_input(input: InputNeeded, method: &str) {
    tracing::info!(
        upstream = %input.connection.upstream(),
        asked = %input.method,
        during = method,
        "an upstream asked the client during a request that cannot carry the question; refused"
    );
    let error = json!({
        "code": crate::jsonrpc::INVALID_REQUEST,
        "message": format!(
            "`{}` cannot reach the client: its request in flight (`{method}`) cannot carry a question to it in protocol 2026-07-28",
            input.method
        ),
    });
    if input
        .connection
        .respond(input.upstream_id, Reply::Error(error))
        .await
        .is_err()
    {
        tracing::debug!("the upstream went away before plexus answered it");
    }
}

type Outcome = Result<Reply, RelayError>;

/// A call's own work. Polled in place by the attempt that waits for it, so a call
/// that needs no input costs no task hand-off; moved to a task of its own when
/// the call pauses, so it keeps running until the client's retry.
enum Work {
    /// The mutex is never locked (only reached through `&mut`): it makes the
    /// future shareable, as the table of paused calls must be.
    InPlace(Mutex<Pin<Box<dyn Future<Output = Outcome> + Send>>>),
    Spawned(JoinHandle<Outcome>),
    /// Only while being moved to a task.
    Moving,
}

impl Work {
    /// Moves work polled in place to a task; work already on its task stays there
    /// (a call that pauses a second time is detached already).
    fn detach(&mut self) {
        if !matches!(self, Work::InPlace(_)) {
            return;
        }
        if let Work::InPlace(work) = std::mem::replace(self, Work::Moving) {
            let work = work.into_inner().unwrap_or_else(PoisonError::into_inner);
            *self = Work::Spawned(tokio::spawn(work));
        }
    }

    fn abort(&self) {
        if let Work::Spawned(task) = self {
            task.abort();
        }
    }
}

impl Future for Work {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Outcome> {
        match self.get_mut() {
            Work::InPlace(work) => work
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
                .poll(context),
            Work::Spawned(task) => Pin::new(task).poll(context).map(|joined| {
                joined.unwrap_or_else(|error| {
                    Err(RelayError::InvalidRequest(format!(
                        "the request failed: {error}"
                    )))
                })
            }),
            Work::Moving => Poll::Pending,
        }
    }
}

/// `subscriptions/listen`: list changes and resource updates for the kinds and
/// URIs the client names, each tagged with the request's id, until the client
/// goes away or plexus shuts down.
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
            _ = hub.stopping() => break,
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
                // Log messages belong to requests, not to this stream.
                if message.get("method").and_then(Value::as_str) == Some("notifications/resources/updated")
                    && related.send(era::tag_subscription(message, id)).await.is_err()
                {
                    return Err(RelayError::InvalidRequest("the client went away".into()));
                }
            }
        }
    }
    Ok(Reply::Result(json!({
        "resultType": "complete",
        "_meta": {era::META_SUBSCRIPTION_ID: id},
    })))
}

fn message_method(message: &Value) -> Option<&str> {
    message.get("method").and_then(Value::as_str)
}
