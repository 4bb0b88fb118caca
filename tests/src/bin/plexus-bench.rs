//! plexus-bench: echo `tools/call` latency and throughput through plexus (HTTP
//! front, stdio front, a 2026-07-28 client, `plexus connect`) against the fixture
//! called directly over stdio and over streamable HTTP, the baseline of every ratio;
//! then a daemon's start time and memory with 100 upstreams and per open session;
//! then tool search quality and speed, measured in process. First of all, the
//! comparison a user makes (`ratio`): a minimal rmcp server called directly and
//! through plexus by the same client, with plexus's allocations per call.

#[path = "../bench/allocations.rs"]
mod allocations;
#[path = "../bench/load.rs"]
mod load;
#[path = "../bench/ratio.rs"]
mod ratio;
#[path = "../bench/report.rs"]
mod report;
#[path = "../bench/scale.rs"]
mod scale;
#[path = "../bench/targets.rs"]
mod targets;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Parser;
use plexus_tests::{search_bench, Client};
use rmcp::service::Peer;
use rmcp::RoleClient;

use load::Payload;
use report::{Cell, CellResult, Sessions};
use targets::{Rig, Target};

/// Counts the allocations of the daemon served in this process (`ratio`).
#[global_allocator]
static ALLOCATOR: allocations::Counting = allocations::Counting;

/// Tasks (and, per worker, sessions) in the concurrent cells.
const HIGH_CONCURRENCY: usize = 16;
/// The concurrent cells make this many times the sequential cells' calls, so
/// both take a comparable wall time.
const HIGH_CONCURRENCY_SCALE: usize = 4;
/// Payload sizes of a full run: about a short argument, a document, a file.
const PAYLOADS: [usize; 3] = [100, 10 << 10, 1 << 20];
/// A 1 MiB call costs about this many small ones; fewer of them keep the run short.
const LARGE_PAYLOAD_DIVISOR: usize = 20;

/// Measures echo tool calls to `plexus-fixture` directly and through plexus, in
/// every combination of concurrency, session sharing and payload size.
#[derive(Parser, Debug)]
#[command(name = "plexus-bench")]
struct Cli {
    /// Measured calls per run at concurrency 1 (concurrency 16 makes four times
    /// as many; 1 MiB payloads a twentieth).
    #[arg(long, value_name = "N", default_value_t = 2000)]
    calls: usize,
    /// How many times each target is measured in each cell (rounds alternate in
    /// order, so drift over the run lands on every target alike).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pairs: usize,
    /// A smoke run: every target with few calls (100 B and 10 KiB, one pair),
    /// every reply still checked, and the scale figures at a small scale; its
    /// timings mean nothing.
    #[arg(long, conflicts_with_all = ["calls", "pairs"])]
    quick: bool,
    /// Only these targets (comma-separated labels, e.g. `plexus-http,plexus-2026`);
    /// the baseline, direct-http, is always measured.
    #[arg(long, value_delimiter = ',', value_name = "LABELS")]
    targets: Vec<String>,
    /// Only these payload sizes, in bytes (e.g. `100,10240`).
    #[arg(long, value_delimiter = ',', value_name = "BYTES")]
    payloads: Vec<usize>,
    /// Leave out the scale figures.
    #[arg(long)]
    no_scale: bool,
    /// Only the scale figures (no echo cells).
    #[arg(long, conflicts_with = "no_scale")]
    only_scale: bool,
    /// Leave out the baseline too (no ratios): a steady load on the named targets
    /// alone, to profile them.
    #[arg(long, requires = "targets")]
    without_baseline: bool,
    /// Another build of plexus to measure against this one: a second daemon,
    /// `plexus-http-against`, in the same rounds as plexus-http (alone, with
    /// `--targets` naming neither).
    #[arg(long, value_name = "BINARY")]
    against: Option<PathBuf>,
    /// Threads of the clients' runtime. One by default, as the MCP clients people
    /// run are (Node's and Python's event loops): on a machine of few cores, a
    /// client's own idle threads woken at each reply compete with the processes it
    /// measures, and more with a relay's three than a direct connection's two.
    #[arg(long, value_name = "N", default_value_t = 1)]
    client_threads: usize,
    /// `[daemon] worker_threads` of the plexus daemons behind the echo cells (the
    /// HTTP daemon, and each stdio front); without it, the daemon's default (one
    /// per core). The scale figures keep the default.
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
    /// Leave out the tool search figures.
    #[arg(long)]
    no_search: bool,
    /// Leave out the comparison with `plexus-echo` called directly (`ratio`).
    #[arg(long)]
    no_ratio: bool,
    /// Only that comparison.
    #[arg(long, conflicts_with_all = ["no_ratio", "only_search", "only_scale"])]
    only_ratio: bool,
    /// Only the tool search figures (quality and speed, measured in process).
    #[arg(long, conflicts_with_all = ["no_search", "only_scale"])]
    only_search: bool,
    /// Where `scripts/search-bench-data` wrote `bfcl.json` and `mcp-servers.json`
    /// (default `target/search-bench`); a file missing is reported as skipped.
    #[arg(long, value_name = "DIR")]
    search_data: Option<PathBuf>,
    /// The hand-written tasks over `mcp-servers.json` (default
    /// `tests/search-bench/mcp-tasks.json`).
    #[arg(long, value_name = "FILE")]
    search_tasks: Option<PathBuf>,
}

