//! The HTTP front facing a network, against a real daemon on loopback: bearer
//! tokens and principals, Host and Origin rules (duplicates included), sessions
//! bound to their principal, session caps, the admin listener's mutating endpoints,
//! slow-header connections, and the config rule for listening beyond loopback.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{eventually, fixture_upstream, plexus_binary, Daemon};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LAPTOP: &str = "laptop-token-0123456789abcdef";
const CI: &str = "ci-token-from-a-file-0123456789";

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "front-test", "version": "0"}}})
    .to_string()
}

/// `host:port` of a URL like `http://127.0.0.1:1234/mcp`.
fn authority(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// One request written by hand (so headers can be duplicated or forged): the
/// status and the whole response text.
async fn raw_request(address: &str, head: &str, body: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(address).await?;
    let request = format!(
        "{head}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await??;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status line: {text}"))?;
    Ok((status, text))
}

/// The JSON body of a raw response.
fn body_of(text: &str) -> Value {
    text.split("\r\n\r\n")
        .nth(1)
        .and_then(|body| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null)
}

/// Waits until the MCP listener holds at least `at_least` connections open
/// (`plexus_listener_connections`): the moment the daemon has taken them.
async fn holds_connections(daemon: &Daemon, at_least: f64) -> anyhow::Result<()> {
    eventually(Duration::from_secs(10), async || {
        let open = daemon
            .metric("plexus_listener_connections{listener=\"mcp\"}")
            .await?
            .unwrap_or(0.0);
        ensure!(
            open >= at_least,
            "the listener holds {open} connections, not {at_least}"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_refuses_what_it_must_and_serves_the_rest() -> anyhow::Result<()> {
    let secrets = tempfile::tempdir()?;
    let ci_file = secrets.path().join("ci.token");
    std::fs::write(&ci_file, format!("{CI}\n"))?;
    let daemon_extra = format!(
        "auth_tokens = {{ laptop = \"${{PLEXUS_TEST_TOKEN}}\", ci = \"${{file:{}}}\" }}\n\
         allowed_hosts = [\"plexus.example\"]\nallowed_origins = [\"https://app.example\"]\n\
         max_sessions_per_principal = 4\n",
        ci_file.display()
    );
    let daemon = Daemon::builder()
        .daemon(&daemon_extra)
        .upstreams(fixture_upstream("fx", "", &[]))
        .env(&[("PLEXUS_TEST_TOKEN", LAPTOP)])
        .start()
        .await?;
    let address = authority(&daemon.url);
    let laptop = format!("Authorization: Bearer {LAPTOP}\r\n");
    let body = initialize_body();

    // (case, the request line and headers, expected status, text the response holds)
    let host = format!("Host: {address}\r\n");
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("no token", format!("POST /mcp HTTP/1.1\r\n{host}"), 401, "WWW-Authenticate: Bearer realm=\"plexus\""),
        ("a wrong token", format!("POST /mcp HTTP/1.1\r\n{host}Authorization: Bearer not-a-token-at-all-000\r\n"), 401, "error=\"invalid_token\""),
        ("a valid token", format!("POST /mcp HTTP/1.1\r\n{host}{laptop}"), 200, "mcp-session-id"),
        ("a foreign Host", format!("POST /mcp HTTP/1.1\r\nHost: evil.example\r\n{laptop}"), 403, "host not allowed"),
        ("a look-alike Host", format!("POST /mcp HTTP/1.1\r\nHost: localhost.evil.example\r\n{laptop}"), 403, "host not allowed"),
        ("an allowed Host", format!("POST /mcp HTTP/1.1\r\nHost: plexus.example\r\n{laptop}"), 200, "mcp-session-id"),
        ("a foreign Origin", format!("POST /mcp HTTP/1.1\r\n{host}Origin: https://evil.example\r\n{laptop}"), 403, "origin not allowed"),
        ("Origin null", format!("POST /mcp HTTP/1.1\r\n{host}Origin: null\r\n{laptop}"), 403, "origin not allowed"),
        ("an allowed Origin", format!("POST /mcp HTTP/1.1\r\n{host}Origin: https://app.example\r\n{laptop}"), 200, "mcp-session-id"),
        ("two Origins", format!("POST /mcp HTTP/1.1\r\n{host}Origin: http://localhost\r\nOrigin: https://evil.example\r\n{laptop}"), 400, "more than one Origin"),
        ("two Hosts", format!("POST /mcp HTTP/1.1\r\n{host}Host: evil.example\r\n{laptop}"), 400, ""),
        ("an unsupported protocol version", format!("POST /mcp HTTP/1.1\r\n{host}{laptop}MCP-Protocol-Version: 1999-01-01\r\n"), 400, "-32022"),
    ];
    for (case, head, status, holds) in cases {
        let (got, text) = raw_request(&address, &head, &body).await?;
        ensure!(got == status, "{case}: {got}, wanted {status}\n{text}");
        // Header names arrive lowercased.
        ensure!(
            text.to_ascii_lowercase()
                .contains(&holds.to_ascii_lowercase()),
            "{case}: no `{holds}` in\n{text}"
        );
        if status == 401 {
            ensure!(
                body_of(&text)["error"]["data"]["kind"] == "unauthorized",
                "{case}: {text}"
            );
        }
    }
    // An oversized body is refused from its declared length.
    let (got, text) = raw_request(
        &address,
        &format!("POST /mcp HTTP/1.1\r\n{host}{laptop}Content-Length: 5000000\r\n"),
        "",
    )
    .await?;
    ensure!(got == 413 || got == 400, "oversized: {text}");

    // A session belongs to its principal: another principal's token meets 404.
    let client = reqwest::Client::new();
    let open = |token: &'static str| {
        client
            .post(&daemon.url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
    };
    let response = open(LAPTOP).await?;
    ensure!(response.status() == 200);
    let session = response
        .headers()
        .get("mcp-session-id")
        .context("no session id")?
        .to_str()?
        .to_string();
    let list = |token: &'static str| {
        client
            .post(&daemon.url)
            .bearer_auth(token)
            .header("mcp-session-id", &session)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
            .send()
    };
    ensure!(
        list(CI).await?.status() == 404,
        "another principal used the session"
    );
    ensure!(list(LAPTOP).await?.status() == 200);
    let delete = |token: &'static str| {
        client
            .delete(&daemon.url)
            .bearer_auth(token)
            .header("mcp-session-id", &session)
            .send()
    };
    ensure!(
        delete(CI).await?.status() == 404,
        "another principal ended the session"
    );
    ensure!(delete(LAPTOP).await?.status() == 204);
    ensure!(
        list(LAPTOP).await?.status() == 404,
        "a deleted session answered"
    );

    // Sessions per principal: the table opened three, one more fits, then 429.
    ensure!(open(LAPTOP).await?.status() == 200);
    let refused = open(LAPTOP).await?;
    ensure!(refused.status() == 429, "{}", refused.status());
    let answer: Value = refused.json().await?;
    ensure!(answer["error"]["code"] == -33004, "{answer}");
    ensure!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_sessions_per_principal")),
        "{answer}"
    );
    ensure!(
        open(CI).await?.status() == 200,
        "another principal is not limited by laptop's sessions"
    );

    // Tokens never reach the log.
    let log = daemon.log();
    ensure!(
        !log.contains(LAPTOP) && !log.contains(CI),
        "a token was logged:\n{log}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_guards_its_changes() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let admin = authority(&daemon.admin);
    let body = r#"{"upstream": "fx"}"#;
    for (case, head, status) in [
        (
            "a cross-origin approval",
            format!(
                "POST /pins/approve HTTP/1.1\r\nHost: {admin}\r\nOrigin: http://localhost:3000\r\n"
            ),
            403,
        ),
        (
            "a cross-origin reset",
            format!(
                "POST /pins/reset HTTP/1.1\r\nHost: {admin}\r\nOrigin: https://evil.example\r\n"
            ),
            403,
        ),
        (
            "a restart naming another port",
            "POST /upstreams/fx/restart HTTP/1.1\r\nHost: 127.0.0.1:1\r\n".to_string(),
            403,
        ),
        (
            "two Hosts",
            format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nHost: {admin}\r\n"),
            400,
        ),
        (
            "a foreign Host",
            "GET /metrics HTTP/1.1\r\nHost: evil.example\r\n".to_string(),
            403,
        ),
        (
            "metrics on loopback",
            format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\n"),
            200,
        ),
        (
            "the pins on loopback",
            format!("GET /pins HTTP/1.1\r\nHost: {admin}\r\n"),
            200,
        ),
    ] {
        let (got, text) = raw_request(&admin, &head, body).await?;
        ensure!(got == status, "{case}: {got}, wanted {status}\n{text}");
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_while_others_are_served() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("header_read_timeout = \"1s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let address = authority(&daemon.url);
    // Five clients that send one byte of a request every 300 ms, forever.
    let mut trickles = Vec::new();
    for _ in 0..5 {
        let address = address.clone();
        trickles.push(tokio::spawn(async move {
            let started = Instant::now();
            let Ok(mut stream) = TcpStream::connect(&address).await else {
                return None;
            };
            for byte in b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
                .iter()
                .cycle()
            {
                if stream.write_all(&[*byte]).await.is_err() {
                    return Some(started.elapsed());
                }
                let mut probe = [0u8; 256];
                match tokio::time::timeout(Duration::from_millis(300), stream.read(&mut probe))
                    .await
                {
                    // Closed (0 bytes) or answered: the server gave up on it.
                    Ok(Ok(_)) | Ok(Err(_)) => return Some(started.elapsed()),
                    Err(_) => {}
                }
                if started.elapsed() > Duration::from_secs(15) {
                    return None;
                }
            }
            None
        }));
    }
    // Meanwhile an ordinary client is served, once the daemon holds the trickles.
    holds_connections(&daemon, 5.0).await?;
    an_ordinary_client_is_served(&daemon).await?;
    for trickle in trickles {
        let closed_after = trickle
            .await?
            .context("a slow connection was never closed")?;
        ensure!(
            closed_after < Duration::from_secs(5),
            "closed only after {closed_after:?}"
        );
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A client that does nothing wrong gets its echo (while others misbehave).
async fn an_ordinary_client_is_served(daemon: &Daemon) -> anyhow::Result<()> {
    let mut session = plexus_tests::RawHttpSession::connect(&daemon.url).await?;
    let answer = session
        .request(
            "tools/call",
            json!({"name": "fx__echo", "arguments": {"text": "served"}}),
        )
        .await?;
    ensure!(
        answer["result"]["content"][0]["text"] == "served",
        "{answer}"
    );
    Ok(())
}

/// What a connection says within `within`, up to its end: `(answer, closed)`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(within, stream.read_to_end(&mut answer))
        .await
        .is_ok();
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_answered_and_its_connection_closed() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("body_read_timeout = \"1s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let address = authority(&daemon.url);
    let admin = authority(&daemon.admin);
    // Each listener: the headers, then part of a body that never ends.
    let mut stalled = Vec::new();
    for (address, path) in [(&address, "/mcp"), (&admin, "/pins/reset")] {
        let mut stream = TcpStream::connect(address).await?;
        stream
            .write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
                     Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
                )
                .as_bytes(),
            )
            .await?;
        stalled.push((path, Instant::now(), stream));
    }
    // Meanwhile an ordinary client is served.
    an_ordinary_client_is_served(&daemon).await?;
    for (path, started, mut stream) in stalled {
        let (answer, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
        ensure!(closed, "{path}: the connection stayed open: {answer}");
        ensure!(
            answer.starts_with("HTTP/1.1 408") && answer.contains("did not arrive within 1000ms"),
            "{path}: {answer}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(5),
            "{path}: answered after {:?}",
            started.elapsed()
        );
    }
    // A body whose framing is broken is unreadable, not too large.
    let mut stream = TcpStream::connect(&address).await?;
    stream
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
                 Accept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    ensure!(
        answer.starts_with("HTTP/1.1 400") && body_of(&answer)["error"]["code"] == -32600,
        "{answer}"
    );
    // The client is told why, down to hyper's cause, not only that reading failed.
    let message = body_of(&answer)["error"]["message"].clone();
    println!("unreadable body: {message}");
    ensure!(
        message.as_str().is_some_and(|message| message.contains(
            "the body cannot be read: error reading a body from connection: Invalid chunk size"
        )),
        "{answer}"
    );
    // The admin listener says the same.
    let mut stream = TcpStream::connect(&admin).await?;
    stream
        .write_all(
            format!(
                "POST /pins/reset HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\n\
                 Transfer-Encoding: chunked\r\n\r\nzz\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    println!("unreadable admin body: {}", body_of(&answer));
    ensure!(
        answer.starts_with("HTTP/1.1 400")
            && answer.contains(
                "the body cannot be read: error reading a body from connection: Invalid chunk size"
            ),
        "{answer}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listening_beyond_loopback_needs_tokens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[daemon]\nlisten = \"0.0.0.0:7464\"\n\n[upstreams.fx]\ncommand = \"true\"\n",
    )?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.code() == Some(64), "{stderr}");
    ensure!(
        stderr.contains("daemon.listen") && stderr.contains("auth_tokens"),
        "{stderr}"
    );
    // With a token it is valid.
    std::fs::write(
        &config,
        "[daemon]\nlisten = \"0.0.0.0:7464\"\nauth_tokens = { ops = \"a-long-enough-token-value\" }\n\n[upstreams.fx]\ncommand = \"true\"\n",
    )?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        !String::from_utf8_lossy(&output.stdout).contains("a-long-enough-token-value"),
        "the token was printed"
    );
    Ok(())
}

/// A client that connects and says nothing is held by the kernel until it speaks,
/// so it neither wakes the daemon nor takes one of its connection slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_take_no_slot() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("max_connections = 1\nheader_read_timeout = \"30s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let address = authority(&daemon.url);
    let silent = TcpStream::connect(&address).await?;
    // Time for the daemon to take the silent connection, were it given it: the
    // kernel holds a connection that has sent nothing (deferred accept), so the
    // open-connections gauge has no moment to show.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let host = format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n");
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(5),
        raw_request(&address, &host, &initialize_body()),
    )
    .await
    .context("a silent connection held the only slot")??;
    ensure!(status == 200, "{text}");
    drop(silent);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Connections beyond the cap wait while every slot serves a request; the admin
/// listener has slots of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_and_the_admin_listener_stays_reachable(
) -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("max_connections = 3\nheader_read_timeout = \"30s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let address = authority(&daemon.url);
    // Three busy connections take every slot: each has sent a request's head and
    // is slow with its body (the daemon waits for it, for `body_read_timeout`).
    let mut busy = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(&address).await?;
        stream
            .write_all(
                format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{")
                    .as_bytes(),
            )
            .await?;
        busy.push(stream);
    }
    holds_connections(&daemon, 3.0).await?;
    let host = format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n");
    let waiting = {
        let address = address.clone();
        tokio::spawn(async move { raw_request(&address, &host, &initialize_body()).await })
    };
    // Not served meanwhile: the absence of an answer is watched for half a second.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        !waiting.is_finished(),
        "a connection beyond the cap was served"
    );
    // The admin listener has slots of its own.
    let (status, _) = daemon.admin_get("/healthz").await?;
    ensure!(status == 200);
    // One busy client goes away: the waiting one is served.
    drop(busy.pop());
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), waiting).await???;
    ensure!(status == 200, "{text}");
    drop(busy);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// At the cap, a new client takes the place of the connection that has waited
