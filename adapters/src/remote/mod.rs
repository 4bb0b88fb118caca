//! Remote upstreams over HTTP, behind the same `UpstreamConnection` as stdio children.
//!
//! Streamable HTTP: every message is a POST to the MCP endpoint; a request is
//! answered with one JSON body or with an event stream carrying the messages
//! related to it and then its reply. The session id and protocol version from
//! `initialize` go on every later request, a GET stream carries what the server
//! sends on its own, and the session is deleted on shutdown.
//!
//! HTTP+SSE (2024-11-05): one GET event stream whose `endpoint` event names where
//! messages are POSTed; every answer arrives on that stream.
//!
//! `auto` tries streamable HTTP and falls back to HTTP+SSE when the first POST is
//! refused (400, 404, 405) without a JSON-RPC error and a GET of the URL opens an
//! event stream that names an endpoint.

mod client;
mod endpoint;
mod head;
mod inbound;
mod legacy;
mod sse;
mod streamable;
mod tls;
/// The TLS-capable connector remote upstreams use, for other HTTP clients of the
/// daemon (the front's key set fetches).
#[cfg(feature = "tls")]
pub use tls::{connector as https_connector, Connector as HttpsConnector};

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{Response, StatusCode, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::request_line::{encode_request, Merge, Params};
use crate::rpc::{
    ConnectionError, ConnectionStats, Events, PendingRequests, Reply, SharedPending, Spawned,
};
pub(crate) use client::HttpClient;
use client::{ExchangeError, PostFailure};
use endpoint::display_url;
pub use endpoint::{check_header, check_url, split_credentials, Credentials};
use head::Head;

/// Which HTTP transport an upstream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpTransportKind {
    /// Streamable HTTP (2025-03-26 and later).
    StreamableHttp,
    /// The HTTP+SSE transport of 2024-11-05.
    Sse,
    /// Streamable HTTP, falling back to HTTP+SSE as the MCP specification describes.
    Auto,
}

impl HttpTransportKind {
    pub fn label(self) -> &'static str {
        match self {
            HttpTransportKind::StreamableHttp => "streamable-http",
            HttpTransportKind::Sse => "sse",
            HttpTransportKind::Auto => "auto",
        }
    }
}

/// Where a remote upstream is and what every request to it carries.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub url: String,
    /// Sent with every request. Values may be secrets: never logged.
    pub headers: Vec<(String, String)>,
    pub transport: HttpTransportKind,
}

impl fmt::Debug for HttpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpEndpoint")
            .field("url", &self.url)
            .field("headers", &names)
            .field("transport", &self.transport)
            .finish()
    }
}

/// Limits and timings of one HTTP connection.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Longest accepted message (a JSON body, or one event's data).
    pub max_message_bytes: usize,
    /// How long connecting may take, and for HTTP+SSE the wait for the `endpoint` event.
    pub connect_timeout: Duration,
    /// Counters, shared so they can outlive one connection (an upstream's restarts).
    pub stats: Arc<ConnectionStats>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            max_message_bytes: 16 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            stats: Arc::new(ConnectionStats::default()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("`{url}` is not a URL plexus can reach: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("the user and password in `{url}` are not valid percent-encoding")]
    BadCredentials { url: String },
    #[error("header `{name}`: {reason}")]
    BadHeader { name: String, reason: String },
    #[error("{url} did not open an HTTP+SSE event stream")]
    NoEventStream {
        url: String,
        #[source]
        source: legacy::LegacyOpenError,
    },
    #[error("{0}")]
    Tls(String),
}

/// The first messages decide which transport an `auto` upstream speaks.
#[derive(Clone, Debug)]
enum Mode {
    Undecided,
    Streamable,
    Legacy { endpoint: Uri },
}

/// Most of an error response's body kept for the message.
const ERROR_BODY_BYTES: usize = 64 * 1024;
/// How long a short body (an error's description) may take to arrive.
const SMALL_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long posting a notification or a response may take.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
const SESSION_ENDED: &str = "the upstream ended the session (HTTP 404)";
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const EVENT_STREAM: &str = "text/event-stream";

/// The HTTP side of an `UpstreamConnection`.
#[derive(Clone)]
pub(crate) struct HttpTransport {
    shared: Arc<Shared>,
}

struct Shared {
    upstream: Arc<str>,
    url: Uri,
    /// `url` for logs and errors.
    url_text: String,
    headers: HeaderMap,
    /// An OAuth access token obtained for the upstream (`Authorization: Bearer`),
    /// replaced when it is refreshed or stepped up. Never logged.
    bearer: Mutex<Option<HeaderValue>>,
    client: HttpClient,
    pending: SharedPending,
    events: Events,
    closed: CancellationToken,
    stats: Arc<ConnectionStats>,
    max_message_bytes: usize,
    connect_timeout: Duration,
    mode: Mutex<Mode>,
    /// Held while the first POST of an `auto` upstream decides its transport.
    deciding: tokio::sync::Mutex<()>,
    session_id: Mutex<Option<HeaderValue>>,
    protocol_version: Mutex<Option<HeaderValue>>,
    /// The task reading each request's response, so a cancel can close its stream.
    streams: Mutex<HashMap<u64, AbortHandle>>,
    listening: AtomicBool,
    /// Whether a followed redirect was logged (once: it may come with every request).
    redirect_noted: AtomicBool,
    /// Every task of the connection (exchanges, event streams, cancels): each
    /// ends when `closed` is set, and the connection's shutdown waits for them.
    tasks: TaskTracker,
}

fn content_type_is(response: &Response<Incoming>, wanted: &str) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(wanted))
}

