//! The streamable HTTP front at `/mcp`: POST carries client messages (answered
//! with a JSON body), GET opens the session's event stream, DELETE ends a session.
//! This file routes and answers; `sessions` holds the handshake-era session path,
//! `modern` the 2026-07-28 per-request path, `event_stream` the streams' writer.

mod event_stream;
mod modern;
mod sessions;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::access::{self, Credential, Refusal};
use crate::client_message::{ClientMessage, KnownCapabilities};
use crate::cluster::{Cluster, ForwardError, Owner, PeerListen};
use crate::config::{DaemonSettings, FrontOAuth};
use crate::era;
use crate::hub::Hub;
use crate::jsonrpc::{self, Answer, RelayError};
use crate::listener::{self, Body, BodyError};
use crate::session::{Continuations, Identity, Session};
use crate::sso::{self, Verifier};
use crate::telemetry;
use sessions::{expire_idle_sessions, HttpSession};

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const PROTOCOL_HEADER: &str = "mcp-protocol-version";
pub const METHOD_HEADER: &str = "mcp-method";
pub const NAME_HEADER: &str = "mcp-name";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

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
    /// Checks access tokens for the `[daemon.oauth]` in force; replaced when it
    /// changes, so a reload applies a new issuer at once.
    verifier: std::sync::Mutex<Option<Arc<Verifier>>>,
    /// `[cluster]`: this node's name and keys, and the way to its peers.
    cluster: Option<Arc<Cluster>>,
}

impl HttpFront {
    pub fn new(
        hub: Arc<Hub>,
        settings: watch::Receiver<DaemonSettings>,
        shutdown: CancellationToken,
        cluster: Option<Arc<Cluster>>,
    ) -> Arc<HttpFront> {
        let paused = Arc::new(Continuations::new(&hub));
        if let Some(cluster) = &cluster {
            let cluster = cluster.clone();
            paused
                .calls
                .name_states(Arc::new(move || cluster.new_state()));
        }
        let front = Arc::new(HttpFront {
            hub,
            sessions: DashMap::new(),
            settings: settings.clone(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            shutdown,
            paused,
            stateless: DashMap::new(),
            stateless_added: AtomicUsize::new(0),
            nowhere: mpsc::channel(1).0,
            known: KnownCapabilities::default(),
            verifier: std::sync::Mutex::new(None),
            cluster,
        });
        front
            .hub
            .spawn(expire_idle_sessions(Arc::downgrade(&front), settings));
        front
    }

    /// Whether this node is draining out of its cluster (then `/readyz` is 503).
    pub fn draining(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|cluster| cluster.draining())
    }

