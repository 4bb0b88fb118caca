//! Nodes of one `[cluster]` on loopback, each with its own fixture upstream: a
//! handshake-era session is served by the node that opened it wherever its
//! requests land (forwarded once, over HTTP); ids that are garbage, truncated,
//! another principal's or sealed under a retired key are unknown sessions (404);
//! an upstream's `requestState` and task ids open for their principal alone; a
//! `subscriptions/listen` stream hears changes made through any node.

use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::cluster::TestCluster;
use serde_json::{json, Value};

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";

fn tokens() -> String {
    format!("auth_tokens = {{ alice = \"{ALICE}\", bob = \"{BOB}\" }}")
}

/// An answer as the test reads it: status, the node that served it if a peer
/// did, the session id it gave, and the JSON-RPC message.
struct Answer {
    status: u16,
    served_by: Option<String>,
    session: Option<String>,
    body: Value,
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    session: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<Answer> {
    let mut request = client
        .request(method, url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?);
    }
    let response = request.send().await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (status, served_by, session) = (
        response.status().as_u16(),
        header("plexus-served-by"),
        header("mcp-session-id"),
    );
    let text = response.text().await?;
    // An event stream's response is its last event.
    let json = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .next_back()
        .unwrap_or(&text);
    // Plain-text refusals (409, 406) are kept as text.
    let body = serde_json::from_str(json).unwrap_or(Value::String(text.clone()));
    Ok(Answer {
        status,
        served_by,
        session,
        body,
    })
}

async fn initialize(client: &reqwest::Client, url: &str, token: &str) -> anyhow::Result<String> {
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let answer = send(client, reqwest::Method::POST, url, token, None, Some(hello)).await?;
    ensure!(answer.status == 200, "initialize: {}", answer.body);
    answer.session.context("no session id")
}

fn call_add(id: u64, a: i64, b: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "fx__add", "arguments": {"a": a, "b": b}}})
}

/// `a + b` called through `url` on alice's `session`: the answer, its sum checked.
async fn add_via(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    (id, a, b): (u64, i64, i64),
) -> anyhow::Result<Answer> {
    let call = Some(call_add(id, a, b));
    let answer = send(
        client,
        reqwest::Method::POST,
        url,
        ALICE,
        Some(session),
        call,
    )
    .await?;
    ensure!(
        answer.body["result"]["structuredContent"]["sum"] == a + b,
        "{id} via {url}: {} {}",
        answer.status,
        answer.body
    );
    Ok(answer)
}

#[tokio::test]
async fn a_session_is_served_by_its_node_wherever_its_requests_land() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3, &tokens(), "").await?;
    let client = reqwest::Client::new();
    let post = reqwest::Method::POST;
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let answer = send(
        &client,
        post.clone(),
        &cluster.url(1),
        ALICE,
        Some(&session),
        Some(initialized),
    )
    .await?;
    ensure!(
        answer.status == 202,
        "initialized via n2: {} {}",
        answer.status,
        answer.body
    );
    ensure!(
        answer.served_by.as_deref() == Some("n1"),
        "{:?}",
        answer.served_by
    );
    for (id, node) in [(1, 1), (2, 2), (3, 0)] {
        let answer = add_via(&client, &cluster.url(node), &session, (id, id as i64, 40)).await?;
        // Only a peer's answer names who served it: the owner's own does not.
        let expected = (node != 0).then(|| "n1".to_string());
        ensure!(
            answer.served_by == expected,
            "via {node}: {:?}",
            answer.served_by
        );
    }
    // The event stream, from another node: the owner's, relayed as it streams.
    let stream = client
        .get(cluster.url(2))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await?;
    ensure!(stream.status() == 200, "GET via n3: {}", stream.status());
    ensure!(
        stream.headers()["content-type"]
            .to_str()?
            .starts_with("text/event-stream"),
        "{:?}",
        stream.headers()
    );
    ensure!(stream
        .headers()
        .get("plexus-served-by")
        .is_some_and(|v| v == "n1"));
    // The owner holds the stream: a second one is refused there, whichever node asks.
    let second = send(
        &client,
        reqwest::Method::GET,
        &cluster.url(1),
        ALICE,
        Some(&session),
        None,
    )
    .await?;
    ensure!(second.status == 409, "a second stream: {}", second.status);
    drop(stream);
    // DELETE from another node ends it on the owner.
    let deleted = send(
        &client,
        reqwest::Method::DELETE,
        &cluster.url(1),
        ALICE,
        Some(&session),
        None,
    )
    .await?;
    ensure!(deleted.status == 204, "DELETE via n2: {}", deleted.status);
    for node in 0..3 {
        let after = send(
            &client,
            post.clone(),
            &cluster.url(node),
            ALICE,
            Some(&session),
            Some(call_add(9, 1, 1)),
        )
        .await?;
        ensure!(
            after.status == 404,
            "after DELETE via {node}: {} {}",
            after.status,
            after.body
        );
    }
    Ok(())
}

