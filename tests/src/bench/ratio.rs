//! The comparison a user makes: `plexus-echo` (a minimal rmcp server) called by
//! the same rmcp client directly over its own streamable HTTP (`direct-http`,
//! the baseline), through plexus with it as a stdio child (`plexus`), and over its
//! own stdio (`direct-stdio`, the ceiling of a stdio leg), with the clients' runtime
//! as a load generator runs it (one worker per core) and one shared session, in
//! alternating rounds. plexus is served in this process, so its allocations per
//! call are counted (`allocations.rs`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};

use crate::allocations;
use crate::load::{self, Payload, Sample};

/// Set while this process stops the daemon it serves with SIGTERM, so the bench's
/// own handler lets that one signal pass.
pub static STOPPING_OWN_DAEMON: AtomicBool = AtomicBool::new(false);

/// Rounds of every cell, alternated; the median is reported.
const ROUNDS: usize = 3;

type Session = RunningService<RoleClient, ()>;

/// Calls per measured run: `calls` at C=1, four times that at C=16, a twentieth
/// with 1 MiB payloads.
pub fn run(calls: usize) -> anyhow::Result<()> {
    let bin = plexus_tests::binary_dir();
    let echo = bin.join("plexus-echo");
    if !echo.exists() {
        bail!(
            "{} is missing (cargo build --release --bins)",
            echo.display()
        );
    }
    let dir = tempfile::tempdir().context("a directory for the daemon")?;
    let (port, admin) = (free_port()?, free_port()?);
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             state_dir = \"{}\"\n\n[upstreams.upstream]\ncommand = \"{}\"\n",
            dir.path().join("state").display(),
            echo.display()
        ),
    )?;
    let daemon = std::thread::Builder::new()
        .name("plexus-daemon".into())
        .spawn({
            let config = config.clone();
            move || {
                let cli = <plexus::cli::Cli as clap::Parser>::try_parse_from([
                    "plexus".as_ref(),
                    "serve".as_ref(),
                    "--config".as_ref(),
                    config.as_os_str(),
                ]);
                match cli {
                    Ok(cli) => drop(plexus::run(cli.command)),
                    Err(error) => eprintln!("{error}"),
                }
            }
        })
        .context("starting the daemon's thread")?;
    let clients = tokio::runtime::Builder::new_multi_thread()
        .thread_name("bench-client")
        .enable_all()
        .build()
        .context("building the clients' runtime")?;
    let measured = clients.block_on(measure(&echo, port, admin, calls));
    drop(clients);
    STOPPING_OWN_DAEMON.store(true, Ordering::SeqCst);
    // The daemon stops as it does for an operator: drained, its child stopped.
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM)?;
    let joined = daemon.join();
    STOPPING_OWN_DAEMON.store(false, Ordering::SeqCst);
    if joined.is_err() {
        bail!("the daemon's thread panicked");
    }
    measured
}

fn free_port() -> anyhow::Result<u16> {
    let socket = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(socket.local_addr()?.port())
}

