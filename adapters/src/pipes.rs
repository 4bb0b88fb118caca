//! A stdio connection's pipes at work, for a child and an in-process server
//! alike: the task writing the upstream's stdin, and the one reading what it
//! writes back, completing calls and handing on what it sends of its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use tokio::io::AsyncRead;
use tokio::net::unix::pipe;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::framing::{Frame, LineDecoder};
use crate::rpc::{
    classify, count_sampled, id_in_head, our_id, read_message, with_paired_surrogates,
    ConnectionError, ConnectionStats, Events, Incoming, PendingRequests, SharedPending, Spawned,
    UpstreamEvent,
};
use crate::stdin_writer::StdinWriter;

/// A connection's pipes at work: the task writing the upstream's stdin and the
/// one reading its output, on the connection's own tracker (its shutdown waits
/// for them).
pub(crate) struct Piped {
    pub(crate) pending: SharedPending,
    pub(crate) closed: CancellationToken,
    pub(crate) stop: CancellationToken,
    pub(crate) stats: Arc<ConnectionStats>,
    pub(crate) writer: Arc<StdinWriter>,
    pub(crate) tasks: TaskTracker,
}

impl Piped {
    /// The connection, its transport made from the stdin writer.
    pub(crate) fn spawned<T>(
        self,
        upstream: Arc<str>,
        transport: impl FnOnce(Arc<StdinWriter>) -> T,
    ) -> Spawned<T> {
        Spawned {
            upstream,
            pending: self.pending,
            closed: self.closed,
            stop: self.stop,
            stats: self.stats,
            tasks: self.tasks,
            transport: transport(self.writer),
        }
    }
}

/// Starts writing to `stdin` and reading `stdout`: the wiring a child and an
/// in-process server share.
pub(crate) fn pipe_up<R: AsyncRead + Unpin + Send + 'static>(
    upstream: &Arc<str>,
    (stdin, stdout): (pipe::Sender, R),
    stats: Arc<ConnectionStats>,
    max_message_bytes: usize,
    events: Events,
) -> Piped {
    let pending: SharedPending = Arc::new(PendingRequests::default());
    let closed = CancellationToken::new();
    let stop = CancellationToken::new();
    stats.spawns.fetch_add(1, Ordering::Relaxed);
    let writer = StdinWriter::new(stdin);
    let tasks = TaskTracker::new();
    tasks.spawn(writer.clone().flush_loop(stop.clone()));
    tasks.spawn(read_loop(ReadLoop {
        upstream: upstream.clone(),
        stdout,
        pending: pending.clone(),
        events,
        stats: stats.clone(),
        max_message_bytes,
        closed: closed.clone(),
        stop: stop.clone(),
    }));
    Piped {
        pending,
        closed,
        stop,
        stats,
        writer,
        tasks,
    }
}

/// The task reading the upstream's stdout (or, in process, its pipe).
pub(crate) struct ReadLoop<R> {
    pub(crate) upstream: Arc<str>,
    pub(crate) stdout: R,
    pub(crate) pending: SharedPending,
    pub(crate) events: Events,
    pub(crate) stats: Arc<ConnectionStats>,
    pub(crate) max_message_bytes: usize,
    pub(crate) closed: CancellationToken,
    pub(crate) stop: CancellationToken,
}

pub(crate) async fn read_loop<R: AsyncRead + Unpin>(state: ReadLoop<R>) {
    let ReadLoop {
        upstream,
        stdout,
        pending,
        events,
        stats,
        max_message_bytes,
        closed,
        stop,
    } = state;
    let mut frames = FramedRead::new(stdout, LineDecoder::new(max_message_bytes));
    while let Some(frame) = frames.next().await {
        let line = match frame {
            // Frozen, so an unread result can keep the line rather than a copy of its part.
            Ok(Frame::Line(line)) => line.freeze(),
            Ok(Frame::TooLong { limit, head }) => {
                // The call it answered learns why. A line that names no call (not JSON,
                // or its id not in its head) could belong to any: every call in flight
                // learns what happened, rather than that the upstream "exited".
                let id = id_in_head(&head);
                let json = head
                    .iter()
                    .find(|b| !b.is_ascii_whitespace())
                    .is_some_and(|b| *b == b'{' || *b == b'[');
                tracing::error!(upstream = %upstream, limit, ?id, json, "upstream wrote a line longer than max_message_bytes; restarting it");
                match id {
                    Some(id) => {
                        pending.complete(id, Err(ConnectionError::TooLarge { limit }));
                    }
                    None => pending.fail_all(ConnectionError::TooLarge { limit }),
                }
                stop.cancel();
                break;
            }
            Err(error) => {
                tracing::warn!(upstream = %upstream, %error, "reading upstream stdout failed");
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line = with_paired_surrogates(line, &upstream, &stats);
        let message = match read_message(line.clone(), &pending) {
            Ok(message) => message,
            Err(error) => {
                // A reply plexus cannot read fails its call now, not at its deadline.
                if pending.fail_unreadable(&upstream, &line, error).is_none() {
                    note_dropped_line(&upstream, &stats, &line);
                }
                continue;
            }
        };
        match message {
            // A batch (JSON-RPC 2.0; MCP until 2025-06-18): each of its messages in turn.
            Incoming::Batch(batch) => {
                for message in batch {
                    let message = classify(message);
                    if !handle(message, &upstream, &pending, &events, &stats).await {
                        note_dropped_line(&upstream, &stats, &line);
                    }
                }
            }
            message => {
                if !handle(message, &upstream, &pending, &events, &stats).await {
                    note_dropped_line(&upstream, &stats, &line);
                }
            }
        }
    }
    // Closed first, so no new request can register after the sweep.
    closed.cancel();
    pending.fail_all(ConnectionError::Closed);
}

/// Completes the request a reply answers, or hands on what the upstream sent on
/// its own. False for what is not a JSON-RPC message (a batch within a batch too).
async fn handle(
    message: Incoming,
    upstream: &str,
    pending: &PendingRequests,
    events: &Events,
    stats: &ConnectionStats,
) -> bool {
    match message {
        Incoming::Reply { id, reply } => {
            let completed = our_id(&id).is_some_and(|id| pending.complete(id, Ok(reply)));
            if !completed {
                stats.late_replies.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(upstream, %id, "dropped a reply nobody waits for");
            }
        }
        Incoming::Notification(message) => {
            events
                .deliver(upstream, UpstreamEvent::Notification(message))
                .await
        }
        Incoming::Request(message) => {
            let event = UpstreamEvent::Request {
                message,
                origin: None,
            };
            events.deliver(upstream, event).await
        }
        Incoming::Hollow { id } => return pending.fail_hollow(upstream, &id).is_some(),
        Incoming::Batch(_) | Incoming::Invalid => return false,
    }
    true
}

fn note_dropped_line(upstream: &str, stats: &ConnectionStats, line: &[u8]) {
    if let Some(count) = count_sampled(&stats.dropped_stdout_lines) {
        let sample = String::from_utf8_lossy(&line[..line.len().min(200)]);
        tracing::warn!(upstream, count, line = %sample, "dropped a non-JSON-RPC line on upstream stdout");
    }
}
