//! The control path. Every input that changes what the daemon runs (SIGTERM and
//! SIGINT, SIGHUP, the config file watcher, the admin listener and through it
//! `plexus reload`) is one [`Control`] on one channel, handled by one loop that
//! owns the current [`Config`]. Reloads that arrive while one runs coalesce into
//! one more.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::config::{
    self, daemon_keys_needing_restart, ClusterChange, Config, ConfigDiff, DaemonSettings,
};
use crate::hub::Hub;
use crate::systemd::{self, Notifier};
use crate::upstreams::RestartOutcome;

/// What the control loop is asked to do.
pub enum Control {
    Shutdown {
        cause: &'static str,
    },
    Reload {
        cause: ReloadCause,
        reply: Option<oneshot::Sender<ReloadReport>>,
    },
    /// Something answered at once, between or during reloads.
    Act(Action),
}

/// A control input the loop answers at once, whatever else it is doing.
pub enum Action {
    /// Start an upstream again now (even from `failed`); the reply is what was
    /// done, None when there is no such enabled upstream.
    Restart {
        upstream: String,
        reply: oneshot::Sender<Option<RestartOutcome>>,
    },
    /// Approve what is pending for an upstream (all of it, or the entries named
    /// `name`); the reply is the approval recorded, or why there is none.
    ApprovePin {
        upstream: String,
        name: Option<String>,
        reply: oneshot::Sender<Result<Value, String>>,
    },
    /// Forget an upstream's pin, so its catalog is a first sight again.
    ResetPin {
        upstream: String,
        reply: oneshot::Sender<Result<Value, String>>,
    },
}

impl Action {
    /// `drain_timeout` is the one in force, for a restarted upstream's predecessor.
    fn run(self, hub: &Arc<Hub>, drain_timeout: Duration) {
        match self {
            Action::Restart { upstream, reply } => {
                // A successor takes as long as a start: the loop answers meanwhile.
                let restarting = hub.clone();
                hub.spawn(async move {
                    let outcome = restarting.restart(&upstream, drain_timeout).await;
                    let _ = reply.send(outcome);
                });
            }
            Action::ApprovePin {
                upstream,
                name,
                reply,
            } => {
                let outcome = hub
                    .approve_pin(&upstream, name.as_deref())
                    .map(|approval| json!({"upstream": upstream, "approval": approval}))
                    .map_err(|error| error.to_string());
                let _ = reply.send(outcome);
            }
            Action::ResetPin { upstream, reply } => {
                let outcome = hub
                    .reset_pin(&upstream)
                    .map(|()| json!({"upstream": upstream, "reset": true}))
                    .map_err(|error| error.to_string());
                let _ = reply.send(outcome);
            }
        }
    }
}

/// Which trigger a reload answered, as the report's `cause` says it: `signal`
/// (SIGHUP), `file_changed` (the watcher) or `admin` (`POST /reload`, `plexus reload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadCause {
    Signal,
    FileChanged,
    Admin,
}

impl ReloadCause {
    fn label(self) -> &'static str {
        match self {
            ReloadCause::Signal => "SIGHUP",
            ReloadCause::FileChanged => "the file changed",
            ReloadCause::Admin => "POST /reload",
        }
    }
}

/// How a reload ended; its lowercase name is what the report, the metric label
/// and the logs say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadOutcome {
    Applied,
    /// An upstream's new configuration could not start and its old instance
    /// serves on.
    Partial,
    /// Nothing changed.
    Rejected,
}

impl ReloadOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadOutcome::Applied => "applied",
            ReloadOutcome::Partial => "partial",
            ReloadOutcome::Rejected => "rejected",
        }
    }
}

/// What a reload did, as `POST /reload` and `plexus reload` show it.
#[derive(Clone, Debug, Serialize)]
pub struct ReloadReport {
    pub outcome: ReloadOutcome,
    /// The reload this report is of: an explicit reload of bytes the watcher had
    /// already applied answers with the watcher's report (see [`ReloadReport::changed`]).
    pub cause: ReloadCause,
    pub config: PathBuf,
    pub sha256: String,
    pub errors: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub restarted: Vec<String>,
    pub updated: Vec<String>,
    pub failed: Vec<FailedUpstream>,
    pub needs_restart: Vec<&'static str>,
    /// The `[cluster]` keys applied (`cluster.peers`, `cluster.dns`).
    pub cluster: Vec<&'static str>,
}

