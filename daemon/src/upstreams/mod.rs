//! The owner of the upstream set: the current upstreams behind a swappable
//! snapshot, changed only by [`UpstreamSet::apply`] with a [`ConfigDiff`]. Startup
//! is the diff from nothing, so startup and reload are one path. Supervisors
//! report what happens to their instances as [`SupervisorEvent`]s on one channel;
//! tables keyed by upstream name elsewhere hear of additions and removals through
//! [`SetHooks`], so they are purged with their upstream. An operator's restart of a
//! serving upstream ([`UpstreamSet::restart`]) takes a reload's path for a changed
//! launch: a successor of the same configuration is warmed, swapped in, and the
//! predecessor drained.

mod instance;
mod limiter;
pub mod login;
mod restart;
mod schedule;
mod starts;
mod supervise;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use adapters::handshake::ServerHello;
use adapters::UpstreamConnection;
use registry::UpstreamListing;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use instance::{client_identity, Caller, Instance, Upstream, UpstreamState};
pub use starts::StartSlots;
pub use supervise::{empty_listing, fetch_listing, open_connection, DISCOVER_PROBE_TIMEOUT};

use crate::config::{ConfigDiff, Share, UpstreamConfig};
use crate::jsonrpc::RelayError;
use crate::logging::LogLevel;
use crate::progress::ProgressRoutes;

/// What a supervisor reports. Listings and states carry the generation of the
/// upstream configuration that produced them, so a draining predecessor can never
/// publish over its successor.
pub enum SupervisorEvent {
    /// The shared instance changed state.
    State {
        upstream: Arc<str>,
        generation: u64,
        state: UpstreamState,
    },
    /// The shared instance was listed (at start or after a `list_changed`).
    Listing {
        generation: u64,
        listing: Box<UpstreamListing>,
        /// Its entries' security digests, taken by the upstream's own task so that
        /// upstreams listing at once are hashed in parallel, not in the pump.
        security: Box<registry::fingerprint::SecurityDigests>,
        capabilities: Value,
        /// What the server said of itself when it was initialized.
        hello: Box<ServerHello>,
        /// Told once the listing is in the catalog: an instance is ready only when
        /// what it serves is listed.
        installed: oneshot::Sender<()>,
    },
    /// A notification the upstream sent on its own (progress, logs, updates, ...).
    Notification {
        upstream: Arc<str>,
        /// The session whose own instance sent it, for a per-session upstream.
        session: Option<u64>,
        message: Value,
    },
    /// A request the upstream sent (sampling, elicitation, roots, ping);
    /// `origin` is plexus's id of the request whose HTTP stream carried it.
    Request {
        upstream: Arc<Upstream>,
        instance: Arc<Instance>,
        connection: UpstreamConnection,
        message: Value,
        origin: Option<u64>,
    },
    /// An instance is being started again after an exit.
    Restarted { upstream: Arc<str>, generation: u64 },
}

/// The task that keeps `instance` of `upstream` running, for `instance.rs` to
/// spawn: the supervisor reads the instance's types, so the instance starts it
/// through here and the two files do not import each other.
fn supervisor(
    instance: Arc<Instance>,
    upstream: Arc<Upstream>,
) -> impl std::future::Future<Output = ()> {
    supervise::supervise(instance, upstream)
}

/// What every supervisor is given: where to report, the log level clients want,
/// the tracker its tasks join, and the daemon's shutdown.
pub struct Supervision {
    pub events: mpsc::Sender<SupervisorEvent>,
    pub log_level: watch::Receiver<Option<LogLevel>>,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    /// Where upstream progress goes, without a detour through the pump.
    pub progress: Arc<ProgressRoutes>,
    /// Kills the upstreams' process groups if the daemon dies without stopping them.
    pub keeper: Option<Arc<adapters::keeper::Keeper>>,
    /// Bounds how many upstreams are starting at once (`daemon.start_concurrency`).
    pub starts: Arc<StartSlots>,
    /// Where hosted upstreams' OAuth tokens are, and their refresh counter.
    pub logins: Arc<login::Logins>,
}

/// The tables that hang off upstream names, told when the set changes.
pub trait SetHooks {
    /// `upstream` entered the set (added, or replacing its predecessor); returns
    /// whether the catalog already lists it.
    fn entered(&self, upstream: &Arc<Upstream>) -> bool;
    /// Settings of `upstream` changed in place.
    fn updated(&self, upstream: &Arc<Upstream>);
    /// The upstream of `generation` left the set for good: purge its name.
    fn removed(&self, name: &str, generation: u64);
    /// Several changes follow (`true`) or are done (`false`): announce them as one.
    fn batch(&self, open: bool);
}

/// What one `apply` did, upstream by upstream.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub restarted: Vec<String>,
    pub updated: Vec<String>,
    /// Upstreams whose new configuration could not start: the old instance serves on.
    pub failed: Vec<(String, String)>,
}

