//! Task requests (`tasks/get`, `tasks/result`, `tasks/update`, `tasks/cancel`)
//! routed by task id, their answers put in the calling client's era's shape
//! (`era::tasks`): plexus serves the 2026-07-28 extension over handshake-era
//! upstreams' tasks, and passes a 2026-07-28 upstream's extension results through.
//!
//! A handshake-era task that waits for input asks its client with requests
//! naming the task, sent while a `tasks/result` for it is held. For a
//! 2026-07-28 client, which cannot be sent requests, plexus holds that
//! `tasks/result` itself ([`super::held_tasks`]) once `tasks/get` shows the task
//! `input_required`, keeps the requests the upstream sends as the task's
//! `inputRequests`, and answers them from `tasks/update`'s `inputResponses`.
//!
//! A `subscriptions/listen` naming tasks (`taskIds`) hears their status as the
//! extension's `notifications/tasks`, each the task as `tasks/get` shows it.

use std::time::Duration;

use adapters::Reply;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::held_tasks;
use super::Session;
use crate::era::tasks::{
    acknowledged, detailed, final_outcome, handshake_task, has_outcome, is_extension_answer,
    is_handshake_task, is_method_not_found, task_fields, waits_for_input,
};
use crate::era::Era;
use crate::jsonrpc::{self, RelayError};

/// How long a `tasks/get` on a task the upstream says waits for input waits for
/// the upstream's requests to arrive on the held `tasks/result` (it sends them
/// once that is held); without any, the task is shown `working`.
const REQUESTS_ARRIVE_WITHIN: Duration = Duration::from_secs(2);

/// How long a handshake-era client's `tasks/result` waits for a 2026-07-28
/// upstream's task to finish (the client's cancel ends it sooner).
const TASK_RESULT_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// `tasks/get`, `tasks/result`, `tasks/update`, `tasks/cancel`: routed by task id,
/// and the answer put in the calling client's era's shape.
pub(super) async fn serve(
    session: &Session,
    method: &str,
    params: Option<Value>,
    related: &mpsc::Sender<Value>,
) -> Result<Reply, RelayError> {
    // Another client's task is unknown here, as one never created is.
    if let Some(id) = params
        .as_ref()
        .and_then(|p| p.get("taskId"))
        .and_then(Value::as_str)
    {
        if !reachable(session, id) {
            return Err(RelayError::InvalidParams(format!("unknown task `{id}`")));
        }
    }
    if session.era() == Era::Modern && method == "tasks/update" {
        if let Some(reply) = held_tasks::update(session, &params, related).await? {
            return Ok(reply);
        }
    }
    let reply = session
        .hub
        .forward_task_request(method, params.clone(), session.call_context(None, related))
        .await?;
    if session.era() == Era::Modern {
        as_extension_answer(session, method, params, reply, related).await
    } else {
        as_handshake_answer(session, method, params, reply, related).await
    }
}

