//! An operator's restart (`POST /upstreams/<name>/restart`, `plexus restart`) of a
//! serving upstream makes before it breaks: against a real daemon and real fixture
//! processes, busy clients see no failed call while the upstream is restarted over
//! and over, a call in flight finishes on the old process, the old process is gone
//! once drained, and a successor that cannot start leaves the old one serving.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    eventually, fixture_binary, fixture_upstream, http_client, plexus_binary, Daemon,
    RawHttpSession, TestClient,
};
use serde_json::{json, Value};

/// Busy clients calling at once, as in the soak that found calls failing.
const CLIENTS: usize = 6;

/// The upstream `name` as `GET /status` shows it.
async fn upstream_status(daemon: &Daemon, name: &str) -> anyhow::Result<Value> {
    let (code, body) = daemon.admin_get("/status").await?;
    ensure!(code == 200, "status {code}: {body}");
    let status: Value = serde_json::from_str(&body)?;
    status["upstreams"]
        .as_array()
        .and_then(|all| all.iter().find(|u| u["name"] == name))
        .cloned()
        .with_context(|| format!("no upstream {name} in {status}"))
}

async fn pid_of(daemon: &Daemon, name: &str) -> anyhow::Result<u64> {
    let upstream = upstream_status(daemon, name).await?;
    upstream["pid"]
        .as_u64()
        .with_context(|| format!("no pid: {upstream}"))
}

fn alive(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Clients calling `tool` in a loop until stopped; every answer is counted, and
/// every one that is not a successful result is kept.
struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Vec<String>>>>,
}

impl Load {
    async fn start(url: &str, clients: usize, call: Value) -> anyhow::Result<Load> {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for client in 0..clients {
            let mut session = RawHttpSession::connect(url).await?;
            let (stop, calls, call) = (stop.clone(), calls.clone(), call.clone());
            tasks.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    // One client also lists between calls: the catalog must never
                    // lose the upstream's tools while it restarts.
                    if client == 0 && round.is_multiple_of(4) {
                        let listed = session.request("tools/list", json!({})).await?;
                        calls.fetch_add(1, Ordering::Relaxed);
                        let listed_here = listed["result"]["tools"]
                            .as_array()
                            .is_some_and(|tools| tools.iter().any(|t| t["name"] == call["name"]));
                        if !listed_here {
                            failures.push(format!("tools/list without {}: {listed}", call["name"]));
                        }
                        continue;
                    }
                    let answer = session.request("tools/call", call.clone()).await?;
                    calls.fetch_add(1, Ordering::Relaxed);
                    let ok = answer["result"].is_object() && answer["result"]["isError"] != true;
                    if !ok {
                        failures.push(answer.to_string());
                    }
                }
                Ok(failures)
            }));
        }
        Ok(Load { stop, calls, tasks })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Waits until `more` answers beyond those counted now have come: the clients
    /// were served meanwhile.
    async fn wait_for_more(&self, more: u64) -> anyhow::Result<()> {
        let target = self.calls() + more;
        eventually(Duration::from_secs(20), async || {
            ensure!(
                self.calls() >= target,
                "{} of {target} answers",
                self.calls()
            );
            Ok(())
        })
        .await
    }

    /// Stops the clients: (answers counted, the failed ones).
    async fn finish(self) -> anyhow::Result<(u64, Vec<String>)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for task in self.tasks {
            failures.extend(task.await??);
        }
        Ok((self.calls.load(Ordering::Relaxed), failures))
    }
}

