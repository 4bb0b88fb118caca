//! Remote (HTTP) upstreams: plexus reaches the fixture served over streamable HTTP
//! by a separate process on a loopback port (with sessions and event streams, and
//! in plain-JSON stateless mode), and a Python SDK server on the 2024-11-05
//! HTTP+SSE transport (also over https). Configured headers (with `${ENV}` secrets) reach the
//! upstream; a server-to-client request is attributed to the call whose response
//! stream carried it; an upstream that goes away fails calls precisely and comes
//! back on its own.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::answering::{call, wait_for_tool, AnsweringClient};
use plexus_tests::{
    eventually, fixture_upstream, http_client, json_of, restartable_port, venv_python,
    workspace_root, Daemon, HttpFixture, RawHttpSession, TestClient,
};
use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn remote_section(name: &str, url: &str, extra: &str) -> String {
    format!("[upstreams.{name}]\nurl = {url:?}\n{extra}\n")
}

/// The JSON lines of a fixture's `--request-log`.
fn request_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Tools, resources and prompts of a streamable HTTP upstream (with sessions and a
/// GET stream), a stateless plain-JSON one and a 2026-07-28 one (whose requests
/// carry `Mcp-Method` and `Mcp-Name`), through plexus; the configured
/// header, its value from the environment, reaches every request, and the session
/// is deleted when plexus stops. A wrong header value is reported with the URL
/// and the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_upstreams_serve_tools_resources_and_prompts_with_their_headers(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let requests = dir.path().join("requests.jsonl");
    let secret = "k-7f3a91";
    let log_arg = requests.display().to_string();
    let keyed = HttpFixture::start(
        dir.path(),
        any_port(),
        &[
            "--name",
            "keyed",
            "--require-header",
            &format!("X-Api-Key: {secret}"),
            "--request-log",
            &log_arg,
        ],
    )
    .await?;
    let plain = HttpFixture::start(
        dir.path(),
        any_port(),
        &["--name", "plain", "--stateless-json"],
    )
    .await?;
    let modern =
        HttpFixture::start(dir.path(), any_port(), &["--name", "modern", "--modern"]).await?;
    let sections = format!(
        "{}{}{}",
        remote_section(
            "remote",
            &keyed.url(),
            "headers = { X-Api-Key = \"${REMOTE_TEST_KEY}\" }\nmax_message_bytes = 65536",
        ),
        remote_section(
            "plain",
            &plain.url(),
            "transport = \"streamable-http\"\nmax_message_bytes = 65536",
        ),
        remote_section("modern", &modern.url(), "protocol = \"2026-07-28\""),
    );
    let daemon = Daemon::builder()
        .upstreams(&sections)
        .env(&[("REMOTE_TEST_KEY", secret)])
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;

    let client = http_client(&daemon.url, TestClient::default()).await?;
    let tools: Vec<String> = client
        .list_all_tools()
        .await?
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect();
    for name in ["remote__echo", "remote__ask", "plain__echo", "plain__add"] {
        ensure!(tools.iter().any(|tool| tool == name), "{name} in {tools:?}");
    }
    for (tool, text) in [
        ("remote__echo", "over http"),
        ("plain__echo", "plain json"),
        ("modern__echo", "per request"),
    ] {
        let params = rmcp::model::CallToolRequestParams::new(tool.to_string())
            .with_arguments(plexus_tests::arguments(json!({"text": text})));
        let result = json_of(&client.call_tool(params).await?);
        ensure!(text_of(&result) == text, "{tool}: {result}");
        // A result plexus must change (a linked resource's URI) is read, whatever
        // the upstream's way of answering.
        let params = rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(
            plexus_tests::arguments(json!({"text": text, "link": "fixture://items/3"})),
        );
        let linked = json_of(&client.call_tool(params).await?);
        let prefix = tool.split("__").next().unwrap_or_default();
        ensure!(
            linked["content"][1]["resource"]["uri"] == format!("{prefix}+fixture://items/3")
                && linked["content"][2]["uri"] == format!("{prefix}+fixture://items/3"),
            "{tool}: {linked}"
        );
    }
    let whoami = json_of(
        &client
            .call_tool(rmcp::model::CallToolRequestParams::new("remote__whoami"))
            .await?,
    );
    ensure!(text_of(&whoami).contains("keyed"), "{whoami}");

    let resources = client.list_all_resources().await?;
    let text_resource = resources
        .iter()
        .map(|resource| resource.uri.clone())
        .find(|uri| uri.starts_with("remote+"))
        .context("no resource of the remote upstream is listed")?;
    let read = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new(text_resource.clone()))
            .await?,
    );
    ensure!(
        read["contents"][0]["uri"] == text_resource.as_str(),
        "{read}"
    );
    let item = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new("remote+fixture://items/42"))
            .await?,
    );
    ensure!(
        item["contents"][0]["text"] == "item 42 from keyed",
        "{item}"
    );
    let prompt = json_of(
        &client
            .get_prompt(
                GetPromptRequestParams::new("remote__greet")
                    .with_arguments(plexus_tests::arguments(json!({"name": "Ada"}))),
            )
            .await?,
    );
    ensure!(
        prompt["messages"][0]["content"]["text"] == "Hello, Ada!",
        "{prompt}"
    );
    client.cancel().await?;

    // An answer over max_message_bytes, in an event or a JSON body, fails its call
    // alone: the next call on the same connection works.
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for upstream in ["remote", "plain"] {
        let huge = "x".repeat(100_000);
        let echo =
            |text: &str| json!({"name": format!("{upstream}__echo"), "arguments": {"text": text}});
        let refused = session.request("tools/call", echo(&huge)).await?;
        ensure!(refused["error"]["code"] == -33005, "{upstream}: {refused}");
        let fine = session.request("tools/call", echo("small")).await?;
        ensure!(text_of(&fine["result"]) == "small", "{upstream}: {fine}");
    }

    ensure!(
        !daemon.log().contains(secret),
        "the header's secret value reached plexus's log"
    );
    // The GET stream is opened beside the calls, not before them (a pooled
    // connection the server closed meanwhile makes it try again): wait for it.
    let _ = plexus_tests::eventually(Duration::from_secs(15), async || {
        ensure!(request_log(&requests)
            .iter()
            .any(|line| line["method"] == "GET"));
        Ok(())
    })
    .await;
    ensure!(daemon.stop().await?.success());

    // The fixture refused (401) any request without the header, so every request
    // seen carried it. After initialize, each one names the session and version.
    let seen = request_log(&requests);
    ensure!(!seen.is_empty(), "the fixture logged no request");
    let session = seen
        .iter()
        .find_map(|line| line["session"].as_str())
        .context("no request carried a session id")?;
    let after_initialize: Vec<&Value> = seen
        .iter()
        .skip_while(|line| line["session"].is_null())
        .collect();
    for line in &after_initialize {
        ensure!(line["session"] == session, "{line}");
        ensure!(line["protocol_version"] == "2025-11-25", "{line}");
    }
    ensure!(
        after_initialize
            .iter()
            .any(|line| line["method"] == "GET" && line["accept"] == "text/event-stream"),
        "plexus opened no GET event stream: {seen:?}"
    );
    ensure!(
        seen.last().is_some_and(|line| line["method"] == "DELETE"),
        "plexus did not delete its session on shutdown: {seen:?}"
    );

    // The same upstream with a wrong key: refused, and the log says where and how.
    let wrong = remote_section(
        "remote",
        &keyed.url(),
        "headers = { X-Api-Key = \"not-the-key\" }\nrestart_backoff = \"5s\"",
    );
    let daemon = Daemon::builder().upstreams(&wrong).start().await?;
    // It says what the server asked for, and where credentials go.
    let needle = format!(
        "{} answered HTTP 401: missing or wrong `x-api-key`; it asks for Bearer authorization",
        keyed.url()
    );
    daemon
        .wait_for_log(&needle, Duration::from_secs(20))
        .await?;
    ensure!(daemon.log().contains("in `headers`"), "{}", daemon.log());
    ensure!(!daemon.log().contains("not-the-key"));
    ensure!(daemon.stop().await?.success());
    drop((keyed, plain, modern));
    Ok(())
}

