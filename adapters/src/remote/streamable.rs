//! Streamable HTTP: a request's POST answered with a JSON body or an event stream
//! (resumed with `Last-Event-ID`), the session's GET stream for what the server
//! sends on its own, and the session's DELETE.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use serde_json::Value;

use super::client::{ExchangeError, PostFailure, SendFailure};
use super::head::Head;
use super::inbound::Pumped;
use super::sse::SseDecoder;
use super::{
    authorization_hint, content_type_is, read_small, snippet, Shared, EVENT_STREAM, SESSION_ENDED,
    SESSION_HEADER, VERSION_HEADER,
};
use crate::error_chain;
use crate::rpc::{skim_reply, with_paired_surrogates, ConnectionError};

/// How many times a request's event stream is resumed (`Last-Event-ID`) before giving up.
const MAX_RESUMES: usize = 3;
/// How long the rest of a request's event stream is read after its reply, so the
/// HTTP connection can be reused.
const DRAIN_AFTER_REPLY: Duration = Duration::from_secs(1);
/// Reconnection delay of event streams when the server names none.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// The longest reconnection delay plexus honours.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How long the session's DELETE may take at shutdown.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);

impl Shared {
    /// Completes request `id` from the response to its POST.
    pub(super) async fn answer(
        self: &Arc<Self>,
        id: u64,
        head: &Head,
        response: Result<Response<Incoming>, PostFailure>,
    ) {
        let response = match response {
            Ok(response) => response,
            Err(failure) => return self.post_failed(id, failure),
        };
        let status = response.status();
        if !status.is_success() {
            let hint = authorization_hint(&response);
            let body = read_small(response).await;
            return self.refuse(id, status, &body, hint);
        }
        if head.initialize {
            let session = response.headers().get(SESSION_HEADER).cloned();
            if let Some(session) = session {
                *self
                    .session_id
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(session);
            }
        }
        let initialize = head.initialize.then_some(id);
        if content_type_is(&response, EVENT_STREAM) {
            return self
                .read_request_stream(id, initialize, response.into_body())
                .await;
        }
        if status == StatusCode::ACCEPTED {
            return self.complete(
                id,
                Err(ConnectionError::HttpStatus {
                    url: self.url_text.clone(),
                    status: 202,
                    detail: "a request was accepted without an answer".into(),
                    challenge: None,
                }),
            );
        }
        // Named when the body is not JSON: an HTML error page says more so.
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        match self.read_body(response.into_body()).await {
            Ok(body) => {
                let body = with_paired_surrogates(Bytes::from(body), &self.upstream, &self.stats);
                // Usually one message; a server may put several on separate lines
                // (its notifications, then the reply): each is taken as it comes.
                let mut answered = false;
                let mut unreadable = None;
                // A tool's reply, usually the whole body, is skimmed: its result stays unread.
                let skimmed = skim_reply(&body, &self.pending);
                let messages = match skimmed {
                    Some((reply_id, reply)) => {
                        answered = self.settle(reply_id, reply, initialize) == Some(id);
                        &[][..]
                    }
                    None => &body[..],
                };
                for message in serde_json::Deserializer::from_slice(messages).into_iter::<Value>() {
                    match message {
                        Ok(message) => {
                            if self.dispatch(message, Some(id), initialize).await == Some(id) {
                                answered = true;
                            }
                        }
                        Err(error) => {
                            unreadable = Some(error);
                            break;
                        }
                    }
                }
                if !answered {
                    let cause = match unreadable {
                        Some(source) => ExchangeError::NotJson {
                            content_type: content_type
                                .unwrap_or_else(|| "no content type".to_string()),
                            source,
                        },
                        None => ExchangeError::NoReply,
                    };
                    self.complete(id, Err(self.broken(cause)));
                }
            }
            Err(error) => self.complete(id, Err(error)),
        }
    }