async fn measure(echo: &Path, port: u16, admin: u16, calls: usize) -> anyhow::Result<()> {
    wait_ready(admin).await?;
    let mut direct_server = tokio::process::Command::new(echo)
        .args(["--http", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting plexus-echo --http")?;
    let direct_url = listening_url(&mut direct_server).await?;
    let direct = http_session(&direct_url).await?;
    let plexus = http_session(&format!("http://127.0.0.1:{port}/mcp")).await?;
    let stdio = ().serve(TokioChildProcess::new(tokio::process::Command::new(echo))?).await?;
    let small = Arc::new(Payload::new(100));
    let large = Arc::new(Payload::new(1 << 20));
    let mut samples: Vec<(String, Vec<Sample>)> = Vec::new();
    let mut allocations = Vec::new();
    for _ in 0..ROUNDS {
        for (concurrency, count) in [(1, calls), (16, calls * 4)] {
            for (label, peer, tool) in [
                ("direct-http", direct.peer(), "echo"),
                ("plexus", plexus.peer(), "upstream__echo"),
                ("direct-stdio", stdio.peer(), "echo"),
            ] {
                let before = allocations::daemon_allocations();
                let sample = one(peer, tool, concurrency, count, &small).await?;
                if label == "plexus" {
                    let made = allocations::daemon_allocations() - before;
                    allocations.push((concurrency, made as f64 / count as f64));
                }
                push(&mut samples, cell(label, concurrency, 100), sample);
            }
        }
        let count = (calls / 20).max(1);
        for (label, peer, tool) in [
            ("direct-http", direct.peer(), "echo"),
            ("plexus", plexus.peer(), "upstream__echo"),
        ] {
            let sample = one(peer, tool, 1, count, &large).await?;
            push(&mut samples, cell(label, 1, 1 << 20), sample);
        }
    }
    for session in [direct, plexus, stdio] {
        let _ = session.cancel().await;
    }
    report(&samples, &allocations);
    Ok(())
}

async fn one(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    concurrency: usize,
    calls: usize,
    payload: &Arc<Payload>,
) -> anyhow::Result<Sample> {
    load::measure(
        std::slice::from_ref(peer),
        tool,
        concurrency,
        calls,
        payload,
    )
    .await
}

fn cell(label: &str, concurrency: usize, payload: usize) -> String {
    format!("{label} c={concurrency} {payload}")
}

fn push(samples: &mut Vec<(String, Vec<Sample>)>, key: String, sample: Sample) {
    match samples.iter_mut().find(|(known, _)| *known == key) {
        Some((_, list)) => list.push(sample),
        None => samples.push((key, vec![sample])),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn report(samples: &[(String, Vec<Sample>)], allocations: &[(usize, f64)]) {
    let of = |key: &str, figure: fn(&Sample) -> f64| {
        samples
            .iter()
            .find(|(known, _)| *known == key)
            .map(|(_, list)| median(list.iter().map(figure).collect()))
            .unwrap_or(f64::NAN)
    };
    let p50 = |sample: &Sample| sample.p50.as_secs_f64() * 1e3;
    let throughput = |sample: &Sample| sample.throughput;
    println!();
    println!(
        "ratio (plexus-echo, rmcp client, one shared session, {ROUNDS} alternated rounds, medians)"
    );
    for key in samples.iter().map(|(key, _)| key) {
        println!(
            "  {key:<28} p50 {:>8.3} ms  {:>9.0} calls/s",
            of(key, p50),
            of(key, throughput)
        );
    }
    let ratio = |a: &str, b: &str, figure: fn(&Sample) -> f64| of(a, figure) / of(b, figure);
    println!(
        "  p50 c=1 x direct-http {:.3}; throughput c=16 x direct-http {:.3}; p50 1 MiB c=1 x direct-http {:.3}",
        ratio("plexus c=1 100", "direct-http c=1 100", p50),
        ratio("plexus c=16 100", "direct-http c=16 100", throughput),
        ratio("plexus c=1 1048576", "direct-http c=1 1048576", p50),
    );
    println!(
        "  p50 c=1 x direct-stdio {:.3}; throughput c=16 x direct-stdio {:.3}",
        ratio("plexus c=1 100", "direct-stdio c=1 100", p50),
        ratio("plexus c=16 100", "direct-stdio c=16 100", throughput),
    );
    for concurrency in [1, 16] {
        let per_call: Vec<f64> = allocations
            .iter()
            .filter(|(c, _)| *c == concurrency)
            .map(|(_, made)| *made)
            .collect();
        println!(
            "  plexus allocations per call, c={concurrency}: {:.1}",
            median(per_call)
        );
    }
}

async fn wait_ready(admin: u16) -> anyhow::Result<()> {
    let url = format!("http://127.0.0.1:{admin}/readyz");
    let client = reqwest::Client::new();
    for _ in 0..300 {
        if let Ok(response) = client.get(&url).send().await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the daemon served in the bench was not ready within 15 s")
}

/// The URL `plexus-echo --http` prints on stderr once it listens.
async fn listening_url(child: &mut tokio::process::Child) -> anyhow::Result<String> {
    use tokio::io::AsyncBufReadExt;
    let stderr = child.stderr.take().context("plexus-echo's stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(url) = line.strip_prefix("plexus-echo listening on ") {
            return Ok(url.to_string());
        }
    }
    bail!("plexus-echo --http ended before listening")
}

async fn http_session(url: &str) -> anyhow::Result<Session> {
    let transport = StreamableHttpClientTransport::from_uri(url.to_string());
    ().serve(transport)
        .await
        .with_context(|| format!("connecting to {url}"))
}