#[tokio::test]
async fn foreign_forged_and_retired_session_ids_are_unknown_sessions() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(2, &tokens(), "").await?;
    let client = reqwest::Client::new();
    let post = reqwest::Method::POST;
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    let truncated = &session[..session.len() - 3];
    let mut flipped = session.clone().into_bytes();
    let middle = flipped.len() / 2;
    flipped[middle] = if flipped[middle] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped)?;
    let cases = [
        ("garbage", "nonsense", ALICE),
        ("truncated", truncated, ALICE),
        ("one character changed", flipped.as_str(), ALICE),
        ("another principal's", session.as_str(), BOB),
    ];
    for node in 0..2 {
        for (what, id, token) in cases {
            let answer = send(
                &client,
                post.clone(),
                &cluster.url(node),
                token,
                Some(id),
                Some(call_add(1, 1, 1)),
            )
            .await?;
            ensure!(
                answer.status == 404,
                "{what} via {node}: {} {}",
                answer.status,
                answer.body
            );
            ensure!(
                answer.body["error"]["code"] == -32600,
                "{what}: {}",
                answer.body
            );
            ensure!(answer.served_by.is_none(), "{what} was forwarded");
        }
    }
    // The owner still serves its principal.
    add_via(&client, &cluster.url(1), &session, (2, 2, 2)).await?;

    // A request claiming to come from a peer without the cluster's signature.
    let forged = client
        .post(cluster.url(0))
        .bearer_auth(ALICE)
        .header("content-type", "application/json")
        .header("mcp-session-id", &session)
        .header("plexus-forwarded-by", "n2")
        .header("plexus-cluster-auth", "1.AAAA")
        .body(serde_json::to_vec(&call_add(3, 1, 1))?)
        .send()
        .await?;
    ensure!(forged.status() == 403, "a forged peer: {}", forged.status());

    // A node whose ring no longer holds the key the id was sealed with.
    cluster.stop(1).await?;
    let retired = "another cluster secret, 32 characters or more";
    cluster
        .boot(1, &[("PLEXUS_CLUSTER_SECRET", retired)])
        .await?;
    cluster.nodes[1]
        .daemon()?
        .wait_ready(Duration::from_secs(30))
        .await?;
    let answer = send(
        &client,
        post,
        &cluster.url(1),
        ALICE,
        Some(&session),
        Some(call_add(4, 1, 1)),
    )
    .await?;
    ensure!(
        answer.status == 404 && answer.served_by.is_none(),
        "retired key: {} {}",
        answer.status,
        answer.body
    );
    Ok(())
}

/// A 2026-07-28 call asking for sampling, made on n1 and paused there: its
/// `requestState`, and its retry answering the input request with `text`.
async fn paused_on_n1(
    client: &reqwest::Client,
    cluster: &TestCluster,
    text: &str,
) -> anyhow::Result<(String, Value)> {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let call = json!({"name": "fx__ask", "arguments": {"kind": "sampling"}, "_meta": meta});
    let first = modern_call(client, &cluster.url(0), 1, call.clone()).await?;
    let result = &first.body["result"];
    ensure!(
        result["resultType"] == "input_required",
        "{}\n{}",
        first.body,
        cluster.logs()
    );
    let state = result["requestState"]
        .as_str()
        .context("requestState")?
        .to_string();
    let key = result["inputRequests"]
        .as_object()
        .and_then(|requests| requests.keys().next())
        .context("an input request")?
        .clone();
    let mut retry = call;
    retry["requestState"] = json!(state);
    retry["inputResponses"] = json!({ key: {"role": "assistant", "model": "m",
        "content": {"type": "text", "text": text}} });
    Ok((state, retry))
}

/// A paused round's retry sent to n2: served by n1, the round's own node, and
/// complete, with `expected` in its result.
async fn retry_completes_on_n1(
    client: &reqwest::Client,
    cluster: &TestCluster,
    retry: Value,
    expected: &str,
) -> anyhow::Result<()> {
    let done = modern_call(client, &cluster.url(1), 3, retry).await?;
    ensure!(
        done.served_by.as_deref() == Some("n1"),
        "{:?}: {}",
        done.served_by,
        done.body
    );
    ensure!(
        done.body["result"]["resultType"] == "complete" && done.body.to_string().contains(expected),
        "{}\n{}",
        done.body,
        cluster.logs()
    );
    Ok(())
}

