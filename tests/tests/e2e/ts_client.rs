//! plexus driven by the official TypeScript MCP SDK's client (`@modelcontextprotocol/sdk`,
//! what Claude Desktop, VS Code, Cursor and the Inspector are built on; installed into
//! `target/ts-client` by `scripts/ensure-ts-client`): `tests/ts-client/plexus_client.mjs`
//! does what a desktop client does over streamable HTTP, through `plexus connect`
//! and against `plexus serve --stdio`, and once against server-everything directly
//! so a difference points at plexus. Its one JSON line is checked field by field.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{fixture_upstream, plexus_binary, workspace_root, Daemon};
use serde_json::{json, Value};

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// The script's calls are bounded at 30 s each; this only catches a wedged run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// Small enough that every list takes several pages.
const PAGE_SIZE: usize = 7;

fn client_dir() -> PathBuf {
    workspace_root().join("target/ts-client")
}

/// Upstream sections: server-everything, and the fixture whose drift file adds a
/// tool on demand (`warn`, so the new tool is listed at once rather than held
/// until approved, as schema pins would by default).
fn sections(drift: &Path) -> String {
    format!(
        "[upstreams.everything]\nnpx = \"{EVERYTHING}\"\ninit_timeout = \"180s\"\n\n{}",
        fixture_upstream(
            "fx",
            "on_schema_change = \"warn\"",
            &[
                "--conformance",
                "--drift-file",
                &drift.display().to_string()
            ]
        )
    )
}

/// Runs the script with `args` and parses its one JSON line.
async fn run_script(label: &str, args: &[&str]) -> anyhow::Result<Value> {
    let started = Instant::now();
    let child = tokio::process::Command::new("node")
        .arg(client_dir().join("plexus_client.mjs"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting node")?;
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .with_context(|| {
            format!("{label}: the script did not finish within {SCRIPT_TIMEOUT:?}")
        })??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "{label}: exit {:?}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        output.status.code()
    );
    let line = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(line).with_context(|| {
        format!("{label}: no JSON line\n--- stdout\n{stdout}--- stderr\n{stderr}")
    })?;
    println!(
        "{label}: {:.1} s; ms per check: {}",
        started.elapsed().as_secs_f64(),
        report
            .as_object()
            .map(|checks| checks
                .iter()
                .filter_map(|(name, check)| Some(format!("{name}={}", check.get("ms")?)))
                .collect::<Vec<_>>()
                .join(" "))
            .unwrap_or_default()
    );
    Ok(report)
}

/// The entries of a check that failed outright (an exception in the script).
fn failed(report: &Value) -> Vec<String> {
    report
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, check)| Some(format!("{name}: {}", check.get("error")?)))
        .collect()
}

/// The tool schemas server-everything lists, keyed by its own names.
fn everything_schemas(report: &Value, prefix: &str) -> serde_json::Map<String, Value> {
    report["listTools"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, schema)| Some((name.strip_prefix(prefix)?.to_string(), schema.clone())))
        .collect()
}

