//! plexus integration harness: locate the built binaries, write a config, start a
//! real daemon on `127.0.0.1:0`, and talk to it with real MCP clients.

pub mod answering;
pub mod balancer;
pub mod cluster;
mod daemon;
pub mod search_bench;

pub use daemon::{Daemon, DaemonBuilder};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rmcp::model::{ClientConfig, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// The directory holding the workspace's built binaries (`target/debug`).
pub fn binary_dir() -> PathBuf {
    // Test executables live in target/<profile>/deps; the binaries one level up.
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The workspace's root directory (where `target/` and `tests/python/` are).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The Python SDK's interpreter, where `scripts/ensure-python-sdk` puts it.
pub fn venv_python() -> PathBuf {
    workspace_root().join("target/python-venv/bin/python")
}

/// The `plexus` binary; the test command builds it before the tests run.
pub fn plexus_binary() -> PathBuf {
    match std::env::var_os("PLEXUS_BIN") {
        Some(chosen) => PathBuf::from(chosen),
        None => fresh(binary_dir().join("plexus")),
    }
}

/// The fixture MCP server binary.
pub fn fixture_binary() -> PathBuf {
    fresh(binary_dir().join("plexus-fixture"))
}

/// `binary`, unless it is older than a workspace source it was built from: then
/// the test fails at once, saying how to build, instead of testing yesterday's
/// daemon against today's test. Checked once per binary and test process.
///
/// A build from here instead was ruled out: it would run inside timed tests, on
/// every test thread at once unless locked, and with this package's cargo
/// features rather than the workspace's (`cargo test -p plexus-tests` and
/// `--workspace` resolve rmcp differently), rebuilding what the outer command built.
fn fresh(binary: PathBuf) -> PathBuf {
    static CHECKED: std::sync::Mutex<Vec<(PathBuf, Result<(), String>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let verdict = match checked.iter().find(|(path, _)| *path == binary) {
        Some((_, verdict)) => verdict.clone(),
        None => {
            let verdict = check_fresh(&binary);
            checked.push((binary.clone(), verdict.clone()));
            verdict
        }
    };
    if let Err(stale) = verdict {
        panic!("{stale}: run `cargo build --workspace --bins`");
    }
    binary
}

/// Compares the binary's mtime with its sources', as cargo listed them in its
/// dep-info (`target/debug/<name>.d`), keeping this workspace's files: those of
/// `daemon/src`, `adapters/src`, `registry/src` and `tests/src` that it is built from.
fn check_fresh(binary: &Path) -> Result<(), String> {
    let built = std::fs::metadata(binary)
        .and_then(|meta| meta.modified())
        .map_err(|error| format!("{}: {error}", binary.display()))?;
    // No dep-info: a binary cargo did not build here; nothing to compare with.
    let Ok(dep_info) = std::fs::read_to_string(binary.with_extension("d")) else {
        return Ok(());
    };
    let root = workspace_root();
    let sources = dep_info
        .lines()
        .next()
        .and_then(|line| line.split_once(": "));
    // Make-style: a space inside a path is escaped as `\ `.
    let sources = sources.map_or(String::new(), |(_, list)| list.replace("\\ ", "\0"));
    for source in sources.split_whitespace() {
        let source = PathBuf::from(source.replace('\0', " "));
        if !source.starts_with(&root) {
            continue;
        }
        let changed = std::fs::metadata(&source).and_then(|meta| meta.modified());
        if changed.is_ok_and(|changed| changed > built) {
            return Err(format!(
                "{} is older than {}",
                binary.display(),
                source.display()
            ));
        }
    }
    Ok(())
}

/// A TOML upstream section running the fixture under `name`.
pub fn fixture_upstream(upstream: &str, extra: &str, fixture_args: &[&str]) -> String {
    let args: Vec<String> = fixture_args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[upstreams.{upstream}]\ncommand = {:?}\nargs = [{}]\n{extra}\n",
        fixture_binary().display().to_string(),
        args.join(", ")
    )
}

/// The first notification on a 2026-07-28 listen stream that `wanted` takes,
/// within `within`; an error if the stream ends or fails first.
pub async fn heard_on<T>(
    subscription: &mut rmcp::service::Subscription,
    within: Duration,
    wanted: impl Fn(rmcp::model::ServerNotification) -> Option<T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(within, async {
        loop {
            match subscription.next().await? {
                Some(notification) => {
                    if let Some(heard) = wanted(notification) {
                        return Ok(heard);
                    }
                }
                None => bail!("the listen stream ended"),
            }
        }
    })
    .await
    .with_context(|| format!("nothing wanted on the listen stream within {within:?}"))?
}

/// The URI of a resource update, for [`heard_on`].
pub fn updated_uri(heard: rmcp::model::ServerNotification) -> Option<String> {
    match heard {
        rmcp::model::ServerNotification::ResourceUpdatedNotification(update) => {
            Some(update.params.uri)
        }
        _ => None,
    }
}

/// A test client that counts the list changes it is told about.
#[derive(Clone, Default)]
pub struct TestClient {
    pub tools_changed: Arc<Notify>,
}

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default().with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }
}

