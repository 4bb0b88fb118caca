//! `plexus serve`: loads the config (exit 64 when it is invalid, before anything
//! binds), builds the hub, starts the configured upstreams through the control
//! loop, runs the fronts, and on shutdown drains and stops everything. And
//! `plexus check-config`, the same load without serving.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::Admin;
use crate::cli::{self, EXIT_BAD_CONFIG};
use crate::cluster::Cluster;
use crate::config::{self, Config, DaemonSettings};
use crate::control::{self, ControlHandle, ControlLoop};
use crate::descriptors;
use crate::http_front::HttpFront;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::systemd::{self, Notifier};
use crate::{admin, listener, memory, own_stdio, stdio_front};

/// The file in the state directory that tells tools where a running daemon listens.
pub const RUNTIME_FILE: &str = "daemon.json";

/// `stdio-<pid>.json` in the state directory: a `serve --stdio` daemon is running
/// with this config and pin file. It has no listener to ask, so `plexus pins`
/// changes the pin file, which the daemon watches.
pub const STDIO_RUNTIME_PREFIX: &str = "stdio-";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics could not be set up: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
}

/// The configuration the daemon starts with, and where it came from.
pub struct Loaded {
    pub config: Config,
    pub path: PathBuf,
    pub sha256: String,
    pub environment: fn(&str) -> Option<String>,
}

