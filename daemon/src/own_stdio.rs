//! The process's own stdin and stdout as async streams, for the stdio front and
//! `plexus connect`. tokio's `stdin()` / `stdout()` hand every read and write to a
//! blocking thread: two thread wake-ups per message each way. An MCP host gives its
//! server pipes (or, from Node, Unix sockets); those are polled on the runtime
//! instead, like any socket, and pipes are widened as an upstream's are (one round
//! for a large message). Anything else (a terminal, a file, /dev/null) keeps
//! tokio's blocking streams.

use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::pin::Pin;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

pub type Input = Pin<Box<dyn AsyncRead + Send>>;
pub type Output = Pin<Box<dyn AsyncWrite + Send>>;

/// stdin and stdout, and the guard that puts their flags back.
pub struct OwnStdio {
    pub input: Input,
    pub output: Output,
    pub restore: Restore,
}

/// Puts the descriptors' file status flags back when dropped: the non-blocking
/// flag belongs to the open file, which the process that started plexus may share.
pub struct Restore {
    saved: Vec<(OwnedFd, OFlag)>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        for (fd, flags) in self.saved.drain(..) {
            let _ = fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags));
        }
    }
}

/// stdin and stdout, each polled on the runtime when it is a pipe or a socket.
/// stdout stays tokio's when stderr shares it: a log line must never meet a full
/// non-blocking pipe.
pub fn open() -> OwnStdio {
    // Both flags are read before either is changed: a host may hand one socket as both.
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let saved: Vec<(OwnedFd, OFlag)> = [stdin.as_fd(), stdout.as_fd()]
        .into_iter()
        .filter_map(|fd| {
            let fd = fd.try_clone_to_owned().ok()?;
            let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).ok()?;
            Some((fd, OFlag::from_bits_truncate(flags)))
        })
        .collect();
    let input = registered(stdin.as_fd(), |fd, kind| match kind {
        Kind::Pipe => {
            adapters::stdio::widen_pipe(fd.as_raw_fd(), "stdin");
            Some(Box::pin(pipe::Receiver::from_owned_fd(fd).ok()?) as Input)
        }
        Kind::Socket => Some(Box::pin(socket(fd)?) as Input),
    })
    .unwrap_or_else(|| Box::pin(tokio::io::stdin()));
    let output = (!same_file(stdout.as_fd(), std::io::stderr().as_fd()))
        .then(|| {
            registered(stdout.as_fd(), |fd, kind| match kind {
                Kind::Pipe => {
                    adapters::stdio::widen_pipe(fd.as_raw_fd(), "stdout");
                    Some(Box::pin(pipe::Sender::from_owned_fd(fd).ok()?) as Output)
                }
                Kind::Socket => Some(Box::pin(socket(fd)?) as Output),
            })
        })
        .flatten()
        .unwrap_or_else(|| Box::pin(tokio::io::stdout()));
    OwnStdio {
        input,
        output,
        // Restored in reverse, so a descriptor saved twice ends as it was first found.
        restore: Restore {
            saved: saved.into_iter().rev().collect(),
        },
    }
}

enum Kind {
    Pipe,
    Socket,
}

/// `make`'s stream over a copy of `fd`, when `fd` is a pipe or a socket.
fn registered<T>(fd: BorrowedFd<'_>, make: impl FnOnce(OwnedFd, Kind) -> Option<T>) -> Option<T> {
    let fd = fd.try_clone_to_owned().ok()?;
    let file_type = metadata(fd.as_fd())?.file_type();
    let kind = if file_type.is_fifo() {
        Kind::Pipe
    } else if file_type.is_socket() {
        Kind::Socket
    } else {
        return None;
    };
    make(fd, kind)
}

fn socket(fd: OwnedFd) -> Option<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true).ok()?;
    tokio::net::UnixStream::from_std(socket).ok()
}

fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (metadata(a), metadata(b)) {
        (Some(a), Some(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn metadata(fd: BorrowedFd<'_>) -> Option<Metadata> {
    File::from(fd.try_clone_to_owned().ok()?).metadata().ok()
}
