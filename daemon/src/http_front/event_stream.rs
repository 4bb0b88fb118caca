//! The event-stream writer: an answer that becomes a stream when related messages
//! come first, and the server-sent events themselves.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{answer_response, empty, modern_status};
use crate::client_message::ClientMessage;
use crate::cluster::{Cluster, PeerListen};
use crate::era::Era;
use crate::jsonrpc::Answer;
use crate::listener::Body;
use crate::session::{CloseOnDrop, Handled, Session};

pub(super) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// Answers one request. A quick answer is a plain JSON body; if a related message
/// (progress, a request from the upstream) comes first, the answer becomes an
/// event stream carrying those messages and then the response. A 2026-07-28
/// request's session was made for it alone, and ends with it; in a cluster its
/// answer's upstream names are sealed for the requesting principal.
pub(super) async fn answer_on_stream(
    session: Arc<Session>,
    message: ClientMessage,
    era: Era,
    cluster: Option<(Arc<Cluster>, Arc<str>)>,
    peers: Option<PeerListen>,
) -> Response<Body> {
    let modern = era == Era::Modern;
    let hub = session.hub().clone();
    let cluster_for_listen = cluster.clone().filter(|_| modern);
    let (related, mut related_messages) = mpsc::channel::<Value>(64);
    let mut handling = Box::pin(async move {
        // A session made for this one request ends with it.
        let _closing = modern.then(|| CloseOnDrop(session.clone()));
        let handled = match peers {
            None => session.handle(message, era, Some(&related)).await,
            // A listen: what the other nodes announce is merged into its stream.
            // Boxed: inline, the merge's future would be copied with every request's.
            Some(peers) => {
                Box::pin(async {
                    let (local, messages) = mpsc::channel::<Value>(64);
                    let serving = session.handle(message, era, Some(&local));
                    peers.merge(serving, messages, &related).await
                })
                .await
            }
        };
        match (handled, cluster) {
            // An upstream's paused round names this node and principal (in a cluster).
            (Handled::Respond(answer), Some((cluster, principal))) if modern => {
                Handled::Respond(cluster.seal_upstream_state(answer, &principal))
            }
            (handled, _) => handled,
        }
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
    // In a cluster, the tasks a 2026-07-28 listen names go out sealed, as the
    // client was given them.
    let sealing = cluster_for_listen;
    let event = move |message: &Value| match &sealing {
        Some((cluster, principal)) => {
            let mut message = message.clone();
            cluster.seal_listen_message(&mut message, principal);
            sse_event(&message)
        }
        None => sse_event(message),
    };
    let (frames, frame_stream) = mpsc::channel::<Bytes>(64);
    // Tracked by the hub, whose shutdown waits for it; it ends when plexus stops
    // at the latest (by then the fronts have answered and closed every stream).
    let stopping = hub.clone();
    hub.spawn(async move {
        if let Some(first) = first {
            if frames.send(event(&first)).await.is_err() {
                return;
            }
        }
        // Whatever was related to the request is sent before its answer.
        let finish = |handled: Handled, mut related: mpsc::Receiver<Value>| {
            let frames = frames.clone();
            let event = &event;
            async move {
                while let Ok(message) = related.try_recv() {
                    let _ = frames.send(event(&message)).await;
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
                        if frames.send(event(&message)).await.is_err() {
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
                () = stopping.stopping() => return,
            }
        }
    });
    let body = futures::stream::unfold(frame_stream, |mut frames| async move {
        let chunk = frames.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), frames))
    });
    event_stream_response(BodyExt::boxed_unsync(StreamBody::new(body)))
}

pub(super) fn event_stream_response(body: Body) -> Response<Body> {
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

pub(super) fn sse_event(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}