/// A 2026-07-28 `tools/call` as alice: no session, its version and capabilities in `_meta`.
async fn modern_call(
    client: &reqwest::Client,
    url: &str,
    id: u64,
    params: Value,
) -> anyhow::Result<Answer> {
    modern_call_as(client, url, id, params, ALICE).await
}

/// [`modern_call`] with `token`'s principal.
async fn modern_call_as(
    client: &reqwest::Client,
    url: &str,
    id: u64,
    params: Value,
    token: &str,
) -> anyhow::Result<Answer> {
    modern_request_as(client, url, id, "tools/call", params, token).await
}

/// A 2026-07-28 request of `method` with `token`'s principal, its name (a tool's,
/// a task's) mirrored into `Mcp-Name`.
async fn modern_request_as(
    client: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    params: Value,
    token: &str,
) -> anyhow::Result<Answer> {
    let name = ["name", "taskId", "uri"]
        .iter()
        .find_map(|key| params[key].as_str())
        .map(str::to_string);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut request = client
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let response = request.body(serde_json::to_vec(&body)?).send().await?;
    let status = response.status().as_u16();
    let served_by = response
        .headers()
        .get("plexus-served-by")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = response.text().await?;
    let json = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .next_back()
        .unwrap_or(&text);
    Ok(Answer {
        status,
        served_by,
        session: None,
        body: serde_json::from_str(json).unwrap_or(Value::String(text.clone())),
    })
}

#[tokio::test]
async fn a_paused_rounds_retry_finds_its_node_and_an_edited_state_is_refused() -> anyhow::Result<()>
{
    let cluster = TestCluster::start(2, &tokens(), "").await?;
    let client = reqwest::Client::new();
    let (state, retry) = paused_on_n1(&client, &cluster, "sampled on n1").await?;
    ensure!(state.starts_with("plexus.") && state.len() > 40, "{state}");

    // Edited by the client: refused (400) wherever it lands, and never forwarded.
    let mut edited = retry.clone();
    let mut bytes = state.clone().into_bytes();
    let last = bytes.len() - 2;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    edited["requestState"] = json!(String::from_utf8(bytes)?);
    for node in 0..2 {
        let answer = modern_call(&client, &cluster.url(node), 2, edited.clone()).await?;
        ensure!(
            answer.status == 400,
            "edited via {node}: {} {}",
            answer.status,
            answer.body
        );
        ensure!(answer.served_by.is_none(), "an edited state was forwarded");
    }

    // Another principal holding the state is told it is unknown, on either node,
    // and the round waits on for its own client.
    for node in 0..2 {
        let stolen = modern_call_as(&client, &cluster.url(node), 4, retry.clone(), BOB).await?;
        let message = stolen.body["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("unknown or has expired"),
            "bob's retry via {node}: {} {}",
            stolen.status,
            stolen.body
        );
    }

    // The retry lands on the other node, which sends it to the round's own.
    retry_completes_on_n1(&client, &cluster, retry, "sampled on n1").await
}

