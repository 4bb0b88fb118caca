//! systemd support: the shipped unit passes `systemd-analyze verify`, and a real
//! `plexus serve` reports READY, STATUS, WATCHDOG and STOPPING on NOTIFY_SOCKET.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::{fixture_binary, fixture_upstream, plexus_binary};
use tokio::net::UnixDatagram;
use tokio::process::Command;

/// The ExecStart of the shipped unit; the verify test points it at the built binary.
const SHIPPED_EXEC_START: &str = "ExecStart=/usr/local/bin/plexus ";

fn shipped_unit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/plexus.service")
}

#[test]
fn the_unit_declares_what_plexus_relies_on() -> anyhow::Result<()> {
    let unit = std::fs::read_to_string(shipped_unit())?;
    let lines: Vec<&str> = unit.lines().map(str::trim).collect();
    for expected in [
        "Type=notify-reload",
        "NotifyAccess=main",
        "ExecStart=/usr/local/bin/plexus serve --config /etc/plexus/config.toml",
        "Restart=on-failure",
        "KillMode=control-group",
        "TimeoutStopSec=30",
        "WatchdogSec=30",
        "StateDirectory=plexus",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "Environment=PATH=/usr/local/bin:/usr/bin:/bin",
    ] {
        ensure!(
            lines.contains(&expected),
            "`{expected}` missing from {}",
            shipped_unit().display()
        );
    }
    Ok(())
}

#[test]
fn the_unit_passes_systemd_analyze_verify() -> anyhow::Result<()> {
    let version = match std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    {
        Ok(output) if output.status.success() => systemd_version(&output.stdout),
        _ => {
            // CI machines without systemd still run the rest of the suite.
            println!("skipped: systemd-analyze not installed");
            return Ok(());
        }
    };
    // `verify` rejects an ExecStart binary that does not exist, and nothing is
    // installed in /usr/local/bin here: check a copy that runs the built one.
    let binary = std::fs::canonicalize(plexus_binary())
        .with_context(|| format!("{} not built", plexus_binary().display()))?;
    let unit = std::fs::read_to_string(shipped_unit())?;
    ensure!(
        unit.contains(SHIPPED_EXEC_START),
        "the unit has no `{SHIPPED_EXEC_START}` line"
    );
    let mut rewritten = unit.replace(
        SHIPPED_EXEC_START,
        &format!("ExecStart={} ", binary.display()),
    );
    if version < 253 {
        // What the unit's comment tells users of an older systemd to write.
        println!("systemd {version}: verifying the unit as Type=notify with ExecReload");
        rewritten = rewritten.replace(
            "Type=notify-reload",
            "Type=notify\nExecReload=/bin/kill -HUP $MAINPID",
        );
    }
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("plexus.service");
    std::fs::write(&copy, rewritten)?;

    let output = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "systemd-analyze verify failed ({}):\n{stderr}",
        output.status
    );
    // Unknown keys and sections are only warnings (exit 0), so read them; lines
    // about other units on the machine are not ours to judge.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("plexus.service"))
        .collect();
    ensure!(
        ours.is_empty(),
        "systemd-analyze verify warned about the unit:\n{}",
        ours.join("\n")
    );
    for warning in ["Unknown key", "Unknown section", "Unknown lvalue"] {
        ensure!(!stderr.contains(warning), "{warning} in:\n{stderr}");
    }
    Ok(())
}

/// The number in `systemd 252 (252.38-1~deb12u1)`.
fn systemd_version(output: &[u8]) -> u32 {
    String::from_utf8_lossy(output)
        .split_whitespace()
        .nth(1)
        .and_then(|word| word.parse().ok())
        .unwrap_or(0)
}

/// Every `KEY=VALUE` line plexus sent, in arrival order.
struct Notifications {
    socket: UnixDatagram,
    lines: Vec<String>,
}

