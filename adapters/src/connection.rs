//! The handle plexus holds to one upstream, whatever carries its messages: a
//! stdio child or an HTTP client. Ids, the pending table, the per-request `_meta`
//! and the cancel sent when a caller stops waiting are the same for both; only
//! how a message leaves differs.

use std::sync::{Arc, PoisonError, RwLock};

use crate::raw_object::WrittenMember;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::launch::LaunchSpec;
use crate::remote::{HttpEndpoint, HttpError, HttpOptions, HttpTransport};
use crate::request_line::{Merge, MetaFields, Params, TraceContext};
pub use crate::rpc::ConnectionStats;
use crate::rpc::Events;
use crate::rpc::{
    encode_notification, encode_response, ConnectionError, Reply, SharedPending, Spawned,
};
use tokio_util::task::TaskTracker;

use crate::stdio::{ExitReport, SpawnError, StdioOptions, StdioTransport};

/// How long a stopped connection's tasks may take to end.
const TASKS_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);
/// A handle to a running upstream. Cheap to clone; the upstream is stopped by
/// [`UpstreamConnection::shutdown`], or (a child) killed when the last handle is dropped.
#[derive(Clone)]
pub struct UpstreamConnection {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) upstream: Arc<str>,
    pub(crate) pending: SharedPending,
    /// Set when no reply can come any more.
    pub(crate) closed: CancellationToken,
    /// Set to stop the upstream.
    pub(crate) stop: CancellationToken,
    pub(crate) stats: Arc<ConnectionStats>,
    /// The connection's own tasks (pipes, child, HTTP exchanges and streams).
    pub(crate) tasks: TaskTracker,
    /// For an upstream of 2026-07-28: the `_meta` fields every request carries.
    pub(crate) request_meta: RwLock<Option<Arc<MetaFields>>>,
    pub(crate) transport: Transport,
}

/// What carries an upstream's messages.
pub(crate) enum Transport {
    Stdio(StdioTransport),
    Http(HttpTransport),
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Last handle gone: every task of the connection ends (a child is killed
        // by its transport's own drop).
        self.stop.cancel();
    }
}

/// A request with plexus's id already assigned, not yet sent: the caller can
/// record the id (to attribute what the upstream sends while serving it) before
/// anything can arrive. Dropping it unsent forgets the id.
pub struct OutgoingRequest<'a> {
    connection: &'a UpstreamConnection,
    id: u64,
    message: Option<(String, Params, Option<Arc<MetaFields>>)>,
    reply: Option<oneshot::Receiver<Result<Reply, ConnectionError>>>,
    headers: Vec<(String, String)>,
    trace: Option<TraceContext>,
}

impl OutgoingRequest<'_> {
    /// HTTP headers for a 2026-07-28 HTTP upstream (`Mcp-Param-*`, already encoded);
    /// other transports ignore them.
    pub fn with_headers(mut self, headers: Vec<(String, String)>) -> Self {
        self.headers = headers;
        self
    }

    /// The trace context the request carries upstream, over any of its own.
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The reply's result may come unread ([`Reply::Unread`]), for a caller that
    /// relays it as the upstream wrote it: a reply that is a message of its own (a
    /// line, an event, a body) is only skimmed; one among others comes read.
    pub fn result_unread(self) -> Self {
        self.connection.inner.pending.leave_unread(self.id);
        self
    }

    /// plexus's id of this request, as the upstream sees it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends the request and waits for the upstream's reply. Dropping the future
    /// before the reply arrives cancels the request upstream.
    pub async fn send(mut self) -> Result<Reply, ConnectionError> {
        let inner = &*self.connection.inner;
        let id = self.id;
        let (Some((method, params, meta)), Some(reply)) = (self.message.take(), self.reply.take())
        else {
            return Err(ConnectionError::NotSent);
        };
        let mut guard = CancelOnDrop {
            inner,
            id,
            armed: true,
        };
        let headers = std::mem::take(&mut self.headers);
        let merge = Merge {
            fields: meta.as_deref(),
            trace: self.trace.as_ref(),
        };
        let sent = inner.send_request(id, &method, params, merge, headers);
        if inner.closed.is_cancelled() || sent.is_err() {
            guard.armed = false;
            inner.pending.forget(id);
            return Err(ConnectionError::NotSent);
        }
        let outcome = tokio::select! {
            biased;
            outcome = reply => outcome.unwrap_or(Err(ConnectionError::Closed)),
            _ = inner.closed.cancelled() => {
                inner.pending.forget(id);
                Err(ConnectionError::Closed)
            }
        };
        guard.armed = false;
        inner.request_finished(id);
        outcome
    }
}

impl Drop for OutgoingRequest<'_> {
    fn drop(&mut self) {
        if self.reply.is_some() {
            self.connection.inner.pending.forget(self.id);
        }
    }
}