pub type Client = RunningService<RoleClient, TestClient>;

/// The names of every tool a client is offered, every page read.
pub async fn tool_names(client: &Client) -> anyhow::Result<Vec<String>> {
    Ok(client
        .list_all_tools()
        .await?
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect())
}

/// An rmcp client over streamable HTTP.
pub async fn http_client(url: &str, handler: TestClient) -> anyhow::Result<Client> {
    let transport = StreamableHttpClientTransport::from_uri(url.to_string());
    Ok(handler.serve(transport).await?)
}

/// An rmcp client that launches `plexus serve --stdio --config <path>` itself.
pub async fn stdio_client(config: &Path, handler: TestClient) -> anyhow::Result<Client> {
    let transport = TokioChildProcess::new(plexus_stdio_command(config))?;
    Ok(handler.serve(transport).await?)
}

/// `plexus serve --stdio --config <config>`, logging warnings only (to stderr).
pub fn plexus_stdio_command(config: &Path) -> Command {
    let mut command = Command::new(plexus_binary());
    command
        .args(["serve", "--stdio", "--config"])
        .arg(config)
        .env("PLEXUS_LOG", "warn");
    command
}

/// A session-less 2026-07-28 request, as a raw client sends it: `_meta` with the
/// revision, empty capabilities and a client info, and the revision's headers
/// (`Mcp-Name` when `name` is given).
pub async fn post_2026(
    url: &str,
    id: Value,
    method: &str,
    mut params: Value,
    name: Option<&str>,
) -> anyhow::Result<reqwest::Response> {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    Ok(request.body(body.to_string()).send().await?)
}

/// A response to a POST as (status, the JSON-RPC message, its `Mcp-Session-Id`):
/// the body itself, or the last message of an event stream.
pub async fn answer_of(
    response: reqwest::Response,
) -> anyhow::Result<(u16, Value, Option<String>)> {
    let status = response.status().as_u16();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = response.text().await?;
    let body: Value = serde_json::from_str(
        text.lines()
            .rev()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap_or(&text),
    )
    .with_context(|| format!("body: {text}"))?;
    Ok((status, body, session))
}

/// Raw JSON-RPC over HTTP, for comparing exactly what arrives.
pub struct RawHttpSession {
    client: reqwest::Client,
    url: String,
    /// Sent with every request (a bearer token, a cookie).
    headers: Vec<(String, String)>,
    session: Option<String>,
    next_id: u64,
    /// Messages that arrived on a request's event stream before its response.
    pub streamed: Vec<Value>,
}

impl RawHttpSession {
    pub async fn connect(url: &str) -> anyhow::Result<RawHttpSession> {
        RawHttpSession::connect_with(url, &[]).await
    }