impl ReloadReport {
    /// Whether the reload changed what runs (or failed to).
    fn changed(&self) -> bool {
        !(self.added.is_empty()
            && self.removed.is_empty()
            && self.restarted.is_empty()
            && self.updated.is_empty()
            && self.failed.is_empty()
            && self.needs_restart.is_empty()
            && self.cluster.is_empty())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedUpstream {
    pub upstream: String,
    pub error: String,
}

/// Sends [`Control`]s to the loop.
#[derive(Clone)]
pub struct ControlHandle(mpsc::Sender<Control>);

impl ControlHandle {
    /// Reloads and waits for the outcome; None if the daemon is stopping.
    pub async fn reload(&self, cause: ReloadCause) -> Option<ReloadReport> {
        let (reply, answer) = oneshot::channel();
        let reply = Some(reply);
        self.0.send(Control::Reload { cause, reply }).await.ok()?;
        answer.await.ok()
    }

    /// Asks for a reload without waiting for it.
    pub fn request_reload(&self, cause: ReloadCause) {
        let _ = self.0.try_send(Control::Reload { cause, reply: None });
    }

    /// Restarts an upstream and waits for the outcome; None when there is no such
    /// enabled upstream or the daemon is stopping.
    pub async fn restart(&self, upstream: &str) -> Option<RestartOutcome> {
        let (reply, answer) = oneshot::channel();
        let upstream = upstream.to_string();
        self.0
            .send(Control::Act(Action::Restart { upstream, reply }))
            .await
            .ok()?;
        answer.await.ok().flatten()
    }

    /// Sends an action that answers with a result; None if the daemon is stopping.
    pub async fn pins(
        &self,
        action: impl FnOnce(oneshot::Sender<Result<Value, String>>) -> Action,
    ) -> Option<Result<Value, String>> {
        let (reply, answer) = oneshot::channel();
        self.0.send(Control::Act(action(reply))).await.ok()?;
        answer.await.ok()
    }

    pub async fn shutdown(&self, cause: &'static str) {
        let _ = self.0.send(Control::Shutdown { cause }).await;
    }
}

/// How many control inputs may wait; more SIGHUPs than this coalesce anyway.
const INBOX: usize = 64;
/// Reload requests closer together than this are one reload.
const RELOAD_QUIET: Duration = Duration::from_millis(100);
/// However long a burst lasts, a reload starts after this.
const RELOAD_GATHER_MAX: Duration = Duration::from_secs(1);

pub fn channel() -> (ControlHandle, mpsc::Receiver<Control>) {
    let (sender, receiver) = mpsc::channel(INBOX);
    (ControlHandle(sender), receiver)
}

/// The loop that owns the current configuration.
pub struct ControlLoop {
    pub path: PathBuf,
    pub environment: fn(&str) -> Option<String>,
    pub current: Config,
    pub sha256: String,
    pub hub: Arc<Hub>,
    /// The daemon settings in force, for the fronts that read them live.
    pub settings: watch::Sender<DaemonSettings>,
    pub notifier: Option<Arc<Notifier>>,
    pub shutdown: CancellationToken,
    /// This node's `[cluster]`, whose peers a reload changes (None: one node, or a
    /// stdio front).
    pub cluster: Option<Arc<Cluster>>,
}

impl ControlLoop {
    /// Starts the configured upstreams: the diff from nothing.
    pub async fn start(&self) {
        self.hub
            .audit()
            .configure(self.current.daemon.audit_log.clone())
            .await;
        self.hub.apply_views(&self.current.views);
        let startup = ConfigDiff::between(&BTreeMap::new(), &self.current.upstreams);
        self.hub
            .apply(startup, self.current.daemon.drain_timeout)
            .await;
        let metrics = self.hub.metrics();
        metrics.config_loaded(&self.sha256);
        metrics.config_last_reload_timestamp.set(unix_now());
        metrics.config_last_reload_successful.set(1);
        self.hub.set_config_identity(&self.path, &self.sha256);
    }

    /// Serves control inputs until shutdown.
    pub async fn run(mut self, mut inbox: mpsc::Receiver<Control>) {
        let mut last_read = self.sha256.clone();
        // The last reload that changed anything: someone who edits the file and runs
        // `plexus reload` wants to see what the edit changed even when the watcher
        // applied it first.
        let mut last_change: Option<ReloadReport> = None;
        let mut queued: Option<(ReloadCause, Vec<oneshot::Sender<ReloadReport>>)> = None;
        loop {
            let (cause, replies) = match queued.take() {
                Some(queued) => queued,
                None => {
                    let message = tokio::select! {
                        message = inbox.recv() => message,
                        _ = self.shutdown.cancelled() => return,
                    };
                    match message {
                        None => return self.stop("the control channel closed"),
                        Some(Control::Shutdown { cause }) => return self.stop(cause),
                        Some(Control::Act(action)) => {
                            action.run(&self.hub, self.current.daemon.drain_timeout);
                            continue;
                        }
                        Some(Control::Reload { cause, reply }) => {
                            let mut request = (cause, reply.into_iter().collect());
                            // A burst (a storm of SIGHUPs, a script's several writes)
                            // becomes one reload.
                            if !self.gather(&mut inbox, &mut request).await {
                                return;
                            }
                            request
                        }
                    }
                }
            };
            let hub = self.hub.clone();
            let drain_timeout = self.current.daemon.drain_timeout;
            let shutdown = self.shutdown.clone();
            let mut more: Option<(ReloadCause, Vec<oneshot::Sender<ReloadReport>>)> = None;
            let report = {
                let reload = self.reload(cause, &mut last_read);
                tokio::pin!(reload);
                loop {
                    tokio::select! {
                        report = &mut reload => break report,
                        _ = shutdown.cancelled() => return,
                        message = inbox.recv() => match message {
                            Some(Control::Reload { cause, reply }) => {
                                let entry = more.get_or_insert_with(|| (cause, Vec::new()));
                                // A request that waits for an answer must not be skipped
                                // as an unchanged file.
                                if cause != ReloadCause::FileChanged {
                                    entry.0 = cause;
                                }
                                entry.1.extend(reply);
                            }
                            Some(Control::Act(action)) => action.run(&hub, drain_timeout),
                            Some(Control::Shutdown { cause }) => {
                                tracing::info!("{cause}: shutting down");
                                shutdown.cancel();
                                return;
                            }
                            None => {
                                shutdown.cancel();
                                return;
                            }
                        },
                    }
                }
            };
            if let Some(mut report) = report {
                match &last_change {
                    Some(earlier)
                        if !report.changed()
                            && report.outcome == ReloadOutcome::Applied
                            && earlier.cause == ReloadCause::FileChanged
                            && earlier.sha256 == report.sha256 =>
                    {
                        report = earlier.clone();
                    }
                    _ if report.changed() => last_change = Some(report.clone()),
                    _ => {}
                }
                for reply in replies {
                    let _ = reply.send(report.clone());
                }
            }
            queued = more;
        }
    }

    /// Folds the reload requests that follow within [`RELOAD_QUIET`] of each other
    /// (for at most [`RELOAD_GATHER_MAX`]) into `request`; false on shutdown.
    async fn gather(
        &self,
        inbox: &mut mpsc::Receiver<Control>,
        request: &mut (ReloadCause, Vec<oneshot::Sender<ReloadReport>>),
    ) -> bool {
        let until = tokio::time::Instant::now() + RELOAD_GATHER_MAX;
        loop {
            let quiet = tokio::time::Instant::now() + RELOAD_QUIET;
            let message = tokio::select! {
                message = inbox.recv() => message,
                _ = tokio::time::sleep_until(quiet.min(until)) => return true,
                _ = self.shutdown.cancelled() => return false,
            };
            match message {
                Some(Control::Reload { cause, reply }) => {
                    // A requester who waits for an answer must not be skipped as an
                    // unchanged file.
                    if cause != ReloadCause::FileChanged {
                        request.0 = cause;
                    }
                    request.1.extend(reply);
                }
                Some(Control::Act(action)) => {
                    action.run(&self.hub, self.current.daemon.drain_timeout)
                }
                Some(Control::Shutdown { cause }) => {
                    self.stop(cause);
                    return false;
                }
                None => {
                    self.stop("the control channel closed");
                    return false;
                }
            }
        }
    }

    fn stop(&self, cause: &str) {
        tracing::info!("{cause}: shutting down");
        self.shutdown.cancel();
    }

    /// Reads, validates and applies the file; None when the watcher saw no new bytes.
    async fn reload(&mut self, cause: ReloadCause, last_read: &mut String) -> Option<ReloadReport> {
        let path = self.path.clone();
        let environment = self.environment;
        let read = tokio::task::spawn_blocking(move || config::read(&path, &environment))
            .await
            .unwrap_or_else(|error| {
                Err(config::ConfigError::Read {
                    path: self.path.clone(),
                    source: std::io::Error::other(error.to_string()),
                })
            });
        let sha256 = match &read {
            Ok((_, sha256)) | Err(config::ConfigError::Invalid { sha256, .. }) => sha256.clone(),
            Err(config::ConfigError::Read { .. }) => String::new(),
        };
        // The watcher hears every change in the directory; only new bytes matter.
        if cause == ReloadCause::FileChanged && (sha256.is_empty() || sha256 == *last_read) {
            // The pin file may sit beside the config (a ConfigMap): its change alone counts.
            self.hub.recheck_pins();
            return None;
        }
        last_read.clone_from(&sha256);
        if let Some(notifier) = &self.notifier {
            notifier.reloading();
        }
        tracing::info!(cause = cause.label(), config = %self.path.display(), "reloading the configuration");
        let report = match read {
            Ok((config, sha256)) => self.apply(config, sha256, cause).await,
            Err(error) => {
                tracing::error!("configuration rejected, the running one stays: {error}");
                let errors = match &error {
                    config::ConfigError::Invalid { issues, .. } => {
                        issues.iter().map(ToString::to_string).collect()
                    }
                    config::ConfigError::Read { .. } => vec![format!("(file): {error}")],
                };
                self.report(ReloadOutcome::Rejected, cause, sha256, errors)
            }
        };
        self.hub
            .metrics()
            .reload_finished(report.outcome.as_str(), unix_now());
        if let Some(notifier) = &self.notifier {
            notifier.ready();
            notifier.status(&reload_status(&report, &self.hub));
        }
        Some(report)
    }

    async fn apply(
        &mut self,
        mut config: Config,
        sha256: String,
        cause: ReloadCause,
    ) -> ReloadReport {
        let mut needs_restart = daemon_keys_needing_restart(&self.current.daemon, &config.daemon);
        let cluster = match &self.cluster {
            Some(_) => {
                ClusterChange::between(self.current.cluster.as_ref(), config.cluster.as_ref())
            }
            None => ClusterChange {
                running: self.current.cluster.clone(),
                retargeted: false,
                needs_restart: Vec::new(),
            },
        };
        needs_restart.extend_from_slice(&cluster.needs_restart);
        for key in &needs_restart {
            tracing::warn!(
                key,
                "this setting changes only when plexus restarts; the running value stays"
            );
        }
        // What cannot change live keeps its running value.
        config.daemon.listen = self.current.daemon.listen;
        config.daemon.admin_listen = self.current.daemon.admin_listen;
        config.daemon.state_dir = self.current.daemon.state_dir.clone();
        config.daemon.pins = self.current.daemon.pins.clone();
        let retargeted = match (&self.cluster, &cluster.running) {
            (Some(node), Some(running)) if cluster.retargeted => {
                node.retarget(running);
                changed_cluster_keys(self.current.cluster.as_ref(), running)
            }
            _ => Vec::new(),
        };
        config.cluster = cluster.running;

        // Reopened at every reload, so a file logrotate moved away is replaced.
        self.hub
            .audit()
            .configure(config.daemon.audit_log.clone())
            .await;
        self.hub.apply_views(&config.views);
        let diff = ConfigDiff::between(&self.current.upstreams, &config.upstreams);
        let applied = self.hub.apply(diff, config.daemon.drain_timeout).await;
        self.hub.apply_daemon_settings(&config.daemon);
        self.settings.send_replace(config.daemon.clone());
        // An upstream whose new configuration could not start runs its old one, so the
        // next reload tries again.
        for (name, _) in &applied.failed {
            if let Some(old) = self.current.upstreams.get(name) {
                config.upstreams.insert(name.clone(), old.clone());
            }
        }
        self.current = config;
        self.sha256.clone_from(&sha256);
        self.hub.metrics().config_loaded(&sha256);
        self.hub.set_config_identity(&self.path, &sha256);

        let outcome = if applied.failed.is_empty() {
            ReloadOutcome::Applied
        } else {
            ReloadOutcome::Partial
        };
        tracing::info!(
            outcome = outcome.as_str(),
            added = ?applied.added,
            removed = ?applied.removed,
            restarted = ?applied.restarted,
            updated = ?applied.updated,
            failed = applied.failed.len(),
            "configuration reloaded"
        );
        let mut report = self.report(outcome, cause, sha256, Vec::new());
        report.added = applied.added;
        report.removed = applied.removed;
        report.restarted = applied.restarted;
        report.updated = applied.updated;
        report.failed = applied
            .failed
            .into_iter()
            .map(|(upstream, error)| FailedUpstream { upstream, error })
            .collect();
        report.needs_restart = needs_restart;
        report.cluster = retargeted;
        report
    }

    fn report(
        &self,
        outcome: ReloadOutcome,
        cause: ReloadCause,
        sha256: String,
        errors: Vec<String>,
    ) -> ReloadReport {
        ReloadReport {
            outcome,
            cause,
            config: self.path.clone(),
            sha256,
            errors,
            added: Vec::new(),
            removed: Vec::new(),
            restarted: Vec::new(),
            updated: Vec::new(),
            failed: Vec::new(),
            needs_restart: Vec::new(),
            cluster: Vec::new(),
        }
    }
}

/// Which of the keys a reload changes live differ from the running `[cluster]`.
fn changed_cluster_keys(
    old: Option<&config::ClusterConfig>,
    new: &config::ClusterConfig,
) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.map(|old| &old.peers) != Some(&new.peers) {
        keys.push("cluster.peers");
    }
    if old.map(|old| &old.dns) != Some(&new.dns) {
        keys.push("cluster.dns");
    }
    keys
}

/// systemd's STATUS line after a reload.
fn reload_status(report: &ReloadReport, hub: &Hub) -> String {
    let states = hub.states();
    let ready = states
        .iter()
        .filter(|(_, state)| *state == crate::upstreams::UpstreamState::Ready)
        .count();
    let upstreams = systemd::upstream_status(states.len(), ready);
    match report.outcome {
        ReloadOutcome::Rejected => {
            format!("configuration rejected, running the previous one; {upstreams}")
        }
        outcome => format!("configuration reloaded ({}); {upstreams}", outcome.as_str()),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs_f64())
        .unwrap_or(0.0)
}

/// The signals plexus answers, registered at once: a signal that comes before
/// they are registered takes its default action, and SIGTERM's kills the process
/// with its upstreams left behind.
pub struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// SIGTERM and SIGINT shut down; SIGHUP reloads.
pub async fn forward_signals(
    mut signals: Signals,
    control: ControlHandle,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = signals.terminate.recv() => return control.shutdown("SIGTERM received").await,
            _ = signals.interrupt.recv() => return control.shutdown("SIGINT received").await,
            _ = signals.hangup.recv() => control.request_reload(ReloadCause::Signal),
        }
    }
}

