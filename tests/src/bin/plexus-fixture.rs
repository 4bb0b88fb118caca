//! plexus-fixture: a stdio MCP server for plexus tests, with vendor-key output patches and fault-injection flags.

#[path = "../fixture/conformance.rs"]
mod conformance;
#[path = "../fixture/drift.rs"]
mod drift;
#[path = "../fixture/extra.rs"]
mod extra;
#[path = "../fixture/filter.rs"]
mod filter;
#[path = "../fixture/http.rs"]
mod http;
#[path = "../fixture/input_required.rs"]
mod input_required;
#[path = "../fixture/server.rs"]
mod server;
#[path = "../fixture/tasks.rs"]
mod tasks;

use std::{
    io::Write as _,
    net::SocketAddr,
    os::fd::AsFd,
    path::PathBuf,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use rmcp::{service::ServerInitializeError, ServiceExt};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader, ReadBuf};

use server::{AddSchema, Fixture};

/// Test MCP server speaking newline-delimited JSON-RPC on stdin/stdout (or
/// streamable HTTP with `--http`).
#[derive(Parser, Debug)]
#[command(name = "plexus-fixture")]
struct Cli {
    /// serverInfo.name, also embedded in outputs [env: FIXTURE_NAME] [default: fixture]
    #[arg(long)]
    name: Option<String>,
    /// Input schema of the `add` tool [env: FIXTURE_ADD_SCHEMA] [default: v1]
    #[arg(long, value_enum)]
    add_schema: Option<AddSchema>,
    /// Print non-JSON lines on stdout: one before serving, one after the initialize response.
    #[arg(long)]
    banner: bool,
    /// Read stdin forever but never answer anything.
    #[arg(long)]
    hang_initialize: bool,
    /// Keep running when SIGTERM arrives.
    #[arg(long)]
    ignore_sigterm: bool,
    /// Write BYTES bytes of 'x' (no newline) to stderr at startup.
    #[arg(long, value_name = "BYTES")]
    stderr_flood: Option<u64>,
    /// Write numbered lines to stderr as fast as it can, in 64 KiB writes, on a
    /// thread of its own while serving (a hostile upstream); the count written so
    /// far is in the file PATH, rewritten every 100 ms.
    #[arg(long, value_name = "PATH")]
    flood_stderr: Option<std::path::PathBuf>,
    /// Write N short lines to stderr at startup (a chatty upstream).
    #[arg(long, value_name = "N")]
    stderr_lines: Option<u64>,
    /// Exit with status 3, without answering, while handling the N-th tools/call.
    #[arg(long, value_name = "N")]
    exit_after_calls: Option<u64>,
    /// Also serve the tools, resources, template and prompts the MCP
    /// conformance suite's server scenarios call by name, plus logging,
    /// completion and subscriptions.
    #[arg(long)]
    conformance: bool,
    /// Also serve protocol 2026-07-28 (`server/discover`, per-request `_meta`),
    /// where `ask` answers through input-required results.
    #[arg(long)]
    modern: bool,
    /// With --modern: refuse `initialize` as a server of 2026-07-28 alone does
    /// (-32022, `data.supported`), so only `server/discover` starts a session.
    #[arg(long, requires = "modern", conflicts_with = "unfiltered")]
    refuse_handshake: bool,
    /// With --modern: answer the first `server/discover` with -32022 naming
    /// 2026-07-28 itself, as a server refusing one request's version does.
    #[arg(long, requires = "modern", conflicts_with = "unfiltered")]
    refuse_first_discover: bool,
    /// With --modern: `server/discover` lists 2026-07-28 alone while `initialize`
    /// is still answered, as the SDKs of that revision do.
    #[arg(long, requires = "modern", conflicts_with = "unfiltered")]
    discover_modern_only: bool,
    /// Over stdio, exit (status 3) instead of answering `initialize`.
    #[arg(long, conflicts_with = "unfiltered")]
    exit_on_initialize: bool,
    /// Over stdio, name the server in every result's `_meta`
    /// (`io.modelcontextprotocol/serverInfo`), as some SDKs of 2026-07-28 do.
    #[arg(long, conflicts_with = "unfiltered")]
    server_info_in_results: bool,
    /// Over stdio, read nothing for MS milliseconds after starting, as a server
    /// that takes long to load (a cold `uvx` start, heavy imports).
    #[arg(long, value_name = "MS", conflicts_with = "http")]
    slow_start: Option<u64>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio; the bound
    /// address is reported on stderr and nothing is written to stdout.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["banner", "hang_initialize"])]
    http: Option<SocketAddr>,
    /// With --http: answer with plain JSON bodies and keep no sessions.
    #[arg(long, requires = "http")]
    stateless_json: bool,
    /// With --http: refuse (401) every request without this header, as `Name: value`.
    #[arg(long, value_name = "HEADER", requires = "http")]
    require_header: Option<String>,
    /// With --stateless-json: put a log notification on the line before each
    /// result, in the same body.
    #[arg(long, requires = "stateless_json")]
    lines_body: bool,
    /// With --stateless-json: pretty-print each JSON body (line breaks between tokens).
    #[arg(long, requires = "stateless_json", conflicts_with = "lines_body")]
    pretty: bool,
    /// With --http: append one JSON line per HTTP request (method, path, MCP headers) to PATH.
    #[arg(long, value_name = "PATH", requires = "http")]
    request_log: Option<PathBuf>,
    /// Write one non-JSON line of BYTES bytes on stdout when the first progress
    /// notification goes out (a call is then in flight).
    #[arg(long, value_name = "BYTES", conflicts_with = "http")]
    oversized_junk: Option<usize>,
    /// Change what is listed by the drift names PATH holds (read at every list, and
    /// watched: a change sends list_changed). See `drift.rs` for the names.
    #[arg(long, value_name = "PATH", conflicts_with = "http")]
    drift_file: Option<PathBuf>,
    /// With --modern: every list carries these 2026-07-28 cache hints, as
    /// `TTL_MS:public` or `TTL_MS:private`.
    #[arg(long, value_name = "TTL_MS:SCOPE", value_parser = parse_cache_hints, requires = "modern")]
    cache_hints: Option<(u64, bool)>,
    /// Also list N tools `extra_0000`… with realistic definitions (about 250 bytes
    /// of JSON each), each echoing its arguments: a large catalog for benchmarks.
    #[arg(long, value_name = "N", default_value_t = 0)]
    extra_tools: usize,
    /// Over stdio, write rmcp's output straight to stdout, without the output
    /// filter's vendor patches (which parse and write every message again, on a
    /// task of their own): the server `--http` is, for benchmarks.
    #[arg(long, conflicts_with_all = ["http", "banner", "drift_file", "oversized_junk", "raw_escapes", "malformed_replies", "batch_replies", "list_changed_every", "byte_order_mark"])]
    unfiltered: bool,
    /// Write `<lone-surrogate>` in any output as half a surrogate pair's escape
    /// (`\ud83d`) and `<bad-escape>` as an escape JSON does not have (`\x`).
    #[arg(long)]
    raw_escapes: bool,
    /// Make a reply whose text names `<hollow-reply>` carry neither result nor
    /// error, `<string-result>` a string result, `<bad-error>` an error that is
    /// not a JSON-RPC error object.
    #[arg(long)]
    malformed_replies: bool,
    /// Write each reply in a JSON-RPC batch, after a log notification (batches
    /// were allowed until MCP 2025-06-18).
    #[arg(long, conflicts_with = "http")]
    batch_replies: bool,
    /// Send `notifications/tools/list_changed` every MS milliseconds, without end.
    #[arg(long, value_name = "MS", conflicts_with = "http")]
    list_changed_every: Option<u64>,
    /// Write UTF-8's byte-order mark before the first line on stdout.
    #[arg(long, conflicts_with = "http")]
    byte_order_mark: bool,
}

