//! Field-by-field round trips of what the relay tests do not cover: server-to-client
//! requests and their answers (in the handshake era, and bridged to a 2026-07-28
//! client as input-required rounds), and task results. Each is compared with the
//! same exchange made directly with the same upstream, over raw stdio on both
//! sides (`plexus serve --stdio` is a stdio server like any other), so what is
//! compared is exactly what went over the wire.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use plexus_tests::{fixture_binary, plexus_binary, RawStdioSession};
use serde_json::{json, Value};

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// Answers with fields no typed model knows, in an order of their own.
fn rich_answer(method: &str) -> Value {
    match method {
        "sampling/createMessage" => json!({
            "role": "assistant",
            "content": {"type": "text", "text": "rich answer", "_meta": {"com.example/block": 1}},
            "model": "model-7",
            "stopReason": "endTurn",
            "_meta": {"com.example/trace": "abc"},
            "x-extra": {"nested": [1, 2.5, true, null]},
        }),
        "elicitation/create" => json!({
            "action": "accept",
            "content": {"name": "Ada", "age": 7},
            "_meta": {"com.example/x": 1},
        }),
        "roots/list" => json!({
            "roots": [{"uri": "file:///a", "name": "A", "_meta": {"k": "v"}}],
            "_meta": {"m": 1},
        }),
        _ => Value::Null,
    }
}

const ALL_CLIENT_CAPABILITIES: &str =
    r#"{"sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": true}}"#;

fn stdio_config(dir: &Path, sections: &str) -> anyhow::Result<std::path::PathBuf> {
    let config = dir.join("plexus.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\n\n{sections}",
            dir.join("state").display().to_string()
        ),
    )?;
    Ok(config)
}

async fn through_plexus(config: &Path) -> anyhow::Result<RawStdioSession> {
    let config = config.to_str().context("config path")?;
    RawStdioSession::start(&plexus_binary(), &["serve", "--stdio", "--config", config]).await
}

