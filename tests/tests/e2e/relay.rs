//! The relay path: what an upstream sends reaches the client field by field
//! (names aside), and plexus's own failures are precise JSON-RPC errors.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    arguments, fixture_binary, fixture_upstream, http_client, plexus_binary,
    progress_is_not_spoofed, Client, Daemon, HttpFixture, RawHttpSession, RawStdioSession,
    TestClient,
};
use rmcp::model::CallToolRequestParams;
use rmcp::ServiceError;
use serde_json::{json, Value};

/// The same requests sent to the fixture directly and through plexus.
fn round_trip_requests() -> Vec<(&'static str, Value)> {
    vec![
        ("tools/list", json!({})),
        (
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "faithful"}}),
        ),
        (
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        ),
        (
            "tools/call",
            json!({"name": "fail", "arguments": {"message": "expected failure"}}),
        ),
        // An upstream JSON-RPC error passes through unchanged.
        (
            "tools/call",
            json!({"name": "add", "arguments": {"a": "not a number"}}),
        ),
        ("resources/list", json!({})),
        ("resources/templates/list", json!({})),
        ("resources/read", json!({"uri": "fixture://text"})),
        ("resources/read", json!({"uri": "fixture://blob"})),
        ("resources/read", json!({"uri": "fixture://items/42"})),
        ("prompts/list", json!({})),
        (
            "prompts/get",
            json!({"name": "greet", "arguments": {"name": "Ada", "style": "casual"}}),
        ),
        // Every content type and the other result shapes (the `--conformance` surface).
        (
            "tools/call",
            json!({"name": "test_image_content", "arguments": {}}),
        ),
        (
            "tools/call",
            json!({"name": "test_audio_content", "arguments": {}}),
        ),
        (
            "tools/call",
            json!({"name": "test_embedded_resource", "arguments": {}}),
        ),
        (
            "tools/call",
            json!({"name": "test_multiple_content_types", "arguments": {}}),
        ),
        (
            "tools/call",
            json!({"name": "test_error_handling", "arguments": {}}),
        ),
        (
            "prompts/get",
            json!({"name": "test_prompt_with_image", "arguments": {}}),
        ),
        (
            "prompts/get",
            json!({"name": "test_prompt_with_embedded_resource", "arguments": {"resourceUri": "test://static-text"}}),
        ),
        ("resources/read", json!({"uri": "test://static-binary"})),
        (
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"}, "argument": {"name": "arg1", "value": "a"}}),
        ),
        ("logging/setLevel", json!({"level": "warning"})),
        (
            "resources/subscribe",
            json!({"uri": "test://watched-resource"}),
        ),
        (
            "resources/unsubscribe",
            json!({"uri": "test://watched-resource"}),
        ),
        ("ping", json!({})),
    ]
}

/// Undoes plexus's namespacing of one upstream, so a prefixed relay can be compared too.
fn strip_namespace(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                if let Value::String(text) = member {
                    match key.as_str() {
                        "name" => {
                            if let Some(rest) = text.strip_prefix(&format!("{prefix}__")) {
                                *text = rest.to_string();
                            }
                        }
                        "uri" | "uriTemplate" => {
                            if let Some(rest) = text.strip_prefix(&format!("{prefix}+")) {
                                *text = rest.to_string();
                            }
                        }
                        _ => {}
                    }
                } else {
                    strip_namespace(member, prefix);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| strip_namespace(item, prefix)),
        _ => {}
    }
}

