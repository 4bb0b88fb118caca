//! What the upstream sends, on any event stream or in a JSON body: replies
//! complete their requests, the rest become events.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::Value;

use super::sse::{SseDecoder, SseItem};
use super::Shared;
use crate::rpc::{
    classify, count_sampled, id_in_head, our_id, skim_reply, with_paired_surrogates,
    ConnectionError, Incoming as Classified, Reply, UpstreamEvent,
};

/// How reading an event stream ended.
pub(super) enum Pumped {
    /// The reply awaited arrived.
    Answered,
    Ended,
    Failed(hyper::Error),
}
impl Shared {
    /// Reads events from `body` until it ends, fails, or (with `awaited`) that
    /// request's reply arrives. Requests on it are attributed to `origin`.
    pub(super) async fn pump(
        self: &Arc<Self>,
        body: &mut Incoming,
        decoder: &mut SseDecoder,
        origin: Option<u64>,
        initialize: Option<u64>,
        awaited: Option<u64>,
    ) -> Pumped {
        let mut items = Vec::new();
        loop {
            let frame = match body.frame().await {
                None => return Pumped::Ended,
                Some(Err(error)) => return Pumped::Failed(error),
                Some(Ok(frame)) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            decoder.feed(&data, &mut items);
            let answered = self.handle_items(&mut items, origin, initialize).await;
            if awaited.is_some() && answered.contains(&awaited) {
                return Pumped::Answered;
            }
        }
    }

    /// Handles decoded events; returns the ids of the replies among them.
    pub(super) async fn handle_items(
        self: &Arc<Self>,
        items: &mut Vec<SseItem>,
        origin: Option<u64>,
        initialize: Option<u64>,
    ) -> Vec<Option<u64>> {
        let mut answered = Vec::new();
        for item in items.drain(..) {
            match item {
                SseItem::Event { kind, data } => {
                    if data.iter().all(u8::is_ascii_whitespace)
                        || kind.as_deref().is_some_and(|kind| kind != "message")
                    {
                        // Priming events, keep-alives, and event types that carry no message.
                        continue;
                    }
                    let data =
                        with_paired_surrogates(Bytes::from(data), &self.upstream, &self.stats);
                    if let Some((id, reply)) = skim_reply(&data, &self.pending) {
                        answered.push(self.settle(id, reply, initialize));
                        continue;
                    }
                    match serde_json::from_slice::<Value>(&data) {
                        Ok(message) => {
                            answered.push(self.dispatch(message, origin, initialize).await)
                        }
                        // A reply plexus cannot read fails its call now, not at its deadline.
                        Err(error) => {
                            match self.pending.fail_unreadable(&self.upstream, &data, error) {
                                Some(id) => answered.push(Some(id)),
                                None => self.note_dropped(&data),
                            }
                        }
                    }
                }
                SseItem::TooLong { head } => {
                    let limit = self.max_message_bytes;
                    let id = id_in_head(&head);
                    tracing::error!(upstream = %self.upstream, limit, ?id, "upstream sent an event over the message limit; dropped it");
                    if let Some(id) = id {
                        self.complete(id, Err(ConnectionError::TooLarge { limit }));
                        answered.push(Some(id));
                    }
                }
            }
        }
        answered
    }

    /// Routes one message (or a batch): replies complete their requests, the rest
    /// become events. Returns the id of the last reply among them.
    pub(super) async fn dispatch(
        self: &Arc<Self>,
        message: Value,
        origin: Option<u64>,
        initialize: Option<u64>,
    ) -> Option<u64> {
        // A batch is split where every transport's messages are classified.
        let messages = match classify(message) {
            Classified::Batch(batch) => batch.into_iter().map(classify).collect(),
            single => vec![single],
        };
        let mut answered = None;
        for message in messages {
            let event = match message {
                Classified::Reply { id, reply } => {
                    if let Some(id) = self.settle(id, reply, initialize) {
                        answered = Some(id);
                    }
                    continue;
                }
                Classified::Hollow { id } => {
                    match self.pending.fail_hollow(&self.upstream, &id) {
                        Some(id) => answered = Some(id),
                        None => self.note_dropped(b"(a reply with neither result nor error)"),
                    }
                    continue;
                }
                Classified::Notification(message) => UpstreamEvent::Notification(message),
                Classified::Request(message) => UpstreamEvent::Request { message, origin },
                // A batch within a batch is not a message.
                Classified::Batch(_) | Classified::Invalid => {
                    self.note_dropped(b"(not a JSON-RPC message)");
                    continue;
                }
            };
            self.events.deliver(&self.upstream, event).await;
        }
        answered
    }

    /// Completes the request a reply answers; its id, if plexus sent it.
    pub(super) fn settle(
        self: &Arc<Self>,
        id: Value,
        reply: Reply,
        initialize: Option<u64>,
    ) -> Option<u64> {
        let Some(id) = our_id(&id) else {
            tracing::debug!(upstream = %self.upstream, %id, "dropped a reply to an id plexus never sent");
            return None;
        };
        if Some(id) == initialize {
            if let Reply::Result(result) = &reply {
                self.initialized(result);
            }
        }
        if !self.pending.complete(id, Ok(reply)) {
            self.stats.late_replies.fetch_add(1, Ordering::Relaxed);
        }
        Some(id)
    }

    pub(super) fn note_dropped(&self, data: &[u8]) {
        if let Some(count) = count_sampled(&self.stats.dropped_stdout_lines) {
            let sample = String::from_utf8_lossy(&data[..data.len().min(200)]);
            tracing::warn!(upstream = %self.upstream, count, event = %sample, "dropped an event that is not a JSON-RPC message");
        }
    }
}