/// The `error` of a JSON-RPC error response in `body`, if that is what it holds.
fn jsonrpc_error(body: &[u8]) -> Option<Value> {
    let message: Value = serde_json::from_slice(body).ok()?;
    let error = message.get("error")?;
    error.get("code")?.as_i64()?;
    Some(error.clone())
}

/// What a refused request's `WWW-Authenticate` says: a hint for the operator
/// (a 401: plexus's daemon sends what `headers`, or the URL's credentials, give)
/// and the challenge whole, for an OAuth client (a 401 or 403).
#[derive(Default)]
pub(crate) struct AccessRefusal {
    hint: Option<String>,
    challenge: Option<String>,
}

fn authorization_hint(response: &Response<Incoming>) -> AccessRefusal {
    let refused = matches!(
        response.status(),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    );
    let Some(challenge) = response.headers().get(WWW_AUTHENTICATE).filter(|_| refused) else {
        return AccessRefusal::default();
    };
    let challenge = String::from_utf8_lossy(challenge.as_bytes()).into_owned();
    let hint = challenge
        .split_whitespace()
        .next()
        .filter(|_| response.status() == StatusCode::UNAUTHORIZED)
        .map(|scheme| {
            format!(
                "it asks for {scheme} authorization, which plexus does not obtain itself: give the upstream its credentials in `headers` (e.g. Authorization = \"{scheme} ${{TOKEN}}\")"
            )
        });
    AccessRefusal {
        hint,
        challenge: Some(challenge),
    }
}

/// A short, printable piece of an error body.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// A client for plexus's own HTTP exchanges beside the MCP connection (OAuth
/// discovery and token requests): the same connector, TLS and timeouts.
pub(crate) fn plain_client(connect_timeout: Duration) -> Result<HttpClient, String> {
    client::build(connect_timeout)
}