    /// Handshake-era sessions open now.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
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
            path if sso::is_metadata_path(path) => return self.resource_metadata(&request),
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
        let (principal, view) = match self.admit(request.headers(), requested_view).await {
            Ok(admitted) => admitted,
            Err(response) => return response,
        };
        let (request, forwarded) = match self.clustered(request, &principal).await {
            Ok(admitted) => admitted,
            Err(response) => return response,
        };
        // A POST's answer echoes its request's id, so the body is read first.
        if request.method() != Method::POST {
            if let Err(error) = check_version_header(request.headers()) {
                return json_error(StatusCode::BAD_REQUEST, &error);
            }
        }
        match *request.method() {
            // A client's trace context in the header parents its request's span (boxed:
            // the untraced request's future stays the size it was).
            Method::POST => match telemetry::http_parent(request.headers()) {
                None => self.post(request, principal, view, forwarded).await,
                Some(parent) => {
                    Box::pin(async move {
                        let post = std::pin::pin!(self.post(request, principal, view, forwarded));
                        telemetry::within(parent, post).await
                    })
                    .await
                }
            },
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

    /// The request's principal and the view it sees, or the response refusing it.
    async fn admit(
        &self,
        headers: &HeaderMap,
        requested_view: Option<String>,
    ) -> Result<(Arc<str>, Option<Arc<str>>), Response<Body>> {
        let (credential, oauth) = {
            let settings = self.settings.borrow();
            let credential = access::check_host_and_origin(headers, &settings)
                .and_then(|()| access::front_credential(headers, &settings));
            (credential, settings.oauth.clone())
        };
        let refuse = |refusal: Refusal| {
            self.hub
                .metrics()
                .http_refused_requests
                .with_label_values(&[refusal.kind()])
                .inc();
            refused(&refusal, oauth.as_ref())
        };
        let (principal, claim_view) = match credential {
            Ok(Credential::Principal(principal)) => (principal, None),
            Ok(Credential::AccessToken(token)) => {
                let Some(verifier) = oauth.as_ref().and_then(|oauth| self.verifier(oauth)) else {
                    return Err(refuse(Refusal::KeysUnavailable));
                };
                match verifier.check(&token).await {
                    Ok(admitted) => (admitted.principal, Some(admitted.view)),
                    Err(refusal) => {
                        // The reason, never the token.
                        tracing::info!(reason = %adapters::error_chain(&refusal), "access token refused");
                        return Err(refuse(if refusal.is_unavailable() {
                            Refusal::KeysUnavailable
                        } else {
                            Refusal::Unauthorized { presented: true }
                        }));
                    }
                }
            }
            Err(refusal) => return Err(refuse(refusal)),
        };
        // A principal bound to a view sees it whatever the path; an unknown view is 404.
        let view = match claim_view {
            Some(Some(bound)) => Ok(Some(Arc::from(bound))),
            // An access token's principal is no static token's name, whatever its claim says.
            Some(None) => self.hub.view_named(requested_view.as_deref()),
            None => self.hub.view_of(&principal, requested_view.as_deref()),
        };
        match view {
            Ok(view) => Ok((Arc::from(principal), view)),
            Err(_) => Err(plain(
                StatusCode::NOT_FOUND,
                "not found: there is no such view",
            )),
        }
    }

    /// The verifier of `oauth`, made anew when the settings changed.
    fn verifier(&self, oauth: &FrontOAuth) -> Option<Arc<Verifier>> {
        let mut current = self
            .verifier
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(verifier) = current.as_ref().filter(|v| v.settings() == oauth) {
            return Some(verifier.clone());
        }
        match Verifier::new(oauth.clone()) {
            Ok(verifier) => {
                let verifier = Arc::new(verifier);
                *current = Some(verifier.clone());
                Some(verifier)
            }
            Err(error) => {
                tracing::error!(error = %adapters::error_chain(&error), "access tokens cannot be checked");
                None
            }
        }
    }

    /// RFC 9728 protected-resource metadata: where clients learn which
    /// authorization server issues tokens for plexus (404 without `[daemon.oauth]`).
    fn resource_metadata(&self, request: &Request<Incoming>) -> Response<Body> {
        let settings = self.settings.borrow();
        if let Err(refusal) = access::check_host_and_origin(request.headers(), &settings) {
            return refused(&refusal, None);
        }
        match (&settings.oauth, request.method()) {
            (None, _) => plain(
                StatusCode::NOT_FOUND,
                "not found: this plexus takes no OAuth access tokens ([daemon.oauth])",
            ),
            (Some(oauth), &Method::GET | &Method::HEAD) => {
                json_response(StatusCode::OK, &sso::metadata(oauth))
            }
            (Some(_), _) => {
                let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET");
                response
                    .headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET"));
                response
            }
        }
    }

    async fn post(
        self: Arc<Self>,
        request: Request<Incoming>,
        principal: Arc<str>,
        view: Option<Arc<str>>,
        forwarded: bool,
    ) -> Response<Body> {
        if self.shutdown.is_cancelled() {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, &RelayError::ShuttingDown);
        }
        let (mut parts, body) = request.into_parts();
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
                    // With hyper's causes: its own text alone says only that reading failed.
                    BodyError::Unreadable(_) => {
                        RelayError::InvalidRequest(adapters::error_chain(&error))
                    }
                };
                return error.closing(json_error(error.status(), &relayed));
            }
        };
        // Kept (a reference, not a copy) in case a paused round's retry goes to its node.
        let raw = self.cluster.as_ref().map(|_| body.clone());
        let mut received = match ClientMessage::read_served(body, &self.known) {
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
            // A client's listen hears the peers too (one forwarded listen each).
            let peers = match (&self.cluster, &raw) {
                (Some(cluster), Some(raw))
                    if !forwarded
                        && message.get("method").and_then(Value::as_str)
                            == Some("subscriptions/listen") =>
                {
                    Some(PeerListen::new(cluster.clone(), parts.clone(), raw.clone()))
                }
                _ => None,
            };
            if let (Some(cluster), Some(raw)) = (&self.cluster, raw) {
                match clustered_modern(
                    cluster,
                    &mut received,
                    &mut parts.headers,
                    forwarded,
                    &principal,
                ) {
                    Ok(()) => {}
                    Err(ModernRoute::Forward(node)) => {
                        return self.forward(cluster, &node, &parts, raw).await;
                    }
                    Err(ModernRoute::Respond(response)) => return *response,
                }
            }
            return self
                .post_modern(
                    &parts.headers,
                    received,
                    Identity { principal, view },
                    peers,
                )
                .await;
        }
        self.post_in_session(&parts.headers, received, principal, view, is_initialize)
            .await
    }
}

