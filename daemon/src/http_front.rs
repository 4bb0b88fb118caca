//! The streamable HTTP front at `/mcp`: POST carries client messages (answered
//! with a JSON body), GET opens the session's event stream, DELETE ends a session.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Refusal};
use crate::client_message::{ClientMessage, KnownCapabilities};
use crate::config::DaemonSettings;
use crate::era;
use crate::hub::Hub;
use crate::jsonrpc::{self, Answer, RelayError};
use crate::listener::{self, Body, BodyError};
use crate::session::{CloseOnDrop, Continuations, Handled, Identity, Session};

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const PROTOCOL_HEADER: &str = "mcp-protocol-version";
pub const METHOD_HEADER: &str = "mcp-method";
pub const NAME_HEADER: &str = "mcp-name";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

struct HttpSession {
    session: Arc<Session>,
    /// Who opened it: only the same principal may use it.
    principal: Arc<str>,
    /// Taken by the open GET stream and put back when it ends.
    events: Mutex<Option<mpsc::Receiver<Value>>>,
    /// When the client last sent anything; idle sessions are ended.
    last_seen: Mutex<tokio::time::Instant>,
}

impl HttpSession {
    fn touch(&self) {
        *self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = tokio::time::Instant::now();
    }

    /// Idle: nothing sent for `timeout`, and no event stream open.
    fn idle_for(&self, timeout: Duration) -> bool {
        let streaming = self
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none();
        let last_seen = *self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        !streaming && last_seen.elapsed() >= timeout
    }
}

/// State shared by every request to the front.
pub struct HttpFront {
    hub: Arc<Hub>,
    sessions: DashMap<String, Arc<HttpSession>>,
    /// Tokens, allowed hosts and origins, session limits: read per request, so a
    /// reload applies them at once.
    settings: watch::Receiver<DaemonSettings>,
    max_body_bytes: usize,
    shutdown: CancellationToken,
    /// 2026-07-28 requests paused on input from their clients.
    paused: Arc<Continuations>,
    /// The sessions of 2026-07-28 requests being served, so a shutdown can answer them.
    stateless: DashMap<u64, std::sync::Weak<Session>>,
    /// Entries added to `stateless`: every so many, the ended ones are swept.
    stateless_added: AtomicUsize,
    /// The queue of every stateless session, read by no one.
    nowhere: mpsc::Sender<Value>,
    /// The client capabilities 2026-07-28 requests declared lately.
    known: KnownCapabilities,
}

impl HttpFront {
    pub fn new(
        hub: Arc<Hub>,
        settings: watch::Receiver<DaemonSettings>,
        shutdown: CancellationToken,
    ) -> Arc<HttpFront> {
        let front = Arc::new(HttpFront {
            hub,
            sessions: DashMap::new(),
            settings: settings.clone(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            shutdown,
            paused: Arc::new(Continuations::default()),
            stateless: DashMap::new(),
            stateless_added: AtomicUsize::new(0),
            nowhere: mpsc::channel(1).0,
            known: KnownCapabilities::default(),
        });
        front
            .hub
            .spawn(expire_idle_sessions(Arc::downgrade(&front), settings));
        front
    }

    /// Open sessions by principal (for status).
    pub fn sessions_by_principal(&self) -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for entry in self.sessions.iter() {
            *counts
                .entry(entry.value().principal.to_string())
                .or_default() += 1;
        }
        counts
    }

    fn remove_session(&self, id: &str) -> bool {
        let Some((_, http_session)) = self.sessions.remove(id) else {
            return false;
        };
        http_session.session.close();
        self.hub
            .metrics()
            .sessions_active
            .with_label_values(&["http"])
            .set(self.sessions.len() as i64);
        true
    }

