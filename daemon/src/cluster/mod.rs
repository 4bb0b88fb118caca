//! More than one node behind a plain balancer (`[cluster]`). A handshake-era
//! session lives on the node that opened it, and its id names that node, sealed
//! (`seal`) so it can be neither forged nor used by another principal; a request
//! arriving elsewhere is forwarded once, over HTTP, to the owner (`forward`). A
//! 2026-07-28 request runs where it lands; only a paused round's `requestState`
//! names its node the same way, and a `subscriptions/listen` stream is opened on
//! every peer too (`listen`), so it hears changes made through any node. No
//! shared store: what a node holds, only it serves.

mod forward;
mod listen;
mod seal;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use serde_json::Value;
use tokio::sync::watch;

use crate::config::ClusterConfig;
use crate::jsonrpc::Answer;
pub use forward::ForwardError;
pub use listen::PeerListen;
pub use seal::Unsealed;
use seal::{KeyRing, Purpose};

/// Marks a request one node forwards to another: the sender's name and a token
/// over the request line signed with the cluster secret.
pub const FORWARDED_BY_HEADER: &str = "plexus-forwarded-by";
pub const PEER_AUTH_HEADER: &str = "plexus-cluster-auth";
/// Set on an answer a peer gave: the node that served it.
pub const SERVED_BY_HEADER: &str = "plexus-served-by";
/// Prefix of the `requestState` of a paused round (the bridge's own states).
pub const STATE_PREFIX: &str = "plexus.";
/// How far apart two nodes' clocks may be for a forwarded request to be taken.
const PEER_CLOCK_SKEW: u64 = 60;
/// How long a forward may wait for a connection to the owner.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a token says its session or round lives.
#[derive(Debug, PartialEq, Eq)]
pub enum Owner {
    Here,
    Peer(String),
}

/// A forwarded request that does not carry the cluster's signature.
#[derive(Debug, thiserror::Error)]
#[error("a request forwarded by `{from}` is not signed with the cluster secret: {reason}")]
pub struct ForgedPeer {
    pub from: String,
    reason: &'static str,
}

pub struct Cluster {
    node: String,
    ring: KeyRing,
    /// Where the other nodes are: a reload may change it ([`Cluster::retarget`]);
    /// listens watch it to open their new peers' streams.
    targets: watch::Sender<Arc<Targets>>,
    client: forward::PeerClient,
    /// Set by a shutdown signal: no new sessions here, `/readyz` answers 503.
    draining: AtomicBool,
}

/// The peers named, and the DNS name whose A records are peers too.
#[derive(Debug, PartialEq)]
struct Targets {
    peers: BTreeMap<String, String>,
    dns: Option<String>,
}

impl Targets {
    fn of(config: &ClusterConfig) -> Arc<Targets> {
        Arc::new(Targets {
            peers: config.peers.clone(),
            dns: config.dns.clone(),
        })
    }
}

impl Cluster {
    pub fn new(config: &ClusterConfig) -> Cluster {
        Cluster {
            node: config.node.clone(),
            ring: KeyRing::new(&config.secrets),
            targets: watch::Sender::new(Targets::of(config)),
            client: forward::PeerClient::new(),
            draining: AtomicBool::new(false),
        }
    }

    /// A reload's peers and DNS name, in force from the next forward on; open
    /// listens open their new peers' streams at once. (The node's name and keys
    /// are the running ones: see `config::ClusterChange`.)
    pub fn retarget(&self, config: &ClusterConfig) {
        let targets = Targets::of(config);
        self.targets.send_if_modified(|running| {
            let changed = *running != targets;
            *running = targets;
            changed
        });
    }

    fn targets(&self) -> Arc<Targets> {
        self.targets.borrow().clone()
    }

    /// A new session's id, naming this node, valid for `principal` only.
    pub fn new_session_id(&self, principal: &str) -> String {
        self.ring.seal(Purpose::Session, &self.node, principal)
    }

    /// The node a session id names, if this cluster sealed it for `principal`.
    pub fn owner_of_session(&self, id: &str, principal: &str) -> Result<Owner, Unsealed> {
        self.ring
            .open(Purpose::Session, id, principal)
            .map(|node| self.owner(node))
    }

    /// A paused round's `requestState`, naming this node.
    pub fn new_state(&self) -> String {
        format!(
            "{STATE_PREFIX}{}",
            self.ring.seal(Purpose::State, &self.node, "")
        )
    }

