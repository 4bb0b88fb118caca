//! What a reload changes: upstreams compared by name, each sorted into the way it
//! is applied, and the daemon and `[cluster]` settings that only a restart can change.

use std::collections::BTreeMap;

use super::{ClusterConfig, DaemonSettings, UpstreamConfig};

/// How a changed upstream is brought to its new configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamChange {
    Unchanged,
    /// Only settings read per call or per start changed: applied in place, the
    /// process is not touched.
    InPlace,
    /// How the process is started or spoken to changed: a new instance is started
    /// and warmed, and the old one drains.
    Restart,
}

impl UpstreamChange {
    pub fn between(old: &UpstreamConfig, new: &UpstreamConfig) -> UpstreamChange {
        if old == new {
            return UpstreamChange::Unchanged;
        }
        fn process(c: &UpstreamConfig) -> impl PartialEq + '_ {
            (
                &c.launch,
                c.protocol,
                c.share,
                c.start,
                c.enabled,
                // Given to the connection when it is made.
                c.max_message_bytes,
                // Read into the upstream's OAuth login when it is made.
                &c.oauth,
            )
        }
        if process(old) == process(new) {
            UpstreamChange::InPlace
        } else {
            UpstreamChange::Restart
        }
    }
}

/// Upstreams added, removed and changed between two configurations. Startup is
/// the diff from no upstreams at all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigDiff {
    pub added: Vec<UpstreamConfig>,
    pub removed: Vec<String>,
    pub restarted: Vec<UpstreamConfig>,
    pub updated: Vec<UpstreamConfig>,
}

impl ConfigDiff {
    pub fn between(
        old: &BTreeMap<String, UpstreamConfig>,
        new: &BTreeMap<String, UpstreamConfig>,
    ) -> ConfigDiff {
        let mut diff = ConfigDiff::default();
        for (name, upstream) in new {
            match old.get(name) {
                None => diff.added.push(upstream.clone()),
                Some(previous) => match UpstreamChange::between(previous, upstream) {
                    UpstreamChange::Unchanged => {}
                    UpstreamChange::InPlace => diff.updated.push(upstream.clone()),
                    UpstreamChange::Restart => diff.restarted.push(upstream.clone()),
                },
            }
        }
        diff.removed = old
            .keys()
            .filter(|name| !new.contains_key(*name))
            .cloned()
            .collect();
        diff
    }
}

/// The daemon keys whose change waits for a restart: the listeners are bound and
/// the state directory holds the running daemon's files.
pub fn daemon_keys_needing_restart(
    old: &DaemonSettings,
    new: &DaemonSettings,
) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.listen != new.listen {
        keys.push("daemon.listen");
    }
    if old.admin_listen != new.admin_listen {
        keys.push("daemon.admin_listen");
    }
    if old.state_dir != new.state_dir {
        keys.push("daemon.state_dir");
    }
    if old.pins != new.pins {
        keys.push("daemon.pins");
    }
    if old.max_connections != new.max_connections {
        keys.push("daemon.max_connections");
    }
    if old.header_read_timeout != new.header_read_timeout {
        keys.push("daemon.header_read_timeout");
    }
    if old.worker_threads != new.worker_threads {
        keys.push("daemon.worker_threads");
    }
    // The exporter is set up once, as the daemon starts.
    if old.tracing != new.tracing {
        keys.push("daemon.tracing");
    }
    keys
}

/// What a reload makes of `[cluster]`: the peers and the DNS name take effect at
/// once; the node's name and its secrets wait for a restart (the ids this node
/// sealed name it and were sealed with them), as does turning `[cluster]` on or off.
#[derive(Debug, PartialEq)]
pub struct ClusterChange {
    /// The `[cluster]` to run: the new peers and DNS name, the running rest.
    pub running: Option<ClusterConfig>,
    /// The peers or the DNS name changed.
    pub retargeted: bool,
    pub needs_restart: Vec<&'static str>,
}