impl HttpFront {
    /// In a cluster: a request forwarded by a peer must carry the cluster's
    /// signature; one naming a session another node holds goes there, once. Gives
    /// back the request to serve here and whether a peer sent it.
    async fn clustered(
        &self,
        request: Request<Incoming>,
        principal: &str,
    ) -> Result<(Request<Incoming>, bool), Response<Body>> {
        let Some(cluster) = &self.cluster else {
            return Ok((request, false));
        };
        let forwarded = match cluster.forwarded_by(
            request.headers(),
            request.method().as_str(),
            request.uri().path(),
        ) {
            Ok(forwarded) => forwarded.is_some(),
            Err(forged) => {
                tracing::warn!(error = %forged, "refused a request claiming to come from a peer");
                return Err(json_error(
                    StatusCode::FORBIDDEN,
                    &RelayError::InvalidRequest(forged.to_string()),
                ));
            }
        };
        let Some(id) = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return Ok((request, forwarded));
        };
        match cluster.owner_of_session(id, principal) {
            Ok(Owner::Here) => Ok((request, forwarded)),
            // Garbage, another principal's, or sealed under a retired key: the
            // spec's answer to a session it does not know, so the client starts over.
            Err(refused) => {
                tracing::debug!(reason = %refused, "a session id of no node");
                Err(unknown_session())
            }
            Ok(Owner::Peer(node)) if forwarded => Err(misrouted(&node)),
            Ok(Owner::Peer(node)) => {
                let (parts, body) = request.into_parts();
                // Held whole (within the body limit), so a try can be made again.
                let timeout = self.settings.borrow().body_read_timeout;
                let body = match listener::read_body(body, self.max_body_bytes, timeout).await {
                    Ok(body) => body,
                    Err(error) => {
                        let relayed = RelayError::InvalidRequest(adapters::error_chain(&error));
                        return Err(error.closing(json_error(error.status(), &relayed)));
                    }
                };
                Err(self.forward(cluster, &node, &parts, body).await)
            }
        }
    }

    async fn forward(
        &self,
        cluster: &Cluster,
        node: &str,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Response<Body> {
        let forwarded = &self.hub.metrics().cluster_forwarded;
        let outcome = match cluster.forward(node, parts, body).await {
            Ok(response) => {
                forwarded.with_label_values(&["ok"]).inc();
                return response;
            }
            Err(error) => error,
        };
        let reason = adapters::error_chain(&outcome);
        tracing::info!(node, error = %reason, "a forward to the owner failed");
        let (status, message) = match outcome {
            // What the owner held is gone with it: like any unknown session.
            ForwardError::UnknownNode(_)
            | ForwardError::Resolve(..)
            | ForwardError::Unreachable { .. } => {
                forwarded.with_label_values(&["unreachable"]).inc();
                (
                    StatusCode::NOT_FOUND,
                    format!(
                    "unknown or ended session: the node holding it, {reason}; start a new session"
                ),
                )
            }
            ForwardError::Unresponsive { .. } => {
                forwarded.with_label_values(&["unresponsive"]).inc();
                (StatusCode::GATEWAY_TIMEOUT, reason)
            }
            ForwardError::Failed { .. } | ForwardError::Request(_) => {
                forwarded.with_label_values(&["failed"]).inc();
                (StatusCode::BAD_GATEWAY, reason)
            }
        };
        json_error(status, &RelayError::InvalidRequest(message))
    }
}

/// Where a 2026-07-28 request goes in a cluster, when not served here.
enum ModernRoute {
    Forward(String),
    Respond(Box<Response<Body>>),
}

