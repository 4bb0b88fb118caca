//! Session dispatch, driven through the stdio front by an in-memory client against
//! fake upstreams: each method family routed to its upstream under the upstream's
//! own name, the precise refusals, and notifications left unanswered.

#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::{json, Value};

use crate::hub::Hub;
use crate::testing::{self, Client, FakeUpstream};

/// Two fakes, `alpha` and `beta` (prefixed by their names), and a client.
async fn two_upstreams(dir: &std::path::Path) -> (FakeUpstream, FakeUpstream, Arc<Hub>, Client) {
    let alpha = FakeUpstream::new();
    let beta = FakeUpstream::new();
    let upstreams = testing::upstream("alpha", &alpha, "") + &testing::upstream("beta", &beta, "");
    let hub = testing::hub(dir, &upstreams).await;
    let client = Client::connect(&hub).await;
    (alpha, beta, hub, client)
}

/// The client leaves (its session ends), then the hub stops.
async fn close(client: Client, hub: Arc<Hub>) {
    drop(client);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn each_method_family_reaches_its_upstream_under_the_upstreams_own_name() {
    let dir = tempfile::tempdir().unwrap();
    let (alpha, beta, hub, mut client) = two_upstreams(dir.path()).await;

    let listed = client.request("tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"alpha__echo") && names.contains(&"beta__echo"),
        "{names:?}"
    );

    let called = client
        .request(
            "tools/call",
            json!({"name": "beta__echo", "arguments": {"x": 1}}),
        )
        .await;
    assert_eq!(
        called["result"]["content"][0]["text"], r#"{"x":1}"#,
        "{called}"
    );
    let calls = beta.received_of("tools/call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["params"]["name"], "echo");
    assert_eq!(calls[0]["params"]["arguments"], json!({"x": 1}));

    let prompt = client
        .request("prompts/get", json!({"name": "alpha__greet"}))
        .await;
    assert!(prompt.get("result").is_some(), "{prompt}");
    let gets = alpha.received_of("prompts/get");
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0]["params"]["name"], "greet");

    let read = client
        .request("resources/read", json!({"uri": "beta+fixture://items/1"}))
        .await;
    // The upstream reads its own URI; the client gets the one it asked for back.
    let reads = beta.received_of("resources/read");
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0]["params"]["uri"], "fixture://items/1");
    assert_eq!(
        read["result"]["contents"][0]["uri"], "beta+fixture://items/1",
        "{read}"
    );

    let completed = client
        .request(
            "completion/complete",
            json!({
                "ref": {"type": "ref/prompt", "name": "alpha__greet"},
                "argument": {"name": "who", "value": "w"},
            }),
        )
        .await;
    assert_eq!(
        completed["result"]["completion"]["values"],
        json!(["one"]),
        "{completed}"
    );
    let completions = alpha.received_of("completion/complete");
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0]["params"]["ref"]["name"], "greet");

    // Nothing went to the other upstream.
    assert!(beta.received_of("completion/complete").is_empty());
    assert!(alpha.received_of("tools/call").is_empty());
    assert!(alpha.received_of("resources/read").is_empty());
    assert!(beta.received_of("prompts/get").is_empty());
    close(client, hub).await;
}

