//! Tasks of 2026-07-28 clients over a handshake-era upstream (the dual-era
//! fixture forced into that era): the tasks extension's input flow
//! (`input_required` with `inputRequests` on `tasks/get`, answered by
//! `tasks/update`) over that era's (requests naming the task, sent while a
//! `tasks/result` is held). Raw HTTP, so every field is seen as sent.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{answer_of, fixture_upstream, Daemon};
use serde_json::{json, Value};

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A 2026-07-28 client that declares the tasks extension and elicitation.
struct Modern {
    client: reqwest::Client,
    url: String,
    next: std::sync::atomic::AtomicU64,
}

impl Modern {
    fn new(url: &str) -> Modern {
        Modern {
            client: reqwest::Client::new(),
            url: url.to_string(),
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The request's result, or its JSON-RPC error as an `Err`.
    async fn request(&self, method: &str, mut params: Value) -> anyhow::Result<Value> {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities":
                {"elicitation": {}, "extensions": {TASKS: {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        });
        let name = params
            .get("taskId")
            .or_else(|| params.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        if let Some(name) = name {
            request = request.header("mcp-name", name);
        }
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, answer, _) = answer_of(request.body(body.to_string()).send().await?).await?;
        match answer.get("result") {
            Some(result) => Ok(result.clone()),
            None => anyhow::bail!("{method}: HTTP {status}: {answer}"),
        }
    }

    /// Polls `tasks/get` until `done` holds of the task, for up to 10 s.
    async fn until(&self, task: &str, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        let started = Instant::now();
        loop {
            let got = self.request("tasks/get", json!({"taskId": task})).await?;
            if done(&got) {
                return Ok(got);
            }
            ensure!(
                started.elapsed() < Duration::from_secs(10),
                "the task never got there: {got}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn daemon() -> anyhow::Result<Daemon> {
    let section = fixture_upstream(
        "fx",
        "prefix = \"\"\nprotocol = \"handshake\"\non_schema_change = \"warn\"",
        &["--conformance", "--modern"],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    Ok(daemon)
}

async fn start_task(client: &Modern, tool: &str, arguments: Value) -> anyhow::Result<String> {
    let created = client
        .request("tools/call", json!({"name": tool, "arguments": arguments}))
        .await?;
    ensure!(created["resultType"] == "task", "{created}");
    created["taskId"]
        .as_str()
        .map(str::to_string)
        .context("no taskId")
}

/// `tasks/update` has no handshake-era form: plexus serves it for such an
/// upstream's task instead of sending the upstream a method of another era
/// (which a dual-era server refuses with -32021, a handshake-era one with -32601).
/// Keys it does not expect are ignored, as the extension asks; an unknown task
/// is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_clients_task_update_of_a_handshake_era_task_is_acknowledged() -> anyhow::Result<()>
{
    let daemon = daemon().await?;
    let client = Modern::new(&daemon.url);
    let task = start_task(
        &client,
        "slow_compute",
        json!({"seconds": 60, "label": "u"}),
    )
    .await?;
    let ack = client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {"unknown-key": {"ignored": true}}}),
        )
        .await?;
    ensure!(ack == json!({"resultType": "complete"}), "{ack}");
    let unknown = client
        .request(
            "tasks/update",
            json!({"taskId": "fx:no-such-task", "inputResponses": {}}),
        )
        .await;
    ensure!(
        unknown
            .as_ref()
            .is_err_and(|e| e.to_string().contains("-32602")),
        "{unknown:?}"
    );
    client
        .request("tasks/cancel", json!({"taskId": task}))
        .await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A handshake-era task waiting for input asks with requests naming the task,
/// while a `tasks/result` is held: plexus holds it for a 2026-07-28 client, shows
/// the requests as the task's `inputRequests` (both of two asked together), passes
/// each answer of `tasks/update` to the upstream (a partial one leaves the other
/// request pending), and the task completes with the answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_era_tasks_input_is_asked_and_answered_through_the_extension(
) -> anyhow::Result<()> {
    let daemon = daemon().await?;
    let client = Modern::new(&daemon.url);
    let task = start_task(&client, "multi_input", json!({})).await?;
    let waiting = client
        .until(&task, |got| {
            got["status"] == "input_required"
                && got["inputRequests"]
                    .as_object()
                    .is_some_and(|r| r.len() == 2)
        })
        .await?;
    let requests = waiting["inputRequests"]
        .as_object()
        .context("no inputRequests")?;
    let mut keys = Vec::new();
    for (key, request) in requests {
        ensure!(request["method"] == "elicitation/create", "{request}");
        ensure!(
            request["params"]["_meta"]["io.modelcontextprotocol/related-task"].is_null(),
            "the handshake-era task naming is the upstream's, not the client's: {request}"
        );
        let field = if request["params"]["requestedSchema"]["properties"]
            .get("name")
            .is_some()
        {
            json!({"action": "accept", "content": {"name": "Ada"}})
        } else {
            json!({"action": "accept", "content": {"confirm": true}})
        };
        keys.push((key.clone(), field));
    }
    let (first, second) = (keys[0].clone(), keys[1].clone());
    let ack = client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {first.0.clone(): first.1}}),
        )
        .await?;
    ensure!(ack == json!({"resultType": "complete"}), "{ack}");
    let left = client.request("tasks/get", json!({"taskId": task})).await?;
    ensure!(left["status"] == "input_required", "{left}");
    let left_keys: Vec<&String> = left["inputRequests"]
        .as_object()
        .context("no inputRequests")?
        .keys()
        .collect();
    ensure!(left_keys == vec![&second.0], "{left}");
    client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {second.0.clone(): second.1}}),
        )
        .await?;
    let done = client
        .until(&task, |got| {
            got["status"] != "input_required" && got["status"] != "working"
        })
        .await?;
    ensure!(done["status"] == "completed", "{done}");
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    ensure!(text == "Name: Ada; confirmed: true", "{done}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}
