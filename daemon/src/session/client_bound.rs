//! Requests sent to the client: an upstream's (sampling, elicitation, roots), put
//! under an id of plexus's and answered back under the upstream's own; plexus's
//! own questions for a 2026-07-28 upstream's input-required rounds; and, for the
//! scope of a 2026-07-28 request, the input requests that pause it instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use adapters::{Reply, UpstreamConnection};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use super::{InputNeeded, Session, MAX_CLIENT_BOUND};
use crate::hub::CallContext;
use crate::jsonrpc::{self, RelayError};

/// Requests refused for `MAX_CLIENT_BOUND`, in this run.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// A request sent to this client, awaiting its answer.
pub(super) enum ClientBound {
    /// An upstream's request, answered to the upstream under its own id.
    Upstream {
        connection: UpstreamConnection,
        upstream_id: Value,
        /// For the audit trail.
        method: String,
        sent: std::time::Instant,
    },
    /// plexus's own (a 2026-07-28 upstream's input request), answered here.
    Local(oneshot::Sender<Reply>),
}

impl ClientBound {
    pub(super) async fn answer(self, reply: Reply) {
        match self {
            ClientBound::Upstream {
                connection,
                upstream_id,
                ..
            } => {
                if connection.respond(upstream_id, reply).await.is_err() {
                    tracing::debug!("the upstream went away before the client answered it");
                }
            }
            ClientBound::Local(answer) => {
                let _ = answer.send(reply);
            }
        }
    }
}

/// How long plexus waits for a client to answer a question of its own.
const CLIENT_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// Input-required rounds a call may take before plexus gives up on it.
const MAX_INPUT_ROUNDS: usize = 10;