/// What one run measures.
struct Plan {
    cells: Vec<Cell>,
    pairs: usize,
    /// Upstreams of the daemon whose start and memory are measured.
    scale_upstreams: usize,
    /// HTTP sessions whose memory is measured.
    scale_sessions: usize,
}

impl Plan {
    fn of(cli: &Cli) -> anyhow::Result<Plan> {
        if cli.quick {
            return Ok(Plan {
                cells: cells(
                    &PAYLOADS[..2],
                    |_, concurrency| {
                        if concurrency == 1 {
                            20
                        } else {
                            64
                        }
                    },
                ),
                pairs: 1,
                scale_upstreams: 5,
                scale_sessions: 50,
            });
        }
        if cli.calls == 0 || cli.pairs == 0 {
            bail!("--calls and --pairs must be at least 1");
        }
        let calls = |payload: usize, concurrency: usize| {
            let calls = if concurrency == 1 {
                cli.calls
            } else {
                cli.calls * HIGH_CONCURRENCY_SCALE
            };
            let calls = if payload >= 1 << 20 {
                calls / LARGE_PAYLOAD_DIVISOR
            } else {
                calls
            };
            calls.max(concurrency)
        };
        let payloads: &[usize] = if cli.payloads.is_empty() {
            &PAYLOADS
        } else {
            &cli.payloads
        };
        Ok(Plan {
            cells: cells(payloads, calls),
            pairs: cli.pairs,
            scale_upstreams: 100,
            scale_sessions: 1000,
        })
    }
}

/// Per payload: concurrency 1, then 16 on one shared session, then 16 on a session each.
fn cells(payloads: &[usize], calls: impl Fn(usize, usize) -> usize) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &payload in payloads {
        for (concurrency, sessions) in [
            (1, Sessions::Shared),
            (HIGH_CONCURRENCY, Sessions::Shared),
            (HIGH_CONCURRENCY, Sessions::PerWorker),
        ] {
            cells.push(Cell {
                concurrency,
                sessions,
                payload,
                calls: calls(payload, concurrency),
            });
        }
    }
    cells
}

