//! Test-only fakes: an MCP upstream served inside the test's process (over the
//! pipes of `adapters::in_process`, so the daemon's own connection, supervisor and
//! relay run unchanged), a hub built from configuration text, and a client that
//! speaks to that hub through the stdio front over an in-memory stream. Nothing
//! waits on another process, so tests run on tokio's paused clock.

#![cfg(test)]
// Test code: a failed expectation is the test's failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use adapters::in_process::{self, Registration, ServerPipes};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigDiff};
use crate::hub::Hub;
use crate::metrics::Metrics;

/// How long a `slow` tool call takes.
pub const SLOW_CALL: Duration = Duration::from_secs(10);
/// How often a `progress` tool call reports progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(20);

/// What one fake upstream was asked and how it ran, shared by its runs.
#[derive(Default)]
struct Script {
    /// Every message plexus sent it, in order, over all its runs.
    received: Mutex<Vec<Value>>,
    /// When each run started.
    starts: Mutex<Vec<Instant>>,
    /// When each run ended (its pipes dropped).
    ends: Mutex<Vec<Instant>>,
    /// So many of the next runs exit at once, before answering anything.
    exit_at_start: AtomicUsize,
    /// Pings go unanswered while set.
    ignore_pings: AtomicBool,
    /// Calls of `slow` running now, and the most at once.
    slow_running: AtomicUsize,
    slow_most: AtomicUsize,
}

/// A fake MCP upstream (handshake era) that lists the tools `echo`, `slow`,
/// `progress`, `hang` and `crash`, the prompt `greet` and the resource
/// `fixture://items/1`. `echo` answers at once with its arguments, `slow` after
/// [`SLOW_CALL`], `progress` after reporting progress `steps` times, each after
/// [`PROGRESS_EVERY`], and that long again; `hang` never answers, and `crash`
/// makes the upstream exit.
pub struct FakeUpstream {
    /// The `command` that reaches it: unique in the process.
    pub program: String,
    script: Arc<Script>,
    _registration: Registration,
}

