//! plexus-bench: echo `tools/call` latency and throughput, direct to the fixture over stdio versus through `plexus serve`.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use plexus_tests::{
    fixture_binary, fixture_upstream, http_client, stdio_client, Client, Daemon, TestClient,
};
use rmcp::model::{CallToolRequestParams, JsonObject, ProtocolVersion};
use rmcp::service::Peer;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use tokio::process::Command;
use tokio::task::JoinSet;

/// The argument every call sends; the echo must come back byte for byte.
const ECHO_TEXT: &str = "hello";
/// Calls before each measured run, so connection setup, allocator growth and
/// lazy initialisation on either path do not land in the numbers.
const WARM_UP_CALLS: usize = 200;
/// Tasks sharing one client connection in the concurrent runs.
const HIGH_CONCURRENCY: usize = 16;
/// The concurrent run makes this many times the sequential run's calls, so
/// both take a comparable wall time.
const HIGH_CONCURRENCY_SCALE: usize = 4;
/// A call this slow means something is stuck; fail rather than hang the bench.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Compares echo tool calls made directly to `plexus-fixture` with the same
/// calls made through a `plexus serve` daemon fronting it.
#[derive(Parser, Debug)]
#[command(name = "plexus-bench")]
struct Cli {
    /// Measured calls at concurrency 1; concurrency 16 makes four times as many.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    calls: usize,
    /// Short run: 200 calls at concurrency 1, 800 at concurrency 16.
    #[arg(long, conflicts_with = "calls")]
    quick: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct,
    /// The client reaches plexus over streamable HTTP.
    Plexus,
    /// The client runs `plexus serve --stdio`: plexus's own cost without HTTP's.
    PlexusStdio,
    /// A 2026-07-28 client over HTTP: no session, `_meta` on every request.
    Plexus2026,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Plexus => "plexus",
            Mode::PlexusStdio => "plexus-stdio",
            Mode::Plexus2026 => "plexus-2026",
        }
    }
}

/// One measured run's summary.
struct Stats {
    mode: Mode,
    concurrency: usize,
    calls: usize,
    p50: Duration,
    p99: Duration,
    throughput: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let sequential_calls = if cli.quick { 200 } else { cli.calls };
    if sequential_calls == 0 {
        bail!("--calls must be at least 1");
    }
    let plan = [
        (1, sequential_calls),
        (HIGH_CONCURRENCY, sequential_calls * HIGH_CONCURRENCY_SCALE),
    ];

    let direct = direct_client()
        .await
        .context("starting the direct fixture client")?;
    let daemon = Daemon::start("", &fixture_upstream("bench", "", &["--name", "bench"]))
        .await
        .context("starting plexus")?;
    daemon
        .wait_ready(Duration::from_secs(30))
        .await
        .context("waiting for the bench upstream")?;
    let proxied = http_client(&daemon.url, TestClient::default())
        .await
        .with_context(|| format!("connecting to plexus at {}", daemon.url))?;
    let stdio_config = daemon.dir.path().join("stdio.toml");
    std::fs::write(
        &stdio_config,
        format!(
            "[daemon]\nstate_dir = {:?}\n\n{}",
            daemon.dir.path().join("stdio-state").display().to_string(),
            fixture_upstream("bench", "", &["--name", "bench"])
        ),
    )?;
    let proxied_stdio = stdio_client(&stdio_config, TestClient::default())
        .await
        .context("starting plexus serve --stdio")?;
    wait_for_tool(&proxied_stdio, "bench__echo").await?;
    let proxied_modern = TestClient::default()
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(daemon.url.clone()),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .context("connecting to plexus as a 2026-07-28 client")?;

    // Modes alternate within each concurrency level so that load from other
    // work on the machine drifts over both sides of a comparison alike.
    let mut results = Vec::new();
    for (concurrency, calls) in plan {
        for (mode, client, tool) in [
            (Mode::Direct, &direct, "echo"),
            (Mode::Plexus, &proxied, "bench__echo"),
            (Mode::PlexusStdio, &proxied_stdio, "bench__echo"),
            (Mode::Plexus2026, &proxied_modern, "bench__echo"),
        ] {
            let peer = client.peer().clone();
            run(&peer, tool, concurrency, WARM_UP_CALLS)
                .await
                .with_context(|| format!("{} warm-up at c={concurrency}", mode.label()))?;
            let stats = measure(&peer, mode, tool, concurrency, calls)
                .await
                .with_context(|| format!("{} run at c={concurrency}", mode.label()))?;
            results.push(stats);
        }
    }

    print_report(&results);

    proxied
        .cancel()
        .await
        .context("closing the plexus client")?;
    proxied_stdio
        .cancel()
        .await
        .context("closing the plexus stdio client")?;
    proxied_modern
        .cancel()
        .await
        .context("closing the 2026-07-28 client")?;
    let status = daemon.stop().await.context("stopping plexus")?;
    if !status.success() {
        bail!("plexus exited with {status}");
    }
    direct.cancel().await.context("closing the direct client")?;
    Ok(())
}

