//! Scale figures: a daemon's start time and memory with many upstreams, and the
//! memory an open HTTP session costs it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use plexus_tests::{fixture_upstream, Daemon};
use serde_json::{json, Value};

/// How long many upstreams may take to come up on a slow machine.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts a daemon with `upstreams` fixture upstreams and prints how long it took
/// to listen and to have every upstream ready, and its resident memory then.
pub async fn upstreams(upstreams: usize) -> anyhow::Result<()> {
    let sections: String = (0..upstreams)
        .map(|n| fixture_upstream(&format!("fx{n}"), "", &["--name", &format!("fx{n}")]))
        .collect();
    let started = Instant::now();
    let daemon = Daemon::start("", &sections)
        .await
        .context("starting plexus")?;
    let listening = started.elapsed();
    daemon
        .wait_ready(READY_TIMEOUT)
        .await
        .context("waiting for the upstreams")?;
    let ready = started.elapsed();
    let rss = rss_kib(&daemon)?;
    println!(
        "{upstreams} fixture upstreams: listening after {} ms, all ready after {} ms (±100), daemon RSS {:.1} MiB",
        listening.as_millis(),
        ready.as_millis(),
        rss as f64 / 1024.0
    );
    stop(daemon).await
}

/// Opens `sessions` HTTP sessions to an otherwise idle daemon and prints its
/// resident memory before and after, and the difference per session.
pub async fn sessions(sessions: usize) -> anyhow::Result<()> {
    let limits = format!(
        "max_sessions = {0}\nmax_sessions_per_principal = {0}",
        sessions + 10
    );
    let daemon = Daemon::start(&limits, &fixture_upstream("bench", "", &[]))
        .await
        .context("starting plexus")?;
    daemon
        .wait_ready(READY_TIMEOUT)
        .await
        .context("waiting for the upstream")?;
    // One client: its pooled connection carries every session, so what is counted
    // is sessions, not TCP connections.
    let http = reqwest::Client::new();
    // One session first, so lazily allocated state is not charged to the others.
    open_session(&http, &daemon.url).await?;
    let before = rss_kib(&daemon)?;
    for n in 0..sessions {
        open_session(&http, &daemon.url)
            .await
            .with_context(|| format!("opening session {n}"))?;
    }
    let after = rss_kib(&daemon)?;
    println!(
        "{sessions} open HTTP sessions: daemon RSS {:.1} → {:.1} MiB, {:.1} KiB per session",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / sessions.max(1) as f64
    );
    stop(daemon).await
}

/// `initialize` and `notifications/initialized`: a session the daemon keeps open.
async fn open_session(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let post = |body: Value| {
        http.post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body)
    };
    let response = post(json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "plexus-bench", "version": "0"}}
    }))
    .send()
    .await?;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.text().await?;
    let Some(session) = session.filter(|_| status.is_success()) else {
        bail!("initialize answered {status} without a session: {body:.500}");
    };
    let status = post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .header("mcp-session-id", session)
        .send()
        .await?
        .status();
    if !status.is_success() {
        bail!("notifications/initialized answered {status}");
    }
    Ok(())
}

/// The daemon's resident set size in KiB, from `/proc/<pid>/status`.
fn rss_kib(daemon: &Daemon) -> anyhow::Result<u64> {
    let pid = daemon.pid().context("plexus has no pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

async fn stop(daemon: Daemon) -> anyhow::Result<()> {
    let status = daemon.stop().await.context("stopping plexus")?;
    if !status.success() {
        bail!("plexus exited with {status}");
    }
    Ok(())
}