/// Opens a connection to a remote upstream. For HTTP+SSE this waits for the event
/// stream's `endpoint`; streamable HTTP connects with the first request. Messages
/// the upstream sends on its own go to `events`.
pub(crate) async fn connect(
    upstream: Arc<str>,
    endpoint: &HttpEndpoint,
    options: &HttpOptions,
    events: Events,
) -> Result<Spawned<HttpTransport>, HttpError> {
    let url = check_url(&endpoint.url)?;
    let mut headers = HeaderMap::new();
    for (name, value) in &endpoint.headers {
        let (name, value) = check_header(name, value)?;
        headers.append(name, value);
    }
    let client = client::build(options.connect_timeout).map_err(HttpError::Tls)?;
    let pending: SharedPending = Arc::new(PendingRequests::default());
    let closed = CancellationToken::new();
    let initial = match endpoint.transport {
        HttpTransportKind::StreamableHttp => Mode::Streamable,
        HttpTransportKind::Sse | HttpTransportKind::Auto => Mode::Undecided,
    };
    let shared = Arc::new(Shared {
        upstream: upstream.clone(),
        url_text: display_url(&url),
        url,
        headers,
        bearer: Mutex::new(None),
        client,
        pending: pending.clone(),
        events,
        closed: closed.clone(),
        stats: options.stats.clone(),
        max_message_bytes: options.max_message_bytes,
        connect_timeout: options.connect_timeout,
        mode: Mutex::new(initial),
        deciding: tokio::sync::Mutex::new(()),
        session_id: Mutex::new(None),
        protocol_version: Mutex::new(None),
        streams: Mutex::new(HashMap::new()),
        listening: AtomicBool::new(false),
        redirect_noted: AtomicBool::new(false),
        tasks: TaskTracker::new(),
    });
    options.stats.spawns.fetch_add(1, Ordering::Relaxed);
    tracing::info!(upstream = %upstream, url = %shared.url_text, transport = endpoint.transport.label(), "connecting to HTTP upstream");
    // Given up before it is returned (an error, or the caller cancelled): end
    // whatever it started, such as the HTTP+SSE stream's reader.
    let abandoned = closed.clone().drop_guard();
    if endpoint.transport == HttpTransportKind::Sse {
        let endpoint = shared
            .open_legacy()
            .await
            .map_err(|source| HttpError::NoEventStream {
                url: shared.url_text.clone(),
                source,
            })?;
        shared.set_mode(Mode::Legacy { endpoint });
    }
    abandoned.disarm();
    let tasks = shared.tasks.clone();
    let transport = HttpTransport { shared };
    // One token: closing the connection is stopping it.
    Ok(Spawned {
        upstream,
        pending,
        closed: closed.clone(),
        stop: closed,
        stats: options.stats.clone(),
        tasks,
        transport,
    })
}

impl HttpTransport {
    /// Starts a request: a task posts it and reads what answers it.
    pub(crate) fn send_request(
        &self,
        id: u64,
        method: &str,
        params: Params,
        merge: Merge,
        headers: Vec<(String, String)>,
    ) -> Result<(), ConnectionError> {
        let shared = self.shared.clone();
        if shared.closed.is_cancelled() {
            return Err(ConnectionError::NotSent);
        }
        // `_meta` that is not an object takes nothing merged, so no header says it does.
        let merged = if params.takes_meta() {
            merge
        } else {
            Merge::default()
        };
        let head = Head::of(method, params.values(), merged).with_params(headers);
        let body = Bytes::from(encode_request(id, method, params, merge));
        let mut streams = shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let task = {
            let shared = shared.clone();
            shared.tasks.clone().spawn(async move {
                tokio::select! {
                    () = shared.exchange(id, head, body) => {}
                    () = shared.closed.cancelled() => {}
                }
            })
        };
        streams.insert(id, task.abort_handle());
        Ok(())
    }