/// Whether an event in the config file's directory may have changed the file.
/// Reads (inotify's open and close) change nothing, and neither do writes into
/// another file there: an audit trail kept beside the config appends a line per
/// call, and each would have the file read and parsed again once calls pause.
/// Anything else (created, removed, renamed: editors and ConfigMaps swap files
/// and symlinks) may.
fn may_change_config(event: &notify::Event, config: Option<&std::ffi::OsStr>) -> bool {
    use notify::event::{EventKind, ModifyKind};
    match event.kind {
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Data(_)) => {
            event.paths.is_empty()
                || event
                    .paths
                    .iter()
                    .any(|path| path.file_name().is_none() || path.file_name() == config)
        }
        _ => true,
    }
}

/// How long the directory must stay quiet before a change is read: editors write
/// a file in several steps.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);

/// Watches the config file's directory (editors and ConfigMaps replace the file
/// rather than write it), and the pin file's when it lives elsewhere, and asks for
/// a reload once changes settle (a pin file changed by another writer, such as
/// `plexus pins approve` beside a `serve --stdio` daemon, is then read again). The
/// returned watcher must be kept: dropping it stops the watch.
pub fn watch_config(
    path: &Path,
    pins: &Path,
    control: ControlHandle,
    shutdown: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    let directory_of = |path: &Path| {
        path.parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    };
    let directory = directory_of(path);
    let pins_directory = directory_of(pins);
    let name = path.file_name().map(std::ffi::OsStr::to_os_string);
    let (changes, quiet) = mpsc::unbounded_channel();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) if !may_change_config(&event, name.as_deref()) => {}
            Ok(_) => {
                let _ = changes.send(());
            }
            Err(error) => tracing::warn!(%error, "the config watcher reported an error"),
        })?;
    watcher.watch(&directory, notify::RecursiveMode::NonRecursive)?;
    tracing::info!(directory = %directory.display(), "watching the configuration for changes");
    let same_directory = match (directory.canonicalize(), pins_directory.canonicalize()) {
        (Ok(config), Ok(pins)) => config == pins,
        _ => directory == pins_directory,
    };
    if !same_directory {
        // The pin file is always written whole and renamed into place: events the
        // filter above lets through.
        match watcher.watch(&pins_directory, notify::RecursiveMode::NonRecursive) {
            Ok(()) => {
                tracing::info!(directory = %pins_directory.display(), "watching the pin file for changes")
            }
            // The config's watch stands; a change to the pin file is then read at a reload.
            Err(error) => {
                tracing::warn!(directory = %pins_directory.display(), %error, "cannot watch the pin file's directory")
            }
        }
    }
    tasks.spawn(async move {
        tokio::select! {
            _ = debounce(quiet, WATCH_DEBOUNCE, || control.request_reload(ReloadCause::FileChanged)) => {}
            _ = shutdown.cancelled() => {}
        }
    });
    Ok(watcher)
}