fn main() -> anyhow::Result<()> {
    // The daemon served in this process starts its keeper as this binary.
    if std::env::args().nth(1).as_deref() == Some("keeper") {
        let _ = plexus::run(plexus::cli::Command::Keeper);
        return Ok(());
    }
    let cli = Cli::parse();
    if cli.client_threads == 0 {
        bail!("--client-threads must be at least 1");
    }
    // Before the other cells: its daemon runs in this process, on runtimes of its own.
    let ratio_asked = !(cli.no_ratio
        || cli.only_search
        || cli.only_scale
        || cli.against.is_some()
        || !cli.targets.is_empty());
    if cli.only_ratio || ratio_asked {
        let calls = if cli.quick { 50 } else { cli.calls };
        ratio::run(calls)?;
        if cli.only_ratio {
            return Ok(());
        }
    }
    let runtime = if cli.client_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cli.client_threads)
            .enable_all()
            .build()
    }
    .context("building the clients' runtime")?;
    println!("clients: {} runtime thread(s)", cli.client_threads);
    // Interrupted, the run is dropped: the daemons and fixtures it started go with
    // their handles (killed on drop) instead of outliving the bench.
    runtime.block_on(async {
        tokio::select! {
            outcome = run(cli) => outcome,
            signal = interrupted() => {
                signal?;
                anyhow::bail!("interrupted; every process the bench started was stopped")
            }
        }
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            outcome = tokio::signal::ctrl_c() => return outcome,
            _ = terminate.recv() => {
                // The one this process sent to stop the daemon it served.
                if !ratio::STOPPING_OWN_DAEMON.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Ok(());
                }
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let plan = Plan::of(&cli)?;
    if cli.only_search {
        return search_figures(&cli);
    }
    if cli.only_scale {
        return scale_figures(&plan, cli.quick).await;
    }

    let mut targets = chosen_targets(&cli.targets, cli.against.is_some())?;
    if cli.without_baseline {
        targets.retain(|target| *target != Target::BASELINE);
    }

    let daemon_extra = cli
        .worker_threads
        .map(|threads| format!("worker_threads = {threads}"))
        .unwrap_or_default();
    if !daemon_extra.is_empty() {
        println!("plexus: {daemon_extra}");
    }
    let traced = targets.contains(&Target::PlexusTraced);
    let rig = Rig::start(cli.against.as_deref(), &daemon_extra, traced).await?;
    // Every target gets its sessions up front: the first serves the shared cells.
    let mut sessions: Vec<(Target, Vec<Client>)> = Vec::new();
    for target in targets {
        let clients = rig.open(target, HIGH_CONCURRENCY).await?;
        sessions.push((target, clients));
    }

    let measured = measure_all(&plan, &sessions).await;
    // A failed measurement still closes everything; its error is the one reported.
    let closed = close(sessions, rig).await;
    measured.and(closed)?;
    if !cli.no_scale {
        scale_figures(&plan, cli.quick).await?;
    }
    if cli.no_search {
        return Ok(());
    }
    search_figures(&cli)
}

/// Tool search: quality on bfcl-eval and on hand-written tasks over real servers'
/// catalogs, then speed and size on generated catalogs (`plexus_tests::search_bench`,
/// the code `plexus-search-bench` runs). A quick run times 2,000 tools only.
fn search_figures(cli: &Cli) -> anyhow::Result<()> {
    println!();
    println!("search");
    let root = plexus_tests::workspace_root();
    let data = cli
        .search_data
        .clone()
        .unwrap_or_else(|| root.join("target/search-bench"));
    let tasks = cli
        .search_tasks
        .clone()
        .unwrap_or_else(|| root.join("tests/search-bench/mcp-tasks.json"));
    let bfcl = data.join("bfcl.json");
    if bfcl.exists() {
        println!("search {}", search_bench::query_file(&bfcl)?);
    } else {
        println!(
            "search quality bfcl: skipped, no {} (scripts/search-bench-data)",
            bfcl.display()
        );
    }
    let servers = data.join("mcp-servers.json");
    if servers.exists() {
        println!(
            "search quality mcp tasks: {}",
            search_bench::tasks(&servers, &tasks)?
        );
    } else {
        println!(
            "search quality mcp tasks: skipped, no {} (scripts/search-bench-data)",
            servers.display()
        );
    }
    let sizes: &[(usize, usize)] = if cli.quick {
        &[(2_000, 200)]
    } else {
        &[(10_000, 2_000), (100_000, 2_000)]
    };
    for &(tools, queries) in sizes {
        for line in search_bench::speed(tools, queries, tools <= 10_000) {
            println!("search {line}");
        }
    }
    Ok(())
}

async fn scale_figures(plan: &Plan, quick: bool) -> anyhow::Result<()> {
    println!();
    println!("scale");
    scale::upstreams(plan.scale_upstreams)
        .await
        .context("measuring a daemon with many upstreams")?;
    scale::sessions(plan.scale_sessions)
        .await
        .context("measuring open sessions")?;
    scale::catalog(scale::CatalogScale::of(quick))
        .await
        .context("measuring a catalog of thousands of tools")
}

/// The targets named on the command line (all when none), the baseline first.
/// With another build to compare (`against`), the baseline, plexus-http and the
/// other build's, plus those named; without, the other build's is not a target.
fn chosen_targets(labels: &[String], against: bool) -> anyhow::Result<Vec<Target>> {
    let known: Vec<Target> = Target::ALL
        .into_iter()
        .filter(|target| against || *target != Target::PlexusHttpAgainst)
        .collect();
    for label in labels {
        if !known.iter().any(|target| target.label() == label) {
            let labels: Vec<&str> = known.iter().map(|t| t.label()).collect();
            let hint = if label == Target::PlexusHttpAgainst.label() {
                " (it needs --against)"
            } else {
                ""
            };
            bail!(
                "no target {label:?}{hint}; the targets are {}",
                labels.join(", ")
            );
        }
    }
    if labels.is_empty() && !against {
        return Ok(known);
    }
    Ok(known
        .into_iter()
        .filter(|target| {
            *target == Target::BASELINE
                || (against && matches!(target, Target::PlexusHttp | Target::PlexusHttpAgainst))
                || labels.iter().any(|label| label == target.label())
        })
        .collect())
}

async fn close(sessions: Vec<(Target, Vec<Client>)>, rig: Rig) -> anyhow::Result<()> {
    for (target, clients) in sessions {
        for client in clients {
            client
                .cancel()
                .await
                .with_context(|| format!("closing a {} session", target.label()))?;
        }
    }
    rig.stop().await
}

async fn measure_all(plan: &Plan, sessions: &[(Target, Vec<Client>)]) -> anyhow::Result<()> {
    let mut cells = Vec::new();
    for cell in &plan.cells {
        let payload = Arc::new(Payload::new(cell.payload));
        let mut results: Vec<(Target, Vec<load::Sample>)> = sessions
            .iter()
            .map(|(target, _)| (*target, Vec::new()))
            .collect();
        for pair in 0..plan.pairs {
            // Every other round runs backwards (ABBA), so a steady drift in the
            // machine's speed evens out between neighbours in the order.
            let order: Vec<usize> = if pair % 2 == 0 {
                (0..sessions.len()).collect()
            } else {
                (0..sessions.len()).rev().collect()
            };
            for index in order {
                let (target, clients) = &sessions[index];
                let sample = measure_one(cell, *target, clients, &payload)
                    .await
                    .with_context(|| format!("{} at {}", target.label(), cell.label()))?;
                results[index].1.push(sample);
            }
        }
        let result = CellResult::new(*cell, plan.pairs, &results);
        // Each table as soon as it is measured: a full run takes minutes.
        result.print();
        cells.push(result);
    }
    report::print_overview(&cells);
    report::print_overheads(&cells);
    report::print_hop_floor(&cells);
    report::print_tracing_cost(&cells);
    Ok(())
}

/// One measured run of `target` in `cell`, after a warm-up on the same sessions
/// so connection setup and lazy initialisation stay out of the numbers.
async fn measure_one(
    cell: &Cell,
    target: Target,
    clients: &[Client],
    payload: &Arc<Payload>,
) -> anyhow::Result<load::Sample> {
    let used = match cell.sessions {
        Sessions::Shared => 1,
        Sessions::PerWorker => cell.concurrency,
    };
    let peers: Vec<Peer<RoleClient>> = clients
        .iter()
        .take(used)
        .map(|client| client.peer().clone())
        .collect();
    let warm_up = (cell.calls / 10).max(cell.concurrency);
    load::run(&peers, target.tool(), cell.concurrency, warm_up, payload)
        .await
        .context("warming up")?;
    load::measure(&peers, target.tool(), cell.concurrency, cell.calls, payload).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(targets: &[Target]) -> Vec<&'static str> {
        targets.iter().map(|target| target.label()).collect()
    }

    #[test]
    fn another_build_is_measured_beside_plexus_http_and_only_when_given() {
        let all = chosen_targets(&[], false).unwrap_or_default();
        assert_eq!(all.len(), Target::ALL.len() - 1);
        assert!(!all.contains(&Target::PlexusHttpAgainst));

        let against = chosen_targets(&[], true).unwrap_or_default();
        assert_eq!(
            labels(&against),
            ["direct-http", "plexus-http", "plexus-http-against"]
        );
        let named = chosen_targets(&["plexus-2026".to_string()], true).unwrap_or_default();
        assert_eq!(
            labels(&named),
            [
                "direct-http",
                "plexus-http",
                "plexus-http-against",
                "plexus-2026"
            ]
        );

        let refused = chosen_targets(&["plexus-http-against".to_string()], false);
        let message = refused.map(|_| ()).err().map(|e| e.to_string());
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.contains("it needs --against")),
            "{message:?}"
        );
    }
}
