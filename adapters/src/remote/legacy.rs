//! HTTP+SSE (2024-11-05): one GET event stream whose `endpoint` event names where
//! messages are POSTed; every answer arrives on that stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT};
use http::{Method, Uri};
use http_body_util::BodyExt as _;

use super::client::SendFailure;
use super::endpoint::{display_url, resolve_endpoint};
use super::head::Head;
use super::inbound::Pumped;
use super::sse::{SseDecoder, SseItem};
use super::{authorization_hint, content_type_is, read_small, Shared, EVENT_STREAM};
use crate::error_chain;

/// Why the HTTP+SSE event stream did not open.
#[derive(Debug, thiserror::Error)]
pub enum LegacyOpenError {
    #[error("no answer within {} ms", .0.as_millis())]
    NoAnswer(Duration),
    #[error(transparent)]
    Send(SendFailure),
    #[error("GET answered HTTP {0}")]
    Status(u16),
    #[error("GET did not answer with an event stream")]
    NotEventStream,
    #[error("the stream ended before its `endpoint` event")]
    EndedEarly,
    /// Reading the stream failed.
    #[error(transparent)]
    Body(hyper::Error),
    #[error("no `endpoint` event within {} ms", .0.as_millis())]
    NoEndpoint(Duration),
    /// The `endpoint` event names somewhere plexus does not post to.
    #[error("{0}")]
    BadEndpoint(String),
}

impl Shared {
    /// Opens the HTTP+SSE event stream and waits for its `endpoint` event; a task
    /// then reads the stream for the connection's life.
    pub(super) async fn open_legacy(self: &Arc<Self>) -> Result<Uri, LegacyOpenError> {
        let open = |target: &Uri| {
            let mut request = self.request(Method::GET, target, Bytes::new());
            request
                .headers_mut()
                .insert(ACCEPT, HeaderValue::from_static(EVENT_STREAM));
            request
        };
        let waited = self.connect_timeout;
        let response = tokio::time::timeout(waited, self.send(&self.url, open))
            .await
            .map_err(|_| LegacyOpenError::NoAnswer(waited))?
            .map_err(LegacyOpenError::Send)?;
        let status = response.status();
        if !status.is_success() {
            return Err(LegacyOpenError::Status(status.as_u16()));
        }
        if !content_type_is(&response, EVENT_STREAM) {
            return Err(LegacyOpenError::NotEventStream);
        }
        let mut body = response.into_body();
        let mut decoder = SseDecoder::new(self.max_message_bytes);
        let mut items = Vec::new();
        let endpoint = tokio::time::timeout(waited, async {
            loop {
                let frame = match body.frame().await {
                    None => return Err(LegacyOpenError::EndedEarly),
                    Some(Err(error)) => return Err(LegacyOpenError::Body(error)),
                    Some(Ok(frame)) => frame,
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                decoder.feed(&data, &mut items);
                let found = items.iter().position(|item| {
                    matches!(item, SseItem::Event { kind: Some(kind), .. } if kind == "endpoint")
                });
                if let Some(found) = found {
                    let rest = items.split_off(found + 1);
                    let endpoint = items.pop();
                    items = rest;
                    if let Some(SseItem::Event { data, .. }) = endpoint {
                        return Ok(String::from_utf8_lossy(&data).into_owned());
                    }
                }
                // Nothing may come before the endpoint: there is nowhere to answer yet.
                items.clear();
            }
        })
        .await
        .map_err(|_| LegacyOpenError::NoEndpoint(waited))??;
        let endpoint =
            resolve_endpoint(&self.url, &endpoint).map_err(LegacyOpenError::BadEndpoint)?;
        tracing::info!(upstream = %self.upstream, endpoint = %display_url(&endpoint), "HTTP+SSE event stream open");
        let shared = self.clone();
        self.tasks.spawn(async move {
            let read = async {
                shared.handle_items(&mut items, None, None).await;
                shared.pump(&mut body, &mut decoder, None, None, None).await
            };
            tokio::select! {
                pumped = read => {
                    let reason = match pumped {
                        Pumped::Failed(error) => format!("the HTTP+SSE event stream broke: {}", error_chain(&error)),
                        Pumped::Ended | Pumped::Answered => "the HTTP+SSE event stream ended".to_string(),
                    };
                    shared.close(&reason);
                }
                () = shared.closed.cancelled() => {}
            }
        });
        Ok(endpoint)
    }

    /// Posts request `id` to the HTTP+SSE endpoint; its reply comes on the event
    /// stream, so only a refusal completes it here.
    pub(super) async fn legacy_request(
        self: &Arc<Self>,
        id: u64,
        endpoint: &Uri,
        head: &Head,
        body: Bytes,
    ) {
        match self.post(endpoint, Some(head), body, false).await {
            Ok(response) => {
                let status = response.status();
                let hint = authorization_hint(&response);
                let body = read_small(response).await;
                if !status.is_success() {
                    self.refuse(id, status, &body, hint);
                }
            }
            Err(failure) => self.post_failed(id, failure),
        }
    }
}