    /// Closes every session (at shutdown).
    pub fn close_all(&self) {
        for entry in self.sessions.iter() {
            entry.value().session.close_for_shutdown();
        }
        for entry in self.stateless.iter() {
            if let Some(session) = entry.value().upgrade() {
                session.close_for_shutdown();
            }
        }
        self.stateless.clear();
        self.sessions.clear();
        // Paused calls will not be retried now: release them and their upstream requests.
        self.paused.clear();
        self.hub
            .metrics()
            .sessions_active
            .with_label_values(&["http"])
            .set(0);
    }

    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        // `/mcp` is the whole catalog, `/mcp/<view>` a view of it.
        let requested_view = match request.uri().path() {
            "/mcp" => None,
            path => match path
                .strip_prefix("/mcp/")
                .filter(|name| !name.is_empty() && !name.contains('/'))
            {
                Some(name) => Some(name.to_string()),
                None => {
                    return plain(
                        StatusCode::NOT_FOUND,
                        "not found: the MCP endpoint is /mcp (or /mcp/<view>)",
                    )
                }
            },
        };
        let principal = {
            let settings = self.settings.borrow();
            access::check_host_and_origin(request.headers(), &settings)
                .and_then(|()| access::authenticate(request.headers(), &settings))
        };
        let principal: Arc<str> = match principal {
            Ok(principal) => Arc::from(principal),
            Err(refusal) => {
                self.hub
                    .metrics()
                    .http_refused_requests
                    .with_label_values(&[refusal.kind()])
                    .inc();
                return refused(&refusal);
            }
        };
        // A principal bound to a view sees it whatever the path; an unknown view is 404.
        let view = match self.hub.view_of(&principal, requested_view.as_deref()) {
            Ok(view) => view,
            Err(_) => return plain(StatusCode::NOT_FOUND, "not found: there is no such view"),
        };
        // A POST's answer echoes its request's id, so the body is read first.
        if request.method() != Method::POST {
            if let Err(error) = check_version_header(request.headers()) {
                return json_error(StatusCode::BAD_REQUEST, &error);
            }
        }
        match *request.method() {
            Method::POST => self.post(request, principal, view).await,
            Method::GET => self.get(request.headers(), &principal),
            Method::DELETE => self.delete(request.headers(), &principal),
            _ => {
                let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE");
                response
                    .headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                response
            }
        }
    }

    /// The session a request names. Another principal's session is unknown to this
    /// one, exactly like an ended session.
    fn session_of(
        &self,
        headers: &HeaderMap,
        principal: &str,
    ) -> Result<Arc<HttpSession>, Rejection> {
        let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
            return Err(Rejection::Json(
                StatusCode::BAD_REQUEST,
                RelayError::InvalidRequest("missing Mcp-Session-Id header".into()),
            ));
        };
        self.sessions
            .get(id)
            .filter(|entry| &*entry.value().principal == principal)
            .map(|entry| {
                entry.value().touch();
                entry.value().clone()
            })
            .ok_or_else(|| {
                Rejection::Json(
                    StatusCode::NOT_FOUND,
                    RelayError::InvalidRequest("unknown or ended session".into()),
                )
            })
    }

    async fn post(
        self: Arc<Self>,
        request: Request<Incoming>,
        principal: Arc<str>,
        view: Option<Arc<str>>,
    ) -> Response<Body> {
        if self.shutdown.is_cancelled() {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, &RelayError::ShuttingDown);
        }
        let (parts, body) = request.into_parts();
        let declared_length = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared_length.is_some_and(|length| length > self.max_body_bytes) {
            // Refuse before reading: the client learns at once, without uploading it all.
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &RelayError::RequestTooLarge {
                    limit: self.max_body_bytes,
                },
            );
        }
        let timeout = self.settings.borrow().body_read_timeout;
        let body = match listener::read_body(body, self.max_body_bytes, timeout).await {
            Ok(body) => body,
            Err(error) => {
                let relayed = match &error {
                    BodyError::TooLarge { limit } => RelayError::RequestTooLarge { limit: *limit },
                    BodyError::TimedOut(_) => {
                        RelayError::InvalidRequest(format!("{error} ([daemon] body_read_timeout)"))
                    }
                    BodyError::Unreadable(_) => RelayError::InvalidRequest(error.to_string()),
                };
                return error.closing(json_error(error.status(), &relayed));
            }
        };
        let received = match ClientMessage::read_served(body, &self.known) {
            Ok(received) => received,
            Err(error) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    &RelayError::Parse(error.to_string()),
                )
            }
        };
        let message = &received.message;
        if let Err(error) = check_version_header(&parts.headers) {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            return json_response(
                StatusCode::BAD_REQUEST,
                &jsonrpc::error_response(id, &error),
            );
        }
        let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        let modern_header = parts
            .headers
            .get(PROTOCOL_HEADER)
            .is_some_and(|v| v.as_bytes() == era::MODERN_VERSION.as_bytes());
        // A 2026-07-28 request is served that way whatever its method: `initialize`
        // sent so is an unknown method of that revision, not a handshake.
        if modern_header || era::declared_version(message.get("params")).is_some() {
            return self
                .post_modern(&parts.headers, received, Identity { principal, view })
                .await;
        }
        let http_session = if is_initialize && !parts.headers.contains_key(SESSION_HEADER) {
            match self.open_session(principal, view) {
                Ok(session) => session,
                Err(error) => return json_error(StatusCode::TOO_MANY_REQUESTS, &error),
            }
        } else {
            match self.session_of(&parts.headers, &principal) {
                Ok(session) => session,
                Err(rejection) => return rejection.into_response(),
            }
        };
        let session = &http_session.session;
        let outcome = match received.message {
            Value::Array(batch) => {
                // Batches exist only before 2025-06-18.
                let allows_batches = session
                    .protocol_version()
                    .is_some_and(|version| version.as_str() < "2025-06-18");
                if !allows_batches || batch.is_empty() {
                    Some(Answer::from(jsonrpc::error_response(
                        Value::Null,
                        &RelayError::InvalidRequest("batches are not accepted".into()),
                    )))
                } else {
                    let answers = futures::future::join_all(
                        batch.into_iter().map(|m| session.handle(m, None)),
                    )
                    .await;
                    let responses: Vec<Value> = answers
                        .into_iter()
                        .filter_map(|handled| match handled {
                            Handled::Respond(response) => Some(response.into_value()),
                            Handled::Nothing => None,
                        })
                        .collect();
                    (!responses.is_empty()).then_some(Answer::from(Value::Array(responses)))
                }
            }
            message => {
                let is_request = message.get("method").is_some() && message.get("id").is_some();
                let received = ClientMessage {
                    message,
                    arguments: received.arguments,
                    capabilities: received.capabilities,
                };
                let accepts_events = parts
                    .headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|accept| accept.contains("text/event-stream"));
                if is_request && accepts_events && !is_initialize {
                    return answer_on_stream(session.clone(), received, false).await;
                }
                match session.handle(received, None).await {
                    Handled::Respond(response) => Some(response),
                    Handled::Nothing => None,
                }
            }
        };
        let mut response = match outcome {
            Some(response) => answer_response(StatusCode::OK, response),
            None => empty(StatusCode::ACCEPTED),
        };
        if is_initialize {
            if let Some(id) = self.id_of(&http_session) {
                if let Ok(value) = HeaderValue::from_str(&id) {
                    response.headers_mut().insert(SESSION_HEADER, value);
                }
            }
        }
        response
    }

    /// A 2026-07-28 message: no session; the headers must mirror the body.
    async fn post_modern(
        &self,
        headers: &HeaderMap,
        mut received: ClientMessage,
        identity: Identity,
    ) -> Response<Body> {
        let catalog = self.hub.catalog_for(identity.view.as_deref());
        // The headers are checked against the arguments a tool mirrors into them.
        let message = &received.message;
        let mirrors_arguments = message
            .get("method")
            .and_then(Value::as_str)
            .and_then(|method| era::mirrored_name(method, message.get("params")))
            .flatten()
            .is_some_and(|name| !catalog.param_headers(name).is_empty());
        let arguments_read = if mirrors_arguments {
            received.read_arguments()
        } else {
            Ok(())
        };
        let message = &received.message;
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return json_error(
                StatusCode::BAD_REQUEST,
                &RelayError::InvalidRequest("only requests and notifications are accepted".into()),
            );
        };
        if message.get("id").is_none() {
            // This revision defines no notification a client sends over HTTP.
            return empty(StatusCode::ACCEPTED);
        }
        let params = message.get("params");
        let checked = arguments_read
            .and_then(|()| check_mirrored_headers(headers, method, params, &catalog))
            .and_then(|()| era::check_meta(params, received.capabilities.is_some()));
        if let Err(error) = checked {
            let response = jsonrpc::error_object_response(id, error.to_modern_error_object());
            return json_response(StatusCode::BAD_REQUEST, &response);
        }
        let session = Session::stateless(
            self.hub.clone(),
            self.paused.clone(),
            identity,
            &self.nowhere,
        );
        if self.stateless_added.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
            self.stateless
                .retain(|_, session| session.strong_count() > 0);
        }
        self.stateless
            .insert(session.id(), Arc::downgrade(&session));
        if accepts_event_stream(headers) {
            return answer_on_stream(session, received, true).await;
        }
        let _closing = CloseOnDrop(session.clone());
        match session.handle(received, None).await {
            Handled::Respond(response) => answer_response(modern_status(&response), response),
            Handled::Nothing => empty(StatusCode::ACCEPTED),
        }
    }

    /// A new session for `principal`, within `max_sessions` in total and per principal.
    fn open_session(
        &self,
        principal: Arc<str>,
        view: Option<Arc<str>>,
    ) -> Result<Arc<HttpSession>, RelayError> {
        let (limit, per_principal) = {
            let settings = self.settings.borrow();
            (settings.max_sessions, settings.max_sessions_per_principal)
        };
        let open = self.sessions.len();
        if open >= limit {
            return Err(RelayError::TooManySessions {
                open,
                limit,
                scope: "in total",
                key: "max_sessions",
            });
        }
        let theirs = self
            .sessions
            .iter()
            .filter(|entry| entry.value().principal == principal)
            .count();
        if theirs >= per_principal {
            return Err(RelayError::TooManySessions {
                open: theirs,
                limit: per_principal,
                scope: "for this principal",
                key: "max_sessions_per_principal",
            });
        }
        let identity = Identity {
            principal: principal.clone(),
            view,
        };
        let (session, events) = Session::new(self.hub.clone(), self.paused.clone(), identity);
        let http_session = Arc::new(HttpSession {
            session,
            principal,
            events: Mutex::new(Some(events)),
            last_seen: Mutex::new(tokio::time::Instant::now()),
        });
        self.sessions.insert(new_session_id(), http_session.clone());
        self.hub
            .metrics()
            .sessions_active
            .with_label_values(&["http"])
            .set(self.sessions.len() as i64);
        Ok(http_session)
    }

    fn id_of(&self, wanted: &Arc<HttpSession>) -> Option<String> {
        self.sessions
            .iter()
            .find(|entry| Arc::ptr_eq(entry.value(), wanted))
            .map(|entry| entry.key().clone())
    }

    fn get(&self, headers: &HeaderMap, principal: &str) -> Response<Body> {
        let accepts_events = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream"));
        if !accepts_events {
            return plain(
                StatusCode::NOT_ACCEPTABLE,
                "GET /mcp needs Accept: text/event-stream",
            );
        }
        let http_session = match self.session_of(headers, principal) {
            Ok(session) => session,
            Err(rejection) => return rejection.into_response(),
        };
        let Some(events) = http_session
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return plain(
                StatusCode::CONFLICT,
                "this session already has an open event stream",
            );
        };
        let stream = EventStream {
            events: Some(events),
            owner: http_session.clone(),
        };
        let shutdown = self.shutdown.clone();
        let body =
            futures::stream::unfold((stream, shutdown), |(mut stream, shutdown)| async move {
                let receiver = stream.events.as_mut()?;
                let chunk = tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    message = receiver.recv() => match message {
                        Some(message) => sse_event(&message),
                        None => return None,
                    },
                    // A comment line keeps idle proxies from closing the stream.
                    _ = tokio::time::sleep(KEEP_ALIVE_INTERVAL) => Bytes::from_static(b":\n\n"),
                };
                Some((Ok::<_, Infallible>(Frame::data(chunk)), (stream, shutdown)))
            });
        event_stream_response(BodyExt::boxed_unsync(StreamBody::new(body)))
    }

    fn delete(&self, headers: &HeaderMap, principal: &str) -> Response<Body> {
        let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
            return plain(StatusCode::BAD_REQUEST, "missing Mcp-Session-Id header");
        };
        let theirs = self
            .sessions
            .get(id)
            .is_some_and(|entry| &*entry.value().principal == principal);
        if theirs && self.remove_session(id) {
            empty(StatusCode::NO_CONTENT)
        } else {
            plain(StatusCode::NOT_FOUND, "unknown or ended session")
        }
    }
}

