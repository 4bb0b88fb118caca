//! Pins: each upstream's catalog as first seen (trust on first use) or approved,
//! kept in the pin file (`plexus.lock` beside the config), and the policy that acts
//! when a fresh listing differs. Every fresh listing is checked; a change is
//! classified field by field, logged once per change with its path and old and new
//! values, counted, and (under `on_schema_change = "block"`) the changed and new
//! entries are held back from the catalog until approved.
//!
//! Fail closed: a pin file that cannot be read or parsed is never overwritten, and
//! every upstream it would cover (all but those with `on_schema_change = "ignore"`)
//! is held whole until it is mended and the configuration reloaded.

pub mod file;
pub mod format;
pub mod keyed;
pub mod sharing;
pub mod view;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use registry::fingerprint::{self, ListingSnapshot};
use registry::{Kind, Quarantine};
use serde_json::{json, Value};

use crate::catalog_host::write_atomically_with;
use crate::config::{PinMode, SchemaPolicy, UpstreamConfig};
use crate::metrics::Metrics;
use file::Observation;
use format::{Approval, PinError, PinFile, UpstreamRecord};

/// What an upstream's configuration says about pinning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub strict: bool,
    pub on_change: SchemaPolicy,
}

impl Policy {
    pub fn of(config: &UpstreamConfig) -> Policy {
        Policy {
            strict: config.pin == PinMode::Strict,
            on_change: config.on_schema_change,
        }
    }
}

pub struct Pins {
    path: PathBuf,
    state: Arc<Mutex<State>>,
    saves: Arc<Saves>,
    metrics: Arc<Metrics>,
    /// Changes and approvals go into the audit trail too.
    audit: Arc<crate::audit::Audit>,
}

/// How long the pin file must go unchanged before a background write: each write
/// hashes and prints every pinned entry again (83 MB at 100,000 tools), and a start
/// of many upstreams changes it once per upstream.
const WRITE_COALESCING: Duration = Duration::from_millis(250);
/// The longest a background write waits for the changes to stop.
const WRITE_AT_THE_LATEST: Duration = Duration::from_secs(5);

/// Writes of the pin file. The file is copied under the state lock and each copy
/// numbered there, so the numbers follow the state's order; writers take turns
/// and skip contents older than what is on disk. A change in the background is
/// copied by the writer itself, once for however many changes came before it ran
/// (a start pins every upstream, one after another).
#[derive(Default)]
struct Saves {
    numbered: AtomicU64,
    /// The number of the contents on disk; held while writing.
    written: Mutex<u64>,
    /// A background write is on its way and will take the newest state.
    scheduled: AtomicBool,
    /// Counts the changes to save, so a waiting write sees whether more came.
    changes: AtomicU64,
    /// Counts finished writes: a large catalog's write allocates for a second or
    /// more, often after the catalog settled, and memory is released after it too.
    finished: watch::Sender<u64>,
    /// The background writes, waited for by [`Pins::flush`].
    tasks: TaskTracker,
    /// Cancelled by [`Pins::flush`]: a write waiting for more changes goes at once.
    flushing: CancellationToken,
    /// The file as last read or written here: another writer's change (a node of
    /// the same cluster, a ConfigMap update) shows as a different stamp.
    stamp: Mutex<Option<FileStamp>>,
}

/// What tells one version of the file from another without reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileStamp {
    device: u64,
    inode: u64,
    length: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    /// Follows symbolic links: a ConfigMap's file is a link swapped on update.
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            length: metadata.len(),
            modified: metadata.modified().ok(),
        })
    }
}

