//! Writing lines to a child's stdin. A line is written straight from the caller when
//! the pipe has room (no task hand-off on the hot path) and queued for the flushing
//! task otherwise. Writes happen under a lock and never across an await, so lines
//! keep their order and a caller that is cancelled never leaves half a line.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Lines waiting for room in the pipe before the writer gives up on the child:
/// an upstream that reads nothing for this long is broken.
const MAX_BACKLOG_LINES: usize = 16 * 1024;

pub(crate) struct StdinWriter {
    state: Mutex<State>,
    wake: Notify,
}

struct State {
    /// `None` once closed: stdin was dropped, which the child reads as EOF.
    pipe: Option<Arc<pipe::Sender>>,
    /// Lines not yet fully written, oldest first, with how much of the first went out.
    backlog: VecDeque<Vec<u8>>,
    written_of_first: usize,
}

/// The line could not be queued: stdin is closed.
#[derive(Debug)]
pub(crate) struct Closed;

impl StdinWriter {
    pub(crate) fn new(pipe: pipe::Sender) -> Arc<StdinWriter> {
        Arc::new(StdinWriter {
            state: Mutex::new(State {
                pipe: Some(Arc::new(pipe)),
                backlog: VecDeque::new(),
                written_of_first: 0,
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes or queues one complete line.
    pub(crate) fn send(&self, line: Vec<u8>) -> Result<(), Closed> {
        let mut state = self.lock();
        let Some(pipe) = state.pipe.clone() else {
            return Err(Closed);
        };
        if state.backlog.is_empty() {
            match pipe.try_write(&line) {
                Ok(written) if written == line.len() => return Ok(()),
                Ok(written) => state.written_of_first = written,
                Err(error) if error.kind() == ErrorKind::WouldBlock => state.written_of_first = 0,
                Err(_) => {
                    state.pipe = None;
                    return Err(Closed);
                }
            }
        } else if state.backlog.len() >= MAX_BACKLOG_LINES {
            tracing::error!(
                lines = MAX_BACKLOG_LINES,
                "upstream stopped reading its stdin; closing it"
            );
            state.pipe = None;
            state.backlog.clear();
            drop(state);
            self.wake.notify_one();
            return Err(Closed);
        }
        state.backlog.push_back(line);
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    /// Closes stdin (the polite stop signal); queued lines are dropped.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.pipe = None;
        state.backlog.clear();
        drop(state);
        self.wake.notify_one();
    }

    /// Writes queued lines whenever the pipe has room, until closed or `stop`.
    pub(crate) async fn flush_loop(self: Arc<Self>, stop: CancellationToken) {
        loop {
            // Drain what the pipe takes now; remember the pipe to wait on if it is full.
            let blocked_on = {
                let mut state = self.lock();
                let Some(pipe) = state.pipe.clone() else {
                    return;
                };
                let mut blocked = None;
                while let Some(line) = state.backlog.front() {
                    let start = state.written_of_first;
                    match pipe.try_write(&line[start..]) {
                        Ok(written) if start + written == line.len() => {
                            state.backlog.pop_front();
                            state.written_of_first = 0;
                        }
                        Ok(written) => state.written_of_first = start + written,
                        Err(error) if error.kind() == ErrorKind::WouldBlock => {
                            blocked = Some(pipe.clone());
                            break;
                        }
                        Err(_) => {
                            state.pipe = None;
                            state.backlog.clear();
                            return;
                        }
                    }
                }
                blocked
            };
            tokio::select! {
                _ = stop.cancelled() => {
                    self.close();
                    return;
                }
                ready = wait_writable(blocked_on) => if ready.is_err() {
                    self.close();
                    return;
                },
                _ = self.wake.notified() => {}
            }
        }
    }
}

/// Resolves when a full pipe has room again; never, when nothing is blocked.
async fn wait_writable(pipe: Option<Arc<pipe::Sender>>) -> std::io::Result<()> {
    match pipe {
        Some(pipe) => pipe.writable().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn lines_arrive_whole_and_in_order_even_when_the_pipe_is_full() {
        let (sender, mut receiver) = pipe::pipe().unwrap();
        let writer = StdinWriter::new(sender);
        let stop = CancellationToken::new();
        tokio::spawn(writer.clone().flush_loop(stop.clone()));
        // Far more than a pipe buffer holds, so most lines go through the backlog.
        let lines: Vec<Vec<u8>> = (0..2000)
            .map(|n| format!("{n:05}{}\n", "x".repeat(500)).into_bytes())
            .collect();
        for line in &lines {
            writer.send(line.clone()).unwrap();
        }
        let mut received = vec![0u8; lines.iter().map(Vec::len).sum()];
        receiver.read_exact(&mut received).await.unwrap();
        assert_eq!(received, lines.concat());
        writer.close();
        assert!(writer.send(b"late\n".to_vec()).is_err());
        let mut rest = Vec::new();
        receiver.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "nothing after close, and EOF reached");
        stop.cancel();
    }
}