fn parse_cache_hints(text: &str) -> Result<(u64, bool), String> {
    let (ttl, scope) = text
        .split_once(':')
        .ok_or("expected TTL_MS:public or TTL_MS:private")?;
    let ttl = ttl.parse().map_err(|error| format!("`{ttl}`: {error}"))?;
    match scope {
        "public" => Ok((ttl, true)),
        "private" => Ok((ttl, false)),
        other => Err(format!("`{other}` is neither `public` nor `private`")),
    }
}

const DEFAULT_NAME: &str = "fixture";

fn main() {
    let cli = Cli::parse();
    // Before anything else, so a parent that never drains stderr blocks us
    // here, which is the fault this flag exists to provoke.
    if let Some(bytes) = cli.stderr_flood {
        flood_stderr(bytes);
    }
    if let Some(lines) = cli.stderr_lines {
        let mut stderr = std::io::stderr().lock();
        for n in 0..lines {
            if writeln!(stderr, "chatty line {n}").is_err() {
                break;
            }
        }
    }
    if let Some(count_file) = cli.flood_stderr.clone() {
        std::thread::spawn(move || flood_stderr_lines(&count_file));
    }
    init_tracing();
    let code = match run(cli) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error:#}");
            1
        }
    };
    // Exit explicitly: tokio's stdin reader runs on a blocking thread that
    // runtime shutdown would otherwise wait on.
    std::process::exit(code);
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(filter)
        .init();
}