#[tokio::test]
async fn a_draining_node_turns_unready_first_refuses_new_sessions_and_serves_its_own(
) -> anyhow::Result<()> {
    let mut cluster =
        TestCluster::start(2, &format!("{}\ndrain_timeout = \"20s\"", tokens()), "").await?;
    let client = reqwest::Client::new();
    let post = reqwest::Method::POST;
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    let signalled = std::time::Instant::now();
    cluster.signal_stop(0)?;
    let readyz = format!("http://127.0.0.1:{}/readyz", cluster.nodes[0].admin_port);
    plexus_tests::eventually(Duration::from_secs(5), async || {
        let status = client.get(&readyz).send().await?.status();
        ensure!(status == 503, "/readyz still {status}");
        Ok(())
    })
    .await?;
    println!("/readyz 503 {:?} after SIGTERM", signalled.elapsed());
    // No new session here: 503, answered before anything ran.
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let refused = send(
        &client,
        post.clone(),
        &cluster.url(0),
        ALICE,
        None,
        Some(hello),
    )
    .await?;
    ensure!(
        refused.status == 503,
        "a new session on a draining node: {} {}",
        refused.status,
        refused.body
    );
    // Its own session is served, directly and through the other node.
    for (id, node) in [(1, 0), (2, 1), (3, 0)] {
        add_via(&client, &cluster.url(node), &session, (id, 1, 1)).await?;
    }
    // Its last session ended, it stops without waiting out drain_timeout.
    let deleted = send(
        &client,
        reqwest::Method::DELETE,
        &cluster.url(1),
        ALICE,
        Some(&session),
        None,
    )
    .await?;
    ensure!(deleted.status == 204, "{}", deleted.status);
    let status = cluster.stop(0).await?;
    let drained = signalled.elapsed();
    ensure!(status.success(), "exit {status}");
    ensure!(
        drained < Duration::from_secs(15),
        "took {drained:?}: waited out drain_timeout"
    );
    println!("SIGTERM to exit with its last session deleted: {drained:?}");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_owner_is_a_bounded_clear_404() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(2, &tokens(), "").await?;
    let client = reqwest::Client::new();
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    // n2 knows n1 by an address where nothing answers (TEST-NET-1: packets go nowhere).
    cluster.stop(1).await?;
    cluster
        .boot(1, &[("PLEXUS_PEER_N1", "http://192.0.2.1:7464")])
        .await?;
    cluster.nodes[1]
        .daemon()?
        .wait_ready(Duration::from_secs(30))
        .await?;
    let started = std::time::Instant::now();
    let answer = send(
        &client,
        reqwest::Method::POST,
        &cluster.url(1),
        ALICE,
        Some(&session),
        Some(call_add(1, 1, 1)),
    )
    .await?;
    let took = started.elapsed();
    println!(
        "an unreachable owner answered in {took:?}: {}",
        answer.body["error"]["message"]
    );
    ensure!(answer.status == 404, "{} {}", answer.status, answer.body);
    ensure!(
        answer.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`n1` cannot be reached")),
        "{}",
        answer.body
    );
    ensure!(took < Duration::from_secs(5), "took {took:?}");
    Ok(())
}

#[tokio::test]
async fn peers_found_through_dns_are_named_by_their_addresses_and_only_those_are_reached(
) -> anyhow::Result<()> {
    use plexus_tests::cluster::{fresh_port, CLUSTER_SECRET};
    use plexus_tests::{fixture_upstream, Daemon};
    // `localhost` stands for a headless Service: its A record (127.0.0.1) is the
    // one peer it lists. A second node on [::1] is not among its records.
    let mut taken = Vec::new();
    let port = fresh_port(&mut taken)?;
    let other = fresh_port(&mut taken)?;
    let start = |node: &'static str, listen: String| {
        Daemon::builder()
            .daemon(tokens())
            .upstreams(format!(
                "{}\n[cluster]\nnode = \"{node}\"\nsecret = \"${{SECRET}}\"\ndns = \"localhost:{port}\"\n",
                fixture_upstream("fx", "", &[])
            ))
            .listen(listen)
            .env(&[("SECRET", CLUSTER_SECRET)])
            .start()
    };
    let listed = start("127.0.0.1", format!("127.0.0.1:{port}")).await?;
    let unlisted = start("::1", format!("[::1]:{other}")).await?;
    for daemon in [&listed, &unlisted] {
        daemon.wait_ready(Duration::from_secs(30)).await?;
    }
    let client = reqwest::Client::new();
    let post = reqwest::Method::POST;
    let session = initialize(&client, &listed.url, ALICE).await?;
    let answer = send(
        &client,
        post.clone(),
        &unlisted.url,
        ALICE,
        Some(&session),
        Some(call_add(1, 2, 3)),
    )
    .await?;
    ensure!(
        answer.served_by.as_deref() == Some("127.0.0.1"),
        "{:?} {}\n{}",
        answer.served_by,
        answer.body,
        unlisted.log()
    );
    ensure!(
        answer.body["result"]["structuredContent"]["sum"] == 5,
        "{}",
        answer.body
    );
    // A node the name does not list is not reached, whatever its (genuine) id says.
    let session = initialize(&client, &unlisted.url, ALICE).await?;
    let answer = send(
        &client,
        post,
        &listed.url,
        ALICE,
        Some(&session),
        Some(call_add(2, 2, 3)),
    )
    .await?;
    ensure!(
        answer.status == 404 && answer.served_by.is_none(),
        "{} {}",
        answer.status,
        answer.body
    );
    ensure!(
        answer.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not a peer")),
        "{}",
        answer.body
    );
    Ok(())
}

