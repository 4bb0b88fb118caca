//! HAProxy (the shipped `packaging/haproxy/haproxy.cfg`) in front of three plexus
//! nodes of one `[cluster]` on loopback, round robin with no affinity unless said:
//! sessions, a server-to-client sampling request and a paused round whose retry
//! lands on another node all complete; a node killed with SIGKILL loses only its
//! own sessions (404, the client starts over) and comes back; a rolling restart
//! under load from two clients loses no call. The figures (forwarded share with
//! and without affinity, a forwarded request's added latency, throughput with 1,
//! 2 and 3 nodes) are printed, never asserted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::answering::{call, AnsweringClient};
use plexus_tests::balancer::Balancer;
use plexus_tests::cluster::TestCluster;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// Three nodes and HAProxy, or None (and a note) where HAProxy is not installed.
async fn balanced(
    nodes: usize,
    affinity: bool,
    daemon_lines: &str,
) -> anyhow::Result<Option<(TestCluster, Balancer, tempfile::TempDir)>> {
    let cluster = TestCluster::start(nodes, daemon_lines, "").await?;
    let dir = tempfile::tempdir()?;
    let Some(balancer) = Balancer::start(&cluster, affinity, dir.path()).await? else {
        println!("skipped: haproxy is not installed; run scripts/ensure-haproxy");
        return Ok(None);
    };
    Ok(Some((cluster, balancer, dir)))
}

/// Forwarded requests, summed over the running nodes.
async fn forwarded(cluster: &TestCluster, outcome: &str) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for node in &cluster.nodes {
        if let Some(daemon) = &node.daemon {
            let series =
                format!("plexus_cluster_forwarded_requests_total{{outcome=\"{outcome}\"}}");
            total += daemon.metric(&series).await?.unwrap_or(0.0);
        }
    }
    Ok(total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_sampling_and_paused_rounds_complete_through_round_robin() -> anyhow::Result<()> {
    let Some((cluster, balancer, _dir)) = balanced(3, false, "").await? else {
        return Ok(());
    };
    // A handshake-era client: its session's requests, its GET stream and its
    // answer to the upstream's sampling request each land anywhere.
    let handler = AnsweringClient::named("legacy");
    let transport = StreamableHttpClientTransport::from_uri(balancer.url());
    let client = handler.clone().serve(transport).await?;
    for round in 0..6 {
        let sum = call(&client, "fx__add", json!({"a": round, "b": 1})).await?;
        ensure!(sum["structuredContent"]["sum"] == round + 1, "{sum}");
    }
    let asked = call(&client, "fx__ask", json!({"kind": "sampling"})).await?;
    ensure!(
        asked["content"][0]["text"] == handler.sampled_text().as_str(),
        "{asked}\n{}",
        cluster.logs()
    );
    let before = forwarded(&cluster, "ok").await?;
    ensure!(
        before >= 4.0,
        "round robin forwarded only {before} requests"
    );
    client.cancel().await?;

    // A 2026-07-28 client: the round's retry goes to the next node, which sends it
    // to the one holding the paused call.
    let handler = AnsweringClient::named("modern").modern();
    let client = handler.connect_modern(&balancer.url()).await?;
    for kind in ["sampling", "roots"] {
        let start = forwarded(&cluster, "ok").await?;
        let asked = call(&client, "fx__ask", json!({ "kind": kind })).await?;
        let expected = if kind == "roots" {
            handler.root()
        } else {
            handler.sampled_text()
        };
        ensure!(
            asked["content"][0]["text"] == expected.as_str(),
            "{kind}: {asked}\n{}",
            cluster.logs()
        );
        let retries = forwarded(&cluster, "ok").await? - start;
        println!("a {kind} round through round robin: {retries} request(s) forwarded");
    }
    client.cancel().await?;
    Ok(())
}

/// A handshake-era session over raw HTTP that starts over when its session is gone.
struct Steady {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
    next: i64,
}

/// What one call came to.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    /// The session was unknown (404): the client opened another and called again.
    StartedOver,
}