/// The `result` of a response, or its `error`.
fn member_of(response: &Value) -> Value {
    response
        .get("result")
        .or_else(|| response.get("error"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// For a list result (which merges both upstreams), keeps the entries of the `fx`
/// upstream (`prefixed`) or of the unprefixed one; other results pass unchanged.
fn only_upstream(method: &str, mut result: Value, prefixed: bool) -> Value {
    if !method.ends_with("/list") {
        return result;
    }
    let is_fx = |entry: &Value| {
        ["name", "uri", "uriTemplate"].iter().any(|key| {
            entry[*key]
                .as_str()
                .is_some_and(|text| text.starts_with("fx__") || text.starts_with("fx+"))
        })
    };
    if let Some(object) = result.as_object_mut() {
        object.remove("nextCursor");
        for entries in object.values_mut() {
            if let Value::Array(items) = entries {
                items.retain(|entry| is_fx(entry) == prefixed);
            }
        }
    }
    result
}

fn namespaced(params: &Value, prefix: &str) -> Value {
    let mut params = params.clone();
    if let Some(reference) = params.get_mut("ref") {
        let namespaced_ref = namespaced(reference, prefix);
        *reference = namespaced_ref;
    }
    if let Some(name) = params.get("name").and_then(Value::as_str) {
        params["name"] = json!(format!("{prefix}__{name}"));
    }
    if let Some(uri) = params.get("uri").and_then(Value::as_str) {
        params["uri"] = json!(format!("{prefix}+{uri}"));
    }
    params
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_is_faithful_field_by_field() -> anyhow::Result<()> {
    // `plain` is exposed unprefixed, `fx` under its name; both run the same fixture.
    let sections = format!(
        "{}{}",
        fixture_upstream("plain", "prefix = \"\"", &["--conformance"]),
        fixture_upstream("fx", "", &["--conformance"])
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let mut direct = RawStdioSession::spawn(&fixture_binary(), &["--conformance"]).await?;
    let mut relayed = RawHttpSession::connect(&daemon.url).await?;

    for (method, params) in round_trip_requests() {
        let from_upstream = direct.request(method, params.clone()).await?;
        let expected = member_of(&from_upstream);
        ensure!(!expected.is_null(), "{from_upstream}");

        // Unprefixed: the same member byte for byte, in the same key order.
        let through_plain = relayed.request(method, params.clone()).await?;
        let got = only_upstream(method, member_of(&through_plain), false);
        ensure!(
            serde_json::to_string(&only_upstream(method, expected.clone(), false))?
                == serde_json::to_string(&got)?,
            "{method} {params}: upstream sent\n{expected}\nclient got\n{got}"
        );

        // Prefixed: equal once the names plexus rewrote are put back.
        let through_fx = relayed.request(method, namespaced(&params, "fx")).await?;
        let mut got = only_upstream(method, member_of(&through_fx), true);
        strip_namespace(&mut got, "fx");
        ensure!(
            serde_json::to_string(&expected)? == serde_json::to_string(&got)?,
            "{method} {params} via fx: upstream sent\n{expected}\nclient got\n{got}"
        );
    }

    // The fields typed SDK models lose are exactly what must survive.
    let tools = relayed.request("tools/list", json!({})).await?;
    let text = serde_json::to_string(&tools)?;
    ensure!(
        text.contains(r#""execution":{"taskSupport":"optional"}"#),
        "{text}"
    );
    ensure!(
        text.contains(r#""x-fixture-vendor":{"stable":true,"n":1}"#),
        "{text}"
    );
    ensure!(
        text.contains(r#""_meta":{"fixture/tool":"echo"}"#),
        "{text}"
    );
    ensure!(
        text.contains(r#""default":5}"#) && !text.contains("5.0"),
        "{text}"
    );

    direct.close().await;
    daemon.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexus_errors_are_precise_and_the_session_survives() -> anyhow::Result<()> {
    let sections = format!(
        "{}{}",
        fixture_upstream("healthy", "", &["--banner"]),
        fixture_upstream("fragile", "", &["--exit-after-calls", "1"]),
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;

    // Probes newer clients send first are answered at once.
    let started = Instant::now();
    let discover = session.request("server/discover", json!({})).await?;
    ensure!(discover["error"]["code"] == -32601, "{discover}");
    ensure!(started.elapsed() < Duration::from_secs(1));

    let unknown = session
        .request("tools/call", json!({"name": "nope__echo", "arguments": {}}))
        .await?;
    ensure!(unknown["error"]["code"] == -32602, "{unknown}");
    let unknown_resource = session
        .request("resources/read", json!({"uri": "nowhere://x"}))
        .await?;
    ensure!(
        unknown_resource["error"]["code"] == -32002,
        "{unknown_resource}"
    );
    // An upstream's own "not found" names the URI the client asked for, not the
    // upstream's form of it.
    for uri in ["healthy+fixture://items/", "healthy+fixture://nothing/here"] {
        let missing = session
            .request("resources/read", json!({"uri": uri}))
            .await?;
        ensure!(
            missing["error"]["code"] == -32002 && missing["error"]["data"]["uri"] == uri,
            "{missing}"
        );
    }
    let missing = session
        .request("tools/call", json!({"arguments": {}}))
        .await?;
    ensure!(missing["error"]["code"] == -32602, "{missing}");
    let not_json = session.post_raw(b"{not json").await?;
    ensure!(not_json["error"]["code"] == -32700, "{not_json}");
    // `_meta` or a call's `arguments` that are not objects: an rmcp server drops such
    // a request unanswered (the caller would wait out the deadline); plexus says what
    // is wrong at once. The large case is left unread, and judged as written.
    let large_text = format!("\"{}\"", "q".repeat(4096));
    for (params, member) in [
        (
            json!({"name": "healthy__echo", "arguments": {"text": "x"}, "_meta": 1}),
            "`_meta`",
        ),
        (
            json!({"name": "healthy__echo", "arguments": {"text": "x"}, "_meta": []}),
            "`_meta`",
        ),
        (
            json!({"name": "healthy__echo", "arguments": "x"}),
            "`arguments`",
        ),
        (
            json!({"name": "healthy__echo", "arguments": serde_json::from_str::<Value>(&large_text)?}),
            "`arguments`",
        ),
    ] {
        let started = Instant::now();
        let refused = session.request("tools/call", params.clone()).await?;
        ensure!(
            refused["error"]["code"] == -32602
                && refused["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(member)),
            "{params:.200}: {refused}"
        );
        ensure!(started.elapsed() < Duration::from_secs(5), "{params:.200}");
    }
    let read_meta = session
        .request(
            "resources/read",
            json!({"uri": "nowhere://x", "_meta": "x"}),
        )
        .await?;
    ensure!(read_meta["error"]["code"] == -32602, "{read_meta}");
    // null is taken as absent.
    let null_meta = session
        .request(
            "tools/call",
            json!({"name": "healthy__echo", "arguments": {"text": "null meta"}, "_meta": null}),
        )
        .await?;
    ensure!(
        null_meta["result"]["content"][0]["text"] == "null meta",
        "{null_meta}"
    );
    // A large call's arguments go on unread, but not with half a surrogate pair in
    // them: a reader refuses that (some upstreams drop it unanswered). They go with
    // U+FFFD in its place, as a small call's do.
    let padding = "p".repeat(4096);
    let lone = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"healthy__echo","arguments":{{"text":"{padding}\ud800"}}}}}}"#,
    );
    let started = Instant::now();
    let mended = session.post_raw(lone.as_bytes()).await?;
    ensure!(
        mended["id"] == 7 && mended["result"]["content"][0]["text"] == format!("{padding}\u{fffd}"),
        "{mended:.300}"
    );
    ensure!(started.elapsed() < Duration::from_secs(5));
    // Nor nested deeper than a reader goes: the upstream could not read the call to
    // answer it, and the caller waited out the deadline. Refused as a small call is.
    for padding in [0, 4096] {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"name":"healthy__echo","arguments":{{"text":"{}","deep":{}{}}}}}}}"#,
            "p".repeat(padding),
            "[".repeat(130),
            "]".repeat(130)
        );
        let started = Instant::now();
        let refused = session.post_raw(deep.as_bytes()).await?;
        ensure!(
            refused["error"]["code"] == -32700
                && refused["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("recursion limit")),
            "{padding}: {refused}"
        );
        ensure!(started.elapsed() < Duration::from_secs(5), "{padding}");
    }
    let large = "é\"\\x\u{1F600}\\u0041".repeat(1024);
    let echoed = session
        .request(
            "tools/call",
            json!({"name": "healthy__echo", "arguments": {"text": large, "n": [1.5e3, -0]}}),
        )
        .await?;
    ensure!(
        echoed["result"]["content"][0]["text"] == large.as_str(),
        "the large echo came back changed: {:.300}",
        echoed.to_string()
    );
    let no_method = session.post(&json!({"jsonrpc": "2.0", "id": 99})).await?;
    ensure!(no_method["error"]["code"] == -32600, "{no_method}");

    // The upstream dies during the call: the caller learns which and what.
    let died = session
        .request(
            "tools/call",
            json!({"name": "fragile__echo", "arguments": {"text": "x"}}),
        )
        .await?;
    ensure!(died["error"]["code"] == -33003, "{died}");
    ensure!(died["error"]["data"]["upstream"] == "fragile", "{died}");
    // Readiness is never behind the calls: once a call has failed with its
    // upstream gone, that upstream is not ready.
    let (status, readiness) = daemon.admin_get("/readyz").await?;
    let readiness: Value = serde_json::from_str(&readiness)?;
    ensure!(
        status == 503 && readiness["upstreams"]["fragile"] != "ready",
        "{status} {readiness}"
    );
    // While it is down its tools stay listed, and calls fail fast with its state.
    let down = session
        .request(
            "tools/call",
            json!({"name": "fragile__echo", "arguments": {"text": "x"}}),
        )
        .await?;
    ensure!(down["error"]["code"] == -33001, "{down}");
    ensure!(down["error"]["data"]["upstream"] == "fragile", "{down}");
    ensure!(down["error"]["data"]["state"].is_string(), "{down}");

    // The healthy upstream (which prints banners on stdout) is untouched, as is the session.
    let fine = session
        .request(
            "tools/call",
            json!({"name": "healthy__echo", "arguments": {"text": "still here"}}),
        )
        .await?;
    ensure!(
        fine["result"]["content"][0]["text"] == "still here",
        "{fine}"
    );
    ensure!(
        daemon.log().contains("dropped a non-JSON-RPC line"),
        "banner lines were not reported"
    );
    // Both banner lines are counted.
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(
        metrics.contains(r#"plexus_upstream_dropped_lines_total{upstream="healthy"} 2"#),
        "{metrics}"
    );

    // It comes back by itself.
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(
        metrics.contains(r#"plexus_upstream_restarts_total{upstream="fragile"} 1"#),
        "{metrics}"
    );
    daemon.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sessions_and_hosts_are_checked() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    let client = reqwest::Client::new();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let post = |session: Option<&str>, host: Option<&str>, origin: Option<&str>| {
        let mut request = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        if let Some(host) = host {
            request = request.header("host", host);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    ensure!(
        post(None, None, None).await?.status() == 400,
        "no session id"
    );
    ensure!(
        post(Some("00000000000000000000000000000000"), None, None)
            .await?
            .status()
            == 404
    );
    ensure!(
        post(None, Some("evil.example"), None).await?.status() == 403,
        "DNS rebinding host"
    );
    ensure!(
        post(None, None, Some("https://evil.example"))
            .await?
            .status()
            == 403,
        "foreign origin"
    );
    // An oversized body is refused from its headers, before it is uploaded.
    let address = daemon
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    let mut socket = tokio::net::TcpStream::connect(&address).await?;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        5 * 1024 * 1024
    );
    tokio::io::AsyncWriteExt::write_all(&mut socket, head.as_bytes()).await?;
    let mut answer = vec![0u8; 1024];
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut socket, &mut answer),
    )
    .await??;
    let answer = String::from_utf8_lossy(&answer[..read]);
    ensure!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    ensure!(answer.contains("-33005"), "{answer}");

    // A session ends with DELETE and is then unknown.
    let session = RawHttpSession::connect(&daemon.url).await?;
    let id = session.session_id().unwrap_or_default();
    ensure!(id.len() == 32, "session id {id}");
    let deleted = client
        .delete(&daemon.url)
        .header("mcp-session-id", &id)
        .send()
        .await?;
    ensure!(deleted.status() == 204);
    ensure!(post(Some(&id), None, None).await?.status() == 404);
    daemon.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_changes_are_announced_and_lists_paginate() -> anyhow::Result<()> {
    // The upstream starts a second late, so the client is connected before it joins.
    let late = format!(
        "[upstreams.late]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep 1; exec {}\"]\n",
        fixture_binary().display()
    );
    // No first-list wait: this is about a late upstream joining through list_changed
    // (as a cold `npx` install beyond the wait does).
    let daemon = Daemon::builder()
        .daemon("page_size = 2\nfirst_list_wait = \"0s\"")
        .upstreams(&late)
        .start()
        .await?;
    let handler = TestClient::default();
    let started = Instant::now();
    let client = http_client(&daemon.url, handler.clone()).await?;
    ensure!(
        started.elapsed() < Duration::from_secs(1),
        "initialize took {:?}",
        started.elapsed()
    );
    ensure!(
        client.list_all_tools().await?.is_empty(),
        "the upstream should not have joined yet"
    );

    tokio::time::timeout(Duration::from_secs(30), handler.tools_changed.notified())
        .await
        .map_err(|_| anyhow::anyhow!("no tools/list_changed arrived\n{}", daemon.log()))?;
    // Six tools at two per page: the client follows plexus's cursors.
    let names: Vec<String> = client
        .list_all_tools()
        .await?
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    ensure!(
        names
            == [
                "late__echo",
                "late__add",
                "late__sleep",
                "late__fail",
                "late__whoami",
                "late__ask"
            ],
        "{names:?}"
    );
    let mut raw = RawHttpSession::connect(&daemon.url).await?;
    let first = raw.request("tools/list", json!({})).await?;
    ensure!(
        first["result"]["tools"].as_array().map(Vec::len) == Some(2),
        "{first}"
    );
    let cursor = first["result"]["nextCursor"].clone();
    ensure!(cursor.is_string(), "{first}");
    let bad = raw
        .request("tools/list", json!({"cursor": "bogus"}))
        .await?;
    ensure!(bad["error"]["code"] == -32602, "{bad}");
    client.cancel().await?;
    daemon.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_launcher_leaves_the_other_upstreams_running() -> anyhow::Result<()> {
    // Missing too: a directory to start in (the system says "not found" for both).
    let sections = format!(
        "{}[upstreams.ghost]\ncommand = \"plexus-no-such-program\"\n{}",
        fixture_upstream("fx", "", &[]),
        fixture_upstream("homeless", "cwd = \"/nonexistent/plexus-dir\"", &[])
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = daemon.admin_get("/readyz").await?;
        let readiness: Value = serde_json::from_str(&body)?;
        if readiness["upstreams"]["fx"] == "ready" {
            ensure!(readiness["ready"] == false, "{readiness}");
            ensure!(readiness["upstreams"]["ghost"] != "ready", "{readiness}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "fx never became ready: {readiness}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        daemon
            .log()
            .contains("`plexus-no-such-program` was not found on PATH"),
        "{}",
        daemon.log()
    );
    daemon
        .wait_for_log(
            "its directory (`cwd`) /nonexistent/plexus-dir does not exist",
            Duration::from_secs(10),
        )
        .await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let echo = session
        .request(
            "tools/call",
            json!({"name": "fx__echo", "arguments": {"text": "ok"}}),
        )
        .await?;
    ensure!(echo["result"]["content"][0]["text"] == "ok", "{echo}");
    // A name under an upstream that was never listed is about that upstream: its
    // state, not an unknown name. A name under no upstream is unknown.
    let ghostly = session
        .request(
            "tools/call",
            json!({"name": "ghost__anything", "arguments": {}}),
        )
        .await?;
    let error = &ghostly["error"];
    ensure!(
        error["code"] == -33001
            && error["data"]["upstream"] == "ghost"
            && error["data"]["state"]
                .as_str()
                .is_some_and(|state| state == "backing_off" || state == "failed"),
        "{ghostly}"
    );
    let prompt = session
        .request("prompts/get", json!({"name": "homeless__anything"}))
        .await?;
    ensure!(
        prompt["error"]["code"] == -33001 && prompt["error"]["data"]["upstream"] == "homeless",
        "{prompt}"
    );
    let nowhere = session
        .request(
            "tools/call",
            json!({"name": "nobody__anything", "arguments": {}}),
        )
        .await?;
    ensure!(
        nowhere["error"]["code"] == -32602
            && nowhere["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("unknown tool")),
        "{nowhere}"
    );
    let status = daemon.stop().await?;
    ensure!(status.success());
    Ok(())
}

/// plexus's progress tokens are its own, each handed to the upstream its call went
/// to; another upstream that names one (misbehaving, or hostile) is not heard: the
/// caller sees only the progress of the upstream serving it, and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_cannot_speak_into_another_upstreams_call_by_its_progress_token(
) -> anyhow::Result<()> {
    let sections = format!(
        "{}{}",
        fixture_upstream("alpha", "", &[]),
        fixture_upstream("beta", "", &[])
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let mut victim = RawHttpSession::connect(&daemon.url).await?;
    let mut spoofer = RawHttpSession::connect(&daemon.url).await?;
    progress_is_not_spoofed(
        &daemon,
        "alpha",
        &mut victim,
        "alpha__sleep",
        &mut spoofer,
        "beta__sleep",
    )
    .await?;
    let log = daemon.log();
    ensure!(
        log.contains("an upstream sent progress under the token of a call to another upstream"),
        "{log}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A call's last progress is sent just before its result, on the same pipe; it must
/// reach the caller before the result does, however busy the daemon is: over the
/// HTTP front, through `plexus connect`, and over the stdio front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_last_progress_arrives_before_its_result() -> anyhow::Result<()> {
    const CALLS: u64 = 40;
    let sections = fixture_upstream("fx", "", &[]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let stdio = daemon.stdio_config(&sections)?;
    let sleep = |token: u64| json!({"name": "fx__sleep", "arguments": {"ms": 1}, "_meta": {"progressToken": token}});
    // Concurrent on one task: a raw stdio session is not `Send`.
    let workers = (0..8u64).map(|worker| {
        let url = daemon.url.clone();
        let stdio = stdio.clone();
        async move {
            let front = match worker {
                0..=3 => "http",
                4..=5 => "connect",
                _ => "stdio",
            };
            let mut http = match front {
                "http" => Some(RawHttpSession::connect(&url).await?),
                _ => None,
            };
            let mut stdio_session = match front {
                "connect" => {
                    Some(RawStdioSession::spawn(&plexus_binary(), &["connect", &url]).await?)
                }
                "stdio" => Some(
                    RawStdioSession::spawn(
                        &plexus_binary(),
                        &["serve", "--stdio", "--config", &stdio.display().to_string()],
                    )
                    .await?,
                ),
                _ => None,
            };
            if let (Some(session), "stdio") = (&mut stdio_session, front) {
                // The stdio front starts its own upstream: wait until it lists.
                let deadline = Instant::now() + Duration::from_secs(20);
                while !session
                    .request("tools/list", json!({}))
                    .await?
                    .to_string()
                    .contains("fx__sleep")
                {
                    ensure!(
                        Instant::now() < deadline,
                        "the stdio front never listed fx__sleep"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            for call in 0..CALLS {
                let token = worker * CALLS + call;
                let (answer, heard) = match (&mut http, &mut stdio_session) {
                    (Some(session), _) => {
                        session.streamed.clear();
                        let answer = session.request("tools/call", sleep(token)).await?;
                        (answer, session.streamed.clone())
                    }
                    (_, Some(session)) => {
                        session.heard.clear();
                        let answer = session.request("tools/call", sleep(token)).await?;
                        (answer, session.heard.clone())
                    }
                    _ => unreachable!("every worker has a session"),
                };
                ensure!(
                    answer["result"]["content"][0]["text"] == "slept 1 ms",
                    "{answer}"
                );
                let last = heard.iter().rev().find(|message| {
                    message["method"] == "notifications/progress"
                        && message["params"]["progressToken"] == token
                });
                ensure!(
                    last.is_some_and(|progress| progress["params"]["progress"] == 1.0),
                    "{front}, call {token}: its 100% progress did not precede its result: {heard:?}"
                );
            }
            if let Some(session) = stdio_session {
                session.close().await;
            }
            anyhow::Ok(())
        }
    });
    futures::future::try_join_all(workers).await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A `plexus serve --stdio` config in `dir` with one fixture upstream.
fn stdio_config(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let config = dir.join("stdio.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\n\n{}",
            dir.join("state").display().to_string(),
            fixture_upstream("fx", "", &[])
        ),
    )?;
    Ok(config)
}

/// The stdio front widens the pipes its host gives it, as plexus does an upstream's:
/// a large message crosses in one round.
#[tokio::test]
async fn the_stdio_front_widens_its_hosts_pipes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = stdio_config(dir.path())?;
    let config = config.to_str().context("config path")?;
    let mut session =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", config]).await?;
    // Answered, so the front has its stdio.
    let listed = session.request("tools/list", json!({})).await?;
    ensure!(listed["result"]["tools"].is_array(), "{listed}");
    let max: i32 = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")?
        .trim()
        .parse()?;
    let expected = (1 << 20).min(max);
    let capacities = session.pipe_capacities()?;
    ensure!(
        capacities == (expected, expected),
        "pipes of {capacities:?} bytes, not {expected}"
    );
    session.close().await;
    Ok(())
}

/// Node-based hosts (Electron desktop apps among them) give a child Unix sockets,
/// not pipes, for stdin and stdout. plexus polls those on its runtime; a large
/// message in both directions must arrive whole, and the caller's socket must be
/// left as plexus found it (blocking) when plexus exits.
#[tokio::test]
async fn the_stdio_front_serves_a_host_that_hands_it_a_socket() -> anyhow::Result<()> {
    use std::os::unix::net::UnixStream;
    use tokio::io::{AsyncBufReadExt, BufReader};

    let dir = tempfile::tempdir()?;
    let config = stdio_config(dir.path())?;
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_out = theirs.try_clone()?;
    // The same open socket as plexus's stdin, to read its flags once plexus is gone.
    let probe = theirs.try_clone()?;
    let mut child = plexus_tests::plexus_stdio_command(&config)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs_out,
        )))
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    let (read, mut write) = ours.into_split();
    let mut lines = BufReader::new(read).lines();
    send_line(&mut write, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "socket", "version": "0"}}}))
    .await?;
    let hello = next_message(&mut lines).await?;
    ensure!(hello["result"]["serverInfo"]["name"] == "plexus", "{hello}");
    send_line(
        &mut write,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    // Far more than a socket buffer holds, so both sides see partial reads and writes.
    let text = "0123456789abcdef".repeat(256 * 1024 / 16);
    let deadline = Instant::now() + Duration::from_secs(60);
    let echoed = loop {
        send_line(
            &mut write,
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "fx__echo", "arguments": {"text": text}}}),
        )
        .await?;
        let answer: Value = loop {
            let message = next_message(&mut lines).await?;
            if message.get("id") == Some(&json!(2)) {
                break message;
            }
        };
        // The upstream may still be starting: plexus answers before it is ready.
        if answer.get("result").is_some() || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        echoed["result"]["content"][0]["text"] == json!(text),
        "the echo came back different: {:.300}",
        echoed.to_string()
    );
    ensure!(
        nonblocking(&probe)?,
        "plexus reads its socket through blocking threads"
    );
    drop(write);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await??;
    ensure!(status.success(), "plexus exited with {status}");
    ensure!(
        !nonblocking(&probe)?,
        "plexus left the host's socket non-blocking"
    );
    Ok(())
}

async fn send_line(
    write: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: Value,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut line = serde_json::to_vec(&message)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    Ok(())
}

async fn next_message(
    lines: &mut tokio::io::Lines<impl tokio::io::AsyncBufRead + Unpin>,
) -> anyhow::Result<Value> {
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await??
        .ok_or_else(|| anyhow::anyhow!("plexus closed its stdout"))?;
    Ok(serde_json::from_str(&line)?)
}

fn nonblocking(socket: &std::os::unix::net::UnixStream) -> anyhow::Result<bool> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(std::os::fd::AsRawFd::as_raw_fd(socket), FcntlArg::F_GETFL)?;
    Ok(OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK))
}

/// The fixture with `flag` behind a ready daemon three ways: over stdio (`piped`),
/// an HTTP event stream (`streamed`) and a plain JSON body (`plain`), each with a
/// deadline far beyond a test's patience (a failure must not wait for one).
struct ThreeWays {
    daemon: Daemon,
    fixtures: [HttpFixture; 2],
}

impl ThreeWays {
    /// Ends `client`, the daemon (cleanly) and the HTTP fixtures.
    async fn finish(self, client: Client) -> anyhow::Result<()> {
        client.cancel().await?;
        ensure!(self.daemon.stop().await?.success());
        for fixture in self.fixtures {
            fixture.kill().await?;
        }
        Ok(())
    }
}

async fn fixture_three_ways(dir: &std::path::Path, flag: &str) -> anyhow::Result<ThreeWays> {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let streamed = HttpFixture::start(dir, loopback, &["--name", "streamed", flag]).await?;
    let plain = HttpFixture::start(
        dir,
        loopback,
        &["--name", "plain", "--stateless-json", flag],
    )
    .await?;
    let deadline = "call_timeout = \"120s\"";
    let sections = format!(
        "{}[upstreams.streamed]\nurl = {:?}\n{deadline}\n[upstreams.plain]\nurl = {:?}\n{deadline}\n",
        fixture_upstream("piped", deadline, &["--name", "piped", flag]),
        streamed.url(),
        plain.url(),
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    Ok(ThreeWays {
        daemon,
        fixtures: [streamed, plain],
    })
}

/// An echo of `text` by `upstream` fails at once (long before its deadline) with
/// plexus's -33003 naming the upstream, its message saying each of `says`.
async fn fails_at_once(
    client: &Client,
    upstream: &str,
    text: &str,
    says: &[&str],
) -> anyhow::Result<()> {
    let started = Instant::now();
    let failed = client.call_tool(echo(upstream, text)).await;
    let Err(ServiceError::McpError(error)) = failed else {
        anyhow::bail!("{upstream}, {text:.60}: got {failed:?}");
    };
    ensure!(
        error.code.0 == -33003
            && error
                .data
                .as_ref()
                .is_some_and(|d| d["upstream"] == upstream)
            && says.iter().all(|said| error.message.contains(said)),
        "{upstream}, {text:.60}: {error:?}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "{upstream}, {text:.60}: the call waited {:?}",
        started.elapsed()
    );
    Ok(())
}

/// `upstream` still answers an echo.
async fn still_serves(client: &Client, upstream: &str) -> anyhow::Result<()> {
    let result = client.call_tool(echo(upstream, "after")).await?;
    ensure!(serde_json::to_value(&result)?["content"][0]["text"] == "after");
    Ok(())
}

/// An echo of `text` by `upstream`'s fixture.
fn echo(upstream: &str, text: &str) -> CallToolRequestParams {
    CallToolRequestParams::new(format!("{upstream}__echo"))
        .with_arguments(arguments(json!({ "text": text })))
}

/// A client that escapes half a UTF-16 surrogate pair (JavaScript does, for a string
/// cut inside an emoji) gets its call answered, with U+FFFD in its place, rather than
/// a parse error whose null id it cannot match to its request: over HTTP, the stdio
/// front and `plexus connect`, small arguments (read) and large (passed on unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_half_surrogate_pair_is_answered_as_a_replacement_character() -> anyhow::Result<()>
{
    let sections = fixture_upstream("fx", "", &[]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let stdio = daemon.stdio_config(&sections)?.display().to_string();
    let call = |id: &str, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{{"name":"fx__echo","arguments":{{"text":"{text} \ud83d cut, \udc00 low, \ud83d\ude00 whole"}}}}}}"#
        )
    };
    let expected = |text: &str| format!("{text} \u{fffd} cut, \u{fffd} low, \u{1f600} whole");
    let mut http = RawHttpSession::connect(&daemon.url).await?;
    let mut connect = RawStdioSession::spawn(&plexus_binary(), &["connect", &daemon.url]).await?;
    let mut served =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", &stdio]).await?;
    // The stdio front starts its own upstream: a call waits for it.
    for (n, text) in ["small".to_string(), "large".repeat(400)]
        .iter()
        .enumerate()
    {
        let answers = [
            (
                "http",
                http.post_raw(call(&format!("h{n}"), text).as_bytes())
                    .await?,
            ),
            (
                "connect",
                connect
                    .request_raw(&format!("c{n}"), &call(&format!("c{n}"), text))
                    .await?,
            ),
            (
                "stdio",
                served
                    .request_raw(&format!("s{n}"), &call(&format!("s{n}"), text))
                    .await?,
            ),
        ];
        for (front, answer) in answers {
            ensure!(
                answer["result"]["content"][0]["text"] == expected(text),
                "{front}, {} bytes: {answer:.300}",
                text.len()
            );
        }
    }
    connect.close().await;
    served.close().await;
    daemon.stop().await?;
    Ok(())
}

