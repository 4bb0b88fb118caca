//! HAProxy (Debian's, installed by `scripts/ensure-haproxy`) in front of a
//! [`TestCluster`] on loopback: round robin, with or without affinity on
//! `Mcp-Session-Id`, health-checked on each node's `/readyz`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

use crate::cluster::{fresh_port, TestCluster};
use crate::eventually;

/// The configuration `packaging/haproxy/haproxy.cfg` ships, for `servers` and a
/// front port; `affinity` keeps its stick lines.
pub fn haproxy_config(
    port: u16,
    cluster: &TestCluster,
    nodes: &[usize],
    affinity: bool,
) -> anyhow::Result<String> {
    let shipped =
        std::fs::read_to_string(crate::workspace_root().join("packaging/haproxy/haproxy.cfg"))?;
    let servers: String = nodes
        .iter()
        .map(|&index| {
            let node = &cluster.nodes[index];
            format!(
                "    server {} 127.0.0.1:{} check port {} inter 200ms fall 1 rise 1\n",
                node.name, node.port, node.admin_port
            )
        })
        .collect();
    let mut config = String::new();
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("server ") || trimmed.starts_with("server-template ") {
            continue;
        }
        if !affinity && trimmed.starts_with("stick") {
            continue;
        }
        if trimmed.starts_with("bind ") {
            config.push_str(&format!("    bind 127.0.0.1:{port}\n"));
            continue;
        }
        // No log lines: the test reads HAProxy's stderr alone.
        if trimmed.starts_with("log ") || trimmed.starts_with("option httplog") {
            continue;
        }
        config.push_str(line);
        config.push('\n');
        if trimmed.starts_with("backend ") {
            config.push_str(&servers);
        }
    }
    Ok(config)
}

pub struct Balancer {
    child: Child,
    pub port: u16,
    pub config: String,
}

impl Balancer {
    /// Starts HAProxy before the nodes' ports; None if it is not installed.
    pub async fn start(
        cluster: &TestCluster,
        affinity: bool,
        dir: &Path,
    ) -> anyhow::Result<Option<Balancer>> {
        let all: Vec<usize> = (0..cluster.nodes.len()).collect();
        Balancer::start_with(cluster, &all, affinity, dir).await
    }

    /// In front of the nodes `nodes` (indices) alone.
    pub async fn start_with(
        cluster: &TestCluster,
        nodes: &[usize],
        affinity: bool,
        dir: &Path,
    ) -> anyhow::Result<Option<Balancer>> {
        let Some(haproxy) = which_haproxy() else {
            return Ok(None);
        };
        let mut taken: Vec<u16> = cluster
            .nodes
            .iter()
            .flat_map(|n| [n.port, n.admin_port])
            .collect();
        let port = fresh_port(&mut taken)?;
        let config = haproxy_config(port, cluster, nodes, affinity)?;
        let path = dir.join(format!("haproxy-{port}.cfg"));
        std::fs::write(&path, &config)?;
        let child = Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(
                dir.join(format!("haproxy-{port}.log")),
            )?)
            .kill_on_drop(true)
            .spawn()
            .context("starting haproxy")?;
        let balancer = Balancer {
            child,
            port,
            config,
        };
        let client = reqwest::Client::new();
        // Ready when it answers and every node has passed a health check.
        eventually(Duration::from_secs(10), async || {
            let answer = client.get(balancer.url()).send().await?;
            anyhow::ensure!(answer.status() != 503, "no node up yet");
            Ok(())
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Some(balancer))
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

pub fn which_haproxy() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([std::path::PathBuf::from("/usr/sbin")])
            .map(|dir| dir.join("haproxy"))
            .find(|path| path.is_file())
    })
}
