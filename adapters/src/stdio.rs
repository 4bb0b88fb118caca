//! A supervised stdio upstream: one child process in its own process group, one
//! task per pipe; the connection's handle stops the whole group.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::launch::{clean_environment, resolve_program, LaunchError, LaunchSpec};
use crate::pipes::pipe_up;
use crate::request_line::{encode_request, Merge, Params};
pub use crate::rpc::ConnectionStats;
use crate::rpc::Spawned;
use crate::rpc::{ConnectionError, Events};
use crate::stdin_writer::StdinWriter;

/// Limits and timings of one stdio connection.
#[derive(Clone, Debug)]
pub struct StdioOptions {
    /// Longest accepted stdout line.
    pub max_message_bytes: usize,
    /// How long a stopping child gets after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
    /// Lines of stderr kept for status and error reports.
    pub stderr_ring_lines: usize,
    /// Counters, shared so they can outlive one connection (an upstream's restarts).
    pub stats: Arc<ConnectionStats>,
    /// Told of the child's process group, to kill it if the daemon dies first.
    pub keeper: Option<Arc<crate::keeper::Keeper>>,
}

impl Default for StdioOptions {
    fn default() -> Self {
        StdioOptions {
            max_message_bytes: 16 * 1024 * 1024,
            stop_grace: Duration::from_secs(5),
            stderr_ring_lines: 50,
            stats: Arc::new(ConnectionStats::default()),
            keeper: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("could not start `{program}`: {source}")]
    Io {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The system says only "not found" either way: the directory is named.
    #[error("could not start `{program}`: its directory (`cwd`) {cwd} does not exist")]
    NoCwd { program: String, cwd: String },
}

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitReport {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => write!(f, "signal {signal}"),
            (None, None) => write!(f, "unknown exit"),
        }
    }
}

/// How much a pipe to or from a child holds. At the default 64 KiB, a 1 MiB message
/// crosses in sixteen or more write, wake-up and read rounds; the kernel fills a
/// pipe's pages only as data arrives, so an idle pipe costs no more for it.
const PIPE_BYTES: i32 = 1024 * 1024;

