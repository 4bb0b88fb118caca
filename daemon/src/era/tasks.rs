//! Tasks across eras. 2026-07-28 has no `tasks` capability: tasks are its
//! `io.modelcontextprotocol/tasks` extension, declared by the client per request.
//! The server decides which `tools/call` becomes a task and answers with a flat
//! `CreateTaskResult` (`resultType: "task"`); `tasks/get` inlines the outcome
//! (`result` or `error`); `tasks/update` and `tasks/cancel` are acknowledged empty;
//! there is no `tasks/list` and no `tasks/result`. The handshake era has
//! `params.task`, a nested `{task}`, `ttl` / `pollInterval` and `tasks/result`.
//! Here: each shape translated into the other.

use adapters::Reply;
use serde_json::{json, Map, Value};

use super::TASKS_EXTENSION as EXTENSION;
use crate::jsonrpc::{self, RelayError};

/// The key of a handshake-era task's own result `_meta`; the extension inlines
/// results without it.
pub use crate::tasks::RELATED_TASK_META as RELATED_TASK;

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
pub fn task_fields(task: &Map<String, Value>) -> Map<String, Value> {
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

/// Whether a handshake-era task waits for its client's input.
pub fn waits_for_input(task: &Map<String, Value>) -> bool {
    task.get("status").and_then(Value::as_str) == Some("input_required")
}

pub fn is_method_not_found(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(error)
        if error.get("code").and_then(Value::as_i64) == Some(jsonrpc::METHOD_NOT_FOUND))
}

/// A 2026-07-28 client's `tools/call`: the handshake era's `task` parameter is
/// not its to send; a tool that may run as a task does when the request declares
/// the tasks extension, and one that must is refused (-32021) when it does not.
pub fn as_task_if_wanted(
    mut params: Map<String, Value>,
    support: Option<registry::TaskSupport>,
    capabilities: &Value,
) -> Result<Map<String, Value>, RelayError> {
    params.remove("task");
    let Some(support) = support else {
        return Ok(params);
    };
    if declared(capabilities) {
        params.insert("task".into(), json!({}));
    } else if support == registry::TaskSupport::Required {
        return Err(missing("this tool runs only as a task; it"));
    }
    Ok(params)
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
