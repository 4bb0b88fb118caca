//! `plexus status`, `GET /status`, the console's state and the process metrics, against
//! a daemon with a ready, a backing-off and a failed upstream, and with upstreams
//! of both eras (one process each); `plexus restart`; the runtime's worker threads.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    arguments, fixture_upstream, http_client, plexus_binary, Daemon, RawHttpSession, TestClient,
};
use rmcp::model::CallToolRequestParams;
use serde_json::{json, Value};

async fn plexus(args: &[&str], config: &std::path::Path) -> anyhow::Result<(i32, String)> {
    let output = tokio::process::Command::new(plexus_binary())
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .await?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

/// An upstream that exits at once, saying so on stderr with terminal escapes in
/// the line (a title, a colour), as a hostile or careless program may.
fn crashing(name: &str, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\ncommand = \"sh\"\nargs = [\"-c\", \"printf '%s is broken \\\\033]0;retitled\\\\007\\\\033[31mred\\\\n' {name} >&2; exit 3\"]\n{extra}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_ready_backing_off_and_failed_upstreams() -> anyhow::Result<()> {
    let sections = [
        fixture_upstream("good", "", &[]),
        crashing("flaky", "restart_backoff = \"30s\""),
        crashing("broken", "restart_backoff = \"50ms\"\nmax_restarts = 1"),
    ]
    .join("\n");
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    let config = daemon.dir.path().join("config.toml");
    let _session = RawHttpSession::connect(&daemon.url).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let (code, out) = plexus(&["status", "--json"], &config).await?;
        ensure!(code == 0, "status exit {code}: {out}");
        let status: Value = serde_json::from_str(&out)?;
        let state = |name: &str| {
            status["upstreams"]
                .as_array()
                .and_then(|all| all.iter().find(|u| u["name"] == name))
                .map(|u| u["state"].as_str().unwrap_or_default().to_string())
        };
        if state("good").as_deref() == Some("ready")
            && state("flaky").as_deref() == Some("backing_off")
            && state("broken").as_deref() == Some("failed")
        {
            break status;
        }
        ensure!(Instant::now() < deadline, "states never settled: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let upstream = |name: &str| {
        status["upstreams"]
            .as_array()
            .and_then(|all| all.iter().find(|u| u["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let good = upstream("good");
    ensure!(good["pid"].as_u64().is_some(), "{good}");
    ensure!(good["uptime_s"].as_f64().is_some(), "{good}");
    ensure!(
        good["entries"]["tools"].as_u64().is_some_and(|n| n >= 5),
        "{good}"
    );
    ensure!(good["protocol"] == "2025-11-25", "{good}");
    ensure!(good["pin"]["state"] == "pinned", "{good}");
    let broken = upstream("broken");
    ensure!(
        broken["restarts"].as_u64().is_some_and(|n| n >= 1),
        "{broken}"
    );
    ensure!(
        broken["last_exit"]
            .as_str()
            .is_some_and(|exit| exit.contains("exit code 3")),
        "{broken}"
    );
    ensure!(
        broken["stderr_tail"]
            .to_string()
            .contains("broken is broken"),
        "{broken}"
    );
    ensure!(upstream("flaky")["pid"].is_null());
    ensure!(
        status["daemon"]["config"] == config.display().to_string(),
        "{status}"
    );
    ensure!(
        status["daemon"]["config_sha256"]
            .as_str()
            .is_some_and(|sha| sha.len() == 64),
        "{status}"
    );
    ensure!(status["sessions"]["http"]["local"] == 1, "{status}");

    // The table for people.
    let (code, table) = plexus(&["status"], &config).await?;
    ensure!(code == 0, "{table}");
    for needle in [
        "UPSTREAM",
        "good",
        "ready",
        "backing_off",
        "failed",
        "broken is broken",
        "sessions: http local=1",
        // The upstream's escapes are shown, not sent to the terminal.
        r"\u{1b}]0;retitled\u{7}",
    ] {
        ensure!(table.contains(needle), "no `{needle}` in\n{table}");
    }
    ensure!(
        !table.contains(['\u{1b}', '\u{7}']),
        "terminal escapes reached the table:\n{table:?}"
    );
    // The console (its page, and the state it renders), and the metrics operators expect.
    let (status_code, page) = daemon.admin_get("/").await?;
    ensure!(
        status_code == 200 && page.contains("<script src=\"/console/app.js\" defer></script>"),
        "{page}"
    );
    ensure!(
        page.matches("<script").count() == 1,
        "the page carries an inline script: {page}"
    );
    let (_, state) = daemon.admin_get("/console/state").await?;
    ensure!(
        state.contains("\"broken\"") && state.contains("broken is broken"),
        "{state}"
    );
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    for needle in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "plexus_build_info{version=\"",
    ] {
        ensure!(metrics.contains(needle), "no {needle} in /metrics");
    }

    // plexus restart starts the failed one again now.
    let (code, out) = plexus(&["restart", "broken"], &config).await?;
    ensure!(code == 0, "restart: {out}");
    let restarted = async {
        loop {
            let (_, out) = plexus(&["status", "--json"], &config).await?;
            let status: Value = serde_json::from_str(&out)?;
            let broken = status["upstreams"]
                .as_array()
                .and_then(|all| all.iter().find(|u| u["name"] == "broken"))
                .context("no broken upstream")?
                .clone();
            if broken["restarts"].as_u64() > upstream("broken")["restarts"].as_u64() {
                return Ok::<_, anyhow::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), restarted)
        .await
        .context("plexus restart did not start the upstream again")??;
    ensure!(daemon.stop().await?.success());

    // No daemon: exit 69.
    let (code, _) = plexus(&["status"], &config).await?;
    ensure!(code == 69, "status without a daemon exited {code}");
    Ok(())
}

/// The shipped Grafana dashboard is valid JSON and charts only metrics plexus defines.
#[test]
fn the_grafana_dashboard_charts_metrics_that_exist() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        root.join("packaging/grafana/plexus-dashboard.json"),
    )?)?;
    let defined = std::fs::read_to_string(root.join("daemon/src/metrics.rs"))?;
    let mut charted = 0;
    for panel in dashboard["panels"].as_array().context("panels")? {
        for target in panel["targets"].as_array().context("targets")? {
            let expr = target["expr"].as_str().context("expr")?;
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(base) = word.strip_prefix("plexus_") {
                    let name = format!("plexus_{base}");
                    let name = name.strip_suffix("_bucket").unwrap_or(&name);
                    ensure!(
                        defined.contains(&format!("\"{name}\"")),
                        "{name} is not a plexus metric"
                    );
                    charted += 1;
                }
            }
        }
    }
    ensure!(charted >= 15, "only {charted} metric references");
    Ok(())
}

/// One process per shared upstream, whatever era its clients speak: a handshake-era
/// client's calls and a 2026-07-28 client's reach the same process of each
/// upstream, and the status shows that one, with the era it is spoken to in
/// (`protocol = "auto"`: 2026-07-28 wherever `server/discover` offers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_one_process_per_shared_upstream() -> anyhow::Result<()> {
    let sections = [
        fixture_upstream("plain", "", &[]),
        fixture_upstream("sdk", "", &["--modern", "--discover-modern-only"]),
        fixture_upstream(
            "strict",
            "",
            &["--modern", "--discover-modern-only", "--refuse-handshake"],
        ),
    ]
    .join("\n");
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let config = daemon.dir.path().join("config.toml");
    let status_of = || async {
        let (code, out) = plexus(&["status", "--json"], &config).await?;
        ensure!(code == 0, "status exit {code}: {out}");
        Ok::<Value, anyhow::Error>(serde_json::from_str(&out)?)
    };
    let process = |status: &Value, name: &str| {
        status["upstreams"]
            .as_array()
            .and_then(|all| all.iter().find(|u| u["name"] == name))
            .map(|u| {
                (
                    u["pid"].as_u64(),
                    u["protocol"].clone(),
                    u.get("handshake_twin").is_some(),
                )
            })
    };
    let before = status_of().await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let client = reqwest::Client::new();
    for upstream in ["plain", "sdk", "strict"] {
        let echo = session
            .request(
                "tools/call",
                json!({"name": format!("{upstream}__echo"), "arguments": {"text": "hi"}}),
            )
            .await?;
        ensure!(echo["result"]["content"][0]["text"] == "hi", "{echo}");
        // The same call from a 2026-07-28 client: no session, `_meta` on the request.
        let name = format!("{upstream}__echo");
        let modern = client
            .post(&daemon.url)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", &name)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": name, "arguments": {"text": "hi"},
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {},
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    },
                }}),
            )
            .send()
            .await?
            .text()
            .await?;
        ensure!(modern.contains(r#""text":"hi""#), "{upstream}: {modern}");
    }
    let after = status_of().await?;
    for (upstream, protocol) in [
        ("plain", "2025-11-25"),
        ("sdk", "2026-07-28"),
        ("strict", "2026-07-28"),
    ] {
        let (pid, spoken, twin) = process(&after, upstream).context(upstream)?;
        ensure!(
            pid.is_some() && spoken == protocol && !twin,
            "{upstream}: {after}"
        );
        ensure!(
            process(&before, upstream).map(|p| p.0) == Some(pid),
            "{upstream}: its process changed\nbefore {before}\nafter {after}"
        );
    }
    let log = daemon.log();
    ensure!(
        log.matches("upstream initialized").count() == 3,
        "a process more than one per upstream started\n{log}"
    );
    let (code, table) = plexus(&["status"], &config).await?;
    ensure!(
        code == 0 && !table.contains("twin"),
        "status exit {code}: {table}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// `[daemon] worker_threads` sizes the runtime: `plexus_runtime_worker_threads`
/// reports what runs (one per core when the key is absent), and a daemon on one
/// worker lists and relays as one on several.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_runs_the_worker_threads_the_config_asks_for() -> anyhow::Result<()> {
    let per_core = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(threads) => threads.parse()?,
        Err(_) => std::thread::available_parallelism()?.get(),
    };
    for (daemon_extra, threads) in [
        ("worker_threads = 1".to_string(), 1),
        ("worker_threads = 3".to_string(), 3),
        (String::new(), per_core),
    ] {
        let daemon = Daemon::builder()
            .daemon(&daemon_extra)
            .upstreams(fixture_upstream("fx", "", &[]))
            .start()
            .await?;
        daemon.wait_ready(Duration::from_secs(30)).await?;
        let (_, metrics) = daemon.admin_get("/metrics").await?;
        let line = format!("plexus_runtime_worker_threads {threads}");
        ensure!(
            metrics.lines().any(|have| have == line),
            "no `{line}` in /metrics of a daemon with `{daemon_extra}`:\n{metrics}"
        );
        let client = http_client(&daemon.url, TestClient::default()).await?;
        let tools = client.list_all_tools().await?;
        ensure!(
            tools.iter().any(|tool| tool.name == "fx__echo"),
            "{tools:?}"
        );
        let text = format!("on {threads} workers");
        let result = client
            .call_tool(
                CallToolRequestParams::new("fx__echo")
                    .with_arguments(arguments(json!({ "text": text }))),
            )
            .await?;
        ensure!(
            serde_json::to_value(&result)?["content"][0]["text"] == text.as_str(),
            "{result:?}"
        );
        client.cancel().await?;
        ensure!(daemon.stop().await?.success());
    }
    Ok(())
}
