//! Pins against a real daemon and the fixture: the first sight of an upstream is
//! pinned to a private file; a schema changed across a daemon restart is found,
//! classified and counted; a corrupt pin file is never overwritten.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::{ensure, Context};
use plexus_tests::{eventually, fixture_upstream, Daemon};
use serde_json::Value;

fn alpha(schema: &str) -> String {
    fixture_upstream("alpha", "", &["--name", "pinned", "--add-schema", schema])
}

async fn metrics(daemon: &Daemon) -> anyhow::Result<String> {
    Ok(daemon.admin_get("/metrics").await?.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_sight_is_pinned_and_a_later_change_is_classified() -> anyhow::Result<()> {
    let daemon = Daemon::start("", &alpha("v1")).await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let pin_path = daemon.dir.path().join("plexus.lock");
    ensure!(
        eventually(Duration::from_secs(10), || pin_path.exists()).await,
        "no pin file: {}",
        daemon.log()
    );
    let mode = std::fs::metadata(&pin_path)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "pin file mode {mode:o}");
    let pinned: Value = serde_json::from_str(&std::fs::read_to_string(&pin_path)?)?;
    let entry = &pinned["upstreams"]["alpha"]["entries"]["tools/add"];
    ensure!(
        entry["security"].as_str().is_some_and(|h| h.len() == 64)
            && entry["compatibility"]
                .as_str()
                .is_some_and(|h| h.len() == 64),
        "{pinned}"
    );
    ensure!(
        pinned["upstreams"]["alpha"]["listing"]["server_name"] == "pinned",
        "the pin keeps what it pinned: {pinned}"
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(r#"plexus_schema_checks_total{outcome="pinned",upstream="alpha"} 1"#),
        "{text}"
    );
    ensure!(
        text.contains("plexus_catalog_fingerprint_info{fingerprint=\""),
        "{text}"
    );
    let before = std::fs::read_to_string(&pin_path)?;

    // The upstream comes back with `add` requiring a third parameter.
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success());
    let daemon = Daemon::start_in(dir, "", &alpha("v2")).await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    ensure!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("an upstream's schema changed since it was pinned"))
        .await,
        "no drift reported: {}",
        daemon.log()
    );
    let log = daemon.log();
    let drift = log
        .lines()
        .find(|line| line.contains("schema changed") && line.contains("required_added"))
        .with_context(|| format!("no required_added change: {log}"))?;
    ensure!(
        drift.contains("breaking") && drift.contains("/inputSchema/required"),
        "{drift}"
    );
    ensure!(drift.contains("entry=add"), "{drift}");
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(r#"plexus_schema_changes_total{class="breaking",upstream="alpha"}"#),
        "{text}"
    );
    ensure!(
        text.contains(r#"plexus_schema_checks_total{outcome="changed",upstream="alpha"}"#),
        "{text}"
    );
    // The pin stays what was first seen until it is approved.
    ensure!(std::fs::read_to_string(&pin_path)? == before);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_pin_file_is_reported_and_left_alone() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pin_path = dir.path().join("plexus.lock");
    let corrupt = "{\n  \"format\": 1,\n  \"upstreams\": { oops\n";
    std::fs::write(&pin_path, corrupt)?;
    let daemon = Daemon::start_in(dir, "", &alpha("v1")).await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    ensure!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("is not a valid pin file (line 3"))
        .await,
        "the error does not name the line: {}",
        daemon.log()
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(
            r#"plexus_schema_checks_total{outcome="pin_file_unreadable",upstream="alpha"}"#
        ),
        "{text}"
    );
    ensure!(
        std::fs::read_to_string(&pin_path)? == corrupt,
        "the pin file was overwritten"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
