//! Pausing a 2026-07-28 request on its client's input. Such a client cannot be
//! sent requests: when a handshake-era upstream asks for sampling, elicitation or
//! roots while serving the client's request, plexus answers the client with an
//! input-required result and keeps the upstream call waiting ([`PausedCalls`]).
//! The client's retry names the paused call by `requestState`; its
//! `inputResponses` go to the upstream as the answers, and the retry receives
//! what follows (the final result, or the next input-required result).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use adapters::{Reply, UpstreamConnection};
use dashmap::DashMap;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::fields::to_input_request;
use super::wire::mirrored_name;
use crate::jsonrpc::{self, RelayError};

/// Marks a `requestState` plexus issued, as opposed to one an upstream issued.
const STATE_PREFIX: &str = "plexus.";
/// How long after an upstream's request to the client another may still join its
/// round, and how long a round may be gathered in all. Requests a server sends
/// together came more than 20 ms apart on a loaded 2-core machine (the round then
/// split in two); a round costs the client this much waiting, once.
const GATHER_QUIET: Duration = Duration::from_millis(60);
const GATHER_AT_MOST: Duration = Duration::from_millis(200);
/// How long a paused call waits for the client's retry before it is cancelled,
/// and how long a held task's result is asked for without news from its client.
pub const CONTINUATION_TTL: Duration = Duration::from_secs(600);

/// A request an upstream sent while serving a 2026-07-28 client's request: it
/// becomes an input request in that request's result.
pub struct InputNeeded {
    pub connection: UpstreamConnection,
    pub upstream_id: Value,
    pub method: String,
    pub params: Option<Value>,
}

impl InputNeeded {
    /// Answers the upstream's request with an error: its client will not answer it
    /// (the call or task it belonged to was abandoned), so it does not time out.
    pub async fn unanswered(self) {
        let error =
            json!({"code": jsonrpc::INTERNAL_ERROR, "message": "the client did not answer"});
        let _ = self
            .connection
            .respond(self.upstream_id, Reply::Error(error))
            .await;
    }
}

/// What a request scope delivers: messages for the client, and upstream requests.
pub struct ScopeChannels {
    pub events: mpsc::Receiver<Value>,
    /// Boxed: a channel's first block holds 32 of them.
    pub inputs: mpsc::Receiver<Box<InputNeeded>>,
}

/// The scope a paused call runs in, closed when the call is abandoned.
pub trait Scope: Send + Sync {
    fn close(&self);
}

type Outcome = Result<Reply, RelayError>;

/// Names a paused round's `requestState` (starting with `plexus.`): in a cluster,
/// one naming this node, sealed, so the retry finds its way back here.
pub type StateNamer = Arc<dyn Fn() -> String + Send + Sync>;

/// Requests paused on input from a 2026-07-28 client, by `requestState`; each
/// is dropped (and its upstream call cancelled) when not retried within
/// [`CONTINUATION_TTL`].
pub struct PausedCalls {
    paused: DashMap<String, Continuation>,
    /// Cancelled by `clear`: the expiry timers end with the front.
    closed: CancellationToken,
    /// Where the expiry timers, the work of paused calls and the answers to their
    /// abandoned questions run: the owner's, closed and awaited at shutdown.
    tasks: TaskTracker,
    /// Set once by a front in a cluster; otherwise states are random.
    namer: std::sync::OnceLock<StateNamer>,
}

impl PausedCalls {
    pub fn new(tasks: TaskTracker) -> PausedCalls {
        PausedCalls {
            paused: DashMap::new(),
            closed: CancellationToken::new(),
            tasks,
            namer: std::sync::OnceLock::new(),
        }
    }