#[tokio::test]
async fn audit_lines_name_the_node_that_served_the_call() -> anyhow::Result<()> {
    let daemon_lines = format!("{}\naudit_log = \"audit.jsonl\"", tokens());
    let cluster = TestCluster::start(2, &daemon_lines, "").await?;
    let client = reqwest::Client::new();
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    // Through n2: the call runs on n1, whose trail says so.
    add_via(&client, &cluster.url(1), &session, (1, 20, 22)).await?;
    let trail = cluster.nodes[0].daemon()?.dir.path().join("audit.jsonl");
    let line = plexus_tests::eventually(Duration::from_secs(5), async || {
        let text = std::fs::read_to_string(&trail).unwrap_or_default();
        let line = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["method"] == "tools/call")
            .with_context(|| format!("no tools/call line in {text}"))?;
        Ok(line)
    })
    .await?;
    ensure!(line["node"] == "n1", "{line}");
    Ok(())
}

async fn tool_listed(client: &reqwest::Client, url: &str, tool: &str) -> anyhow::Result<bool> {
    let session = initialize(client, url, ALICE).await?;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let answer = send(
        client,
        reqwest::Method::POST,
        url,
        ALICE,
        Some(&session),
        Some(list),
    )
    .await?;
    let tools = answer.body["result"]["tools"].as_array().context("tools")?;
    Ok(tools.iter().any(|t| t["name"] == tool))
}

#[tokio::test]
async fn an_approval_holds_on_every_node_sharing_the_pin_file() -> anyhow::Result<()> {
    let shared = tempfile::tempdir()?;
    let lock = shared.path().join("plexus.lock");
    let daemon_lines = format!("{}\npins = {:?}", tokens(), lock.display().to_string());
    let cluster = TestCluster::start(2, &daemon_lines, "pin = \"strict\"").await?;
    let client = reqwest::Client::new();
    for node in 0..2 {
        ensure!(
            !tool_listed(&client, &cluster.url(node), "fx__add").await?,
            "n{} shows an unapproved tool",
            node + 1
        );
    }
    // Each node has written what it saw (pending approval) by now; the file's
    // writes settle (250 ms coalescing) before the approval, whose write is then
    // the last: nodes sharing a writable file each write it whole.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Approved on n1, which writes the shared file.
    let approved = client
        .post(format!("{}/pins/approve", cluster.nodes[0].daemon()?.admin))
        .header("content-type", "application/json")
        .body(json!({"upstream": "fx"}).to_string())
        .send()
        .await?;
    ensure!(
        approved.status() == 200,
        "approve: {} {}",
        approved.status(),
        approved.text().await?
    );
    ensure!(
        tool_listed(&client, &cluster.url(0), "fx__add").await?,
        "not on n1 after its approval"
    );
    // n2 reads it at its next reload (at once when the file sits beside its
    // config, as a ConfigMap's does: its watcher sees the change).
    let n2 = cluster.nodes[1].daemon()?;
    n2.reload().await?;
    plexus_tests::eventually(Duration::from_secs(5), async || {
        ensure!(
            tool_listed(&client, &cluster.url(1), "fx__add").await?,
            "not on n2\n{}\n{}",
            n2.log(),
            std::fs::read_to_string(&lock)
                .unwrap_or_default()
                .chars()
                .take(600)
                .collect::<String>()
        );
        Ok(())
    })
    .await?;
    ensure!(
        n2.log().contains("the pin file changed on disk"),
        "{}",
        n2.log()
    );
    Ok(())
}

