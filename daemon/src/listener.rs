//! Accepting HTTP/1.1 connections on a bound listener until shutdown, shared by
//! the MCP front and the admin listener.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::repoll::Repoll;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What one listener allows its clients.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once; more wait in the kernel's backlog until one ends,
    /// or take the place of one that has sent no request yet.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (also between
    /// requests on a kept-alive connection); then the connection is closed.
    pub header_read_timeout: Duration,
    /// The connections it holds open now (`plexus_listener_connections`).
    pub open: prometheus::IntGauge,
}

/// A connection's place under the cap, counted in the open-connections gauge
/// while it lasts.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, open: &prometheus::IntGauge) -> Slot {
        open.inc();
        Slot {
            _permit: permit,
            open: open.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Why a request's body could not be had.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the body is longer than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the body did not arrive within {}ms", .0.as_millis())]
    TimedOut(Duration),
    /// The connection broke, or the body's framing was wrong.
    #[error("the body cannot be read")]
    Unreadable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl BodyError {
    pub fn status(&self) -> http::StatusCode {
        match self {
            BodyError::TooLarge { .. } => http::StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TimedOut(_) => http::StatusCode::REQUEST_TIMEOUT,
            BodyError::Unreadable(_) => http::StatusCode::BAD_REQUEST,
        }
    }

    /// `answer`, made to close its connection where the body was not all read:
    /// what is left of it would be read as the next request.
    pub fn closing<B>(&self, mut answer: Response<B>) -> Response<B> {
        if matches!(self, BodyError::TimedOut(_)) {
            answer.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        answer
    }
}

/// Reads a request's body: at most `limit` bytes, all of them within `timeout`.
/// hyper times a request's headers, not its body: a client that stalls halfway
/// through one would otherwise hold its connection, and a slot, for good.
pub async fn read_body(
    body: Incoming,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(BodyError::TimedOut(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
            Err(BodyError::TooLarge { limit })
        }
        Ok(Err(error)) => Err(BodyError::Unreadable(error)),
    }
}

/// Serves `handler` on every accepted connection until `shutdown`, then waits up
/// to `drain()` (read then: a reload may have changed it) for open connections to
/// finish their current exchange.
pub async fn serve<H, F>(
    listener: TcpListener,
    handler: H,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    drain: impl Fn() -> Duration,
    drain_expired: impl FnOnce(),
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    // Every connection's task, waited for before `serve` returns; `abandoned` ends
    // those still open when the drain and the answers' grace are over.
    let connections = TaskTracker::new();
    let abandoned = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let unserved = Arc::new(Unserved::default());
    let nodelay_inherited = nodelay_for_accepted(&listener);
    loop {
        // A slot first: at the cap, new connections are not accepted (and so not
        // given a descriptor) until one ends, or one that has sent no request yet
        // makes room.
        let (slot, accepted) = match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let accepted = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                (slot, accepted)
            }
            Err(TryAcquireError::Closed) => break,
            Err(TryAcquireError::NoPermits) => {
                let accepted = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    // A slot came free: taken on the next turn.
                    _ = slots.clone().acquire_owned() => continue,
                    accepted = listener.accept(), if unserved.any() => accepted,
                };
                // Slow clients holding every slot without a request would keep a
                // new one out for a `header_read_timeout`: the one that has waited
                // longest is closed, and its slot goes to the new client (which
                // holds one descriptor over the cap until then: the budget's margin).
                unserved.close_oldest();
                let slot = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    slot = slots.clone().acquire_owned() => slot,
                };
                let Ok(slot) = slot else { break };
                (slot, accepted)
            }
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off briefly instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        serve_connection(
            stream,
            peer,
            Slot::new(slot, &limits.open),
            Unserved::enter(&unserved),
            handler.clone(),
            Ending {
                graceful: &graceful,
                abandoned: &abandoned,
                connections: &connections,
            },
            limits.header_read_timeout,
            nodelay_inherited,
        );
    }
    drop(listener);
    let drain = drain();
    let finished = graceful.shutdown();
    tokio::pin!(finished);
    if tokio::time::timeout(drain, &mut finished).await.is_err() {
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "HTTP exchanges still open after the drain deadline; ending them"
        );
        // What still runs is answered (shutting down), then its connection may close.
        drain_expired();
        if tokio::time::timeout(ANSWER_GRACE, &mut finished)
            .await
            .is_err()
        {
            tracing::warn!("HTTP connections still open after their last answers");
        }
    }
    connections.close();
    abandoned.cancel();
    connections.wait().await;
}

/// What ends an accepted connection besides its client, and tracks its task.
struct Ending<'a> {
    graceful: &'a GracefulShutdown,
    abandoned: &'a CancellationToken,
    connections: &'a TaskTracker,
}

