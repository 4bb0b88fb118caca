//! Per-client views against a real daemon: served at `/mcp/<view>`, bound to
//! tokens, selected for stdio with `--view`; a view holds on lists, calls, prompts,
//! reads, templates, instructions, `list_changed` and the 2026-07-28 path, and a
//! reload changes it under open sessions.

use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::{fixture_upstream, http_client, Daemon, RawHttpSession, TestClient};
use rmcp::model::CallToolRequestParams;
use serde_json::{json, Value};

const LAPTOP: &str = "laptop-token-0123456789abcdef";
const CI: &str = "ci-token-0123456789abcdefghij";

fn upstreams(alpha_drift: &std::path::Path, beta_drift: &std::path::Path) -> String {
    let alpha = fixture_upstream(
        "alpha",
        "on_schema_change = \"warn\"",
        &["--drift-file", &alpha_drift.display().to_string()],
    );
    let beta = fixture_upstream(
        "beta",
        "on_schema_change = \"warn\"",
        &[
            "--name",
            "secret-beta",
            "--drift-file",
            &beta_drift.display().to_string(),
        ],
    );
    format!("{alpha}\n{beta}")
}

const VIEWS: &str = r#"
[views.ci]
upstreams = ["alpha"]
tools = ["alpha__echo", "alpha__sleep", "alpha__whoami"]

[views.docs]
tools = ["nothing-at-all"]
prompts = ["alpha__*"]
resources = ["alpha+fixture://items/*"]
"#;