#[tokio::test(start_paused = true)]
async fn an_unknown_name_is_refused_precisely_and_reaches_no_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let (alpha, beta, hub, mut client) = two_upstreams(dir.path()).await;

    let tool = client
        .request(
            "tools/call",
            json!({"name": "gamma__echo", "arguments": {}}),
        )
        .await;
    assert_eq!(
        tool["error"],
        json!({"code": -32602, "message": "unknown tool: gamma__echo"})
    );
    // A name without its prefix is not a name plexus exposes.
    let bare = client
        .request("tools/call", json!({"name": "echo", "arguments": {}}))
        .await;
    assert_eq!(
        bare["error"],
        json!({"code": -32602, "message": "unknown tool: echo"})
    );
    let prompt = client
        .request("prompts/get", json!({"name": "alpha__nope"}))
        .await;
    assert_eq!(
        prompt["error"],
        json!({"code": -32602, "message": "unknown prompt: alpha__nope"})
    );
    let resource = client
        .request("resources/read", json!({"uri": "gamma+x://y"}))
        .await;
    assert_eq!(
        resource["error"],
        json!({"code": -32002, "message": "resource not found: gamma+x://y", "data": {"uri": "gamma+x://y"}})
    );
    let method = client.request("made/up", json!({})).await;
    assert_eq!(
        method["error"],
        json!({"code": -32601, "message": "method not found: made/up"})
    );
    for fake in [&alpha, &beta] {
        for method in ["tools/call", "prompts/get", "resources/read", "made/up"] {
            assert!(fake.received_of(method).is_empty(), "{method} was relayed");
        }
    }
    close(client, hub).await;
}

#[tokio::test(start_paused = true)]
async fn a_notification_gets_no_reply() {
    let dir = tempfile::tempdir().unwrap();
    let (_alpha, _beta, hub, mut client) = two_upstreams(dir.path()).await;

    for notification in [
        json!({"jsonrpc": "2.0", "method": "notifications/made_up", "params": {}}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ] {
        client.send(&notification).await;
    }
    client
        .send(&json!({"jsonrpc": "2.0", "id": "after", "method": "ping"}))
        .await;
    // Notifications are handled in order before the request read after them: had
    // any been answered, its answer would come first.
    let next = client.next_message().await;
    assert_eq!(next, json!({"jsonrpc": "2.0", "id": "after", "result": {}}));
    close(client, hub).await;
}

#[tokio::test(start_paused = true)]
async fn malformed_requests_get_invalid_request_or_invalid_params_and_the_session_survives() {
    let dir = tempfile::tempdir().unwrap();
    let (alpha, _beta, hub, mut client) = two_upstreams(dir.path()).await;

    let cases: [(&str, Value); 6] = [
        (
            r#"{"jsonrpc":"2.0","id":7,"method":5}"#,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "invalid request: `method` must be a string"}}),
        ),
        (
            r#"{"jsonrpc":"1.0","id":8,"method":"ping"}"#,
            json!({"jsonrpc": "2.0", "id": 8, "error": {"code": -32600, "message": "invalid request: `jsonrpc` must be \"2.0\""}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "invalid request: a request id must be a string or an integer"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"arguments":{}}}"#,
            json!({"jsonrpc": "2.0", "id": 9, "error": {"code": -32602, "message": "invalid params: `name` must be a string"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":"x"}"#,
            json!({"jsonrpc": "2.0", "id": 10, "error": {"code": -32602, "message": "invalid params: params must be an object"}}),
        ),
        (
            "not json",
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error: expected ident at line 1 column 2"}}),
        ),
    ];
    for (line, expected) in cases {
        client.send_line(line).await;
        assert_eq!(client.next_message().await, expected, "for {line}");
    }
    assert!(alpha.received_of("tools/call").is_empty());
    // The session still serves.
    let called = client
        .request(
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {}}),
        )
        .await;
    assert_eq!(called["result"]["content"][0]["text"], "{}", "{called}");
    close(client, hub).await;
}

/// Hostile requests of every family (value and byte mutants of well-formed
/// ones) through the stdio front: each answer is a JSON-RPC response, and after
/// each the session still answers a ping; nothing panics the front or the hub.
#[tokio::test(start_paused = true)]
async fn hostile_requests_are_answered_and_the_session_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let alpha = FakeUpstream::new();
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &alpha, "")).await;
    let mut client = Client::connect(&hub).await;
    let seeds = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "alpha__echo", "arguments": {"x": [1, "y"]}, "_meta": {"progressToken": "p"}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "eA"}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": {"name": "alpha__greet", "arguments": {"who": "w"}}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": "alpha+fixture://items/1"}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "resources/subscribe", "params": {"uri": "alpha+fixture://items/1"}}),
        json!({"jsonrpc": "2.0", "id": 6, "method": "completion/complete",
            "params": {"ref": {"type": "ref/prompt", "name": "alpha__greet"}, "argument": {"name": "who", "value": "a"}}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "logging/setLevel", "params": {"level": "debug"}}),
        json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"taskId": "t"}}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "r"}}),
        json!({"jsonrpc": "2.0", "id": 9, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}),
    ];
    let mut cases = Vec::new();
    for (index, seed) in seeds.iter().enumerate() {
        cases.extend(mutations::value_mutants(seed, 90, index as u64));
        let text = seed.to_string();
        cases.extend(
            mutations::cases(&[text.as_bytes()], 20, index as u64)
                .into_iter()
                .skip(1),
        );
    }
    // Lines the front reads: none holds a newline of its own.
    cases.retain(|case| !case.contains(&b'\n'));
    let mut answered = 0;
    for (probe, case) in cases.iter().enumerate() {
        client.send_line(&String::from_utf8_lossy(case)).await;
        let id = json!(format!("probe-{probe}"));
        client
            .send(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"}))
            .await;
        let pong = client.response_to(&id).await;
        assert_eq!(
            pong["result"],
            json!({}),
            "after {}: {pong}",
            mutations::describe(case)
        );
        answered += 1;
    }
    // Whatever else was answered meanwhile is a response: an id, and a result or an error.
    while let Ok(message) =
        tokio::time::timeout(std::time::Duration::from_secs(120), client.next_message()).await
    {
        if message.get("method").is_some() {
            continue;
        }
        assert!(message.get("id").is_some(), "{message}");
        assert!(
            message.get("result").is_some() != message.get("error").is_some(),
            "{message}"
        );
    }
    println!("{answered} hostile requests, each followed by an answered ping");
    close(client, hub).await;
}