impl ClusterChange {
    pub fn between(old: Option<&ClusterConfig>, new: Option<&ClusterConfig>) -> ClusterChange {
        let (Some(old), Some(new)) = (old, new) else {
            return ClusterChange {
                running: old.cloned(),
                retargeted: false,
                needs_restart: match old.is_some() == new.is_some() {
                    true => Vec::new(),
                    false => vec!["cluster"],
                },
            };
        };
        let mut needs_restart = Vec::new();
        if old.node != new.node {
            needs_restart.push("cluster.node");
        }
        if old.secrets.first() != new.secrets.first() {
            needs_restart.push("cluster.secret");
        }
        if old.secrets.get(1..) != new.secrets.get(1..) {
            needs_restart.push("cluster.previous_secrets");
        }
        ClusterChange {
            running: Some(ClusterConfig {
                peers: new.peers.clone(),
                dns: new.dns.clone(),
                ..old.clone()
            }),
            retargeted: old.peers != new.peers || old.dns != new.dns,
            needs_restart,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{parse, Config};

    fn config(text: &str) -> Config {
        parse(text, Path::new("/srv"), &|_| None).unwrap()
    }

    const BASE: &str = r#"
        [upstreams.alpha]
        command = "fixture"
        args = ["--one"]
        [upstreams.beta]
        command = "fixture"
        [upstreams.gamma]
        command = "fixture"
        [upstreams.delta]
        command = "fixture"
    "#;

    #[test]
    fn startup_is_the_diff_from_nothing() {
        let diff = ConfigDiff::between(&BTreeMap::new(), &config(BASE).upstreams);
        let added: Vec<&str> = diff.added.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(added, ["alpha", "beta", "delta", "gamma"]);
        assert!(diff.removed.is_empty() && diff.restarted.is_empty() && diff.updated.is_empty());
    }

    #[test]
    fn each_upstream_is_sorted_by_what_changed() {
        let old = config(BASE);
        let new = config(
            r#"
            [upstreams.alpha]
            command = "fixture"
            args = ["--two"]
            [upstreams.beta]
            command = "fixture"
            prefix = "b"
            call_timeout = "5s"
            [upstreams.gamma]
            command = "fixture"
            [upstreams.epsilon]
            url = "http://127.0.0.1:9/mcp"
        "#,
        );
        let diff = ConfigDiff::between(&old.upstreams, &new.upstreams);
        let names = |list: &[UpstreamConfig]| -> Vec<String> {
            list.iter().map(|u| u.name.clone()).collect()
        };
        assert_eq!(names(&diff.restarted), ["alpha"]);
        assert_eq!(names(&diff.updated), ["beta"]);
        assert_eq!(names(&diff.added), ["epsilon"]);
        assert_eq!(diff.removed, ["delta"]);
        assert_eq!(
            ConfigDiff::between(&old.upstreams, &old.upstreams),
            ConfigDiff::default()
        );
    }

    #[test]
    fn sharing_protocol_and_enabling_restart_the_upstream() {
        let old = config("[upstreams.a]\ncommand = \"x\"\n");
        for changed in [
            "share = \"session\"",
            "protocol = \"handshake\"",
            "enabled = false",
            "start = \"lazy\"",
            "env = { A = \"1\" }",
            "cwd = \"/tmp\"",
        ] {
            let new = config(&format!("[upstreams.a]\ncommand = \"x\"\n{changed}\n"));
            assert_eq!(
                UpstreamChange::between(&old.upstreams["a"], &new.upstreams["a"]),
                UpstreamChange::Restart,
                "{changed}"
            );
        }
        for changed in [
            "max_in_flight = 3",
            "deny_tools = [\"x\"]",
            "max_restarts = 1",
            "idle_timeout = \"1s\"",
        ] {
            let new = config(&format!("[upstreams.a]\ncommand = \"x\"\n{changed}\n"));
            assert_eq!(
                UpstreamChange::between(&old.upstreams["a"], &new.upstreams["a"]),
                UpstreamChange::InPlace,
                "{changed}"
            );
        }
    }

    #[test]
    fn a_changed_oauth_table_restarts_a_hosted_upstream() {
        let old = config("[upstreams.h]\nurl = \"https://h.example/mcp\"\n");
        let new = config(
            "[upstreams.h]\nurl = \"https://h.example/mcp\"\n[upstreams.h.oauth]\nclient_id = \"plexus\"\n",
        );
        assert_eq!(
            UpstreamChange::between(&old.upstreams["h"], &new.upstreams["h"]),
            UpstreamChange::Restart
        );
    }

    #[test]
    fn a_clusters_peers_change_live_and_its_name_and_keys_at_a_restart() {
        let cluster = |extra: &str| {
            let text = format!(
                "{BASE}\n[cluster]\nnode = \"n1\"\nsecret = \"{}\"\n{extra}",
                "s".repeat(32)
            );
            config(&text).cluster
        };
        let old = cluster("peers = { n1 = \"http://10.0.0.1:7464\" }");
        let more =
            cluster("peers = { n1 = \"http://10.0.0.1:7464\", n2 = \"http://10.0.0.2:7464\" }");
        let change = ClusterChange::between(old.as_ref(), more.as_ref());
        assert!(change.retargeted && change.needs_restart.is_empty());
        assert_eq!(change.running, more);

        let renamed = cluster("peers = { n1 = \"http://10.0.0.1:7464\" }").map(|c| ClusterConfig {
            node: "n9".into(),
            secrets: vec!["t".repeat(32)],
            ..c
        });
        let change = ClusterChange::between(old.as_ref(), renamed.as_ref());
        assert_eq!(change.needs_restart, ["cluster.node", "cluster.secret"]);
        assert!(!change.retargeted);
        // The running name and keys stay.
        assert_eq!(change.running, old);

        let change = ClusterChange::between(old.as_ref(), None);
        assert_eq!(change.needs_restart, ["cluster"]);
        assert_eq!(change.running, old);
        let change = ClusterChange::between(None, old.as_ref());
        assert_eq!(change.needs_restart, ["cluster"]);
        assert_eq!(change.running, None);
        assert_eq!(
            ClusterChange::between(old.as_ref(), old.as_ref())
                .needs_restart
                .len(),
            0
        );
    }

    #[test]
    fn listeners_and_the_state_directory_need_a_restart() {
        let old = config("[daemon]\nlisten = \"127.0.0.1:1\"\n");
        let new = config("[daemon]\nlisten = \"127.0.0.1:2\"\ndrain_timeout = \"3s\"\n");
        assert_eq!(
            daemon_keys_needing_restart(&old.daemon, &new.daemon),
            ["daemon.listen"]
        );
        let threads = config("[daemon]\nlisten = \"127.0.0.1:1\"\nworker_threads = 1\n");
        assert_eq!(
            daemon_keys_needing_restart(&old.daemon, &threads.daemon),
            ["daemon.worker_threads"]
        );
    }
}
