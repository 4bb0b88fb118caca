//! A 2026-07-28 `subscriptions/listen` stream hears every node. Each node runs
//! its own upstream processes, so a change made through one (a resource update,
//! a list change) is announced there alone. The node a client's listen lands on
//! opens the same listen once on each peer, forwarded with the cluster's
//! signature (a forwarded listen is not opened onwards), and merges what they
//! announce into its client's stream; the client's acknowledgement waits, within
//! [`PEERS_ACKNOWLEDGE_WITHIN`], until the peers have acknowledged theirs, so
//! from then on a change anywhere is heard, and it agrees to the task ids the
//! peers agreed to (a task's status comes from the node running it). A peer that cannot be reached, or
//! whose stream ends, is tried again with a backoff; the client's stream goes on.
//! Dropping the merge (the client went away) closes every peer's stream.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::Cluster;

/// How long a client's acknowledgement waits for the peers' (one down is
/// waited for no longer than this).
pub const PEERS_ACKNOWLEDGE_WITHIN: Duration = Duration::from_secs(2);
/// A peer's stream carries a comment every 15 s when idle: three missed and it
/// is taken for dead (frozen, or a connection lost without a close) and reopened.
const PEER_SILENT_FOR: Duration = Duration::from_secs(45);
const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(8);
/// Under `dns`, how often the peers are looked up again, so one that joined is heard.
const RESOLVE_EVERY: Duration = Duration::from_secs(30);
/// An event from a peer larger than this is dropped, not buffered without end.
const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;
/// What waits for the client's acknowledgement before being sent.
const MAX_HELD: usize = 256;

const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";

/// A client's listen request, to be opened on every peer as it was sent here.
pub struct PeerListen {
    cluster: Arc<Cluster>,
    parts: http::request::Parts,
    body: Bytes,
}

/// What a peer's listen stream brings.
enum Heard {
    /// With the task ids the peer agreed to (a task is heard where it runs).
    Acknowledged(Vec<Value>),
    Announced(Value),
}

impl PeerListen {
    pub fn new(cluster: Arc<Cluster>, parts: http::request::Parts, body: Bytes) -> PeerListen {
        PeerListen {
            cluster,
            parts,
            body,
        }
    }

    /// Runs `serving` (the listen served here, whose messages arrive on `local`)
    /// and sends its messages and the peers' announcements to `related`: the
    /// first local one (the acknowledgement) once the peers acknowledged theirs
    /// or [`PEERS_ACKNOWLEDGE_WITHIN`] passed, everything else as it comes.
    pub async fn merge<T>(
        self,
        serving: impl Future<Output = T>,
        mut local: mpsc::Receiver<Value>,
        related: &mpsc::Sender<Value>,
    ) -> T {
        let (heard_tx, mut heard) = mpsc::channel::<(String, Heard)>(64);
        let hearing = self.hear_peers(heard_tx);
        tokio::pin!(serving, hearing);
        let mut expected = self.cluster.peer_names().await;
        let mut held: Vec<Value> = Vec::new();
        let mut held_from_peers: Vec<Value> = Vec::new();
        let mut peers_tasks: Vec<Value> = Vec::new();
        let mut released = false;
        let waiting = tokio::time::sleep(PEERS_ACKNOWLEDGE_WITHIN);
        tokio::pin!(waiting);
        let mut local_open = true;
        loop {
            if !released && held.is_empty() {
                // The deadline runs from the local acknowledgement on.
                waiting
                    .as_mut()
                    .reset(tokio::time::Instant::now() + PEERS_ACKNOWLEDGE_WITHIN);
            }
            let release = !released && !held.is_empty() && expected.is_empty();
            if release {
                released = true;
                with_tasks(&mut held[0], &mut peers_tasks);
                for message in held.drain(..).chain(held_from_peers.drain(..)) {
                    let _ = related.send(message).await;
                }
            }
            tokio::select! {
                biased;
                message = local.recv(), if local_open => match message {
                    Some(message) if released => {
                        let _ = related.send(message).await;
                    }
                    Some(message) if held.len() < MAX_HELD => held.push(message),
                    Some(_) => tracing::debug!("a listen stream's message dropped while its peers acknowledge"),
                    None => local_open = false,
                },
                done = &mut serving => {
                    while let Ok(message) = local.try_recv() {
                        held.push(message);
                    }
                    for message in held.drain(..) {
                        let _ = related.send(message).await;
                    }
                    return done;
                }
                Some((node, event)) = heard.recv() => match event {
                    Heard::Acknowledged(tasks) => {
                        // Once the client's went out, a peer's listen opened again agrees anew.
                        if !released {
                            peers_tasks.extend(tasks);
                        }
                        expected.remove(&node);
                    }
                    Heard::Announced(message) if released => {
                        let _ = related.send(message).await;
                    }
                    Heard::Announced(message) if held_from_peers.len() < MAX_HELD => {
                        held_from_peers.push(message);
                    }
                    Heard::Announced(_) => {}
                },
                () = &mut waiting, if !released && !held.is_empty() => {
                    tracing::info!(
                        peers = ?expected,
                        "a listen stream goes on without peers that did not acknowledge in time"
                    );
                    expected.clear();
                }
                // Never ends while `heard` is read; kept polled so the peers are heard.
                () = &mut hearing => {}
            }
        }
    }