/// An upstream saying hostile things during a call (value mutants of progress,
/// logs, list changes, resource updates, stray replies and requests to the
/// client): the call is answered, the session serves on, nothing panics.
#[tokio::test(start_paused = true)]
async fn an_upstreams_hostile_messages_during_a_call_touch_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let alpha = FakeUpstream::new();
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &alpha, "")).await;
    let mut client = Client::connect(&hub).await;
    let seeds = [
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "$token", "progress": 1, "total": 2, "message": "m"}}),
        json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "error", "logger": "l", "data": {"a": [1]}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
        json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "fixture://items/1"}}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "id": 7, "result": {"content": []}}),
        json!({"jsonrpc": "2.0", "id": "s", "method": "sampling/createMessage",
            "params": {"messages": [], "maxTokens": 5}}),
        json!({"jsonrpc": "2.0", "id": 8, "method": "roots/list"}),
        json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
            "params": {"taskId": "t", "status": "working"}}),
    ];
    let mut said = Vec::new();
    for (index, seed) in seeds.iter().enumerate() {
        for mutant in mutations::value_mutants(seed, 150, 100 + index as u64) {
            if let Ok(message) = serde_json::from_slice::<Value>(&mutant) {
                said.push(message);
            }
        }
    }
    let calls = said.len().div_ceil(5);
    for (call, messages) in said.chunks(5).enumerate() {
        let answer = client
            .request(
                "tools/call",
                json!({"name": "alpha__echo", "arguments": {"say": messages, "n": call},
                    "_meta": {"progressToken": format!("p{call}")}}),
            )
            .await;
        assert!(
            answer["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|text| text.contains(&format!("\"n\":{call}"))),
            "{answer:.300}"
        );
        let pong = client.request("ping", json!({})).await;
        assert_eq!(pong["result"], json!({}), "{pong}");
    }
    println!(
        "{} hostile upstream messages over {calls} calls",
        said.len()
    );
    close(client, hub).await;
}
