//! `plexus connect [URL]`: a stdio bridge for clients that only launch commands.
//! MCP messages on stdin/stdout are relayed to a running daemon's HTTP front, in the
//! client's own era: a handshake-era client gets a session (its `initialize` goes
//! through), a 2026-07-28 client's requests go as they are, each with the headers
//! that revision mirrors. Requests run concurrently; server-to-client requests,
//! progress, logs and list changes come back on stdout.
//!
//! It survives the daemon: when the connection is lost (a restart, a moment of
//! unreachability) it reconnects with backoff, re-initializes with the client's
//! original `initialize`, sets the log level and subscriptions again and tells the
//! client the lists changed. A call that was in flight gets -33003; one that had
//! not left waits for the new connection. Only protocol messages go to stdout.
//!
//! A refusal of its credentials (HTTP 401 or 403) is final: the bridge says so in
//! one line on stderr, answers that request and every later one with the error,
//! never asks the daemon again, and exits 77 (`EX_NOPERM`) when the client leaves.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use adapters::framing::{Frame, LineDecoder};
use adapters::{
    ConnectionError, Events, HttpEndpoint, HttpOptions, HttpTransportKind, Reply,
    UpstreamConnection, UpstreamEvent, WrittenMember,
};
use futures::StreamExt;
use registry::headers::{encode_header_value, param_headers, ParamHeader};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;
use tokio_util::task::TaskTracker;

use crate::cli::{self, EXIT_NO_PERMISSION, EXIT_UNAVAILABLE};
use crate::client_message::ClientMessage;
use crate::jsonrpc::{self, Answer, Envelope};

/// Where the bridge connects and with what.
struct Target {
    pub url: String,
    pub token: Option<String>,
}

/// The daemon's front: URL given, else the running daemon of `config` (its
/// `daemon.json`), else the default listener; `/VIEW` appended for a view.
fn target(
    url: Option<String>,
    config: Option<&Path>,
    view: Option<&str>,
    token_file: Option<&Path>,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, String> {
    let mut url = match (url, config) {
        (Some(url), _) => url,
        (None, Some(config)) => crate::admin_client::daemon_url(config, environment)
            .map_err(|error| error.to_string())?,
        (None, None) => format!("http://{}/mcp", crate::config::DEFAULT_LISTEN),
    };
    if let Some(view) = view {
        url = format!("{}/{view}", url.trim_end_matches('/'));
    }
    let token = match token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => environment("PLEXUS_TOKEN").filter(|token| !token.is_empty()),
    };
    Ok(Target { url, token })
}

/// A message's place in the order of relaying: an `initialize` goes alone.
enum Gate {
    /// Held (for its drop) while the message is relayed.
    Exclusive {
        _guard: tokio::sync::OwnedRwLockWriteGuard<()>,
    },
    Shared {
        _guard: tokio::sync::OwnedRwLockReadGuard<()>,
    },
}

/// A request's params as the bridge relays them: values, but for a tool call's
/// large arguments, which stay as the client wrote them (see `client_message`).
struct Params {
    values: Option<Value>,
    arguments: Option<WrittenMember>,
}

impl Params {
    fn values(&self) -> Option<&Value> {
        self.values.as_ref()
    }
}

/// What the bridge remembers of the client to restore it on a new connection.
#[derive(Default)]
struct Remembered {
    /// The client's `initialize` params (a handshake-era client).
    initialize: Option<Value>,
    initialized: bool,
    log_level: Option<Value>,
    subscriptions: BTreeSet<String>,
    /// Tools' parameters mirrored into `Mcp-Param-*` headers, from the tool lists
    /// the bridge relayed (a 2026-07-28 client's calls must carry them).
    param_headers: HashMap<String, Vec<ParamHeader>>,
}

struct Bridge {
    target: Target,
    /// The live connection; None while reconnecting.
    connection: watch::Sender<Option<UpstreamConnection>>,
    remembered: Mutex<Remembered>,
    output: mpsc::Sender<Answer>,
    /// Requests in flight by the client's id, so its cancel can end them.
    in_flight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Set once the daemon refused the credentials; the bridge then asks no more.
    refused: OnceLock<Refused>,
    /// Every task of the bridge (the writer, the keeper, relayed requests,
    /// connections closing), waited for before it ends.
    tasks: TaskTracker,
}

/// How the daemon refused the bridge's credentials.
struct Refused {
    status: u16,
    /// What the daemon said, for the client's error.
    detail: String,
}

/// How the bridge ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The client closed its input.
    ClientLeft,
    /// The client left after the daemon refused the bridge's credentials.
    Refused,
}

