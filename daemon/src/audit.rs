//! The audit trail (`[daemon] audit_log`): one JSON line per tool call, prompt,
//! resource read and client-bound request relayed, and per schema change and
//! approval. Arguments are never written, only the SHA-256 of their canonical JSON
//! (RFC 8785, as the fingerprints); sessions appear as a keyed hash, never their id.
//!
//! Lines go through a bounded channel to one writer thread, so a slow disk never
//! blocks a call: when the channel is full the line is dropped, counted and noted in
//! the log. The file is opened for appending with mode 0600, each line is written
//! whole and flushed, and a reload reopens it (after logrotate moved it away). The
//! last lines are also kept in memory, for the console's activity (the file stays
//! the record).

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// Lines that may wait for the writer; more are dropped (and counted).
const QUEUE: usize = 4096;

/// The last lines kept in memory for the console (the file stays the record).
pub const RECENT: usize = 200;

/// What the console shows of a line: never arguments, not even their hash.
const SHOWN: [&str; 10] = [
    "time",
    "event",
    "principal",
    "view",
    "upstream",
    "method",
    "name",
    "original",
    "outcome",
    "duration_ms",
];

enum Message {
    /// A whole line, without its newline.
    Line(Vec<u8>),
    /// Open this file (or none) for the lines that follow.
    Reopen(Option<PathBuf>),
    /// Answered once every line before it is written.
    Flush(tokio::sync::oneshot::Sender<()>),
}

pub struct Audit {
    sender: mpsc::Sender<Message>,
    /// Whether a file is configured: no line is even built otherwise.
    enabled: AtomicBool,
    /// Per run: session hashes cannot be linked across restarts or reversed.
    key: [u8; 32],
    dropped: AtomicU64,
    metrics: Arc<Metrics>,
    /// The last [`RECENT`] lines, whole, newest last.
    recent: Mutex<VecDeque<Arc<[u8]>>>,
    /// In a `[cluster]`: this node's name, on every line (set once, at start).
    node: std::sync::OnceLock<String>,
}