impl Steady {
    fn new(url: String) -> Steady {
        Steady {
            http: reqwest::Client::new(),
            url,
            session: None,
            next: 0,
        }
    }

    async fn post(&self, body: &Value) -> anyhow::Result<(u16, Option<String>, Value)> {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .timeout(Duration::from_secs(30))
            .body(body.to_string());
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = response.text().await?;
        let json = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .next_back()
            .unwrap_or(&text);
        Ok((
            status,
            session,
            serde_json::from_str(json).unwrap_or(Value::String(text.clone())),
        ))
    }

    async fn open(&mut self) -> anyhow::Result<()> {
        self.session = None;
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "steady", "version": "0"}}});
        let (status, session, body) = self.post(&hello).await?;
        ensure!(status == 200, "initialize: {status} {body}");
        self.session = Some(session.context("no session id")?);
        let (status, _, body) = self
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        ensure!(status == 202, "initialized: {status} {body}");
        Ok(())
    }

    /// One `fx__add`; a 404 (the session's node is gone) opens a new session and
    /// calls again, as the spec tells a client to.
    async fn call(&mut self) -> anyhow::Result<Outcome> {
        self.next += 1;
        let id = self.next;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "fx__add", "arguments": {"a": id, "b": 1}}});
        let mut outcome = Outcome::Done;
        for _ in 0..3 {
            if self.session.is_none() {
                self.open().await?;
            }
            let (status, _, body) = self.post(&request).await?;
            if status == 404 {
                ensure!(
                    body["error"]["code"] == -32600,
                    "a 404 without a JSON-RPC error: {body}"
                );
                self.session = None;
                outcome = Outcome::StartedOver;
                continue;
            }
            ensure!(status == 200, "call {id}: {status} {body}");
            ensure!(
                body["result"]["structuredContent"]["sum"] == id + 1,
                "call {id}: {body}"
            );
            return Ok(outcome);
        }
        anyhow::bail!("call {id}: three sessions in a row were lost")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_only_its_own_sessions_and_comes_back() -> anyhow::Result<()> {
    let Some((mut cluster, balancer, _dir)) = balanced(3, false, "").await? else {
        return Ok(());
    };
    // A session on each node (opened on the node itself), used through the balancer.
    let mut sessions = Vec::new();
    for index in 0..3 {
        let mut session = Steady::new(cluster.url(index));
        session.open().await?;
        session.url = balancer.url();
        ensure!(session.call().await? == Outcome::Done);
        sessions.push(session);
    }
    cluster.kill(1).await?;
    // n2's session: unknown wherever its next request lands (404, a JSON-RPC error),
    // within the forward's connect bound; never another session's answer.
    for _ in 0..3 {
        let started = Instant::now();
        let request = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
            "params": {"name": "fx__add", "arguments": {"a": 1, "b": 1}}});
        let (status, _, body) = sessions[1].post(&request).await?;
        ensure!(
            status == 404 && body["error"]["code"] == -32600,
            "{status} {body}"
        );
        ensure!(body.get("result").is_none(), "{body}");
        println!(
            "a killed node's session: 404 in {:?}: {}",
            started.elapsed(),
            body["error"]["message"]
        );
    }
    // The others see nothing of it.
    for index in [0, 2] {
        for _ in 0..6 {
            ensure!(
                sessions[index].call().await? == Outcome::Done,
                "n{}'s session",
                index + 1
            );
        }
    }
    // Its client starts over, and is served.
    ensure!(sessions[1].call().await? == Outcome::StartedOver);
    cluster.boot(1, &[]).await?;
    cluster.nodes[1]
        .daemon()?
        .wait_ready(Duration::from_secs(30))
        .await?;
    // Back, with a fresh table: sessions on it work again, through the balancer too.
    let mut fresh = Steady::new(cluster.url(1));
    fresh.open().await?;
    fresh.url = balancer.url();
    for _ in 0..6 {
        ensure!(fresh.call().await? == Outcome::Done);
        for session in &mut sessions {
            ensure!(session.call().await? == Outcome::Done);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_no_call() -> anyhow::Result<()> {
    let Some((mut cluster, balancer, _dir)) = balanced(3, false, "drain_timeout = \"2s\"").await?
    else {
        return Ok(());
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started_over = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let url = balancer.url();
        let stop = stop.clone();
        let started_over = started_over.clone();
        clients.spawn(async move {
            let mut client = Steady::new(url);
            let mut calls = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if client.call().await? == Outcome::StartedOver {
                    started_over.fetch_add(1, Ordering::Relaxed);
                }
                calls += 1;
            }
            anyhow::Ok(calls)
        });
    }
    let rolling = Instant::now();
    for index in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = cluster.stop(index).await?;
        ensure!(status.success(), "n{} exited {status}", index + 1);
        cluster.boot(index, &[]).await?;
        cluster.nodes[index]
            .daemon()?
            .wait_ready(Duration::from_secs(30))
            .await?;
        // Back in the balancer's rotation (its health check passes) before the next goes.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    while let Some(client) = clients.join_next().await {
        calls += client?.with_context(|| cluster.logs())?;
    }
    println!(
        "rolling restart of 3 nodes in {:?}: {calls} calls from 2 clients, none lost; {} started a new session",
        rolling.elapsed(),
        started_over.load(Ordering::Relaxed)
    );
    ensure!(calls > 50, "only {calls} calls");
    Ok(())
}