    /// Like [`RawHttpSession::connect`], sending `headers` with every request.
    pub async fn connect_with(
        url: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<RawHttpSession> {
        RawHttpSession::connect_declaring(url, headers, serde_json::json!({})).await
    }

    /// Like [`RawHttpSession::connect_with`], declaring `capabilities` (it never
    /// answers what they let an upstream ask).
    pub async fn connect_declaring(
        url: &str,
        headers: &[(&str, &str)],
        capabilities: Value,
    ) -> anyhow::Result<RawHttpSession> {
        let mut session = RawHttpSession {
            client: reqwest::Client::new(),
            url: url.to_string(),
            headers: headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            session: None,
            next_id: 0,
            streamed: Vec::new(),
        };
        let hello = session
            .request(
                "initialize",
                serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "raw", "version": "0"}}),
            )
            .await?;
        if hello.get("result").is_none() {
            bail!("initialize failed: {hello}");
        }
        session.notify("notifications/initialized").await?;
        Ok(session)
    }

    /// Sends a request and returns the whole response message.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let message = serde_json::json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.post(&message).await
    }

    pub async fn post(&mut self, message: &Value) -> anyhow::Result<Value> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(serde_json::to_vec(message)?);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await?;
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str()?.to_string());
        }
        let is_stream = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let text = response.text().await?;
        if !is_stream {
            return serde_json::from_str(&text).with_context(|| format!("response body: {text}"));
        }
        // An event stream: related messages, then the response, which comes last.
        let mut messages: Vec<Value> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .with_context(|| format!("event stream: {text}"))?;
        let last = messages
            .pop()
            .with_context(|| format!("empty event stream: {text}"))?;
        self.streamed.extend(messages);
        Ok(last)
    }

    /// Posts bytes that need not be JSON.
    pub async fn post_raw(&mut self, body: &[u8]) -> anyhow::Result<Value> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_vec());
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let text = request.send().await?.text().await?;
        serde_json::from_str(&text).with_context(|| format!("response body: {text}"))
    }

    pub fn session_id(&self) -> Option<String> {
        self.session.clone()
    }

    pub async fn notify(&mut self, method: &str) -> anyhow::Result<u16> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(
                &serde_json::json!({"jsonrpc": "2.0", "method": method}),
            )?);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        Ok(request.send().await?.status().as_u16())
    }
}

/// A progress-token spoofing round: `victim` calls `victim_tool` (the fixture's
/// `sleep`, 1.5 s, with progress) on `daemon`'s upstream `victim_upstream` while
/// `spoofer`, once that call is in flight, calls
/// `spoofer_tool` (a `sleep` of 600 ms that also sends its progress under
/// `plexus-1`, the daemon's first progress token and so the victim's). Fails unless
/// both are answered and the victim hears its own progress, all of it, alone.
pub async fn progress_is_not_spoofed(
    daemon: &Daemon,
    victim_upstream: &str,
    victim: &mut RawHttpSession,
    victim_tool: &str,
    spoofer: &mut RawHttpSession,
    spoofer_tool: &str,
) -> anyhow::Result<()> {
    let victims_call = victim.request(
        "tools/call",
        json!({"name": victim_tool, "arguments": {"ms": 1500}, "_meta": {"progressToken": "mine"}}),
    );
    let spoofing = async {
        daemon.wait_for_in_flight(victim_upstream, 1).await?;
        spoofer
            .request(
                "tools/call",
                json!({"name": spoofer_tool, "arguments": {"ms": 600, "spoof_progress": "plexus-1"}}),
            )
            .await
    };
    let (answer, spoofed) = tokio::join!(victims_call, spoofing);
    let (answer, spoofed) = (answer?, spoofed?);
    anyhow::ensure!(
        answer["result"]["content"][0]["text"] == "slept 1500 ms",
        "{answer}"
    );
    anyhow::ensure!(
        spoofed["result"]["content"][0]["text"] == "slept 600 ms",
        "{spoofed}"
    );
    let progress: Vec<&Value> = victim
        .streamed
        .iter()
        .filter(|message| message["method"] == "notifications/progress")
        .collect();
    anyhow::ensure!(
        !progress.is_empty()
            && progress.iter().all(|message| {
                message["params"]["progressToken"] == "mine"
                    && message["params"]["total"] == 1500.0
                    && message["params"].get("message").is_none()
            }),
        "the victim heard progress not of its own call: {progress:?}"
    );
    Ok(())
}