async fn restart(daemon: &Daemon, name: &str) -> anyhow::Result<(u16, Value)> {
    let response = reqwest::Client::new()
        .post(format!("{}/upstreams/{name}/restart", daemon.admin))
        .send()
        .await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    let body = serde_json::from_str(&text).with_context(|| format!("{status}: {text}"))?;
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_under_load_fail_no_call_and_leave_no_old_process() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("drain_timeout = \"20s\"")
        .upstreams(fixture_upstream("slow", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let handler = TestClient::default();
    let watcher = http_client(&daemon.url, handler.clone()).await?;
    ensure!(
        watcher
            .list_all_tools()
            .await?
            .iter()
            .any(|tool| tool.name == "slow__sleep"),
        "not listed"
    );
    let first_pid = pid_of(&daemon, "slow").await?;

    // A call that spans the restarts: it is on the first process when they begin.
    let mut long = RawHttpSession::connect(&daemon.url).await?;
    let long_call = tokio::spawn(async move {
        long.request(
            "tools/call",
            json!({"name": "slow__sleep", "arguments": {"ms": 3000}}),
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream_status(&daemon, "slow").await?["in_flight"] == 0 {
        ensure!(Instant::now() < deadline, "the long call never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let load = Load::start(
        &daemon.url,
        CLIENTS,
        json!({"name": "slow__sleep", "arguments": {"ms": 20}}),
    )
    .await?;
    // Every client is being answered before the restarts begin.
    load.wait_for_more(2 * CLIENTS as u64).await?;
    let before = load.calls();
    let started = Instant::now();
    let mut pids = vec![first_pid];
    for round in 1..=3 {
        let (status, answer) = restart(&daemon, "slow").await?;
        ensure!(status == 202, "restart {round}: {status} {answer}");
        ensure!(
            answer["outcome"] == "restarted",
            "restart {round}: {answer}"
        );
        ensure!(answer["restart"] == "requested", "{answer}");
        let previous = *pids.last().context("no pid")?;
        ensure!(
            answer["previous_pid"] == previous,
            "restart {round}: {answer}"
        );
        let pid = answer["pid"].as_u64().context("no new pid")?;
        ensure!(
            pid != previous,
            "restart {round}: the pid did not change: {answer}"
        );
        ensure!(
            pid_of(&daemon, "slow").await? == pid,
            "status shows another pid"
        );
        pids.push(pid);
        // Calls are answered by each generation before the next restart.
        load.wait_for_more(2 * CLIENTS as u64).await?;
    }
    let during = load.calls() - before;
    let restarting = started.elapsed();

    let long_answer = long_call.await??;
    let (calls, failures) = load.finish().await?;
    println!(
        "{calls} answers in all, {during} during 3 restarts in {:.1} s; {} failed",
        restarting.as_secs_f64(),
        failures.len()
    );
    ensure!(
        long_answer["result"].is_object() && long_answer["result"]["isError"] != true,
        "the call in flight across the restarts failed: {long_answer}"
    );
    ensure!(
        failures.is_empty(),
        "{} of {calls} answers failed, first: {}\n{}",
        failures.len(),
        failures[0],
        daemon.log()
    );
    ensure!(during > 0, "no call was made during the restarts");

    // Every predecessor drained and stopped; only the last one runs.
    let old = &pids[..pids.len() - 1];
    eventually(Duration::from_secs(20), async || {
        ensure!(
            old.iter().all(|pid| !alive(*pid)),
            "old processes left: {:?}",
            old.iter().filter(|pid| alive(**pid)).collect::<Vec<_>>()
        );
        Ok(())
    })
    .await?;
    let last = *pids.last().context("no pid")?;
    ensure!(alive(last), "the serving process is gone");
    let status = upstream_status(&daemon, "slow").await?;
    ensure!(
        status["state"] == "ready" && status["pid"] == last,
        "{status}"
    );
    // Each operator's restart is counted, across the generations.
    ensure!(status["restarts"] == 3, "{status}");
    ensure!(
        daemon
            .metric(r#"plexus_upstream_restarts_total{upstream="slow"}"#)
            .await?
            == Some(3.0),
        "restart metric"
    );
    // The catalog did not flap: the same tools, and no list change announced.
    ensure!(
        tokio::time::timeout(Duration::from_millis(500), handler.tools_changed.notified())
            .await
            .is_err(),
        "a tools/list_changed was sent though nothing changed"
    );
    drop(watcher);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_cannot_start_leaves_the_running_instance_serving() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let marker = dir.path().join("refuse");
    // Starts the fixture, unless the marker exists: then it fails at once.
    let script = format!(
        "if [ -e '{}' ]; then echo 'picky: refusing to start' >&2; exit 7; fi; exec '{}'",
        marker.display(),
        fixture_binary().display()
    );
    let section = format!(
        "[upstreams.picky]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nrestart_backoff = \"30s\"\n"
    );
    let daemon = Daemon::builder()
        .daemon("drain_timeout = \"5s\"")
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let config = daemon.dir.path().join("config.toml");
    let pid = pid_of(&daemon, "picky").await?;
    let load = Load::start(
        &daemon.url,
        2,
        json!({"name": "picky__sleep", "arguments": {"ms": 20}}),
    )
    .await?;

    std::fs::write(&marker, "")?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["restart", "picky", "--config"])
        .arg(&config)
        .output()
        .await?;
    let printed = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.code() == Some(1),
        "plexus restart exited {:?}: {printed}",
        output.status.code()
    );
    let answer: Value = serde_json::from_str(printed.trim()).context("not JSON")?;
    ensure!(answer["outcome"] == "failed", "{answer}");
    ensure!(
        answer["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no reason given: {answer}"
    );
    ensure!(
        daemon.log().contains("the successor did not start"),
        "not logged"
    );
    // The old process serves on, uncounted as restarted.
    let status = upstream_status(&daemon, "picky").await?;
    ensure!(
        status["state"] == "ready" && status["pid"] == pid && status["restarts"] == 0,
        "{status}"
    );
    ensure!(alive(pid), "the running process was stopped");
    // And it answers calls after the failed restart.
    load.wait_for_more(4).await?;

    // Once it can start, the next restart replaces it.
    std::fs::remove_file(&marker)?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["restart", "picky", "--config"])
        .arg(&config)
        .output()
        .await?;
    let printed = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "plexus restart: {printed}");
    let answer: Value = serde_json::from_str(printed.trim()).context("not JSON")?;
    ensure!(
        answer["outcome"] == "restarted" && answer["pid"] != pid,
        "{answer}"
    );

    let (calls, failures) = load.finish().await?;
    println!("{calls} answers across a failed and a good restart");
    ensure!(
        failures.is_empty(),
        "{} of {calls} failed: {failures:?}",
        failures.len()
    );
    eventually(Duration::from_secs(10), async || {
        ensure!(
            !alive(pid),
            "the old process was not stopped after the good restart"
        );
        Ok(())
    })
    .await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_for_a_slot_at_a_restart_are_served_by_the_successor() -> anyhow::Result<()> {
    // `whoami` answers with the process's own pid (`$$` is kept across `exec`).
    let script = format!("exec '{}' --name \"p$$\"", fixture_binary().display());
    let section = format!(
        "[upstreams.narrow]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nmax_in_flight = 1\nmax_pending = 16\n"
    );
    let daemon = Daemon::builder()
        .daemon("drain_timeout = \"20s\"")
        .upstreams(&section)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let old = pid_of(&daemon, "narrow").await?;

    // The one slot is taken by a long call; four more wait in line for it.
    let mut long = RawHttpSession::connect(&daemon.url).await?;
    let long_call = tokio::spawn(async move {
        long.request(
            "tools/call",
            json!({"name": "narrow__sleep", "arguments": {"ms": 1500}}),
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream_status(&daemon, "narrow").await?["in_flight"] == 0 {
        ensure!(Instant::now() < deadline, "the long call never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let mut session = RawHttpSession::connect(&daemon.url).await?;
        waiting.push(tokio::spawn(async move {
            session
                .request(
                    "tools/call",
                    json!({"name": "narrow__whoami", "arguments": {}}),
                )
                .await
        }));
    }
    while upstream_status(&daemon, "narrow").await?["pending"] != 4 {
        ensure!(Instant::now() < deadline, "the calls never waited in line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, answer) = restart(&daemon, "narrow").await?;
    ensure!(
        status == 202 && answer["outcome"] == "restarted",
        "{answer}"
    );
    let new = answer["pid"].as_u64().context("no new pid")?;
    // The long call finishes where it runs; the calls in line go to the successor
    // rather than keep the old process serving after it was replaced.
    let long_answer = long_call.await??;
    ensure!(long_answer["result"]["isError"] != true, "{long_answer}");
    for call in waiting {
        let answer = call.await??;
        let by = answer["result"]["content"][0]["text"].clone();
        ensure!(
            by == format!("p{new}"),
            "answered by {by} (old p{old}, new p{new}): {answer}"
        );
    }
    eventually(Duration::from_secs(10), async || {
        ensure!(!alive(old), "the old process was not stopped");
        Ok(())
    })
    .await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_upstream_restarts_in_place_when_idle_and_ahead_when_running() -> anyhow::Result<()>
{
    let section = fixture_upstream("lazy", "start = \"lazy\"\nidle_timeout = \"3s\"", &[]);
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    // Listed once at start (nothing was known of it), then idle until a call.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tools = session.request("tools/list", json!({})).await?;
        if tools.to_string().contains("lazy__whoami") {
            break;
        }
        ensure!(Instant::now() < deadline, "never listed\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut state = upstream_status(&daemon, "lazy").await?;
    while state["state"] != "idle" {
        ensure!(Instant::now() < deadline, "never idle: {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        state = upstream_status(&daemon, "lazy").await?;
    }

    // Idle: nothing to keep, so it is asked to start now, in place.
    let (status, answer) = restart(&daemon, "lazy").await?;
    ensure!(status == 202, "{status} {answer}");
    ensure!(
        answer["outcome"] == "in_place" && answer["state"] == "idle",
        "{answer}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let old = loop {
        let state = upstream_status(&daemon, "lazy").await?;
        if state["state"] == "ready" {
            break state["pid"].as_u64().context("no pid")?;
        }
        ensure!(Instant::now() < deadline, "not started: {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Running: its successor is started at once, before it stops.
    let (status, answer) = restart(&daemon, "lazy").await?;
    ensure!(
        status == 202 && answer["outcome"] == "restarted" && answer["previous_pid"] == old,
        "{status} {answer}"
    );
    let new = answer["pid"].as_u64().context("no new pid")?;
    ensure!(new != old && alive(new), "{answer}");
    let state = upstream_status(&daemon, "lazy").await?;
    ensure!(state["state"] == "ready" && state["pid"] == new, "{state}");
    let answer = session
        .request(
            "tools/call",
            json!({"name": "lazy__whoami", "arguments": {}}),
        )
        .await?;
    ensure!(answer["result"]["isError"] == false, "{answer}");
    eventually(Duration::from_secs(10), async || {
        ensure!(!alive(old), "the old process was not stopped");
        Ok(())
    })
    .await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}
