//! The console at `/` of the admin listener in a real browser: Debian's chromium,
//! driven through chromium-driver by Selenium (`tests/python/console_browser.py`,
//! installed by `scripts/ensure-browser`), against a real daemon with two fixture
//! upstreams (one drifting) and a second daemon whose admin listener is beyond
//! loopback. Screenshots of each state land in `target/console-screenshots/`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{fixture_upstream, venv_python, workspace_root, Daemon};

/// The script's own waits are seconds; this only catches a wedged browser.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

const ADMIN_TOKEN: &str = "console-admin-token-0123456789";

fn browser_installed() -> bool {
    let selenium = std::process::Command::new(venv_python())
        .args(["-c", "import selenium"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    selenium
        && std::path::Path::new("/usr/bin/chromium").exists()
        && std::path::Path::new("/usr/bin/chromedriver").exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_health_pins_catalog_and_activity_and_acts_in_a_real_browser(
) -> anyhow::Result<()> {
    // The test command installs the browser; a bare `cargo test` without it says
    // what to run instead of failing on a missing program.
    if !browser_installed() {
        println!(
            "skipped: chromium, chromium-driver or selenium missing; run scripts/ensure-browser"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    let sections = format!(
        "{}{}\n[views.small]\ntools = [\"alpha__echo\"]\n",
        fixture_upstream(
            "alpha",
            "",
            &["--drift-file", &drift_file.display().to_string()]
        ),
        fixture_upstream("beta", "", &[]),
    );
    let daemon = Daemon::builder()
        .dir(dir)
        .daemon("audit_log = \"audit.jsonl\"")
        .upstreams(sections)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let secure = Daemon::builder()
        .admin_listen("0.0.0.0:0")
        .daemon("auth_tokens = { ops = \"${ADMIN_TOKEN}\" }")
        .env(&[("ADMIN_TOKEN", ADMIN_TOKEN)])
        .start()
        .await?;
    let secure_admin = secure.admin.replace("0.0.0.0", "127.0.0.1");
    let secure_pid = secure.pid().context("the second daemon's pid")?.to_string();
    let shots = workspace_root().join("target/console-screenshots");

    let started = Instant::now();
    let child = tokio::process::Command::new(venv_python())
        .arg(workspace_root().join("tests/python/console_browser.py"))
        .args(["--admin", &daemon.admin, "--mcp", &daemon.url])
        .arg("--drift-file")
        .arg(&drift_file)
        .args(["--secure-admin", &secure_admin, "--token", ADMIN_TOKEN])
        .args(["--secure-pid", &secure_pid])
        .arg("--shots")
        .arg(&shots)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the browser script")?;
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .context("the browser script did not finish")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!(
        "browser run: {:.1} s\n{stdout}--- stderr\n{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "the browser checks failed (screenshots in {}):\n{stdout}\n{}\n--- daemon log\n{}",
        shots.display(),
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    // Every check ran and said so: a script that skipped one would not pass here.
    for check in [
        "page_loads_cleanly",
        "security_headers",
        "search_filters",
        "crash_shows",
        "restart_button",
        "approve_releases",
        "view_selector",
        "reload_button",
        "sparkline",
        "activity",
        "forged_form_refused",
        "phone_width",
        "login_required_beyond_loopback",
        "sign_out",
        "lost_connection_shows",
    ] {
        ensure!(
            stdout
                .lines()
                .any(|line| line.starts_with(&format!("ok {check}"))),
            "check {check} did not run:\n{stdout}"
        );
    }
    for shot in [
        "01-loaded",
        "03-crash",
        "05-held",
        "08-forged-refused",
        "10-login",
    ] {
        let path = shots.join(format!("{shot}.png"));
        ensure!(path.exists(), "no screenshot {}", path.display());
    }
    Ok(())
}