/// Calls until the upstream is ready: while it starts (with no listing on disk yet)
/// plexus answers -33001, or -32602 before its tools are listed.
async fn call_when_ready(
    peer: &mut RawStdioSession,
    params: Value,
    answer: &dyn Fn(&str) -> Value,
) -> anyhow::Result<Value> {
    for _ in 0..600 {
        let response = peer
            .request_answering("tools/call", params.clone(), answer)
            .await?;
        let starting = response["error"]["code"] == -33001
            || response["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("unknown tool"));
        if !starting {
            return Ok(response);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the upstream never became ready")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_to_client_requests_round_trip_field_by_field() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = fixture_binary();
    let config = stdio_config(
        dir.path(),
        &format!(
            "[upstreams.fx]\ncommand = {:?}\nprefix = \"\"\n",
            fixture.display().to_string()
        ),
    )?;
    let capabilities: Value = serde_json::from_str(ALL_CLIENT_CAPABILITIES)?;

    for kind in ["sampling", "elicitation", "roots"] {
        let call = json!({"name": "ask", "arguments": {"kind": kind}});

        // Directly: the request the fixture sends, and the result it builds from the answer.
        let mut direct = RawStdioSession::start(&fixture, &[]).await?;
        direct.initialize(capabilities.clone()).await?;
        let expected = direct
            .request_answering("tools/call", call.clone(), &rich_answer)
            .await?;
        ensure!(direct.asked.len() == 1, "{kind}: asked {:?}", direct.asked);
        let sent = direct.asked[0].clone();
        direct.close().await;
        ensure!(
            expected["result"]["structuredContent"]["answer"].is_object(),
            "{kind}: {expected}"
        );

        // Through plexus, handshake era: the same request reaches the client under
        // plexus's id, and the same answer reaches the upstream under its own.
        let mut relayed = through_plexus(&config).await?;
        relayed.initialize(capabilities.clone()).await?;
        let got = call_when_ready(&mut relayed, call.clone(), &rich_answer).await?;
        ensure!(
            relayed.asked.len() == 1,
            "{kind}: asked {:?}",
            relayed.asked
        );
        ensure!(
            serde_json::to_string(&relayed.asked[0])? == serde_json::to_string(&sent)?,
            "{kind}: the upstream sent\n{sent}\nthe client got\n{}",
            relayed.asked[0]
        );
        ensure!(
            serde_json::to_string(&got["result"])? == serde_json::to_string(&expected["result"])?,
            "{kind}: directly\n{expected}\nthrough plexus\n{got}"
        );
        relayed.close().await;

        // Through plexus to a 2026-07-28 client: the same request as an input
        // request, and the same answer, given in the retry, reaches the upstream.
        let mut modern = through_plexus(&config).await?;
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        });
        let mut first_call = call.clone();
        first_call["_meta"] = meta.clone();
        let first = call_when_ready(&mut modern, first_call, &|_| Value::Null).await?;
        ensure!(
            modern.asked.is_empty(),
            "a 2026-07-28 client was sent a request"
        );
        let result = &first["result"];
        ensure!(result["resultType"] == "input_required", "{kind}: {first}");
        let requests = result["inputRequests"]
            .as_object()
            .context("inputRequests")?;
        ensure!(requests.len() == 1, "{kind}: {first}");
        let (key, request) = requests.iter().next().context("one input request")?;
        let mut wire = request.clone();
        if wire.get("params").is_none() {
            wire["params"] = Value::Null;
        }
        ensure!(
            serde_json::to_string(&wire)? == serde_json::to_string(&sent)?,
            "{kind}: the upstream sent\n{sent}\nthe input request is\n{request}"
        );
        let mut retry = call.clone();
        retry["_meta"] = meta;
        retry["requestState"] = result["requestState"].clone();
        retry["inputResponses"] =
            json!({ key.clone(): rich_answer(sent["method"].as_str().unwrap_or_default()) });
        let done = modern.request("tools/call", retry).await?;
        let mut want = expected["result"].clone();
        want["resultType"] = json!("complete");
        ensure!(
            serde_json::to_string(&done["result"])? == serde_json::to_string(&want)?,
            "{kind}: directly\n{expected}\nbridged\n{done}"
        );
        modern.close().await;
    }
    Ok(())
}

/// The fields of a task a second run cannot reproduce.
fn without_clock(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(object) => {
                for key in ["taskId", "createdAt", "lastUpdatedAt", "statusMessage"] {
                    object.remove(key);
                }
                object.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// Runs one task-augmented call to completion and returns (created, got, result).
async fn run_task(
    peer: &mut RawStdioSession,
    ready: bool,
) -> anyhow::Result<(Value, Value, Value)> {
    let call = json!({"name": "simulate-research-query", "arguments": {"topic": "relays"}, "task": {"ttl": 60000}});
    let created = if ready {
        peer.request("tools/call", call).await?
    } else {
        call_when_ready(peer, call, &|_| Value::Null).await?
    };
    let task_id = created["result"]["task"]["taskId"]
        .as_str()
        .with_context(|| format!("no task: {created}"))?
        .to_string();
    let mut got = Value::Null;
    for _ in 0..300 {
        got = peer
            .request("tasks/get", json!({"taskId": task_id}))
            .await?;
        if got["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let result = peer
        .request("tasks/result", json!({"taskId": task_id}))
        .await?;
    Ok((created, got, result))
}

/// server-everything over stdio, initialized by a handshake-era client.
async fn everything_directly() -> anyhow::Result<RawStdioSession> {
    let mut direct = RawStdioSession::start(Path::new("npx"), &["-y", EVERYTHING]).await?;
    direct
        .initialize(json!({}))
        .await
        .context("server-everything did not start")?;
    Ok(direct)
}

/// plexus's config with server-everything, unprefixed, as its one upstream.
fn everything_config(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    stdio_config(
        dir,
        &format!("[upstreams.everything]\nnpx = \"{EVERYTHING}\"\nprefix = \"\"\ninit_timeout = \"180s\"\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_results_round_trip_field_by_field() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut direct = everything_directly().await?;
    let (created, got, result) = run_task(&mut direct, true).await?;
    direct.close().await;

    let config = everything_config(dir.path())?;
    let mut relayed = through_plexus(&config).await?;
    relayed.initialize(json!({})).await?;
    let (relayed_created, relayed_got, relayed_result) = run_task(&mut relayed, false).await?;
    relayed.close().await;

    // Task ids name their upstream; everything else is the upstream's, field by field.
    let exposed = relayed_created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_default();
    ensure!(exposed.starts_with("everything:"), "{relayed_created}");
    for (what, direct, relayed) in [
        ("the created task", created, relayed_created),
        ("tasks/get", got, relayed_got),
        ("tasks/result", result, relayed_result),
    ] {
        let direct = without_clock(direct["result"].clone());
        let relayed = without_clock(relayed["result"].clone());
        ensure!(!direct.is_null(), "{what}: nothing directly");
        ensure!(
            serde_json::to_string(&direct)? == serde_json::to_string(&relayed)?,
            "{what}: directly\n{direct}\nthrough plexus\n{relayed}"
        );
    }
    Ok(())
}

/// URL-mode elicitations across eras. A 2026-07-28 upstream's carries no
/// `elicitationId` (that revision has none): a handshake-era client, whose revision
/// requires one, gets one plexus minted, and once the upstream has taken the answer,
/// `notifications/elicitation/complete` names it. A handshake-era upstream's own id
/// reaches a handshake-era client untouched, and is left out of the input request a
/// 2026-07-28 client gets, whose answer still completes the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_elicitations_carry_an_elicitation_id_only_in_the_era_that_has_one(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = fixture_binary().display().to_string();
    let config = stdio_config(
        dir.path(),
        &format!(
            "[upstreams.new]\ncommand = {fixture:?}\nargs = [\"--modern\"]\nprotocol = \"2026-07-28\"\n\n\
             [upstreams.old]\ncommand = {fixture:?}\n"
        ),
    )?;
    let capabilities = json!({"elicitation": {"url": {}}});
    let accept = |method: &str| match method {
        "elicitation/create" => json!({"action": "accept"}),
        _ => Value::Null,
    };
    let url_call = |tool: &str| json!({"name": tool, "arguments": {"kind": "url"}});

    let mut legacy = through_plexus(&config).await?;
    legacy.initialize(capabilities.clone()).await?;
    let done = call_when_ready(&mut legacy, url_call("new__ask"), &accept).await?;
    ensure!(
        done["result"]["content"][0]["text"] == "url:accept",
        "{done}"
    );
    ensure!(legacy.asked.len() == 1, "{:?}", legacy.asked);
    let asked = &legacy.asked[0]["params"];
    ensure!(
        asked["mode"] == "url" && asked["url"] == "https://example.com/sign-in",
        "{asked}"
    );
    let minted = asked["elicitationId"]
        .as_str()
        .filter(|id| id.starts_with("plexus-elicitation-"))
        .with_context(|| format!("no minted elicitationId: {asked}"))?
        .to_string();
    let completed: Vec<&Value> = legacy
        .heard
        .iter()
        .filter(|m| m["method"] == "notifications/elicitation/complete")
        .collect();
    ensure!(
        completed.len() == 1 && completed[0]["params"]["elicitationId"] == minted.as_str(),
        "completion of {minted}: {:?}",
        legacy.heard
    );
    // The handshake-era upstream's own id, relayed as it is.
    legacy.asked.clear();
    let done = call_when_ready(&mut legacy, url_call("old__ask"), &accept).await?;
    ensure!(
        done["result"]["content"][0]["text"] == "url:accept",
        "{done}"
    );
    ensure!(
        legacy.asked.len() == 1 && legacy.asked[0]["params"]["elicitationId"] == "fixture-url-1",
        "{:?}",
        legacy.asked
    );
    legacy.close().await;

    let mut modern = through_plexus(&config).await?;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    let mut first_call = url_call("old__ask");
    first_call["_meta"] = meta.clone();
    let first = call_when_ready(&mut modern, first_call, &|_| Value::Null).await?;
    let result = &first["result"];
    ensure!(result["resultType"] == "input_required", "{first}");
    let requests = result["inputRequests"]
        .as_object()
        .context("inputRequests")?;
    let (key, request) = requests.iter().next().context("one input request")?;
    ensure!(
        request["method"] == "elicitation/create"
            && request["params"]["mode"] == "url"
            && request["params"]["url"] == "https://example.com/sign-in"
            && request["params"].get("elicitationId").is_none(),
        "{request}"
    );
    let mut retry = url_call("old__ask");
    retry["_meta"] = meta;
    retry["requestState"] = result["requestState"].clone();
    retry["inputResponses"] = json!({ key.clone(): {"action": "accept"} });
    let done = modern.request("tools/call", retry).await?;
    ensure!(
        done["result"]["content"][0]["text"] == "url:accept"
            && done["result"]["resultType"] == "complete",
        "{done}"
    );
    modern.close().await;
    Ok(())
}

/// A 2026-07-28 client uses server-everything's tasks (handshake era) through the
/// tasks extension: offered as `extensions`, not `tasks`; a tool call that declares
/// the extension becomes a flat task (`resultType: "task"`, `ttlMs`); `tasks/get`
/// polls it and, once it is done, inlines the very result a handshake-era client
/// gets from `tasks/result` directly; `tasks/cancel` is acknowledged empty, even
/// for a finished task; `tasks/list` and `tasks/result` do not exist; and a request
/// that does not declare the extension is refused with -32021.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_runs_handshake_era_tasks_through_the_extension() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut direct = everything_directly().await?;
    let (_, _, expected) = run_task(&mut direct, true).await?;
    direct.close().await;

    let config = everything_config(dir.path())?;
    let mut client = through_plexus(&config).await?;
    let declaring = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let bare = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let call = json!({"name": "simulate-research-query", "arguments": {"topic": "relays"}, "_meta": declaring});
    let created = call_when_ready(&mut client, call, &|_| Value::Null).await?;
    let created = &created["result"];
    ensure!(
        created["resultType"] == "task" && created.get("task").is_none(),
        "{created}"
    );
    ensure!(
        created.get("ttlMs").is_some() && created.get("ttl").is_none(),
        "{created}"
    );
    let task_id = created["taskId"]
        .as_str()
        .filter(|id| id.starts_with("everything:"))
        .with_context(|| format!("no exposed task id: {created}"))?
        .to_string();

    let discovered = client
        .request("server/discover", json!({"_meta": bare}))
        .await?;
    let capabilities = &discovered["result"]["capabilities"];
    ensure!(
        capabilities.get("tasks").is_none()
            && capabilities["extensions"]
                .get("io.modelcontextprotocol/tasks")
                .is_some(),
        "{discovered}"
    );

    let get = json!({"taskId": task_id, "_meta": declaring});
    let mut got = Value::Null;
    for _ in 0..300 {
        got = client.request("tasks/get", get.clone()).await?;
        if got["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = &got["result"];
    ensure!(
        got["status"] == "completed" && got["resultType"] == "complete",
        "{got}"
    );
    let mut want = expected["result"].clone();
    if let Some(meta) = want.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove("io.modelcontextprotocol/related-task");
        if meta.is_empty() {
            want.as_object_mut().map(|w| w.remove("_meta"));
        }
    }
    ensure!(
        serde_json::to_string(&got["result"])? == serde_json::to_string(&want)?,
        "inlined\n{}\ndirectly from tasks/result\n{want}",
        got["result"]
    );

    let cancelled = client.request("tasks/cancel", get.clone()).await?;
    ensure!(
        cancelled["result"] == json!({"resultType": "complete"}),
        "{cancelled}"
    );
    for method in ["tasks/list", "tasks/result"] {
        let answer = client
            .request(method, json!({"taskId": task_id, "_meta": declaring}))
            .await?;
        ensure!(answer["error"]["code"] == -32601, "{method}: {answer}");
    }
    let refused = client
        .request("tasks/get", json!({"taskId": task_id, "_meta": bare}))
        .await?;
    ensure!(
        refused["error"]["code"] == -32021
            && refused["error"]["data"]["requiredCapabilities"]["extensions"]
                .get("io.modelcontextprotocol/tasks")
                .is_some(),
        "{refused}"
    );
    // Without the extension the same tool runs as a plain call, or, if it only
    // runs as a task, is refused.
    let listed = client.request("tools/list", json!({"_meta": bare})).await?;
    let support = listed["result"]["tools"]
        .as_array()
        .and_then(|tools| {
            tools
                .iter()
                .find(|t| t["name"] == "simulate-research-query")
        })
        .map(|tool| tool["execution"]["taskSupport"].clone())
        .context("simulate-research-query is not listed")?;
    let plain = client
        .request(
            "tools/call",
            json!({"name": "simulate-research-query", "arguments": {"topic": "relays"}, "_meta": bare}),
        )
        .await?;
    if support == "required" {
        ensure!(plain["error"]["code"] == -32021, "{plain}");
    } else {
        ensure!(
            plain["result"]["resultType"] == "complete" && plain["result"]["content"].is_array(),
            "{support}: {plain}"
        );
    }
    client.close().await;
    Ok(())
}

/// A handshake-era client uses a 2026-07-28 upstream's tasks (the fixture's tasks
/// extension, the upstream reached in 2026-07-28 only): offered the `tasks` slot, its
/// `task`-augmented call gets that era's nested task (`ttl`, `pollInterval`),
/// `tasks/get` a `Task` without the inlined outcome (a tool error is `failed`), and
/// `tasks/result` waits for the outcome, carrying the related-task `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_client_runs_a_2026_upstreams_tasks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = fixture_binary().display().to_string();
    let config = stdio_config(
        dir.path(),
        &format!(
            "[upstreams.fx]\ncommand = {fixture:?}\nargs = [\"--conformance\", \"--modern\"]\nprotocol = \"2026-07-28\"\n"
        ),
    )?;
    // A first run lists the upstream and keeps what it advertised on disk, so the
    // next one can answer `initialize` with it before the upstream is up.
    let mut first = through_plexus(&config).await?;
    first.initialize(json!({})).await?;
    call_when_ready(
        &mut first,
        json!({"name": "fx__greet", "arguments": {"name": "x"}}),
        &|_| Value::Null,
    )
    .await?;
    first.close().await;
    let mut client = through_plexus(&config).await?;
    let hello = client.initialize(json!({})).await?;
    ensure!(
        hello["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{hello}"
    );
    let call = json!({"name": "fx__slow_compute", "arguments": {"seconds": 0.3, "label": "eras"}, "task": {"ttl": 60000}});
    let created = call_when_ready(&mut client, call, &|_| Value::Null).await?;
    let task = &created["result"]["task"];
    let task_id = task["taskId"]
        .as_str()
        .filter(|id| id.starts_with("fx:"))
        .with_context(|| format!("no nested task: {created}"))?
        .to_string();
    ensure!(
        created["result"].get("resultType").is_none()
            && task.get("ttl").is_some()
            && task.get("ttlMs").is_none(),
        "{created}"
    );
    let got = client
        .request("tasks/get", json!({"taskId": task_id}))
        .await?;
    ensure!(
        got["result"]["taskId"] == task_id.as_str()
            && got["result"].get("result").is_none()
            && got["result"].get("resultType").is_none(),
        "{got}"
    );
    let result = client
        .request("tasks/result", json!({"taskId": task_id}))
        .await?;
    let text = result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    ensure!(text.contains("eras"), "{result}");
    ensure!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
            == task_id.as_str(),
        "{result}"
    );
    let done = client
        .request("tasks/get", json!({"taskId": task_id}))
        .await?;
    ensure!(done["result"]["status"] == "completed", "{done}");

    // A tool error ends `completed` in the extension, `failed` in this era.
    let failing = client
        .request(
            "tools/call",
            json!({"name": "fx__failing_job", "arguments": {}, "task": {}}),
        )
        .await?;
    let failing_id = failing["result"]["task"]["taskId"]
        .as_str()
        .with_context(|| format!("{failing}"))?
        .to_string();
    let outcome = client
        .request("tasks/result", json!({"taskId": failing_id}))
        .await?;
    ensure!(outcome["result"]["isError"] == true, "{outcome}");
    let status = client
        .request("tasks/get", json!({"taskId": failing_id}))
        .await?;
    ensure!(status["result"]["status"] == "failed", "{status}");
    client.close().await;
    Ok(())
}

/// Two upstreams may choose one URL elicitation id (both fixtures choose
/// `fixture-url-1`), and so may two sessions' own instances of one per-session
/// upstream: each one's `notifications/elicitation/complete` reaches the client it
/// asked, never the other's, however their elicitations interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_elicitation_id_from_two_upstreams_completes_for_each_its_own_client(
) -> anyhow::Result<()> {
    use plexus_tests::answering::{call, eventually_len, len_of, AnsweringClient};
    use plexus_tests::{fixture_upstream, Daemon};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    let two_upstreams = format!(
        "{}{}",
        fixture_upstream("a", "", &[]),
        fixture_upstream("b", "", &[])
    );
    let per_session = fixture_upstream("a", "share = \"session\"", &[]);
    for (sections, slow_tool, quick_tool) in [
        (two_upstreams, "a__ask", "b__ask"),
        (per_session, "a__ask", "a__ask"),
    ] {
        let daemon = Daemon::builder().upstreams(&sections).start().await?;
        daemon.wait_ready(Duration::from_secs(20)).await?;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let mut slow = AnsweringClient::named("slow");
        slow.elicitation_gate = Some(gate.clone());
        let slow_asked = slow.elicitations_asked.clone();
        let quick = AnsweringClient::named("quick");
        let (slow_heard, quick_heard) = (
            slow.elicitations_completed.clone(),
            quick.elicitations_completed.clone(),
        );
        let slow = slow
            .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
            .await?;
        let quick = quick
            .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
            .await?;
        plexus_tests::answering::wait_for_tool(&slow, slow_tool).await?;
        // The slow client is asked first; the quick one, under the same id, while it
        // thinks, and is answered, completion and all, before the slow one answers.
        let slow_call = call(&slow, slow_tool, json!({"kind": "url"}));
        let quick_call = async {
            let quick_round = async {
                plexus_tests::eventually(Duration::from_secs(10), async || {
                    ensure!(slow_asked.load(Ordering::SeqCst) == 1, "slow not asked");
                    Ok(())
                })
                .await?;
                let answer = call(&quick, quick_tool, json!({"kind": "url"})).await?;
                let heard = eventually_len(&quick_heard, Duration::from_secs(10)).await;
                ensure!(heard == 1, "{quick_tool}: quick heard {heard} completions");
                anyhow::Ok(answer)
            };
            let answer = quick_round.await;
            // The slow client answers now, whatever happened to the quick one.
            gate.add_permits(1);
            answer
        };
        let (slow_answer, quick_answer) = tokio::join!(slow_call, quick_call);
        for answer in [slow_answer?, quick_answer?] {
            ensure!(answer["content"][0]["text"] == "url:accept", "{answer}");
        }
        ensure!(
            eventually_len(&slow_heard, Duration::from_secs(10)).await == 1,
            "{quick_tool}: completions heard: slow {:?}, quick {:?}",
            len_of(&slow_heard),
            len_of(&quick_heard)
        );
        // None more arrives: a stray copy would come before a later completion to
        // the same client (a session's messages keep their order), so each asks once
        // more and hears exactly that one more.
        gate.add_permits(1);
        for (client, tool, heard) in [
            (&quick, quick_tool, &quick_heard),
            (&slow, slow_tool, &slow_heard),
        ] {
            let again = call(client, tool, json!({"kind": "url"})).await?;
            ensure!(again["content"][0]["text"] == "url:accept", "{again}");
            plexus_tests::eventually(Duration::from_secs(10), async || {
                ensure!(len_of(heard) >= 2, "{tool}: no second completion");
                Ok(())
            })
            .await?;
            ensure!(
                len_of(heard) == 2,
                "{tool}: completions heard: slow {:?}, quick {:?}",
                len_of(&slow_heard),
                len_of(&quick_heard)
            );
        }
        slow.cancel().await?;
        quick.cancel().await?;
        ensure!(daemon.stop().await?.success());
    }
    Ok(())
}
