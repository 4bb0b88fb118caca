//! The worst a client can send (100,000 nested arrays or objects, invalid UTF-8, a
//! NUL, a number beyond every type) through a real daemon, over HTTP and over
//! stdio: each is answered at once with a precise JSON-RPC error, the daemon stays
//! up and ready, and another session calling meanwhile sees no error. (The
//! randomized tests beside each parser try thousands more inputs; an upstream's
//! deep reply is in `relay.rs::an_upstreams_malformed_replies_fail_the_call_at_once`.)

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    eventually, fixture_upstream, plexus_binary, ControlSession, Daemon, RawHttpSession,
    RawStdioSession,
};
use serde_json::{json, Value};

const DEEP: usize = 100_000;

/// A `tools/call` of the fixture's echo with `arguments` written as given, padded
/// past 1 KiB when `large` (its arguments are then skimmed, not read).
fn call_with(arguments: &str, large: bool) -> Vec<u8> {
    let padding = if large {
        "p".repeat(2048)
    } else {
        String::new()
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"fx__echo","arguments":{{"text":"{padding}","x":{arguments}}}}}}}"#
    )
    .into_bytes()
}

/// The hostile bodies and lines, each with what its error's message must say.
fn worst_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let arrays = format!("{}{}", "[".repeat(DEEP), "]".repeat(DEEP));
    let objects = format!("{}1{}", "{\"a\":".repeat(DEEP), "}".repeat(DEEP));
    let mut cases = vec![
        (
            "params 100,000 arrays deep",
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{arrays}}}"#)
                .into_bytes(),
            "recursion limit",
        ),
        (
            "100,000 arrays opened, none closed",
            "[".repeat(DEEP).into_bytes(),
            "recursion limit",
        ),
        (
            "an id 100,000 objects deep",
            format!(r#"{{"jsonrpc":"2.0","id":{objects},"method":"ping"}}"#).into_bytes(),
            "recursion limit",
        ),
    ];
    for large in [false, true] {
        cases.push((
            "arguments 100,000 arrays deep",
            call_with(&arrays, large),
            "recursion limit",
        ));
        cases.push((
            "invalid UTF-8 in a string",
            call_with("\"\u{1}\"", large)
                .into_iter()
                .map(|byte| if byte == 1 { 0xff } else { byte })
                .collect(),
            "",
        ));
        cases.push((
            "a NUL in a string",
            call_with("\"a\0b\"", large),
            "control character",
        ));
        cases.push((
            "a number beyond every type",
            call_with("1e999999", large),
            "out of range",
        ));
    }
    cases
}

/// The answer to the case `what`, `took` after it was sent: -32700 with no id,
/// its message saying `says`.
fn unparsed(what: &str, answer: &Value, says: &str, took: Duration) -> anyhow::Result<()> {
    println!("{what}: answered in {took:?}");
    ensure!(
        answer["error"]["code"] == -32700
            && answer["id"].is_null()
            && answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(says)),
        "{what}: {answer}"
    );
    // Headroom for a loaded debug build; a wedge would take the client's timeout.
    ensure!(took < Duration::from_secs(5), "{what}: {took:?}");
    Ok(())
}

/// plexus fronting the fixture as `fx`, and a session calling it throughout.
async fn watched() -> anyhow::Result<(Daemon, ControlSession)> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let control = ControlSession::start(&daemon.url, "fx__echo").await?;
    Ok((daemon, control))
}

/// The calling session saw a few calls and no error, and the daemon is still ready.
async fn untouched(daemon: Daemon, control: ControlSession) -> anyhow::Result<()> {
    control.wait_for_calls(3).await?;
    control.finish().await?;
    let (status, readiness) = daemon.admin_get("/readyz").await?;
    ensure!(status == 200, "{status} {readiness}");
    daemon.stop().await?;
    Ok(())
}

/// The call a session that was sent the worst inputs must still have answered.
fn echo_after() -> Value {
    json!({"name": "fx__echo", "arguments": {"text": "after"}})
}

