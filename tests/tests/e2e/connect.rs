//! `plexus connect`: an rmcp client of each era launches the bridge, which relays to
//! a running daemon's HTTP front; the daemon is killed and started again mid-session
//! (a call in flight then gets -33003) and the next call succeeds.

use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::answering::{call, AnsweringClient};
use plexus_tests::{
    fixture_upstream, plexus_binary, restartable_port, venv_python, workspace_root, Daemon,
};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use serde_json::json;

fn connect_command(url: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(plexus_binary());
    command.args(["connect", url]).env("PLEXUS_LOG", "warn");
    command
}

/// Calls `fx__echo` until it answers (the bridge reconnects behind the client's back).
/// The bridge with its stdin and the lines of its stdout, for a test that writes
/// raw lines.
fn piped_bridge(
    url: &str,
) -> anyhow::Result<(
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
)> {
    use tokio::io::AsyncBufReadExt;
    let mut bridge = connect_command(url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = bridge.stdin.take().context("stdin")?;
    let lines = tokio::io::BufReader::new(bridge.stdout.take().context("stdout")?).lines();
    Ok((bridge, stdin, lines))
}

async fn echo_once_back(
    client: &plexus_tests::answering::AnsweringService,
    text: &str,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match call(client, "fx__echo", json!({"text": text})).await {
            Ok(answer) if answer.to_string().contains(text) => return Ok(()),
            outcome => {
                ensure!(
                    std::time::Instant::now() < deadline,
                    "the call never succeeded after the restart: {outcome:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_client_survives_a_daemon_restart_through_connect() -> anyhow::Result<()> {
    let port = restartable_port()?;
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://{listen}/mcp");
    let section = fixture_upstream("fx", "", &[]);
    let daemon = Daemon::builder()
        .listen(&listen)
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let handler = AnsweringClient::named("bridged");
    let client = handler
        .clone()
        .serve(TokioChildProcess::new(connect_command(&url))?)
        .await?;
    let tools = client.list_all_tools().await?;
    ensure!(
        tools.iter().any(|tool| tool.name == "fx__echo"),
        "{tools:?}"
    );
    ensure!(call(&client, "fx__echo", json!({"text": "before"}))
        .await?
        .to_string()
        .contains("before"));
    // A server-to-client request and its answer pass through the bridge.
    let asked = call(&client, "fx__ask", json!({"kind": "sampling"})).await?;
    ensure!(
        asked.to_string().contains(&handler.sampled_text()),
        "{asked}"
    );

    // The daemon dies with a call in flight, and comes back on the same port.
    let in_flight = {
        let peer = client.peer().clone();
        tokio::spawn(async move {
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("fx__sleep".to_string())
                    .with_arguments(plexus_tests::arguments(json!({"ms": 10000}))),
            )
            .await
        })
    };
    daemon.wait_for_in_flight("fx", 1).await?;
    let dir = daemon.kill().await?;
    let lost = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .context("the call in flight was never answered")??;
    let error = lost
        .err()
        .context("the call in flight succeeded after a SIGKILL")?;
    ensure!(error.to_string().contains("-33003"), "{error}");
    let daemon = Daemon::builder()
        .dir(dir)
        .listen(&listen)
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    echo_once_back(&client, "after").await?;
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_survives_a_daemon_restart_through_connect() -> anyhow::Result<()> {
    let port = restartable_port()?;
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://{listen}/mcp");
    let section = fixture_upstream("fx", "", &[]);
    let daemon = Daemon::builder()
        .listen(&listen)
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let handler = AnsweringClient::named("modern-bridged").modern();
    let client = handler
        .clone()
        .serve_with_lifecycle(
            TokioChildProcess::new(connect_command(&url))?,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await?;
    let info = client.peer_info().context("no server info")?;
    ensure!(
        info.protocol_version == rmcp::model::ProtocolVersion::V_2026_07_28,
        "{:?}",
        info.protocol_version
    );
    ensure!(call(&client, "fx__echo", json!({"text": "before"}))
        .await?
        .to_string()
        .contains("before"));
    // Sampling reaches this client as an input-required round through the bridge.
    let asked = call(&client, "fx__ask", json!({"kind": "sampling"})).await?;
    ensure!(
        asked.to_string().contains(&handler.sampled_text()),
        "{asked}"
    );

    let dir = daemon.kill().await?;
    let daemon = Daemon::builder()
        .dir(dir)
        .listen(&listen)
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    echo_once_back(&client, "after").await?;
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// The Python SDK (a client written apart) through `plexus connect`, in both eras,
/// across a daemon SIGKILL and restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_survives_a_daemon_restart_through_connect() -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let root = workspace_root();
    let python = venv_python();
    if !python.exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return Ok(());
    }
    let port = restartable_port()?;
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://{listen}/mcp");
    let section = fixture_upstream("fx", "", &[]);
    let mut daemon = Daemon::builder()
        .listen(&listen)
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    for mode in ["auto", "legacy"] {
        let mut script = tokio::process::Command::new(&python)
            .arg(root.join("tests/python/connect_client.py"))
            .args(["--mode", mode, "--"])
            .arg(plexus_binary())
            .args(["connect", &url])
            .env("PYTHONUNBUFFERED", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = script.stdin.take().context("stdin")?;
        let mut lines = tokio::io::BufReader::new(script.stdout.take().context("stdout")?).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the script never got ready")??;
        ensure!(ready.as_deref() == Some("ready"), "{mode}: {ready:?}");
        let dir = daemon.kill().await?;
        daemon = Daemon::builder()
            .dir(dir)
            .listen(&listen)
            .upstreams(&section)
            .start()
            .await?;
        daemon.wait_ready(Duration::from_secs(20)).await?;
        stdin.write_all(b"go\n").await?;
        let verdict = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the script never finished")??;
        let output = script.wait_with_output().await?;
        ensure!(
            verdict
                .as_deref()
                .is_some_and(|line| line.starts_with("ok")),
            "{mode}: {verdict:?}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Everything a session carries passes through the bridge, in each era: server-to-
/// client requests and their answers (sampling, elicitation in both modes, roots),
/// progress and cancellation, against server-everything and the fixture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_relays_requests_progress_and_cancellation_in_each_era() -> anyhow::Result<()> {
    use plexus_tests::answering::{exercise_common, fixture_with_cancel_log};
    let logs = tempfile::tempdir()?;
    let cancel_log = logs.path().join("cancels");
    let sections = format!(
        "[upstreams.everything]\nnpx = \"@modelcontextprotocol/server-everything@2026.8.31\"\ninit_timeout = \"180s\"\n\n{}",
        fixture_with_cancel_log(&cancel_log)
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    let handshake = AnsweringClient::named("bridged-old");
    let client = handshake
        .clone()
        .serve(TokioChildProcess::new(connect_command(&daemon.url))?)
        .await?;
    exercise_common(&client, &handshake, &cancel_log).await?;
    client.cancel().await?;
    let modern = AnsweringClient::named("bridged-new").modern();
    let client = modern
        .clone()
        .serve_with_lifecycle(
            TokioChildProcess::new(connect_command(&daemon.url))?,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await?;
    exercise_common(&client, &modern, &cancel_log).await?;
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A client that writes its `initialize` and its first call at once still gets the
/// call answered in the session the `initialize` opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_after_initialize_wait_for_its_session() -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let (_bridge, mut stdin, mut lines) = piped_bridge(&daemon.url)?;
    let burst = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "hasty", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "fx__echo", "arguments": {"text": "at once"}}}),
    ]
    .iter()
    .map(|message| format!("{message}\n"))
    .collect::<String>();
    stdin.write_all(burst.as_bytes()).await?;
    let mut answered = None;
    while answered.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .context("no answer to the call")??
            .context("the bridge ended")?;
        let message: serde_json::Value = serde_json::from_str(&line)?;
        if message["id"] == 2 {
            answered = Some(message);
        }
    }
    let answer = answered.context("no answer")?;
    ensure!(
        answer["result"]["content"][0]["text"] == "at once",
        "{answer}"
    );
    drop(stdin);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// What a client writes reaches the daemon however it is written: a line that is
/// not UTF-8 is answered with a parse error and the bridge goes on; a 2026-07-28
/// client's call of a tool that mirrors a parameter into a header gets that
/// header (the daemon refuses the call without it); a large call's arguments,
/// passed on as the client wrote them, come back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_passes_calls_on_as_written() -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &["--modern"]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let (_bridge, mut stdin, mut lines) = piped_bridge(&daemon.url)?;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let large = "é\"\\x".repeat(64 * 1024);
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "fx__regional", "arguments": {"region": "eu-west", "text": "hi"}, "_meta": meta}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "fx__echo", "arguments": {"text": large}, "_meta": meta}}),
        // Large arguments a header mirrors: read by the bridge for the header only.
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "fx__regional", "arguments": {"text": large, "region": "eu-north"}, "_meta": meta}}),
    ];
    let mut next = async || -> anyhow::Result<serde_json::Value> {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .context("no answer")??
            .context("the bridge ended")?;
        Ok(serde_json::from_str(&line)?)
    };
    stdin.write_all(b"\xff\xfe not UTF-8\n").await?;
    let refused = next().await?;
    ensure!(refused["error"]["code"] == -32700, "{refused}");
    // JSON that is no JSON-RPC message is answered as the daemon answers it (the
    // bridge dropped a batch, a bare response and the like unanswered).
    for (not_rpc, id) in [
        (
            json!([{"jsonrpc": "2.0", "id": 9, "method": "ping"}]),
            json!(null),
        ),
        (
            json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}),
            json!(null),
        ),
        (
            json!({"jsonrpc": "1.0", "id": 10, "method": "ping"}),
            json!(10),
        ),
        (json!({"jsonrpc": "2.0", "id": 11}), json!(11)),
    ] {
        stdin.write_all(format!("{not_rpc}\n").as_bytes()).await?;
        let refused = next().await?;
        ensure!(
            refused["error"]["code"] == -32600 && refused["id"] == id,
            "{not_rpc}: {refused}"
        );
    }
    for message in &messages {
        stdin.write_all(format!("{message}\n").as_bytes()).await?;
        let answer = next().await?;
        ensure!(answer["id"] == message["id"], "{answer}");
        ensure!(answer.get("error").is_none(), "{answer}");
        match message["id"].as_i64() {
            Some(2) => ensure!(
                answer["result"]["content"][0]["text"] == "eu-west: hi",
                "{answer}"
            ),
            Some(3) => ensure!(
                answer["result"]["content"][0]["text"] == large.as_str(),
                "the large echo came back changed"
            ),
            Some(4) => ensure!(
                answer["result"]["content"][0]["text"] == format!("eu-north: {large}").as_str(),
                "the large regional call came back changed"
            ),
            _ => {}
        }
    }
    drop(stdin);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Requests the daemon refused for want of a valid token, from its metrics.
