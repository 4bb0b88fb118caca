//! Requests upstreams send to clients (sampling, elicitation, roots): to the one
//! session whose call caused them, or answered by plexus when none can be told;
//! and the roots changes passed back to the upstreams that asked.

use std::sync::{Arc, PoisonError, Weak};

use adapters::{Reply, UpstreamConnection};
use serde_json::{json, Value};

use super::{Client, Fanout};
use crate::jsonrpc;
use crate::upstreams::{Caller, Instance, Upstream};

/// A request an upstream sent, as plexus routes it.
struct UpstreamRequest<'a> {
    /// The upstream's id, under which the answer goes back.
    id: Value,
    method: &'a str,
    params: Option<Value>,
    /// plexus's id of the request whose HTTP response stream carried it.
    origin: Option<u64>,
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
            None => match self.caller_of(
                name,
                method,
                &capability,
                connection,
                unclaimed,
                instance.owner(),
            ) {
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
        let trace = target.trace.as_ref();
        if session.forward_to_client(sink, connection.clone(), id, method, params, trace) {
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
        owner: Option<u64>,
    ) -> Result<Caller, Reply> {
        match callers {
            [] => {
                // A per-session instance's one client, or the daemon's only client, is
                // the one to ask: there is no other (server-filesystem asks for roots
                // again when told they changed, with no call in flight).
                let owner = owner.filter(|owner| {
                    self.session(*owner)
                        .is_some_and(|session| session.has_capability(capability))
                });
                if let Some(session) = owner.or_else(|| self.only_client_with(capability)) {
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

    /// A client's roots changed: tell the upstreams that asked it, and those told
    /// "no roots" while no client could answer (as when a client initializes), so
    /// each asks again and can reach this one.
    pub fn roots_changed(&self, session: &dyn Client) {
        let askers = self
            .roots_askers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session.id())
            .cloned()
            .unwrap_or_default();
        let waiting = self.roots_waiters(session);
        for connection in askers
            .into_iter()
            .map(|(_, connection)| connection)
            .chain(waiting)
        {
            self.tasks.spawn(async move {
                let _ = connection
                    .notify("notifications/roots/list_changed", None)
                    .await;
            });
        }
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
