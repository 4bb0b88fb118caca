//! Task status on a 2026-07-28 `subscriptions/listen` stream (the tasks
//! extension's `taskIds`): a handshake-era upstream's `notifications/tasks/status`
//! reaches the listen of the principal whose task it is as `notifications/tasks`,
//! the task as `tasks/get` shows it; another principal's listen naming the same
//! id is not agreed to and hears nothing; in a cluster, on a node other than the
//! task's, under the sealed id. Raw HTTP, so every field is seen as sent.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::cluster::TestCluster;
use plexus_tests::{answer_of, fixture_upstream, Daemon};
use serde_json::{json, Value};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-9876543210";

/// The `_meta` of a 2026-07-28 request, declaring the tasks extension or not.
fn meta(extension: bool) -> Value {
    let capabilities = if extension {
        json!({"extensions": {TASKS: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    })
}

fn post(client: &reqwest::Client, url: &str, token: &str, method: &str) -> reqwest::RequestBuilder {
    client
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
}

/// A `subscriptions/listen` stream, read event by event.
struct Listen {
    response: reqwest::Response,
    buffer: String,
}

impl Listen {
    async fn open(url: &str, token: &str, task: &str) -> anyhow::Result<Listen> {
        let body = json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
            "params": {"notifications": {"taskIds": [task]}, "_meta": meta(true)}});
        let response = post(&reqwest::Client::new(), url, token, "subscriptions/listen")
            .body(body.to_string())
            .send()
            .await?;
        ensure!(response.status() == 200, "listen: {}", response.status());
        Ok(Listen {
            response,
            buffer: String::new(),
        })
    }

    /// The next message, within `within`; None if none came.
    async fn next(&mut self, within: Duration) -> anyhow::Result<Option<Value>> {
        let reading = async {
            loop {
                while let Some(end) = self.buffer.find("\n\n") {
                    let event: String = self.buffer.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: ")) {
                        return anyhow::Ok(serde_json::from_str::<Value>(data)?);
                    }
                }
                let chunk = self.response.chunk().await?.context("the stream ended")?;
                self.buffer.push_str(std::str::from_utf8(&chunk)?);
            }
        };
        match tokio::time::timeout(within, reading).await {
            Ok(message) => message.map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// Alice's task of `tool` (`slow_compute`: 1.5 s), started at `url`: its id.
async fn create_task(url: &str, tool: &str) -> anyhow::Result<String> {
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": {"seconds": 1.5, "label": "heard"},
        "_meta": meta(true)}});
    let (_, answer, _) = answer_of(
        post(&reqwest::Client::new(), url, ALICE, "tools/call")
            .header("mcp-name", tool)
            .body(call.to_string())
            .send()
            .await?,
    )
    .await?;
    ensure!(answer["result"]["resultType"] == "task", "{answer}");
    answer["result"]["taskId"]
        .as_str()
        .map(str::to_string)
        .context("no taskId")
}

/// The task ids a listen's acknowledgement agreed to.
fn agreed(message: Option<Value>) -> anyhow::Result<Value> {
    let message = message.context("no acknowledgement")?;
    ensure!(
        message["method"] == "notifications/subscriptions/acknowledged",
        "{message}"
    );
    Ok(message["params"]["notifications"]["taskIds"].clone())
}