    /// The node a `requestState` plexus handed out names, and for a 2026-07-28
    /// upstream's own state that plexus sealed on its way out to `principal`, that
    /// state as the upstream wrote it; None: not one plexus handed out, served
    /// where it lands. Another principal's is refused as an edited one is.
    pub fn owner_of_state(
        &self,
        state: &str,
        principal: &str,
    ) -> Option<Result<(Owner, Option<String>), Unsealed>> {
        self.open_carried(Purpose::State, state, principal)
    }

    /// The node a task id names (one a 2026-07-28 upstream's task on that node had,
    /// sealed on its way out to `principal`), and the id as plexus knows it there.
    pub fn owner_of_task(
        &self,
        task: &str,
        principal: &str,
    ) -> Option<Result<(Owner, String), Unsealed>> {
        Some(match self.open_carried(Purpose::Task, task, principal)? {
            Ok((owner, Some(task))) => Ok((owner, task)),
            Ok((_, None)) => Err(Unsealed::Malformed),
            Err(refused) => Err(refused),
        })
    }

    /// `plexus.<token>` or `plexus.<token>.<carried, base64url>`.
    fn open_carried(
        &self,
        purpose: Purpose,
        text: &str,
        principal: &str,
    ) -> Option<Result<(Owner, Option<String>), Unsealed>> {
        let sealed = text.strip_prefix(STATE_PREFIX)?;
        Some(
            self.ring
                .open_carried(purpose, sealed, principal)
                .map(|(node, carried)| (self.owner(node), carried)),
        )
    }

    fn seal_carried(&self, purpose: Purpose, principal: &str, carried: &str) -> String {
        let sealed = self
            .ring
            .seal_carried(purpose, &self.node, principal, carried);
        format!("{STATE_PREFIX}{sealed}")
    }

    /// An answer for a 2026-07-28 client of `principal` with what the upstream
    /// process of this node holds sealed to name it and that principal: the
    /// upstream's own `requestState` and its tasks' ids, so a retry or a `tasks/*`
    /// request landing elsewhere is forwarded here, and one another principal
    /// presents opens nowhere. Other answers pass unread but for a search for
    /// those members.
    pub fn seal_upstream_state(&self, answer: Answer, principal: &str) -> Answer {
        if let Answer::Serialized(bytes) = &answer {
            let finds = |member: &[u8]| memchr::memmem::find(bytes, member).is_some();
            if !finds(b"\"requestState\"") && !finds(b"\"taskId\"") {
                return answer;
            }
        }
        let mut value = answer.into_value();
        let Some(result) = value.get_mut("result") else {
            return Answer::Value(value);
        };
        if let Some(Value::String(state)) = result.get_mut("requestState") {
            if !state.starts_with(STATE_PREFIX) {
                *state = self.seal_carried(Purpose::State, principal, state);
            }
        }
        crate::tasks::rewrite_task_ids(result, &|task| {
            (!task.starts_with(STATE_PREFIX))
                .then(|| self.seal_carried(Purpose::Task, principal, task))
        });
        Answer::Value(value)
    }

    /// A listen's `taskIds` as this node knows them: those sealed for
    /// `principal` naming this node, opened. Another node's are left to its own
    /// listen (the merge opens the same one there); one that opens nowhere is
    /// left out, as an unknown task.
    pub fn open_listened_tasks(&self, params: Option<&mut Value>, principal: &str) {
        let Some(Value::Array(ids)) = params
            .and_then(|params| params.get_mut("notifications"))
            .and_then(|filter| filter.get_mut("taskIds"))
        else {
            return;
        };
        ids.retain_mut(|id| {
            let Some(text) = id.as_str() else {
                return false;
            };
            match self.owner_of_task(text, principal) {
                Some(Ok((Owner::Here, original))) => {
                    *id = Value::String(original);
                    true
                }
                Some(_) => false,
                // Not one the cluster sealed: no route of this node names it.
                None => false,
            }
        });
    }

