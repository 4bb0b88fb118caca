//! `plexus-bench --quick`: every target of the benchmark, with few calls and every
//! reply checked, so the bench cannot rot between the runs that measure.

use std::time::Duration;

use anyhow::{ensure, Context};

/// A debug build's quick run takes well under a minute; this is for a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_quick_bench_runs_every_target_and_verifies_every_reply() -> anyhow::Result<()> {
    let bench = plexus_tests::binary_dir().join("plexus-bench");
    let run = tokio::process::Command::new(&bench)
        .arg("--quick")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(TIMEOUT, run)
        .await
        .with_context(|| format!("plexus-bench --quick ran over {TIMEOUT:?}"))?
        .with_context(|| format!("running {}", bench.display()))?;
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    ensure!(
        output.status.success(),
        "plexus-bench --quick exited with {}",
        output.status
    );
    Ok(())
}