/// A 2026-07-28 request naming a paused round or a task another node holds goes
/// there (once); one naming this node's gets back the names its upstream gave.
/// A name plexus sealed that the client edited, or that was sealed for another
/// principal, opens nowhere: a `requestState` is refused (400), a task id is an
/// unknown task, as anywhere.
fn clustered_modern(
    cluster: &Cluster,
    received: &mut ClientMessage,
    headers: &mut HeaderMap,
    forwarded: bool,
    principal: &str,
) -> Result<(), ModernRoute> {
    if received.message.get("method").and_then(Value::as_str) == Some("subscriptions/listen") {
        cluster.open_listened_tasks(received.message.get_mut("params"), principal);
    }
    let message = &received.message;
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let by_task = matches!(
        message.get("method").and_then(Value::as_str),
        Some("tasks/get" | "tasks/update" | "tasks/cancel")
    );
    for key in ["requestState", "taskId"] {
        let message = &received.message;
        let Some(name) = message
            .get("params")
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let decided = match key {
            "requestState" => cluster.owner_of_state(name, principal),
            _ if by_task => cluster
                .owner_of_task(name, principal)
                .map(|owned| owned.map(|(owner, task)| (owner, Some(task)))),
            _ => None,
        };
        match decided {
            None | Some(Ok((Owner::Here, None))) => {}
            Some(Ok((Owner::Here, Some(original)))) => {
                // The name as the upstream gave it, in the body and the header mirroring it.
                // (A header naming something else is left for the mirror check to refuse.)
                let mirrored = headers
                    .get(NAME_HEADER)
                    .is_some_and(|v| v.as_bytes() == name.as_bytes());
                if key == "taskId" && mirrored {
                    if let Ok(value) = HeaderValue::from_str(&original) {
                        headers.insert(NAME_HEADER, value);
                    }
                }
                received.message["params"][key] = Value::String(original);
            }
            Some(Err(refused)) if key == "taskId" => {
                // The hub's answer to a task id it does not know (-32602).
                tracing::debug!(reason = %refused, "a task id of no node, or another principal's");
                let error = RelayError::InvalidParams(format!("unknown task `{name}`"));
                return Err(ModernRoute::Respond(Box::new(json_response(
                    StatusCode::OK,
                    &jsonrpc::error_response(id, &error),
                ))));
            }
            Some(Err(refused)) => {
                // Edited, another principal's, or sealed under a key no longer in the ring.
                let error = RelayError::InvalidParams(format!(
                    "`{key}` is not one plexus issued: {refused}"
                ));
                return Err(ModernRoute::Respond(Box::new(json_response(
                    StatusCode::BAD_REQUEST,
                    &jsonrpc::error_response(id, &error),
                ))));
            }
            Some(Ok((Owner::Peer(node), _))) if !forwarded => {
                return Err(ModernRoute::Forward(node))
            }
            Some(Ok((Owner::Peer(node), _))) => {
                return Err(ModernRoute::Respond(Box::new(misrouted(&node))))
            }
        }
    }
    Ok(())
}

fn unknown_session() -> Response<Body> {
    json_error(
        StatusCode::NOT_FOUND,
        &RelayError::InvalidRequest("unknown or ended session".into()),
    )
}

/// A peer sent a request for a third node: forwarded once only, never onwards.
fn misrouted(node: &str) -> Response<Body> {
    json_error(
        StatusCode::NOT_FOUND,
        &RelayError::InvalidRequest(format!(
            "unknown or ended session: it belongs to node `{node}`, and a forwarded request is not forwarded again"
        )),
    )
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
/// `WWW-Authenticate` challenge (pointing to the resource metadata with `[daemon.oauth]`).
fn refused(refusal: &Refusal, oauth: Option<&FrontOAuth>) -> Response<Body> {
    let error = RelayError::AccessDenied {
        kind: refusal.kind(),
        reason: refusal.message(),
    };
    let mut response = json_error(refusal.status(), &error);
    let with_metadata = match (refusal, oauth) {
        (Refusal::Unauthorized { presented }, Some(oauth)) => {
            HeaderValue::from_str(&sso::challenge(oauth, *presented)).ok()
        }
        _ => None,
    };
    if let Some(challenge) = with_metadata {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    } else if let Some(challenge) = refusal.challenge() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    response
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
}
