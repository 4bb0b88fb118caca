//! The stdio front: one client on the daemon's stdin/stdout. stdout carries
//! protocol messages only; every log line goes to stderr.

use std::sync::Arc;

use adapters::framing::{Frame, LineDecoder};
use futures::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client_message::{ClientMessage, KnownCapabilities};
use crate::era::Era;
use crate::hub::Hub;
use crate::jsonrpc::{self, Answer, RelayError};
use crate::session::{Continuations, Handled, Identity, Session};

/// Longest line accepted from the client.
pub const MAX_CLIENT_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Serves one client until its input ends or `shutdown`; in-flight requests then
/// get up to `drain` to finish before they are cancelled. Returns once every
/// answer has been written.
pub async fn serve<R, W>(
    hub: Arc<Hub>,
    input: R,
    output: W,
    view: Option<Arc<str>>,
    shutdown: CancellationToken,
    drain: impl Fn() -> std::time::Duration,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let paused = Arc::new(Continuations::new(&hub));
    let (session, mut events) = Session::new(hub.clone(), paused.clone(), Identity::local(view));
    let metrics_gauge = hub.metrics().sessions_active.with_label_values(&["stdio"]);
    metrics_gauge.inc();
    let (replies, mut outgoing) = mpsc::channel::<Answer>(256);
    // Ends when every reply sender is gone; aborted if serving is dropped.
    let mut writer = tokio::task::JoinSet::new();
    writer.spawn(async move {
        let mut output = output;
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                biased;
                reply = outgoing.recv() => match reply {
                    Some(reply) => {
                        // A request's progress and log messages go out before its response.
                        while let Ok(event) = events.try_recv() {
                            batch.push(Answer::from(event));
                        }
                        batch.push(reply);
                    }
                    None => break,
                },
                Some(event) = events.recv() => batch.push(Answer::from(event)),
            }
            let mut lines = Vec::new();
            for message in batch.drain(..) {
                message.write_to(&mut lines);
                lines.push(b'\n');
            }
            if output.write_all(&lines).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });

    let requests = TaskTracker::new();
    let known = KnownCapabilities::default();
    let mut lines = FramedRead::new(input, LineDecoder::new(MAX_CLIENT_LINE_BYTES));
    loop {
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            frame = lines.next() => frame,
        };
        let line = match frame {
            Some(Ok(Frame::Line(line))) => line,
            Some(Ok(Frame::TooLong { limit, .. })) => {
                let error = RelayError::RequestTooLarge { limit };
                let _ = replies
                    .send(jsonrpc::error_response(Value::Null, &error).into())
                    .await;
                continue;
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "reading stdin failed");
                break;
            }
            None => break,
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message = match ClientMessage::read_served(line.freeze(), &known) {
            Ok(message) => message,
            Err(error) => {
                let error = RelayError::Parse(error.to_string());
                let _ = replies
                    .send(jsonrpc::error_response(Value::Null, &error).into())
                    .await;
                continue;
            }
        };
        let is_request =
            message.message.get("id").is_some() && message.message.get("method").is_some();
        // One client, either era: a 2026-07-28 request is one that comes before any
        // `initialize` and declares its version (decided here, carried down).
        let era = Era::of_message(session.initialized(), &message.message);
        if is_request {
            // Requests run concurrently: a slow tool must not hold up a quick one.
            let session = session.clone();
            let replies = replies.clone();
            requests.spawn(async move {
                if let Handled::Respond(response) = session.handle(message, era, None).await {
                    let _ = replies.send(response).await;
                }
            });
        } else if let Handled::Respond(response) = session.handle(message, era, None).await {
            // Notifications (a cancel above all) are handled in order, at once.
            let _ = replies.send(response).await;
        }
    }
    requests.close();
    if tokio::time::timeout(drain(), requests.wait())
        .await
        .is_err()
    {
        tracing::warn!("requests still running after the drain deadline; cancelling them");
    }
    session.close();
    // Paused calls will not be retried now: release them and their upstream requests.
    paused.clear();
    requests.wait().await;
    drop(replies);
    while writer.join_next().await.is_some() {}
    metrics_gauge.dec();
}