/// longest without sending a whole request head: idle or slow clients cannot
/// keep it out for a `header_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_new_client_takes_the_place_of_the_oldest_idle_one() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("max_connections = 3\nheader_read_timeout = \"30s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let address = authority(&daemon.url);
    // Three idle connections take every slot: each has begun a request and gone
    // quiet (a connection that has sent nothing is still the kernel's to hold).
    let mut idle = Vec::new();
    for n in 1..=3 {
        let mut stream = TcpStream::connect(&address).await?;
        stream.write_all(b"POST /mcp HTTP/1.1\r\n").await?;
        idle.push(stream);
        // One taken before the next connects, so "the oldest" is one: the daemon
        // orders them by when it took them.
        holds_connections(&daemon, f64::from(n)).await?;
    }
    let host = format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n");
    let asked = Instant::now();
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(5),
        raw_request(&address, &host, &initialize_body()),
    )
    .await
    .context("idle connections kept a new client out")??;
    println!("served at the cap in {:?}", asked.elapsed());
    ensure!(status == 200, "{text}");
    // The oldest idle one was closed; the younger ones are still open.
    let mut byte = [0; 1];
    let oldest = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut byte)).await;
    ensure!(
        matches!(oldest, Ok(Ok(0) | Err(_))),
        "the oldest idle connection is still open: {oldest:?}"
    );
    let youngest = tokio::time::timeout(Duration::from_millis(300), idle[2].read(&mut byte)).await;
    ensure!(
        youngest.is_err(),
        "the youngest idle connection was closed: {youngest:?}"
    );
    drop(idle);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A script that runs the daemon under `ulimit` arguments (`-n 256`: soft and
/// hard; `-S -n 512`: soft only).
fn limited_plexus(dir: &std::path::Path, ulimit: &str) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("limited-plexus");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nulimit {ulimit} || exit 71\nexec {:?} \"$@\"\n",
            plexus_binary().display().to_string()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// `Max open files` of a process: (soft, hard).
fn open_files_limit(pid: u32) -> anyhow::Result<(String, String)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .context("no open files limit")?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    Ok((fields[3].to_string(), fields[4].to_string()))
}