/// Waits until plexus lists `tool` (its upstream starts after plexus answers `initialize`).
async fn wait_for_tool(client: &Client, tool: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !client
        .list_all_tools()
        .await?
        .iter()
        .any(|t| t.name == tool)
    {
        if std::time::Instant::now() > deadline {
            bail!("{tool} was never listed");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// An rmcp client that runs the fixture itself, as an MCP host would.
async fn direct_client() -> anyhow::Result<Client> {
    let mut command = Command::new(fixture_binary());
    command.args(["--name", "bench"]);
    // The daemon does not put its upstream's stderr on our terminal either;
    // discarding it keeps the table readable.
    let (transport, _stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {}", fixture_binary().display()))?;
    Ok(TestClient::default().serve(transport).await?)
}

async fn measure(
    peer: &Peer<RoleClient>,
    mode: Mode,
    tool: &'static str,
    concurrency: usize,
    calls: usize,
) -> anyhow::Result<Stats> {
    let started = Instant::now();
    let mut latencies = run(peer, tool, concurrency, calls).await?;
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Stats {
        mode,
        concurrency,
        calls,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        throughput: calls as f64 / elapsed.as_secs_f64(),
    })
}

/// Makes `calls` echo calls from `concurrency` tasks over one shared peer and
/// returns every call's latency.
async fn run(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    concurrency: usize,
    calls: usize,
) -> anyhow::Result<Vec<Duration>> {
    // Tasks take call numbers from one counter instead of fixed shares, so a
    // task that falls behind does not leave the others idle at the end.
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency {
        let peer = peer.clone();
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(calls / concurrency + 1);
            while next.fetch_add(1, Ordering::Relaxed) < calls {
                latencies.push(echo(&peer, tool).await?);
            }
            anyhow::Ok(latencies)
        });
    }
    let mut all = Vec::with_capacity(calls);
    while let Some(joined) = tasks.join_next().await {
        // Returning early drops the JoinSet, which aborts the other tasks.
        all.extend(joined.context("bench task panicked")??);
    }
    if all.len() != calls {
        bail!("made {} calls, expected {calls}", all.len());
    }
    Ok(all)
}

/// One `tools/call` of the echo tool; checks the answer so a fast wrong answer
/// cannot pass for a fast right one.
async fn echo(peer: &Peer<RoleClient>, tool: &'static str) -> anyhow::Result<Duration> {
    let mut arguments = JsonObject::new();
    arguments.insert("text".into(), ECHO_TEXT.into());
    let params = CallToolRequestParams::new(tool).with_arguments(arguments);
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params))
        .await
        .with_context(|| format!("{tool} took longer than {CALL_TIMEOUT:?}"))?
        .with_context(|| format!("calling {tool}"))?;
    let latency = started.elapsed();
    if result.is_error == Some(true) {
        bail!("{tool} returned an error result: {:?}", result.content);
    }
    let text = result
        .content
        .first()
        .and_then(|block| block.as_text())
        .map(|t| t.text.as_str());
    if text != Some(ECHO_TEXT) {
        bail!("{tool} echoed {:?}, sent {ECHO_TEXT:?}", result.content);
    }
    Ok(latency)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn print_report(results: &[Stats]) {
    println!(
        "{:<13} {:>11} {:>7} {:>10} {:>10} {:>10}",
        "mode", "concurrency", "calls", "p50 µs", "p99 µs", "calls/s"
    );
    for s in results {
        println!(
            "{:<13} {:>11} {:>7} {:>10.1} {:>10.1} {:>10.0}",
            s.mode.label(),
            s.concurrency,
            s.calls,
            micros(s.p50),
            micros(s.p99),
            s.throughput
        );
    }

    let mut ratios = Vec::new();
    for mode in [Mode::Plexus, Mode::PlexusStdio, Mode::Plexus2026] {
        for concurrency in [1, HIGH_CONCURRENCY] {
            let find = |mode| {
                results
                    .iter()
                    .find(|s| s.mode == mode && s.concurrency == concurrency)
            };
            if let (Some(direct), Some(proxied)) = (find(Mode::Direct), find(mode)) {
                ratios.push((
                    mode.label(),
                    concurrency,
                    micros(proxied.p50) / micros(direct.p50),
                    micros(proxied.p99) / micros(direct.p99),
                    proxied.throughput / direct.throughput,
                ));
            }
        }
    }

    println!();
    println!("through plexus / direct (latency: higher is slower; throughput: lower is slower)");
    println!(
        "{:<13} {:>11} {:>10} {:>10} {:>11}",
        "mode", "concurrency", "p50", "p99", "throughput"
    );
    for (mode, concurrency, p50, p99, throughput) in &ratios {
        println!("{mode:<13} {concurrency:>11} {p50:>10.2} {p99:>10.2} {throughput:>11.2}");
    }

    println!();
    for (mode, concurrency, p50, p99, throughput) in &ratios {
        println!(
            "ratio {mode} c={concurrency} p50={p50:.2} p99={p99:.2} throughput={throughput:.2}"
        );
    }
}
