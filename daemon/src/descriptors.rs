//! The descriptor budget: the soft `RLIMIT_NOFILE` raised to the hard limit at
//! start (as nginx and Envoy do), and the connection cap that budget allows once
//! the upstreams' pipes, the admin listener, the daemon's own files and a margin
//! are set aside, so `accept` never fails for want of a descriptor.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

use crate::config::{Config, Launch, Share, DEFAULT_MAX_CONNECTIONS};

/// What the daemon holds whatever its traffic: its standard streams, the log, the
/// state, pin and audit files, the runtime's own (epoll, eventfd), the config
/// watcher, the keeper's pipe and the two listening sockets. (Measured: 18 with
/// nothing open; files written now and then are counted in.)
pub const DAEMON_DESCRIPTORS: u64 = 32;
/// One stdio upstream's process: stdin, stdout and stderr pipes and a pidfd.
pub const STDIO_UPSTREAM_DESCRIPTORS: u64 = 4;
/// One HTTP upstream: a pooled connection and an event stream.
pub const HTTP_UPSTREAM_DESCRIPTORS: u64 = 2;
/// Instances of a `share = "session"` upstream counted on: one per session
/// would be unbounded, and most sessions leave most of them unstarted.
pub const SESSION_INSTANCES: u64 = 8;
/// The admin listener's connections (status, metrics, reloads: a few at a time).
pub const ADMIN_CONNECTIONS: usize = 16;

/// The process's descriptor limits once the soft one was raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub soft: u64,
    pub hard: u64,
    /// The soft limit before it was raised, if it was.
    pub raised_from: Option<u64>,
}

/// Raises the soft descriptor limit to the hard one. An unlimited hard limit is
/// taken as the kernel's `nr_open`, beyond which the call fails.
pub fn raise_soft_limit() -> Result<Limits, nix::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = if hard == RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(soft)
    } else {
        hard
    };
    if soft >= target {
        return Ok(Limits {
            soft,
            hard,
            raised_from: None,
        });
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok(Limits {
        soft: target,
        hard,
        raised_from: Some(soft),
    })
}

/// What the configured upstreams hold, in descriptors.
pub fn upstream_descriptors(config: &Config) -> u64 {
    config
        .upstreams
        .values()
        .filter(|upstream| upstream.enabled)
        .map(|upstream| {
            let each = match upstream.launch {
                Launch::Stdio(_) => STDIO_UPSTREAM_DESCRIPTORS,
                Launch::Http(_) => HTTP_UPSTREAM_DESCRIPTORS,
            };
            match upstream.share {
                Share::Shared => each,
                Share::Session => each * SESSION_INSTANCES,
            }
        })
        .sum()
}

/// The MCP listener's connection cap a soft limit of `limit` descriptors allows:
/// what is left once the daemon's own, the upstreams', the admin listener's and a
/// margin (a tenth, at least 16: connections to upstreams come and go) are set
/// aside; never above the default cap, never below one.
pub fn connection_cap(limit: u64, upstreams: u64) -> usize {
    let margin = (limit / 10).max(16);
    let held = DAEMON_DESCRIPTORS + upstreams + ADMIN_CONNECTIONS as u64 + margin;
    let cap = limit.saturating_sub(held).max(1);
    usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .min(DEFAULT_MAX_CONNECTIONS)
}

/// The caps of the two listeners, given the configured `max_connections` (None:
/// derived from the budget), with a warning when the budget is tight or the
/// configured cap exceeds it; `upstreams` is what [`upstream_descriptors`] counts.
/// Logged once, at start.
pub fn listener_caps(
    limits: Option<Limits>,
    configured: Option<usize>,
    upstreams: u64,
) -> (usize, usize) {
    let Some(limits) = limits else {
        let cap = configured.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        return (cap, cap.min(ADMIN_CONNECTIONS));
    };
    let budget = connection_cap(limits.soft, upstreams);
    let cap = match configured {
        Some(configured) if configured > budget => {
            tracing::warn!(
                soft_limit = limits.soft,
                hard_limit = limits.hard,
                max_connections = configured,
                budget,
                "[daemon] max_connections is more than the descriptor limit leaves room for; at that many connections accept fails (raise the hard limit: LimitNOFILE=, ulimit -Hn)"
            );
            configured
        }
        Some(configured) => configured,
        None => {
            if budget < DEFAULT_MAX_CONNECTIONS {
                tracing::warn!(
                    soft_limit = limits.soft,
                    hard_limit = limits.hard,
                    max_connections = budget,
                    upstream_descriptors = upstreams,
                    "the descriptor limit caps connections at {budget} (raise the hard limit: LimitNOFILE=, ulimit -Hn; or set [daemon] max_connections)"
                );
            }
            budget
        }
    };
    (cap, cap.min(ADMIN_CONNECTIONS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_upstreams_the_admin_listener_and_a_margin() {
        // 256 descriptors, one stdio upstream: 32 + 4 + 16 + 25 set aside.
        assert_eq!(connection_cap(256, STDIO_UPSTREAM_DESCRIPTORS), 179);
        // The common 1024, ten stdio upstreams and one per-session one.
        let upstreams =
            10 * STDIO_UPSTREAM_DESCRIPTORS + STDIO_UPSTREAM_DESCRIPTORS * SESSION_INSTANCES;
        assert_eq!(upstreams, 72);
        assert_eq!(connection_cap(1024, upstreams), 1024 - 32 - 72 - 16 - 102);
        // A small limit keeps a floor of 16 for the margin, and the cap never reaches 0.
        assert_eq!(connection_cap(100, 0), 100 - 32 - 16 - 16);
        assert_eq!(connection_cap(50, 40), 1);
        // A generous limit gives the default cap, no more.
        assert_eq!(connection_cap(1 << 20, 400), DEFAULT_MAX_CONNECTIONS);
    }
}