/// Answers one request. A quick answer is a plain JSON body; if a related message
/// (progress, a request from the upstream) comes first, the answer becomes an
/// event stream carrying those messages and then the response.
async fn answer_on_stream(
    session: Arc<Session>,
    message: ClientMessage,
    modern: bool,
) -> Response<Body> {
    let (related, mut related_messages) = mpsc::channel::<Value>(64);
    let mut handling = Box::pin(async move {
        // A session made for this one request ends with it.
        let _closing = modern.then(|| CloseOnDrop(session.clone()));
        session.handle(message, Some(&related)).await
    });
    let (first, done) = tokio::select! {
        biased;
        handled = &mut handling => match related_messages.try_recv() {
            // Related messages queued before the answer go first, on a stream.
            Ok(first) => (Some(first), Some(handled)),
            Err(_) => {
                return match handled {
                    Handled::Respond(response) => {
                        let status = if modern { modern_status(&response) } else { StatusCode::OK };
                        answer_response(status, response)
                    }
                    Handled::Nothing => empty(StatusCode::ACCEPTED),
                };
            }
        },
        first = related_messages.recv() => (first, None),
    };
    let (frames, frame_stream) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        if let Some(first) = first {
            if frames.send(sse_event(&first)).await.is_err() {
                return;
            }
        }
        // Whatever was related to the request is sent before its answer.
        let finish = |handled: Handled, mut related: mpsc::Receiver<Value>| {
            let frames = frames.clone();
            async move {
                while let Ok(message) = related.try_recv() {
                    let _ = frames.send(sse_event(&message)).await;
                }
                if let Handled::Respond(response) = handled {
                    let _ = frames.send(sse_answer(response)).await;
                }
            }
        };
        if let Some(handled) = done {
            return finish(handled, related_messages).await;
        }
        let mut related_open = true;
        // A comment line now and then keeps a long stream (a listen) open through idle proxies.
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE_INTERVAL);
        keep_alive.reset();
        loop {
            tokio::select! {
                biased;
                message = related_messages.recv(), if related_open => match message {
                    Some(message) => {
                        // The client went away: dropping `handling` cancels the request.
                        if frames.send(sse_event(&message)).await.is_err() {
                            return;
                        }
                    }
                    None => related_open = false,
                },
                handled = &mut handling => return finish(handled, related_messages).await,
                _ = keep_alive.tick() => {
                    if frames.send(Bytes::from_static(b":\n\n")).await.is_err() {
                        return;
                    }
                }
                // The client closed the stream: that cancels the request (dropping `handling`).
                () = frames.closed() => return,
            }
        }
    });
    let body = futures::stream::unfold(frame_stream, |mut frames| async move {
        let chunk = frames.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), frames))
    });
    event_stream_response(BodyExt::boxed_unsync(StreamBody::new(body)))
}

fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"))
}

/// 2026-07-28 over HTTP: an unknown method is 404, a malformed request (or one
/// needing a capability it did not declare, an upstream's refusal included) 400.
fn modern_status(response: &Answer) -> StatusCode {
    match response.error_code() {
        Some(jsonrpc::METHOD_NOT_FOUND) => StatusCode::NOT_FOUND,
        Some(
            jsonrpc::HEADER_MISMATCH
            | jsonrpc::MISSING_CAPABILITY
            | jsonrpc::UNSUPPORTED_PROTOCOL_VERSION
            | jsonrpc::INVALID_REQUEST
            | jsonrpc::PARSE_ERROR,
        ) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

/// The headers a 2026-07-28 request must carry, mirroring its body, so that
/// anything routing on headers sees what plexus executes.
fn check_mirrored_headers(
    headers: &HeaderMap,
    method: &str,
    params: Option<&Value>,
    catalog: &registry::Catalog,
) -> Result<(), RelayError> {
    let header = |name: &str| -> Result<std::borrow::Cow<'_, str>, RelayError> {
        let value = headers
            .get(name)
            .ok_or_else(|| RelayError::HeaderMismatch(format!("the {name} header is required")))?;
        value
            .to_str()
            .ok()
            .and_then(registry::headers::decode_header_value)
            .ok_or_else(|| RelayError::HeaderMismatch(format!("the {name} header is malformed")))
    };
    let version = header(PROTOCOL_HEADER)?;
    if let Some(declared) = era::declared_version(params).and_then(Value::as_str) {
        if declared != version {
            return Err(RelayError::HeaderMismatch(format!(
                "MCP-Protocol-Version `{version}` does not match `_meta` `{declared}`"
            )));
        }
    }
    let sent = header(METHOD_HEADER)?;
    if sent != method {
        return Err(RelayError::HeaderMismatch(format!(
            "Mcp-Method `{sent}` does not match the body's `{method}`"
        )));
    }
    if let Some(name) = era::mirrored_name(method, params) {
        let sent = header(NAME_HEADER)?;
        if Some(&*sent) != name {
            return Err(RelayError::HeaderMismatch(format!(
                "Mcp-Name `{sent}` does not match the body's `{}`",
                name.unwrap_or_default()
            )));
        }
        // The tool's parameters that its schema mirrors into headers.
        if method == "tools/call" {
            let arguments = params.and_then(|p| p.get("arguments"));
            for designated in catalog.param_headers(name.unwrap_or_default()) {
                let Some(expected) = designated.value_in(arguments) else {
                    continue;
                };
                let header_name = designated.header_name();
                let sent = header(&header_name)?;
                if !registry::headers::header_matches(&sent, &expected) {
                    return Err(RelayError::HeaderMismatch(format!(
                        "Mcp-Param-{} `{sent}` does not match the argument `{expected}`",
                        designated.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn event_stream_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// One server-sent event carrying a JSON-RPC message.
/// An answer as an event: serialised bytes go out as they are (JSON has no raw
/// newline, so one `data:` line holds it).
fn sse_answer(answer: Answer) -> Bytes {
    let mut event = b"event: message\ndata: ".to_vec();
    answer.write_to(&mut event);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

fn sse_event(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

/// Ends sessions whose clients went away without a DELETE, so their per-session
/// upstreams do not run forever.
async fn expire_idle_sessions(
    front: std::sync::Weak<HttpFront>,
    settings: watch::Receiver<DaemonSettings>,
) {
    let Some(shutdown) = front.upgrade().map(|front| front.shutdown.clone()) else {
        return;
    };
    loop {
        // Read each round: a reload may change it.
        let timeout = settings.borrow().session_idle_timeout;
        let period = (timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.cancelled() => return,
        }
        let Some(front) = front.upgrade() else { return };
        let idle: Vec<String> = front
            .sessions
            .iter()
            .filter(|entry| entry.value().idle_for(timeout))
            .map(|entry| entry.key().clone())
            .collect();
        for id in idle {
            tracing::info!(
                idle_ms = timeout.as_millis() as u64,
                "ending an idle HTTP session"
            );
            front.remove_session(&id);
        }
    }
}

/// An open GET stream; gives the receiver back to its session when the client goes.
struct EventStream {
    events: Option<mpsc::Receiver<Value>>,
    owner: Arc<HttpSession>,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if let Some(events) = self.events.take() {
            *self
                .owner
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(events);
        }
    }
}

/// Why a request is refused before it reaches a session.
enum Rejection {
    Json(StatusCode, RelayError),
}

impl Rejection {
    fn into_response(self) -> Response<Body> {
        match self {
            Rejection::Json(status, error) => json_error(status, &error),
        }
    }
}

/// A `MCP-Protocol-Version` header names a revision plexus serves, if there is one.
fn check_version_header(headers: &HeaderMap) -> Result<(), RelayError> {
    let Some(version) = headers.get(PROTOCOL_HEADER) else {
        return Ok(());
    };
    let version = version.to_str().unwrap_or_default();
    if era::ALL_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(RelayError::UnsupportedVersion {
        requested: version.to_string(),
        supported: era::ALL_VERSIONS.to_vec(),
    })
}

/// A refusal at the door: its status, a JSON-RPC error body, and for 401 the
/// `WWW-Authenticate` challenge.
fn refused(refusal: &Refusal) -> Response<Body> {
    let error = RelayError::AccessDenied {
        kind: refusal.kind(),
        reason: refusal.message(),
    };
    let mut response = json_error(refusal.status(), &error);
    if let Some(challenge) = refusal.challenge() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    response
}

/// 128 random bits, hex: unguessable, and never a credential.
fn new_session_id() -> String {
    let bits: u128 = rand::random();
    format!("{bits:032x}")
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *response.status_mut() = status;
    response
}

fn json_response(status: StatusCode, message: &Value) -> Response<Body> {
    json_bytes_response(status, adapters::json_out::to_vec(message))
}

fn answer_response(status: StatusCode, answer: Answer) -> Response<Body> {
    json_bytes_response(status, answer.into_bytes())
}

fn json_bytes_response(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn json_error(status: StatusCode, error: &RelayError) -> Response<Body> {
    json_response(status, &jsonrpc::error_response(Value::Null, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::is_loopback_host;

    #[test]
    fn loopback_hosts_are_recognised() {
        for host in [
            "localhost",
            "localhost:7464",
            "127.0.0.1:1",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7464",
            "127.0.0.2",
            "localhost.evil.example",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn session_ids_are_128_bit_hex_and_distinct() {
        let first = new_session_id();
        assert_eq!(first.len(), 32);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(first, new_session_id());
    }
}