impl FakeUpstream {
    pub fn new() -> FakeUpstream {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let program = format!(
            "plexus-fake-upstream-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let script = Arc::new(Script::default());
        let serving = script.clone();
        let registration = in_process::register(
            &program,
            Arc::new(move |pipes| {
                tokio::spawn(serve(serving.clone(), pipes));
            }),
        );
        FakeUpstream {
            program,
            script,
            _registration: registration,
        }
    }

    /// The next `runs` runs exit as soon as they start.
    pub fn exit_at_start(&self, runs: usize) {
        self.script.exit_at_start.store(runs, Ordering::SeqCst);
    }

    /// From now on pings go unanswered (`true`), or are answered again.
    pub fn ignore_pings(&self, ignore: bool) {
        self.script.ignore_pings.store(ignore, Ordering::SeqCst);
    }

    /// Every message plexus sent, in order.
    pub fn received(&self) -> Vec<Value> {
        lock(&self.script.received).clone()
    }

    /// The messages of `method` plexus sent.
    pub fn received_of(&self, method: &str) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|message| message["method"] == method)
            .collect()
    }

    pub fn starts(&self) -> Vec<Instant> {
        lock(&self.script.starts).clone()
    }

    pub fn ends(&self) -> Vec<Instant> {
        lock(&self.script.ends).clone()
    }

    /// The most `slow` calls that ran at once.
    pub fn most_slow_at_once(&self) -> usize {
        self.script.slow_most.load(Ordering::SeqCst)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One run of the fake: serves lines until plexus closes its input or stops it,
/// or a `crash` call makes it exit.
async fn serve(script: Arc<Script>, pipes: ServerPipes) {
    let ServerPipes {
        from_plexus,
        mut to_plexus,
        stopped,
    } = pipes;
    lock(&script.starts).push(Instant::now());
    let exits_now = script
        .exit_at_start
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    if !exits_now {
        let (replies, mut outgoing) = mpsc::unbounded_channel::<Value>();
        let crashed = CancellationToken::new();
        // Calls are answered concurrently; dropping the set ends the ones still running.
        let mut calls = JoinSet::new();
        let mut lines = BufReader::new(from_plexus).lines();
        loop {
            tokio::select! {
                _ = stopped.cancelled() => break,
                _ = crashed.cancelled() => break,
                Some(reply) = outgoing.recv() => {
                    let mut line = reply.to_string().into_bytes();
                    line.push(b'\n');
                    if to_plexus.write_all(&line).await.is_err() {
                        break;
                    }
                }
                line = lines.next_line() => {
                    let Ok(Some(line)) = line else { break };
                    let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
                    lock(&script.received).push(message.clone());
                    if message.get("id").is_some() && message.get("method").is_some() {
                        calls.spawn(answer(script.clone(), message, replies.clone(), crashed.clone()));
                    }
                }
            }
        }
    }
    drop(to_plexus);
    lock(&script.ends).push(Instant::now());
}

/// Answers one request (or never, or by exiting).
async fn answer(
    script: Arc<Script>,
    request: Value,
    replies: mpsc::UnboundedSender<Value>,
    crashed: CancellationToken,
) {
    let params = &request["params"];
    let result = match request["method"].as_str().unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}, "prompts": {}, "resources": {}, "completions": {}},
            "serverInfo": {"name": "fake", "version": "1"},
        }),
        "ping" if script.ignore_pings.load(Ordering::SeqCst) => {
            return std::future::pending().await
        }
        "ping" => json!({}),
        "tools/list" => {
            let tools = ["echo", "slow", "progress", "hang", "crash"].map(|name| {
                json!({
                    "name": name,
                    "description": format!("the fake's {name}"),
                    "inputSchema": {"type": "object"},
                })
            });
            json!({ "tools": tools })
        }
        "prompts/list" => json!({"prompts": [{"name": "greet", "description": "a greeting"}]}),
        "resources/list" => {
            json!({"resources": [{"uri": "fixture://items/1", "name": "item one"}]})
        }
        "resources/templates/list" => json!({"resourceTemplates": []}),
        "prompts/get" => json!({"messages": [{"role": "user", "content": {
            "type": "text", "text": format!("hello from {}", params["name"]),
        }}]}),
        "resources/read" => json!({"contents": [{"uri": params["uri"], "text": "item one"}]}),
        "completion/complete" => json!({"completion": {"values": ["one"], "hasMore": false}}),
        "tools/call" => match params["name"].as_str().unwrap_or_default() {
            "echo" => {
                // Messages a test has the fake send first, as an upstream may whatever
                // they hold (`"$token"` is the call's progress token).
                let token = params["_meta"]["progressToken"].to_string();
                for said in params["arguments"]["say"].as_array().into_iter().flatten() {
                    let text = said.to_string().replace("\"$token\"", &token);
                    if let Ok(said) = serde_json::from_str(&text) {
                        let _ = replies.send(said);
                    }
                }
                text_result(&params["arguments"].to_string())
            }
            "slow" => {
                let running = script.slow_running.fetch_add(1, Ordering::SeqCst) + 1;
                script.slow_most.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(SLOW_CALL).await;
                script.slow_running.fetch_sub(1, Ordering::SeqCst);
                text_result("slept")
            }
            "progress" => {
                let token = &params["_meta"]["progressToken"];
                for step in 1..=params["arguments"]["steps"].as_u64().unwrap_or(1) {
                    tokio::time::sleep(PROGRESS_EVERY).await;
                    let progress = json!({"progressToken": token, "progress": step});
                    let _ = replies.send(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}));
                }
                tokio::time::sleep(PROGRESS_EVERY).await;
                text_result("done")
            }
            "hang" => return std::future::pending().await,
            "crash" => return crashed.cancel(),
            other => {
                let error = json!({"code": -32602, "message": format!("no tool {other}")});
                let _ =
                    replies.send(json!({"jsonrpc": "2.0", "id": request["id"], "error": error}));
                return;
            }
        },
        other => {
            let error = json!({"code": -32601, "message": format!("no method {other}")});
            let _ = replies.send(json!({"jsonrpc": "2.0", "id": request["id"], "error": error}));
            return;
        }
    };
    let _ = replies.send(json!({"jsonrpc": "2.0", "id": request["id"], "result": result}));
}