async fn unauthorized_requests(daemon: &Daemon) -> anyhow::Result<u64> {
    let (_, text) = daemon.admin_get("/metrics").await?;
    Ok(text
        .lines()
        .find_map(|line| {
            line.strip_prefix("plexus_http_refused_requests_total{reason=\"unauthorized\"} ")
        })
        .map_or(Ok(0), str::parse)?)
}

/// A bridge whose token is wrong or missing says so on stderr in one line naming
/// the fix, answers `initialize` (and what follows) with the error under the
/// client's id, asks the daemon no more, and exits 77 once the client leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_the_daemon_refuses_says_so_and_exits_77() -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let daemon = Daemon::builder()
        .daemon("auth_tokens = { laptop = \"${PLEXUS_TEST_TOKEN}\" }")
        .upstreams(fixture_upstream("fx", "", &[]))
        .env(&[("PLEXUS_TEST_TOKEN", "the-right-token-0123456789")])
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let mut refused_before = unauthorized_requests(&daemon).await?;
    for (case, token) in [
        ("a wrong token", Some("not-the-token-0123456789")),
        ("no token", None),
    ] {
        let mut command = connect_command(&daemon.url);
        command.env_remove("PLEXUS_TOKEN");
        if let Some(token) = token {
            command.env("PLEXUS_TOKEN", token);
        }
        let mut bridge = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = bridge.stdin.take().context("stdin")?;
        let mut lines = tokio::io::BufReader::new(bridge.stdout.take().context("stdout")?).lines();
        let mut stderr = bridge.stderr.take().context("stderr")?;
        let mut next = async || -> anyhow::Result<serde_json::Value> {
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .context("no answer")??
                .context("the bridge ended")?;
            Ok(serde_json::from_str(&line)?)
        };
        let initialize = json!({"jsonrpc": "2.0", "id": "init-1", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "refused", "version": "0"}}});
        stdin
            .write_all(format!("{initialize}\n").as_bytes())
            .await?;
        let answer = next().await?;
        ensure!(answer["id"] == "init-1", "{case}: {answer}");
        ensure!(answer["error"]["code"] == -32600, "{case}: {answer}");
        ensure!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("PLEXUS_TOKEN")),
            "{case}: {answer}"
        );
        ensure!(
            answer["error"]["data"]["kind"] == "unauthorized",
            "{case}: {answer}"
        );
        // A client that asks again is answered at once, from what the bridge knows.
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        stdin.write_all(format!("{list}\n").as_bytes()).await?;
        let answer = next().await?;
        ensure!(
            answer["id"] == 2 && answer["error"]["code"] == -32600,
            "{case}: {answer}"
        );
        // Given a couple of seconds, it asks the daemon no more. A bridge that did
        // would retry on its backoff timer (100 ms, doubling), which sends no event
        // to wait for: the wait spans four such retries.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let refused = unauthorized_requests(&daemon).await?;
        println!(
            "{case}: the daemon refused {} request(s)",
            refused - refused_before
        );
        ensure!(
            (1..=2).contains(&(refused - refused_before)),
            "{case}: the daemon refused {} requests",
            refused - refused_before
        );
        refused_before = refused;
        ensure!(
            bridge.try_wait()?.is_none(),
            "{case}: the bridge ended before its client"
        );
        drop(stdin);
        let status = tokio::time::timeout(Duration::from_secs(10), bridge.wait())
            .await
            .context("the bridge did not exit after its client left")??;
        let mut said = String::new();
        stderr.read_to_string(&mut said).await?;
        println!("{case}: exit {status}, stderr: {said}");
        ensure!(status.code() == Some(77), "{case}: {status}\n{said}");
        let naming: Vec<&str> = said
            .lines()
            .filter(|line| line.contains("PLEXUS_TOKEN") && line.contains("--token-file"))
            .collect();
        ensure!(naming.len() == 1, "{case}: stderr:\n{said}");
        ensure!(
            said.lines().filter(|line| !line.trim().is_empty()).count() == 1,
            "{case}: more than one line on stderr:\n{said}"
        );
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}