/// Session A has a call in flight on a shared upstream while session B's call
/// makes that upstream ask for roots. Over HTTP the request arrives on the
/// response stream of B's call, so B is asked and gets its own roots; over stdio
/// nothing tells the two calls apart, and plexus refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_calls_stream_goes_to_that_call_among_several_sessions() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let fixture = HttpFixture::start(dir.path(), any_port(), &["--name", "web"]).await?;
    let sections = format!(
        "{}{}",
        remote_section("remote", &fixture.url(), ""),
        fixture_upstream("local", "", &[])
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let alice_handler = AnsweringClient::named("alice");
    let bob_handler = AnsweringClient::named("bob");
    let alice = alice_handler
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    let bob = bob_handler
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    wait_for_tool(&alice, "remote__sleep").await?;
    wait_for_tool(&bob, "local__ask").await?;

    let mut answers = Vec::new();
    for upstream in ["remote", "local"] {
        let long = {
            let peer = alice.peer().clone();
            let tool = format!("{upstream}__sleep");
            tokio::spawn(async move {
                let params = rmcp::model::CallToolRequestParams::new(tool)
                    .with_arguments(plexus_tests::arguments(json!({"ms": 1500})));
                peer.call_tool(params).await
            })
        };
        daemon.wait_for_in_flight(upstream, 1).await?;
        let asked = call(&bob, &format!("{upstream}__ask"), json!({"kind": "roots"})).await?;
        let slept = json_of(&long.await??);
        ensure!(text_of(&slept) == "slept 1500 ms", "{upstream}: {slept}");
        answers.push(asked);
    }
    let [remote, local] = &answers[..] else {
        bail!("two answers expected: {answers:?}");
    };
    ensure!(
        text_of(remote) == bob_handler.root() && remote["isError"] != true,
        "over HTTP, bob gets his own roots: {remote}"
    );
    ensure!(
        local["isError"] == true && text_of(local).contains("share = \"session\""),
        "over stdio, plexus cannot tell and refuses: {local}"
    );
    ensure!(
        alice_handler.roots_asked() == 0,
        "alice was asked for bob's call"
    );
    ensure!(bob_handler.roots_asked() == 1, "bob was asked once");
    alice.cancel().await?;
    bob.cancel().await?;
    ensure!(daemon.stop().await?.success());
    drop(fixture);
    Ok(())
}