/// The tasks extension's answer (2026-07-28 clients), over a handshake-era
/// upstream's task or passed on from a 2026-07-28 upstream's.
async fn as_extension_answer(
    session: &Session,
    method: &str,
    params: Option<Value>,
    reply: Reply,
    related: &mpsc::Sender<Value>,
) -> Result<Reply, RelayError> {
    match method {
        "tasks/get" => {
            if !is_handshake_task(&reply) {
                return Ok(reply);
            }
            let Reply::Result(Value::Object(task)) = reply else {
                return Ok(reply);
            };
            if waits_for_input(&task) {
                let exposed = task
                    .get("taskId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let waiting = waiting_for_input(session, exposed, &task).await;
                return Ok(Reply::Result(waiting));
            }
            // A task with an outcome: its `tasks/result` answers at once.
            let outcome = if has_outcome(&task) {
                let reply = session
                    .hub
                    .forward_task_request(
                        "tasks/result",
                        params,
                        session.call_context(None, related),
                    )
                    .await?;
                Some(reply)
            } else {
                None
            };
            Ok(Reply::Result(detailed(&task, outcome)))
        }
        // A handshake-era upstream has no `tasks/update`: nothing of its task
        // waits for input plexus could give, so the answers are ignored, as the
        // extension allows for keys it does not expect.
        "tasks/update" if is_method_not_found(&reply) => Ok(Reply::Result(json!({}))),
        "tasks/update" => Ok(reply),
        _ => Ok(acknowledged(reply)),
    }
}

/// A handshake-era client's answer: a handshake-era upstream's as it is; a
/// 2026-07-28 upstream's task (the tasks extension) in this era's shape, and its
/// `tasks/result`, which the extension lacks, waited for by polling `tasks/get`
/// at the task's interval.
async fn as_handshake_answer(
    session: &Session,
    method: &str,
    params: Option<Value>,
    reply: Reply,
    related: &mpsc::Sender<Value>,
) -> Result<Reply, RelayError> {
    let get = || {
        session.hub.forward_task_request(
            "tasks/get",
            params.clone(),
            session.call_context(None, related),
        )
    };
    let extension = is_extension_answer(&reply);
    match method {
        "tasks/get" if extension => Ok(handshake_task(reply)),
        // The extension acknowledges a cancel; this era answers with the task.
        "tasks/cancel" if extension || reply == Reply::Result(json!({})) => {
            Ok(handshake_task(get().await?))
        }
        "tasks/result" if is_method_not_found(&reply) => {
            let task_id = params
                .as_ref()
                .and_then(|p| p.get("taskId"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let started = tokio::time::Instant::now();
            loop {
                let got = get().await?;
                let Reply::Result(detailed) = &got else {
                    return Ok(got);
                };
                if let Some(outcome) = final_outcome(detailed, &task_id) {
                    return Ok(outcome);
                }
                if started.elapsed() > TASK_RESULT_WAIT {
                    return Err(RelayError::Timeout {
                        upstream: task_id.split(':').next().unwrap_or_default().to_string(),
                        after: started.elapsed(),
                    });
                }
                let interval = detailed
                    .get("pollIntervalMs")
                    .and_then(Value::as_u64)
                    .unwrap_or(500)
                    .clamp(50, 5_000);
                tokio::time::sleep(std::time::Duration::from_millis(interval)).await;
            }
        }
        _ => Ok(reply),
    }
}

/// A 2026-07-28 client's `tasks/get` of a handshake-era task that waits for
/// input: `input_required` with the requests the upstream sent on the held
/// `tasks/result`, or `working` while it has sent none plexus could pass on.
async fn waiting_for_input(session: &Session, exposed: &str, task: &Map<String, Value>) -> Value {
    let held = held_tasks::hold(session, exposed);
    let mut detailed = task_fields(task);
    if held.wait_for_requests(REQUESTS_ARRIVE_WITHIN).await {
        detailed.insert("inputRequests".into(), Value::Object(held.input_requests()));
    } else {
        detailed.insert("status".into(), Value::from("working"));
        detailed.remove("statusMessage");
    }
    Value::Object(detailed)
}

/// Whether `session` may reach the task it names `exposed`: not one plexus handed
/// to another principal, nor one of an upstream its view hides. A task whose route
/// plexus no longer keeps (it restarted since) is reachable by its id, which only
/// the client it was handed to knows.
fn reachable(session: &Session, exposed: &str) -> bool {
    handed_to_principal(session, exposed) != Some(false) && shown(session, exposed)
}

/// Whether plexus handed the task `exposed` to `session`'s principal (None when it
/// keeps no route for it).
fn handed_to_principal(session: &Session, exposed: &str) -> Option<bool> {
    let owner = session.hub.task_principal(exposed)?;
    Some(owner == session.identity.principal)
}

fn shown(session: &Session, exposed: &str) -> bool {
    session.identity.view.is_none()
        || session
            .hub
            .task_route(exposed)
            .is_some_and(|(upstream, _)| session.catalog().shows_upstream(&upstream))
}

/// `tasks/list` as one client sees it: the tasks plexus handed to its principal,
/// of upstreams its view shows. An upstream lists every task it holds, and plexus
/// shares one upstream among its clients.
pub(super) fn own_tasks(session: &Session, reply: Reply) -> Reply {
    let Reply::Result(mut result) = reply else {
        return reply;
    };
    if let Some(Value::Array(tasks)) = result.get_mut("tasks") {
        tasks.retain(|task| {
            task.get("taskId")
                .and_then(Value::as_str)
                .is_some_and(|id| {
                    handed_to_principal(session, id) == Some(true) && shown(session, id)
                })
        });
    }
    Reply::Result(result)
}

/// The ids of a listen's `taskIds` it hears of (the acknowledgement's): those of
/// tasks plexus handed to the listen's principal, while it keeps their routes.
/// Another's, or an unknown one, is left out, as the extension lets a server
/// agree to fewer than asked.
pub(super) fn listen(scope: &Session, requested: &Value) -> Vec<Value> {
    let principal = &scope.identity.principal;
    let mut asked: Vec<&str> = requested
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    asked.sort_unstable();
    asked.dedup();
    asked
        .into_iter()
        .filter(|id| {
            scope
                .hub
                .task_principal(id)
                .is_some_and(|owner| owner == *principal)
        })
        .take(super::MAX_SUBSCRIPTIONS)
        .map(|id| {
            scope.hub.listen_to_task(id, scope.id());
            Value::from(id)
        })
        .collect()
}

/// An upstream's task status, for a listen that asked for the task: a
/// 2026-07-28 upstream's `notifications/tasks` as it is; a handshake-era one's
/// `notifications/tasks/status`, which lacks the outcome the extension's
/// carries, as the task `tasks/get` shows now. None: nothing to tell.
pub(super) async fn status(
    scope: &Session,
    message: &Value,
    related: &mpsc::Sender<Value>,
) -> Option<Value> {
    const METHOD: &str = "notifications/tasks";
    let params = message.get("params")?;
    if message.get("method").and_then(Value::as_str) == Some(METHOD) {
        return Some(jsonrpc::notification(METHOD, Some(params.clone())));
    }
    let task = params.get("taskId")?.clone();
    let got = serve(scope, "tasks/get", Some(json!({ "taskId": task })), related).await;
    match got.map(Reply::into_result) {
        Ok(Ok(Value::Object(mut detailed))) => {
            detailed.remove("resultType");
            Some(jsonrpc::notification(METHOD, Some(Value::Object(detailed))))
        }
        Ok(Ok(_)) => None,
        Ok(Err(error)) => {
            tracing::debug!(%error, %task, "a listened task's status could not be read");
            None
        }
        Err(error) => {
            tracing::debug!(%error, %task, "a listened task's status could not be read");
            None
        }
    }
}
