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

/// The page's token, over plain HTTP (no browser needed): the page's own origin
/// with the token it was served may change the daemon; the same origin without it,
/// another origin with it, or a token served under another host may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_consoles_own_page_with_its_token_may_change_the_daemon() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("alpha", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let client = reqwest::Client::new();
    let page = client.get(format!("{}/", daemon.admin)).send().await?;
    for (header, expected) in [
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
    ] {
        ensure!(
            page.headers()[header] == expected,
            "{header}: {:?}",
            page.headers()
        );
    }
    let policy = page.headers()["content-security-policy"]
        .to_str()?
        .to_string();
    ensure!(
        policy.contains("script-src 'self'") && !policy.contains("unsafe"),
        "{policy}"
    );
    let page = page.text().await?;
    let token = page
        .split("name=\"plexus-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .context("no token in the page")?
        .to_string();
    let own = daemon.admin.clone();
    // Another loopback origin: allowed to read, never to change.
    let other_port = "http://127.0.0.1:1".to_string();
    let reload = |origin: &str, token: Option<&str>| {
        let mut request = client
            .post(format!("{}/reload", daemon.admin))
            .header("origin", origin.to_string());
        if let Some(token) = token {
            request = request.header("x-plexus-console", token.to_string());
        }
        request.send()
    };
    let refused = [
        ("own origin, no token", reload(&own, None).await?.status()),
        (
            "own origin, a forged token",
            reload(&own, Some("00.00")).await?.status(),
        ),
        (
            "another origin, the page's token",
            reload(&other_port, Some(&token)).await?.status(),
        ),
    ];
    for (case, status) in refused {
        ensure!(status == 403, "{case}: {status}");
    }
    let admitted = reload(&own, Some(&token)).await?;
    let status = admitted.status();
    let body = admitted.text().await?;
    ensure!(
        status == 200 && body.contains("\"outcome\":\"applied\""),
        "{status} {body}"
    );
    // A token served for `localhost:PORT` is no good under `127.0.0.1:PORT`.
    let port = own.rsplit(':').next().unwrap_or_default();
    let elsewhere = client
        .get(format!("{}/", daemon.admin))
        .header("host", format!("localhost:{port}"))
        .send()
        .await?
        .text()
        .await?;
    let foreign_token = elsewhere
        .split("name=\"plexus-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .context("no token in the page")?
        .to_string();
    ensure!(reload(&own, Some(&foreign_token)).await?.status() == 403);
    Ok(())
}
