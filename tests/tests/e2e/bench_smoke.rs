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