/// An upstream that escapes half a UTF-16 surrogate pair (as JavaScript writes a
/// string cut inside an emoji) is relayed with U+FFFD in its place, so a strict
/// client (rmcp's) takes the answer, small (read) or large (unread); an answer that
/// is not JSON at all fails its call at once, naming the upstream, rather than at
/// the call's deadline. Over stdio, an HTTP event stream and a plain JSON body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_broken_escapes_are_repaired_or_fail_the_call_at_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let three = fixture_three_ways(dir.path(), "--raw-escapes").await?;
    let client = http_client(&three.daemon.url, TestClient::default()).await?;
    for upstream in ["piped", "streamed", "plain"] {
        for filler in [0, 4096] {
            let text = format!("{}cut <lone-surrogate> here", "f".repeat(filler));
            let result = client
                .call_tool(echo(upstream, &text))
                .await
                .with_context(|| format!("{upstream}, {filler} bytes before the cut"))?;
            let echoed = serde_json::to_value(&result)?;
            ensure!(
                echoed["content"][0]["text"] == text.replace("<lone-surrogate>", "\u{FFFD}"),
                "{upstream}: {:.300}",
                echoed.to_string()
            );
            ensure!(echoed["structuredContent"]["text"] == echoed["content"][0]["text"]);
        }
        fails_at_once(&client, upstream, "not <bad-escape> JSON", &["not JSON"]).await?;
        still_serves(&client, upstream).await?;
    }
    three.finish(client).await
}