/// The median of `samples`.
fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Pins a node and its upstream's processes to CPU 0, so that every cluster size
/// gets the same CPU, and HAProxy and the load the other one.
fn pin_to_cpu0(pid: u32) -> anyhow::Result<()> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for pid in
        std::iter::once(pid.to_string()).chain(children.split_whitespace().map(str::to_string))
    {
        let status = std::process::Command::new("taskset")
            .args(["-a", "-c", "-p", "0", &pid])
            .stdout(std::process::Stdio::null())
            .status()?;
        ensure!(status.success(), "taskset {pid}");
    }
    Ok(())
}

/// Calls per second from `clients` sessions through `url` for `during`.
async fn throughput(url: &str, clients: usize, during: Duration) -> anyhow::Result<f64> {
    let mut set = tokio::task::JoinSet::new();
    let until = Instant::now() + during;
    for _ in 0..clients {
        let url = url.to_string();
        set.spawn(async move {
            let mut client = Steady::new(url);
            client.open().await?;
            let mut calls = 0usize;
            while Instant::now() < until {
                client.call().await?;
                calls += 1;
            }
            anyhow::Ok(calls)
        });
    }
    let mut calls = 0;
    while let Some(done) = set.join_next().await {
        calls += done??;
    }
    Ok(calls as f64 / during.as_secs_f64())
}