/// Raw JSON-RPC over a child's stdin/stdout: what a server sends, unmodified. The
/// child may be an upstream or `plexus serve --stdio`, so one exchange can be made
/// both directly and through plexus and compared byte for byte.
/// A child in a process group of its own, which is killed with it when dropped: a
/// launcher such as `npx` leaves its node child running when only it is killed, and
/// some servers do not exit when their stdin closes.
struct GroupChild {
    child: Child,
    group: Option<i32>,
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        if let Some(group) = self.group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub struct RawStdioSession {
    child: GroupChild,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
    /// Requests the server sent this client (`method` and `params`), as they arrived.
    pub asked: Vec<Value>,
    /// Notifications the server sent while a request ran, whole, as they arrived.
    pub heard: Vec<Value>,
    /// Responses read while waiting for another message, as they arrived.
    pub responses: Vec<Value>,
}

impl RawStdioSession {
    /// Starts `program` and runs the `initialize` handshake, declaring no capabilities.
    pub async fn spawn(program: &Path, args: &[&str]) -> anyhow::Result<RawStdioSession> {
        let mut session = RawStdioSession::start(program, args).await?;
        session.initialize(serde_json::json!({})).await?;
        Ok(session)
    }

    /// Starts `program` without any handshake.
    pub async fn start(program: &Path, args: &[&str]) -> anyhow::Result<RawStdioSession> {
        use tokio::io::AsyncBufReadExt;
        let mut child = Command::new(program)
            .args(args)
            .env("PLEXUS_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let group = child.id().and_then(|pid| i32::try_from(pid).ok());
        Ok(RawStdioSession {
            child: GroupChild { child, group },
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            next_id: 0,
            asked: Vec::new(),
            heard: Vec::new(),
            responses: Vec::new(),
        })
    }

    /// How many bytes the pipes to the child's stdin and from its stdout hold.
    pub fn pipe_capacities(&mut self) -> anyhow::Result<(i32, i32)> {
        use nix::fcntl::{fcntl, FcntlArg};
        use std::os::fd::AsRawFd;
        let stdin = fcntl(self.stdin.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)?;
        let stdout = fcntl(
            self.lines.get_ref().get_ref().as_raw_fd(),
            FcntlArg::F_GETPIPE_SZ,
        )?;
        Ok((stdin, stdout))
    }

    /// The handshake, declaring `capabilities`; returns the `initialize` response.
    pub async fn initialize(&mut self, capabilities: Value) -> anyhow::Result<Value> {
        let hello = self
            .request(
                "initialize",
                serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "raw", "version": "0"}}),
            )
            .await?;
        self.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(hello)
    }

    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Sends a request and returns the response message; requests the server
    /// sends meanwhile get an empty result.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.request_answering(method, params, &|_| serde_json::json!({}))
            .await
    }

    /// Sends a request and returns the response message; requests the server
    /// sends meanwhile are recorded in `asked` and answered with `answer(method)`.
    pub async fn request_answering(
        &mut self,
        method: &str,
        params: Value,
        answer: &dyn Fn(&str) -> Value,
    ) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = Value::from(self.next_id);
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await?;
        self.answer_to(&id, answer).await
    }

    /// Sends a request without waiting for its response; returns its id (for
    /// [`RawStdioSession::response_to`] or a `notifications/cancelled`).
    pub async fn send_request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = Value::from(self.next_id);
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await?;
        Ok(id)
    }

    /// Sends a notification.
    pub async fn send_notification(&mut self, method: &str, params: Value) -> anyhow::Result<()> {
        self.send(&serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await
    }

    /// Reads messages until the first notification `method`, which is returned
    /// (others are kept in `heard`; the server's requests get an empty result).
    pub async fn notification(&mut self, method: &str) -> anyhow::Result<Value> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .with_context(|| format!("no {method} within 60 s"))??
                .context("the server closed stdout")?;
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            match (
                message.get("method").and_then(Value::as_str),
                message.get("id"),
            ) {
                (Some(asked), Some(asked_id)) => {
                    self.asked.push(
                        serde_json::json!({"method": asked, "params": message.get("params")}),
                    );
                    let reply = serde_json::json!({"jsonrpc": "2.0", "id": asked_id, "result": {}});
                    self.send(&reply).await?;
                }
                (Some(heard), None) if heard == method => return Ok(message),
                (Some(_), None) => self.heard.push(message),
                _ => self.responses.push(message),
            }
        }
    }

    /// Sends `line` as it is (a request whose id is the string `id`, written by the
    /// caller: text no `Value` holds), and returns the response message; requests
    /// the server sends meanwhile get an empty result.
    pub async fn request_raw(&mut self, id: &str, line: &str) -> anyhow::Result<Value> {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        self.answer_to(&Value::from(id), &|_| serde_json::json!({}))
            .await
    }

    /// Writes `bytes` and a newline as they are (not JSON, not even UTF-8) and
    /// returns the response whose id is `id` (null for a line that could not be read).
    pub async fn request_bytes(&mut self, id: Value, bytes: &[u8]) -> anyhow::Result<Value> {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(bytes).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        self.answer_to(&id, &|_| serde_json::json!({})).await
    }

    /// Reads until the response to `id`, answering the server's requests meanwhile.
    async fn answer_to(
        &mut self,
        id: &Value,
        answer: &dyn Fn(&str) -> Value,
    ) -> anyhow::Result<Value> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .context("no message within 60 s")??
                .context("the server closed stdout")?;
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            match (
                message.get("method").and_then(Value::as_str),
                message.get("id"),
            ) {
                (Some(asked), Some(asked_id)) => {
                    self.asked.push(
                        serde_json::json!({"method": asked, "params": message.get("params")}),
                    );
                    let reply = serde_json::json!({"jsonrpc": "2.0", "id": asked_id, "result": answer(asked)});
                    self.send(&reply).await?;
                }
                (None, Some(answered)) if answered == id => return Ok(message),
                (Some(_), None) => self.heard.push(message),
                _ => self.responses.push(message),
            }
        }
    }

    pub async fn close(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.child.wait()).await;
    }
}