impl Saves {
    /// Writes `file`, numbered `number`, unless newer contents are on disk already
    /// or, when `yielding`, another writer changed the file since it was last read
    /// or written here (`plexus pins approve` beside a `serve --stdio` daemon): the
    /// file is then read again first (the watcher, a reload), and the listings seen
    /// here judged against it and written, rather than its change overwritten.
    /// Streamed: the file is several times its definitions' size, and one buffer
    /// of it would raise the allocator's trim threshold for good.
    fn write(&self, path: &Path, number: u64, file: &PinFile, yielding: bool) {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if number <= *written {
            return;
        }
        if yielding {
            let now = FileStamp::of(path);
            let known = *self.stamp.lock().unwrap_or_else(PoisonError::into_inner);
            if now.is_some() && now != known {
                tracing::info!(path = %path.display(), "the pin file changed on disk; it is read again before this daemon's changes are written");
                return;
            }
        }
        match write_atomically_with(path, 0o600, |out| file.write_to(out)) {
            Ok(()) => {
                *written = number;
                *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) = FileStamp::of(path);
            }
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot write the pin file")
            }
        }
        self.finished.send_modify(|count| *count += 1);
    }
}

/// An upstream's last fresh listing, read again only when a policy, an approval or a
/// reset changes what is held. Most often it is the pinned (or pending) catalog
/// itself, and is then read from the file rather than kept twice.
enum Observed {
    /// Equal to the file's pinned or pending catalog of this fingerprint.
    InFile(String),
    /// Compact JSON: a tree of values is about ten times its text.
    Own(Vec<u8>),
}

impl Observed {
    /// `snapshot`, whose catalog fingerprint is `current`, as `record` stands after
    /// seeing it.
    fn of(snapshot: &ListingSnapshot, current: &str, record: Option<&UpstreamRecord>) -> Observed {
        // Equal fingerprints hold the same entries by name; the count rules out a
        // listing that named one entry twice (the file keeps one of each name).
        let entries = entry_count(snapshot);
        let in_file = record.is_some_and(|record| {
            record.pinned.as_ref().is_some_and(|pinned| {
                pinned.catalog_fingerprint == current && pinned.entries.len() == entries
            }) || record.pending.as_ref().is_some_and(|pending| {
                pending.catalog_fingerprint == current && pending.entries.len() == entries
            })
        });
        if in_file {
            Observed::InFile(current.to_string())
        } else {
            Observed::own(snapshot)
        }
    }

    fn own(snapshot: &ListingSnapshot) -> Observed {
        let mut json = serde_json::to_vec(snapshot).unwrap_or_default();
        json.shrink_to_fit();
        Observed::Own(json)
    }

    /// The listing again. `None` if it was the file's and the file has moved on
    /// (an approval, a reset) or if, written by `own`, it did not read back: callers
    /// then use what they would with nothing observed.
    fn snapshot(&self, record: Option<&UpstreamRecord>) -> Option<ListingSnapshot> {
        match self {
            Observed::Own(json) => serde_json::from_slice(json).ok(),
            Observed::InFile(fingerprint) => {
                let record = record?;
                match (&record.pinned, &record.pending) {
                    (Some(pinned), _) if pinned.catalog_fingerprint == *fingerprint => {
                        Some(pinned.snapshot())
                    }
                    (_, Some(pending)) if pending.catalog_fingerprint == *fingerprint => {
                        Some(pending.snapshot())
                    }
                    _ => None,
                }
            }
        }
    }
}

struct State {
    /// The file, or why it cannot be read.
    file: Result<PinFile, String>,
    /// Each upstream's last fresh listing in this run, so a policy change, an
    /// approval or a reset can be applied to it at once.
    observed: HashMap<String, Observed>,
}