    /// A whole JSON body, within the message cap.
    async fn read_body(&self, mut body: Incoming) -> Result<Vec<u8>, ConnectionError> {
        let limit = self.max_message_bytes;
        // Sized by the length the response announces (within the limit): a megabyte
        // body is then not grown and copied a dozen times on its way in.
        let announced = usize::try_from(hyper::body::Body::size_hint(&body).lower()).unwrap_or(0);
        let mut bytes = Vec::with_capacity(announced.min(limit));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| self.broken(error))?;
            if let Ok(data) = frame.into_data() {
                if bytes.len() + data.len() > limit {
                    tracing::error!(upstream = %self.upstream, limit, "upstream sent a response over the message limit");
                    return Err(ConnectionError::TooLarge { limit });
                }
                bytes.extend_from_slice(&data);
            }
        }
        Ok(bytes)
    }

    /// Reads the event stream answering request `id`: its related messages, then
    /// its reply. A stream that ends early is resumed by its last event id.
    async fn read_request_stream(
        self: &Arc<Self>,
        id: u64,
        initialize: Option<u64>,
        mut body: Incoming,
    ) {
        let mut decoder = SseDecoder::new(self.max_message_bytes);
        let mut resumes = 0;
        loop {
            match self
                .pump(&mut body, &mut decoder, Some(id), initialize, Some(id))
                .await
            {
                Pumped::Answered => {
                    let drain = self.pump(&mut body, &mut decoder, Some(id), None, None);
                    let _ = tokio::time::timeout(DRAIN_AFTER_REPLY, drain).await;
                    return;
                }
                Pumped::Failed(error) => return self.complete(id, Err(self.broken(error))),
                Pumped::Ended => {}
            }
            let Some(last_event_id) = decoder.last_event_id.clone() else {
                break;
            };
            if resumes == MAX_RESUMES {
                break;
            }
            resumes += 1;
            tokio::time::sleep(retry_delay(&decoder)).await;
            match self.resume(&last_event_id).await {
                Some(resumed) => body = resumed,
                None => break,
            }
        }
        self.complete(id, Err(self.broken(ExchangeError::StreamEnded)));
    }

    /// GET with `Last-Event-ID`: the rest of an interrupted stream.
    async fn resume(&self, last_event_id: &str) -> Option<Incoming> {
        let last = HeaderValue::from_str(last_event_id).ok()?;
        let response = self
            .send(&self.url, |target| self.listen_request(target, Some(&last)))
            .await
            .ok()?;
        if response.status().is_success() && content_type_is(&response, EVENT_STREAM) {
            Some(response.into_body())
        } else {
            None
        }
    }

    /// A GET of the MCP endpoint (at `target`) for its event stream, resumed after
    /// `last_event_id` if given.
    pub(super) fn listen_request(
        &self,
        target: &Uri,
        last_event_id: Option<&HeaderValue>,
    ) -> Request<Full<Bytes>> {
        let mut request = self.request(Method::GET, target, Bytes::new());
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static(EVENT_STREAM));
        if let Some(last) = last_event_id {
            headers.insert("last-event-id", last.clone());
        }
        if let Some(session) = self.session_id() {
            headers.insert(SESSION_HEADER, session);
        }
        if let Some(version) = self.negotiated_version() {
            headers.insert(VERSION_HEADER, version);
        }
        request
    }

    /// The GET stream of a streamable HTTP session: messages the server sends on
    /// its own. Reopened when it ends; a server that cannot be reached any more
    /// closes the connection, so the supervisor notices without waiting for a call.
    pub(super) async fn listen(self: &Arc<Self>) {
        let mut decoder = SseDecoder::new(self.max_message_bytes);
        let mut failures = 0u32;
        loop {
            let last = decoder
                .last_event_id
                .as_deref()
                .and_then(|id| HeaderValue::from_str(id).ok());
            let listen = |target: &Uri| self.listen_request(target, last.as_ref());
            let response = match self.send(&self.url, listen).await {
                Ok(response) => response,
                Err(failure) if failure.is_connect() => {
                    let (_, reason) = self.unreachable(failure);
                    return self.close(&reason);
                }
                Err(failure @ SendFailure::Redirect(_)) => {
                    tracing::debug!(upstream = %self.upstream, error = %error_chain(&failure), "no GET event stream");
                    return;
                }
                Err(failure) => {
                    failures += 1;
                    tracing::debug!(upstream = %self.upstream, error = %error_chain(&failure), "the GET event stream failed");
                    tokio::time::sleep(retry_delay(&decoder) * failures.min(10)).await;
                    continue;
                }
            };
            let status = response.status();
            if status == StatusCode::METHOD_NOT_ALLOWED {
                tracing::debug!(upstream = %self.upstream, "the upstream offers no GET event stream");
                return;
            }
            if !status.is_success() || !content_type_is(&response, EVENT_STREAM) {
                let body = read_small(response).await;
                if status == StatusCode::NOT_FOUND && self.session_id().is_some() {
                    return self.close(SESSION_ENDED);
                }
                tracing::debug!(upstream = %self.upstream, status = status.as_u16(), body = %snippet(&body), "the upstream refused the GET event stream");
                return;
            }
            let mut body = response.into_body();
            match self.pump(&mut body, &mut decoder, None, None, None).await {
                // A broken stream is reopened at once: if the server is gone, the
                // connection attempt says so.
                Pumped::Failed(error) => {
                    failures += 1;
                    tracing::debug!(upstream = %self.upstream, reason = %error_chain(&error), "the GET event stream broke");
                    if failures > 1 {
                        tokio::time::sleep(retry_delay(&decoder)).await;
                    }
                }
                Pumped::Ended | Pumped::Answered => {
                    failures = 0;
                    tokio::time::sleep(retry_delay(&decoder)).await;
                }
            }
        }
    }

    /// Deletes the session (servers may refuse with 405).
    pub(super) async fn delete_session(&self, session: HeaderValue) {
        let version = self.negotiated_version();
        let delete = |target: &Uri| {
            let mut request = self.request(Method::DELETE, target, Bytes::new());
            request
                .headers_mut()
                .insert(SESSION_HEADER, session.clone());
            if let Some(version) = &version {
                request
                    .headers_mut()
                    .insert(VERSION_HEADER, version.clone());
            }
            request
        };
        match tokio::time::timeout(DELETE_TIMEOUT, self.send(&self.url, delete)).await {
            Ok(Ok(response)) => {
                tracing::debug!(upstream = %self.upstream, status = response.status().as_u16(), "deleted the upstream's session")
            }
            Ok(Err(failure)) => {
                tracing::debug!(upstream = %self.upstream, error = %error_chain(&failure), "deleting the upstream's session failed")
            }
            Err(_) => {
                tracing::debug!(upstream = %self.upstream, "deleting the upstream's session timed out")
            }
        }
    }
}

/// How long to wait before reopening an event stream: what the server asked, within reason.
fn retry_delay(decoder: &SseDecoder) -> Duration {
    decoder
        .retry_ms
        .map_or(DEFAULT_RETRY, Duration::from_millis)
        .min(MAX_RETRY)
}
