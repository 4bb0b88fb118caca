//! One upstream, one state, whatever era its clients speak: a stateful dual-era server
//! built on the official Python SDK (`tests/python/dual_era_server.py`) behind plexus,
//! used in turns by a handshake-era and a 2026-07-28 client of the same SDK
//! (`tests/python/one_state_client.py`). Both see one counter kept by one process, a
//! tool added through either era reaches the pin check and both clients' lists, and a
//! breaking change made through either era is held for both; a tool that asks its
//! client with a request of its own reaches each client in the handshake era only. Run with the upstream in
//! the era plexus chooses (`protocol = "auto"`: 2026-07-28, which its
//! `server/discover` offers) and forced into the handshake era.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::{plexus_binary, venv_python, workspace_root, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_both_eras_share_one_upstream_state() -> anyhow::Result<()> {
    let root = workspace_root();
    let python = venv_python();
    ensure!(
        python.exists(),
        "target/python-venv is missing: run scripts/ensure-python-sdk (scripts/test does)"
    );
    for (extra, spoken) in [
        ("", "2026-07-28"),
        ("protocol = \"handshake\"\n", "2025-11-25"),
    ] {
        let section = format!(
            "[upstreams.dual]\ncommand = {:?}\nargs = [{:?}]\non_schema_change = \"block\"\n{extra}",
            python.display().to_string(),
            root.join("tests/python/dual_era_server.py")
                .display()
                .to_string(),
        );
        let daemon = Daemon::builder().upstreams(&section).start().await?;
        daemon.wait_ready(Duration::from_secs(60)).await?;
        let output = tokio::process::Command::new(&python)
            .arg(root.join("tests/python/one_state_client.py"))
            .arg("--url")
            .arg(&daemon.url)
            .arg("--plexus")
            .arg(plexus_binary())
            .arg("--config")
            .arg(daemon.dir.path().join("config.toml"))
            .arg("--upstream-era")
            .arg(if spoken == "2026-07-28" {
                "2026-07-28"
            } else {
                "handshake"
            })
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(300), output)
            .await
            .context("the client script did not finish in 300 s")??;
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        println!("upstream spoken to in {spoken}:\n{report}");
        ensure!(
            output.status.success(),
            "{spoken}: {report}\n{}",
            daemon.log()
        );
        for check in [
            "ok eras",
            "ok one-counter",
            "ok added",
            "ok held",
            "ok one-process",
        ] {
            ensure!(
                report.contains(check),
                "{spoken}: no `{check}` in\n{report}"
            );
        }
        let log = daemon.log();
        let started = log.matches("upstream initialized upstream=dual ").count();
        ensure!(
            started == 1
                && log.contains(&format!(
                    "upstream initialized upstream=dual protocol={spoken}"
                )),
            "{spoken}: dual started {started} times\n{log}"
        );
        ensure!(daemon.stop().await?.success());
    }
    Ok(())
}