/// The figures: printed, never asserted (a loaded 2-core machine varies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_forwarded_share_forwarding_latency_and_throughput_by_node_count(
) -> anyhow::Result<()> {
    let Some((cluster, _, dir)) = balanced(3, false, "worker_threads = 1").await? else {
        return Ok(());
    };
    let all = [0, 1, 2];
    // Forwarded share: 12 sessions of 10 calls each, with and without affinity.
    for affinity in [false, true] {
        let balancer = Balancer::start_with(&cluster, &all, affinity, dir.path())
            .await?
            .context("haproxy")?;
        let before = forwarded(&cluster, "ok").await?;
        let mut requests = 0;
        for _ in 0..12 {
            let mut client = Steady::new(balancer.url());
            client.open().await?;
            for _ in 0..10 {
                ensure!(client.call().await? == Outcome::Done);
            }
            requests += 12;
        }
        let share = (forwarded(&cluster, "ok").await? - before) / requests as f64;
        println!(
            "figure: forwarded share through HAProxy round robin, {} affinity: {:.1}% of {requests} requests",
            if affinity { "with" } else { "without" },
            share * 100.0
        );
    }
    // A forwarded request's added latency: one session's calls at its own node, then through another.
    let mut client = Steady::new(cluster.url(0));
    client.open().await?;
    let (mut direct, mut via) = (Vec::with_capacity(300), Vec::with_capacity(300));
    for round in 0..600 {
        client.url = cluster.url(if round % 2 == 0 { 0 } else { 1 });
        let started = Instant::now();
        ensure!(client.call().await? == Outcome::Done);
        if round % 2 == 0 {
            &mut direct
        } else {
            &mut via
        }
        .push(started.elapsed());
    }
    let (direct, via) = (p50(&mut direct), p50(&mut via));
    println!(
        "figure: tools/call p50 at the session's node {direct:?}, forwarded from another {via:?}: +{:?}, x{:.2}",
        via.saturating_sub(direct),
        via.as_secs_f64() / direct.as_secs_f64()
    );
    // Throughput with 1, 2 and 3 nodes, all on CPU 0 (one worker thread each):
    // equal total CPU; HAProxy and the 8 clients on CPU 1.
    for node in &cluster.nodes {
        pin_to_cpu0(node.daemon()?.pid().context("pid")?)?;
    }
    for count in 1..=3 {
        let balancer = Balancer::start_with(&cluster, &all[..count], true, dir.path())
            .await?
            .context("haproxy")?;
        if let Some(pid) = balancer.pid() {
            let _ = std::process::Command::new("taskset")
                .args(["-a", "-c", "-p", "1", &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .status();
        }
        let rate = throughput(&balancer.url(), 8, Duration::from_secs(2)).await?;
        println!("figure: throughput with {count} node(s) on one CPU, 8 clients through HAProxy with affinity: {rate:.0} calls/s");
    }
    Ok(())
}

/// The official Python SDK's client (`tests/python/plexus_client.py`, both eras)
/// passes through the balancer as it does against one node, the 2026-07-28
/// subscription check included: its `subscriptions/listen` stream and the call
/// that makes an `everything` process send updates land on different nodes, and
/// the listen is heard on every node. But for the 2026-07-28 logging check: the
/// toggle of simulated logging is the state of one node's `everything` process,
/// and the call that would log lands on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_client_passes_through_round_robin() -> anyhow::Result<()> {
    use plexus_tests::{venv_python, workspace_root};
    if !venv_python().exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return Ok(());
    }
    let everything = "[upstreams.everything]\nnpx = \"@modelcontextprotocol/server-everything@2026.8.31\"\ninit_timeout = \"180s\"\n";
    let cluster = TestCluster::start(3, "", everything).await?;
    let dir = tempfile::tempdir()?;
    let Some(balancer) = Balancer::start(&cluster, false, dir.path()).await? else {
        println!("skipped: haproxy is not installed; run scripts/ensure-haproxy");
        return Ok(());
    };
    for mode in ["legacy", "auto"] {
        let started = Instant::now();
        let output = tokio::process::Command::new(venv_python())
            .arg(workspace_root().join("tests/python/plexus_client.py"))
            .args(["--mode", mode, "--url", &balancer.url()])
            // Three nodes, each with its own npx upstream, on a loaded 2-core
            // machine: the connect's 1 s budget for one node is left room here.
            .args(["--connect-budget", "5"])
            .args(if mode == "auto" {
                &["--skip", "logging"][..]
            } else {
                &[]
            })
            .env("PYTHONUNBUFFERED", "1")
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(600), output).await??;
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        ensure!(
            output.status.success(),
            "python client ({mode}) through HAProxy:\n{report}\n{}",
            cluster.logs()
        );
        println!(
            "python client ({mode}) through HAProxy round robin, 3 nodes: passed in {:.1} s, {} forwarded",
            started.elapsed().as_secs_f64(),
            forwarded(&cluster, "ok").await?
        );
    }
    Ok(())
}
