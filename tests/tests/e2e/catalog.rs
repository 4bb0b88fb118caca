//! One daemon fronting two fixture instances, `@modelcontextprotocol/server-everything`
//! (npx) and `mcp-server-time` (uvx): an rmcp client over HTTP and another over
//! stdio each see one namespaced catalog and reach every upstream through it.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    arguments, eventually, fixture_upstream, http_client, json_of, stdio_client, tool_names,
    Client, Daemon, TestClient,
};
use rmcp::model::{CallToolRequestParams, GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::{json, Value};

/// Cold `npx` and `uvx` installs take tens of seconds.
const STARTUP_BUDGET: Duration = Duration::from_secs(240);

fn sections() -> String {
    format!(
        "{}{}{}",
        fixture_upstream("alpha", "", &["--name", "alpha"]),
        fixture_upstream("beta", "prefix = \"b\"", &["--name", "beta"]),
        r#"
[upstreams.everything]
npx = "@modelcontextprotocol/server-everything@2026.8.31"
init_timeout = "180s"

[upstreams.time]
uvx = "mcp-server-time@2026.10.19"
args = ["--local-timezone=UTC"]
init_timeout = "180s"
"#
    )
}

const EXPECTED_TOOLS: &[&str] = &[
    "alpha__echo",
    "alpha__add",
    "alpha__whoami",
    "b__echo",
    "b__whoami",
    "everything__echo",
    "everything__get-sum",
    "time__get_current_time",
    "time__convert_time",
];

/// Waits until the catalog holds every upstream's tools (upstreams join it as they start).
async fn wait_for_catalog(client: &Client) -> anyhow::Result<Vec<String>> {
    eventually(STARTUP_BUDGET, async || {
        let names = tool_names(client).await?;
        ensure!(
            EXPECTED_TOOLS
                .iter()
                .all(|name| names.iter().any(|n| n == name)),
            "catalog incomplete: {names:?}"
        );
        Ok(names)
    })
    .await
}

async fn call(client: &Client, name: &str, args: Value) -> anyhow::Result<Value> {
    let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments(args));
    Ok(json_of(&client.call_tool(params).await?))
}