fn flood_stderr(bytes: u64) {
    let chunk = [b'x'; 8192];
    let mut left = bytes;
    let mut stderr = std::io::stderr().lock();
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        if stderr.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
    let _ = stderr.flush();
}

/// Numbered lines, 64 KiB at a time, until stderr is closed. Lines are whole in
/// each write, so a reader sees complete lines however it reads.
fn flood_stderr_lines(count_file: &std::path::Path) {
    let mut buffer = Vec::with_capacity(70 * 1024);
    let mut written: u64 = 0;
    let mut noted = std::time::Instant::now();
    loop {
        buffer.clear();
        while buffer.len() < 64 * 1024 {
            let _ = writeln!(buffer, "flood line {written}");
            written += 1;
        }
        // Stderr is unbuffered: one write of whole lines, locked for that write
        // only (the fixture's own log lines go between).
        if std::io::stderr().lock().write_all(&buffer).is_err() {
            return;
        }
        if noted.elapsed() >= std::time::Duration::from_millis(100) {
            noted = std::time::Instant::now();
            let _ = std::fs::write(count_file, written.to_string());
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    // clap's `env` feature is not enabled in the workspace, so fall back to
    // the environment by hand.
    let name = cli
        .name
        .or_else(|| std::env::var("FIXTURE_NAME").ok())
        .unwrap_or_else(|| DEFAULT_NAME.to_owned());
    let add_schema = match cli.add_schema {
        Some(schema) => schema,
        None => match std::env::var("FIXTURE_ADD_SCHEMA") {
            Ok(value) => AddSchema::from_str(&value, true)
                .map_err(|e| anyhow::anyhow!("FIXTURE_ADD_SCHEMA={value}: {e}"))?,
            Err(_) => AddSchema::V1,
        },
    };
    let cancel_log = std::env::var_os("FIXTURE_CANCEL_LOG").map(PathBuf::from);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(async move {
        if cli.ignore_sigterm {
            ignore_sigterm()?;
        }
        tracing::info!(%name, ?add_schema, conformance = cli.conformance, modern = cli.modern, pid = std::process::id(), "plexus-fixture starting");

        if let Some(addr) = cli.http {
            // One handler per HTTP session, as each stdio process has one.
            let exit_after_calls = cli.exit_after_calls;
            // One for the process: HTTP serves each session (and each
            // 2026-07-28 request) with a handler of its own.
            let conformance = cli.conformance.then(|| Arc::new(conformance::Shared::new()));
            let modern = cli.modern;
            let required_header = match &cli.require_header {
                Some(header) => {
                    let (name, value) = header
                        .split_once(':')
                        .with_context(|| format!("--require-header `{header}` is not `Name: value`"))?;
                    Some((name.trim().to_ascii_lowercase(), value.trim().to_string()))
                }
                None => None,
            };
            let settings = http::HttpSettings {
                stateless_json: cli.stateless_json,
                required_header,
                request_log: cli.request_log.clone(),
                lines_body: cli.lines_body,
                pretty: cli.pretty,
                raw_escapes: cli.raw_escapes,
                malformed_replies: cli.malformed_replies,
            };
            let cache_hints = cli.cache_hints;
            let extra_tools = extra::tools(cli.extra_tools);
            http::serve(addr, settings, move || {
                let fixture = Fixture::new(
                    name.clone(),
                    add_schema,
                    exit_after_calls,
                    cancel_log.clone(),
                    // An HTTP session has no stdin whose EOF could end it.
                    Arc::new(AtomicBool::new(false)),
                    conformance.clone(),
                    modern,
                )
                .with_extra_tools(extra_tools.clone());
                match cache_hints {
                    Some((ttl_ms, public)) => fixture.with_cache_hints(ttl_ms, public),
                    None => fixture,
                }
            })
            .await?;
            return Ok(0);
        }

        // rmcp writes into `to_filter`; the filter owns the real stdout (unless
        // `--unfiltered`, when rmcp does).
        let (to_filter, filter_task): (Box<dyn AsyncWrite + Send + Unpin>, _) = if cli.unfiltered {
            (polled_stdout(), None)
        } else {
            let (to_filter, from_rmcp) = tokio::io::duplex(64 * 1024);
            let filter_task = tokio::spawn(filter::run(
                from_rmcp,
                tokio::io::stdout(),
                filter::Options {
                    server_name: name.clone(),
                    banner: cli.banner,
                    drift_file: cli.drift_file.clone(),
                    oversized_junk: cli.oversized_junk,
                    raw_escapes: cli.raw_escapes,
                    malformed_replies: cli.malformed_replies,
                    batch_replies: cli.batch_replies,
                    list_changed_every: cli
                        .list_changed_every
                        .map(std::time::Duration::from_millis),
                    byte_order_mark: cli.byte_order_mark,
                    refuse_handshake: cli.refuse_handshake,
                    refuse_first_discover: cli.refuse_first_discover,
                    discover_modern_only: cli.discover_modern_only,
                    exit_on_initialize: cli.exit_on_initialize,
                    server_info_in_results: cli.server_info_in_results,
                    handshake_tasks: cli.conformance && cli.modern,
                },
            ));
            (Box::new(to_filter), Some(filter_task))
        };

        let stdin_eof = Arc::new(AtomicBool::new(false));
        let stdin: EofFlag<Box<dyn AsyncRead + Send + Unpin>> = EofFlag {
            inner: if cli.unfiltered {
                polled_stdin()
            } else if cli.conformance && cli.modern {
                // Handshake-era task requests are renamed before rmcp reads them.
                let (to_rmcp, from_pump) = tokio::io::duplex(64 * 1024);
                tokio::spawn(rewrite_stdin(tokio::io::stdin(), to_rmcp));
                Box::new(from_pump)
            } else {
                Box::new(tokio::io::stdin())
            },
            eof: stdin_eof.clone(),
        };

        if let Some(ms) = cli.slow_start {
            // What arrives meanwhile waits in the pipe, as for a server still loading.
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if cli.hang_initialize {
            drop(to_filter);
            hang(stdin).await;
        } else {
            let fixture = Fixture::new(
                name.clone(),
                add_schema,
                cli.exit_after_calls,
                cancel_log,
                stdin_eof,
                cli.conformance
                    .then(|| Arc::new(conformance::Shared::new())),
                cli.modern,
            )
            .with_extra_tools(extra::tools(cli.extra_tools));
            let fixture = match cli.cache_hints {
                Some((ttl_ms, public)) => fixture.with_cache_hints(ttl_ms, public),
                None => fixture,
            };
            match fixture.serve((stdin, to_filter)).await {
                Ok(running) => {
                    let reason = running.waiting().await.context("joining the service")?;
                    tracing::info!(?reason, "service finished");
                }
                // Closing stdin before initialize is a normal way to go away.
                Err(ServerInitializeError::ConnectionClosed(context)) => {
                    tracing::info!(%context, "stdin closed before initialize");
                }
                Err(error) => return Err(anyhow::Error::new(error).context("initialize")),
            }
        }
        // The duplex writer is gone once the service is, so the filter ends
        // after writing what it already holds.
        if let Some(filter_task) = filter_task {
            filter_task
                .await
                .context("joining the output filter")?
                .context("writing stdout")?;
        }
        Ok(0)
    })
}

/// Copies `from` to `to` line by line, each JSON-RPC message passed through
/// `tasks::rewrite_handshake_input`; `to` closes when `from` ends, so rmcp
/// still sees the end of stdin.
async fn rewrite_stdin<R, W>(from: R, mut to: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    let mut lines = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "reading stdin");
                break;
            }
        }
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        let rewritten = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|mut message| {
                let before = message.get("method").cloned();
                tasks::rewrite_handshake_input(&mut message);
                (message.get("method") != before.as_ref())
                    .then(|| serde_json::to_vec(&message).ok())
                    .flatten()
            });
        let written = match rewritten {
            Some(mut bytes) => {
                bytes.push(b'\n');
                to.write_all(&bytes).await
            }
            None => to.write_all(&line).await,
        };
        if written.and(to.flush().await).is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Installs a SIGTERM handler that only logs: once tokio owns the signal its