    /// One forwarded listen per peer, each reopened when it ends, until `heard`
    /// is closed. Peers that join are looked up as a reload names them, and under
    /// `dns` every so often.
    async fn hear_peers(&self, heard: mpsc::Sender<(String, Heard)>) {
        let mut listening = BTreeSet::new();
        let mut peers = FuturesUnordered::new();
        let mut resolve = tokio::time::interval(RESOLVE_EVERY);
        let mut retargeted = self.cluster.targets.subscribe();
        loop {
            tokio::select! {
                // A reload's peers: looked up at once (the sender lives as long as
                // the cluster, so this never ends).
                Ok(()) = retargeted.changed() => {
                    for node in self.cluster.peer_names().await {
                        if listening.insert(node.clone()) {
                            peers.push(self.hear(node, heard.clone()));
                        }
                    }
                }
                _ = resolve.tick() => {
                    for node in self.cluster.peer_names().await {
                        if listening.insert(node.clone()) {
                            peers.push(self.hear(node, heard.clone()));
                        }
                    }
                }
                Some(ended) = peers.next() => match ended {
                    Ended::ClientGone => return std::future::pending().await,
                    // No longer among the peers: looked for again at the next lookup.
                    Ended::NotAPeer(node) => {
                        listening.remove(&node);
                    }
                },
            }
        }
    }