/// Raises the capacity of a pipe (a child's, or plexus's own stdin and stdout) to
/// [`PIPE_BYTES`], as far as the system allows (`/proc/sys/fs/pipe-max-size`, 1 MiB
/// by default); at the default otherwise. `pipe` names it in the log.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn widen_pipe(fd: std::os::fd::RawFd, pipe: &str) {
    use nix::fcntl::{fcntl, FcntlArg};
    if let Err(error) = fcntl(fd, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES)) {
        tracing::debug!(pipe, %error, "pipe capacity left at the default");
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn widen_pipe(_fd: std::os::fd::RawFd, _pipe: &str) {}

/// The stdio side of an `UpstreamConnection`: the child's stdin, its exit, and
/// the tail of its stderr.
pub(crate) struct StdioTransport {
    pub(crate) writer: Arc<StdinWriter>,
    pub(crate) exit: watch::Receiver<Option<ExitReport>>,
    pub(crate) pid: Option<u32>,
    pub(crate) stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        // Last handle gone without a graceful stop: never leave the group behind.
        if self.exit.borrow().is_none() {
            if let Some(pid) = self.pid {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

impl StdioTransport {
    pub(crate) fn send_request(
        &self,
        id: u64,
        method: &str,
        params: Params,
        merge: Merge,
    ) -> Result<(), ConnectionError> {
        self.send_line(encode_request(id, method, params, merge))
    }

    pub(crate) fn send_line(&self, line: Vec<u8>) -> Result<(), ConnectionError> {
        self.writer.send(line).map_err(|_| ConnectionError::NotSent)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub(crate) fn stderr_tail(&self) -> Vec<String> {
        let tail = self
            .stderr_tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tail.iter().cloned().collect()
    }

    pub(crate) async fn wait_exit(&self) -> ExitReport {
        let mut exit = self.exit.clone();
        loop {
            if let Some(report) = *exit.borrow_and_update() {
                return report;
            }
            if exit.changed().await.is_err() {
                return ExitReport {
                    code: None,
                    signal: None,
                };
            }
        }
    }
}

/// Starts the child described by `spec`. Messages the upstream sends on its own
/// (notifications, server-to-client requests) go to `events`.
pub(crate) fn spawn(
    upstream: Arc<str>,
    spec: &LaunchSpec,
    options: &StdioOptions,
    events: Events,
) -> Result<Spawned<StdioTransport>, SpawnError> {
    let parent = std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)));
    let env = clean_environment(parent, &spec.env);
    let program = resolve_program(&spec.program, env.get("PATH").map(String::as_str))?;
    let mut command = Command::new(&program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so stopping it reaches grandchildren (npx → npm → sh → node).
        .process_group(0)
        .kill_on_drop(false);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    let mut child =
        command.spawn().map_err(
            |source| match spec.cwd.as_ref().filter(|cwd| !cwd.is_dir()) {
                Some(cwd) => SpawnError::NoCwd {
                    program: spec.program.clone(),
                    cwd: cwd.display().to_string(),
                },
                None => SpawnError::Io {
                    program: spec.program.clone(),
                    source,
                },
            },
        )?;
    let pid = child.id();
    if let (Some(keeper), Some(group)) = (&options.keeper, pid) {
        keeper.watch(group);
    }
    tracing::info!(
        upstream = %upstream,
        pid = pid.unwrap_or_default(),
        program = %program.display(),
        argv = ?spec.args,
        "spawned upstream"
    );
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(SpawnError::Io {
            program: spec.program.clone(),
            source: std::io::Error::other("child pipes were not created"),
        });
    };

    widen_pipe(stdin.as_raw_fd(), &upstream);
    widen_pipe(stdout.as_raw_fd(), &upstream);

    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let stdin = stdin
        .into_owned_fd()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
        .map_err(|source| SpawnError::Io {
            program: spec.program.clone(),
            source,
        })?;
    let piped = pipe_up(
        &upstream,
        (stdin, stdout),
        options.stats.clone(),
        options.max_message_bytes,
        events,
    );
    let (exit_tx, exit) = watch::channel(None);
    let stderr_done = CancellationToken::new();
    piped.tasks.spawn(stderr_loop(
        upstream.clone(),
        stderr,
        stderr_tail.clone(),
        options.stderr_ring_lines,
        options.stats.clone(),
        stderr_done.clone(),
    ));
    piped.tasks.spawn(child_loop(
        upstream.clone(),
        child,
        piped.stop.clone(),
        options.stop_grace,
        (exit_tx, stderr_done),
        options.keeper.clone(),
    ));

    Ok(piped.spawned(upstream, |writer| StdioTransport {
        writer,
        exit,
        pid,
        stderr_tail,
    }))
}

/// Bytes read from an upstream's stderr at once: a flood is drained in few reads.
const STDERR_READ_BYTES: usize = 64 * 1024;
/// A stderr line longer than this is cut (its head kept, the rest dropped).
const STDERR_LINE_BYTES: usize = 16 * 1024;

async fn stderr_loop(
    upstream: Arc<str>,
    mut stderr: ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
    ring_lines: usize,
    stats: Arc<ConnectionStats>,
    done: CancellationToken,
) {
    use tokio::io::AsyncReadExt;
    let _done = done.drop_guard();
    let mut lines = StderrLines {
        upstream,
        tail,
        ring_lines,
        stats,
        budget: LogBudget::new(tokio::time::Instant::now()),
        partial: Vec::new(),
        discarding: false,
    };
    let mut chunk = vec![0; STDERR_READ_BYTES];
    // One timer for the summaries, moved rather than made anew for each read (a
    // flood is thousands of reads a second).
    let summary = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(summary);
    // Always drained: a child blocked on a full stderr pipe stops answering.
    loop {
        // Lines left out are counted in the log once it has room again, whether or
        // not the upstream writes more: a burst that ends must not hide its count.
        let due = lines.budget.summary_due();
        if let Some(due) = due {
            if summary.deadline() != due {
                summary.as_mut().reset(due);
            }
        }
        // A read is cancellation-safe: the timer firing loses no bytes.
        let read = tokio::select! {
            read = stderr.read(&mut chunk) => read,
            () = &mut summary, if due.is_some() => {
                if let Some(suppressed) = lines.budget.summarise(tokio::time::Instant::now()) {
                    log_suppressed(&lines.upstream, suppressed);
                }
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(read) => lines.take(&chunk[..read], tokio::time::Instant::now()),
        }
    }
    lines.end(tokio::time::Instant::now());
}

fn log_suppressed(upstream: &str, suppressed: u64) {
    tracing::warn!(target: "plexus::upstream_stderr", upstream = %upstream, suppressed, "{suppressed} stderr lines suppressed");
}

/// An upstream's stderr cut into lines at the cost of counting them: a line is
/// built (a `String`) only when the log takes it or it is among the last ones,
/// which the ring keeps; a flood's other lines are counted, never copied.
struct StderrLines {
    upstream: Arc<str>,
    tail: Arc<Mutex<VecDeque<String>>>,
    ring_lines: usize,
    stats: Arc<ConnectionStats>,
    budget: LogBudget,
    /// The start of a line whose end has not come yet.
    partial: Vec<u8>,
    /// Within a line already reported cut: dropped up to its newline.
    discarding: bool,
}

impl StderrLines {
    /// Takes what one read returned.
    fn take(&mut self, mut data: &[u8], now: tokio::time::Instant) {
        if self.discarding {
            let Some(newline) = memchr::memchr(b'\n', data) else {
                return;
            };
            data = &data[newline + 1..];
            self.discarding = false;
        }
        let count = memchr::memchr_iter(b'\n', data).count();
        if count == 0 {
            self.keep_partial(data, now);
            return;
        }
        self.stats
            .stderr_lines
            .fetch_add(count as u64, Ordering::Relaxed);
        // The log gets a burst, then a steady trickle and a count of what it
        // missed: the first lines while it has room, then none of this read's.
        let mut start = 0;
        let mut logged = 0;
        for end in memchr::memchr_iter(b'\n', data) {
            match self.budget.take(now) {
                Admit::Log { suppressed } => {
                    let text = self.text(logged == 0, &data[start..end]);
                    self.log(suppressed, &text);
                }
                Admit::Suppress => break,
            }
            logged += 1;
            start = end + 1;
        }
        let suppressed = count - logged;
        if suppressed > 0 {
            // `take` counted the first of them.
            self.budget.suppressed += (suppressed - 1) as u64;
            self.stats
                .stderr_suppressed
                .fetch_add(suppressed as u64, Ordering::Relaxed);
        }
        // The ring keeps the last lines, whole: only those are built.
        let kept = count.min(self.ring_lines);
        let ends: Vec<usize> = memchr::memrchr_iter(b'\n', data).take(kept + 1).collect();
        let mut texts = Vec::with_capacity(kept);
        for at in (0..kept).rev() {
            let start = ends.get(at + 1).map_or(0, |end| end + 1);
            let first = at + 1 == count;
            texts.push(self.text(first, &data[start..ends[at]]));
        }
        self.keep(texts);
        self.partial.clear();
        self.keep_partial(&data[ends[0] + 1..], now);
    }

    /// Bytes after the last newline: the start of the next line, cut (and reported
    /// at once, as a line) if it outgrows the cap before its end.
    fn keep_partial(&mut self, data: &[u8], now: tokio::time::Instant) {
        self.partial.extend_from_slice(data);
        if self.partial.len() > STDERR_LINE_BYTES {
            let text = cut_line(&self.partial);
            self.partial.clear();
            self.discarding = true;
            self.one(text, now);
        }
    }

    /// The output has ended: a last line without a newline still counts.
    fn end(mut self, now: tokio::time::Instant) {
        if !self.partial.is_empty() {
            let text = self.text(true, &[]);
            self.one(text, now);
        }
        let suppressed = self.budget.suppressed;
        if suppressed > 0 {
            log_suppressed(&self.upstream, suppressed);
        }
    }

    /// One line, built: counted, logged if the budget allows, kept in the ring.
    fn one(&mut self, text: String, now: tokio::time::Instant) {
        self.stats.stderr_lines.fetch_add(1, Ordering::Relaxed);
        match self.budget.take(now) {
            Admit::Log { suppressed } => self.log(suppressed, &text),
            Admit::Suppress => {
                self.stats.stderr_suppressed.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.keep(vec![text]);
    }

    fn log(&self, suppressed: u64, text: &str) {
        if suppressed > 0 {
            log_suppressed(&self.upstream, suppressed);
        }
        tracing::info!(target: "plexus::upstream_stderr", upstream = %self.upstream, "{text}");
    }

    /// A line's text: `segment`, after the partial line when it is the first
    /// line of a read; cut if over the cap; without a trailing `\r`.
    fn text(&self, first: bool, segment: &[u8]) -> String {
        let whole;
        let line = if first && !self.partial.is_empty() {
            whole = [self.partial.as_slice(), segment].concat();
            whole.as_slice()
        } else {
            segment
        };
        if line.len() > STDERR_LINE_BYTES {
            return cut_line(line);
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        String::from_utf8_lossy(line).into_owned()
    }

    /// The ring's newest lines, oldest first; older ones leave to make room.
    fn keep(&self, texts: Vec<String>) {
        if self.ring_lines == 0 {
            return;
        }
        let mut tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        for text in texts {
            if tail.len() >= self.ring_lines {
                tail.pop_front();
            }
            tail.push_back(text);
        }
    }
}

fn cut_line(line: &[u8]) -> String {
    format!(
        "{}… [a stderr line over {STDERR_LINE_BYTES} bytes was cut]",
        String::from_utf8_lossy(&line[..crate::framing::HEAD_BYTES.min(line.len())])
    )
}

/// How many stderr lines of one upstream go to the log: a burst, then a steady rate
/// (a token bucket), so a chatty or hostile upstream cannot flood the daemon's log.
struct LogBudget {
    tokens: f64,
    last: tokio::time::Instant,
    /// Lines suppressed since the last one logged.
    suppressed: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Log it; first say how many were suppressed before it.
    Log {
        suppressed: u64,
    },
    Suppress,
}

impl LogBudget {
    const BURST: f64 = 100.0;
    const PER_SECOND: f64 = 20.0;

    fn new(now: tokio::time::Instant) -> LogBudget {
        LogBudget {
            tokens: Self::BURST,
            last: now,
            suppressed: 0,
        }
    }

    fn refill(&mut self, now: tokio::time::Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * Self::PER_SECOND).min(Self::BURST);
    }

    fn take(&mut self, now: tokio::time::Instant) -> Admit {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Admit::Log {
                suppressed: std::mem::take(&mut self.suppressed),
            }
        } else {
            self.suppressed += 1;
            Admit::Suppress
        }
    }
}

impl LogBudget {
    /// When the log has room for the count of lines left out, if any were.
    fn summary_due(&self) -> Option<tokio::time::Instant> {
        (self.suppressed > 0).then(|| {
            let wait = (1.0 - self.tokens).max(0.0) / Self::PER_SECOND;
            self.last + Duration::from_secs_f64(wait)
        })
    }

    /// The count of lines left out, taking the log's room for it, if it has room.
    fn summarise(&mut self, now: tokio::time::Instant) -> Option<u64> {
        self.refill(now);
        if self.suppressed == 0 || self.tokens < 1.0 {
            return None;
        }
        self.tokens -= 1.0;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// How long an exit's report waits for the rest of the child's stderr.
const STDERR_AFTER_EXIT: Duration = Duration::from_millis(500);

async fn child_loop(
    upstream: Arc<str>,
    mut child: Child,
    stop: CancellationToken,
    grace: Duration,
    (exit_tx, stderr_done): (watch::Sender<Option<ExitReport>>, CancellationToken),
    keeper: Option<Arc<crate::keeper::Keeper>>,
) {
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    let status = tokio::select! {
        status = child.wait() => status,
        _ = stop.cancelled() => {
            // stdin is already closed by the writer; many servers exit on EOF.
            match tokio::time::timeout(grace.min(Duration::from_secs(1)), child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    signal_group(group, Signal::SIGTERM);
                    match tokio::time::timeout(grace, child.wait()).await {
                        Ok(status) => status,
                        Err(_) => {
                            tracing::warn!(upstream = %upstream, "upstream ignored SIGTERM; killing its process group");
                            signal_group(group, Signal::SIGKILL);
                            child.wait().await
                        }
                    }
                }
            }
        }
    };
    // The leader is gone, but its group (an npx tree) may live on.
    terminate_group(group, grace).await;
    if let (Some(keeper), Some(group)) = (&keeper, group) {
        // Reaped and emptied: its id may now be reused by an unrelated process.
        keeper.forget(group.as_raw() as u32);
    }
    let report = match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            ExitReport {
                code: status.code(),
                signal: status.signal(),
            }
        }
        Err(_) => ExitReport {
            code: None,
            signal: None,
        },
    };
    tracing::info!(upstream = %upstream, exit = %report, "upstream process ended");
    stop.cancel();
    // Its last words (why it exited) belong to the exit's report: stderr is read to
    // its end first, unless something that escaped the group keeps it open.
    let _ = tokio::time::timeout(STDERR_AFTER_EXIT, stderr_done.cancelled()).await;
    let _ = exit_tx.send(Some(report));
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = killpg(group, signal);
    }
}

fn group_alive(group: Pid) -> bool {
    killpg(group, None).is_ok()
}

async fn terminate_group(group: Option<Pid>, grace: Duration) {
    let Some(group) = group else { return };
    if !group_alive(group) {
        return;
    }
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    // Looked at again and again: a group's end has no event to wait on (only its
    // leader is our child, and its members may outlive it).
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !group_alive(group) {
            return;
        }
    }
    let _ = killpg(group, Signal::SIGKILL);
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn a_burst_then_a_trickle_with_a_count_of_what_was_missed() {
        let start = tokio::time::Instant::now();
        let mut budget = LogBudget::new(start);
        let logged = (0..1000)
            .filter(|_| budget.take(start) != Admit::Suppress)
            .count();
        assert_eq!(logged, 100);
        // A second later, twenty more; the first says how many were missed.
        let later = start + Duration::from_secs(1);
        assert_eq!(budget.take(later), Admit::Log { suppressed: 900 });
        let more = (0..100)
            .filter(|_| budget.take(later) != Admit::Suppress)
            .count();
        assert_eq!(more, 19);
    }

    #[test]
    fn a_burst_that_ends_is_counted_once_the_log_has_room() {
        let start = tokio::time::Instant::now();
        let mut budget = LogBudget::new(start);
        assert_eq!(budget.summary_due(), None);
        for _ in 0..150 {
            budget.take(start);
        }
        let due = start + Duration::from_millis(50);
        assert_eq!(budget.summary_due(), Some(due));
        assert_eq!(budget.summarise(start), None, "no room yet");
        assert_eq!(budget.summarise(due), Some(50));
        assert_eq!(budget.summary_due(), None);
        assert_eq!(budget.take(due), Admit::Suppress, "the count took the room");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod stderr_lines_tests {
    use super::*;

    fn lines(ring_lines: usize) -> StderrLines {
        StderrLines {
            upstream: Arc::from("test"),
            tail: Arc::new(Mutex::new(VecDeque::new())),
            ring_lines,
            stats: Arc::new(ConnectionStats::default()),
            budget: LogBudget::new(tokio::time::Instant::now()),
            partial: Vec::new(),
            discarding: false,
        }
    }

    fn tail(lines: &StderrLines) -> Vec<String> {
        lines.tail.lock().unwrap().iter().cloned().collect()
    }

    #[test]
    fn lines_split_across_reads_are_kept_whole_and_counted() {
        let now = tokio::time::Instant::now();
        let mut lines = lines(3);
        lines.take(b"one\ntw", now);
        lines.take(b"o\r\nthr", now);
        lines.take(b"ee\nfour\nfi", now);
        assert_eq!(tail(&lines), ["two", "three", "four"]);
        lines.take(&[b'a'; 2000], now);
        assert_eq!(lines.stats.stderr_lines.load(Ordering::Relaxed), 4);
        let stats = lines.stats.clone();
        let ring = lines.tail.clone();
        lines.end(now);
        // The last line, without its newline, still counts.
        assert_eq!(stats.stderr_lines.load(Ordering::Relaxed), 5);
        let last = ring.lock().unwrap().back().cloned().unwrap();
        assert_eq!(last, format!("fi{}", "a".repeat(2000)));
    }

    #[test]
    fn a_flood_is_counted_and_its_last_lines_kept() {
        let now = tokio::time::Instant::now();
        let mut lines = lines(50);
        let flood: Vec<u8> = (0..10_000)
            .flat_map(|n| format!("line {n}\n").into_bytes())
            .collect();
        for read in flood.chunks(64 * 1024 - 7) {
            lines.take(read, now);
        }
        assert_eq!(lines.stats.stderr_lines.load(Ordering::Relaxed), 10_000);
        // The budget's burst of 100 was logged; the rest were counted for a summary.
        assert_eq!(lines.stats.stderr_suppressed.load(Ordering::Relaxed), 9_900);
        assert_eq!(lines.budget.suppressed, 9_900);
        let expected: Vec<String> = (9_950..10_000).map(|n| format!("line {n}")).collect();
        assert_eq!(tail(&lines), expected);
    }

    #[test]
    fn an_overlong_line_is_cut_once() {
        let now = tokio::time::Instant::now();
        let mut lines = lines(5);
        let long = vec![b'x'; STDERR_LINE_BYTES + 10];
        lines.take(&long[..10_000], now);
        lines.take(&long[10_000..], now);
        lines.take(b"xxx\nafter\n", now);
        let kept = tail(&lines);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept[0].ends_with("bytes was cut]"), "{kept:?}");
        assert_eq!(kept[1], "after");
        assert_eq!(lines.stats.stderr_lines.load(Ordering::Relaxed), 2);
    }
}