/// An upstream's reply that no MCP client could take (neither `result` nor
/// `error`, a result that is not an object, an error that is not a JSON-RPC error
/// object) fails its call at once with an error naming the upstream, rather than
/// reaching the client's SDK as it is or waiting out the call's deadline. Over
/// stdio, an HTTP event stream and a plain JSON body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_malformed_replies_fail_the_call_at_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let three = fixture_three_ways(dir.path(), "--malformed-replies").await?;
    let client = http_client(&three.daemon.url, TestClient::default()).await?;
    for upstream in ["piped", "streamed", "plain"] {
        for (mark, what) in [
            ("<hollow-reply>", "neither `result` nor `error`"),
            ("<string-result>", "`result` is not an object"),
            (
                "<bad-error>",
                "`error` is not an object with an integer `code`",
            ),
        ] {
            // Small (read) and large (its result left unread) alike.
            for filler in [0, 4096] {
                let text = format!("{}a reply {mark}", "f".repeat(filler));
                fails_at_once(&client, upstream, &text, &["not a JSON-RPC response", what]).await?;
            }
        }
        // A result 100,000 arrays deep: refused as a reader refuses it, not read
        // into a stack, small or large.
        for filler in [0, 4096] {
            let text = format!("{}a reply <deep-reply>", "f".repeat(filler));
            fails_at_once(&client, upstream, &text, &["not JSON", "recursion limit"]).await?;
        }
        still_serves(&client, upstream).await?;
    }
    three.finish(client).await
}