impl Inner {
    fn send_request(
        &self,
        id: u64,
        method: &str,
        params: Params,
        merge: Merge,
        headers: Vec<(String, String)>,
    ) -> Result<(), ConnectionError> {
        match &self.transport {
            Transport::Stdio(stdio) => stdio.send_request(id, method, params, merge),
            Transport::Http(http) => http.send_request(id, method, params, merge, headers),
        }
    }

    fn request_finished(&self, id: u64) {
        if let Transport::Http(http) = &self.transport {
            http.request_finished(id);
        }
    }

    fn per_request(&self) -> bool {
        self.request_meta
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

impl UpstreamConnection {
    /// Starts the child described by `spec`. Messages the upstream sends on its
    /// own (notifications, server-to-client requests) go to `events`.
    pub fn spawn_stdio(
        upstream: Arc<str>,
        spec: &LaunchSpec,
        options: &StdioOptions,
        events: impl Into<Events>,
    ) -> Result<UpstreamConnection, SpawnError> {
        let events = events.into();
        // A program served in this process (tests only) is connected to, not spawned.
        #[cfg(feature = "test-support")]
        let events = match crate::in_process::connect(&upstream, &spec.program, options, events) {
            Ok(spawned) => return Ok(UpstreamConnection::from_spawned(spawned?, Transport::Stdio)),
            Err(events) => events,
        };
        let spawned = crate::stdio::spawn(upstream, spec, options, events)?;
        Ok(UpstreamConnection::from_spawned(spawned, Transport::Stdio))
    }

    /// Opens a connection to a remote upstream. For HTTP+SSE this waits for the
    /// event stream's `endpoint`; streamable HTTP connects with the first request.
    /// Messages the upstream sends on its own go to `events`.
    pub async fn connect_http(
        upstream: Arc<str>,
        endpoint: &HttpEndpoint,
        options: &HttpOptions,
        events: impl Into<Events>,
    ) -> Result<UpstreamConnection, HttpError> {
        let spawned = crate::remote::connect(upstream, endpoint, options, events.into()).await?;
        Ok(UpstreamConnection::from_spawned(spawned, Transport::Http))
    }

    /// Sends an OAuth access token with every later request of an HTTP upstream
    /// (None: stops sending one). False for a stdio upstream, or a token that
    /// cannot be a header value.
    pub fn set_bearer_token(&self, token: Option<&str>) -> bool {
        match &self.inner.transport {
            Transport::Http(http) => http.set_bearer(token),
            Transport::Stdio(_) => false,
        }
    }

    fn from_spawned<T>(
        spawned: Spawned<T>,
        transport: impl FnOnce(T) -> Transport,
    ) -> UpstreamConnection {
        let Spawned {
            upstream,
            pending,
            closed,
            stop,
            stats,
            tasks,
            transport: carrier,
        } = spawned;
        UpstreamConnection {
            inner: Arc::new(Inner {
                upstream,
                pending,
                closed,
                stop,
                stats,
                tasks,
                request_meta: RwLock::new(None),
                transport: transport(carrier),
            }),
        }
    }

    /// Gives a request plexus's id without sending it yet; see [`OutgoingRequest`].
    pub fn prepare(&self, method: &str, params: Option<Value>) -> OutgoingRequest<'_> {
        self.prepare_params(method, Params::Values(params))
    }

    /// [`UpstreamConnection::prepare`] with one member of the params passed on as its
    /// sender wrote it, unread; one of the same key in `params` gives way to it.
    /// Params that are not an object (a skim finds a member only in one) give way
    /// to an object of that member alone.
    pub fn prepare_with_member(
        &self,
        method: &str,
        params: Option<Value>,
        member: WrittenMember,
    ) -> OutgoingRequest<'_> {
        let mut params = match params {
            Some(Value::Object(params)) => params,
            _ => Map::new(),
        };
        params.shift_remove(member.key());
        self.prepare_params(method, Params::WithMember(params, member))
    }