#[tokio::test]
async fn a_committed_approval_reaches_a_node_through_its_watcher() -> anyhow::Result<()> {
    // Each node's pin file beside its config, as a ConfigMap mounts both.
    let daemon_lines = format!("{}\npins = \"plexus.lock\"", tokens());
    let cluster = TestCluster::start(2, &daemon_lines, "pin = \"strict\"").await?;
    let client = reqwest::Client::new();
    let n1 = cluster.nodes[0].daemon()?;
    let n2 = cluster.nodes[1].daemon()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let approved = client
        .post(format!("{}/pins/approve", n1.admin))
        .header("content-type", "application/json")
        .body(json!({"upstream": "fx"}).to_string())
        .send()
        .await?;
    ensure!(approved.status() == 200, "approve: {}", approved.status());
    ensure!(
        !tool_listed(&client, &cluster.url(1), "fx__add").await?,
        "n2 shows an unapproved tool"
    );
    // The approved file, committed and delivered to n2 (replaced whole, as a
    // ConfigMap update does); its config is unchanged, and nothing asks it to reload.
    let approved_file = plexus_tests::eventually(Duration::from_secs(5), async || {
        let text = std::fs::read_to_string(n1.dir.path().join("plexus.lock"))?;
        ensure!(text.contains("\"pinned\""), "not written yet");
        Ok(text)
    })
    .await?;
    let staged = n2.dir.path().join(".plexus.lock.new");
    std::fs::write(&staged, approved_file)?;
    std::fs::rename(&staged, n2.dir.path().join("plexus.lock"))?;
    plexus_tests::eventually(Duration::from_secs(5), async || {
        ensure!(
            tool_listed(&client, &cluster.url(1), "fx__add").await?,
            "not on n2\n{}",
            n2.log()
        );
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_owner_that_stops_answering_ends_the_wait_with_a_clear_error() -> anyhow::Result<()> {
    let cluster = TestCluster::start(2, &tokens(), "").await?;
    let client = reqwest::Client::new();
    let session = initialize(&client, &cluster.url(0), ALICE).await?;
    // n1 frozen: its socket still takes connections, nothing answers them.
    let pid = nix::unistd::Pid::from_raw(cluster.nodes[0].daemon()?.pid().context("pid")? as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
    let started = std::time::Instant::now();
    let answer = send(
        &client,
        reqwest::Method::POST,
        &cluster.url(1),
        ALICE,
        Some(&session),
        Some(call_add(1, 1, 1)),
    )
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)?;
    let answer = answer?;
    let took = started.elapsed();
    println!(
        "a frozen owner: {} in {took:?}: {}",
        answer.status, answer.body["error"]["message"]
    );
    ensure!(answer.status == 504, "{} {}", answer.status, answer.body);
    ensure!(
        answer.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("stopped answering")),
        "{}",
        answer.body
    );
    // Probed every 5 s, given 5 s to answer: within 10 s, with headroom.
    ensure!(took < Duration::from_secs(20), "took {took:?}");
    // Thawed, it serves its session again.
    add_via(&client, &cluster.url(1), &session, (2, 2, 2)).await?;
    Ok(())
}

#[tokio::test]
async fn an_upstreams_own_paused_round_names_its_node_and_its_retry_goes_there(
) -> anyhow::Result<()> {
    // A 2026-07-28 upstream: its input-required results carry its own requestState.
    let cluster = TestCluster::start_with(2, &tokens(), &["--modern"], "").await?;
    let client = reqwest::Client::new();
    let (state, retry) = paused_on_n1(&client, &cluster, "sampled for n1's upstream").await?;
    // Sealed to name n1, the upstream's own state carried inside.
    ensure!(
        state.starts_with("plexus.") && state.matches('.').count() == 2,
        "{state}"
    );
    // The carried state edited: refused.
    let mut edited = retry.clone();
    let (head, _) = state.rsplit_once('.').context("carried")?;
    edited["requestState"] = json!(format!("{head}.{}", "YXNrOnNhbXBsaW5nOjI"));
    let answer = modern_call(&client, &cluster.url(1), 2, edited).await?;
    ensure!(
        answer.status == 400 && answer.served_by.is_none(),
        "{} {}",
        answer.status,
        answer.body
    );
    // Another principal holding it: refused (400) on the owning node and on the
    // other, never forwarded, and the round waits on for alice.
    for node in 0..2 {
        let stolen = modern_call_as(&client, &cluster.url(node), 4, retry.clone(), BOB).await?;
        ensure!(
            stolen.status == 400 && stolen.served_by.is_none(),
            "bob's retry via {node}: {} {:?} {}",
            stolen.status,
            stolen.served_by,
            stolen.body
        );
    }
    // The retry lands on n2 and is served by n1, whose upstream gets its state back.
    retry_completes_on_n1(&client, &cluster, retry, "sampled for n1's upstream").await
}

#[tokio::test]
async fn an_upstreams_task_id_is_its_principals_alone_on_every_node() -> anyhow::Result<()> {
    // A 2026-07-28 upstream running a call as a task: its id names n1 and alice.
    let cluster = TestCluster::start_with(2, &tokens(), &["--conformance", "--modern"], "").await?;
    let client = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let call = json!({"name": "fx__slow_compute", "arguments": {"seconds": 0.2}, "_meta": meta});
    let created = modern_call(&client, &cluster.url(0), 1, call).await?;
    let task = created.body["result"]["taskId"]
        .as_str()
        .with_context(|| format!("no task: {}\n{}", created.body, cluster.logs()))?
        .to_string();
    ensure!(task.starts_with("plexus."), "{task}");
    let get = json!({"taskId": task, "_meta": meta});
    // Bob holding alice's task id: an unknown task on either node, never forwarded.
    for node in 0..2 {
        let stolen = modern_request_as(
            &client,
            &cluster.url(node),
            2,
            "tasks/get",
            get.clone(),
            BOB,
        )
        .await?;
        let error = &stolen.body["error"];
        ensure!(
            error["code"] == -32602
                && error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("unknown task"))
                && stolen.served_by.is_none(),
            "bob's tasks/get via {node}: {} {:?} {}",
            stolen.status,
            stolen.served_by,
            stolen.body
        );
        let cancel = modern_request_as(
            &client,
            &cluster.url(node),
            3,
            "tasks/cancel",
            get.clone(),
            BOB,
        )
        .await?;
        ensure!(
            cancel.body["error"]["code"] == -32602,
            "bob's tasks/cancel via {node}: {}",
            cancel.body
        );
    }
    // Alice's, landing on n2, is served by n1, and the task ran to its end.
    let mut got = Value::Null;
    for _ in 0..100 {
        let answer =
            modern_request_as(&client, &cluster.url(1), 4, "tasks/get", get.clone(), ALICE).await?;
        ensure!(
            answer.served_by.as_deref() == Some("n1"),
            "{:?}: {}",
            answer.served_by,
            answer.body
        );
        got = answer.body;
        if got["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        got["result"]["status"] == "completed" && got["result"]["taskId"] == task.as_str(),
        "{got}\n{}",
        cluster.logs()
    );
    Ok(())
}

/// A 2026-07-28 `subscriptions/listen` stream, read event by event.
struct ListenStream {
    response: reqwest::Response,
    buffer: String,
}

impl ListenStream {
    async fn open(client: &reqwest::Client, url: &str, uri: &str) -> anyhow::Result<ListenStream> {
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        });
        let body = json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
            "params": {"notifications": {"resourceSubscriptions": [uri]}, "_meta": meta}});
        let response = client
            .post(url)
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        ensure!(response.status() == 200, "listen: {}", response.status());
        Ok(ListenStream {
            response,
            buffer: String::new(),
        })
    }

    /// The next message with `method`, within `within`.
    async fn next(&mut self, method: &str, within: Duration) -> anyhow::Result<Value> {
        tokio::time::timeout(within, async {
            loop {
                while let Some(end) = self.buffer.find("\n\n") {
                    let event: String = self.buffer.drain(..end + 2).collect();
                    let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: "))
                    else {
                        continue;
                    };
                    let message: Value = serde_json::from_str(data)?;
                    if message["method"] == method {
                        return Ok(message);
                    }
                }
                let chunk = self.response.chunk().await?.context("the stream ended")?;
                self.buffer.push_str(std::str::from_utf8(&chunk)?);
            }
        })
        .await
        .with_context(|| format!("no {method} within {within:?}"))?
    }
}