/// A stdio upstream that writes UTF-8's byte-order mark before its first line (as
/// some runtimes do) is served: its `initialize` answer counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_writing_a_byte_order_mark_first_is_served() -> anyhow::Result<()> {
    let sections = fixture_upstream("marked", "", &["--name", "marked", "--byte-order-mark"]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let result = client.call_tool(echo("marked", "after a mark")).await?;
    ensure!(serde_json::to_value(&result)?["content"][0]["text"] == "after a mark");
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A stdio upstream that answers in JSON-RPC batches (a notification, then the
/// reply: allowed until MCP 2025-06-18) is served: each message of a batch is
/// taken in turn, and none is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_in_batches_is_served() -> anyhow::Result<()> {
    let sections = fixture_upstream("batched", "", &["--name", "batched", "--batch-replies"]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let tools = client.list_all_tools().await?;
    ensure!(
        tools.iter().any(|tool| tool.name == "batched__echo"),
        "{tools:?}"
    );
    for text in ["one", "two"] {
        let result = client
            .call_tool(
                CallToolRequestParams::new("batched__echo")
                    .with_arguments(arguments(json!({ "text": text }))),
            )
            .await?;
        ensure!(serde_json::to_value(&result)?["content"][0]["text"] == text);
    }
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(
        metrics.contains("plexus_upstream_dropped_lines_total"),
        "{metrics}"
    );
    ensure!(
        !metrics.lines().any(
            |line| line.starts_with("plexus_upstream_dropped_lines_total") && !line.ends_with(" 0")
        ),
        "lines were dropped: {metrics}"
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A resource subscription takes the one relay path every request to an upstream
/// takes: it waits its turn under the upstream's `max_in_flight`/`max_pending`
/// (refused with -33004 when both are full) and counts among the relay metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_takes_the_relay_path_with_its_limits_and_metrics() -> anyhow::Result<()> {
    let sections = fixture_upstream(
        "fx",
        "max_in_flight = 1\nmax_pending = 0",
        &["--name", "fx", "--conformance"],
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let uri = "fx+test://template/1/data";

    // One slow call takes the upstream's only slot, and nothing may wait for it.
    let mut busy = RawHttpSession::connect(&daemon.url).await?;
    let slow = tokio::spawn(async move {
        busy.request(
            "tools/call",
            json!({"name": "fx__sleep", "arguments": {"ms": 3000}}),
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = daemon.admin_get("/metrics").await?;
        if metrics.contains(r#"plexus_upstream_in_flight{upstream="fx"} 1"#) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the slow call never started: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let refused = session
        .request("resources/subscribe", json!({"uri": uri}))
        .await?;
    ensure!(
        refused["error"]["code"] == -33004 && refused["error"]["data"]["upstream"] == "fx",
        "{refused}"
    );
    let slept = slow.await??;
    ensure!(
        slept["result"]["content"][0]["text"] == "slept 3000 ms",
        "{slept}"
    );

    // With the slot free, the same subscription is taken and counted.
    let taken = session
        .request("resources/subscribe", json!({"uri": uri}))
        .await?;
    ensure!(taken["result"] == json!({}), "{taken}");
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    for line in [
        r#"plexus_relay_requests_total{method="resources/subscribe",outcome="overloaded",upstream="fx"} 1"#,
        r#"plexus_relay_requests_total{method="resources/subscribe",outcome="ok",upstream="fx"} 1"#,
    ] {
        ensure!(metrics.contains(line), "no `{line}` in {metrics}");
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}
