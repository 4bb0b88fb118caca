//! Upstreams served inside this process (feature `test-support`): a test registers
//! a server under a program name, and a stdio upstream launching that program is
//! connected to it over a pair of pipes instead of spawning a child. The connection
//! is the stdio one (writer, reading task, pending table), so a caller's code runs
//! as in production; nothing waits on another process, so a test can run on a
//! paused clock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::unix::pipe;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::pipes::pipe_up;
use crate::rpc::{Events, Spawned};
use crate::stdio::{ExitReport, SpawnError, StdioOptions, StdioTransport};

/// What an in-process server is handed for one start.
pub struct ServerPipes {
    /// The upstream's stdin: the lines plexus writes. EOF when plexus stops it.
    pub from_plexus: pipe::Receiver,
    /// The upstream's stdout. Dropping it is the upstream exiting.
    pub to_plexus: pipe::Sender,
    /// Cancelled when plexus stops the upstream (what a signal is to a child): the
    /// server must drop its pipes then, or the stop waits for it.
    pub stopped: CancellationToken,
}

/// Starts one run of a server: called on the runtime, it spawns what serves the pipes.
pub type Serve = Arc<dyn Fn(ServerPipes) + Send + Sync>;

fn servers() -> std::sync::MutexGuard<'static, BTreeMap<String, Serve>> {
    static SERVERS: Mutex<BTreeMap<String, Serve>> = Mutex::new(BTreeMap::new());
    SERVERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A registered server; dropping it unregisters the program name.
pub struct Registration {
    program: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        servers().remove(&self.program);
    }
}

/// Serves `program` in this process from now on (until the registration is dropped).
/// Names are shared by the whole process: tests running in parallel use distinct ones.
pub fn register(program: &str, serve: Serve) -> Registration {
    servers().insert(program.to_string(), serve);
    Registration {
        program: program.to_string(),
    }
}

/// Connects to the server registered for `program`, if there is one; gives the
/// events back otherwise.
pub(crate) fn connect(
    upstream: &Arc<str>,
    program: &str,
    options: &StdioOptions,
    events: Events,
) -> Result<Result<Spawned<StdioTransport>, SpawnError>, Events> {
    let Some(serve) = servers().get(program).cloned() else {
        return Err(events);
    };
    Ok(start(upstream.clone(), program, options, events, &serve))
}

fn start(
    upstream: Arc<str>,
    program: &str,
    options: &StdioOptions,
    events: Events,
    serve: &Serve,
) -> Result<Spawned<StdioTransport>, SpawnError> {
    let io = |source| SpawnError::Io {
        program: program.to_string(),
        source,
    };
    let (to_upstream, from_plexus) = pipe::pipe().map_err(io)?;
    let (to_plexus, from_upstream) = pipe::pipe().map_err(io)?;
    let piped = pipe_up(
        &upstream,
        (to_upstream, from_upstream),
        options.stats.clone(),
        options.max_message_bytes,
        events,
    );
    let (exit_tx, exit) = watch::channel(None);
    // The server has exited once its output has ended.
    let ended = piped.closed.clone();
    piped.tasks.spawn(async move {
        ended.cancelled().await;
        let _ = exit_tx.send(Some(ExitReport {
            code: None,
            signal: None,
        }));
    });
    serve(ServerPipes {
        from_plexus,
        to_plexus,
        stopped: piped.stop.clone(),
    });
    Ok(piped.spawned(upstream, |writer| StdioTransport {
        writer,
        exit,
        pid: None,
        stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
    }))
}