/// A call past its deadline is cancelled upstream: by `notifications/cancelled`
/// for a handshake-era upstream, by closing the request's stream for 2026-07-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_cancels_the_remote_call() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut fixtures = Vec::new();
    let mut sections = String::new();
    for (name, args) in [("session", &[][..]), ("modern", &["--modern"][..])] {
        let cancels = dir.path().join(format!("{name}-cancels"));
        let cancels_text = cancels.display().to_string();
        let fixture = HttpFixture::start_with_env(
            dir.path(),
            any_port(),
            args,
            &[("FIXTURE_CANCEL_LOG", cancels_text.as_str())],
        )
        .await?;
        sections.push_str(&remote_section(
            name,
            &fixture.url(),
            "call_timeout = \"300ms\"",
        ));
        fixtures.push((name, fixture, cancels));
    }
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for (name, _, cancels) in &fixtures {
        let sleep = json!({"name": format!("{name}__sleep"), "arguments": {"ms": 5000}});
        let expired = session.request("tools/call", sleep).await?;
        ensure!(expired["error"]["code"] == -33002, "{name}: {expired}");
        let deadline = Instant::now() + Duration::from_secs(4);
        while !std::fs::read_to_string(cancels).is_ok_and(|log| log.contains("cancelled sleep")) {
            ensure!(
                Instant::now() < deadline,
                "{name}: the upstream never saw the cancel"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    ensure!(daemon.stop().await?.success());
    drop(fixtures);
    Ok(())
}

/// Killing the HTTP server fails the call in flight with -33003 and later calls
/// with -33001 while it is down; started again on the same port, the upstream is
/// ready again without restarting plexus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_upstream_that_goes_away_fails_fast_and_comes_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Restarted on the same port below: one a reconnecting client cannot self-connect on.
    let port = SocketAddr::from(([127, 0, 0, 1], restartable_port()?));
    let fixture = HttpFixture::start(dir.path(), port, &[]).await?;
    let extra = "restart_backoff = \"200ms\"\nrestart_backoff_max = \"500ms\"\nmax_restarts = 1000";
    let daemon = Daemon::builder()
        .upstreams(remote_section("remote", &fixture.url(), extra))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let pid = daemon.pid();

    let mut sleeper = RawHttpSession::connect(&daemon.url).await?;
    let in_flight = tokio::spawn(async move {
        sleeper
            .request(
                "tools/call",
                json!({"name": "remote__sleep", "arguments": {"ms": 20000}}),
            )
            .await
    });
    daemon.wait_for_in_flight("remote", 1).await?;
    let started = Instant::now();
    let addr = fixture.kill().await?;
    let failed = tokio::time::timeout(Duration::from_secs(10), in_flight).await???;
    ensure!(failed["error"]["code"] == -33003, "{failed}");
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "the call in flight was not failed promptly"
    );

    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let echo = json!({"name": "remote__echo", "arguments": {"text": "anyone?"}});
    // Refused at once on each try, across the daemon's attempts to reconnect:
    // the next call waits for one more attempt to have been made.
    let restarts = r#"plexus_upstream_restarts_total{upstream="remote"}"#;
    for _ in 0..3 {
        let down = session.request("tools/call", echo.clone()).await?;
        ensure!(down["error"]["code"] == -33001, "{down}");
        ensure!(down["error"]["data"]["upstream"] == "remote", "{down}");
        let tried = daemon.metric(restarts).await?.unwrap_or(0.0);
        eventually(Duration::from_secs(10), async || {
            let now = daemon.metric(restarts).await?.unwrap_or(0.0);
            ensure!(now > tried, "no attempt to reconnect after {tried}");
            Ok(())
        })
        .await?;
    }

    let _fixture = HttpFixture::start(dir.path(), addr, &[]).await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let back = session.request("tools/call", echo).await?;
    ensure!(text_of(&back["result"]) == "anyone?", "{back}");
    ensure!(daemon.pid() == pid);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A server that redirects (307 or 308) on its own origin, as one mounted at
/// `/mcp/` answers `/mcp`, is followed, for every request (its session's GET stream
/// too) and is served, a relative `Location` (`../mcp`) resolved as RFC 3986 says; a redirect to another origin is not followed (every request
/// carries the configured headers), and the upstream's error says where it points.
/// A URL that answers a web page has an error that names its content type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_followed_on_the_same_origin_only() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let requests = dir.path().join("requests.jsonl");
    let log = requests.display().to_string();
    let fixture = HttpFixture::start(dir.path(), any_port(), &["--request-log", &log]).await?;
    let base = fixture.url().trim_end_matches("/mcp").to_string();
    let sections = format!(
        "{}{}{}{}",
        remote_section("moved", &format!("{base}/moved"), ""),
        remote_section("forgood", &format!("{base}/moved-for-good"), ""),
        remote_section("relative", &format!("{base}/deep/moved"), ""),
        remote_section(
            "away",
            &format!("{base}/away"),
            "restart_backoff = \"100ms\""
        ),
    ) + &remote_section("page", &format!("{base}/page"), "");
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for upstream in ["moved", "forgood", "relative"] {
        let echo = json!({"name": format!("{upstream}__echo"), "arguments": {"text": upstream}});
        loop {
            let answer = session.request("tools/call", echo.clone()).await?;
            if text_of(&answer["result"]) == upstream {
                break;
            }
            ensure!(Instant::now() < deadline, "{upstream}: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // All reached `/mcp` with their POSTs, and a GET for their sessions' streams.
    let at_mcp = |method: &str| {
        request_log(&requests)
            .iter()
            .filter(|line| line["path"] == "/mcp" && line["method"] == method)
            .count()
    };
    plexus_tests::eventually(Duration::from_secs(10), async || {
        ensure!(at_mcp("GET") >= 3, "{:?}", request_log(&requests));
        Ok(())
    })
    .await?;
    ensure!(at_mcp("POST") >= 6);
    // Both have failed a first start by now (they began with the others); read
    // again until their errors are there, whatever the timing.
    let mut status = Value::Null;
    for _ in 0..100 {
        let (_, text) = daemon.admin_get("/status").await?;
        status = serde_json::from_str(&text)?;
        let failed = |name: &str| {
            status["upstreams"].as_array().is_some_and(|all| {
                all.iter()
                    .any(|upstream| upstream["name"] == name && upstream["last_error"].is_string())
            })
        };
        if failed("page") && failed("away") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upstream = |name: &str| {
        status["upstreams"]
            .as_array()
            .and_then(|all| all.iter().find(|upstream| upstream["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let page = upstream("page");
    ensure!(
        page["last_error"]
            .as_str()
            .is_some_and(|error| error.contains("(text/html) is not JSON")),
        "{page}"
    );
    let away = upstream("away");
    ensure!(away["state"] != "ready", "{away}");
    let error = away["last_error"].as_str().unwrap_or_default();
    ensure!(
        error.contains("http://localhost:") && error.contains("another origin"),
        "{away}"
    );
    ensure!(
        !request_log(&requests).iter().any(|line| line["host"]
            .as_str()
            .is_some_and(|host| host.starts_with("localhost"))),
        "a redirect to another origin was followed"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// The server ends plexus's session (here: a DELETE behind plexus's back). The
/// next request is answered 404, which closes the connection; the upstream is
/// initialized again in a new session and serves calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_is_replaced_by_a_new_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let requests = dir.path().join("requests.jsonl");
    let log_arg = requests.display().to_string();
    let fixture = HttpFixture::start(dir.path(), any_port(), &["--request-log", &log_arg]).await?;
    let extra = "restart_backoff = \"200ms\"\nrestart_backoff_max = \"500ms\"";
    let daemon = Daemon::builder()
        .upstreams(remote_section("remote", &fixture.url(), extra))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let first = request_log(&requests)
        .iter()
        .find_map(|line| line["session"].as_str().map(str::to_string))
        .context("no session in the request log")?;
    let deleted = reqwest::Client::new()
        .delete(fixture.url())
        .header("mcp-session-id", &first)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await?;
    ensure!(
        deleted.status().is_success(),
        "DELETE: {}",
        deleted.status()
    );

    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let echo = json!({"name": "remote__echo", "arguments": {"text": "again"}});
    let lost = session.request("tools/call", echo.clone()).await?;
    ensure!(lost["error"]["code"] == -33001, "{lost}");
    // The upstream backs off, then reconnects: the call is retried as the error says
    // a client may (readiness polled right after the loss can still be the old one).
    let deadline = Instant::now() + Duration::from_secs(20);
    let back = loop {
        let answer = session.request("tools/call", echo.clone()).await?;
        let error = &answer["error"];
        if error.is_null() || Instant::now() > deadline {
            break answer;
        }
        ensure!(
            error["code"] == -33001 && error["data"]["retryable"] == true,
            "{answer}"
        );
        let wait = error["data"]["retry_after_ms"].as_u64().unwrap_or(100);
        tokio::time::sleep(Duration::from_millis(wait.clamp(10, 1000))).await;
    };
    ensure!(text_of(&back["result"]) == "again", "{back}");
    ensure!(
        daemon
            .log()
            .contains("the upstream ended the session (HTTP 404)"),
        "{}",
        daemon.log()
    );
    let sessions: std::collections::BTreeSet<String> = request_log(&requests)
        .iter()
        .filter_map(|line| line["session"].as_str().map(str::to_string))
        .collect();
    ensure!(sessions.len() == 2, "{sessions:?}");
    ensure!(daemon.stop().await?.success());
    drop(fixture);
    Ok(())
}

/// A Python SDK server on the 2024-11-05 HTTP+SSE transport: reached with
/// `transport = "sse"` (and the `initialize` handshake), and found by `auto` when
/// the POST of streamable HTTP is refused (that server then negotiates 2026-07-28
/// over the same transport). The configured header reaches the server's POSTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_sse_upstream_is_relayed() -> anyhow::Result<()> {
    let Some((_server, port)) = start_python_sse_server(&[]).await? else {
        return Ok(());
    };
    let url = format!("http://127.0.0.1:{port}/sse");
    let sections = format!(
        "{}{}",
        remote_section(
            "legacy",
            &url,
            "transport = \"sse\"\nprotocol = \"handshake\"\nheaders = { X-Tenant = \"acme\" }"
        ),
        remote_section("found", &url, ""),
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = AnsweringClient::named("carol")
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    for prefix in ["legacy", "found"] {
        let echoed = call(&client, &format!("{prefix}__echo"), json!({"text": prefix})).await?;
        ensure!(text_of(&echoed) == prefix, "{echoed}");
    }
    let tenant = call(&client, "legacy__header", json!({"name": "X-Tenant"})).await?;
    ensure!(text_of(&tenant) == "acme", "{tenant}");
    ensure!(
        daemon.log().contains("serves HTTP+SSE"),
        "auto did not fall back:\n{}",
        daemon.log()
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An `https://` upstream: verified against the CA that `SSL_CERT_FILE` names,
/// and refused, saying why, when nothing vouches for its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_verified_against_trusted_certificates() -> anyhow::Result<()> {
    let certificates = tempfile::tempdir()?;
    let tls_dir = certificates.path().display().to_string();
    let Some((_server, port)) = start_python_sse_server(&["--tls-dir", &tls_dir]).await? else {
        return Ok(());
    };
    let ca = certificates.path().join("ca.pem");
    let section = remote_section(
        "secure",
        &format!("https://127.0.0.1:{port}/sse"),
        "transport = \"sse\"\nrestart_backoff = \"5s\"",
    );
    let ca_text = ca.display().to_string();
    let daemon = Daemon::builder()
        .upstreams(&section)
        .env(&[("SSL_CERT_FILE", ca_text.as_str())])
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let params = rmcp::model::CallToolRequestParams::new("secure__echo")
        .with_arguments(plexus_tests::arguments(json!({"text": "over tls"})));
    let echoed = json_of(&client.call_tool(params).await?);
    ensure!(text_of(&echoed) == "over tls", "{echoed}");
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());

    let untrusted = Daemon::builder().upstreams(&section).start().await?;
    untrusted
        .wait_for_log("certificate", Duration::from_secs(20))
        .await?;
    let (status, _) = untrusted.admin_get("/readyz").await?;
    ensure!(status != 200, "an unverified upstream counts as ready");
    ensure!(untrusted.stop().await?.success());
    Ok(())
}

/// Starts `tests/python/sse_server.py` on a free port and waits until it listens;
/// None (after saying so) when the Python SDK's venv is missing.
async fn start_python_sse_server(args: &[&str]) -> anyhow::Result<Option<(Child, u16)>> {
    let python = venv_python();
    if !python.exists() {
        eprintln!(
            "skipping: {} is missing (run scripts/ensure-python-sdk)",
            python.display()
        );
        return Ok(None);
    }
    let port = restartable_port()?;
    let server = Command::new(&python)
        .arg(workspace_root().join("tests/python/sse_server.py"))
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the Python HTTP+SSE server")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        ensure!(
            Instant::now() < deadline,
            "the Python server never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Some((server, port)))
}

/// A tool whose schema mirrors a parameter into a header (`x-mcp-header`):
/// plexus checks the header a 2026-07-28 client sends against the body, and
/// sends it, encoded, to a 2026-07-28 HTTP upstream for clients of either era.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrored_parameters_are_checked_and_reach_a_2026_http_upstream() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("requests.jsonl");
    let log_arg = log.display().to_string();
    let upstream = HttpFixture::start(
        dir.path(),
        any_port(),
        &["--name", "geo", "--modern", "--request-log", &log_arg],
    )
    .await?;
    let daemon = Daemon::builder()
        .upstreams(remote_section(
            "geo",
            &upstream.url(),
            "protocol = \"2026-07-28\"",
        ))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;

    let client = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let call = |region: &str, header: Option<&str>, text: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "geo__regional", "arguments": {"region": region, "text": text}, "_meta": meta}});
        let mut request = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "geo__regional")
            .body(body.to_string());
        if let Some(header) = header {
            request = request.header("mcp-param-region", header);
        }
        async move {
            let (status, body, _) = plexus_tests::answer_of(request.send().await?).await?;
            anyhow::Ok((status, body))
        }
    };

    let (status, answer) = call("eu-west", Some("eu-west"), "hi").await?;
    ensure!(status == 200, "{status} {answer}");
    ensure!(text_of(&answer["result"]) == "eu-west: hi", "{answer}");
    let (status, answer) = call("eu-west", None, "hi").await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "missing: {status} {answer}"
    );
    let (status, answer) = call("eu-west", Some("us-east"), "hi").await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "mismatched: {status} {answer}"
    );
    // Not plain ASCII: the base64 form, decoded before comparing.
    let (status, answer) = call("Zürich", Some("=?base64?WsO8cmljaA==?="), "hi").await?;
    ensure!(status == 200, "{status} {answer}");
    ensure!(text_of(&answer["result"]) == "Zürich: hi", "{answer}");
    // Arguments of kilobytes pass through plexus unread, but not to a tool that
    // mirrors them: the headers are checked against them.
    let long = "long ".repeat(400);
    let (status, answer) = call("eu-west", Some("us-east"), &long).await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "mismatched, long: {status} {answer}"
    );
    let (status, answer) = call("eu-west", Some("eu-west"), &long).await?;
    ensure!(status == 200, "long: {status} {answer}");
    ensure!(
        text_of(&answer["result"]) == format!("eu-west: {long}"),
        "{answer}"
    );

    // A handshake-era client sends no such header: plexus computes it for the upstream.
    let legacy =
        plexus_tests::http_client(&daemon.url, plexus_tests::TestClient::default()).await?;
    let result = legacy
        .call_tool(
            rmcp::model::CallToolRequestParams::new("geo__regional").with_arguments(
                plexus_tests::arguments(json!({"region": "ap-south", "text": long})),
            ),
        )
        .await?;
    ensure!(
        text_of(&plexus_tests::json_of(&result)) == format!("ap-south: {long}"),
        "{}",
        plexus_tests::json_of(&result)
    );
    legacy.cancel().await?;

    let sent: Vec<Value> = request_log(&log)
        .into_iter()
        .filter(|line| line["mcp_name"] == "regional")
        .collect();
    let regions: Vec<&str> = sent
        .iter()
        .filter_map(|line| line["mcp_param_region"].as_str())
        .collect();
    ensure!(
        regions == ["eu-west", "=?base64?WsO8cmljaA==?=", "eu-west", "ap-south"],
        "headers the upstream got: {sent:?}"
    );
    ensure!(daemon.stop().await?.success());
    drop(upstream);
    Ok(())
}