/// Opens a session at `path` with `token` and lists its tools (through `/mcp`: the
/// session's view holds whatever path later requests use).
async fn tools_at(
    client: &reqwest::Client,
    mcp: &str,
    path: &str,
    token: &str,
) -> anyhow::Result<(u16, Vec<String>, Option<String>)> {
    let response = client
        .post(path)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}}})
            .to_string(),
        )
        .send()
        .await?;
    let status = response.status().as_u16();
    let Some(session) = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return Ok((status, Vec::new(), None));
    };
    let listed: Value = client
        .post(mcp)
        .bearer_auth(token)
        .header("mcp-session-id", &session)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .send()
        .await?
        .json()
        .await?;
    let mut names: Vec<String> = listed["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    Ok((status, names, Some(session)))
}

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    let mut names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_holds_on_every_path_over_http() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (alpha_drift, beta_drift) = (dir.path().join("alpha"), dir.path().join("beta"));
    std::fs::write(&alpha_drift, "")?;
    std::fs::write(&beta_drift, "")?;
    let daemon = Daemon::builder()
        .upstreams(format!("{}\n{VIEWS}", upstreams(&alpha_drift, &beta_drift)))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;

    let full_handler = TestClient::default();
    let full = http_client(&daemon.url, full_handler.clone()).await?;
    let ci_handler = TestClient::default();
    let ci = http_client(&format!("{}/ci", daemon.url), ci_handler.clone()).await?;
    let all = names(&full.list_all_tools().await?);
    ensure!(all.iter().any(|n| n == "beta__echo"), "{all:?}");
    let seen = names(&ci.list_all_tools().await?);
    ensure!(
        seen == ["alpha__echo", "alpha__sleep", "alpha__whoami"],
        "{seen:?}"
    );

    // Outside the view is unknown, exactly as if it did not exist.
    for hidden in ["alpha__add", "beta__echo"] {
        let error = ci
            .call_tool(
                CallToolRequestParams::new(hidden.to_string()).with_arguments(
                    serde_json::Map::from_iter([("text".to_string(), json!("x"))]),
                ),
            )
            .await
            .err()
            .with_context(|| format!("{hidden} was called through the view"))?;
        ensure!(
            error.to_string().contains("-32602") || error.to_string().contains("unknown tool"),
            "{hidden}: {error}"
        );
    }
    // A hidden upstream's name and instructions never appear.
    let instructions = ci
        .peer_info()
        .and_then(|info| info.instructions.clone())
        .unwrap_or_default();
    ensure!(instructions.contains("alpha"), "{instructions}");
    ensure!(!instructions.contains("beta"), "{instructions}");
    let full_instructions = full
        .peer_info()
        .and_then(|info| info.instructions.clone())
        .unwrap_or_default();
    ensure!(
        full_instructions.contains("secret-beta"),
        "{full_instructions}"
    );

    // Prompts, templates and reads in a view with resource globs.
    let mut docs = RawHttpSession::connect(&format!("{}/docs", daemon.url)).await?;
    let tools = docs.request("tools/list", json!({})).await?;
    ensure!(tools["result"]["tools"] == json!([]), "{tools}");
    let prompt = docs
        .request(
            "prompts/get",
            json!({"name": "alpha__greet", "arguments": {"name": "docs"}}),
        )
        .await?;
    ensure!(prompt.get("result").is_some(), "{prompt}");
    let templates = docs.request("resources/templates/list", json!({})).await?;
    ensure!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"] == "alpha+fixture://items/{id}",
        "{templates}"
    );
    let read = docs
        .request("resources/read", json!({"uri": "alpha+fixture://items/3"}))
        .await?;
    ensure!(read.get("result").is_some(), "{read}");
    let hidden = docs
        .request("resources/read", json!({"uri": "alpha+fixture://text"}))
        .await?;
    ensure!(hidden["error"]["code"] == -32002, "{hidden}");
    let beta_prompt = docs
        .request(
            "prompts/get",
            json!({"name": "beta__greet", "arguments": {"name": "docs"}}),
        )
        .await?;
    ensure!(beta_prompt["error"]["code"] == -32602, "{beta_prompt}");

    // The 2026-07-28 path through a view.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let response = reqwest::Client::new()
        .post(format!("{}/ci", daemon.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "alpha__add")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "alpha__add", "arguments": {"a": 1, "b": 2}, "_meta": meta}})
            .to_string(),
        )
        .send()
        .await?;
    let (_, answer, _) = plexus_tests::answer_of(response).await?;
    ensure!(answer["error"]["code"] == -32602, "{answer}");

    // list_changed only for changes the view shows: beta's new tool is news to the
    // whole catalog, not to `ci`; alpha's echo changing is news to both.
    std::fs::write(&beta_drift, "new-tool")?;
    tokio::time::timeout(
        Duration::from_secs(20),
        full_handler.tools_changed.notified(),
    )
    .await
    .context("the whole catalog's client heard no list_changed")?;
    let heard = tokio::time::timeout(
        Duration::from_millis(1500),
        ci_handler.tools_changed.notified(),
    )
    .await;
    ensure!(
        heard.is_err(),
        "the view announced a change it does not show"
    );
    std::fs::write(&alpha_drift, "description")?;
    tokio::time::timeout(Duration::from_secs(20), ci_handler.tools_changed.notified())
        .await
        .context("the view did not announce a change it shows")?;

    ci.cancel().await?;
    full.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_bind_views_stdio_selects_one_and_a_reload_changes_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (alpha_drift, beta_drift) = (dir.path().join("alpha"), dir.path().join("beta"));
    std::fs::write(&alpha_drift, "")?;
    std::fs::write(&beta_drift, "")?;
    let views = VIEWS.replace("[views.ci]\n", "[views.ci]\ntokens = [\"ci\"]\n");
    let sections = format!("{}\n{views}", upstreams(&alpha_drift, &beta_drift));
    let daemon = Daemon::builder()
        .daemon("auth_tokens = { laptop = \"${LAPTOP}\", ci = \"${CI}\" }")
        .upstreams(&sections)
        .env(&[("LAPTOP", LAPTOP), ("CI", CI)])
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let client = reqwest::Client::new();
    let ci_view = ["alpha__echo", "alpha__sleep", "alpha__whoami"];
    // A bound token sees its view on any path; an unbound one chooses by path.
    let (_, seen, ci_session) = tools_at(&client, &daemon.url, &daemon.url, CI).await?;
    ensure!(seen == ci_view, "ci at /mcp: {seen:?}");
    let (_, seen, _) = tools_at(&client, &daemon.url, &format!("{}/docs", daemon.url), CI).await?;
    ensure!(seen == ci_view, "ci at /mcp/docs: {seen:?}");
    let (_, seen, _) =
        tools_at(&client, &daemon.url, &format!("{}/ci", daemon.url), LAPTOP).await?;
    ensure!(seen == ci_view, "laptop at /mcp/ci: {seen:?}");
    let (_, seen, _) = tools_at(&client, &daemon.url, &daemon.url, LAPTOP).await?;
    ensure!(
        seen.len() > ci_view.len() && seen.iter().any(|n| n == "beta__echo"),
        "laptop at /mcp: {seen:?}"
    );
    let (status, _, _) = tools_at(
        &client,
        &daemon.url,
        &format!("{}/nope", daemon.url),
        LAPTOP,
    )
    .await?;
    ensure!(status == 404, "an unknown view answered {status}");

    // stdio with --view.
    let stdio = daemon.stdio_config(&format!(
        "{}\n{VIEWS}",
        upstreams(&alpha_drift, &beta_drift)
    ))?;
    let mut command = plexus_tests::plexus_stdio_command(&stdio);
    command.args(["--view", "ci"]);
    let stdio_client = rmcp::ServiceExt::serve(
        TestClient::default(),
        rmcp::transport::TokioChildProcess::new(command)?,
    )
    .await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = names(&stdio_client.list_all_tools().await?);
        if seen == ci_view {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "stdio --view ci: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stdio_client.cancel().await?;

    // A reload widens the view under the open session, which keeps its view.
    let config_path = daemon.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config_path)?;
    std::fs::write(
        &config_path,
        text.replace(
            "tools = [\"alpha__echo\", \"alpha__sleep\", \"alpha__whoami\"]",
            "tools = [\"alpha__echo\", \"alpha__add\"]",
        ),
    )?;
    daemon.reload().await?;
    let session = ci_session.context("no ci session")?;
    let listed: Value = client
        .post(&daemon.url)
        .bearer_auth(CI)
        .header("mcp-session-id", &session)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).to_string())
        .send()
        .await?
        .json()
        .await?;
    let mut seen: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    seen.sort();
    ensure!(
        seen == ["alpha__add", "alpha__echo"],
        "after the reload: {listed}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
