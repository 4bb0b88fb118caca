//! Several `plexus serve` nodes of one `[cluster]` on loopback, each on a port of
//! its own that survives its restarts, with the fixture as their upstream.

use std::time::Duration;

use anyhow::Context;

use crate::{fixture_upstream, restartable_port, Daemon};

pub const CLUSTER_SECRET: &str = "a cluster secret of at least 32 characters";

/// One node's place: its name, port and, while it runs, its daemon.
pub struct Node {
    pub name: String,
    pub port: u16,
    /// Its admin listener's port, where `/readyz` is.
    pub admin_port: u16,
    pub daemon: Option<Daemon>,
    /// Kept across restarts: its state directory.
    dir: Option<tempfile::TempDir>,
}

pub struct TestCluster {
    pub nodes: Vec<Node>,
    /// The `[daemon]` lines and sections every node is given.
    daemon_lines: String,
    sections: String,
}

impl TestCluster {
    /// `count` nodes `n1`..; each lists every node (itself included) as a peer and
    /// runs the fixture as upstream `fx`.
    pub async fn start(
        count: usize,
        daemon_lines: &str,
        extra: &str,
    ) -> anyhow::Result<TestCluster> {
        TestCluster::start_with(count, daemon_lines, &[], extra).await
    }

    /// [`TestCluster::start`] with the fixture run with `fixture_args`.
    pub async fn start_with(
        count: usize,
        daemon_lines: &str,
        fixture_args: &[&str],
        extra: &str,
    ) -> anyhow::Result<TestCluster> {
        let mut nodes = Vec::new();
        let mut taken = Vec::new();
        for index in 0..count {
            nodes.push(Node {
                name: format!("n{}", index + 1),
                port: fresh_port(&mut taken)?,
                admin_port: fresh_port(&mut taken)?,
                daemon: None,
                dir: None,
            });
        }
        // From the environment, so one node can be given another address for a peer.
        let peers: Vec<String> = nodes
            .iter()
            .map(|node| {
                format!(
                    "{} = \"${{PLEXUS_PEER_{}}}\"",
                    node.name,
                    node.name.to_uppercase()
                )
            })
            .collect();
        let sections = format!(
            "{}\n{extra}\n[cluster]\nnode = \"${{PLEXUS_NODE}}\"\nsecret = \"${{PLEXUS_CLUSTER_SECRET}}\"\npeers = {{ {} }}\n",
            fixture_upstream("fx", "", fixture_args),
            peers.join(", ")
        );
        let mut cluster = TestCluster {
            nodes,
            daemon_lines: daemon_lines.to_string(),
            sections,
        };
        for index in 0..count {
            cluster.boot(index, &[]).await?;
        }
        for node in &cluster.nodes {
            node.daemon()?.wait_ready(Duration::from_secs(30)).await?;
        }
        Ok(cluster)
    }

    /// Starts node `index` (again), with `env` besides its name and the secret.
    pub async fn boot(&mut self, index: usize, env: &[(&str, &str)]) -> anyhow::Result<()> {
        let peers: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|node| {
                (
                    format!("PLEXUS_PEER_{}", node.name.to_uppercase()),
                    format!("http://127.0.0.1:{}", node.port),
                )
            })
            .collect();
        let peers: Vec<(&str, &str)> = peers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let node = &mut self.nodes[index];
        let mut builder = Daemon::builder()
            .daemon(self.daemon_lines.clone())
            .upstreams(self.sections.clone())
            .listen(format!("127.0.0.1:{}", node.port))
            .admin_listen(format!("127.0.0.1:{}", node.admin_port))
            .env(&[
                ("PLEXUS_NODE", node.name.as_str()),
                ("PLEXUS_CLUSTER_SECRET", CLUSTER_SECRET),
            ])
            .env(&peers)
            .env(env);
        if let Some(dir) = node.dir.take() {
            builder = builder.dir(dir);
        }
        node.daemon = Some(builder.start().await?);
        Ok(())
    }

    pub fn url(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}/mcp", self.nodes[index].port)
    }

    /// SIGTERM without waiting: the node starts draining.
    pub fn signal_stop(&self, index: usize) -> anyhow::Result<()> {
        let pid = self.nodes[index].daemon()?.pid().context("no pid")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        Ok(())
    }

    /// SIGKILL: the node vanishes with every session it held.
    pub async fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let daemon = self.nodes[index].daemon.take().context("not running")?;
        self.nodes[index].dir = Some(daemon.kill().await?);
        Ok(())
    }

    /// SIGTERM, and the exit status once it has drained.
    pub async fn stop(&mut self, index: usize) -> anyhow::Result<std::process::ExitStatus> {
        let daemon = self.nodes[index].daemon.take().context("not running")?;
        let (status, dir) = daemon.stop_keeping_state().await?;
        self.nodes[index].dir = Some(dir);
        Ok(status)
    }

    /// Every running node's log, for a failure's message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .filter_map(|node| {
                let daemon = node.daemon.as_ref()?;
                Some(format!("--- {} ---\n{}", node.name, daemon.log()))
            })
            .collect()
    }
}

impl Node {
    pub fn daemon(&self) -> anyhow::Result<&Daemon> {
        self.daemon
            .as_ref()
            .with_context(|| format!("{} is not running", self.name))
    }
}

/// A restartable port none of `taken` is.
pub fn fresh_port(taken: &mut Vec<u16>) -> anyhow::Result<u16> {
    for _ in 0..100 {
        let port = restartable_port()?;
        if !taken.contains(&port) {
            taken.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("no fresh port")
}
