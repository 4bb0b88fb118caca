//! `plexus serve`: builds the hub from a validated config, runs the fronts, and
//! drains and stops everything on a shutdown signal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigDiff};
use crate::http_front::HttpFront;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::systemd::{self, Notifier};
use crate::{admin, listener, stdio_front};

/// The file in the state directory that tells tools where a running daemon listens.
pub const RUNTIME_FILE: &str = "daemon.json";

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
}

/// Runs the daemon with the HTTP and admin listeners until `shutdown`.
pub async fn serve_http(
    config: Config,
    shutdown: CancellationToken,
    notifier: Option<Arc<Notifier>>,
) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::new()?);
    // Bind before starting anything, so a taken port fails fast and leaves nothing behind.
    let mcp_listener = bind(config.daemon.listen).await?;
    let admin_listener = bind(config.daemon.admin_listen).await?;
    let mcp_address = local_address(&mcp_listener, config.daemon.listen);
    let admin_address = local_address(&admin_listener, config.daemon.admin_listen);
    write_runtime_file(&config.daemon.state_dir, mcp_address, admin_address)?;

    let hub = Hub::new(&config, metrics);
    hub.apply(
        ConfigDiff::between(&BTreeMap::new(), &config.upstreams),
        config.daemon.drain_timeout,
    )
    .await;
    let front = HttpFront::new(
        hub.clone(),
        mcp_address,
        config.daemon.session_idle_timeout,
        shutdown.clone(),
    );
    tracing::info!(%mcp_address, %admin_address, upstreams = config.upstreams.len(), "plexus serving on http://{mcp_address}/mcp");
    if let Some(notifier) = &notifier {
        // The listeners are bound and daemon.json is written: clients can connect.
        notifier.ready();
        tokio::spawn(systemd::watchdog_loop(notifier.clone(), shutdown.clone()));
        let notifier = notifier.clone();
        hub.on_status(Box::new(move |configured, ready| {
            notifier.status(&systemd::upstream_status(configured, ready));
        }));
    }

    let mcp_front = {
        let front = front.clone();
        tokio::spawn(listener::serve(
            mcp_listener,
            move |request| front.clone().handle(request),
            shutdown.clone(),
            config.daemon.drain_timeout,
        ))
    };
    let admin_front = {
        let hub = hub.clone();
        tokio::spawn(listener::serve(
            admin_listener,
            move |request| admin::handle(hub.clone(), request),
            shutdown.clone(),
            Duration::from_secs(1),
        ))
    };
    shutdown.cancelled().await;
    if let Some(notifier) = &notifier {
        notifier.stopping();
    }
    tracing::info!("shutting down: draining HTTP exchanges");
    let _ = mcp_front.await;
    front.close_all();
    let _ = admin_front.await;
    tracing::info!("stopping upstreams");
    hub.shutdown().await;
    let _ = std::fs::remove_file(config.daemon.state_dir.join(RUNTIME_FILE));
    tracing::info!("plexus stopped");
    Ok(())
}

/// Runs the daemon for one client on stdin/stdout, until its input ends or `shutdown`.
pub async fn serve_stdio(config: Config, shutdown: CancellationToken) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::new()?);
    let hub = Hub::new(&config, metrics);
    hub.apply(
        ConfigDiff::between(&BTreeMap::new(), &config.upstreams),
        config.daemon.drain_timeout,
    )
    .await;
    tracing::info!(
        upstreams = config.upstreams.len(),
        "plexus serving one client on stdio"
    );
    stdio_front::serve(
        hub.clone(),
        tokio::io::stdin(),
        tokio::io::stdout(),
        shutdown,
        config.daemon.drain_timeout,
    )
    .await;
    tracing::info!("stdio client gone; stopping upstreams");
    hub.shutdown().await;
    Ok(())
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServeError::Bind { address, source })
}

fn local_address(listener: &TcpListener, configured: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(configured)
}

/// Writes `{pid, listen, admin_listen}` atomically, so `plexus connect` and tests
/// find a daemon bound to port 0.
fn write_runtime_file(
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
    crate::catalog_host::write_atomically(&path, &body)
        .map_err(|source| ServeError::StateDir { path, source })
}
