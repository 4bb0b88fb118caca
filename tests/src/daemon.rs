//! A real `plexus serve` for a test: its config written into a temporary
//! directory, started on port 0 and found by its runtime file, stopped or killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::plexus_binary;

/// A running `plexus serve` with its own temporary directory.
pub struct Daemon {
    child: Option<Child>,
    pub url: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts a daemon whose config is `[daemon]` on port 0 plus `sections`.
    pub async fn start(daemon_extra: &str, sections: &str) -> anyhow::Result<Daemon> {
        Daemon::start_in(tempfile::tempdir()?, daemon_extra, sections).await
    }

    /// Like [`Daemon::start`], in a directory kept from an earlier daemon (its state survives).
    pub async fn start_in(
        dir: tempfile::TempDir,
        daemon_extra: &str,
        sections: &str,
    ) -> anyhow::Result<Daemon> {
        Daemon::launch(dir, "127.0.0.1:0", daemon_extra, sections, &[]).await
    }

    /// Like [`Daemon::start_in`], listening on `listen` (a fixed port, so a
    /// restarted daemon is found where its clients left it).
    pub async fn start_on(
        dir: tempfile::TempDir,
        listen: &str,
        daemon_extra: &str,
        sections: &str,
    ) -> anyhow::Result<Daemon> {
        Daemon::launch(dir, listen, daemon_extra, sections, &[]).await
    }

    /// Like [`Daemon::start`], with these variables added to the daemon's environment
    /// (what `${NAME}` in its config expands to).
    pub async fn start_with_env(
        daemon_extra: &str,
        sections: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Daemon> {
        Daemon::launch(
            tempfile::tempdir()?,
            "127.0.0.1:0",
            daemon_extra,
            sections,
            env,
        )
        .await
    }

    /// Like [`Daemon::start`], running `binary` rather than the workspace's build
    /// (another build of plexus, to compare with).
    pub async fn start_binary(
        binary: &Path,
        daemon_extra: &str,
        sections: &str,
    ) -> anyhow::Result<Daemon> {
        Daemon::launch_binary(
            binary,
            tempfile::tempdir()?,
            "127.0.0.1:0",
            daemon_extra,
            sections,
            &[],
        )
        .await
    }

    async fn launch(
        dir: tempfile::TempDir,
        listen: &str,
        daemon_extra: &str,
        sections: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Daemon> {
        Daemon::launch_binary(&plexus_binary(), dir, listen, daemon_extra, sections, env).await
    }

    async fn launch_binary(
        binary: &Path,
        dir: tempfile::TempDir,
        listen: &str,
        daemon_extra: &str,
        sections: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Daemon> {
        let _ = std::fs::remove_file(dir.path().join("state").join("daemon.json"));
        let state = dir.path().join("state");
        let config = format!(
            "[daemon]\nlisten = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\nstate_dir = {:?}\n{daemon_extra}\n\n{sections}",
            state.display().to_string()
        );
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(dir.path().join("plexus.log"))?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("PLEXUS_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let runtime_file = state.join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(20);
        let runtime: Value = loop {
            if let Ok(text) = std::fs::read_to_string(&runtime_file) {
                break serde_json::from_str(&text)?;
            }
            if Instant::now() > deadline {
                bail!(
                    "plexus did not start: {}",
                    std::fs::read_to_string(dir.path().join("plexus.log"))?
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let field = |key: &str| {
            runtime[key]
                .as_str()
                .map(str::to_string)
                .context("daemon.json field")
        };
        Ok(Daemon {
            child: Some(child),
            url: field("url")?,
            admin: format!("http://{}", field("admin_listen")?),
            dir,
        })
    }

    /// Writes a config for `plexus serve --stdio` with these upstream sections and a
    /// state directory of its own, beside this daemon's, and returns its path.
    pub fn stdio_config(&self, sections: &str) -> anyhow::Result<PathBuf> {
        let config = self.dir.path().join("stdio.toml");
        let state = self.dir.path().join("stdio-state");
        std::fs::write(
            &config,
            format!(
                "[daemon]\nstate_dir = {:?}\n\n{sections}",
                state.display().to_string()
            ),
        )?;
        Ok(config)
    }

    /// Polls `/readyz` until every upstream is ready.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + within;
        let client = reqwest::Client::new();
        loop {
            let response = client.get(format!("{}/readyz", self.admin)).send().await?;
            let ready = response.status().is_success();
            let body: Value = response.json().await?;
            if ready {
                return Ok(body);
            }
            if Instant::now() > deadline {
                bail!(
                    "upstreams not ready after {within:?}: {body}\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("{}{path}", self.admin)).await?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("plexus.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// `plexus reload` on this daemon's config: its JSON report, once applied.
    pub async fn reload(&self) -> anyhow::Result<Value> {
        let output = Command::new(plexus_binary())
            .args(["reload", "--config"])
            .arg(self.dir.path().join("config.toml"))
            .output()
            .await?;
        let report = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!("plexus reload failed: {report}");
        }
        Ok(serde_json::from_str(&report)?)
    }

    /// SIGKILL: the daemon vanishes mid-session, as in a crash.
    pub async fn kill(mut self) -> anyhow::Result<tempfile::TempDir> {
        let mut child = self.child.take().context("already stopped")?;
        child.kill().await?;
        Ok(std::mem::replace(&mut self.dir, tempfile::tempdir()?))
    }

    /// Stops the daemon and hands back its directory, for a restart on the same state.
    pub async fn stop_keeping_state(
        mut self,
    ) -> anyhow::Result<(std::process::ExitStatus, tempfile::TempDir)> {
        let status = self.terminate().await?;
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir()?);
        Ok((status, dir))
    }

    /// SIGTERM, then wait for the exit status.
    pub async fn stop(mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.terminate().await
    }

    async fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("already stopped")?;
        if let Some(pid) = child.id() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            )?;
        }
        Ok(tokio::time::timeout(Duration::from_secs(30), child.wait()).await??)
    }
}