    /// The request's caller has its answer: its task is left to finish on its own.
    pub(crate) fn request_finished(&self, id: u64) {
        self.shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// The caller stopped waiting: its stream is closed (the cancel of 2026-07-28)
    /// and `notification` (`notifications/cancelled`), if any, is posted.
    pub(crate) fn cancel(&self, id: u64, notification: Option<Vec<u8>>) {
        let task = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some(task) = task {
            task.abort();
        }
        if let (Some(notification), Ok(runtime)) =
            (notification, tokio::runtime::Handle::try_current())
        {
            let transport = self.clone();
            let closed = self.shared.closed.clone();
            self.shared.tasks.spawn_on(
                async move {
                    // Best effort: an unreachable upstream has dropped the request anyway,
                    // and a closed connection's session is gone.
                    tokio::select! {
                        _ = transport.send_message(notification) => {}
                        () = closed.cancelled() => {}
                    }
                },
                &runtime,
            );
        }
    }

    /// Posts a notification or a response.
    pub(crate) async fn send_message(&self, message: Vec<u8>) -> Result<(), ConnectionError> {
        let shared = &self.shared;
        let body = Bytes::from(message);
        let post = async {
            match shared.mode() {
                Mode::Legacy { endpoint } => shared.post(&endpoint, None, body, false).await,
                Mode::Streamable | Mode::Undecided => {
                    shared.post(&shared.url, None, body, true).await
                }
            }
        };
        // A server that never acknowledges must not hold the sender forever.
        let response = tokio::time::timeout(MESSAGE_TIMEOUT, post)
            .await
            .unwrap_or_else(|_| {
                Err(PostFailure::Failed(ExchangeError::Unacknowledged(
                    MESSAGE_TIMEOUT,
                )))
            });
        let response = match response {
            Ok(response) => response,
            Err(PostFailure::Unreachable(failure)) => {
                let (error, reason) = shared.unreachable(failure);
                shared.close(&reason);
                return Err(error);
            }
            Err(PostFailure::Failed(cause)) => return Err(shared.broken(cause)),
        };
        let status = response.status();
        let hint = authorization_hint(&response);
        let body = read_small(response).await;
        if status.is_success() {
            return Ok(());
        }
        match shared.refusal(status, &body, hint) {
            Some(Ok(Reply::Error(error))) => Err(ConnectionError::HttpStatus {
                url: shared.url_text.clone(),
                status: status.as_u16(),
                detail: error.to_string(),
                challenge: None,
            }),
            Some(Ok(Reply::Result(_) | Reply::Unread(_))) => Err(ConnectionError::NotSent),
            Some(Err(error)) => Err(error),
            None => {
                shared.close(SESSION_ENDED);
                Err(ConnectionError::NotSent)
            }
        }
    }

    /// Sends `token` as `Authorization: Bearer` from the next request on (None:
    /// none). False when it cannot be a header value.
    pub(crate) fn set_bearer(&self, token: Option<&str>) -> bool {
        let value = match token {
            Some(token) => match HeaderValue::from_str(&format!("Bearer {token}")) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    Some(value)
                }
                Err(_) => return false,
            },
            None => None,
        };
        *self
            .shared
            .bearer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = value;
        true
    }

    /// Deletes the session (servers may refuse with 405) and closes the connection.
    pub(crate) async fn shutdown(&self) {
        let shared = &self.shared;
        let session = shared.session_id();
        if let (false, Some(session), Mode::Streamable) =
            (shared.closed.is_cancelled(), session, shared.mode())
        {
            shared.delete_session(session).await;
        }
        shared.closed.cancel();
        shared.pending.fail_all(ConnectionError::Closed);
    }
}

