//! systemd integration without libsystemd: the sd_notify(3) datagram protocol
//! (READY, RELOADING, STOPPING, STATUS, WATCHDOG) and the watchdog loop.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Why one notification could not be delivered; only ever logged, because
/// notification is best effort and must never take the daemon down.
#[derive(Debug, thiserror::Error)]
enum NotifyError {
    #[error("cannot open a datagram socket: {0}")]
    Socket(#[source] io::Error),
    #[error("cannot send to NOTIFY_SOCKET {socket}: {source}")]
    Send {
        socket: String,
        #[source]
        source: io::Error,
    },
    #[error("only {sent} of {length} bytes reached NOTIFY_SOCKET {socket}")]
    Truncated {
        socket: String,
        sent: usize,
        length: usize,
    },
}

/// Sends state changes to the service manager that started us.
#[derive(Debug)]
pub struct Notifier {
    address: SocketAddr,
    /// `NOTIFY_SOCKET` as given, for log lines.
    socket: String,
    watchdog_interval: Option<Duration>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` through `env`
    /// (a closure, so tests need not touch the process environment). `None`
    /// when we were not started by systemd with `Type=notify`, or when the
    /// socket address is unusable.
    pub fn from_environment(env: &dyn Fn(&str) -> Option<String>) -> Option<Notifier> {
        let socket = env("NOTIFY_SOCKET").filter(|s| !s.is_empty())?;
        let address = match parse_address(&socket) {
            Ok(address) => address,
            Err(error) => {
                // Under Type=notify systemd would time the start out; say why.
                tracing::warn!(socket, %error, "ignoring unusable NOTIFY_SOCKET");
                return None;
            }
        };
        let watchdog_interval = watchdog_interval(env, std::process::id());
        tracing::debug!(socket, ?watchdog_interval, "systemd notification enabled");
        Some(Notifier {
            address,
            socket,
            watchdog_interval,
        })
    }

    /// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3)
    /// recommends, so one late wake-up does not get us killed.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog_interval
    }

    /// Start-up is complete: the fronts listen.
    pub fn ready(&self) {
        self.notify("READY=1");
    }

    /// A configuration reload has begun; send [`Notifier::ready`] when it is done.
    /// MONOTONIC_USEC lets `Type=notify-reload` (systemd 253+) match this message
    /// to the reload it asked for.
    pub fn reloading(&self) {
        match clock_gettime(ClockId::CLOCK_MONOTONIC) {
            Ok(now) => {
                let micros = Duration::from(now).as_micros();
                self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={micros}"));
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read CLOCK_MONOTONIC; sending RELOADING=1 alone");
                self.notify("RELOADING=1");
            }
        }
    }

    /// Shutdown has begun; systemd then waits up to TimeoutStopSec for the exit.
    pub fn stopping(&self) {
        self.notify("STOPPING=1");
    }

    /// A one-line status for `systemctl status`. Never blocks, so it may be called
    /// from a state-change callback that holds a lock.
    pub fn status(&self, text: &str) {
        // A newline would start a new KEY=VALUE assignment in the datagram.
        let line = text.replace(['\n', '\r'], " ");
        self.notify(&format!("STATUS={line}"));
    }

    /// Tells the watchdog we are alive.
    pub fn watchdog(&self) {
        self.notify("WATCHDOG=1");
    }

    fn notify(&self, message: &str) {
        match self.send(message.as_bytes()) {
            Ok(()) => tracing::trace!(message, "sd_notify sent"),
            Err(error) => tracing::debug!(message, %error, "sd_notify failed"),
        }
    }

    fn send(&self, message: &[u8]) -> Result<(), NotifyError> {
        let socket = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        // Never park a runtime worker on a full receive queue: a lost
        // notification is better than a stalled daemon.
        socket.set_nonblocking(true).map_err(NotifyError::Socket)?;
        let sent = socket
            .send_to_addr(message, &self.address)
            .map_err(|source| NotifyError::Send {
                socket: self.socket.clone(),
                source,
            })?;
        if sent != message.len() {
            return Err(NotifyError::Truncated {
                socket: self.socket.clone(),
                sent,
                length: message.len(),
            });
        }
        Ok(())
    }
}

/// The one-line status plexus reports: `"<n> upstreams configured, <m> ready"`.
pub fn upstream_status(configured: usize, ready: usize) -> String {
    format!("{configured} upstreams configured, {ready} ready")
}

/// Sends `WATCHDOG=1` every [`Notifier::watchdog_interval`] until `shutdown`;
/// returns at once when systemd asked for no watchdog.
pub async fn watchdog_loop(notifier: Arc<Notifier>, shutdown: CancellationToken) {
    let Some(period) = notifier.watchdog_interval() else {
        return;
    };
    let mut ticks = tokio::time::interval(period);
    // After a stall, one ping is enough; a burst of catch-up pings says nothing more.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => notifier.watchdog(),
            _ = shutdown.cancelled() => return,
        }
    }
}

/// `@name` is a Linux abstract socket (a leading NUL byte); anything else must
/// be an absolute path, as sd_notify(3) requires.
fn parse_address(socket: &str) -> io::Result<SocketAddr> {
    if let Some(name) = socket.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else if socket.starts_with('/') {
        SocketAddr::from_pathname(socket)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @abstract name",
        ))
    }
}

/// Half of `WATCHDOG_USEC`, when it is set, positive, and meant for `pid`
/// (a `WATCHDOG_PID` naming another process means the variable was inherited).
fn watchdog_interval(env: &dyn Fn(&str) -> Option<String>, pid: u32) -> Option<Duration> {
    if let Some(target) = env("WATCHDOG_PID").filter(|p| !p.is_empty()) {
        if target.trim().parse::<u32>().ok() != Some(pid) {
            tracing::debug!(target, pid, "WATCHDOG_PID is not ours; no watchdog");
            return None;
        }
    }
    let usec = env("WATCHDOG_USEC")?.trim().parse::<u64>().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec) / 2)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    /// A Notifier built from `vars` as if they were the environment.
    fn notifier(vars: &[(&str, String)]) -> Option<Notifier> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Notifier::from_environment(&move |key: &str| map.get(key).cloned())
    }

    fn listener(path: &Path) -> UnixDatagram {
        let socket = UnixDatagram::bind(path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket
    }

    fn receive(socket: &UnixDatagram) -> String {
        let mut buffer = [0u8; 4096];
        let length = socket.recv(&mut buffer).unwrap();
        String::from_utf8(buffer[..length].to_vec()).unwrap()
    }

    #[test]
    fn sends_the_exact_datagrams_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = listener(&path);
        let notifier = notifier(&[("NOTIFY_SOCKET", path.display().to_string())]).unwrap();
        assert_eq!(notifier.watchdog_interval(), None);

        notifier.ready();
        assert_eq!(receive(&socket), "READY=1");
        notifier.status("2 upstreams configured,\n1 ready\r");
        assert_eq!(receive(&socket), "STATUS=2 upstreams configured, 1 ready ");
        notifier.stopping();
        assert_eq!(receive(&socket), "STOPPING=1");
        notifier.watchdog();
        assert_eq!(receive(&socket), "WATCHDOG=1");

        notifier.reloading();
        let reloading = receive(&socket);
        let mut lines = reloading.lines();
        assert_eq!(lines.next(), Some("RELOADING=1"));
        let micros = lines
            .next()
            .and_then(|line| line.strip_prefix("MONOTONIC_USEC="))
            .unwrap();
        assert!(micros.parse::<u64>().unwrap() > 0, "{reloading}");
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn upstream_status_reads_as_counts() {
        assert_eq!(upstream_status(3, 1), "3 upstreams configured, 1 ready");
    }

    #[test]
    fn round_trips_through_an_abstract_socket() {
        let name = format!("plexus-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&address).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let notifier = notifier(&[("NOTIFY_SOCKET", format!("@{name}"))]).unwrap();
        notifier.ready();
        assert_eq!(receive(&socket), "READY=1");
    }

    #[test]
    fn no_notify_socket_means_no_notifier() {
        assert!(notifier(&[]).is_none());
        assert!(notifier(&[("NOTIFY_SOCKET", String::new())]).is_none());
        assert!(notifier(&[("NOTIFY_SOCKET", "relative/path".into())]).is_none());
        assert!(notifier(&[("WATCHDOG_USEC", "1000000".into())]).is_none());
    }

    #[test]
    fn a_send_to_nobody_is_only_logged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nobody.sock");
        let notifier = notifier(&[("NOTIFY_SOCKET", path.display().to_string())]).unwrap();
        notifier.ready();
        notifier.status("still alive");
    }

    #[test]
    fn watchdog_interval_is_half_of_watchdog_usec_for_our_pid() {
        let ours = std::process::id();
        fn env(usec: Option<&'static str>, pid: Option<String>) -> impl Fn(&str) -> Option<String> {
            move |key| match key {
                "WATCHDOG_USEC" => usec.map(str::to_string),
                "WATCHDOG_PID" => pid.clone(),
                _ => None,
            }
        }
        assert_eq!(
            watchdog_interval(&env(Some("30000000"), None), ours),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(&env(Some("30000000"), Some(ours.to_string())), ours),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(&env(Some("30000000"), Some((ours + 1).to_string())), ours),
            None
        );
        assert_eq!(
            watchdog_interval(&env(Some("30000000"), Some("junk".into())), ours),
            None
        );
        assert_eq!(watchdog_interval(&env(Some("0"), None), ours), None);
        assert_eq!(watchdog_interval(&env(Some("soon"), None), ours), None);
        assert_eq!(watchdog_interval(&env(None, None), ours), None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let from_env = notifier(&[
            ("NOTIFY_SOCKET", path.display().to_string()),
            ("WATCHDOG_USEC", "1000000".into()),
            ("WATCHDOG_PID", ours.to_string()),
        ])
        .unwrap();
        assert_eq!(
            from_env.watchdog_interval(),
            Some(Duration::from_millis(500))
        );
    }

    #[tokio::test]
    async fn watchdog_loop_pings_until_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = listener(&path);
        let notifier = Arc::new(
            notifier(&[
                ("NOTIFY_SOCKET", path.display().to_string()),
                ("WATCHDOG_USEC", "40000".into()),
            ])
            .unwrap(),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(watchdog_loop(notifier, shutdown.clone()));
        let socket = tokio::task::spawn_blocking(move || {
            assert_eq!(receive(&socket), "WATCHDOG=1");
            assert_eq!(receive(&socket), "WATCHDOG=1");
            socket
        })
        .await
        .unwrap();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        drop(socket);
    }

    #[tokio::test]
    async fn watchdog_loop_returns_at_once_without_a_watchdog() {
        let notifier = Arc::new(notifier(&[("NOTIFY_SOCKET", "@plexus-unused".into())]).unwrap());
        tokio::time::timeout(
            Duration::from_secs(1),
            watchdog_loop(notifier, CancellationToken::new()),
        )
        .await
        .unwrap();
    }
}