impl Pins {
    /// Reads the pin file; a missing one is empty.
    pub fn load(path: &Path, metrics: Arc<Metrics>, audit: Arc<crate::audit::Audit>) -> Pins {
        let stamp = FileStamp::of(path);
        let file = read(path);
        let saves = Saves::default();
        *saves.stamp.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        Pins {
            // Absolute, as `GET /pins` reports it: `plexus pins` compares it with the
            // file its own config names, from another working directory.
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            state: Arc::new(Mutex::new(State {
                file,
                observed: HashMap::new(),
            })),
            saves: Arc::new(saves),
            metrics,
            audit,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks a fresh listing of `upstream` against its pin (pinning it on first
    /// sight unless pinning is strict), reports what changed, and returns what of
    /// it is held back.
    pub fn observe(
        &self,
        upstream: &str,
        snapshot: &ListingSnapshot,
        policy: Policy,
    ) -> Quarantine {
        self.observe_hashed(upstream, snapshot, policy, None)
    }

    /// [`Pins::observe`] of a snapshot whose entries' security digests were taken
    /// already (`hashed`, by kind and place; taken here if they do not match it).
    pub fn observe_hashed(
        &self,
        upstream: &str,
        snapshot: &ListingSnapshot,
        policy: Policy,
        hashed: Option<fingerprint::SecurityDigests>,
    ) -> Quarantine {
        let matches = |digests: &fingerprint::SecurityDigests| {
            Kind::ALL
                .iter()
                .all(|kind| digests[kind.index()].len() == snapshot.entries(*kind).len())
        };
        let security = match hashed {
            Some(digests) if matches(&digests) => digests,
            _ => fingerprint::security_digests(snapshot),
        };
        let current = fingerprint::catalog_fingerprint_with(snapshot, &security);
        self.metrics.catalog_fingerprint(upstream, &current);
        let mut guard = self.lock();
        let state = &mut *guard;
        let file = match &mut state.file {
            Err(reason) => {
                tracing::error!(upstream, "{reason}; the upstream's catalog is held until the pin file is mended and the configuration reloaded");
                self.count(upstream, "pin_file_unreadable");
                state
                    .observed
                    .insert(upstream.to_string(), Observed::own(snapshot));
                return hold(&state.file, upstream, snapshot, policy);
            }
            Ok(file) => file,
        };
        let (seen, dirty) = file.observe_fingerprinted(
            upstream,
            snapshot,
            (current.clone(), &security),
            policy.strict,
        );
        state.observed.insert(
            upstream.to_string(),
            Observed::of(snapshot, &current, file.upstreams.get(upstream)),
        );
        match seen {
            Observation::PinnedOnFirstSight => {
                tracing::info!(upstream, fingerprint = %current, entries = entry_count(snapshot), "pinned the upstream's catalog on first sight");
                self.count(upstream, "pinned");
            }
            Observation::Unapproved => {
                if dirty {
                    tracing::warn!(upstream, fingerprint = %current, entries = entry_count(snapshot), "pin = \"strict\": nothing of the upstream is exposed until `plexus pins approve {upstream}`");
                }
                self.count(upstream, "unapproved");
            }
            Observation::Unchanged => self.count(upstream, "unchanged"),
            Observation::Changed { changes, new } => {
                self.count(upstream, "changed");
                if new && policy.on_change != SchemaPolicy::Ignore {
                    self.report(upstream, &changes, policy);
                }
            }
        }
        if dirty {
            self.save(file, false);
        }
        hold(&state.file, upstream, snapshot, policy)
    }

    /// `upstream`'s pinned and pending definitions take the equal texts of its
    /// catalog part, so each entry's JSON is kept once (a copy goes to each write
    /// of the file, which then copies references, not texts).
    pub fn share_texts(&self, upstream: &str, texts: &[registry::EntryText]) {
        if let Ok(file) = &mut self.lock().file {
            file.share_texts(upstream, texts);
        }
    }

    /// What is held of `upstream`'s listing now: its last fresh listing in this run
    /// if there is one, else `listed` (a listing kept from an earlier run), judged
    /// without recording anything.
    pub fn evaluate(&self, upstream: &str, listed: &ListingSnapshot, policy: Policy) -> Quarantine {
        let state = self.lock();
        let observed = state
            .observed
            .get(upstream)
            .and_then(|observed| observed.snapshot(record_of(&state.file, upstream)));
        hold(
            &state.file,
            upstream,
            observed.as_ref().unwrap_or(listed),
            policy,
        )
    }

    /// Approves what is pending for `upstream`, all of it or the entries named `name`.
    pub fn approve(&self, upstream: &str, name: Option<&str>) -> Result<Approval, PinError> {
        let mut state = self.lock();
        let file = state
            .file
            .as_mut()
            .map_err(|reason| unreadable(&self.path, reason))?;
        let approval = file.approve(upstream, name)?;
        tracing::info!(upstream, approved = %approval.approved, to = %approval.to, changes = approval.changes.len(), "schema change approved");
        if let Some(mut line) = self.audit.line("pin_approved") {
            line.field("upstream", upstream)
                .field("approved", &approval.approved)
                .field("from", &approval.from)
                .field("to", &approval.to)
                .field("changes", &approval.changes);
            self.audit.write(line);
        }
        self.save(file, true);
        Ok(approval)
    }

    /// Forgets `upstream`'s pin; its last listing, if any, is then seen afresh.
    pub fn reset(&self, upstream: &str, policy: Policy) -> Result<(), PinError> {
        let observed = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let file = state
                .file
                .as_mut()
                .map_err(|reason| unreadable(&self.path, reason))?;
            // Read before the reset: it may be the pin being forgotten.
            let observed = state
                .observed
                .get(upstream)
                .and_then(|observed| observed.snapshot(file.upstreams.get(upstream)));
            file.reset(upstream)?;
            self.save(file, true);
            observed
        };
        tracing::info!(upstream, "pin reset");
        if let Some(mut line) = self.audit.line("pin_reset") {
            line.field("upstream", upstream);
            self.audit.write(line);
        }
        if let Some(snapshot) = observed {
            self.observe(upstream, &snapshot, policy);
        }
        Ok(())
    }

    /// Reads the file again if it could not be read before; when it now reads,
    /// returns the upstreams seen in this run, to be checked again (None: it read
    /// before, or still does not).
    pub fn reread_if_unreadable(&self) -> Option<Vec<(String, ListingSnapshot)>> {
        let mut state = self.lock();
        if state.file.is_ok() {
            return None;
        }
        state.file = read(&self.path);
        if state.file.is_err() {
            return None;
        }
        tracing::info!(path = %self.path.display(), "the pin file reads again");
        *self
            .saves
            .stamp
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = FileStamp::of(&self.path);
        Some(Self::to_judge(&state))
    }

    /// Reads the file again if another writer changed it since this node last
    /// read or wrote it (nodes sharing one file, a ConfigMap updated), or if it
    /// could not be read before: returns the upstreams to judge again. A change
    /// that does not read keeps what was read before.
    pub fn reread_if_changed(&self) -> Option<Vec<(String, ListingSnapshot)>> {
        if self.lock().file.is_err() {
            return self.reread_if_unreadable();
        }
        let file = {
            // Held so that no write of this node's lands meanwhile (released before
            // the state is taken: a write is made with the state held).
            let mut written = self
                .saves
                .written
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let now = FileStamp::of(&self.path);
            let mut stamp = self
                .saves
                .stamp
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if now.is_none() || now == *stamp {
                return None;
            }
            match PinFile::read(&self.path) {
                Ok(file) => {
                    *stamp = now;
                    // Copies taken before this read are not written over it; the
                    // listings seen here are judged against it and saved afresh.
                    *written = (*written).max(self.saves.numbered.load(Ordering::Acquire));
                    file
                }
                Err(error) => {
                    tracing::error!(error = %error, "the pin file changed and does not read; the pins read before stay");
                    return None;
                }
            }
        };
        tracing::info!(path = %self.path.display(), "the pin file changed on disk; its pins are in force");
        let mut state = self.lock();
        // The listings seen here, read before the swap: one kept as the old file's
        // pin or pending catalog may be in the new one no more.
        let judged = Self::to_judge(&state);
        state.file = Ok(file);
        Some(judged)
    }

    /// The upstreams seen in this run, with their listings, to be judged again.
    fn to_judge(state: &State) -> Vec<(String, ListingSnapshot)> {
        state
            .observed
            .iter()
            .filter_map(|(name, observed)| {
                let record = record_of(&state.file, name);
                Some((name.clone(), observed.snapshot(record)?))
            })
            .collect()
    }

    /// A removed upstream's listing is no longer kept (its pin stays in the file).
    pub fn forget(&self, upstream: &str) {
        self.lock().observed.remove(upstream);
    }

    /// The file as it stands, or why it cannot be read.
    pub fn file(&self) -> Result<PinFile, PinError> {
        self.lock()
            .file
            .clone()
            .map_err(|reason| unreadable(&self.path, &reason))
    }

    fn report(&self, upstream: &str, changes: &[fingerprint::Change], policy: Policy) {
        let action = match policy.on_change {
            SchemaPolicy::Block => "held until approved",
            SchemaPolicy::Warn | SchemaPolicy::Ignore => "exposed (on_schema_change = \"warn\")",
        };
        for change in changes {
            let class = class_label(change.class);
            self.metrics
                .schema_changes
                .with_label_values(&[upstream, class])
                .inc();
            let old = change
                .old
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default();
            let new = change
                .new
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default();
            if let Some(mut line) = self.audit.line("schema_change") {
                line.field("upstream", upstream)
                    .field("class", class)
                    .field("entry", format!("{}/{}", change.kind, change.identity))
                    .field("path", &change.path)
                    .field("reason", &change.reason)
                    .field("action", action);
                self.audit.write(line);
            }
            tracing::warn!(
                upstream,
                class,
                kind = %change.kind,
                entry = %change.identity,
                path = %change.path,
                reason = %change.reason,
                %old,
                %new,
                action,
                "an upstream's schema changed since it was pinned"
            );
        }
    }

    fn count(&self, upstream: &str, outcome: &str) {
        self.metrics
            .schema_checks
            .with_label_values(&[upstream, outcome])
            .inc();
    }

    /// Writes the pin file (mode 0600, atomically): at once when `wait` (the caller
    /// holds the state lock and passes its file), else off the runtime, where the
    /// writer serialises the newest state itself. Never called for a file that
    /// could not be read.
    /// Changes once each write of the pin file has finished.
    pub fn writes(&self) -> watch::Receiver<u64> {
        self.saves.finished.subscribe()
    }

    fn save(&self, file: &PinFile, wait: bool) {
        let runtime = tokio::runtime::Handle::try_current().ok();
        if wait || runtime.is_none() {
            let number = self.saves.numbered.fetch_add(1, Ordering::AcqRel) + 1;
            self.saves.write(&self.path, number, file, false);
            return;
        }
        self.saves.changes.fetch_add(1, Ordering::AcqRel);
        if self.saves.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let (state, saves, path) = (self.state.clone(), self.saves.clone(), self.path.clone());
        let write = move || {
            // Cleared first: a change after this point schedules a write of its own.
            saves.scheduled.store(false, Ordering::Release);
            // A copy (compact definitions, so cheap) is written outside the lock.
            let copied = {
                let state = state.lock().unwrap_or_else(PoisonError::into_inner);
                let number = saves.numbered.fetch_add(1, Ordering::AcqRel) + 1;
                state.file.as_ref().ok().map(|file| (number, file.clone()))
            };
            if let Some((number, file)) = copied {
                saves.write(&path, number, &file, true);
            }
        };
        if let Some(runtime) = runtime {
            // Changes that follow each other closely (upstreams starting together) go
            // out in the same write.
            let flushing = self.saves.flushing.clone();
            let saves = self.saves.clone();
            self.saves.tasks.spawn_on(
                async move {
                    let quiet = async {
                        loop {
                            let seen = saves.changes.load(Ordering::Acquire);
                            tokio::time::sleep(WRITE_COALESCING).await;
                            if saves.changes.load(Ordering::Acquire) == seen {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = quiet => {}
                        () = tokio::time::sleep(WRITE_AT_THE_LATEST) => {}
                        () = flushing.cancelled() => {}
                    }
                    let _ = tokio::task::spawn_blocking(write).await;
                },
                &runtime,
            );
        }
    }

    /// Writes now what a background write was waiting to write, and waits for
    /// every background write (plexus is stopping).
    pub async fn flush(&self) {
        self.saves.flushing.cancel();
        self.saves.tasks.close();
        self.saves.tasks.wait().await;
    }
}

/// What of `snapshot` the policy holds back, given the file.
fn hold(
    file: &Result<PinFile, String>,
    upstream: &str,
    snapshot: &ListingSnapshot,
    policy: Policy,
) -> Quarantine {
    let file = match file {
        Err(reason) => {
            if policy.on_change == SchemaPolicy::Ignore {
                return admitting_unlisted(policy);
            }
            return Quarantine::whole(json!({
                "class": "pin_file_unreadable",
                "reason": reason,
                "fields": [],
            }));
        }
        Ok(file) => file,
    };
    let pinned = file
        .upstreams
        .get(upstream)
        .and_then(|record| record.pinned.as_ref());
    match pinned {
        None if policy.strict => Quarantine::whole(json!({
            "class": "unapproved",
            "reason": format!("pin = \"strict\": nothing of upstream `{upstream}` is exposed until `plexus pins approve {upstream}`"),
            "fields": [],
        })),
        None => admitting_unlisted(policy),
        Some(pinned) => match policy.on_change {
            SchemaPolicy::Block => {
                let (pinned, observed) = pinned.differing(snapshot);
                fingerprint::drift(&pinned, &observed)
            }
            SchemaPolicy::Warn | SchemaPolicy::Ignore => admitting_unlisted(policy),
        },
    }
}

/// Nothing held; names the upstream does not list may reach it unless its pins
/// block new entries (relaying them would bypass that).
fn admitting_unlisted(policy: Policy) -> Quarantine {
    Quarantine {
        admits_unlisted: policy.on_change != SchemaPolicy::Block && !policy.strict,
        ..Quarantine::none()
    }
}

fn read(path: &Path) -> Result<PinFile, String> {
    PinFile::read(path).map_err(|error| {
        let reason = error.to_string();
        tracing::error!(
            "{reason}; the upstreams it covers are held, and the file is left as it is"
        );
        reason
    })
}

fn unreadable(path: &Path, reason: &str) -> PinError {
    PinError::Read {
        path: path.display().to_string(),
        source: std::io::Error::other(reason.to_string()),
    }
}

pub fn class_label(class: fingerprint::ChangeClass) -> &'static str {
    match class {
        fingerprint::ChangeClass::Cosmetic => "cosmetic",
        fingerprint::ChangeClass::Security => "security",
        fingerprint::ChangeClass::Breaking => "breaking",
    }
}

/// `upstream`'s record in the file, if it reads and has one.
fn record_of<'a>(file: &'a Result<PinFile, String>, upstream: &str) -> Option<&'a UpstreamRecord> {
    file.as_ref().ok()?.upstreams.get(upstream)
}

fn entry_count(listing: &ListingSnapshot) -> usize {
    Kind::ALL
        .iter()
        .map(|kind| listing.entries(*kind).len())
        .sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const BLOCK: Policy = Policy {
        strict: false,
        on_change: SchemaPolicy::Block,
    };

    fn listing(description: &str) -> ListingSnapshot {
        ListingSnapshot {
            server_name: Some("fx".into()),
            tools: vec![
                json!({"name": "add", "description": description, "inputSchema": {"type": "object"}}),
                json!({"name": "echo", "inputSchema": {"type": "object"}}),
            ],
            ..ListingSnapshot::default()
        }
    }

    fn pins_in(dir: &Path) -> Pins {
        let metrics = Arc::new(Metrics::new().unwrap());
        let audit = crate::audit::Audit::new(metrics.clone());
        Pins::load(&dir.join("plexus.lock"), metrics, audit)
    }

    fn held(quarantine: &Quarantine) -> bool {
        quarantine
            .entries
            .contains_key(&(Kind::Tools, "add".to_string()))
    }

    #[test]
    fn a_listing_equal_to_the_file_is_read_from_it_through_drift_approval_and_reset() {
        let dir = tempfile::tempdir().unwrap();
        let pins = pins_in(dir.path());
        let (first, drifted) = (listing("Adds."), listing("Adds. Then mails the sum."));
        let is_in_file = |pins: &Pins| matches!(pins.lock().observed["alpha"], Observed::InFile(_));

        assert!(!held(&pins.observe("alpha", &first, BLOCK)));
        assert!(
            is_in_file(&pins),
            "a listing pinned on first sight is the pin"
        );
        assert!(held(&pins.observe("alpha", &drifted, BLOCK)));
        assert!(
            is_in_file(&pins),
            "a drifted listing is the pending catalog"
        );
        // Judged again, the observed listing counts, not the one passed in.
        assert!(held(&pins.evaluate("alpha", &first, BLOCK)));

        pins.approve("alpha", None).unwrap();
        assert!(!held(&pins.evaluate("alpha", &first, BLOCK)));

        // The pin the observed listing was read from is forgotten; the listing is
        // pinned again at once.
        pins.reset("alpha", BLOCK).unwrap();
        let file = pins.file().unwrap();
        let pinned = file.upstreams["alpha"].pinned.as_ref().unwrap();
        assert_eq!(
            pinned.catalog_fingerprint,
            fingerprint::catalog_fingerprint(&drifted)
        );
        assert!(is_in_file(&pins));
    }

    /// Another writer's change (an approval written by `plexus pins approve` while
    /// no admin listener runs) is not overwritten by this daemon's next background
    /// write: it is read again, and what this daemon saw is judged and written on top.
    #[tokio::test]
    async fn another_writers_change_is_read_before_this_daemons_own_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plexus.lock");
        let pins = pins_in(dir.path());
        let (first, drifted) = (listing("Adds."), listing("Adds. Then mails the sum."));
        pins.observe("alpha", &first, BLOCK);
        pins.observe("alpha", &drifted, BLOCK);
        // Later writes go at once, so each step is on disk when the next is taken.
        pins.flush().await;

        let mut theirs = PinFile::read(&path).unwrap();
        assert!(theirs.upstreams["alpha"].pending.is_some());
        theirs.approve("alpha", None).unwrap();
        crate::catalog_host::write_atomically(&path, &theirs.to_bytes(), 0o600).unwrap();

        // A change of this daemon's own, written in the background.
        pins.observe("beta", &first, BLOCK);
        pins.flush().await;
        let on_disk = PinFile::read(&path).unwrap();
        assert_eq!(
            on_disk.upstreams["alpha"].history.len(),
            1,
            "the approval was overwritten"
        );
        assert!(on_disk.upstreams["alpha"].pending.is_none());

        let reread = pins.reread_if_changed();
        assert!(reread.is_some(), "the change is not read");
        for (name, listing) in reread.unwrap() {
            pins.observe(&name, &listing, BLOCK);
        }
        pins.flush().await;
        let on_disk = PinFile::read(&path).unwrap();
        assert_eq!(on_disk.upstreams["alpha"].history.len(), 1);
        assert!(
            on_disk
                .upstreams
                .get("beta")
                .is_some_and(|beta| beta.pinned.is_some()),
            "this daemon's own change is lost"
        );
        assert!(!held(&pins.evaluate("alpha", &drifted, BLOCK)));
    }

    #[test]
    fn a_listing_naming_an_entry_twice_is_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let pins = pins_in(dir.path());
        let mut twice = listing("Adds.");
        twice.tools.push(twice.tools[0].clone());
        pins.observe("alpha", &twice, BLOCK);
        let state = pins.lock();
        let observed = &state.observed["alpha"];
        assert!(matches!(observed, Observed::Own(_)));
        let again = observed.snapshot(record_of(&state.file, "alpha")).unwrap();
        assert_eq!(again.tools.len(), 3);
    }
}
