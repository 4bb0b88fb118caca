//! A real `plexus serve` for a test: its config written into a temporary
//! directory, started on port 0 and found by its runtime file, stopped or killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::{eventually, plexus_binary};

/// A running `plexus serve` with its own temporary directory.
pub struct Daemon {
    child: Option<Child>,
    pub url: String,
    pub admin: String,
    pub dir: tempfile::TempDir,
}

/// What to start, built with [`Daemon::builder`]: by default the workspace's
/// `plexus` on `127.0.0.1:0`, in a fresh directory, with an empty config.
#[derive(Default)]
pub struct DaemonBuilder {
    binary: Option<PathBuf>,
    dir: Option<tempfile::TempDir>,
    listen: Option<String>,
    admin_listen: Option<String>,
    daemon: String,
    upstreams: String,
    env: Vec<(String, String)>,
}

impl DaemonBuilder {
    /// Lines added to the `[daemon]` section (after `listen`, `admin_listen` and
    /// `state_dir`).
    pub fn daemon(mut self, lines: impl Into<String>) -> Self {
        self.daemon = lines.into();
        self
    }

    /// The config after `[daemon]`: upstream sections, views, anything else.
    pub fn upstreams(mut self, sections: impl Into<String>) -> Self {
        self.upstreams = sections.into();
        self
    }

    /// A directory kept from an earlier daemon (its state survives).
    pub fn dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// A fixed listen address, so a restarted daemon is found where its clients
    /// left it.
    pub fn listen(mut self, listen: impl Into<String>) -> Self {
        self.listen = Some(listen.into());
        self
    }

    /// Where the admin listener binds (`127.0.0.1:0` by default): `0.0.0.0:0` puts it
    /// beyond loopback, where it asks for a token.
    pub fn admin_listen(mut self, admin_listen: impl Into<String>) -> Self {
        self.admin_listen = Some(admin_listen.into());
        self
    }

    /// Variables added to the daemon's environment (what `${NAME}` in its config
    /// expands to).
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// Runs `binary` rather than the workspace's build (another build of plexus,
    /// to compare with).
    pub fn binary(mut self, binary: &Path) -> Self {
        self.binary = Some(binary.to_path_buf());
        self
    }

    /// Writes the config, starts the daemon and waits for its runtime file.
    pub async fn start(self) -> anyhow::Result<Daemon> {
        let binary = self.binary.unwrap_or_else(plexus_binary);
        let dir = match self.dir {
            Some(dir) => dir,
            None => tempfile::tempdir()?,
        };
        let listen = self.listen.as_deref().unwrap_or("127.0.0.1:0");
        let admin_listen = self.admin_listen.as_deref().unwrap_or("127.0.0.1:0");
        let (daemon_extra, sections) = (&self.daemon, &self.upstreams);
        let _ = std::fs::remove_file(dir.path().join("state").join("daemon.json"));
        let state = dir.path().join("state");
        let config = format!(
            "[daemon]\nlisten = \"{listen}\"\nadmin_listen = \"{admin_listen}\"\nstate_dir = {:?}\n{daemon_extra}\n\n{sections}",
            state.display().to_string()
        );
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(dir.path().join("plexus.log"))?;
        let child = Command::new(&binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("PLEXUS_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
}

impl Daemon {
    /// What to start: `Daemon::builder().daemon("…").upstreams("…").start().await`.
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
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
        let client = reqwest::Client::new();
        eventually(within, async || {
            let response = client.get(format!("{}/readyz", self.admin)).send().await?;
            let ready = response.status().is_success();
            let body: Value = response.json().await?;
            anyhow::ensure!(ready, "upstreams not ready: {body}\n{}", self.log());
            Ok(body)
        })
        .await
    }

    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("{}{path}", self.admin)).await?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// The value of one metric series (name with labels, exactly as exported).
    pub async fn metric(&self, series: &str) -> anyhow::Result<Option<f64>> {
        let (_, text) = self.admin_get("/metrics").await?;
        Ok(text.lines().find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|value| value.parse().ok())
        }))
    }

    /// Waits until an upstream has `calls` calls in flight (by its gauge).
    pub async fn wait_for_in_flight(&self, upstream: &str, calls: usize) -> anyhow::Result<()> {
        let gauge = format!(r#"plexus_upstream_in_flight{{upstream="{upstream}"}}"#);
        eventually(Duration::from_secs(10), async || {
            anyhow::ensure!(
                self.metric(&gauge).await? == Some(calls as f64),
                "{calls} calls never got in flight on {upstream}"
            );
            Ok(())
        })
        .await
    }

    /// Waits until the daemon's log holds `needle`: the line that says a thing
    /// happened, rather than a pause long enough for it to have.
    pub async fn wait_for_log(&self, needle: &str, within: Duration) -> anyhow::Result<()> {
        eventually(within, async || {
            anyhow::ensure!(
                self.log().contains(needle),
                "no `{needle}` in the log:\n{}",
                self.log()
            );
            Ok(())
        })
        .await
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