/// At a descriptor limit of 256 that raising cannot lift, hundreds of slow
/// clients (silent, or stopped halfway through a request) neither make `accept`
/// fail nor keep a new client out: it is answered well within
/// `header_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_at_the_descriptor_limit_keep_no_one_out() -> anyhow::Result<()> {
    let scripts = tempfile::tempdir()?;
    let limited = limited_plexus(scripts.path(), "-n 256")?;
    let daemon = Daemon::builder()
        .binary(&limited)
        .daemon("header_read_timeout = \"10s\"")
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let pid = daemon.pid().context("no daemon pid")?;
    ensure!(
        open_files_limit(pid)? == ("256".to_string(), "256".to_string()),
        "{:?}",
        open_files_limit(pid)?
    );
    let cap = daemon
        .metric("plexus_listener_max_connections{listener=\"mcp\"}")
        .await?
        .context("no connection cap in the metrics")?;
    println!("descriptor limit 256: connection cap {cap}");
    ensure!(cap > 100.0 && cap < 256.0, "cap {cap}");
    ensure!(
        daemon
            .log()
            .contains("the descriptor limit caps connections at"),
        "no warning of a small budget:\n{}",
        daemon.log()
    );
    let address = authority(&daemon.url);
    let mut slow = Vec::new();
    for n in 0..615 {
        let mut stream = TcpStream::connect(&address).await?;
        if n % 3 != 0 {
            stream
                .write_all(format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n").as_bytes())
                .await?;
        }
        slow.push(stream);
    }
    // The daemon has taken what it will of the 615: its cap.
    holds_connections(&daemon, cap).await?;
    let host = format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\n");
    let asked = Instant::now();
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(5),
        raw_request(&address, &host, &initialize_body()),
    )
    .await
    .context("a new client was kept out by slow ones")??;
    let waited = asked.elapsed();
    println!("615 slow clients: a new client answered in {waited:?}");
    ensure!(status == 200, "{text}");
    // And again, a moment later, with the slow ones still there.
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(5),
        raw_request(&address, &host, &initialize_body()),
    )
    .await
    .context("a second new client was kept out")??;
    ensure!(status == 200, "{text}");
    let log = daemon.log();
    let accept_failures = log.matches("accept failed").count();
    println!("accept failures in the log: {accept_failures}");
    ensure!(
        accept_failures <= 3,
        "{accept_failures} accept failures:\n{log}"
    );
    drop(slow);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A soft descriptor limit below the hard one is raised to it at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_descriptor_limit_is_raised_to_the_hard_one() -> anyhow::Result<()> {
    let scripts = tempfile::tempdir()?;
    let limited = limited_plexus(scripts.path(), "-S -n 512")?;
    let daemon = Daemon::builder()
        .binary(&limited)
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    let pid = daemon.pid().context("no daemon pid")?;
    let (soft, hard) = open_files_limit(pid)?;
    println!("the daemon's open files limit: soft {soft}, hard {hard}");
    ensure!(soft == hard, "soft {soft}, hard {hard}");
    ensure!(soft != "512", "the hard limit is 512 here: nothing to show");
    ensure!(
        daemon.log().contains("raised the soft descriptor limit"),
        "{}",
        daemon.log()
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
