//! What the bench measures: the fixture reached directly (stdio, HTTP) and through
//! plexus (HTTP front, stdio front, a 2026-07-28 client, `plexus connect`), and the
//! processes and client sessions behind each.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use plexus_tests::{
    fixture_binary, fixture_upstream, http_client, plexus_binary, plexus_stdio_command, Client,
    Daemon, HttpFixture, TestClient,
};
use rmcp::model::ProtocolVersion;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::JoinSet;

/// How long a process or session may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// An rmcp client running the fixture as its child, as an MCP host would.
    DirectStdio,
    /// The fixture serving streamable HTTP itself: the baseline of every ratio.
    DirectHttp,
    /// plexus's HTTP front, the fixture its stdio upstream.
    PlexusHttp,
    /// plexus's HTTP front, the fixture serving HTTP its upstream (the baseline's
    /// own server behind plexus): plexus's cost without a stdio upstream's.
    PlexusRemote,
    /// `plexus serve --stdio`: plexus's own cost without HTTP's.
    PlexusStdio,
    /// A 2026-07-28 client (no session, `_meta` on every request) straight to a
    /// fixture serving HTTP in that revision: what the era itself costs, without plexus.
    DirectHttp2026,
    /// A 2026-07-28 client (no session, `_meta` on every request) over HTTP, to a
    /// fixture that speaks 2026-07-28 too.
    Plexus2026,
    /// `plexus connect <url>`: a stdio client bridged to the daemon's HTTP front.
    PlexusConnect,
    /// plexus-http again, served by another build (`--against`): a change and what
    /// it replaced, measured in the same rounds.
    PlexusHttpAgainst,
    /// plexus-http again, with OpenTelemetry on: every request sampled, spans and
    /// histograms posted over OTLP/HTTP to an endpoint that discards them.
    PlexusTraced,
}

impl Target {
    /// The order of a round: direct and plexus cells alternate, so drift on a
    /// noisy machine lands on both sides of a comparison alike.
    pub const ALL: [Target; 10] = [
        Target::DirectHttp,
        Target::PlexusHttp,
        Target::PlexusTraced,
        Target::PlexusHttpAgainst,
        Target::PlexusRemote,
        Target::DirectStdio,
        Target::PlexusStdio,
        Target::DirectHttp2026,
        Target::Plexus2026,
        Target::PlexusConnect,
    ];

    /// The target every ratio is taken against.
    pub const BASELINE: Target = Target::DirectHttp;

    pub fn label(self) -> &'static str {
        match self {
            Target::DirectStdio => "direct-stdio",
            Target::DirectHttp => "direct-http",
            Target::PlexusHttp => "plexus-http",
            Target::PlexusRemote => "plexus-remote",
            Target::PlexusStdio => "plexus-stdio",
            Target::DirectHttp2026 => "direct-http-2026",
            Target::Plexus2026 => "plexus-2026",
            Target::PlexusConnect => "plexus-connect",
            Target::PlexusHttpAgainst => "plexus-http-against",
            Target::PlexusTraced => "plexus-http-traced",
        }
    }

    /// The server called directly by the same kind of client: what the target
    /// costs over going without plexus (a stdio host would run the server itself,
    /// so `plexus connect` is set against direct-stdio). `None` for direct targets.
    pub fn direct_counterpart(self) -> Option<Target> {
        match self {
            Target::DirectStdio | Target::DirectHttp | Target::DirectHttp2026 => None,
            Target::PlexusHttp
            | Target::PlexusRemote
            | Target::PlexusHttpAgainst
            | Target::PlexusTraced => Some(Target::DirectHttp),
            Target::PlexusStdio | Target::PlexusConnect => Some(Target::DirectStdio),
            Target::Plexus2026 => Some(Target::DirectHttp2026),
        }
    }

    /// The echo tool's name as this target lists it.
    pub fn tool(self) -> &'static str {
        match self {
            Target::DirectStdio | Target::DirectHttp | Target::DirectHttp2026 => "echo",
            Target::Plexus2026 => "modern__echo",
            Target::PlexusRemote => "remote__echo",
            Target::PlexusHttp
            | Target::PlexusStdio
            | Target::PlexusConnect
            | Target::PlexusHttpAgainst
            | Target::PlexusTraced => "bench__echo",
        }
    }
}

/// The servers behind the targets: a fixture serving HTTP, and a daemon with two
/// fixture upstreams over stdio (`bench`, and `modern` for 2026-07-28 clients) and
/// that HTTP fixture as a third (`remote`).
/// The stdio targets start their own processes per session.
pub struct Rig {
    http_fixture: HttpFixture,
    /// The same, serving 2026-07-28 too (`--modern`).
    modern_fixture: HttpFixture,
    daemon: Daemon,
    /// The same daemon from another build, when one is compared (`--against`).
    against: Option<Daemon>,
    /// The same daemon with OpenTelemetry on, and where it exports (`plexus-http-traced`).
    traced: Option<(Daemon, Discard)>,
    /// Lines every daemon's `[daemon]` section gets (stdio fronts started later too).
    daemon_extra: String,
    /// The HTTP fixtures' logs, beside no daemon's: they start first.
    _fixture_dir: tempfile::TempDir,
    _modern_dir: tempfile::TempDir,
}