/// The fixture serving streamable HTTP (`plexus-fixture --http`), as its own process.
pub struct HttpFixture {
    child: Child,
    pub addr: std::net::SocketAddr,
}

impl HttpFixture {
    /// Starts `plexus-fixture --http` on `addr` (port 0: any free port), its stderr
    /// in `dir`, and waits until it reports the address it bound.
    pub async fn start(
        dir: &Path,
        addr: std::net::SocketAddr,
        args: &[&str],
    ) -> anyhow::Result<HttpFixture> {
        HttpFixture::start_with_env(dir, addr, args, &[]).await
    }

    pub async fn start_with_env(
        dir: &Path,
        addr: std::net::SocketAddr,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<HttpFixture> {
        static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr = dir.join(format!("fixture-{}-{n}.log", addr.port()));
        let log = std::fs::File::create(&stderr)
            .with_context(|| format!("creating {}", stderr.display()))?;
        let child = Command::new(fixture_binary())
            .arg("--http")
            .arg(addr.to_string())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting the HTTP fixture")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // The one line it prints once bound: `... listening on http://ADDR/mcp`.
            let text = std::fs::read_to_string(&stderr).unwrap_or_default();
            let bound = text
                .lines()
                .find_map(|line| line.split("listening on http://").nth(1))
                .and_then(|rest| rest.strip_suffix("/mcp"))
                .and_then(|addr| addr.parse().ok());
            if let Some(addr) = bound {
                return Ok(HttpFixture { child, addr });
            }
            if Instant::now() > deadline {
                bail!("the HTTP fixture did not start: {text}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// SIGKILL: the server vanishes mid-stream, connections reset.
    pub async fn kill(mut self) -> anyhow::Result<std::net::SocketAddr> {
        self.child.kill().await?;
        Ok(self.addr)
    }
}

/// A loopback port nothing listens on now, for a server a test stops and starts
/// again. It lies below the kernel's ephemeral range (32768 and up by default): a
/// client that keeps reconnecting to a stopped server on an ephemeral port can be
/// given that very port as its own, connect to itself (TCP simultaneous open) and
/// hold it, so the restarted server cannot bind it.
pub fn restartable_port() -> anyhow::Result<u16> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default()
        ^ std::process::id();
    for attempt in 0..500u32 {
        let port = 20_000 + (seed.wrapping_add(attempt.wrapping_mul(7_919)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port between 20000 and 32000")
}

/// Any typed rmcp value as JSON, so tests assert on wire shapes.
pub fn json_of<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A JSON object literal as rmcp's argument map.
pub fn arguments(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// Every pid under /proc.
fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Held by a test that counts processes by their command line and by a test that
/// starts processes another counts (the same `--name`, the same package): the
/// end-to-end tests share one process, and one must not count the other's.
pub static PROCESS_CENSUS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Pids of live processes whose command line contains `needle` (arguments joined by spaces).
pub fn processes_matching(needle: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                String::from_utf8_lossy(&raw)
                    .replace('\0', " ")
                    .contains(needle)
            }) && !is_zombie(*pid)
        })
        .collect()
}

/// Pids of live processes in process group `group`.
pub fn process_group_members(group: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| stat_fields(*pid).is_some_and(|(state, pgrp)| pgrp == group && state != 'Z'))
        .collect()
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_none_or(|(state, _)| state == 'Z')
}

/// The state letter and process group of a pid, from /proc/<pid>/stat.
fn stat_fields(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// Awaits `attempt` every 25 ms until it returns `Ok` or `within` passes; then its
/// last error, which says what was awaited and what was seen instead, is returned.
/// Write the attempt as `async || { ensure!(condition, "what: {seen}"); Ok(()) }`.
pub async fn eventually<T>(
    within: Duration,
    mut attempt: impl AsyncFnMut() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + within;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() > deadline => {
                return Err(error.context(format!("still not so after {within:?}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// A session that keeps calling a healthy upstream's `echo` while a test injects
/// faults elsewhere, and reports every error it saw.
pub struct ControlSession {
    stop: Arc<Notify>,
    /// Calls answered so far, whatever the answer.
    answered: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<anyhow::Result<(usize, Vec<String>)>>,
}

impl ControlSession {
    pub async fn start(url: &str, tool: &str) -> anyhow::Result<ControlSession> {
        let mut session = RawHttpSession::connect(url).await?;
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = answered.clone();
        let tool = tool.to_string();
        let task = tokio::spawn(async move {
            let mut calls = 0;
            let mut errors = Vec::new();
            loop {
                let text = format!("control {calls}");
                // Each call is let finish (a stop waits for it), so a session
                // stopped early has still made one.
                let response = session
                    .request(
                        "tools/call",
                        serde_json::json!({"name": tool, "arguments": {"text": text}}),
                    )
                    .await;
                calls += 1;
                counted.store(calls, std::sync::atomic::Ordering::SeqCst);
                match response {
                    Ok(response) if response["result"]["content"][0]["text"] == text.as_str() => {}
                    Ok(response) => errors.push(response.to_string()),
                    Err(error) => errors.push(error.to_string()),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = stopped.notified() => break,
                }
            }
            Ok((calls, errors))
        });
        Ok(ControlSession {
            stop,
            answered,
            task,
        })
    }

    /// Waits until `more` calls beyond those answered now have been answered: proof
    /// that the session was served meanwhile, where a pause would only hope so.
    pub async fn wait_for_calls(&self, more: usize) -> anyhow::Result<()> {
        let answered = || self.answered.load(std::sync::atomic::Ordering::SeqCst);
        let target = answered() + more;
        eventually(Duration::from_secs(20), async || {
            anyhow::ensure!(
                answered() >= target,
                "the control session made {} of {target} calls",
                answered()
            );
            Ok(())
        })
        .await
    }

    /// Stops calling; fails if any call went wrong or none was made.
    pub async fn finish(self) -> anyhow::Result<usize> {
        self.stop.notify_one();
        let (calls, errors) = self.task.await??;
        if !errors.is_empty() {
            bail!(
                "the control session saw {} errors in {calls} calls: {errors:?}",
                errors.len()
            );
        }
        if calls == 0 {
            bail!("the control session made no call");
        }
        Ok(calls)
    }
}
