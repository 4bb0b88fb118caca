//! The keeper: a small process that outlives the daemon by a moment to kill every
//! upstream process group the daemon left behind. The daemon tells it each group it
//! starts and each it has reaped, one line each on the keeper's stdin; when that pipe
//! closes (the daemon exited, was killed with SIGKILL, or crashed), the keeper kills
//! the groups still listed and exits. `PR_SET_PDEATHSIG` would reach only each
//! group's leader, never `npx`'s grandchildren.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The daemon's side: a running keeper and the pipe to it.
pub struct Keeper {
    /// None once closed (at drop).
    stdin: Mutex<Option<ChildStdin>>,
    child: Mutex<Child>,
}

impl Keeper {
    /// Starts `program args…` as the keeper (the daemon's own binary in keeper mode).
    pub fn spawn(program: &Path, args: &[&str]) -> std::io::Result<Keeper> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // Its own group: a terminal's Ctrl-C reaches the daemon, which stops its
            // upstreams itself, and the keeper is left to do nothing but exit.
            .process_group(0)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the keeper's stdin was not created"))?;
        Ok(Keeper {
            stdin: Mutex::new(Some(stdin)),
            child: Mutex::new(child),
        })
    }

    /// A new upstream process group to kill if the daemon dies.
    pub fn watch(&self, group: u32) {
        self.send(&format!("+{group}\n"));
    }

    /// A reaped group: its id may be reused, so the keeper forgets it.
    pub fn forget(&self, group: u32) {
        self.send(&format!("-{group}\n"));
    }

    fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().unwrap_or_else(PoisonError::into_inner);
        // A line is a few bytes, far below the pipe's buffer: the write never blocks.
        if let Some(pipe) = stdin.as_mut() {
            if let Err(error) = pipe.write_all(line.as_bytes()) {
                tracing::warn!(%error, "the keeper is gone; upstreams may outlive a crash");
            }
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Keeper")
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Closing its stdin ends it; reap it so it leaves no zombie.
        drop(
            self.stdin
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let _ = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wait();
    }
}

/// The keeper process: reads `+GROUP` / `-GROUP` lines until its input ends, then
/// kills the groups still listed. Returns how many it signalled.
pub fn run_keeper(input: impl BufRead) -> usize {
    let mut groups = BTreeSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, number) = line.split_at(line.len().min(1));
        match (sign, number.trim().parse::<i32>()) {
            ("+", Ok(group)) if group > 1 => {
                groups.insert(group);
            }
            ("-", Ok(group)) => {
                groups.remove(&group);
            }
            _ => {}
        }
    }
    groups
        .into_iter()
        .filter(|group| killpg(Pid::from_raw(*group), Signal::SIGKILL).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_groups_still_listed_are_killed() {
        // Group ids of processes that do not exist: nothing is signalled, nothing fails.
        let input = "+999999\n+999998\n-999999\nnonsense\n+1\n";
        assert_eq!(run_keeper(input.as_bytes()), 0);
    }
}
