//! `plexus-bench --quick`: every target of the benchmark, with few calls and every
//! reply checked, so the bench cannot rot between the runs that measure.

use std::ffi::OsStr;
use std::process::Output;
use std::time::Duration;

use anyhow::{ensure, Context};

/// A debug build's quick run takes well under a minute; this is for a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(300);

/// Runs plexus-bench with `args`, within [`TIMEOUT`].
async fn bench(args: &[&OsStr]) -> anyhow::Result<Output> {
    let bench = plexus_tests::binary_dir().join("plexus-bench");
    let run = tokio::process::Command::new(&bench)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(TIMEOUT, run)
        .await
        .with_context(|| format!("plexus-bench {args:?} ran over {TIMEOUT:?}"))?
        .with_context(|| format!("running {}", bench.display()))
}

#[tokio::test]
async fn the_quick_bench_runs_every_target_and_verifies_every_reply() -> anyhow::Result<()> {
    let output = bench(&["--quick".as_ref()]).await?;
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    ensure!(
        output.status.success(),
        "plexus-bench --quick exited with {}",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    for section in [
        "p50 of plexus-http against its two legs",
        "one tools/list page of 10 from the middle",
        "walk and serialisation in turns",
        "search speed 2000 tools: search p50",
        "ratio (plexus-echo, rmcp client",
        "throughput c=16 x direct-http",
        "throughput c=16 x direct-stdio",
        "plexus allocations per call, c=16:",
    ] {
        ensure!(stdout.contains(section), "no {section:?} in the report");
    }
    Ok(())
}

/// `--against`: another build (here the same one) runs as a second daemon, its
/// calls checked and reported beside plexus-http's; both on one worker thread
/// (`--worker-threads 1`).
#[tokio::test]
async fn the_bench_measures_another_build_beside_this_one() -> anyhow::Result<()> {
    let plexus = plexus_tests::plexus_binary();
    let args = [
        "--quick",
        "--no-scale",
        "--payloads",
        "100",
        "--worker-threads",
        "1",
        "--against",
    ];
    let mut args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    args.push(plexus.as_os_str());
    let output = bench(&args).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    ensure!(
        output.status.success(),
        "plexus-bench --against exited with {}:\n{stdout}",
        output.status
    );
    // Each cell's table has a row for it; only the named targets were measured.
    let rows = stdout
        .lines()
        .filter(|line| line.starts_with("plexus-http-against "))
        .count();
    ensure!(rows >= 3, "{rows} plexus-http-against rows:\n{stdout}");
    ensure!(
        !stdout.contains("plexus-stdio"),
        "a target that was not asked for:\n{stdout}"
    );
    ensure!(
        stdout.contains("plexus: worker_threads = 1"),
        "the daemons' worker threads are not reported:\n{stdout}"
    );
    Ok(())
}

/// The search section alone, quick, on a small catalog and tasks written here: its
/// quality figures come from the same code as plexus-search-bench's, and a task
/// whose steps name their tools plainly is found in full.
#[tokio::test]
async fn the_quick_bench_measures_tool_search_quality_and_speed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tool = |name: &str, description: &str| {
        serde_json::json!({"name": name, "description": description,
                           "inputSchema": {"type": "object", "properties": {}}})
    };
    let servers = serde_json::json!({"servers": [
        {"upstream": "clock", "instructions": "Time zones.", "tools": [
            tool("get_current_time", "The current time in a time zone."),
            tool("convert_time", "Converts a time between zones.")]},
        {"upstream": "files", "tools": [
            tool("read_file", "Reads a file."),
            tool("write_file", "Writes a file."),
            tool("list_directory", "Lists a directory.")]},
    ]});
    let tasks = serde_json::json!({"tasks": [
        {"task": "copy the current time into a file", "steps": [
            {"query": "current time", "tools": ["clock/get_current_time"]},
            {"query": "write a file", "tools": ["files/write_file"]}]},
        {"task": "read a file", "steps": [
            {"query": "read a file", "tools": ["files/read_file"]}]},
    ]});
    std::fs::write(dir.path().join("mcp-servers.json"), servers.to_string())?;
    let tasks_file = dir.path().join("tasks.json");
    std::fs::write(&tasks_file, tasks.to_string())?;
    let args: Vec<&OsStr> = vec![
        "--only-search".as_ref(),
        "--quick".as_ref(),
        "--search-data".as_ref(),
        dir.path().as_os_str(),
        "--search-tasks".as_ref(),
        tasks_file.as_os_str(),
    ];
    let output = bench(&args).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    println!("{stdout}");
    ensure!(output.status.success(), "exited with {}", output.status);
    ensure!(
        stdout.contains("search quality bfcl: skipped"),
        "no bfcl.json here, yet:\n{stdout}"
    );
    ensure!(
        stdout.contains(
            "search quality mcp tasks: 5 tools of 2 servers, 2 tasks, 3 steps: \
             step coverage@5 1.000, task recall@10 1.000; per step recall@1 1.000"
        ),
        "{stdout}"
    );
    ensure!(
        stdout.contains("search speed 2000 tools: search p50")
            && stdout.contains("search rebuild at 2000 tools"),
        "{stdout}"
    );
    ensure!(
        !stdout.contains("echo"),
        "the echo cells ran too:\n{stdout}"
    );
    Ok(())
}
