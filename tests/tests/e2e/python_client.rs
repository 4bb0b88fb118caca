//! plexus driven by a second, independent MCP client: the official Python SDK (`mcp`,
//! installed into `target/python-venv` by `scripts/ensure-python-sdk`) runs
//! `tests/python/plexus_client.py` over streamable HTTP and over stdio, against the
//! `everything` reference server and the fixture. The rmcp-based tests share code with
//! rmcp's server side; this one catches what only a client written apart would notice.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use plexus_tests::{fixture_upstream, plexus_binary, venv_python, workspace_root, Daemon};

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// The script gives itself 540 s; this bound only catches a wedged interpreter.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

fn sections() -> String {
    format!(
        "[upstreams.everything]\nnpx = \"{EVERYTHING}\"\ninit_timeout = \"180s\"\n\n{}",
        fixture_upstream("fx", "", &[])
    )
}

/// Runs the client script with `args`; its output is the report either way.
async fn run_script(args: &[&std::ffi::OsStr]) -> anyhow::Result<(bool, String)> {
    let script = workspace_root().join("tests/python/plexus_client.py");
    let started = Instant::now();
    let child = tokio::process::Command::new(venv_python())
        .arg(&script)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A timed-out run must not leave the interpreter (and its stdio plexus) behind.
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", venv_python().display()))?;
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .with_context(|| {
            format!(
                "{} did not finish within {SCRIPT_TIMEOUT:?}",
                script.display()
            )
        })??;
    let report = format!(
        "exit {:?} after {:.1} s\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    Ok((output.status.success(), report))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_client_passes_every_check_in_both_eras_over_http_and_stdio(
) -> anyhow::Result<()> {
    // The test command creates the venv; a bare `cargo test` on a machine without it
    // says what to run instead of failing on a missing interpreter.
    if !venv_python().exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return Ok(());
    }

    let daemon = Daemon::builder().upstreams(sections()).start().await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    // The SDK's default (auto) settles on 2026-07-28, so plexus bridges that era to the
    // handshake-era upstreams; legacy mode covers the handshake era end to end.
    let config = daemon.stdio_config(&sections())?;
    let plexus = plexus_binary();
    for mode in ["auto", "legacy"] {
        let (passed, report) = run_script(&[
            "--mode".as_ref(),
            mode.as_ref(),
            "--url".as_ref(),
            daemon.url.as_ref(),
        ])
        .await?;
        if !passed {
            bail!(
                "python client ({mode}) over HTTP failed: {report}\n--- plexus log\n{}",
                daemon.log()
            );
        }
        println!("python client ({mode}) over HTTP: {report}");

        // stdio: the script launches plexus itself, on a state directory of its own so
        // nothing is shared with the HTTP daemon but the warm npx cache.
        let (passed, report) = run_script(&[
            "--mode".as_ref(),
            mode.as_ref(),
            "--stdio".as_ref(),
            "--".as_ref(),
            plexus.as_os_str(),
            "serve".as_ref(),
            "--stdio".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ])
        .await?;
        if !passed {
            bail!(
                "python client ({mode}) over stdio failed (plexus's log is its stderr): {report}"
            );
        }
        println!("python client ({mode}) over stdio: {report}");
    }

    let status = daemon.stop().await?;
    anyhow::ensure!(status.success(), "plexus exited with {status}");
    Ok(())
}