/// Lists all four kinds and calls a tool, reads a resource and gets a prompt on each
/// upstream that has them.
async fn exercise(client: &Client) -> anyhow::Result<()> {
    let names = wait_for_catalog(client).await?;
    for name in &names {
        ensure!(
            ["alpha__", "b__", "everything__", "time__"]
                .iter()
                .any(|p| name.starts_with(p)),
            "tool {name} is not namespaced"
        );
        ensure!(
            name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        );
    }

    // Tools: each call reaches the upstream that owns the name.
    let who = call(client, "alpha__whoami", json!({})).await?;
    ensure!(who["content"][0]["text"] == "alpha", "{who}");
    let who = call(client, "b__whoami", json!({})).await?;
    ensure!(who["content"][0]["text"] == "beta", "{who}");
    let sum = call(client, "alpha__add", json!({"a": 2, "b": 40})).await?;
    ensure!(sum["structuredContent"]["sum"] == 42, "{sum}");
    let echo = call(
        client,
        "everything__echo",
        json!({"message": "through plexus"}),
    )
    .await?;
    ensure!(
        echo["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("through plexus")),
        "{echo}"
    );
    let time = call(client, "time__get_current_time", json!({"timezone": "UTC"})).await?;
    ensure!(time["isError"] != true, "{time}");
    ensure!(time.to_string().contains("UTC"), "{time}");

    // Prompts.
    let prompts: Vec<String> = client
        .list_all_prompts()
        .await?
        .into_iter()
        .map(|p| p.name.to_string())
        .collect();
    for expected in ["alpha__greet", "b__greet", "everything__simple-prompt"] {
        ensure!(
            prompts.iter().any(|p| p == expected),
            "{expected} missing from {prompts:?}"
        );
    }
    let greet = json_of(
        &client
            .get_prompt(
                GetPromptRequestParams::new("b__greet")
                    .with_arguments(arguments(json!({"name": "Ada", "style": "formal"}))),
            )
            .await?,
    );
    ensure!(
        greet["messages"][0]["content"]["text"] == "Good day, Ada.",
        "{greet}"
    );
    let simple = json_of(
        &client
            .get_prompt(GetPromptRequestParams::new("everything__simple-prompt"))
            .await?,
    );
    ensure!(
        simple["messages"].as_array().is_some_and(|m| !m.is_empty()),
        "{simple}"
    );

    // Resources and templates, namespaced by the URI rule.
    let resources: Vec<Value> = client
        .list_all_resources()
        .await?
        .iter()
        .map(json_of)
        .collect();
    let uris: Vec<&str> = resources.iter().filter_map(|r| r["uri"].as_str()).collect();
    for expected in [
        "alpha+fixture://text",
        "alpha+fixture://blob",
        "b+fixture://text",
    ] {
        ensure!(uris.contains(&expected), "{expected} missing from {uris:?}");
    }
    let everything_uri = uris
        .iter()
        .find(|uri| uri.starts_with("everything+"))
        .context("no everything resource listed")?
        .to_string();
    let templates: Vec<Value> = client
        .list_all_resource_templates()
        .await?
        .iter()
        .map(json_of)
        .collect();
    let template_uris: Vec<&str> = templates
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    for expected in ["alpha+fixture://items/{id}", "b+fixture://items/{id}"] {
        ensure!(
            template_uris.contains(&expected),
            "{expected} missing from {template_uris:?}"
        );
    }
    ensure!(
        template_uris.iter().any(|t| t.starts_with("everything+")),
        "{template_uris:?}"
    );

    let text = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new("alpha+fixture://text"))
            .await?,
    );
    ensure!(text["contents"][0]["text"] == "hello from alpha", "{text}");
    ensure!(
        text["contents"][0]["uri"] == "alpha+fixture://text",
        "{text}"
    );
    let item = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new("b+fixture://items/7"))
            .await?,
    );
    ensure!(item["contents"][0]["text"] == "item 7 from beta", "{item}");
    let blob = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new("b+fixture://blob"))
            .await?,
    );
    ensure!(blob["contents"][0]["blob"] == "AAECA/8=", "{blob}");
    let everything = json_of(
        &client
            .read_resource(ReadResourceRequestParams::new(everything_uri.clone()))
            .await?,
    );
    ensure!(
        everything["contents"][0]["uri"] == everything_uri.as_str(),
        "{everything}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_upstreams_over_http_and_stdio() -> anyhow::Result<()> {
    // Its fixtures' names and its uvx package are counted by other tests.
    let _census = plexus_tests::PROCESS_CENSUS.lock().await;
    let daemon = Daemon::builder().upstreams(sections()).start().await?;

    // plexus answers initialize at once, whatever the upstreams are doing.
    let started = Instant::now();
    let http = http_client(&daemon.url, TestClient::default()).await?;
    ensure!(
        started.elapsed() < Duration::from_secs(1),
        "initialize took {:?}",
        started.elapsed()
    );

    // The stdio front runs its own daemon on the same upstream sections.
    let config = daemon.stdio_config(&sections())?;
    let stdio = stdio_client(&config, TestClient::default()).await?;

    let (over_http, over_stdio) = tokio::join!(exercise(&http), exercise(&stdio));
    over_http.with_context(|| format!("over HTTP; daemon log:\n{}", daemon.log()))?;
    over_stdio.context("over stdio")?;

    let (status, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(status == 200);
    ensure!(
        metrics.contains(
            r#"plexus_relay_requests_total{method="tools/call",outcome="ok",upstream="alpha"}"#
        ),
        "{metrics}"
    );
    ensure!(
        metrics.contains(r#"plexus_upstream_up{upstream="time"} 1"#),
        "{metrics}"
    );
    ensure!(
        metrics.contains(r#"plexus_catalog_entries{kind="tools"}"#),
        "{metrics}"
    );

    http.cancel().await?;
    stdio.cancel().await?;
    let status = daemon.stop().await?;
    ensure!(status.success(), "plexus exited with {status}");
    Ok(())
}