/// default (terminate) action no longer applies.
fn ignore_sigterm() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    tokio::spawn(async move {
        while sigterm.recv().await.is_some() {
            tracing::warn!("SIGTERM received and ignored (--ignore-sigterm)");
        }
    });
    Ok(())
}

/// `--hang-initialize`: consume stdin so the writer never blocks, answer nothing.
async fn hang<R: AsyncRead + Unpin>(stdin: R) {
    let mut lines = BufReader::new(stdin).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                tracing::info!(len = line.len(), "--hang-initialize: ignoring input line")
            }
            Ok(None) => {
                tracing::info!("--hang-initialize: stdin closed");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "--hang-initialize: stdin read failed");
                return;
            }
        }
    }
}

/// stdin polled on the runtime when it is a pipe, as a server written for speed
/// would (tokio's `stdin()` hands every read to a blocking thread); else tokio's.
fn polled_stdin() -> Box<dyn AsyncRead + Send + Unpin> {
    std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok())
        .map(|pipe| Box::new(pipe) as Box<dyn AsyncRead + Send + Unpin>)
        .unwrap_or_else(|| Box::new(tokio::io::stdin()))
}

/// stdout polled on the runtime when it is a pipe (logs go to stderr); else tokio's.
fn polled_stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
    std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok())
        .map(|pipe| Box::new(pipe) as Box<dyn AsyncWrite + Send + Unpin>)
        .unwrap_or_else(|| Box::new(tokio::io::stdout()))
}

/// Wraps stdin to record EOF, which tells `sleep` that a cancellation came
/// from shutdown rather than from the client.
struct EofFlag<R> {
    inner: R,
    eof: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for EofFlag<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            if buf.filled().len() == before && buf.remaining() > 0 {
                self.eof.store(true, Ordering::SeqCst);
            }
        }
        poll
    }
}