    /// The request gets the connection's per-request `_meta` fields (if any) when
    /// it is written, merged into its own `_meta`.
    fn prepare_params(&self, method: &str, params: Params) -> OutgoingRequest<'_> {
        let meta = self
            .inner
            .request_meta
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (id, reply) = self.inner.pending.register();
        OutgoingRequest {
            connection: self,
            id,
            message: Some((method.to_string(), params, meta)),
            reply: Some(reply),
            headers: Vec::new(),
            trace: None,
        }
    }

    /// Sends a request and waits for the upstream's reply. Dropping the future
    /// before the reply arrives sends `notifications/cancelled` upstream.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Reply, ConnectionError> {
        self.prepare(method, params).send().await
    }

    /// From now on every request carries these `_meta` fields (a 2026-07-28
    /// upstream negotiates per request, not once).
    pub fn set_request_meta(&self, meta: Map<String, Value>) {
        *self
            .inner
            .request_meta
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(MetaFields::new(meta)));
    }

    /// Sets or removes one of the per-request `_meta` fields, if there are any.
    pub fn set_request_meta_field(&self, key: &str, value: Option<Value>) {
        let mut meta = self
            .inner
            .request_meta
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(fields) = meta.as_ref() {
            let mut fields = fields.fields().clone();
            match value {
                Some(value) => fields.insert(key.to_string(), value),
                None => fields.shift_remove(key),
            };
            *meta = Some(Arc::new(MetaFields::new(fields)));
        }
    }

    /// Whether requests carry per-request `_meta` fields (the upstream is 2026-07-28).
    pub fn is_per_request(&self) -> bool {
        self.inner.per_request()
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), ConnectionError> {
        self.send_message(encode_notification(method, params)).await
    }

    /// Answers a server-to-client request, under the id the upstream gave it.
    pub async fn respond(&self, id: Value, reply: Reply) -> Result<(), ConnectionError> {
        self.send_message(encode_response(id, reply)).await
    }

    async fn send_message(&self, message: Vec<u8>) -> Result<(), ConnectionError> {
        if self.inner.closed.is_cancelled() {
            return Err(ConnectionError::NotSent);
        }
        match &self.inner.transport {
            Transport::Stdio(stdio) => stdio.send_line(message),
            Transport::Http(http) => http.send_message(message).await,
        }
    }

    pub fn upstream(&self) -> &Arc<str> {
        &self.inner.upstream
    }

    /// The child's process id; `None` for an HTTP upstream.
    pub fn pid(&self) -> Option<u32> {
        match &self.inner.transport {
            Transport::Stdio(stdio) => stdio.pid(),
            Transport::Http(_) => None,
        }
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.inner.pending.in_flight()
    }

    pub fn stats(&self) -> &ConnectionStats {
        &self.inner.stats
    }

    /// Whether both handles are to one connection.
    pub fn is_same(&self, other: &UpstreamConnection) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// True once no reply can arrive any more (stdout closed, the child stopped,
    /// or the HTTP upstream unreachable or its session gone).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await;
    }

    /// The last lines the child wrote to stderr, oldest first (none over HTTP).
    pub fn stderr_tail(&self) -> Vec<String> {
        match &self.inner.transport {
            Transport::Stdio(stdio) => stdio.stderr_tail(),
            Transport::Http(_) => Vec::new(),
        }
    }

    /// Waits until the child and every process of its group are gone (over
    /// HTTP: until the connection is closed).
    pub async fn wait_exit(&self) -> ExitReport {
        match &self.inner.transport {
            Transport::Stdio(stdio) => stdio.wait_exit().await,
            Transport::Http(_) => {
                self.closed().await;
                ExitReport {
                    code: None,
                    signal: None,
                }
            }
        }
    }

    /// Stops the upstream. A child: close stdin, then SIGTERM to its group, then
    /// after the grace period SIGKILL; waits until every process of the group is
    /// reaped. HTTP: the session is deleted and the connection closed.
    pub async fn shutdown(&self) -> ExitReport {
        let report = match &self.inner.transport {
            Transport::Stdio(_) => {
                self.inner.stop.cancel();
                self.wait_exit().await
            }
            Transport::Http(http) => {
                http.shutdown().await;
                self.inner.stop.cancel();
                ExitReport {
                    code: None,
                    signal: None,
                }
            }
        };
        // Every task ends on `stop`; the bound keeps one stuck in a write from
        // holding the daemon's shutdown.
        self.inner.tasks.close();
        if tokio::time::timeout(TASKS_SETTLE, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(upstream = %self.inner.upstream, tasks = self.inner.tasks.len(), "the connection's tasks did not end after it stopped");
        }
        report
    }
}

/// Cancels a request upstream when its caller stops waiting.
struct CancelOnDrop<'a> {
    inner: &'a Inner,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if !self.inner.pending.forget(self.id) {
            // Answered, but the caller left before reading it.
            self.inner.request_finished(self.id);
            return;
        }
        let cancel = || {
            encode_notification(
                "notifications/cancelled",
                Some(json!({"requestId": self.id, "reason": "the caller stopped waiting"})),
            )
        };
        match &self.inner.transport {
            // Best effort: a closed stdin means the upstream is gone anyway.
            Transport::Stdio(stdio) => {
                let _ = stdio.send_line(cancel());
            }
            // Over 2026-07-28 HTTP, closing the request's stream is the cancel.
            Transport::Http(http) => {
                let notification = (!self.inner.per_request()).then(cancel);
                http.cancel(self.id, notification);
            }
        }
    }
}
