//! The audit trail against a real daemon: one line per call (ok, isError, an
//! upstream error, a timeout, an unknown tool), prompt, read and client-bound
//! request, and per schema change and approval; arguments hashed, never written;
//! no secret in the trail or the log; mode 0600; reopened on reload (logrotate).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::answering::{call, AnsweringClient};
use plexus_tests::{eventually, fixture_upstream, plexus_binary, Daemon, RawHttpSession};
use registry::fingerprint;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

const SECRET_ARGUMENT: &str = "an-argument-nobody-may-read";
const TOKEN: &str = "audit-test-token-0123456789";

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The trail's line for a request naming `name`, once it is there.
pub(crate) async fn line_for(path: &Path, method: &str, name: &str) -> anyhow::Result<Value> {
    let found = |lines: &[Value]| {
        lines
            .iter()
            .find(|line| line["method"] == method && line["name"] == name)
            .cloned()
    };
    eventually(Duration::from_secs(10), async || {
        ensure!(
            found(&lines(path)).is_some(),
            "no audit line for {method} {name}: {:?}",
            lines(path)
        );
        Ok(())
    })
    .await?;
    found(&lines(path)).context("vanished")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_leaves_one_line_and_no_secret() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift = dir.path().join("drift");
    std::fs::write(&drift, "")?;
    let section = fixture_upstream(
        "fx",
        "call_timeout = \"400ms\"\nmax_call_timeout = \"400ms\"",
        &["--drift-file", &drift.display().to_string()],
    );
    let daemon = Daemon::builder()
        .daemon("audit_log = \"audit.jsonl\"")
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let trail = daemon.dir.path().join("audit.jsonl");

    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let calls = [
        ("fx__echo", json!({"text": SECRET_ARGUMENT}), json!("ok")),
        // Arguments of kilobytes pass through plexus unread, but are hashed all the same.
        (
            "fx__fail",
            json!({"message": format!("{SECRET_ARGUMENT} {}", "é\"".repeat(1024))}),
            json!("is_error"),
        ),
        (
            "fx__add",
            json!({"a": "not a number", "b": 1}),
            json!(-32602),
        ),
        ("fx__sleep", json!({"ms": 5000}), json!(-33002)),
        ("fx__nothing", json!({}), json!(-32602)),
    ];
    for (tool, arguments, _) in &calls {
        session
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await?;
    }
    session
        .request(
            "prompts/get",
            json!({"name": "fx__greet", "arguments": {"name": SECRET_ARGUMENT}}),
        )
        .await?;
    session
        .request("resources/read", json!({"uri": "fx+fixture://text"}))
        .await?;

    for (tool, arguments, outcome) in &calls {
        let line = line_for(&trail, "tools/call", tool).await?;
        ensure!(line["outcome"] == *outcome, "{tool}: {line}");
        ensure!(
            line["principal"] == "local" && line["view"].is_null(),
            "{line}"
        );
        ensure!(
            line["event"] == "request" && line["time"].is_string(),
            "{line}"
        );
        ensure!(
            line["arguments_sha256"] == fingerprint::security_hash(arguments).as_str(),
            "{tool}: the arguments' hash is not SHA-256 of their canonical JSON: {line}"
        );
        ensure!(line["duration_ms"].as_f64().is_some(), "{line}");
        ensure!(
            line["session"].as_str().is_some_and(|s| s.len() == 12),
            "{line}"
        );
        if *tool != "fx__nothing" {
            ensure!(line["upstream"] == "fx", "{line}");
            ensure!(
                line["original"] == tool.trim_start_matches("fx__"),
                "{line}"
            );
        }
    }
    let echo = line_for(&trail, "tools/call", "fx__echo").await?;
    ensure!(
        echo["response_bytes"].as_u64().is_some_and(|n| n > 0),
        "{echo}"
    );
    let prompt = line_for(&trail, "prompts/get", "fx__greet").await?;
    ensure!(
        prompt["outcome"] == "ok" && prompt["original"] == "greet",
        "{prompt}"
    );
    let read = line_for(&trail, "resources/read", "fx+fixture://text").await?;
    ensure!(
        read["outcome"] == "ok" && read["arguments_sha256"].is_null(),
        "{read}"
    );

    // A client-bound request (sampling) relayed to the calling client.
    let client = AnsweringClient::named("auditor")
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    call(&client, "fx__ask", json!({"kind": "sampling"})).await?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            lines(&trail)
                .iter()
                .any(|line| line["event"] == "client_request"
                    && line["method"] == "sampling/createMessage"
                    && line["upstream"] == "fx"
                    && line["outcome"] == "ok"),
            "no client_request line: {:?}",
            lines(&trail)
        );
        Ok(())
    })
    .await?;
    client.cancel().await?;

    // A schema change and its approval.
    std::fs::write(&drift, "description")?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            lines(&trail)
                .iter()
                .any(|line| line["event"] == "schema_change" && line["entry"] == "tools/echo"),
            "no schema_change line: {:?}",
            lines(&trail)
        );
        Ok(())
    })
    .await?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["pins", "approve", "fx/echo", "--config"])
        .arg(daemon.dir.path().join("config.toml"))
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eventually(Duration::from_secs(10), async || {
        ensure!(
            lines(&trail)
                .iter()
                .any(|line| line["event"] == "pin_approved" && line["approved"] == "echo"),
            "no pin_approved line"
        );
        Ok(())
    })
    .await?;

    let mode = std::fs::metadata(&trail)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "audit log mode {mode:o}");
    let text = std::fs::read_to_string(&trail)?;
    ensure!(
        !text.contains(SECRET_ARGUMENT),
        "an argument reached the audit log"
    );
    ensure!(
        !daemon.log().contains(SECRET_ARGUMENT),
        "an argument reached the daemon's log"
    );

    // logrotate moves the file away; a reload opens a new one.
    let rotated = daemon.dir.path().join("audit.jsonl.1");
    std::fs::rename(&trail, &rotated)?;
    daemon.reload().await?;
    session
        .request("tools/call", json!({"name": "fx__whoami", "arguments": {}}))
        .await?;
    line_for(&trail, "tools/call", "fx__whoami").await?;
    ensure!(
        !lines(&rotated)
            .iter()
            .any(|line| line["name"] == "fx__whoami"),
        "a line went to the rotated file"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_names_the_principal_and_view_never_the_token() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("audit_log = \"audit.jsonl\"\nauth_tokens = { ci = \"${CI_TOKEN}\" }")
        .upstreams(format!(
            "{}\n[views.narrow]\ntools = [\"fx__echo\"]\n",
            fixture_upstream("fx", "", &[])
        ))
        .env(&[("CI_TOKEN", TOKEN)])
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let bearer = format!("Bearer {TOKEN}");
    let mut session = RawHttpSession::connect_with(
        &format!("{}/narrow", daemon.url),
        &[("authorization", bearer.as_str())],
    )
    .await?;
    session
        .request(
            "tools/call",
            json!({"name": "fx__echo", "arguments": {"text": "x"}}),
        )
        .await?;
    let trail = daemon.dir.path().join("audit.jsonl");
    let line = line_for(&trail, "tools/call", "fx__echo").await?;
    ensure!(
        line["principal"] == "ci" && line["view"] == "narrow",
        "{line}"
    );
    let text = std::fs::read_to_string(&trail)?;
    ensure!(!text.contains(TOKEN), "the token reached the audit log");
    ensure!(
        !daemon.log().contains(TOKEN),
        "the token reached the daemon's log"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A call's line names the upstream and original name it was sent by, also when no
/// listing names it: a name the one unprefixed upstream does not list is still
/// sent there (it answers with its own error), and the line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_names_the_route_the_call_was_sent_by() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("audit_log = \"audit.jsonl\"")
        .upstreams(fixture_upstream(
            "fx",
            "prefix = \"\"\non_schema_change = \"warn\"",
            &[],
        ))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    for (name, arguments) in [("echo", json!({"text": "x"})), ("not_listed", json!({}))] {
        let answer = session
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        println!("{name}: {answer}");
    }
    let trail = daemon.dir.path().join("audit.jsonl");
    for name in ["echo", "not_listed"] {
        let line = line_for(&trail, "tools/call", name).await?;
        ensure!(
            line["upstream"] == "fx" && line["original"] == name,
            "{name}: {line}"
        );
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}