/// What serving needs besides the fronts: the hub, the control loop that owns the
/// config, and the tasks (signals, watcher) that feed it.
struct Daemon {
    hub: Arc<Hub>,
    control: ControlHandle,
    settings: watch::Receiver<DaemonSettings>,
    /// Cancelled when plexus stops: the parent of every other token.
    root: CancellationToken,
    /// Cancelled when plexus stops serving (a signal, the stdio client gone):
    /// the fronts drain while the upstreams still answer.
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Dropping it ends the watch.
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Daemon {
    async fn start(
        loaded: Loaded,
        notifier: Option<Arc<Notifier>>,
        signals: control::Signals,
        cluster: Option<Arc<Cluster>>,
    ) -> Result<Daemon, ServeError> {
        let metrics = Arc::new(Metrics::new()?);
        let root = CancellationToken::new();
        let hub = Hub::new(&loaded.config, metrics, root.child_token());
        if let Some(cluster) = &loaded.config.cluster {
            // Before any upstream starts: its first audit lines name the node too.
            hub.audit().set_node(&cluster.node);
        }
        let shutdown = root.child_token();
        let tasks = TaskTracker::new();
        let (control, inbox) = control::channel();
        let (settings, settings_receiver) = watch::channel(loaded.config.daemon.clone());
        let watcher = control::watch_config(
            &loaded.path,
            &loaded.config.daemon.pins,
            control.clone(),
            shutdown.clone(),
            &tasks,
        )
            .map_err(|error| {
                tracing::warn!(%error, "cannot watch the configuration file; reload with SIGHUP or `plexus reload`")
            })
            .ok();
        let control_loop = ControlLoop {
            path: loaded.path,
            environment: loaded.environment,
            current: loaded.config,
            sha256: loaded.sha256,
            hub: hub.clone(),
            settings,
            notifier,
            shutdown: shutdown.clone(),
            cluster,
        };
        // The configured upstreams start before any client is served.
        control_loop.start().await;
        tasks.spawn(control_loop.run(inbox));
        tasks.spawn(control::forward_signals(
            signals,
            control.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(memory::release_after_changes(
            vec![hub.listings_installed(), hub.pin_files_written()],
            shutdown.clone(),
            memory::release_free_memory,
        ));
        Ok(Daemon {
            hub,
            control,
            settings: settings_receiver,
            root,
            shutdown,
            tasks,
            _watcher: watcher,
        })
    }

    fn drain_timeout(&self) -> impl Fn() -> Duration {
        let settings = self.settings.clone();
        move || settings.borrow().drain_timeout
    }

    /// Stops every upstream and waits for every task.
    async fn stop(self) {
        tracing::info!("stopping upstreams");
        self.root.cancel();
        self.hub.shutdown().await;
        // Every line of the audit trail, and the pins, are on disk before the process ends.
        self.hub.audit().flush().await;
        self.hub.pins().flush().await;
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// `plexus check-config`: exit 0 when the file is valid, 64 with every error when not.
pub fn check_config(config: &Path) -> ExitCode {
    match config::load(config, &cli::environment) {
        Ok(loaded) => {
            let enabled = loaded.upstreams.values().filter(|u| u.enabled).count();
            println!(
                "{}: valid ({} upstreams, {} enabled)",
                config.display(),
                loaded.upstreams.len(),
                enabled
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
    }
}

/// `plexus serve`: the HTTP listeners, or with `stdio` one client on stdin/stdout.
pub fn serve(config: PathBuf, stdio: bool, view: Option<String>) -> ExitCode {
    let (loaded, sha256) = match config::read(&config, &cli::environment) {
        Ok(loaded) => loaded,
        Err(error) => {
            tracing::error!("{error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let Some(name) = view
        .as_deref()
        .filter(|name| !loaded.views.contains_key(*name))
    {
        tracing::error!(
            "{}: there is no view `{name}` ([views.{name}])",
            config.display()
        );
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    // Before the runtime's threads start allocating.
    memory::fix_thresholds_for_reading();
    let Some(runtime) = cli::runtime_with(loaded.daemon.worker_threads) else {
        return ExitCode::FAILURE;
    };
    // Read before the runtime starts; None unless systemd started us (Type=notify).
    let notifier = systemd::Notifier::from_environment(&cli::environment).map(Arc::new);
    let loaded = Loaded {
        config: loaded,
        path: config,
        sha256,
        environment: cli::environment,
    };
    let outcome = runtime.block_on(async move {
        let exporting = match crate::telemetry::start(&loaded.config.daemon.tracing) {
            Ok(exporting) => exporting,
            Err(error) => return Err(ServeError::Telemetry(error)),
        };
        let outcome = if stdio {
            serve_stdio(loaded, view).await
        } else {
            serve_http(loaded, notifier).await
        };
        if let Some(exporting) = exporting {
            exporting.finish().await;
        }
        outcome
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the daemon with the HTTP and admin listeners until a shutdown signal.
async fn serve_http(loaded: Loaded, notifier: Option<Arc<Notifier>>) -> Result<(), ServeError> {
    // Before anything is bound or started, so a stop asked for from the moment
    // daemon.json says where plexus listens is a clean one.
    let signals = control::Signals::install().map_err(ServeError::Signals)?;
    let descriptor_limits = raise_descriptor_limit();
    let daemon_settings = loaded.config.daemon.clone();
    let upstream_descriptors = descriptors::upstream_descriptors(&loaded.config);
    // Bind before starting anything, so a taken port fails fast and leaves nothing behind.
    let mcp_listener = bind(daemon_settings.listen).await?;
    let admin_listener = bind(daemon_settings.admin_listen).await?;
    let mcp_address = local_address(&mcp_listener, daemon_settings.listen);
    let admin_address = local_address(&admin_listener, daemon_settings.admin_listen);
    write_runtime_file(&daemon_settings.state_dir, mcp_address, admin_address).await?;
    let upstreams = loaded.config.upstreams.len();
    let cluster = loaded
        .config
        .cluster
        .as_ref()
        .map(|config| Arc::new(Cluster::new(config)));

    let daemon = Daemon::start(loaded, notifier.clone(), signals, cluster.clone()).await?;
    let hub = daemon.hub.clone();
    let shutdown = daemon.shutdown.clone();
    // In a cluster a shutdown signal first drains (`leave_cluster`): the listeners
    // and sessions serve on until `serving` ends. Alone, they stop at once.
    let serving = match cluster {
        Some(_) => CancellationToken::new(),
        None => shutdown.clone(),
    };
    let front = HttpFront::new(
        hub.clone(),
        daemon.settings.clone(),
        serving.clone(),
        cluster.clone(),
    );
    tracing::info!(%mcp_address, %admin_address, upstreams, "plexus serving on http://{mcp_address}/mcp");
    if let Some(notifier) = &notifier {
        // The listeners are bound and daemon.json is written: clients can connect.
        notifier.ready();
        daemon
            .tasks
            .spawn(systemd::watchdog_loop(notifier.clone(), shutdown.clone()));
        let notifier = notifier.clone();
        hub.on_status(Box::new(move |configured, ready| {
            notifier.status(&systemd::upstream_status(configured, ready));
        }));
    }

    // Each listener has its own cap, so a flood of one leaves the other reachable;
    // together they fit the descriptor budget.
    let (mcp_cap, admin_cap) = descriptors::listener_caps(
        descriptor_limits,
        daemon_settings.max_connections,
        upstream_descriptors,
    );
    for (listener, cap) in [("mcp", mcp_cap), ("admin", admin_cap)] {
        hub.metrics()
            .listener_max_connections
            .with_label_values(&[listener])
            .set(i64::try_from(cap).unwrap_or(i64::MAX));
    }
    let open = |listener: &str| {
        hub.metrics()
            .listener_connections
            .with_label_values(&[listener])
    };
    let limits = listener::ConnectionLimits {
        max_connections: mcp_cap,
        header_read_timeout: daemon_settings.header_read_timeout,
        open: open("mcp"),
    };
    let admin_limits = listener::ConnectionLimits {
        max_connections: admin_cap,
        open: open("admin"),
        ..limits.clone()
    };
    let mcp_front = {
        let front = front.clone();
        let expired = front.clone();
        daemon.tasks.spawn(listener::serve(
            mcp_listener,
            move |request| front.clone().handle(request),
            limits,
            serving.clone(),
            daemon.drain_timeout(),
            // Calls still running at the deadline get their -33007 answer.
            move || expired.close_all(),
        ))
    };
    let admin_front = {
        // The uptime's start: real elapsed time.
        #[allow(clippy::disallowed_types)]
        let admin = Arc::new(Admin {
            hub: hub.clone(),
            control: daemon.control.clone(),
            settings: daemon.settings.clone(),
            address: admin_address,
            front: front.clone(),
            started: std::time::Instant::now(),
            shutdown: shutdown.clone(),
        });
        daemon.tasks.spawn(listener::serve(
            admin_listener,
            move |request| admin::handle(admin.clone(), request),
            admin_limits,
            serving.clone(),
            || Duration::from_secs(1),
            || {},
        ))
    };
    shutdown.cancelled().await;
    if let Some(notifier) = &notifier {
        notifier.stopping();
    }
    hub.end_streams();
    if let Some(cluster) = &cluster {
        leave_cluster(cluster, &front, daemon.drain_timeout()()).await;
        serving.cancel();
    }
    tracing::info!("shutting down: draining HTTP exchanges");
    let _ = mcp_front.await;
    front.close_all();
    let _ = admin_front.await;
    let state_dir = daemon_settings.state_dir;
    daemon.stop().await;
    let _ = tokio::fs::remove_file(state_dir.join(RUNTIME_FILE)).await;
    tracing::info!("plexus stopped");
    Ok(())
}

/// A node of a cluster stopping: `/readyz` turns 503 and new sessions are refused
/// (the balancer sends them elsewhere) while the sessions held here are served,
/// until they end or `drain_timeout` passes; then the fronts drain as alone.
async fn leave_cluster(cluster: &Cluster, front: &HttpFront, drain_timeout: Duration) {
    cluster.start_draining();
    let open = front.session_count();
    tracing::info!(
        sessions = open,
        drain_timeout_ms = drain_timeout.as_millis() as u64,
        "draining: /readyz answers 503 and new sessions go to other nodes"
    );
    let deadline = tokio::time::Instant::now() + drain_timeout;
    while front.session_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!(
        sessions = front.session_count(),
        "drained: the sessions still open end now"
    );
}

/// Runs the daemon for one client on stdin/stdout, until its input ends or a
/// shutdown signal.
async fn serve_stdio(loaded: Loaded, view: Option<String>) -> Result<(), ServeError> {
    let signals = control::Signals::install().map_err(ServeError::Signals)?;
    raise_descriptor_limit();
    let upstreams = loaded.config.upstreams.len();
    let registration = register_stdio(&loaded).await;
    // `[cluster]` is for nodes behind a balancer: a stdio front is one client's own.
    let daemon = match Daemon::start(loaded, None, signals, None).await {
        Ok(daemon) => daemon,
        Err(error) => {
            if let Some(path) = registration {
                let _ = tokio::fs::remove_file(path).await;
            }
            return Err(error);
        }
    };
    daemon.hub.serve_one_client();
    tracing::info!(upstreams, "plexus serving one client on stdio");
    let own_stdio::OwnStdio {
        input,
        output,
        restore: _flags,
    } = own_stdio::open();
    stdio_front::serve(
        daemon.hub.clone(),
        input,
        output,
        view.map(|name| Arc::from(name.as_str())),
        daemon.shutdown.clone(),
        daemon.drain_timeout(),
    )
    .await;
    tracing::info!("stdio client gone; stopping upstreams");
    daemon.stop().await;
    if let Some(path) = registration {
        let _ = tokio::fs::remove_file(path).await;
    }
    Ok(())
}

/// Writes `stdio-<pid>.json` (`{pid, config, pins}`, absolute paths) in the state
/// directory, so `plexus pins` knows a daemon holds that pin file; its path, to be
/// removed as plexus stops. Serving goes on without it (a warning) if it cannot be written.
async fn register_stdio(loaded: &Loaded) -> Option<PathBuf> {
    let daemon = &loaded.config.daemon;
    let pid = std::process::id();
    let path = daemon
        .state_dir
        .join(format!("{STDIO_RUNTIME_PREFIX}{pid}.json"));
    let absolute = |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let body = serde_json::json!({
        "pid": pid,
        "config": absolute(&loaded.path),
        "pins": absolute(&daemon.pins),
    });
    match write_state_file(path.clone(), &body).await {
        Ok(()) => Some(path),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot write the stdio runtime file; `plexus pins` will not know this daemon runs");
            None
        }
    }
}

/// The soft descriptor limit raised to the hard one, as far as allowed.
fn raise_descriptor_limit() -> Option<descriptors::Limits> {
    match descriptors::raise_soft_limit() {
        Ok(limits) => {
            if let Some(from) = limits.raised_from {
                tracing::info!(
                    from,
                    to = limits.soft,
                    "raised the soft descriptor limit to the hard one"
                );
            }
            Some(limits)
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read or raise the descriptor limit");
            None
        }
    }
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| ServeError::Bind { address, source })?;
    listener::accept_when_data_arrives(&listener);
    Ok(listener)
}

fn local_address(listener: &TcpListener, configured: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(configured)
}

/// Writes `{pid, listen, admin_listen}` atomically, so `plexus connect`, `plexus
/// reload` and tests find a daemon bound to port 0.
async fn write_runtime_file(
    state_dir: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
) -> Result<(), ServeError> {
    let path = state_dir.join(RUNTIME_FILE);
    let body = serde_json::json!({
        "pid": std::process::id(),
        "listen": listen.to_string(),
        "admin_listen": admin.to_string(),
        "url": format!("http://{listen}/mcp"),
    });
    write_state_file(path.clone(), &body)
        .await
        .map_err(|source| ServeError::StateDir { path, source })
}

/// Writes `body` to `path` in the state directory (made if missing), whole or not
/// at all, off the runtime's workers.
async fn write_state_file(path: PathBuf, body: &serde_json::Value) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        crate::catalog_host::write_atomically(&path, &bytes, 0o644)
    })
    .await
    .unwrap_or_else(|error| Err(std::io::Error::other(error.to_string())))
}
