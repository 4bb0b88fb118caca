//! Requests sent to the client ([`ClientBoundRequests`], the session's table of
//! them): an upstream's (sampling, elicitation, roots), put under an id of
//! plexus's and answered back under the upstream's own; and plexus's own
//! questions for a 2026-07-28 upstream's input-required rounds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use adapters::{Reply, UpstreamConnection};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::audit_lines::SessionAudit;
use super::MAX_CLIENT_BOUND;
use crate::jsonrpc::RelayError;
use crate::telemetry::{self, Wait};

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
        sent: tokio::time::Instant,
        /// Its span, when traced: ended by the answer (or dropped with the request).
        round: Option<telemetry::ClientRound>,
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
                round,
                ..
            } => {
                if let Some(round) = round {
                    round.end(&reply);
                }
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

/// The requests sent to one client and awaiting its answer, by the id plexus
/// gave them.
pub(super) struct ClientBoundRequests {
    /// The session's id, part of every id plexus gives its requests.
    session: u64,
    waiting: Mutex<HashMap<String, ClientBound>>,
    next: AtomicU64,
}

impl ClientBoundRequests {
    pub(super) fn new(session: u64) -> ClientBoundRequests {
        ClientBoundRequests {
            session,
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, ClientBound>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Passes a client's answer to whoever asked: an upstream under its own id
    /// (the exchange written to the trail), or plexus's own question.
    pub(super) async fn answer(&self, id: &Value, reply: Reply, audit: &SessionAudit<'_>) {
        let key = id
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| id.to_string());
        let request = self.lock().remove(&key);
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
                    audit.client_request(Some(connection.upstream()), method, *sent, &answered);
                }
                request.answer(reply).await
            }
            None => tracing::debug!(%id, "a response to no request plexus sent"),
        }
    }

    /// Sends an upstream's request to the client under a fresh id; the client's
    /// answer goes back to the upstream under the upstream's own id.
    pub(super) fn forward(
        &self,
        sink: &mpsc::Sender<Value>,
        connection: UpstreamConnection,
        upstream_id: Value,
        method: &str,
        mut params: Option<Value>,
        trace: Option<&telemetry::CallTrace>,
    ) -> bool {
        let round = telemetry::client_round(connection.upstream(), method, &mut params, trace);
        let target = ClientBound::Upstream {
            connection,
            upstream_id,
            method: method.to_string(),
            sent: tokio::time::Instant::now(),
            round,
        };
        self.send(sink, target, method, params).is_some()
    }

    /// Sends a request to the client under a fresh id, remembering where its answer
    /// goes; `None` if it cannot take it (its queue is full or closed, or
    /// `MAX_CLIENT_BOUND` wait on it already).
    fn send(
        &self,
        sink: &mpsc::Sender<Value>,
        target: ClientBound,
        method: &str,
        params: Option<Value>,
    ) -> Option<String> {
        let id = format!(
            "plexus-{}-{}",
            self.session,
            self.next.fetch_add(1, Ordering::Relaxed) + 1
        );
        if let ClientBound::Upstream {
            round: Some(round), ..
        } = &target
        {
            round.request_id(&id);
        }
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(params) = params {
            message["params"] = params;
        }
        {
            let mut waiting = self.lock();
            if waiting.len() >= MAX_CLIENT_BOUND {
                // A flood does not flood the log.
                if let Some(refused) = adapters::rpc::count_rarely(&REFUSED) {
                    tracing::warn!(
                        session = self.session,
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
            self.lock().remove(&id);
            return None;
        }
        Some(id)
    }

    /// Asks the client something on plexus's own behalf and waits for the answer.
    pub(super) async fn ask(
        &self,
        sink: &mpsc::Sender<Value>,
        method: &str,
        params: Option<Value>,
    ) -> Result<Reply, RelayError> {
        let (answer, answered) = oneshot::channel();
        let id = self
            .send(sink, ClientBound::Local(answer), method, params)
            .ok_or_else(|| {
                RelayError::InvalidRequest("the client's queue is full or closed".into())
            })?;
        let answered = tokio::time::timeout(CLIENT_ANSWER_TIMEOUT, answered);
        match telemetry::waited(Wait::ClientRound, None, answered).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => {
                self.lock().remove(&id);
                Err(RelayError::InvalidRequest(format!(
                    "the client did not answer `{method}`"
                )))
            }
        }
    }

    /// Forgets the upstream's request `upstream_id`, which it cancelled; the id
    /// the client knows it by, if it was still waiting.
    pub(super) fn withdraw(&self, upstream: &str, upstream_id: &Value) -> Option<String> {
        let mut pending = self.lock();
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
            .map(|(id, _)| id.clone())?;
        pending.remove(&found);
        Some(found)
    }

    /// Takes every request still waiting (the session ends).
    pub(super) fn drain(&self) -> Vec<ClientBound> {
        self.lock().drain().map(|(_, request)| request).collect()
    }
}