    /// A listen's message as its client knows the tasks it names: sealed for
    /// `principal` and this node, as its answers gave them (a peer's, already
    /// sealed there, passes as it is).
    pub fn seal_listen_message(&self, message: &mut Value, principal: &str) {
        let seal = |task: &str| {
            (!task.starts_with(STATE_PREFIX))
                .then(|| self.seal_carried(Purpose::Task, principal, task))
        };
        match message.get("method").and_then(Value::as_str) {
            Some("notifications/tasks") => {
                if let Some(params) = message.get_mut("params") {
                    crate::tasks::rewrite_task_ids(params, &seal);
                }
            }
            Some("notifications/subscriptions/acknowledged") => {
                if let Some(Value::Array(ids)) =
                    message.pointer_mut("/params/notifications/taskIds")
                {
                    for id in ids.iter_mut() {
                        if let Some(sealed) = id.as_str().and_then(seal) {
                            *id = Value::String(sealed);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn owner(&self, node: String) -> Owner {
        if node == self.node {
            Owner::Here
        } else {
            Owner::Peer(node)
        }
    }

    /// The peer a request was forwarded by, or None if it came from a client. A
    /// request claiming a peer without the cluster's signature is refused.
    pub fn forwarded_by(
        &self,
        headers: &HeaderMap,
        method: &str,
        path: &str,
    ) -> Result<Option<String>, ForgedPeer> {
        let Some(from) = headers.get(FORWARDED_BY_HEADER) else {
            return Ok(None);
        };
        let from = from.to_str().unwrap_or_default().to_string();
        let forged = |reason| ForgedPeer {
            from: from.clone(),
            reason,
        };
        let auth = headers
            .get(PEER_AUTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| forged("no signature"))?;
        let (at, token) = auth.split_once('.').ok_or_else(|| forged("malformed"))?;
        let at: u64 = at.parse().map_err(|_| forged("malformed"))?;
        if now_secs().abs_diff(at) > PEER_CLOCK_SKEW {
            return Err(forged(
                "too old, or the clocks differ by more than a minute",
            ));
        }
        let signer = self
            .ring
            .open(Purpose::Peer, token, &peer_bound(at, method, path))
            .map_err(|_| forged("signature does not match"))?;
        if signer != from {
            return Err(forged("signed by another node"));
        }
        Ok(Some(from))
    }

    /// The headers marking a request this node forwards.
    fn peer_auth(&self, method: &str, path: &str) -> String {
        let at = now_secs();
        let token = self
            .ring
            .seal(Purpose::Peer, &self.node, &peer_bound(at, method, path));
        format!("{at}.{token}")
    }

    /// Where `node` listens: its `peers` entry, or, under `dns`, its address when
    /// it is one of the name's A records (never any address a token names).
    async fn address_of(&self, node: &str) -> Result<String, ForwardError> {
        let targets = self.targets();
        if let Some(address) = targets.peers.get(node) {
            return Ok(address.clone());
        }
        let unknown = || ForwardError::UnknownNode(node.to_string());
        let (Some(dns), Ok(ip)) = (&targets.dns, node.parse::<IpAddr>()) else {
            return Err(unknown());
        };
        let port = dns
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .ok_or_else(unknown)?;
        let records = tokio::net::lookup_host(dns.as_str())
            .await
            .map_err(|error| ForwardError::Resolve(dns.clone(), error))?;
        let listed = records.into_iter().any(|record| record.ip() == ip);
        if !listed {
            return Err(unknown());
        }
        Ok(match ip {
            IpAddr::V4(ip) => format!("http://{ip}:{port}"),
            IpAddr::V6(ip) => format!("http://[{ip}]:{port}"),
        })
    }
}

impl Cluster {
    /// Stops taking new sessions (a shutdown signal): `/readyz` turns 503 so the
    /// balancer sends no more, while the sessions held here are still served.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

fn peer_bound(at: u64, method: &str, path: &str) -> String {
    format!("{at}\0{method}\0{path}")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hostile_peer_headers_are_refused_unless_signed_as_sent() {
        let config = crate::config::parse(
            "[cluster]\nnode = \"n2\"\nsecret = \"0123456789abcdef0123456789abcdef\"\npeers = { n1 = \"http://127.0.0.1:1\" }\n",
            std::path::Path::new("/"),
            &|_| None,
        )
        .unwrap();
        let cluster = Cluster::new(&config.cluster.unwrap());
        let signed = cluster.peer_auth("POST", "/mcp");
        let seeds: [&[u8]; 2] = [signed.as_bytes(), b"n2"];
        let cases = mutations::cases(&seeds, 3_000, 0xC105);
        mutations::check("a peer's headers", &cases, 16, |value| {
            let Ok(value) = HeaderValue::from_bytes(value) else {
                return;
            };
            for (from, auth) in [
                (HeaderValue::from_static("n2"), value.clone()),
                (value.clone(), HeaderValue::from_str(&signed).unwrap()),
            ] {
                let mut headers = HeaderMap::new();
                headers.insert(FORWARDED_BY_HEADER, from.clone());
                headers.insert(PEER_AUTH_HEADER, auth.clone());
                // Only the very headers signed, for the request signed, admit.
                if let Ok(peer) = cluster.forwarded_by(&headers, "POST", "/mcp") {
                    assert_eq!(peer.as_deref(), Some("n2"));
                    assert_eq!(
                        (from.as_bytes(), auth.as_bytes()),
                        (&b"n2"[..], signed.as_bytes())
                    );
                }
            }
        });
    }
}