impl Rig {
    /// `against`: another build of plexus, run as a second daemon like the first;
    /// `daemon_extra`: lines for every daemon's `[daemon]` section, stdio fronts too;
    /// `traced`: a third daemon, exporting OpenTelemetry data.
    pub async fn start(
        against: Option<&Path>,
        daemon_extra: &str,
        traced: bool,
    ) -> anyhow::Result<Rig> {
        let fixture_dir = tempfile::tempdir().context("creating the HTTP fixture's directory")?;
        let http_fixture = HttpFixture::start(
            fixture_dir.path(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &["--name", "bench"],
        )
        .await
        .context("starting the HTTP fixture")?;
        let modern_dir = tempfile::tempdir().context("creating the modern fixture's directory")?;
        let modern_fixture = HttpFixture::start(
            modern_dir.path(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &["--name", "modern", "--modern"],
        )
        .await
        .context("starting the modern HTTP fixture")?;
        // The baseline's own server is also an upstream of the daemon (`remote`).
        let sections = format!(
            "{}[upstreams.remote]\nurl = {:?}\n",
            upstream_sections(),
            http_fixture.url()
        );
        let daemon = Daemon::builder()
            .daemon(daemon_extra)
            .upstreams(&sections)
            .start()
            .await
            .context("starting plexus")?;
        daemon
            .wait_ready(START_TIMEOUT)
            .await
            .context("waiting for plexus's upstreams")?;
        let against = match against {
            Some(binary) => {
                let other = Daemon::builder()
                    .binary(binary)
                    .daemon(daemon_extra)
                    .upstreams(&sections)
                    .start()
                    .await
                    .with_context(|| format!("starting {}", binary.display()))?;
                other
                    .wait_ready(START_TIMEOUT)
                    .await
                    .context("waiting for the other build's upstreams")?;
                Some(other)
            }
            None => None,
        };
        let traced = match traced {
            true => {
                let discard = Discard::start().await?;
                let endpoint = discard.endpoint();
                let traced = Daemon::builder()
                    .daemon(daemon_extra)
                    .upstreams(&sections)
                    .env(&[
                        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                        ("OTEL_TRACES_SAMPLER", "always_on"),
                    ])
                    .start()
                    .await
                    .context("starting plexus with tracing on")?;
                traced
                    .wait_ready(START_TIMEOUT)
                    .await
                    .context("waiting for the traced daemon's upstreams")?;
                Some((traced, discard))
            }
            false => None,
        };
        Ok(Rig {
            http_fixture,
            modern_fixture,
            daemon,
            against,
            traced,
            daemon_extra: daemon_extra.to_string(),
            _fixture_dir: fixture_dir,
            _modern_dir: modern_dir,
        })
    }

    /// Opens `count` independent sessions to `target`, each listing its echo tool.
    pub async fn open(&self, target: Target, count: usize) -> anyhow::Result<Vec<Client>> {
        let mut sessions = Vec::with_capacity(count);
        for index in 0..count {
            let session = self
                .open_one(target, index)
                .await
                .with_context(|| format!("opening {} session {index}", target.label()))?;
            sessions.push(session);
        }
        // Waited for only once all are open, so stdio daemons start their upstreams
        // side by side.
        for session in &sessions {
            wait_for_tool(session, target.tool())
                .await
                .with_context(|| format!("{} never listed {}", target.label(), target.tool()))?;
        }
        Ok(sessions)
    }

    async fn open_one(&self, target: Target, index: usize) -> anyhow::Result<Client> {
        let client = TestClient::default();
        Ok(match target {
            Target::DirectStdio => {
                let mut command = Command::new(fixture_binary());
                command.args(["--name", "bench", "--unfiltered"]);
                // Nor does the daemon put its upstream's stderr on our terminal.
                let (transport, _stderr) = TokioChildProcess::builder(command)
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("spawning {}", fixture_binary().display()))?;
                client.serve(transport).await?
            }
            Target::DirectHttp => http_client(&self.http_fixture.url(), client).await?,
            Target::PlexusHttp | Target::PlexusRemote => {
                http_client(&self.daemon.url, client).await?
            }
            Target::PlexusHttpAgainst => {
                let other = self
                    .against
                    .as_ref()
                    .context("plexus-http-against needs --against")?;
                http_client(&other.url, client).await?
            }
            Target::PlexusTraced => {
                let (traced, _) = self
                    .traced
                    .as_ref()
                    .context("the rig was started without its traced daemon")?;
                http_client(&traced.url, client).await?
            }
            Target::PlexusStdio => {
                // A state directory per daemon: they share nothing, as separate hosts would.
                let dir = self.daemon.dir.path();
                let config = dir.join(format!("stdio-{index}.toml"));
                let state = dir.join(format!("stdio-state-{index}"));
                std::fs::write(
                    &config,
                    format!(
                        "[daemon]\nstate_dir = {:?}\n{}\n\n{}",
                        state.display().to_string(),
                        self.daemon_extra,
                        upstream_sections()
                    ),
                )
                .with_context(|| format!("writing {}", config.display()))?;
                client
                    .serve(TokioChildProcess::new(plexus_stdio_command(&config))?)
                    .await?
            }
            Target::DirectHttp2026 | Target::Plexus2026 => {
                let url = match target {
                    Target::DirectHttp2026 => self.modern_fixture.url(),
                    _ => self.daemon.url.clone(),
                };
                client
                    .serve_with_lifecycle(
                        StreamableHttpClientTransport::from_uri(url),
                        ClientLifecycleMode::Discover {
                            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                        },
                    )
                    .await?
            }
            Target::PlexusConnect => {
                let mut command = Command::new(plexus_binary());
                command
                    .args(["connect", &self.daemon.url])
                    .env("PLEXUS_LOG", "warn");
                client.serve(TokioChildProcess::new(command)?).await?
            }
        })
    }

    /// Stops the daemon and the HTTP fixture; fails if plexus exits uncleanly.
    pub async fn stop(self) -> anyhow::Result<()> {
        let stopped = stop_cleanly(self.daemon, "plexus").await;
        self.http_fixture
            .kill()
            .await
            .context("stopping the HTTP fixture")?;
        self.modern_fixture
            .kill()
            .await
            .context("stopping the modern HTTP fixture")?;
        stopped?;
        if let Some(other) = self.against {
            stop_cleanly(other, "the other build").await?;
        }
        if let Some((traced, discard)) = self.traced {
            stop_cleanly(traced, "plexus with tracing on").await?;
            println!(
                "\nplexus-http-traced exported {} OTLP requests ({} bytes)",
                discard.requests(),
                discard.bytes()
            );
        }
        Ok(())
    }
}

/// An OTLP/HTTP endpoint on loopback that reads each POST and answers 200 with
/// an empty body (an empty export response), keeping nothing.
struct Discard {
    address: SocketAddr,
    counts: Arc<(AtomicU64, AtomicU64)>,
    _tasks: JoinSet<()>,
}

impl Discard {
    async fn start() -> anyhow::Result<Discard> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let mut tasks = JoinSet::new();
        let seen = counts.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(discard_requests(stream, seen.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Discard {
            address,
            counts,
            _tasks: tasks,
        })
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    fn requests(&self) -> u64 {
        self.counts.0.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.counts.1.load(Ordering::Relaxed)
    }
}

/// Serves one keep-alive connection: each request's head, then its
/// `content-length` bytes of body, then `200`.
async fn discard_requests(stream: TcpStream, counts: Arc<(AtomicU64, AtomicU64)>) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut length = 0u64;
        loop {
            let mut line = String::new();
            match stream.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let copied = tokio::io::copy(&mut (&mut stream).take(length), &mut tokio::io::sink()).await;
        if copied.is_err() {
            return;
        }
        counts.0.fetch_add(1, Ordering::Relaxed);
        counts.1.fetch_add(length, Ordering::Relaxed);
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.get_mut().write_all(answer).await.is_err() {
            return;
        }
    }
}

/// Stops `daemon`; fails, with its log, if it exits uncleanly.
async fn stop_cleanly(daemon: Daemon, what: &str) -> anyhow::Result<()> {
    let log = daemon.log();
    let status = daemon
        .stop()
        .await
        .with_context(|| format!("stopping {what}"))?;
    if !status.success() {
        bail!("{what} exited with {status}:\n{log}");
    }
    Ok(())
}

/// The daemon's upstreams (the stdio daemons have the same).
fn upstream_sections() -> String {
    // Unfiltered: the stdio fixture then does the work the HTTP one does, no more.
    fixture_upstream("bench", "", &["--name", "bench", "--unfiltered"])
        + &fixture_upstream(
            "modern",
            "",
            &["--name", "modern", "--modern", "--unfiltered"],
        )
}

/// Waits until `client` lists `tool` (a stdio daemon starts its upstream after
/// answering `initialize`).
async fn wait_for_tool(client: &Client, tool: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while !client
        .list_all_tools()
        .await?
        .iter()
        .any(|t| t.name == tool)
    {
        if Instant::now() > deadline {
            bail!("not listed after {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