impl Audit {
    /// An audit trail writing nothing until [`Audit::configure`] names a file.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Audit> {
        let (sender, receiver) = mpsc::channel(QUEUE);
        // A thread of its own: blocking file writes never occupy the runtime. It
        // ends when the last sender (this Audit) is dropped.
        if let Err(error) = std::thread::Builder::new()
            .name("plexus-audit".into())
            .spawn(move || write_lines(receiver))
        {
            tracing::error!(%error, "cannot start the audit writer");
        }
        Arc::new(Audit {
            sender,
            enabled: AtomicBool::new(false),
            key: rand::random(),
            dropped: AtomicU64::new(0),
            metrics,
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            node: std::sync::OnceLock::new(),
        })
    }

    /// Opens (or reopens) the audit file; None stops auditing. Called at start and
    /// at every reload, so a file moved away by logrotate is replaced.
    pub async fn configure(&self, path: Option<PathBuf>) {
        self.enabled.store(path.is_some(), Ordering::Relaxed);
        if self.sender.send(Message::Reopen(path)).await.is_err() {
            tracing::error!("the audit writer is gone");
        }
    }

    /// Names this node on every line from now on (a `[cluster]` node, at start).
    pub fn set_node(&self, node: &str) {
        let _ = self.node.set(node.to_string());
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// A session as the trail names it: a keyed hash, not its id.
    pub fn session_tag(&self, session: u64) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.key);
        hasher.update(session.to_be_bytes());
        hex::encode(&hasher.finalize()[..6])
    }

    /// A line for `event`, stamped with the time, to add fields to; `None` when
    /// nothing is audited (so a caller builds nothing).
    pub fn line(&self, event: &str) -> Option<Line> {
        if !self.enabled() {
            return None;
        }
        let mut bytes = Vec::with_capacity(384);
        // RFC 3339 has nothing to escape.
        let _ = write!(
            bytes,
            r#"{{"time":"{}""#,
            humantime::format_rfc3339_millis(SystemTime::now())
        );
        let mut line = Line(bytes);
        if let Some(node) = self.node.get() {
            line.field("node", node);
        }
        line.field("event", event);
        Some(line)
    }

    /// Appends `line`, unless the writer is behind.
    pub fn write(&self, line: Line) {
        let mut bytes = line.0;
        bytes.push(b'}');
        {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(Arc::from(bytes.as_slice()));
        }
        if self.sender.try_send(Message::Line(bytes)).is_err() {
            self.metrics.audit_dropped.inc();
            // A stuck disk does not flood the log.
            if let Some(dropped) = adapters::rpc::count_rarely(&self.dropped) {
                tracing::warn!(dropped, "the audit log is behind; lines were dropped");
            }
        }
    }

    /// The last lines recorded (newest first), each reduced to what the console
    /// shows: who, which view, what, its outcome and duration; no arguments.
    pub fn recent(&self) -> Vec<Value> {
        let lines: Vec<Arc<[u8]>> = self
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .cloned()
            .collect();
        lines
            .iter()
            .filter_map(|line| serde_json::from_slice::<Map<String, Value>>(line).ok())
            .map(|mut line| {
                line.retain(|key, _| SHOWN.contains(&key.as_str()));
                Value::Object(line)
            })
            .collect()
    }

    /// Waits until every line recorded so far is written (at shutdown).
    pub async fn flush(&self) {
        let (done, written) = tokio::sync::oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

/// One line of the trail, written as it is built (no map of values first): the
/// members in the order they are added, as serde_json writes them.
pub struct Line(Vec<u8>);

impl Line {
    /// Adds `"key":value`.
    pub fn field(&mut self, key: &str, value: impl Serialize) -> &mut Line {
        self.0.push(b',');
        // Writing a string to memory cannot fail.
        let _ = serde_json::to_writer(&mut self.0, key);
        self.0.push(b':');
        let at = self.0.len();
        if serde_json::to_writer(&mut self.0, &value).is_err() {
            // A value serde_json cannot write (none the trail has) is written as null.
            self.0.truncate(at);
            self.0.extend_from_slice(b"null");
        }
        self
    }
}

/// SHA-256 of a value's canonical JSON: what the trail says of arguments.
pub fn arguments_hash(arguments: Option<&Value>) -> Value {
    match arguments {
        None | Some(Value::Null) => Value::Null,
        Some(arguments) => Value::String(registry::fingerprint::security_hash(arguments)),
    }
}

/// The writer: one file at a time, appended to, flushed per line.
fn write_lines(mut receiver: mpsc::Receiver<Message>) {
    let mut file: Option<(PathBuf, std::fs::File)> = None;
    while let Some(message) = receiver.blocking_recv() {
        match message {
            Message::Reopen(path) => {
                file = path.and_then(|path| match open(&path) {
                    Ok(opened) => Some((path, opened)),
                    Err(error) => {
                        tracing::error!(path = %path.display(), %error, "cannot open the audit log");
                        None
                    }
                });
            }
            Message::Flush(done) => {
                let _ = done.send(());
            }
            Message::Line(mut bytes) => {
                let Some((path, opened)) = file.as_mut() else {
                    continue;
                };
                bytes.push(b'\n');
                if let Err(error) = opened.write_all(&bytes).and_then(|()| opened.flush()) {
                    tracing::error!(path = %path.display(), %error, "cannot write the audit log");
                }
            }
        }
    }
}

fn open(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
}

/// The `outcome` of a relayed answer: `ok`, `is_error`, or the JSON-RPC error code.
pub fn outcome(reply: &Result<adapters::Reply, crate::jsonrpc::RelayError>) -> Value {
    match reply {
        Ok(adapters::Reply::Result(result)) => {
            if result.get("isError").and_then(Value::as_bool) == Some(true) {
                json!("is_error")
            } else {
                json!("ok")
            }
        }
        Ok(adapters::Reply::Unread(raw)) => {
            if raw.member("isError") == Some(b"true") {
                json!("is_error")
            } else {
                json!("ok")
            }
        }
        Ok(adapters::Reply::Error(error)) => error.get("code").cloned().unwrap_or(Value::Null),
        Err(error) => error.to_error_object()["code"].clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;

    /// A line written as it is built reads as serde_json writes the same members.
    #[test]
    fn a_line_is_what_serde_json_writes_of_its_members() -> serde_json::Result<()> {
        let mut line = Line(br#"{"time":"2026-11-26T14:00:00.000Z""#.to_vec());
        let route: Option<&str> = None;
        line.field("event", "request")
            .field("principal", "a \"quoted\"\nname\u{1}")
            .field("view", route)
            .field("arguments_sha256", json!(null))
            .field("outcome", json!(-33002))
            .field("duration_ms", 6.374_150_999_999_999_5)
            .field("response_bytes", 2_097_253_usize)
            .field("changes", json!([{"class": "security", "fields": []}]))
            .field("nan", f64::NAN);
        line.0.push(b'}');
        let mut expected = Map::new();
        expected.insert("time".into(), json!("2026-11-26T14:00:00.000Z"));
        expected.insert("event".into(), json!("request"));
        expected.insert("principal".into(), json!("a \"quoted\"\nname\u{1}"));
        expected.insert("view".into(), Value::Null);
        expected.insert("arguments_sha256".into(), Value::Null);
        expected.insert("outcome".into(), json!(-33002));
        expected.insert("duration_ms".into(), json!(6.374_150_999_999_999_5));
        expected.insert("response_bytes".into(), json!(2_097_253));
        expected.insert(
            "changes".into(),
            json!([{"class": "security", "fields": []}]),
        );
        expected.insert("nan".into(), Value::Null);
        assert_eq!(
            String::from_utf8_lossy(&line.0),
            serde_json::to_string(&expected)?
        );
        Ok(())
    }
}
