//! What upstreams say on their own (log messages, resource updates, elicitation
//! completions, task status, withdrawn requests), to the sessions concerned; and
//! the log level plexus sets on upstreams for the sessions.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Client, Fanout};
use crate::jsonrpc;
use crate::logging::LogLevel;

impl Fanout {
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
            // A handshake-era upstream's task status, and a 2026-07-28 one's
            // (`notifications/tasks`), to the client the task's id was handed to
            // and to the 2026-07-28 listens that asked for it.
            "notifications/tasks/status" | "notifications/tasks" => {
                let mut params = params;
                crate::tasks::rewrite_task_ids(&mut params, &|id| {
                    Some(crate::tasks::expose_task_id(upstream, id))
                });
                let Some(id) = params.get("taskId").and_then(Value::as_str) else {
                    return;
                };
                // A handshake-era client knows only its era's notification.
                let owner = (method == "notifications/tasks/status")
                    .then(|| self.task_routes.owner(id))
                    .flatten()
                    .and_then(|id| self.session(id))
                    .filter(|session| owned_by(session));
                let listens = self.task_routes.listeners(id);
                let message = jsonrpc::notification(method, Some(params));
                for session in owner
                    .into_iter()
                    .chain(listens.into_iter().filter_map(|id| self.session(id)))
                {
                    session.notify(message.clone());
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
}
