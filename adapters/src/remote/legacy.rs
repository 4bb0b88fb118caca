//! HTTP+SSE (2024-11-05): one GET event stream whose `endpoint` event names where
//! messages are POSTed; every answer arrives on that stream.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT};
use http::{Method, Uri};
use http_body_util::BodyExt as _;

use super::endpoint::{display_url, resolve_endpoint};
use super::inbound::Pumped;
use super::sse::{SseDecoder, SseItem};
use super::{authorization_hint, content_type_is, error_chain, read_small, Shared, EVENT_STREAM};

impl Shared {
    /// Opens the HTTP+SSE event stream and waits for its `endpoint` event; a task
    /// then reads the stream for the connection's life.
    pub(super) async fn open_legacy(self: &Arc<Self>) -> Result<Uri, String> {
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
            .map_err(|_| format!("no answer within {} ms", waited.as_millis()))?
            .map_err(|failure| failure.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET answered HTTP {}", status.as_u16()));
        }
        if !content_type_is(&response, EVENT_STREAM) {
            return Err("GET did not answer with an event stream".into());
        }
        let mut body = response.into_body();
        let mut decoder = SseDecoder::new(self.max_message_bytes);
        let mut items = Vec::new();
        let endpoint = tokio::time::timeout(waited, async {
            loop {
                let frame = match body.frame().await {
                    None => return Err("the stream ended before its `endpoint` event".to_string()),
                    Some(Err(error)) => return Err(error_chain(&error)),
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
        .map_err(|_| format!("no `endpoint` event within {} ms", waited.as_millis()))??;
        let endpoint = resolve_endpoint(&self.url, &endpoint)?;
        tracing::info!(upstream = %self.upstream, endpoint = %display_url(&endpoint), "HTTP+SSE event stream open");
        let shared = self.clone();
        tokio::spawn(async move {
            let read = async {
                shared.handle_items(&mut items, None, None).await;
                shared.pump(&mut body, &mut decoder, None, None, None).await
            };
            tokio::select! {
                pumped = read => {
                    let reason = match pumped {
                        Pumped::Failed(reason) => format!("the HTTP+SSE event stream broke: {reason}"),
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
    pub(super) async fn legacy_request(self: &Arc<Self>, id: u64, endpoint: &Uri, body: Bytes) {
        match self.post(endpoint, None, body, false).await {
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