impl Notifications {
    /// Receives until a line satisfies `wanted` or `within` passes.
    async fn wait_for(
        &mut self,
        within: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        if let Some(line) = self.lines.iter().find(|line| wanted(line)) {
            return Ok(line.clone());
        }
        let deadline = Instant::now() + within;
        let mut buffer = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(received) = tokio::time::timeout(left, self.socket.recv(&mut buffer)).await
            else {
                bail!("not received within {within:?}; got {:?}", self.lines);
            };
            let text = String::from_utf8_lossy(&buffer[..received?]).into_owned();
            // One datagram may carry several assignments, one per line.
            for line in text.lines() {
                self.lines.push(line.to_string());
                if wanted(line) {
                    return Ok(line.to_string());
                }
            }
        }
    }

    fn position(&self, line: &str) -> Option<usize> {
        self.lines.iter().position(|l| l == line)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_notifies_ready_status_watchdog_and_stopping() -> anyhow::Result<()> {
    ensure!(
        fixture_binary().exists(),
        "{} not built",
        fixture_binary().display()
    );
    let dir = tempfile::tempdir()?;
    let socket_path = dir.path().join("notify.sock");
    let mut notifications = Notifications {
        socket: UnixDatagram::bind(&socket_path)?,
        lines: Vec::new(),
    };
    let config = format!(
        "[daemon]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nstate_dir = {:?}\n\n{}",
        dir.path().join("state").display().to_string(),
        fixture_upstream("fx", "", &[])
    );
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config)?;
    let log_path = dir.path().join("plexus.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let mut child = Command::new(plexus_binary())
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .env("NOTIFY_SOCKET", &socket_path)
        // 1 s watchdog, so a ping is due every 500 ms; no WATCHDOG_PID, as the
        // child's pid is not known before it starts.
        .env("WATCHDOG_USEC", "1000000")
        .env_remove("WATCHDOG_PID")
        .env("PLEXUS_LOG", "info,plexus=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", plexus_binary().display()))?;

    notifications
        .wait_for(Duration::from_secs(10), |line| line == "READY=1")
        .await
        .with_context(|| format!("READY=1: {}", log()))?;
    notifications
        .wait_for(Duration::from_secs(10), |line| {
            line.starts_with("STATUS=1 upstreams configured, ")
        })
        .await
        .with_context(|| format!("STATUS with upstream counts: {}", log()))?;
    notifications
        .wait_for(Duration::from_secs(30), |line| {
            line == "STATUS=1 upstreams configured, 1 ready"
        })
        .await
        .with_context(|| format!("STATUS once the fixture is ready: {}", log()))?;
    notifications
        .wait_for(Duration::from_secs(10), |line| line == "WATCHDOG=1")
        .await
        .with_context(|| format!("WATCHDOG=1: {}", log()))?;

    let pid = child.id().context("plexus exited early")?;
    // A reload (what `systemctl reload` asks with SIGHUP under Type=notify-reload):
    // RELOADING=1 with the monotonic clock, then READY=1 and a STATUS line.
    let already = notifications.lines.len();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGHUP,
    )?;
    notifications
        .wait_for(Duration::from_secs(10), |line| {
            line.starts_with("STATUS=configuration reloaded (applied)")
        })
        .await
        .with_context(|| format!("STATUS after the reload: {}", log()))?;
    let after: Vec<&String> = notifications.lines[already..].iter().collect();
    let reloading = after
        .iter()
        .position(|line| *line == "RELOADING=1")
        .with_context(|| format!("RELOADING=1 after SIGHUP: {after:?}"))?;
    let usec = after
        .get(reloading + 1)
        .and_then(|line| line.strip_prefix("MONOTONIC_USEC="))
        .and_then(|value| value.parse::<u64>().ok())
        .with_context(|| format!("MONOTONIC_USEC with RELOADING=1: {after:?}"))?;
    ensure!(usec > 0);
    let ready = after
        .iter()
        .rposition(|line| *line == "READY=1")
        .with_context(|| format!("READY=1 after the reload: {after:?}"))?;
    ensure!(
        reloading < ready,
        "READY=1 must follow RELOADING=1: {after:?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    notifications
        .wait_for(Duration::from_secs(10), |line| line == "STOPPING=1")
        .await
        .with_context(|| format!("STOPPING=1: {}", log()))?;
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .context("plexus did not exit within 30 s of SIGTERM")??;
    ensure!(exit.success(), "plexus exited with {exit}: {}", log());
    ensure!(
        notifications.position("READY=1") < notifications.position("STOPPING=1"),
        "READY=1 must come before STOPPING=1: {:?}",
        notifications.lines
    );
    Ok(())
}
