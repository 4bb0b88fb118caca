//! `[cluster]`: the node's name, its peers (by name, or a DNS name whose A records
//! they are) and the shared secret with its predecessors.

use std::path::Path;

use super::values::secret_value;
use crate::config::raw::RawCluster;
use crate::config::{ClusterConfig, ConfigIssue};

/// Shortest cluster secret: it keys the HMAC that session ids and node-to-node
/// requests are signed with.
const MIN_SECRET_LENGTH: usize = 32;

pub(super) fn validate_cluster(
    raw: toml::Value,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<ClusterConfig> {
    let before = issues.len();
    let mut issue = |key: &str, message: String| {
        issues.push(ConfigIssue {
            key: format!("cluster.{key}"),
            message,
        })
    };
    let raw = match raw.try_into::<RawCluster>() {
        Ok(raw) => raw,
        Err(error) => {
            issues.push(ConfigIssue {
                key: "cluster".into(),
                message: error.message().to_string(),
            });
            return None;
        }
    };
    let node = match raw
        .node
        .as_deref()
        .map(|node| secret_value(node, base, environment))
    {
        None => {
            issue(
                "node",
                "every node needs a name (`node = \"${HOSTNAME}\"`)".into(),
            );
            String::new()
        }
        Some(Err(message)) => {
            issue("node", message);
            String::new()
        }
        Some(Ok(node)) if !is_node_name(&node) => {
            issue(
                "node",
                format!(
                    "`{node}` is not a node name (1 to 63 letters, digits, `.`, `:`, `_`, `-`)"
                ),
            );
            node
        }
        Some(Ok(node)) => node,
    };
    let mut peers = std::collections::BTreeMap::new();
    for (name, address) in raw.peers {
        if !is_node_name(&name) {
            issue(
                &format!("peers.{name}"),
                "not a node name (letters, digits, `.`, `:`, `_`, `-`)".into(),
            );
            continue;
        }
        match secret_value(&address, base, environment).and_then(|a| peer_address(&a)) {
            Ok(address) => {
                peers.insert(name, address);
            }
            Err(message) => issue(&format!("peers.{name}"), message),
        }
    }
    let dns = match raw
        .dns
        .as_deref()
        .map(|dns| secret_value(dns, base, environment))
    {
        None => None,
        Some(Ok(dns)) if dns_target(&dns) => Some(dns),
        Some(Ok(dns)) => {
            issue("dns", format!("`{dns}` is not `name:port`"));
            None
        }
        Some(Err(message)) => {
            issue("dns", message);
            None
        }
    };
    let mut secrets = Vec::new();
    match raw.secret {
        None => issue(
            "secret",
            "nodes sign what they hand each other: set `secret = \"${PLEXUS_CLUSTER_SECRET}\"`"
                .into(),
        ),
        Some(text) => secrets.push(("secret".to_string(), text)),
    }
    for (index, text) in raw.previous_secrets.into_iter().enumerate() {
        secrets.push((format!("previous_secrets[{index}]"), text));
    }
    let mut ring = Vec::new();
    for (key, text) in secrets {
        match secret_value(&text, base, environment) {
            Ok(secret) if secret.len() >= MIN_SECRET_LENGTH => ring.push(secret),
            // The value itself is never repeated.
            Ok(_) => issue(
                &key,
                format!("a cluster secret must be at least {MIN_SECRET_LENGTH} characters long"),
            ),
            Err(message) => issue(&key, message),
        }
    }
    (issues.len() == before).then_some(ClusterConfig {
        node,
        peers,
        dns,
        secrets: ring,
    })
}

/// A node's name: it travels in session ids and headers, so it is kept plain.
pub fn is_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(&b))
}

/// `http://host:port`, the peer's MCP listener (no path: plexus adds `/mcp`).
fn peer_address(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|error| format!("`{text}` is not a URL: {error}"))?;
    if url.scheme() != "http"
        || url.host_str().is_none()
        || url.path() != "/"
        || url.query().is_some()
    {
        return Err(format!("`{text}` is not `http://host:port`"));
    }
    Ok(text.trim_end_matches('/').to_string())
}

fn dns_target(text: &str) -> bool {
    text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port > 0)
    })
}