/// What an operator's restart did.
#[derive(Clone, Debug)]
pub enum RestartOutcome {
    /// A successor of generation `generation` serves; the predecessor drains.
    Replaced {
        generation: u64,
        pid: Option<u32>,
        previous_pid: Option<u32>,
    },
    /// Nothing was serving (failed, backing off, idle, starting, or the discovery
    /// instance of a per-session upstream), so the instance was asked to start
    /// again now, in place; `state` is the one it was in.
    InPlace { state: &'static str },
    /// The successor did not start (`reason`): the running instance serves on.
    Failed { reason: String },
}

pub struct UpstreamSet {
    current: RwLock<Arc<BTreeMap<String, Arc<Upstream>>>>,
    next_generation: AtomicU64,
    supervision: Arc<Supervision>,
    /// Held while the set changes (a reload's `apply`, an operator's restart), so
    /// two successors never replace one upstream at once (the loser would run on,
    /// out of the set and never drained).
    changing: tokio::sync::Mutex<()>,
}

impl UpstreamSet {
    pub fn new(supervision: Supervision) -> UpstreamSet {
        UpstreamSet {
            current: RwLock::new(Arc::new(BTreeMap::new())),
            next_generation: AtomicU64::new(1),
            supervision: Arc::new(supervision),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// The upstreams now, as one consistent snapshot.
    pub fn snapshot(&self) -> Arc<BTreeMap<String, Arc<Upstream>>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Upstream>> {
        self.snapshot().get(name).cloned()
    }

    /// The upstream of that name, or the error a call to it gets.
    pub fn named(&self, name: &str) -> Result<Arc<Upstream>, RelayError> {
        self.get(name).ok_or_else(|| RelayError::Unavailable {
            upstream: name.to_string(),
            state: "removed".into(),
            retry_after_ms: None,
        })
    }

    /// Whether `generation` is the one serving under `name` now.
    pub fn is_current(&self, name: &str, generation: u64) -> bool {
        self.get(name)
            .is_some_and(|upstream| upstream.generation() == generation)
    }

    fn update(&self, change: impl FnOnce(&mut BTreeMap<String, Arc<Upstream>>)) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = (**current).clone();
        change(&mut next);
        *current = Arc::new(next);
    }

    fn create(&self, config: UpstreamConfig) -> Arc<Upstream> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        Arc::new(Upstream::new(config, generation, self.supervision.clone()))
    }

    /// Brings the set to a new configuration: removed upstreams leave (and drain),
    /// in-place changes apply, added ones start, and changed ones are replaced by a
    /// new instance once it is ready (the old one serves until then, and on if the
    /// new one fails). An upstream that had failed is started afresh.
    pub async fn apply(
        &self,
        diff: ConfigDiff,
        hooks: &(dyn SetHooks + Sync),
        drain_timeout: Duration,
    ) -> ApplyReport {
        let _changing = self.changing.lock().await;
        let mut report = ApplyReport::default();
        hooks.batch(true);
        for name in diff.removed {
            let mut removed = None;
            self.update(|set| removed = set.remove(&name));
            if let Some(old) = removed {
                tracing::info!(upstream = %name, "upstream removed from the configuration");
                hooks.removed(&name, old.generation());
                self.drain(old, drain_timeout);
                report.removed.push(name);
            }
        }
        for config in diff.updated {
            if let Some(upstream) = self.get(&config.name) {
                tracing::info!(upstream = %config.name, "upstream settings changed in place");
                report.updated.push(config.name.clone());
                upstream.update_in_place(config);
                hooks.updated(&upstream);
            }
        }
        for config in diff.added {
            let upstream = self.create(config);
            report.added.push(upstream.name().to_string());
            self.update(|set| {
                set.insert(upstream.name().to_string(), upstream.clone());
            });
            let known = hooks.entered(&upstream);
            upstream.start(known);
        }
        // Replacements wait for their successors, each announced when it is ready.
        hooks.batch(false);
        let replacements = diff
            .restarted
            .into_iter()
            .map(|config| self.replace(config, hooks, drain_timeout));
        for outcome in futures::future::join_all(replacements).await {
            match outcome {
                Ok(name) => report.restarted.push(name),
                Err(failure) => report.failed.push(failure),
            }
        }
        // A reload is the operator's word that a failed upstream may try again.
        for upstream in self.snapshot().values() {
            if upstream.shared.state() == UpstreamState::Failed {
                tracing::info!(upstream = %upstream.name(), "reload: starting a failed upstream afresh");
                upstream.shared.retry();
            }
        }
        report
    }

    /// Starts `config` as the successor of the upstream of its name.
    async fn replace(
        &self,
        config: UpstreamConfig,
        hooks: &(dyn SetHooks + Sync),
        drain_timeout: Duration,
    ) -> Result<String, (String, String)> {
        let name = config.name.clone();
        let old = self.get(&name);
        let new = self.create(config);
        match self
            .succeed(old, new, Succession::Reload, hooks, drain_timeout)
            .await
        {
            Ok(()) => Ok(name),
            Err(reason) => Err((name, reason)),
        }
    }

