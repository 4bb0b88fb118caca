//! The owner of the upstream set: the current upstreams behind a swappable
//! snapshot, changed only by [`UpstreamSet::apply`] with a [`ConfigDiff`]. Startup
//! is the diff from nothing, so startup and reload are one path. Supervisors
//! report what happens to their instances as [`SupervisorEvent`]s on one channel;
//! tables keyed by upstream name elsewhere hear of additions and removals through
//! [`SetHooks`], so they are purged with their upstream.

mod instance;
mod limiter;
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

use crate::config::{ConfigDiff, UpstreamConfig};
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

pub struct UpstreamSet {
    current: RwLock<Arc<BTreeMap<String, Arc<Upstream>>>>,
    next_generation: AtomicU64,
    supervision: Arc<Supervision>,
}

impl UpstreamSet {
    pub fn new(supervision: Supervision) -> UpstreamSet {
        UpstreamSet {
            current: RwLock::new(Arc::new(BTreeMap::new())),
            next_generation: AtomicU64::new(1),
            supervision: Arc::new(supervision),
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
        let settings = new.config();
        // Warm the successor first only where there is something to keep serving.
        let warm = settings.enabled
            && !new.on_demand()
            && old
                .as_ref()
                .is_some_and(|old| old.shared.state() == UpstreamState::Ready);
        if warm {
            tracing::info!(upstream = %name, "upstream's launch changed: starting its successor");
            new.start(true);
            let within = settings.init_timeout + Duration::from_secs(5);
            if let Err(reason) = new.shared.wait_ready(within).await {
                new.stop();
                tracing::error!(upstream = %name, %reason, "the changed upstream did not start; the previous instance keeps serving");
                return Err((name, reason));
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
        Ok(name)
    }

    /// Lets a removed or replaced upstream's calls finish, then stops it.
    fn drain(&self, old: Arc<Upstream>, drain_timeout: Duration) {
        self.supervision
            .tasks
            .spawn(async move { old.drain(drain_timeout).await });
    }

    /// Asks an upstream to start again now (after `failed`, during a backoff, or
    /// while running); false when there is no such enabled upstream.
    pub fn retry(&self, name: &str) -> bool {
        match self.get(name) {
            Some(upstream) if upstream.config().enabled => {
                tracing::info!(upstream = name, "restart requested by an operator");
                upstream.restart();
                true
            }
            _ => false,
        }
    }
}
