//! Tasks (2025-11-25): task ids are namespaced per upstream as `{upstream}:{id}`,
//! recorded with the session that created them, and rewritten in every result and
//! notification that carries one.

use std::sync::Arc;

use adapters::Reply;
use serde_json::{json, Value};

use crate::hub::{CallContext, Hub};
use crate::jsonrpc::RelayError;

/// Where a task's id appears in results and notifications.
const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";

/// The exposed form of an upstream's task id.
pub fn expose_task_id(upstream: &str, task_id: &str) -> String {
    format!("{upstream}:{task_id}")
}

/// Rewrites every task id in a result or notification params: `taskId` of the object
/// itself, of `task`, of each of `tasks`, and of `_meta` related-task.
pub fn rewrite_task_ids(value: &mut Value, rewrite: &dyn Fn(&str) -> Option<String>) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    let fix = |holder: Option<&mut Value>| {
        if let Some(Value::String(id)) = holder.and_then(|h| h.get_mut("taskId")) {
            if let Some(new) = rewrite(id) {
                *id = new;
            }
        }
    };
    if let Some(Value::String(id)) = object.get_mut("taskId") {
        if let Some(new) = rewrite(id) {
            *id = new;
        }
    }
    fix(object.get_mut("task"));
    fix(object
        .get_mut("_meta")
        .and_then(|meta| meta.get_mut(RELATED_TASK_META)));
    if let Some(Value::Array(tasks)) = object.get_mut("tasks") {
        for task in tasks {
            fix(Some(task));
        }
    }
}

impl Hub {
    /// Records the tasks a result created (for `session`) and exposes their ids.
    pub fn expose_tasks(&self, upstream: &str, session: Option<u64>, reply: Reply) -> Reply {
        let Reply::Result(mut result) = reply else {
            return reply;
        };
        rewrite_task_ids(&mut result, &|id| {
            let exposed = expose_task_id(upstream, id);
            self.task_routes
                .entry(exposed.clone())
                .or_insert_with(|| TaskRoute {
                    upstream: upstream.to_string(),
                    original: id.to_string(),
                    session,
                });
            Some(exposed)
        });
        Reply::Result(result)
    }

    /// The upstream and original id behind an exposed task id.
    pub fn route_task(&self, exposed: &str) -> Option<(String, String)> {
        if let Some(route) = self.task_routes.get(exposed) {
            return Some((route.upstream.clone(), route.original.clone()));
        }
        // A task listed before plexus restarted: the prefix names a known upstream.
        let (upstream, original) = exposed.split_once(':')?;
        self.upstream_named(upstream).ok()?;
        Some((upstream.to_string(), original.to_string()))
    }

    /// The session that created a task, for its status notifications.
    pub fn task_owner(&self, exposed: &str) -> Option<u64> {
        self.task_routes
            .get(exposed)
            .and_then(|route| route.session)
    }

    /// `tasks/get`, `tasks/result`, `tasks/cancel`: routed by the task id.
    pub async fn forward_task_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        let exposed = params
            .get("taskId")
            .and_then(Value::as_str)
            .ok_or_else(|| RelayError::InvalidParams("`taskId` must be a string".into()))?
            .to_string();
        let (upstream, original) = self
            .route_task(&exposed)
            .ok_or_else(|| RelayError::InvalidParams(format!("unknown task `{exposed}`")))?;
        params.insert("taskId".into(), Value::String(original));
        let session = call.session;
        let reply = self
            .forward(&upstream, method, Some(Value::Object(params)), call)
            .await?;
        Ok(self.expose_tasks(&upstream, Some(session), reply))
    }

    /// `tasks/list`: every upstream that lists tasks, merged, ids exposed.
    pub async fn list_tasks(self: &Arc<Self>, call: CallContext<'_>) -> Result<Reply, RelayError> {
        let mut tasks = Vec::new();
        let listing: Vec<String> = self
            .upstreams()
            .values()
            .filter(|upstream| {
                upstream
                    .known_capabilities()
                    .get("tasks")
                    .and_then(|tasks| tasks.get("list"))
                    .is_some()
            })
            .map(|upstream| upstream.name().to_string())
            .collect();
        for upstream in listing {
            let context = CallContext {
                session: call.session,
                owner: call.owner,
                tool: None,
                related: call.related,
                headers: &[],
            };
            match self
                .forward(&upstream, "tasks/list", Some(json!({})), context)
                .await
            {
                Ok(reply) => {
                    if let Reply::Result(mut result) = self.expose_tasks(&upstream, None, reply) {
                        if let Some(Value::Array(found)) = result.get_mut("tasks").map(Value::take)
                        {
                            tasks.extend(found);
                        }
                    }
                }
                // One upstream being down leaves the others' tasks listed.
                Err(error) => {
                    tracing::debug!(upstream, %error, "listing an upstream's tasks failed")
                }
            }
        }
        Ok(Reply::Result(json!({ "tasks": tasks })))
    }
}

/// Where an exposed task id leads.
pub struct TaskRoute {
    pub upstream: String,
    pub original: String,
    pub session: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_rewritten_wherever_they_appear() {
        let mut value = json!({
            "taskId": "a",
            "task": {"taskId": "b", "status": "working"},
            "tasks": [{"taskId": "c"}, {"taskId": "d"}],
            "_meta": {RELATED_TASK_META: {"taskId": "e"}},
            "content": [{"type": "text", "text": "taskId stays"}],
        });
        rewrite_task_ids(&mut value, &|id| Some(expose_task_id("up", id)));
        assert_eq!(
            value,
            json!({
                "taskId": "up:a",
                "task": {"taskId": "up:b", "status": "working"},
                "tasks": [{"taskId": "up:c"}, {"taskId": "up:d"}],
                "_meta": {RELATED_TASK_META: {"taskId": "up:e"}},
                "content": [{"type": "text", "text": "taskId stays"}],
            })
        );
    }
}
