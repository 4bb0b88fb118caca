//! Nodes of one `[cluster]` on loopback, each with its own fixture upstream: a
//! handshake-era session is served by the node that opened it wherever its
//! requests land (forwarded once, over HTTP); ids that are garbage, truncated,
//! another principal's or sealed under a retired key are unknown sessions (404).

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
        let answer = send(
            &client,
            post.clone(),
            &cluster.url(node),
            ALICE,
            Some(&session),
            Some(call_add(id, id as i64, 40)),
        )
        .await?;
        ensure!(
            answer.body["result"]["structuredContent"]["sum"] == 40 + id as i64,
            "call {id} via node {node}: {}\n{}",
            answer.body,
            cluster.logs()
        );
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
    let answer = send(
        &client,
        post.clone(),
        &cluster.url(1),
        ALICE,
        Some(&session),
        Some(call_add(2, 2, 2)),
    )
    .await?;
    ensure!(
        answer.body["result"]["structuredContent"]["sum"] == 4,
        "{}",
        answer.body
    );

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