/// `fx__echo`, whose upstream first says `test://watched-resource` changed.
async fn change_the_resource(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let call = json!({"name": "fx__echo", "arguments":
        {"text": "x", "updated": "test://watched-resource"}, "_meta": meta});
    let answer = modern_call(client, url, 9, call).await?;
    ensure!(answer.body["result"].is_object(), "echo: {}", answer.body);
    Ok(())
}

#[tokio::test]
async fn a_listen_stream_hears_changes_made_through_any_node() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start_with(2, &tokens(), &["--conformance"], "").await?;
    let client = reqwest::Client::new();
    let uri = "fx+test://watched-resource";
    // Listening on n1; the acknowledgement comes once n2 listens too.
    let mut stream = ListenStream::open(&client, &cluster.url(0), uri).await?;
    let ack = stream
        .next(
            "notifications/subscriptions/acknowledged",
            Duration::from_secs(10),
        )
        .await?;
    ensure!(
        ack["params"]["notifications"]["resourceSubscriptions"] == json!([uri]),
        "{ack}"
    );
    // Changed through n2, whose own upstream process announces it.
    let started = std::time::Instant::now();
    change_the_resource(&client, &cluster.url(1)).await?;
    let updated = stream
        .next("notifications/resources/updated", Duration::from_secs(5))
        .await
        .with_context(|| cluster.logs())?;
    ensure!(updated["params"]["uri"] == uri, "{updated}");
    println!(
        "figure: a change through n2 heard on n1's listen stream after {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );

    // n2 gone: the stream goes on with n1's own changes...
    cluster.kill(1).await?;
    change_the_resource(&client, &cluster.url(0)).await?;
    let own = stream
        .next("notifications/resources/updated", Duration::from_secs(5))
        .await?;
    ensure!(own["params"]["uri"] == uri, "{own}");
    // ...and hears n2 again once it is back (tried again with a backoff).
    cluster.boot(1, &[]).await?;
    cluster.nodes[1]
        .daemon()?
        .wait_ready(Duration::from_secs(30))
        .await?;
    let back = std::time::Instant::now();
    let heard = loop {
        change_the_resource(&client, &cluster.url(1)).await?;
        if let Ok(heard) = stream
            .next(
                "notifications/resources/updated",
                Duration::from_millis(500),
            )
            .await
        {
            break heard;
        }
        ensure!(
            back.elapsed() < Duration::from_secs(20),
            "n2's changes unheard 20 s after it came back\n{}",
            cluster.logs()
        );
    };
    ensure!(heard["params"]["uri"] == uri, "{heard}");
    println!(
        "figure: n2 heard again {:.1} s after it was ready",
        back.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::test]
async fn a_reload_changes_the_peers_at_once_and_the_nodes_name_at_a_restart() -> anyhow::Result<()>
{
    let cluster = TestCluster::start_with(2, &tokens(), &["--conformance"], "").await?;
    let client = reqwest::Client::new();
    let n1 = cluster.nodes[0].daemon()?;
    let path = n1.dir.path().join("config.toml");
    let listed = std::fs::read_to_string(&path)?;
    let unlisted = listed.replace(", n2 = \"${PLEXUS_PEER_N2}\"", "");
    ensure!(unlisted != listed, "{listed}");
    let session = initialize(&client, &cluster.url(1), ALICE).await?;

    // n1 forgets n2: n2's session is unknown through n1, and a listen on n1 hears n1 alone.
    std::fs::write(&path, &unlisted)?;
    let report = n1.reload().await?;
    ensure!(
        report["cluster"] == json!(["cluster.peers"]) && report["needs_restart"] == json!([]),
        "{report}"
    );
    let call = Some(call_add(1, 1, 1));
    let answer = send(
        &client,
        reqwest::Method::POST,
        &cluster.url(0),
        ALICE,
        Some(&session),
        call,
    )
    .await?;
    ensure!(answer.status == 404, "{} {}", answer.status, answer.body);
    let uri = "fx+test://watched-resource";
    let mut stream = ListenStream::open(&client, &cluster.url(0), uri).await?;
    let acknowledged = "notifications/subscriptions/acknowledged";
    stream.next(acknowledged, Duration::from_secs(10)).await?;
    change_the_resource(&client, &cluster.url(1)).await?;
    let updated = "notifications/resources/updated";
    let unheard = stream.next(updated, Duration::from_millis(1500)).await;
    ensure!(
        unheard.is_err(),
        "heard a peer n1 does not list: {unheard:?}"
    );

    // Listed again: its session is forwarded to it, and the open listen hears it.
    std::fs::write(&path, &listed)?;
    let report = n1.reload().await?;
    ensure!(report["cluster"] == json!(["cluster.peers"]), "{report}");
    let answer = add_via(&client, &cluster.url(0), &session, (2, 2, 2)).await?;
    ensure!(
        answer.served_by.as_deref() == Some("n2"),
        "{:?}",
        answer.served_by
    );
    let reloaded = std::time::Instant::now();
    loop {
        change_the_resource(&client, &cluster.url(1)).await?;
        if let Ok(heard) = stream.next(updated, Duration::from_millis(500)).await {
            ensure!(heard["params"]["uri"] == uri, "{heard}");
            break;
        }
        ensure!(
            reloaded.elapsed() < Duration::from_secs(10),
            "n2 unheard 10 s after the reload listed it\n{}",
            cluster.logs()
        );
    }
    println!(
        "figure: a listen heard a peer the reload listed after {:.2} s",
        reloaded.elapsed().as_secs_f64()
    );

    // A new name waits for a restart: said so, and n1 goes on under its own.
    std::fs::write(&path, listed.replace("\"${PLEXUS_NODE}\"", "\"n9\""))?;
    let report = n1.reload().await?;
    ensure!(
        report["needs_restart"] == json!(["cluster.node"]) && report["cluster"] == json!([]),
        "{report}"
    );
    let own = initialize(&client, &cluster.url(0), ALICE).await?;
    let answer = add_via(&client, &cluster.url(1), &own, (3, 1, 2)).await?;
    ensure!(
        answer.served_by.as_deref() == Some("n1"),
        "{:?}",
        answer.served_by
    );
    Ok(())
}