fn text_result(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

/// A hub serving the upstreams of `upstreams` (TOML `[upstreams.*]` tables), its
/// state in `state_dir`, started and listed.
pub async fn hub(state_dir: &Path, upstreams: &str) -> Arc<Hub> {
    let text = format!(
        "[daemon]\nstate_dir = {:?}\n\n{upstreams}",
        state_dir.display().to_string()
    );
    let config: Config = match crate::config::parse(&text, state_dir, &|_| None) {
        Ok(config) => config,
        Err(issues) => panic!("test configuration is invalid: {issues:?}\n{text}"),
    };
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let hub = Hub::new(&config, metrics, CancellationToken::new());
    hub.apply_views(&config.views);
    let startup = ConfigDiff::between(&BTreeMap::new(), &config.upstreams);
    hub.apply(startup, config.daemon.drain_timeout).await;
    hub.wait_for_first_listings().await;
    hub
}

/// Lets the other tasks run until `condition` holds, without moving the clock;
/// fails the test if it never does (rather than spinning).
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if condition() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never came to pass: {what}");
}

/// Waits on the paused clock, 10 ms at a time, until `condition` holds; fails
/// the test if it does not within ten minutes (of the clock's time). What the
/// fake records carries its own instants: the step costs those no precision.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !condition() {
        assert!(Instant::now() < deadline, "never came to pass: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `[upstreams.<name>]` table of a fake, speaking the handshake era, with `extra` keys.
pub fn upstream(name: &str, fake: &FakeUpstream, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\ncommand = {:?}\nprotocol = \"handshake\"\n{extra}\n",
        fake.program
    )
}

/// How long a client waits for a message before it fails the test.
pub const NO_ANSWER: Duration = Duration::from_secs(3600);

/// A client of the stdio front, over an in-memory stream.
pub struct Client {
    to_front: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    from_front: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    /// Messages read while waiting for another.
    unread: VecDeque<Value>,
    next_id: u64,
}

impl Client {
    /// Connects and initializes (handshake era).
    pub async fn connect(hub: &Arc<Hub>) -> Client {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (input, output) = tokio::io::split(theirs);
        tokio::spawn(crate::stdio_front::serve(
            hub.clone(),
            input,
            output,
            None,
            CancellationToken::new(),
            || Duration::from_secs(1),
        ));
        let (from_front, to_front) = tokio::io::split(ours);
        let mut client = Client {
            to_front,
            from_front: BufReader::new(from_front).lines(),
            unread: VecDeque::new(),
            next_id: 0,
        };
        let hello = client
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "unit", "version": "1"},
                }),
            )
            .await;
        assert!(hello.get("result").is_some(), "initialize failed: {hello}");
        client
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    /// Writes one line as is.
    pub async fn send_line(&mut self, line: &str) {
        self.to_front
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the front");
    }

    pub async fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string()).await;
    }

    /// Sends a request and waits for its response (whole, error or result).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.response_to(&id).await
    }

    /// Waits for the response with this id; other messages stay unread.
    pub async fn response_to(&mut self, id: &Value) -> Value {
        if let Some(at) = self
            .unread
            .iter()
            .position(|message| message.get("id") == Some(id) && message.get("method").is_none())
        {
            return self.unread.remove(at).expect("found");
        }
        loop {
            let message = self.read_message().await;
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return message;
            }
            self.unread.push_back(message);
        }
    }

    /// The next message the front writes, in order.
    pub async fn next_message(&mut self) -> Value {
        match self.unread.pop_front() {
            Some(message) => message,
            None => self.read_message().await,
        }
    }

    /// The next message from the stream (past those already read).
    async fn read_message(&mut self) -> Value {
        // On the paused clock an idle wait ends at once: a missing answer fails, not hangs.
        let line = tokio::time::timeout(NO_ANSWER, self.from_front.next_line())
            .await
            .expect("no message from the front")
            .expect("read from the front")
            .expect("the front ended");
        serde_json::from_str(&line).expect("the front writes JSON")
    }
}