/// Calls `settled` once events stop arriving for `quiet`, for every burst.
async fn debounce(
    mut events: mpsc::UnboundedReceiver<()>,
    quiet: Duration,
    mut settled: impl FnMut(),
) {
    while events.recv().await.is_some() {
        loop {
            match tokio::time::timeout(quiet, events.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return settled(),
                Err(_) => break,
            }
        }
        settled();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn outcomes_serialize_as_their_lowercase_names() {
        for outcome in [
            ReloadOutcome::Applied,
            ReloadOutcome::Partial,
            ReloadOutcome::Rejected,
        ] {
            assert_eq!(
                serde_json::to_value(outcome).ok(),
                Some(json!(outcome.as_str()))
            );
        }
        assert_eq!(ReloadOutcome::Partial.as_str(), "partial");
    }

    #[test]
    fn only_events_that_may_change_the_file_count() {
        use notify::event::{
            AccessKind, CreateKind, DataChange, EventKind, ModifyKind, RemoveKind, RenameMode,
        };
        let config = Some(std::ffi::OsStr::new("config.toml"));
        let event = |kind: EventKind, name: &str| {
            notify::Event::new(kind).add_path(std::path::PathBuf::from("/etc/plexus").join(name))
        };
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Content));
        // Appending to the audit trail beside the config, or to any other file: no.
        assert!(!may_change_config(&event(written, "audit.jsonl"), config));
        assert!(!may_change_config(
            &event(EventKind::Access(AccessKind::Any), "config.toml"),
            config
        ));
        // Writing the file in place, or any swap of names: yes.
        assert!(may_change_config(&event(written, "config.toml"), config));
        for kind in [
            EventKind::Create(CreateKind::File),
            EventKind::Remove(RemoveKind::File),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Metadata(notify::event::MetadataKind::Any)),
            EventKind::Any,
        ] {
            assert!(
                may_change_config(&event(kind, "..data"), config),
                "{kind:?}"
            );
        }
        assert!(may_change_config(&notify::Event::new(written), config));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_is_one_reload_after_a_quiet_spell() {
        let (changes, quiet) = mpsc::unbounded_channel();
        let fired = Arc::new(AtomicUsize::new(0));
        let counter = fired.clone();
        let task = tokio::spawn(debounce(quiet, WATCH_DEBOUNCE, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        // An editor's save: several events within a few milliseconds.
        for _ in 0..5 {
            changes.send(()).ok();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(fired.load(Ordering::SeqCst), 0, "still settling");
        tokio::time::sleep(WATCH_DEBOUNCE + Duration::from_millis(10)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        // A later, separate change is a second reload.
        changes.send(()).ok();
        tokio::time::sleep(WATCH_DEBOUNCE * 2).await;
        assert_eq!(fired.load(Ordering::SeqCst), 2);
        drop(changes);
        task.await.ok();
        assert_eq!(fired.load(Ordering::SeqCst), 2);
    }
}