/// A password in a remote upstream's URL becomes Basic authentication and is never
/// logged; the downstream client's bearer token and cookies never reach an upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_become_basic_auth_and_client_credentials_stay_home() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let requests = dir.path().join("requests.jsonl");
    let requests_arg = requests.display().to_string();
    // user `ops`, password `p@ss:word`: Basic b3BzOnBAc3M6d29yZA==
    let fixture = HttpFixture::start(
        dir.path(),
        any_port(),
        &[
            "--require-header",
            "Authorization: Basic b3BzOnBAc3M6d29yZA==",
            "--request-log",
            &requests_arg,
        ],
    )
    .await?;
    let url = format!("http://ops:p%40ss%3Aword@{}/mcp", fixture.addr);
    let token = "client-bearer-token-0123456789";
    let daemon = Daemon::builder()
        .daemon("auth_tokens = { laptop = \"${CLIENT_TOKEN}\" }")
        .upstreams(remote_section("remote", &url, ""))
        .env(&[("CLIENT_TOKEN", token)])
        .start()
        .await?;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        let response = client
            .get(format!("{}/readyz", daemon.admin))
            .send()
            .await?;
        if response.status() == 200 {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        ready,
        "the upstream never accepted the URL's credentials\n{}",
        daemon.log()
    );
    let bearer = format!("Bearer {token}");
    let mut session = plexus_tests::RawHttpSession::connect_with(
        &daemon.url,
        &[
            ("authorization", bearer.as_str()),
            ("cookie", "plexus-test=cookie-secret"),
        ],
    )
    .await?;
    let called = session
        .request(
            "tools/call",
            json!({"name": "remote__echo", "arguments": {"text": "through"}}),
        )
        .await?;
    ensure!(text_of(&called["result"]) == "through", "{called}");
    let log = daemon.log();
    for secret in ["p%40ss", "p@ss", token, "cookie-secret"] {
        ensure!(
            !log.contains(secret),
            "`{secret}` reached plexus's log:\n{log}"
        );
    }
    ensure!(
        log.contains(&format!("http://{}/mcp", fixture.addr)),
        "{log}"
    );
    ensure!(daemon.stop().await?.success());
    let seen = request_log(&requests);
    ensure!(!seen.is_empty(), "the fixture logged no request");
    for line in &seen {
        ensure!(
            line["authorization"] == "Basic b3BzOnBAc3M6d29yZA==",
            "{line}"
        );
        ensure!(
            line["cookie"].is_null(),
            "a client's cookie reached the upstream: {line}"
        );
    }
    drop(fixture);
    Ok(())
}

