//! The `plexus` command line: `check-config` on the shipped and on broken files;
//! `--admin` as an address or a name and port, anything else a usage error;
//! `--version` with the git commit; `plexus health`.

use std::process::Command;

use anyhow::ensure;
use plexus_tests::{plexus_binary, Daemon};

fn check_config(path: &std::path::Path) -> anyhow::Result<(i32, String, String)> {
    let output = Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(path)
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[test]
fn the_shipped_config_passes_check_config() -> anyhow::Result<()> {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.toml");
    let (code, stdout, stderr) = check_config(&shipped)?;
    ensure!(code == 0, "exit {code}: {stderr}");
    ensure!(stdout.contains("valid"), "{stdout}");
    Ok(())
}

#[test]
fn check_config_lists_every_error_and_exits_64() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[daemon]\nlisten = \"nowhere\"\n[upstreams.Bad]\ncommand = \"x\"\n[upstreams.two]\nuvx = \"a\"\nnpx = \"b\"\n[upstreams.typo]\ncomand = \"x\"\n",
    )?;
    let (code, _, stderr) = check_config(&path)?;
    ensure!(code == 64, "exit {code}: {stderr}");
    for key in [
        "daemon.listen",
        "upstreams.Bad",
        "upstreams.two",
        "upstreams.typo: unknown field `comand`",
    ] {
        ensure!(stderr.contains(key), "`{key}` not reported in:\n{stderr}");
    }
    let (code, _, stderr) = check_config(&dir.path().join("missing.toml"))?;
    ensure!(
        code == 64 && stderr.contains("cannot read"),
        "exit {code}: {stderr}"
    );
    Ok(())
}

#[test]
fn serve_refuses_a_bad_config_without_starting() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[upstreams.x]\nurl = \"ftp://example.invalid/mcp\"\n",
    )?;
    let output = Command::new(plexus_binary())
        .args(["serve", "--config"])
        .arg(&path)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.code() == Some(64), "{stderr}");
    ensure!(stderr.contains("upstreams.x.url"), "{stderr}");
    Ok(())
}

/// `--admin` names the admin listener by address or by name and port (`localhost`,
/// resolved by the command line, as before when it went to the connect); a value
/// that is neither is a usage error (exit 2, as clap's are) before anything is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_is_an_address_or_a_name_and_port() -> anyhow::Result<()> {
    let daemon = Daemon::builder().start().await?;
    let port = daemon
        .admin
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    // A config file that does not exist: the listener comes from --admin alone.
    let missing = daemon.dir.path().join("missing.toml");
    let plexus = |args: Vec<String>| {
        let missing = missing.clone();
        async move {
            let output = tokio::process::Command::new(plexus_binary())
                .args(&args)
                .arg("--config")
                .arg(&missing)
                .output()
                .await?;
            Ok::<_, anyhow::Error>((
                output.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ))
        }
    };
    for admin in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (code, stdout, stderr) = plexus(vec![
            "status".into(),
            "--json".into(),
            "--admin".into(),
            admin.clone(),
        ])
        .await?;
        ensure!(code == 0, "status --admin {admin}: exit {code}: {stderr}");
        let status: serde_json::Value = serde_json::from_str(&stdout)?;
        ensure!(status["upstreams"].is_array(), "{status}");
        // A change: the Host it sends names the listener's own port.
        let (code, stdout, stderr) =
            plexus(vec!["reload".into(), "--admin".into(), admin.clone()]).await?;
        let answer: serde_json::Value = serde_json::from_str(&stdout).map_err(|error| {
            anyhow::anyhow!("reload --admin {admin}: exit {code}: {error}: {stdout}{stderr}")
        })?;
        ensure!(answer["outcome"].is_string(), "{answer}");
    }
    for bad in ["nonsense", "127.0.0.1", "localhost:port", "127.0.0.1:70000"] {
        for command in [
            &["status"][..],
            &["restart", "x"],
            &["reload"],
            &["pins", "status"],
        ] {
            let mut args: Vec<String> = command.iter().map(|word| word.to_string()).collect();
            args.extend(["--admin".to_string(), bad.to_string()]);
            let (code, _, stderr) = plexus(args.clone()).await?;
            ensure!(
                code == 2 && stderr.contains("--admin"),
                "{args:?}: exit {code}: {stderr}"
            );
        }
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// `plexus --version` names the version and the commit the binary was built from
/// (the checkout's HEAD: `scripts/test` builds before it tests).
#[test]
fn version_shows_the_version_and_the_git_commit() -> anyhow::Result<()> {
    let output = Command::new(plexus_binary()).arg("--version").output()?;
    let shown = String::from_utf8_lossy(&output.stdout).trim().to_string();
    ensure!(output.status.success(), "exit {}: {shown}", output.status);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string());
    let expected = format!(
        "plexus {} ({})",
        env!("CARGO_PKG_VERSION"),
        head.as_deref().unwrap_or("unknown")
    );
    ensure!(
        shown == expected,
        "`plexus --version` printed {shown:?}, expected {expected:?} (built before the last commit? cargo build --workspace --bins)"
    );
    Ok(())
}

/// `plexus health` (the container's health check) asks the admin listener the
/// config names, here found through daemon.json as its port is 0: exit 0 and `ok`
/// while the daemon runs, 69 once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_asks_healthz_and_exits_69_without_a_daemon() -> anyhow::Result<()> {
    let daemon = Daemon::builder().start().await?;
    let config = daemon.dir.path().join("config.toml");
    let health = || {
        tokio::process::Command::new(plexus_binary())
            .args(["health", "--config"])
            .arg(&config)
            .output()
    };
    let output = health().await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.code() == Some(0) && stdout.trim() == "ok",
        "with a daemon: {}: {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(daemon.stop().await?.success());
    let output = health().await?;
    ensure!(
        output.status.code() == Some(69),
        "without a daemon: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