/// Reads up to [`ERROR_BODY_BYTES`] of a body (an error's description, an
/// acknowledgement), for at most [`SMALL_BODY_TIMEOUT`].
async fn read_small(response: Response<Incoming>) -> Vec<u8> {
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                let room = ERROR_BODY_BYTES.saturating_sub(bytes.len());
                bytes.extend_from_slice(&data[..data.len().min(room)]);
                if room <= data.len() {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(SMALL_BODY_TIMEOUT, read).await;
    bytes
}

impl Shared {
    fn mode(&self) -> Mode {
        self.mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    fn session_id(&self) -> Option<HeaderValue> {
        self.session_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn negotiated_version(&self) -> Option<HeaderValue> {
        self.protocol_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn complete(&self, id: u64, outcome: Result<Reply, ConnectionError>) {
        if !self.pending.complete(id, outcome) {
            tracing::debug!(upstream = %self.upstream, id, "an answer came for a request nobody waits for");
        }
    }

    /// The upstream is gone (unreachable, or its session ended): no reply can come.
    fn close(&self, reason: &str) {
        if self.closed.is_cancelled() {
            return;
        }
        tracing::warn!(upstream = %self.upstream, url = %self.url_text, reason, "lost the HTTP upstream; closing its connection");
        // Closed first, so no new request can register after the sweep.
        self.closed.cancel();
        self.pending.fail_all(ConnectionError::Closed);
    }

    /// What a refused HTTP request means: a JSON-RPC error body is the reply; a
    /// 404 on a session is the session's end (None: the caller closes the
    /// connection); anything else is an HTTP failure.
    fn refusal(
        &self,
        status: StatusCode,
        body: &[u8],
        refused: AccessRefusal,
    ) -> Option<Result<Reply, ConnectionError>> {
        let AccessRefusal { hint, challenge } = refused;
        let refused_access = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        if let Some(error) = jsonrpc_error(body) {
            // A door refusing the credentials answers no message: the caller sees
            // the status (a bridge stops on it; retrying cannot help), with the
            // error's words.
            if !refused_access {
                return Some(Ok(Reply::Error(error)));
            }
            // The server explained itself: no hint is added to its words.
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            return Some(Err(ConnectionError::HttpStatus {
                url: self.url_text.clone(),
                status: status.as_u16(),
                detail: message.to_string(),
                challenge,
            }));
        }
        let session_ended = status == StatusCode::NOT_FOUND
            && (self.session_id().is_some() || matches!(self.mode(), Mode::Legacy { .. }));
        if session_ended {
            return None;
        }
        let detail = match (hint, snippet(body)) {
            (Some(hint), body) if body.is_empty() => hint,
            (Some(hint), body) => format!("{body}; {hint}"),
            (None, body) => body,
        };
        Some(Err(ConnectionError::HttpStatus {
            url: self.url_text.clone(),
            status: status.as_u16(),
            detail,
            challenge,
        }))
    }

    /// Completes request `id`, refused with `status` and `body` (and what its
    /// `WWW-Authenticate` says).
    fn refuse(&self, id: u64, status: StatusCode, body: &[u8], refused: AccessRefusal) {
        match self.refusal(status, body, refused) {
            Some(outcome) => self.complete(id, outcome),
            None => {
                // Never served, so it may be sent again, in the next session.
                self.complete(id, Err(ConnectionError::NotSent));
                self.close(SESSION_ENDED);
            }
        }
    }

    /// Sends request `id` and completes it, whatever happens.
    async fn exchange(self: &Arc<Self>, id: u64, head: Head, body: Bytes) {
        loop {
            match self.mode() {
                Mode::Legacy { endpoint } => {
                    return self.legacy_request(id, &endpoint, &head, body).await
                }
                Mode::Streamable => {
                    let response = self.post(&self.url, Some(&head), body, true).await;
                    return self.answer(id, &head, response).await;
                }
                Mode::Undecided => {
                    let _deciding = self.deciding.lock().await;
                    if !matches!(self.mode(), Mode::Undecided) {
                        continue;
                    }
                    let response = match self.post(&self.url, Some(&head), body.clone(), true).await
                    {
                        Ok(response) => response,
                        failure => return self.answer(id, &head, failure).await,
                    };
                    let status = response.status();
                    if !matches!(status.as_u16(), 400 | 404 | 405) {
                        self.set_mode(Mode::Streamable);
                        return self.answer(id, &head, Ok(response)).await;
                    }
                    let hint = authorization_hint(&response);
                    let refused = read_small(response).await;
                    if jsonrpc_error(&refused).is_none() {
                        match self.open_legacy().await {
                            Ok(endpoint) => {
                                tracing::info!(upstream = %self.upstream, url = %self.url_text, status = status.as_u16(), "the upstream refused a streamable HTTP POST and serves HTTP+SSE; using that");
                                self.set_mode(Mode::Legacy { endpoint });
                                continue;
                            }
                            Err(error) => {
                                let reason = crate::error_chain(&error);
                                tracing::debug!(upstream = %self.upstream, reason, "no HTTP+SSE fallback; the upstream speaks streamable HTTP")
                            }
                        }
                    }
                    self.set_mode(Mode::Streamable);
                    return self.refuse(id, status, &refused, hint);
                }
            }
        }
    }

    /// Fails request `id` whose POST got no response; an unreachable server
    /// also closes the connection, so the supervisor restarts it.
    fn post_failed(&self, id: u64, failure: PostFailure) {
        match failure {
            PostFailure::Unreachable(failure) => {
                let (error, reason) = self.unreachable(failure);
                self.complete(id, Err(error));
                self.close(&reason);
            }
            PostFailure::Failed(cause) => self.complete(id, Err(self.broken(cause))),
        }
    }

    /// `initialize` succeeded: later requests carry its version, and the GET
    /// stream is opened for what the server sends on its own.
    fn initialized(self: &Arc<Self>, result: &Value) {
        if let Some(version) = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(|version| HeaderValue::from_str(version).ok())
        {
            *self
                .protocol_version
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(version);
        }
        if matches!(self.mode(), Mode::Streamable) && !self.listening.swap(true, Ordering::AcqRel) {
            let shared = self.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = shared.listen() => {}
                    () = shared.closed.cancelled() => {}
                }
            });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_json_rpc_errors_count_as_replies() {
        assert!(jsonrpc_error(
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"m"}}"#
        )
        .is_some());
        assert!(jsonrpc_error(b"Method Not Allowed").is_none());
        assert!(jsonrpc_error(br#"{"error":"nope"}"#).is_none());
        assert_eq!(snippet(&[b'x'; 300]).chars().count(), 201);
    }
}