    /// How `requestState`s are named from now on (set once).
    pub fn name_states(&self, namer: StateNamer) {
        let _ = self.namer.set(namer);
    }

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
        self.tasks.spawn(async move {
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
    }

    /// A retry of a call plexus paused (its `requestState` is plexus's): the
    /// client's answers go to the upstream and the call runs on until it completes
    /// or asks again. `None`: not a retry of plexus's; the request starts anew.
    /// Only the principal whose request was paused may resume it: anyone else is
    /// told the state is unknown, and the call waits on for its own client.
    pub async fn resume(
        self: &Arc<Self>,
        method: &str,
        params: &Option<Value>,
        related: &mpsc::Sender<Value>,
        principal: &str,
    ) -> Option<Outcome> {
        let state = params
            .as_ref()
            .and_then(|p| p.get("requestState"))
            .and_then(Value::as_str)
            .filter(|state| state.starts_with(STATE_PREFIX))?
            .to_string();
        let unknown = || {
            Some(Err(RelayError::InvalidParams(
                "`requestState` is unknown or has expired".into(),
            )))
        };
        let Some(mut continuation) = self.take(&state) else {
            return unknown();
        };
        if *continuation.principal != *principal {
            self.keep(state, continuation, false);
            return unknown();
        }
        if continuation.method != method || continuation.target != target_of(method, params) {
            // Put it back: a stray retry must not cancel the real one.
            let message = format!(
                "`requestState` belongs to a `{}` request, not this one",
                continuation.method
            );
            self.keep(state, continuation, false);
            return Some(Err(RelayError::InvalidParams(message)));
        }
        let responses = params
            .as_ref()
            .and_then(|p| p.get("inputResponses"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        continuation.answer(responses).await;
        let token = progress_token(params);
        Some(continuation.drive(self, related, token).await)
    }

    /// A first attempt: `work` (the request served in `scope`) is polled in place
    /// until it completes, or is paused when an upstream asks the client something.
    /// Not an `async fn`: the attempt is the call's own future, one frame fewer.
    pub fn start<'f>(
        self: &'f Arc<Self>,
        scope: Arc<dyn Scope>,
        channels: ScopeChannels,
        work: impl Future<Output = Outcome> + Send + 'static,
        attempt: FirstAttempt,
        related: &'f mpsc::Sender<Value>,
    ) -> impl Future<Output = Outcome> + 'f {
        let FirstAttempt {
            method,
            target,
            token,
            principal,
        } = attempt;
        Continuation {
            scope,
            work: Work::InPlace(Mutex::new(Box::pin(work))),
            channels,
            pending: Vec::new(),
            next_key: 0,
            method,
            target,
            first_token: token.clone(),
            principal,
            tasks: self.tasks.clone(),
        }
        .drive(self, related, token)
    }
}

/// What a call's first attempt is known by, read before its params go to its work.
pub struct FirstAttempt {
    method: String,
    target: Option<String>,
    token: Option<Value>,
    principal: Arc<str>,
}

impl FirstAttempt {
    /// `principal` made the request: only it may resume the call once paused.
    pub fn of(method: &str, params: &Option<Value>, principal: Arc<str>) -> FirstAttempt {
        FirstAttempt {
            method: method.to_string(),
            target: target_of(method, params),
            token: progress_token(params),
            principal,
        }
    }
}

/// A request paused on input from a 2026-07-28 client.
struct Continuation {
    scope: Arc<dyn Scope>,
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
    /// Who made the request, the only one who may resume it.
    principal: Arc<str>,
    tasks: TaskTracker,
}

impl Drop for Continuation {
    fn drop(&mut self) {
        // Abandoned (expired, cancelled, or shut down): stop the upstream call and
        // release the upstream's pending requests instead of leaving them to time out.
        self.work.abort();
        self.scope.close();
        for (_, input) in self.pending.drain(..) {
            self.tasks.spawn(input.unanswered());
        }
    }
}

/// A retry's members as the schema has them: `requestState` a string,
/// `inputResponses` an object. Passed on otherwise, an upstream's SDK refuses the
/// request with an error that does not say which member is wrong.
pub fn check_retry_members(params: Option<&Value>) -> Result<(), RelayError> {
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
    mirrored_name(method, params.as_ref())
        .flatten()
        .map(str::to_string)
}

impl Continuation {
    /// Runs the call until it completes or needs input; relays its progress and
    /// log messages to the current attempt's stream meanwhile.
    async fn drive(
        mut self,
        paused: &Arc<PausedCalls>,
        related: &mpsc::Sender<Value>,
        token: Option<Value>,
    ) -> Outcome {
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
        if message.get("method").and_then(Value::as_str) != Some("notifications/progress") {
            return Some(message);
        }
        // Params that are no object (an upstream's mistake) carry no token to swap.
        let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
            return Some(message);
        };
        if params.get("progressToken") == self.first_token.as_ref() {
            params.insert("progressToken".into(), token?.clone());
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
    fn pause(mut self, paused: &Arc<PausedCalls>) -> Reply {
        // The call goes on between attempts, so it needs a task of its own now.
        self.work.detach(&self.tasks);
        let mut requests = Map::new();
        for (key, input) in &self.pending {
            let mut request = Map::new();
            request.insert("method".into(), Value::String(input.method.clone()));
            let mut params = input.params.clone();
            to_input_request(&input.method, &mut params);
            if let Some(params) = params {
                request.insert("params".into(), params);
            }
            requests.insert(key.clone(), Value::Object(request));
        }
        let state = match paused.namer.get() {
            Some(namer) => namer(),
            None => {
                let bits: u128 = rand::random();
                format!("{STATE_PREFIX}{bits:032x}")
            }
        };
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
        "code": jsonrpc::INVALID_REQUEST,
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
    /// Moves work polled in place to a task on `tasks`; work already on its task
    /// stays there (a call that pauses a second time is detached already).
    fn detach(&mut self, tasks: &TaskTracker) {
        if !matches!(self, Work::InPlace(_)) {
            return;
        }
        if let Work::InPlace(work) = std::mem::replace(self, Work::Moving) {
            let work = work.into_inner().unwrap_or_else(PoisonError::into_inner);
            *self = Work::Spawned(tasks.spawn(work));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Closed(AtomicBool);

    impl Scope for Closed {
        fn close(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// alice's `tools/call` of `a__b` in `scope`, its work never ending, nothing pending.
    fn idle_call(
        scope: Arc<Closed>,
        tasks: &TaskTracker,
        first_token: Option<Value>,
    ) -> Continuation {
        let (_events, events) = mpsc::channel(1);
        let (_inputs, inputs) = mpsc::channel(1);
        Continuation {
            scope,
            work: Work::InPlace(Mutex::new(Box::pin(std::future::pending()))),
            channels: ScopeChannels { events, inputs },
            pending: Vec::new(),
            next_key: 0,
            method: "tools/call".into(),
            target: Some("a__b".into()),
            first_token,
            principal: Arc::from("alice"),
            tasks: tasks.clone(),
        }
    }

    #[tokio::test]
    async fn a_paused_calls_tasks_are_tracked_and_end_when_cleared() {
        let tasks = TaskTracker::new();
        let paused = Arc::new(PausedCalls::new(tasks.clone()));
        let scope = Arc::new(Closed::default());
        let continuation = idle_call(scope.clone(), &tasks, None);
        let Reply::Result(result) = continuation.pause(&paused) else {
            panic!("not paused");
        };
        let state = result["requestState"].as_str().unwrap_or_default();
        assert!(state.starts_with(STATE_PREFIX), "{result}");
        // Another principal holding the state is told it is unknown, and the call
        // stays paused for its own.
        let (related, _) = mpsc::channel(1);
        let params = Some(json!({"name": "a__b", "requestState": state}));
        let stolen = paused
            .resume("tools/call", &params, &related, "mallory")
            .await;
        assert!(
            matches!(stolen, Some(Err(RelayError::InvalidParams(ref m))) if m.contains("unknown")),
            "{stolen:?}"
        );
        assert!(
            paused.paused.contains_key(state),
            "a stranger's retry dropped the call"
        );
        // The call's work, moved to a task, and its expiry timer: both the owner's.
        assert_eq!(tasks.len(), 2);
        paused.clear();
        assert!(scope.0.load(Ordering::Relaxed), "the scope was not closed");
        tasks.close();
        let ended = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
        assert!(ended.is_ok(), "{} tasks outlived the clear", tasks.len());
        let resumed = paused
            .resume("tools/call", &params, &related, "alice")
            .await;
        assert!(
            matches!(resumed, Some(Err(RelayError::InvalidParams(ref m))) if m.contains("expired")),
            "{resumed:?}"
        );
    }

    #[tokio::test]
    async fn an_upstreams_hostile_progress_is_passed_on_or_dropped_and_never_panics() {
        let tasks = TaskTracker::new();
        let continuation = |first_token: Option<Value>| {
            idle_call(Arc::new(Closed::default()), &tasks, first_token)
        };
        // The first attempt asked for progress, or did not; the retry does.
        let asked = [continuation(Some(json!("first"))), continuation(None)];
        let seed = json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "first", "progress": 1, "total": 2, "message": "m"}});
        let mut cases = mutations::value_mutants(&seed, 3_000, 0xB41D);
        cases.push(br#"{"method":"notifications/progress","params":[1]}"#.to_vec());
        cases.push(br#"{"method":"notifications/progress","params":"x"}"#.to_vec());
        mutations::check("an upstream's progress", &cases, 64, |bytes| {
            // As the upstream's connection reads it (past serde_json's depth: not read).
            let Ok(message) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            for continuation in &asked {
                let Some(out) = continuation.for_attempt(message.clone(), Some(&json!("retry")))
                else {
                    continue;
                };
                // Only the token changes.
                let token = out.pointer("/params/progressToken").cloned();
                let mut restored = out;
                if token.is_some() && token != message.pointer("/params/progressToken").cloned() {
                    restored["params"]["progressToken"] =
                        message["params"]["progressToken"].clone();
                }
                if message["params"].get("progressToken").is_some() {
                    assert_eq!(restored, message);
                }
            }
        });
    }
}