/// Checks one run through plexus against the direct run, field by field.
fn check_through_plexus(label: &str, report: &Value, direct: &Value) -> anyhow::Result<()> {
    let failures = failed(report);
    ensure!(failures.is_empty(), "{label}: checks failed: {failures:#?}");

    let init = &report["initialize"];
    ensure!(
        init["serverInfo"]["name"] == "plexus",
        "{label}: serverInfo {}",
        init["serverInfo"]
    );
    let caps = &init["capabilities"];
    for (path, want) in [
        ("/tools/listChanged", json!(true)),
        ("/prompts/listChanged", json!(true)),
        ("/resources/listChanged", json!(true)),
        ("/resources/subscribe", json!(true)),
        ("/logging", json!({})),
        ("/completions", json!({})),
    ] {
        ensure!(
            caps.pointer(path) == Some(&want),
            "{label}: capabilities{path} should be {want} (as server-everything's are): {caps}"
        );
    }

    // Every page read, names namespaced, server-everything's schemas as it lists them.
    let tools = &report["listTools"];
    let names: Vec<&str> = tools["names"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let pages = tools["pages"].as_u64().unwrap_or(0);
    ensure!(
        pages as usize == names.len().div_ceil(PAGE_SIZE) && pages > 1,
        "{label}: {} tools over {pages} pages at page_size {PAGE_SIZE}",
        names.len()
    );
    ensure!(
        names
            .iter()
            .all(|n| n.starts_with("everything__") || n.starts_with("fx__")),
        "{label}: a name not namespaced: {names:?}"
    );
    ensure!(
        names.contains(&"fx__echo"),
        "{label}: fx__echo not listed: {names:?}"
    );
    let through = everything_schemas(report, "everything__");
    let direct_schemas = everything_schemas(direct, "");
    for (name, schema) in &direct_schemas {
        ensure!(
            through.get(name) == Some(schema),
            "{label}: {name}'s schemas differ\n direct: {schema}\n plexus: {:?}",
            through.get(name)
        );
    }

    // What the direct run got, plexus's clients get too.
    for pointer in [
        "/callTool/echo",
        "/callTool/structuredContent",
        "/progress/text",
        "/cancel/aborted",
        "/cancel/echoAfter",
        "/prompts/simple",
        "/prompts/args",
        "/complete/values",
        "/complete/narrowed",
        "/resources/count",
        "/resources/read/contents/0/mimeType",
        "/resources/read/contents/0/size",
        "/sampling/handled",
        "/sampling/answered",
        "/elicitation/handled",
        "/elicitation/fields",
        "/elicitation/accepted",
        "/logging/received",
    ] {
        ensure!(
            report.pointer(pointer) == direct.pointer(pointer),
            "{label}: {pointer} is {:?} through plexus, {:?} directly",
            report.pointer(pointer),
            direct.pointer(pointer)
        );
    }
    ensure!(
        report["callTool"]["echo"] == "Echo: héllo from typescript ✓",
        "{label}: echo {}",
        report["callTool"]["echo"]
    );
    ensure!(
        report
            .pointer("/progress/notifications")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            >= 1,
        "{label}: no progress notification: {}",
        report["progress"]
    );
    // The abort rejects the call at once (the SDK does not wait for the upstream).
    ensure!(
        report["cancel"]["rejection"]
            .as_str()
            .is_some_and(|r| r.contains("user cancelled")),
        "{label}: the aborted call rejected with {}",
        report["cancel"]["rejection"]
    );
    // Namespaced URIs and templates, read back through plexus.
    let uri = report["resources"]["read"]["uri"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        uri.starts_with("everything+demo://")
            && report["resources"]["read"]["contents"][0]["uri"] == uri,
        "{label}: read {}",
        report["resources"]["read"]
    );
    let templates: Vec<Value> = direct["resources"]["templates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| Some(json!(format!("everything+{}", t.as_str()?))))
        .collect();
    ensure!(
        report["resources"]["templates"] == json!(templates),
        "{label}: templates {}",
        report["resources"]["templates"]
    );
    ensure!(
        report["resources"]["pages"].as_u64() > Some(1)
            && report["prompts"]["pages"].as_u64() > Some(1),
        "{label}: resources and prompts in one page at page_size {PAGE_SIZE}"
    );
    ensure!(
        report["logging"]["first"]["level"].is_string(),
        "{label}: log message {}",
        report["logging"]["first"]
    );
    let changed = &report["listChanged"];
    ensure!(
        changed["received"] == true
            && changed["listedBefore"] == false
            && changed["listedAfter"] == true,
        "{label}: catalog change: {changed}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_client_does_what_a_desktop_client_does_over_http_and_stdio(
) -> anyhow::Result<()> {
    // The test command installs the SDK; a bare `cargo test` without it says what to run.
    if !client_dir()
        .join("node_modules/@modelcontextprotocol/sdk")
        .is_dir()
    {
        println!("skipped: target/ts-client missing; run scripts/ensure-ts-client");
        return Ok(());
    }
    // The installed copy resolves the SDK from target/ts-client/node_modules.
    std::fs::copy(
        workspace_root().join("tests/ts-client/plexus_client.mjs"),
        client_dir().join("plexus_client.mjs"),
    )?;

    let direct = run_script(
        "server-everything directly",
        &["--", "npx", "-y", EVERYTHING],
    )
    .await?;
    let failures = failed(&direct);
    ensure!(
        failures.is_empty(),
        "server-everything directly: {failures:#?}"
    );

    let scratch = tempfile::tempdir()?;
    let drift = scratch.path().join("drift");
    std::fs::write(&drift, "")?;
    let page_size = format!("page_size = {PAGE_SIZE}");
    let daemon = Daemon::builder()
        .daemon(page_size.clone())
        .upstreams(sections(&drift))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    let stdio_config = scratch.path().join("stdio.toml");
    std::fs::write(
        &stdio_config,
        format!(
            "[daemon]\nstate_dir = {:?}\n{page_size}\n\n{}",
            scratch.path().join("stdio-state").display().to_string(),
            sections(&drift)
        ),
    )?;
    let plexus = plexus_binary().display().to_string();
    let drift_arg = drift.display().to_string();
    let common = [
        "--prefix",
        "everything__",
        "--uri-prefix",
        "everything+",
        "--drift",
        &drift_arg,
    ];
    let stdio_config = stdio_config.display().to_string();
    let runs: [(&str, Vec<&str>); 3] = [
        ("streamable HTTP", vec!["--url", &daemon.url]),
        (
            "plexus connect",
            vec!["--", &plexus, "connect", &daemon.url],
        ),
        (
            "plexus serve --stdio",
            vec!["--", &plexus, "serve", "--stdio", "--config", &stdio_config],
        ),
    ];
    for (label, transport) in runs {
        // The drift file starts empty: the fixture lists no `exfiltrate` until the
        // script asks for it.
        std::fs::write(&drift, "")?;
        let mut args = common.to_vec();
        args.extend(transport);
        let report = run_script(label, &args).await?;
        if let Err(error) = check_through_plexus(label, &report, &direct) {
            anyhow::bail!(
                "{error:#}\n--- report\n{report}\n--- plexus log\n{}",
                daemon.log()
            );
        }
    }

    let status = daemon.stop().await?;
    ensure!(status.success(), "plexus exited with {status}");
    Ok(())
}