    /// `node`'s listen, opened again with a backoff each time it ends.
    async fn hear(&self, node: String, heard: mpsc::Sender<(String, Heard)>) -> Ended {
        let mut delay = FIRST_RETRY;
        loop {
            match self.hear_once(&node, &heard).await {
                Ok(Once::ClientGone) => return Ended::ClientGone,
                Ok(Once::Ended { acknowledged }) => {
                    tracing::debug!(node, "a peer's listen stream ended; opening it again");
                    if acknowledged {
                        delay = FIRST_RETRY;
                    }
                }
                Err(Refused::NotAPeer) => return Ended::NotAPeer(node),
                Err(Refused::Other(reason)) => {
                    tracing::debug!(node, %reason, retry_in = ?delay, "a peer's listen stream could not be opened");
                }
            }
            if heard.is_closed() {
                return Ended::ClientGone;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(LAST_RETRY);
        }
    }

    async fn hear_once(
        &self,
        node: &str,
        heard: &mpsc::Sender<(String, Heard)>,
    ) -> Result<Once, Refused> {
        let response = self
            .cluster
            .forward(node, &self.parts, self.body.clone())
            .await
            .map_err(|error| match error {
                super::ForwardError::UnknownNode(_) => Refused::NotAPeer,
                error => Refused::Other(adapters::error_chain(&error)),
            })?;
        let is_stream = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
        if !response.status().is_success() || !is_stream {
            return Err(Refused::Other(format!(
                "answered {} without an event stream",
                response.status()
            )));
        }
        let mut body = response.into_body();
        let mut buffer = BytesMut::new();
        let mut acknowledged = false;
        loop {
            let frame = match tokio::time::timeout(PEER_SILENT_FOR, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => return Ok(Once::Ended { acknowledged }),
                Ok(Some(Err(never))) => match never {},
                Err(_) => {
                    tracing::info!(node, "a peer's listen stream fell silent; opening it again");
                    return Ok(Once::Ended { acknowledged });
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffer.extend_from_slice(&data);
            while let Some(event) = next_event(&mut buffer) {
                let Some(message) = event_message(&event) else {
                    continue;
                };
                let method = message.get("method").and_then(Value::as_str);
                let event = match method {
                    // The peer's own acknowledgement: the client has this node's.
                    Some(ACKNOWLEDGED) => {
                        acknowledged = true;
                        let tasks = message.pointer("/params/notifications/taskIds");
                        Heard::Acknowledged(
                            tasks.and_then(Value::as_array).cloned().unwrap_or_default(),
                        )
                    }
                    Some(_) if message.get("id").is_none() => Heard::Announced(message),
                    // The listen's end (the peer stops) or a request: not the client's.
                    _ => continue,
                };
                if heard.send((node.to_string(), event)).await.is_err() {
                    return Ok(Once::ClientGone);
                }
            }
            if buffer.len() > MAX_EVENT_BYTES {
                tracing::warn!(
                    node,
                    "a peer's listen stream sent an oversized event; dropped"
                );
                buffer.clear();
            }
        }
    }
}

/// The client's acknowledgement also agrees to the tasks the peers agreed to
/// (a listen naming none is left as it is).
fn with_tasks(acknowledgement: &mut Value, peers_tasks: &mut Vec<Value>) {
    let is_ack = acknowledgement.get("method").and_then(Value::as_str) == Some(ACKNOWLEDGED);
    if let (true, Some(Value::Array(tasks))) = (
        is_ack,
        acknowledgement.pointer_mut("/params/notifications/taskIds"),
    ) {
        tasks.append(peers_tasks);
    }
}

enum Ended {
    ClientGone,
    NotAPeer(String),
}

enum Once {
    ClientGone,
    Ended { acknowledged: bool },
}

enum Refused {
    NotAPeer,
    Other(String),
}

/// The next whole event (up to its blank line) taken off `buffer`.
fn next_event(buffer: &mut BytesMut) -> Option<Bytes> {
    let end = memchr::memmem::find(buffer, b"\n\n")?;
    let event = buffer.split_to(end + 2).freeze();
    Some(event)
}

/// The JSON-RPC message an event's `data:` lines carry; None for a comment.
fn event_message(event: &[u8]) -> Option<Value> {
    let mut data = Vec::new();
    for line in event.split(|byte| *byte == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
        }
    }
    if data.is_empty() {
        return None;
    }
    serde_json::from_slice(&data).ok()
}

impl Cluster {
    /// The other nodes: the `peers` named, and under `dns` the name's A records.
    async fn peer_names(&self) -> BTreeSet<String> {
        let targets = self.targets();
        let mut names: BTreeSet<String> = targets.peers.keys().cloned().collect();
        if let Some(dns) = &targets.dns {
            match tokio::net::lookup_host(dns.as_str()).await {
                Ok(records) => names.extend(records.map(|record| record.ip().to_string())),
                Err(error) => {
                    tracing::debug!(dns, %error, "the cluster's DNS name did not resolve")
                }
            }
        }
        names.remove(&self.node);
        names
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_at_blank_lines_and_comments_carry_nothing() {
        let mut buffer = BytesMut::from(
            &b":\n\nevent: message\ndata: {\"method\":\"a\"}\n\nevent: message\ndata: {\"me"[..],
        );
        let comment = next_event(&mut buffer).unwrap();
        assert_eq!(event_message(&comment), None);
        let first = next_event(&mut buffer).unwrap();
        assert_eq!(event_message(&first).unwrap()["method"], "a");
        // Half an event waits for the rest.
        assert!(next_event(&mut buffer).is_none());
        buffer.extend_from_slice(b"thod\":\"b\"}\r\n\n");
        let second = next_event(&mut buffer).unwrap();
        assert_eq!(event_message(&second).unwrap()["method"], "b");
    }

    #[test]
    fn a_peers_hostile_event_stream_is_read_or_skipped_and_never_panics() {
        let seeds: [&[u8]; 2] = [
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"a\"}\n\n: keep-alive\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"b\"}\r\n\n",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0x115E);
        mutations::check("a peer's listen stream", &cases, 64, |stream| {
            let mut buffer = BytesMut::from(stream);
            let mut taken = 0;
            while let Some(event) = next_event(&mut buffer) {
                assert!(event.ends_with(b"\n\n"));
                taken += event.len();
                if let Some(message) = event_message(&event) {
                    serde_json::to_vec(&message).unwrap();
                }
            }
            assert_eq!(taken + buffer.len(), stream.len());
        });
    }
}
