//! The handshake-era session path: sessions opened by `initialize`, their POSTs,
//! their GET event stream, DELETE, and the expiry of idle ones.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::event_stream::{
    answer_on_stream, event_stream_response, sse_event, KEEP_ALIVE_INTERVAL,
};
use super::{answer_response, empty, json_error, plain, HttpFront, Rejection, SESSION_HEADER};
use crate::client_message::ClientMessage;
use crate::config::DaemonSettings;
use crate::era::Era;
use crate::jsonrpc::{self, Answer, RelayError};
use crate::listener::Body;
use crate::session::{Handled, Identity, Session};

/// A session opened by `initialize`, known by its `Mcp-Session-Id`.
pub(super) struct HttpSession {
    pub(super) session: Arc<Session>,
    /// Who opened it: only the same principal may use it.
    pub(super) principal: Arc<str>,
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

impl HttpFront {
    /// The session a request names. Another principal's session is unknown to this
    /// one, exactly like an ended session.
    pub(super) fn session_of(
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

    /// A message of a handshake-era session: `initialize` opens one, anything
    /// else names its session.
    pub(super) async fn post_in_session(
        &self,
        headers: &HeaderMap,
        received: ClientMessage,
        principal: Arc<str>,
        view: Option<Arc<str>>,
        is_initialize: bool,
    ) -> Response<Body> {
        let http_session = if is_initialize && !headers.contains_key(SESSION_HEADER) {
            if self.draining() {
                // Nothing ran: a balancer may send it to another node (HAProxy's `retry-on 503`).
                return json_error(StatusCode::SERVICE_UNAVAILABLE, &RelayError::ShuttingDown);
            }
            match self.open_session(principal, view) {
                Ok(session) => session,
                Err(error) => return json_error(StatusCode::TOO_MANY_REQUESTS, &error),
            }
        } else {
            match self.session_of(headers, &principal) {
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
                    let answers = futures::future::join_all(batch.into_iter().map(|m| {
                        let era = Era::of_message(session.initialized(), &m);
                        session.handle(m, era, None)
                    }))
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
                let accepts_events = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|accept| accept.contains("text/event-stream"));
                // Decided here, once: the session's requests are handshake-era
                // but for a 2026-07-28 one before any `initialize`.
                let era = Era::of_message(session.initialized(), &received.message);
                if is_request && accepts_events && !is_initialize {
                    return answer_on_stream(session.clone(), received, era, None, None).await;
                }
                match session.handle(received, era, None).await {
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
        let id = match &self.cluster {
            Some(cluster) => cluster.new_session_id(&http_session.principal),
            None => new_session_id(),
        };
        self.sessions.insert(id, http_session.clone());
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

    pub(super) fn get(&self, headers: &HeaderMap, principal: &str) -> Response<Body> {
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

    pub(super) fn delete(&self, headers: &HeaderMap, principal: &str) -> Response<Body> {
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
}

/// Ends sessions whose clients went away without a DELETE, so their per-session
/// upstreams do not run forever.
pub(super) async fn expire_idle_sessions(
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

/// 128 random bits, hex: unguessable, and never a credential.
fn new_session_id() -> String {
    let bits: u128 = rand::random();
    format!("{bits:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_128_bit_hex_and_distinct() {
        let first = new_session_id();
        assert_eq!(first.len(), 32);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(first, new_session_id());
    }
}