/// `plexus connect`: exit 0 when the client leaves, 77 when the daemon refused the
/// credentials, 69 when no daemon can be found.
pub fn run(
    url: Option<String>,
    config: Option<&Path>,
    token_file: Option<&Path>,
    view: Option<&str>,
) -> ExitCode {
    let target = match target(url, config, view, token_file, &cli::environment) {
        Ok(target) => target,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(EXIT_UNAVAILABLE);
        }
    };
    // A bridge reads no catalog: its large blocks are messages from the start.
    crate::memory::fix_thresholds_for_messages();
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(bridge(target)) {
        Ended::ClientLeft => ExitCode::SUCCESS,
        // Said on stderr when it happened.
        Ended::Refused => ExitCode::from(EXIT_NO_PERMISSION),
    }
}

/// Runs the bridge until the client's input ends.
async fn bridge(target: Target) -> Ended {
    let (output, mut outgoing) = mpsc::channel::<Answer>(256);
    let crate::own_stdio::OwnStdio {
        input,
        output: mut stdout,
        restore: _flags,
    } = crate::own_stdio::open();
    let tasks = TaskTracker::new();
    tasks.spawn(async move {
        while let Some(message) = outgoing.recv().await {
            let mut line = message.into_bytes();
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let bridge = Arc::new(Bridge {
        target,
        connection: watch::channel(None).0,
        remembered: Mutex::new(Remembered::default()),
        output,
        in_flight: Mutex::new(HashMap::new()),
        refused: OnceLock::new(),
        tasks: tasks.clone(),
    });
    let keeper = tasks.spawn(keep_connected(bridge.clone()));
    // Lines as the stdio front reads them: capped, and bytes (a line that is not
    // UTF-8 is a parse error to answer, not the end of the input).
    let mut lines = FramedRead::new(
        input,
        LineDecoder::new(crate::stdio_front::MAX_CLIENT_LINE_BYTES),
    );
    let mut handling = tokio::task::JoinSet::new();
    let order = Arc::new(tokio::sync::RwLock::new(()));
    while let Some(frame) = lines.next().await {
        let line = match frame {
            Ok(Frame::Line(line)) => line,
            Ok(Frame::TooLong { limit, .. }) => {
                let error = jsonrpc::RelayError::RequestTooLarge { limit };
                bridge
                    .send(jsonrpc::error_response(Value::Null, &error))
                    .await;
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "reading stdin failed");
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message = match ClientMessage::read(line.freeze()) {
            Ok(message) => message,
            Err(error) => {
                let error = jsonrpc::RelayError::Parse(error.to_string());
                bridge
                    .send(jsonrpc::error_response(Value::Null, &error))
                    .await;
                continue;
            }
        };
        // Nothing overtakes an `initialize`: its session must exist before the
        // messages after it go out (they are otherwise relayed concurrently).
        let gate = if message.message.get("method").and_then(Value::as_str) == Some("initialize") {
            Gate::Exclusive {
                _guard: order.clone().write_owned().await,
            }
        } else {
            Gate::Shared {
                _guard: order.clone().read_owned().await,
            }
        };
        let handled = bridge.clone();
        handling.spawn(async move {
            let _gate = gate;
            handled.handle(message).await
        });
        // Finished tasks are collected as they go, so the set stays small.
        while handling.try_join_next().is_some() {}
    }
    // The client is gone: let answers in flight out, briefly, then end.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while handling.join_next().await.is_some() {}
    })
    .await;
    drop(handling);
    // What still runs is abandoned: the process ends.
    bridge.abort_in_flight();
    keeper.abort();
    let connection = bridge.connection.borrow().clone();
    if let Some(connection) = connection {
        connection.shutdown().await;
    }
    let refused = bridge.refused.get().is_some();
    drop(bridge);
    // The writer ends once every sender of its output is gone.
    tasks.close();
    tasks.wait().await;
    if refused {
        Ended::Refused
    } else {
        Ended::ClientLeft
    }
}

/// Whether `error` is the daemon refusing the credentials (not the message).
fn refusal(error: &ConnectionError) -> Option<Refused> {
    match error {
        ConnectionError::HttpStatus { status, detail, .. } if matches!(status, 401 | 403) => {
            Some(Refused {
                status: *status,
                detail: detail.clone(),
            })
        }
        _ => None,
    }
}

impl Bridge {
    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn send(&self, message: impl Into<Answer>) {
        let _ = self.output.send(message.into()).await;
    }

    /// The daemon refused the credentials: said once on stderr, and the live
    /// connection closed so nothing asks again.
    fn refuse(&self, refused: Refused) {
        let status = refused.status;
        if self.refused.set(refused).is_err() {
            return;
        }
        let problem = match (status, self.target.token.is_some()) {
            (401, true) => "refused the bearer token (HTTP 401)",
            (401, false) => "requires a bearer token (HTTP 401)",
            _ => "refused access (HTTP 403: a Host or Origin it does not answer, or a token it does not accept)",
        };
        // One line, stderr, whatever the log level: the client's user must see it.
        eprintln!(
            "plexus connect: plexus at {} {problem}; set PLEXUS_TOKEN or pass --token-file with a token from its [daemon] auth_tokens",
            self.target.url
        );
        let connection = self.connection.send_replace(None);
        if let Some(connection) = connection {
            self.tasks.spawn(async move { connection.shutdown().await });
        }
    }

    /// The error every request gets once the credentials were refused.
    fn refused_error(&self) -> Option<Value> {
        let refused = self.refused.get()?;
        Some(json!({
            "code": jsonrpc::INVALID_REQUEST,
            "message": format!(
                "plexus at {} refused the bridge's credentials (HTTP {}: {}); set PLEXUS_TOKEN or pass --token-file",
                self.target.url, refused.status, refused.detail
            ),
            "data": {"kind": if refused.status == 401 { "unauthorized" } else { "forbidden" }, "status": refused.status, "retryable": false},
        }))
    }

    async fn handle(self: Arc<Self>, message: ClientMessage) {
        // Read with `ClientMessage::read`: nothing is taken out of `_meta`.
        let ClientMessage {
            message,
            arguments,
            capabilities: _,
        } = message;
        // Checked as the daemon checks what reaches it: what is not JSON-RPC is
        // answered here, not dropped (its sender would wait for good).
        match Envelope::of(message) {
            Ok(Envelope::Request { id, method, params }) => {
                let params = Params {
                    values: params,
                    arguments,
                };
                self.relay(id, method, params).await
            }
            Ok(Envelope::Notification { method, params }) => {
                self.notification(&method, params).await
            }
            Ok(Envelope::Response { id, reply }) => {
                let connection = self.connection.borrow().clone();
                if let Some(connection) = connection {
                    let _ = connection.respond(id, reply).await;
                }
            }
            Err(not) => self.send(not.answer()).await,
        }
    }

    /// Relays a request on a task of its own, which the client's cancel ends.
    async fn relay(self: Arc<Self>, id: Value, method: String, params: Params) {
        let key = id.to_string();
        let task = {
            let bridge = self.clone();
            self.tasks
                .spawn(async move { bridge.request(id, &method, params).await })
        };
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), task.abort_handle());
        let _ = task.await;
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
    }

    /// Ends every relayed request still running.
    fn abort_in_flight(&self) {
        let in_flight = std::mem::take(
            &mut *self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for task in in_flight.into_values() {
            task.abort();
        }
    }

    async fn notification(&self, method: &str, params: Option<Value>) {
        if method == "notifications/cancelled" {
            let key = params
                .as_ref()
                .and_then(|p| p.get("requestId"))
                .map(Value::to_string);
            let task = key.and_then(|key| {
                self.in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key)
            });
            // Dropping the relayed request sends the daemon its own cancel.
            if let Some(task) = task {
                task.abort();
            }
            return;
        }
        if method == "notifications/initialized" {
            self.remembered().initialized = true;
        }
        if self.refused.get().is_some() {
            return;
        }
        let connection = tokio::select! {
            connection = self.connection() => connection,
            () = self.refused_now() => return,
        };
        if let Err(error) = connection.notify(method, params).await {
            if let Some(refused) = refusal(&error) {
                self.refuse(refused);
            }
        }
    }

    /// Relays one request and writes its answer under the client's id.
    async fn request(self: &Arc<Self>, id: Value, method: &str, params: Params) {
        if method == "initialize" {
            self.remembered().initialize = params.values().cloned();
        }
        // A call's result is relayed as the daemon wrote it, never parsed here: it
        // teaches the bridge nothing, and may be megabytes.
        let relayed_unread = method == "tools/call";
        let headers = self.mirrored_headers(method, &params);
        let reply = loop {
            if let Some(error) = self.refused_error() {
                return self.send(jsonrpc::error_object_response(id, error)).await;
            }
            let connection = tokio::select! {
                connection = self.connection() => connection,
                () = self.refused_now() => continue,
            };
            let values = params.values.clone();
            let request = match &params.arguments {
                Some(arguments) => {
                    connection.prepare_with_member(method, values, arguments.clone())
                }
                None => connection.prepare(method, values),
            }
            .with_headers(headers.clone());
            let request = if relayed_unread {
                request.result_unread()
            } else {
                request
            };
            let outcome = request.send().await;
            match outcome {
                Ok(reply) => break Ok(reply),
                // It never left: send it again on the next connection.
                Err(ConnectionError::NotSent | ConnectionError::Unreachable { .. }) => {
                    self.lost(&connection);
                }
                Err(error @ (ConnectionError::Closed | ConnectionError::Broken { .. })) => {
                    self.lost(&connection);
                    break Err(error);
                }
                Err(error) => match refusal(&error) {
                    Some(refused) => self.refuse(refused),
                    None => break Err(error),
                },
            }
        };
        let reply = match reply {
            Ok(Reply::Unread(raw)) if relayed_unread => {
                return self.send(Answer::serialized_result(&id, raw.bytes())).await;
            }
            reply => reply,
        };
        let answer = match reply.map(Reply::into_result) {
            Ok(Ok(result)) => {
                self.learn(method, params.values(), &result);
                jsonrpc::result_response(id, result)
            }
            Ok(Err(error)) => jsonrpc::error_object_response(id, error),
            Err(error) => jsonrpc::error_object_response(
                id,
                json!({
                    "code": jsonrpc::UPSTREAM_FAILED,
                    "message": format!("the connection to plexus at {} was lost during the call: {}", self.target.url, adapters::error_chain(&error)),
                    "data": {"kind": "upstream_failed", "upstream": null, "retryable": true, "retry_after_ms": 1000},
                }),
            ),
        };
        self.send(answer).await;
    }

    /// What a successful answer teaches the bridge about the client's state.
    fn learn(&self, method: &str, params: Option<&Value>, result: &Value) {
        let mut remembered = self.remembered();
        match method {
            "logging/setLevel" => remembered.log_level = params.cloned(),
            "resources/subscribe" | "resources/unsubscribe" => {
                if let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
                    if method == "resources/subscribe" {
                        remembered.subscriptions.insert(uri.to_string());
                    } else {
                        remembered.subscriptions.remove(uri);
                    }
                }
            }
            "tools/list" => {
                for tool in result
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (Some(name), Some(schema)) = (
                        tool.get("name").and_then(Value::as_str),
                        tool.get("inputSchema"),
                    ) else {
                        continue;
                    };
                    if let Ok(designated) = param_headers(schema) {
                        if !designated.is_empty() {
                            remembered
                                .param_headers
                                .insert(name.to_string(), designated);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// The `Mcp-Param-*` headers a 2026-07-28 `tools/call` must carry.
    fn mirrored_headers(&self, method: &str, params: &Params) -> Vec<(String, String)> {
        if method != "tools/call" {
            return Vec::new();
        }
        let remembered = self.remembered();
        // Most daemons list no tool that mirrors a parameter: a call's params are
        // then not looked at. Otherwise the name is read, and the arguments only
        // for a tool that mirrors some of them.
        if remembered.param_headers.is_empty() {
            return Vec::new();
        }
        let name = params
            .values()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str);
        let Some(designated) = name.and_then(|name| remembered.param_headers.get(name)) else {
            return Vec::new();
        };
        let read;
        let arguments = match &params.arguments {
            Some(written) => {
                read = written.read().ok();
                read.as_ref()
            }
            None => params.values().and_then(|p| p.get("arguments")),
        };
        designated
            .iter()
            .filter_map(|header| {
                let value = header.value_in(arguments)?;
                Some((header.header_name(), encode_header_value(&value)))
            })
            .collect()
    }

    /// The live connection, waiting for one while the bridge reconnects.
    async fn connection(&self) -> UpstreamConnection {
        let mut connections = self.connection.subscribe();
        loop {
            if let Some(connection) = connections.borrow_and_update().clone() {
                if !connection.is_closed() {
                    return connection;
                }
            }
            if connections.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Returns once the credentials are refused (a request waiting for a
    /// connection then waits no more).
    async fn refused_now(&self) {
        let mut connections = self.connection.subscribe();
        while self.refused.get().is_none() {
            if connections.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// `connection` failed: take it down so the keeper makes a new one (which the
    /// caller's next `connection()` waits for).
    fn lost(&self, connection: &UpstreamConnection) {
        self.connection.send_if_modified(|current| {
            let same = current
                .as_ref()
                .is_some_and(|current| current.is_same(connection));
            if same {
                *current = None;
            }
            same
        });
    }
}

/// Keeps a connection to the daemon: opens one, restores the client's session on
/// it, relays what the daemon sends on its own, and starts over when it is lost.
async fn keep_connected(bridge: Arc<Bridge>) {
    let mut delay = Duration::from_millis(100);
    let mut first = true;
    loop {
        let (events, mut received) = mpsc::channel(256);
        // Notifications are written out by the task that read them, so a call's
        // progress is out before its result; the queue takes them only when full.
        let output = bridge.output.clone();
        let events = Events::new(events).with_tap(Arc::new(move |message| {
            output.try_send(message.clone().into()).is_ok()
        }));
        let endpoint = HttpEndpoint {
            url: bridge.target.url.clone(),
            headers: bridge
                .target
                .token
                .iter()
                .map(|token| ("Authorization".to_string(), format!("Bearer {token}")))
                .collect(),
            transport: HttpTransportKind::StreamableHttp,
        };
        let options = HttpOptions {
            connect_timeout: Duration::from_secs(5),
            ..HttpOptions::default()
        };
        let connection = match UpstreamConnection::connect_http(
            Arc::from("plexus"),
            &endpoint,
            &options,
            events,
        )
        .await
        {
            Ok(connection) => connection,
            Err(error) => {
                tracing::warn!(error = %adapters::error_chain(&error), url = %bridge.target.url, "cannot connect to plexus; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if !first {
            match restore(&bridge, &connection).await {
                Ok(()) => tracing::info!(url = %bridge.target.url, "reconnected to plexus"),
                Err(Restore::Refused(refused)) => {
                    connection.shutdown().await;
                    bridge.refuse(refused);
                    return;
                }
                Err(Restore::Failed(error)) => {
                    tracing::warn!(%error, url = %bridge.target.url, "plexus is not back yet; retrying");
                    connection.shutdown().await;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        first = false;
        delay = Duration::from_millis(100);
        bridge.connection.send_replace(Some(connection.clone()));
        let relaying = async {
            while let Some(event) = received.recv().await {
                let message = match event {
                    UpstreamEvent::Notification(message) => message,
                    UpstreamEvent::Request { message, .. } => message,
                };
                bridge.send(message).await;
            }
        };
        let mut current = bridge.connection.subscribe();
        let replaced = async {
            loop {
                if current.borrow_and_update().is_none() {
                    return;
                }
                if current.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = connection.closed() => {}
            () = relaying => {}
            () = replaced => {}
        }
        bridge.connection.send_replace(None);
        connection.shutdown().await;
        if bridge.refused.get().is_some() {
            return;
        }
        tracing::warn!(url = %bridge.target.url, "lost the connection to plexus; reconnecting");
    }
}

/// Why a session could not be restored on a new connection.
enum Restore {
    /// The daemon refused the credentials: final.
    Refused(Refused),
    /// Not back yet: try again.
    Failed(String),
}

/// A new connection for a client that had a session: its `initialize` again (the
/// answer is the bridge's, not the client's), its log level and subscriptions,
/// and `list_changed` so it lists again.
async fn restore(bridge: &Bridge, connection: &UpstreamConnection) -> Result<(), Restore> {
    let (initialize, initialized, log_level, subscriptions) = {
        let remembered = bridge.remembered();
        (
            remembered.initialize.clone(),
            remembered.initialized,
            remembered.log_level.clone(),
            remembered.subscriptions.clone(),
        )
    };
    let Some(initialize) = initialize else {
        // A 2026-07-28 client has no session to restore; its lists may still have changed.
        announce_changes(bridge).await;
        return Ok(());
    };
    match connection.request("initialize", Some(initialize)).await {
        Ok(Reply::Result(_) | Reply::Unread(_)) => {}
        Ok(Reply::Error(error)) => {
            return Err(Restore::Failed(format!("initialize was refused: {error}")))
        }
        Err(error) => {
            return Err(match refusal(&error) {
                Some(refused) => Restore::Refused(refused),
                None => Restore::Failed(adapters::error_chain(&error)),
            })
        }
    }
    if initialized {
        let _ = connection.notify("notifications/initialized", None).await;
    }
    if let Some(level) = log_level {
        let _ = connection.request("logging/setLevel", Some(level)).await;
    }
    for uri in subscriptions {
        let mut params = Map::new();
        params.insert("uri".into(), Value::String(uri));
        let _ = connection
            .request("resources/subscribe", Some(Value::Object(params)))
            .await;
    }
    announce_changes(bridge).await;
    Ok(())
}

async fn announce_changes(bridge: &Bridge) {
    for method in [
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    ] {
        bridge.send(jsonrpc::notification(method, None)).await;
    }
}