/// Whether `echoed` answers [`echo_after`].
fn served_on(echoed: &Value) -> anyhow::Result<()> {
    ensure!(
        echoed["result"]["content"][0]["text"] == "after",
        "{echoed}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_http_bodies_are_answered_precisely_and_touch_no_other_session(
) -> anyhow::Result<()> {
    let (daemon, control) = watched().await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for (what, body, says) in worst_cases() {
        let started = Instant::now();
        let answer = session.post_raw(&body).await.context(what)?;
        unparsed(what, &answer, says, started.elapsed())?;
    }
    // The session that sent them is served on, as is the one calling meanwhile.
    served_on(&session.request("tools/call", echo_after()).await?)?;
    untouched(daemon, control).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_stdio_lines_are_answered_precisely_and_the_front_serves_on() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("stdio.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\n\n{}",
            dir.path().join("state").display().to_string(),
            fixture_upstream("fx", "", &[])
        ),
    )?;
    let config = config.to_str().context("config path")?;
    let mut session =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", config]).await?;
    // The front's own upstream listed first: the echo at the end is then the
    // front's to answer, not a wait on a start under load.
    eventually(Duration::from_secs(60), async || {
        let listed = session.request("tools/list", json!({})).await?;
        ensure!(listed.to_string().contains("fx__echo"), "{listed}");
        Ok(())
    })
    .await?;
    let mut lines = worst_cases();
    lines.push(("a lone NUL", b"\0".to_vec(), ""));
    lines.push(("bytes that are no text", b"\xff\xfe\x00\xc3(".to_vec(), ""));
    for (what, line, says) in lines {
        let started = Instant::now();
        let answer = session
            .request_bytes(Value::Null, &line)
            .await
            .context(what)?;
        unparsed(what, &answer, says, started.elapsed())?;
    }
    served_on(&session.request("tools/call", echo_after()).await?)?;
    session.close().await;
    Ok(())
}

/// A session-less 2026-07-28 call whose headers and body are hostile (byte mutants
/// of each header the revision reads, value mutants of the body): every request
/// is answered, as JSON-RPC whenever the body is JSON, never with a 5xx, and a
/// control session calling meanwhile sees no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_2026_headers_and_bodies_are_answered_and_touch_no_other_session(
) -> anyhow::Result<()> {
    let (daemon, control) = watched().await?;
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "fx__echo"),
        (
            "mcp-session-id",
            "plexus.AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "fx__echo", "arguments": {"text": "t"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "progressToken": "p",
        },
    }});
    // A connection each: one the daemon closes after refusing a head (431) is not
    // raced by the next request, which a pooled client would send on it.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let mut requests: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
    for (index, (_, value)) in headers.iter().enumerate() {
        for mutant in mutations::cases(&[value.as_bytes()], 60, index as u64) {
            requests.push((index, mutant, body.to_string().into_bytes()));
        }
    }
    for mutant in mutations::value_mutants(&body, 300, 0x2026) {
        requests.push((usize::MAX, Vec::new(), mutant));
    }
    let (mut sent, mut statuses) = (0, std::collections::BTreeMap::<u16, usize>::new());
    let started = Instant::now();
    for (mutated, value, body) in &requests {
        let mut request = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (index, (name, plain)) in headers.iter().enumerate() {
            request = match index == *mutated {
                true => match reqwest::header::HeaderValue::from_bytes(value) {
                    Ok(value) => request.header(*name, value),
                    // Not a header value at all: hyper would not send it.
                    Err(_) => request,
                },
                false if *name == "mcp-session-id" => request,
                false => request.header(*name, *plain),
            };
        }
        let response = match request.body(body.clone()).send().await {
            Ok(response) => response,
            // A head past hyper's limit is refused with 431 and the connection
            // closed, which may come while the client still sends it.
            Err(_) if value.len() > 64 * 1024 => {
                *statuses.entry(431).or_default() += 1;
                continue;
            }
            Err(error) => {
                return Err(error).with_context(|| mutations::describe(value));
            }
        };
        let status = answered_below_500(response, value).await?;
        *statuses.entry(status).or_default() += 1;
        sent += 1;
    }
    println!(
        "{sent} hostile requests in {:?}: statuses {statuses:?}",
        started.elapsed()
    );
    untouched(daemon, control).await
}

/// A hostile request's answer: below 500, and one JSON-RPC result or error when it
/// is JSON (the last event of a stream); its status.
async fn answered_below_500(response: reqwest::Response, sent: &[u8]) -> anyhow::Result<u16> {
    let status = response.status().as_u16();
    let text = response.text().await?;
    ensure!(
        status < 500,
        "{status} for {}: {text:.300}",
        mutations::describe(sent)
    );
    let answer = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or(&text);
    if let Ok(answer) = serde_json::from_str::<Value>(answer) {
        ensure!(
            answer.get("result").is_some() != answer.get("error").is_some(),
            "{status}: {answer:.300}"
        );
    }
    Ok(status)
}

/// Hostile `initialize` requests (value mutants: versions, capabilities, client
/// info of every shape) each get an answer below 500, JSON-RPC when JSON; the
/// sessions some of them open are bounded like any, and a control session
/// calling throughout sees no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_initialize_requests_are_answered_and_touch_no_other_session() -> anyhow::Result<()>
{
    let (daemon, control) = watched().await?;
    let seed = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"roots": {"listChanged": true}, "sampling": {}, "elicitation": {"form": {}}},
        "clientInfo": {"name": "c", "version": "1"},
    }});
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for body in mutations::value_mutants(&seed, 400, 0x1417) {
        let response = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .with_context(|| mutations::describe(&body))?;
        let status = answered_below_500(response, &body).await?;
        *statuses.entry(status).or_default() += 1;
    }
    println!("400 hostile initialize requests: statuses {statuses:?}");
    untouched(daemon, control).await
}