/// Reads `listen` until the task completes: its last status, each one checked
/// to name `task` and the listen.
async fn until_completed(listen: &mut Listen, task: &str) -> anyhow::Result<Value> {
    loop {
        let message = listen
            .next(Duration::from_secs(20))
            .await?
            .context("no task status on the listen")?;
        ensure!(message["method"] == "notifications/tasks", "{message}");
        let params = &message["params"];
        ensure!(params["taskId"] == task, "{message}");
        ensure!(
            params["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen-1",
            "{message}"
        );
        if params["status"] == "completed" {
            return Ok(params.clone());
        }
        ensure!(params["status"] == "working", "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_naming_its_task_hears_its_status_and_another_principals_hears_nothing(
) -> anyhow::Result<()> {
    let section = fixture_upstream(
        "fx",
        "prefix = \"\"\nprotocol = \"handshake\"\non_schema_change = \"warn\"",
        &["--conformance", "--modern"],
    );
    let daemon = Daemon::builder()
        .daemon(format!(
            "auth_tokens = {{ alice = \"{ALICE}\", bob = \"{BOB}\" }}"
        ))
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = reqwest::Client::new();
    let task = create_task(&daemon.url, "slow_compute").await?;
    let started = Instant::now();

    // Naming tasks needs the extension declared (-32021, as for `tasks/get`).
    let undeclared = json!({"jsonrpc": "2.0", "id": 2, "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [task]}, "_meta": meta(false)}});
    let (_, refused, _) = answer_of(
        post(&client, &daemon.url, ALICE, "subscriptions/listen")
            .body(undeclared.to_string())
            .send()
            .await?,
    )
    .await?;
    ensure!(refused["error"]["code"] == -32021, "{refused}");

    let mut alice = Listen::open(&daemon.url, ALICE, &task).await?;
    let mut bob = Listen::open(&daemon.url, BOB, &task).await?;
    let agreed_to = agreed(alice.next(Duration::from_secs(10)).await?)?;
    ensure!(
        agreed_to == json!([task]),
        "alice's listen agreed to {agreed_to}"
    );
    let agreed_to = agreed(bob.next(Duration::from_secs(10)).await?)?;
    ensure!(agreed_to == json!([]), "bob's listen agreed to {agreed_to}");

    // Status until the task completes, its result inlined as `tasks/get` has it.
    let completed = until_completed(&mut alice, &task).await?;
    println!(
        "task status heard on the listen {:?} after the call",
        started.elapsed()
    );
    let text = completed["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    ensure!(text.contains("heard"), "{completed}");
    ensure!(completed.get("resultType").is_none(), "{completed}");

    // Bob's listen, open the whole time, heard nothing of it.
    let heard = bob.next(Duration::from_millis(500)).await?;
    ensure!(heard.is_none(), "bob's listen heard {heard:?}");
    // Closed first: a listen stream still open holds the daemon's stop ~10 s.
    drop((alice, bob));
    let stopping = Instant::now();
    ensure!(daemon.stop().await?.success());
    println!("the daemon stopped in {:?}", stopping.elapsed());
    Ok(())
}

/// In a cluster the task id is sealed for its node and principal: a listen
/// landing on another node is opened there too (the merge), the node that runs
/// the task agrees to it and sends its status, under the id the client was given;
/// bob's listen naming it, on either node, is agreed to nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_listen_on_another_node_hears_its_task() -> anyhow::Result<()> {
    let cluster = TestCluster::start_with(
        2,
        &format!("auth_tokens = {{ alice = \"{ALICE}\", bob = \"{BOB}\" }}"),
        &["--conformance", "--modern"],
        "protocol = \"handshake\"",
    )
    .await?;
    let task = create_task(&cluster.url(0), "fx__slow_compute").await?;
    ensure!(task.starts_with("plexus."), "{task}");
    let mut alice = Listen::open(&cluster.url(1), ALICE, &task).await?;
    let mut bob = Listen::open(&cluster.url(1), BOB, &task).await?;
    let agreed_to = agreed(alice.next(Duration::from_secs(10)).await?)?;
    ensure!(
        agreed_to == json!([task]),
        "alice's listen agreed to {agreed_to}\n{}",
        cluster.logs()
    );
    let agreed_to = agreed(bob.next(Duration::from_secs(10)).await?)?;
    ensure!(agreed_to == json!([]), "bob's listen agreed to {agreed_to}");
    let completed = until_completed(&mut alice, &task)
        .await
        .with_context(|| cluster.logs())?;
    ensure!(
        completed["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("heard")),
        "{completed}"
    );
    let heard = bob.next(Duration::from_millis(500)).await?;
    ensure!(heard.is_none(), "bob's listen heard {heard:?}");
    drop((alice, bob));
    Ok(())
}