impl Session {
    /// Passes a client's answer to the upstream that asked, under the upstream's id.
    pub(super) async fn answer_client_bound(&self, id: &Value, reply: Reply) {
        let key = id
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| id.to_string());
        let request = self
            .client_bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        match request {
            Some(request) => {
                if let ClientBound::Upstream {
                    connection,
                    method,
                    sent,
                    ..
                } = &request
                {
                    let answered = Ok(reply.clone());
                    self.audit().client_request(
                        Some(connection.upstream()),
                        method,
                        *sent,
                        &answered,
                    );
                }
                request.answer(reply).await
            }
            None => tracing::debug!(%id, "a response to no request plexus sent"),
        }
    }

    /// Sends an upstream's request to this client under a fresh id; the client's
    /// answer goes back to the upstream under the upstream's own id.
    pub fn forward_to_client(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        params: Option<Value>,
    ) -> bool {
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
        let target = ClientBound::Upstream {
            connection,
            upstream_id,
            method: method.to_string(),
            sent: std::time::Instant::now(),
        };
        self.send_client_bound(sink, target, method, params)
            .is_some()
    }

    /// Sends a request to the client under a fresh id, remembering where its answer
    /// goes; `None` if it cannot take it (its queue is full or closed, or
    /// `MAX_CLIENT_BOUND` wait on it already).
    pub(super) fn send_client_bound(
        &self,
        sink: &mpsc::Sender<Value>,
        target: ClientBound,
        method: &str,
        params: Option<Value>,
    ) -> Option<String> {
        let id = format!(
            "plexus-{}-{}",
            self.id,
            self.next_client_bound.fetch_add(1, Ordering::Relaxed) + 1
        );
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(params) = params {
            message["params"] = params;
        }
        {
            let mut waiting = self
                .client_bound
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if waiting.len() >= MAX_CLIENT_BOUND {
                // A flood does not flood the log.
                if let Some(refused) = adapters::rpc::count_rarely(&REFUSED) {
                    tracing::warn!(
                        session = self.id,
                        waiting = waiting.len(),
                        method,
                        refused,
                        "too many requests wait on this client; refused"
                    );
                }
                return None;
            }
            waiting.insert(id.clone(), target);
        }
        if sink.try_send(message).is_err() {
            self.client_bound
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
            return None;
        }
        Some(id)
    }

    /// Asks the client something on plexus's own behalf and waits for the answer.
    pub(super) async fn ask_client(
        &self,
        sink: &mpsc::Sender<Value>,
        method: &str,
        params: Option<Value>,
    ) -> Result<Reply, RelayError> {
        let (answer, answered) = oneshot::channel();
        let id = self
            .send_client_bound(sink, ClientBound::Local(answer), method, params)
            .ok_or_else(|| {
                RelayError::InvalidRequest("the client's queue is full or closed".into())
            })?;
        match tokio::time::timeout(CLIENT_ANSWER_TIMEOUT, answered).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => {
                self.client_bound
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                Err(RelayError::InvalidRequest(format!(
                    "the client did not answer `{method}`"
                )))
            }
        }
    }

    /// Relays a request that may need client input: a 2026-07-28 upstream answers
    /// with an input-required result. A 2026-07-28 client gets it as it is (its
    /// retry carries the upstream's state back); a handshake-era client is asked
    /// each input request as a real request, and plexus retries for it.
    pub(super) async fn forward_with_input(
        &self,
        upstream: &str,
        method: &str,
        params: Value,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        // A 2026-07-28 client retries for itself, and a handshake-era client is
        // answered input_required only by a 2026-07-28 upstream: the params are
        // kept for a retry unless neither can happen.
        let may_retry = !self.is_scope()
            && !self
                .hub
                .upstream_named(upstream)
                .is_ok_and(|upstream| upstream.speaks_handshake());
        if !may_retry {
            let reply = self
                .hub
                .forward(upstream, method, Some(params), call)
                .await?;
            let mut reply = self.unread_unless_changed(upstream, reply);
            if !self.is_scope() {
                without_complete_type(&mut reply);
            }
            return Ok(reply);
        }
        // Every round's result is read: it may ask for input.
        let call = CallContext {
            result_unread: false,
            ..call
        };
        let mut reply = self
            .hub
            .forward(upstream, method, Some(params.clone()), call)
            .await?;
        for _ in 0..MAX_INPUT_ROUNDS {
            let Reply::Result(result) = &mut reply else {
                return Ok(reply);
            };
            if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
                without_complete_type(&mut reply);
                return Ok(reply);
            }
            let requests = result
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let mut responses = Map::new();
            let mut minted = Vec::new();
            for (key, request) in requests {
                let asked = request.get("method").and_then(Value::as_str).unwrap_or("");
                let mut asked_params = request.get("params").cloned();
                let elicitation = crate::era::mint_elicitation_id(asked, &mut asked_params);
                if let Some(capability) =
                    crate::fanout::required_capability(asked, asked_params.as_ref())
                {
                    if !self.has_capability(&capability) {
                        return Err(RelayError::InvalidRequest(format!(
                            "upstream `{upstream}` needs `{asked}`, and this client did not declare the `{}` capability",
                            capability.join(".")
                        )));
                    }
                }
                let sent = std::time::Instant::now();
                let answered = self.ask_client(call.related, asked, asked_params).await;
                self.audit()
                    .client_request(Some(upstream), asked, sent, &answered);
                match answered?.into_result() {
                    Ok(answer) => {
                        if answer.get("action").and_then(Value::as_str) == Some("accept") {
                            minted.extend(elicitation);
                        }
                        responses.insert(key, answer);
                    }
                    // The client refused: the call ends with its answer.
                    Err(error) => return Ok(Reply::Error(error)),
                }
            }
            let mut retry = params.clone();
            if let Some(object) = retry.as_object_mut() {
                object.insert("inputResponses".into(), Value::Object(responses));
                match result.get("requestState") {
                    Some(state) => object.insert("requestState".into(), state.clone()),
                    None => object.remove("requestState"),
                };
            }
            reply = self
                .hub
                .forward(upstream, method, Some(retry), call)
                .await?;
            // The upstream has taken the accepted URL elicitations' outcome (its
            // retry answered): their completion, before the call's own answer.
            for id in minted {
                let complete = jsonrpc::notification(
                    "notifications/elicitation/complete",
                    Some(json!({ "elicitationId": id })),
                );
                let _ = call.related.send(complete).await;
            }
        }
        Err(RelayError::InvalidRequest(format!(
            "upstream `{upstream}` still asked for input after {MAX_INPUT_ROUNDS} rounds"
        )))
    }

    /// A result that came unread stays so unless plexus has something to change in
    /// it: a linked resource's URI or a task (`forward_named`), or, for a
    /// handshake-era client, a `resultType`.
    fn unread_unless_changed(&self, upstream: &str, reply: Reply) -> Reply {
        let Reply::Unread(raw) = &reply else {
            return reply;
        };
        // memchr's search is vectorised: a megabyte of content is searched twice.
        let mentions = |member: &str, what: &[&str]| {
            raw.member(member).is_some_and(|text| {
                what.iter()
                    .any(|word| memchr::memmem::find(text, word.as_bytes()).is_some())
            })
        };
        let unchanged = raw.member("task").is_none()
            && raw.member("taskId").is_none()
            && raw.member("tasks").is_none()
            && !mentions("_meta", &["task", "\\u"])
            // Escapes could spell a block's type: such content is read.
            && !mentions("content", &["resource", "\\u"])
            && (self.is_scope() || raw.member("resultType").is_none());
        if unchanged {
            return reply;
        }
        match reply.try_read() {
            Ok(read) => read,
            Err(error) => Reply::Error(json!({
                "code": jsonrpc::UPSTREAM_FAILED,
                "message": format!("upstream `{upstream}` sent a result plexus cannot read: {error}"),
            })),
        }
    }

    /// An upstream cancelled a request it had sent this client: pass the cancel on.
    pub fn withdraw_client_bound(&self, upstream: &str, upstream_id: &Value) {
        let mut pending = self
            .client_bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let found = pending
            .iter()
            .find(|(_, request)| match request {
                ClientBound::Upstream {
                    connection,
                    upstream_id: id,
                    ..
                } => &**connection.upstream() == upstream && id == upstream_id,
                ClientBound::Local(_) => false,
            })
            .map(|(id, _)| id.clone());
        if let Some(id) = found {
            pending.remove(&id);
            drop(pending);
            self.notify(jsonrpc::notification(
                "notifications/cancelled",
                Some(json!({"requestId": id, "reason": "the upstream withdrew its request"})),
            ));
        }
    }
}

/// The handshake era has no result types: a complete result loses its `resultType`.
fn without_complete_type(reply: &mut Reply) {
    if let Reply::Result(Value::Object(result)) = reply {
        if result.get("resultType").and_then(Value::as_str) == Some("complete") {
            result.remove("resultType");
        }
    }
}