/// Serves one accepted connection on a task of its own, which ends when the
/// connection does, or when it is closed to make room while it has sent no request.
#[allow(clippy::too_many_arguments)]
fn serve_connection<H, F>(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    slot: Slot,
    waiting: Arc<Waiting>,
    handler: H,
    ending: Ending<'_>,
    header_read_timeout: Duration,
    nodelay_inherited: bool,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    // Without it a keep-alive exchange on loopback waits ~40 ms for delayed ACKs.
    if !nodelay_inherited {
        let _ = stream.set_nodelay(true);
    }
    let watcher = ending.graceful.watcher();
    let closed = waiting.closed.clone();
    let abandoned = ending.abandoned.clone();
    // The connection (some 1.7 KB of state) is built in its task's own memory,
    // reached through one pointer: moved by value through the spawn, it was
    // copied a dozen times per accepted connection.
    ending.connections.spawn(Box::pin(async move {
        let service = hyper::service::service_fn(move |request| {
            waiting.served();
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handler(request).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .serve_connection(TokioIo::new(stream), service);
        // Polled again in place when hyper wakes its own task (see `repoll`).
        let connection = Repoll::new(watcher.watch(connection));
        tokio::select! {
            ended = connection => {
                if let Err(error) = ended {
                    tracing::debug!(%peer, %error, "HTTP connection ended with an error");
                }
            }
            () = closed.cancelled() => {
                tracing::debug!(%peer, "closed a connection that had sent no request, to make room at the cap");
            }
            () = abandoned.cancelled() => {
                tracing::debug!(%peer, "closed a connection still open after the drain");
            }
        }
        drop(slot);
    }));
}

/// The connections that have not sent a whole request head yet, oldest first.
#[derive(Default)]
struct Unserved {
    next: AtomicU64,
    waiting: Mutex<BTreeMap<u64, CancellationToken>>,
    /// Whether making room was logged (once per listener).
    noted: AtomicBool,
}

impl Unserved {
    fn enter(this: &Arc<Unserved>) -> Arc<Waiting> {
        let id = this.next.fetch_add(1, Ordering::Relaxed);
        let closed = CancellationToken::new();
        this.lock().insert(id, closed.clone());
        Arc::new(Waiting {
            id,
            closed,
            unserved: this.clone(),
            served: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Closes the connection that has waited longest without a request.
    fn close_oldest(&self) {
        let oldest = self.lock().pop_first();
        if let Some((_, closed)) = oldest {
            closed.cancel();
            if !self.noted.swap(true, Ordering::Relaxed) {
                tracing::warn!("at the connection cap: connections that have sent no request are closed to make room for new ones (slow or idle clients)");
            }
        }
    }
}

/// One connection's place among the unserved, left at its first request or end.
struct Waiting {
    id: u64,
    closed: CancellationToken,
    unserved: Arc<Unserved>,
    served: AtomicBool,
}

impl Waiting {
    /// A request head has arrived: the connection is no longer one to close.
    fn served(&self) {
        // Read first: every later request finds it set without a write.
        if !self.served.load(Ordering::Relaxed) && !self.served.swap(true, Ordering::Relaxed) {
            self.unserved.lock().remove(&self.id);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.served();
    }
}

/// Lets the kernel hand a connection over only once its first bytes have arrived:
/// an HTTP client speaks first, and a client that opens a connection per request
/// (rmcp's does) otherwise wakes the daemon twice per request, once to accept and
/// once to read. Connections that never send anything stay in the kernel and take
/// no slot. Where the option is missing, accepting works as before.
pub fn accept_when_data_arrives(listener: &TcpListener) {
    #[cfg(target_os = "linux")]
    if !set_tcp_option(listener, libc::TCP_DEFER_ACCEPT, DEFER_ACCEPT_SECONDS) {
        tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_DEFER_ACCEPT not set");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = listener;
}

/// Sets `TCP_NODELAY` on the listener, where accepted connections inherit it
/// (Linux): one system call per connection fewer. Whether they do.
fn nodelay_for_accepted(listener: &TcpListener) -> bool {
    #[cfg(target_os = "linux")]
    return set_tcp_option(listener, libc::TCP_NODELAY, 1);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = listener;
        false
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_tcp_option(listener: &TcpListener, name: libc::c_int, value: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    let length = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: the descriptor is the listener's own, open for the call; the value
    // points to a live c_int whose size is passed with it.
    let set = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            name,
            std::ptr::from_ref(&value).cast::<libc::c_void>(),
            length,
        )
    };
    set == 0
}

/// Longer than any client takes to send its request line after connecting.
#[cfg(target_os = "linux")]
const DEFER_ACCEPT_SECONDS: libc::c_int = 10;

/// How long exchanges ended at the drain deadline have to write their answer.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// `localhost`, `127.0.0.1` or `[::1]`, with an optional port: the Host and Origin
/// a browser page cannot forge for a loopback listener (DNS rebinding).
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('/');
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepted connections skip their own `TCP_NODELAY` on the strength of this.
    #[tokio::test]
    async fn accepted_connections_inherit_nodelay_where_the_listener_says_so() -> std::io::Result<()>
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let inherited = nodelay_for_accepted(&listener);
        assert_eq!(inherited, cfg!(target_os = "linux"));
        let _client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
        let (accepted, _) = listener.accept().await?;
        assert_eq!(accepted.nodelay()?, inherited);
        Ok(())
    }
}