    /// Puts `new` in the place of `old`. Where `old` serves (ready), `new` is
    /// started first and waited for until it is ready and listed (`old` serves
    /// until then, and on if `new` fails: the error says why); then `new` enters
    /// the set, so new calls go to it, and `old` drains within `drain_timeout`.
    async fn succeed(
        &self,
        old: Option<Arc<Upstream>>,
        new: Arc<Upstream>,
        succession: Succession,
        hooks: &(dyn SetHooks + Sync),
        drain_timeout: Duration,
    ) -> Result<(), String> {
        let name = new.name().to_string();
        let settings = new.config();
        // Warm the successor first only where there is something to keep serving.
        // A reload leaves an on-demand upstream's successor to the next call that
        // needs it; a restart was asked to start one now.
        let warm = settings.enabled
            && (succession == Succession::Restart || !new.on_demand())
            && old
                .as_ref()
                .is_some_and(|old| old.shared.state() == UpstreamState::Ready);
        if warm {
            match succession {
                Succession::Reload => {
                    tracing::info!(upstream = %name, "upstream's launch changed: starting its successor")
                }
                Succession::Restart => {
                    tracing::info!(upstream = %name, generation = new.generation(), "restart: starting a successor before stopping the running instance")
                }
            }
            if new.on_demand() {
                // Not left waiting for a call's demand.
                new.shared.retry();
            }
            new.start(true);
            let within = settings.init_timeout + Duration::from_secs(5);
            if let Err(reason) = new.shared.wait_ready(within).await {
                new.stop();
                tracing::error!(upstream = %name, %reason, "the successor did not start; the previous instance keeps serving");
                return Err(reason);
            }
        }
        self.update(|set| {
            set.insert(name.clone(), new.clone());
        });
        if !settings.enabled {
            // Disabled now: nothing of it stays listed.
            hooks.removed(&name, new.generation().saturating_sub(1));
        }
        let known = hooks.entered(&new);
        if !warm {
            new.start(known);
        }
        if let Some(old) = old {
            self.drain(old, drain_timeout);
        }
        Ok(())
    }

    /// Lets a removed or replaced upstream's calls finish, then stops it.
    fn drain(&self, old: Arc<Upstream>, drain_timeout: Duration) {
        self.supervision
            .tasks
            .spawn(async move { old.drain(drain_timeout).await });
    }

    /// An operator's restart of the enabled upstream `name` (None when there is no
    /// such upstream, or plexus is stopping). A shared upstream that serves is
    /// replaced as a reload replaces a changed one: a successor of the same
    /// configuration (the next generation) is started and waited for, then takes
    /// the new calls while the running instance drains, so no call meets it
    /// stopping. One with no process to keep (failed, backing off, idle,
    /// starting) and a per-session upstream (whose sessions own their instances;
    /// its shared instance only lists) start again in place, as after an exit.
    pub async fn restart(
        &self,
        name: &str,
        hooks: &(dyn SetHooks + Sync),
        drain_timeout: Duration,
    ) -> Option<RestartOutcome> {
        let _changing = self.changing.lock().await;
        if self.supervision.shutdown.is_cancelled() {
            return None;
        }
        let old = self
            .get(name)
            .filter(|upstream| upstream.config().enabled)?;
        let state = old.shared.reported_state();
        tracing::info!(
            upstream = name,
            state = state.label(),
            "restart requested by an operator"
        );
        if old.config().share == Share::Session || state != UpstreamState::Ready {
            old.restart();
            return Some(RestartOutcome::InPlace {
                state: state.label(),
            });
        }
        let previous_pid = old.shared.process().0;
        let new = self.successor(&old);
        let generation = new.generation();
        let outcome = self
            .succeed(
                Some(old),
                new.clone(),
                Succession::Restart,
                hooks,
                drain_timeout,
            )
            .await;
        if let Err(reason) = outcome {
            return Some(RestartOutcome::Failed { reason });
        }
        // Counted as a restart of the upstream, whose count the successor carries on.
        let _ = self
            .supervision
            .events
            .send(SupervisorEvent::Restarted {
                upstream: new.name_arc().clone(),
                generation,
            })
            .await;
        Some(RestartOutcome::Replaced {
            generation,
            pid: new.shared.process().0,
            previous_pid,
        })
    }

    /// A new generation of `old`, of its configuration now, carrying what outlives
    /// any one process: the connection counters, the capabilities it advertised,
    /// the URIs its listen stream names, its restarts (this one counted) and last exit.
    fn successor(&self, old: &Upstream) -> Arc<Upstream> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut new = Upstream::new(
            (*old.config()).clone(),
            generation,
            self.supervision.clone(),
        );
        new.stats = old.stats.clone();
        new.remember_capabilities(old.known_capabilities());
        new.listen_uris
            .send_replace(old.listen_uris.borrow().clone());
        let past = old.shared.history();
        new.shared.record(|history| {
            history.restarts = past.restarts + 1;
            history.last_exit = past.last_exit;
            history.stderr_tail = past.stderr_tail;
        });
        Arc::new(new)
    }
}

/// Why an upstream gets a successor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Succession {
    /// A reload changed how it is launched.
    Reload,
    /// An operator asked for a restart: same configuration, next generation.
    Restart,
}

#[cfg(test)]
mod tests;