/// A server that writes two JSON-RPC messages on separate lines in one
/// `application/json` body (a notification, then the reply) is understood: each
/// message is taken as it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_messages_in_one_json_body_are_each_taken() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = HttpFixture::start(
        dir.path(),
        any_port(),
        &["--stateless-json", "--lines-body"],
    )
    .await?;
    let daemon = Daemon::builder()
        .upstreams(remote_section("lines", &fixture.url(), ""))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let answer = session
        .request(
            "tools/call",
            json!({"name": "lines__echo", "arguments": {"text": "both lines"}}),
        )
        .await?;
    ensure!(text_of(&answer["result"]) == "both lines", "{answer}");
    ensure!(daemon.stop().await?.success());
    drop(fixture);
    Ok(())
}

/// A line break in JSON can only be spacing between tokens, but what plexus relays
/// unread must fit on one line: an HTTP upstream's pretty-printed answer reaches a
/// stdio client as one line, and an HTTP client's pretty-printed call of kilobytes
/// reaches a stdio upstream as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretty_printed_json_is_relayed_on_one_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pretty = HttpFixture::start(
        dir.path(),
        any_port(),
        &["--name", "pretty", "--stateless-json", "--pretty"],
    )
    .await?;
    let sections = format!(
        "{}{}",
        remote_section("pretty", &pretty.url(), "transport = \"streamable-http\""),
        plexus_tests::fixture_upstream("fx", "", &[]),
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let long = "long ".repeat(400);

    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for upstream in ["fx", "pretty"] {
        let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": format!("{upstream}__echo"), "arguments": {"text": long}}});
        let answer = session.post_raw(&serde_json::to_vec_pretty(&call)?).await?;
        ensure!(
            text_of(&answer["result"]) == long,
            "{upstream}: {:.300}",
            answer.to_string()
        );
    }

    let config = daemon.stdio_config(&sections)?;
    let config = config.display().to_string();
    let mut stdio = plexus_tests::RawStdioSession::spawn(
        &plexus_tests::plexus_binary(),
        &["serve", "--stdio", "--config", &config],
    )
    .await?;
    // The stdio daemon starts its upstreams once initialized.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = stdio.request("tools/list", json!({})).await?;
        let tools = listed["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if tools.iter().any(|tool| tool["name"] == "pretty__echo") {
            break;
        }
        ensure!(Instant::now() < deadline, "never listed: {listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for text in ["short", long.as_str()] {
        let answer = stdio
            .request(
                "tools/call",
                json!({"name": "pretty__echo", "arguments": {"text": text}}),
            )
            .await?;
        ensure!(
            text_of(&answer["result"]) == text,
            "{:.300}",
            answer.to_string()
        );
    }
    stdio.close().await;
    ensure!(daemon.stop().await?.success());
    Ok(())
}
