//! The catalog's owner: each upstream's latest listing (tagged with the generation
//! of the upstream configuration that produced it) as the part of the catalog built
//! from it, the snapshot put together from those parts, and the copy of each listing
//! kept on disk so an upstream stays listed while it restarts. A new listing (or a new
//! judgement, name or filter of one upstream) rebuilds that upstream's part only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use registry::{
    Catalog, CatalogOptions, CatalogWarning, Kind, Quarantine, ToolFilter, UpstreamListing,
    UpstreamPart, View,
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::memory;
use crate::metrics::Metrics;

/// A kept listing this large is parsed on a thread of its own ([`memory::apart`]);
/// a smaller one's values are too few to leave holes worth a thread.
const PARSE_APART_FROM: usize = 64 * 1024;

/// One published state of the catalog: the whole, and each view of it, computed
/// together so a reader never sees a view of another snapshot.
#[derive(Default)]
pub struct Snapshot {
    pub all: Arc<Catalog>,
    pub views: HashMap<String, Arc<Catalog>>,
    /// The upstreams whose listings it was built from.
    pub listed: std::collections::BTreeSet<String>,
}

impl Snapshot {
    /// The whole catalog, or the named view (an empty catalog if the view is gone:
    /// a session whose view was removed by a reload sees nothing).
    pub fn view(&self, view: Option<&str>) -> Arc<Catalog> {
        match view {
            None => self.all.clone(),
            Some(name) => self
                .views
                .get(name)
                .cloned()
                .unwrap_or_else(|| Arc::new(Catalog::empty())),
        }
    }
}

/// How long a shutdown waits for the kept listings being written.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub struct CatalogHost {
    state: Mutex<Listings>,
    catalog: watch::Sender<Arc<Snapshot>>,
    /// Counts the listings installed or judged anew, published or not (a listing
    /// equal to the one shown publishes nothing, but was read and judged).
    installed: watch::Sender<u64>,
    /// Where each upstream's last listing is kept, so it stays listed across restarts.
    directory: PathBuf,
    metrics: Arc<Metrics>,
    /// Listings being written to or removed from `directory`: a shutdown waits
    /// for them, so none is left half done.
    writes: TaskTracker,
}

struct Listings {
    options: CatalogOptions,
    /// The configured views, computed with every snapshot.
    views: BTreeMap<String, View>,
    /// Each upstream's part of the catalog, with its listing as JSON text (so no
    /// tree of values per entry is kept).
    by_upstream: BTreeMap<String, Arc<UpstreamPart>>,
    /// The lowest generation whose listing is still accepted, per upstream name: a
    /// replaced or removed upstream's late listing is older and is dropped.
    floor: BTreeMap<String, u64>,
    /// Warnings already logged, so each is logged once, not at every rebuild.
    reported: HashSet<String>,
    /// While a reload changes several upstreams, or the pump works through listings
    /// that arrived together, one snapshot is published at the end (each session
    /// hears one `list_changed` per kind, and a start of N upstreams assembles the
    /// catalog a few times, not N). Counts the holders.
    held: u32,
    dirty: bool,
}

impl CatalogHost {
    pub fn new(options: CatalogOptions, directory: PathBuf, metrics: Arc<Metrics>) -> CatalogHost {
        CatalogHost {
            state: Mutex::new(Listings {
                options,
                views: BTreeMap::new(),
                by_upstream: BTreeMap::new(),
                floor: BTreeMap::new(),
                reported: HashSet::new(),
                held: 0,
                dirty: false,
            }),
            catalog: watch::channel(Arc::new(Snapshot::default())).0,
            installed: watch::channel(0).0,
            directory,
            metrics,
            writes: TaskTracker::new(),
        }
    }

    /// Waits until the listings being written or removed are done, for at most
    /// [`FLUSH_TIMEOUT`]: a stuck disk must not hold the daemon's exit.
    pub async fn flush(&self) {
        self.writes.close();
        if tokio::time::timeout(FLUSH_TIMEOUT, self.writes.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                writes = self.writes.len(),
                "kept listings were still being written at exit"
            );
        }
    }

    pub fn current(&self) -> Arc<Catalog> {
        self.catalog.borrow().all.clone()
    }

    /// The whole catalog or one view of it, as published now.
    pub fn view(&self, view: Option<&str>) -> Arc<Catalog> {
        self.catalog.borrow().view(view)
    }

    /// Changes with every listing installed or judged anew.
    pub fn installed(&self) -> watch::Receiver<u64> {
        self.installed.subscribe()
    }

    /// `name`'s part of the catalog, if it lists anything.
    pub fn part(&self, name: &str) -> Option<Arc<UpstreamPart>> {
        self.lock().by_upstream.get(name).cloned()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.catalog.subscribe()
    }

    pub fn has_view(&self, name: &str) -> bool {
        self.catalog.borrow().views.contains_key(name)
    }

    /// New view definitions (at start and on reload).
    pub fn set_views(&self, views: BTreeMap<String, View>) {
        let mut state = self.lock();
        if state.views != views {
            state.views = views;
            self.rebuild(&mut state);
        }
    }

    /// Whether a listing of `name` from the configuration of `generation` is still
    /// wanted: no newer one of that name has published, and it was not removed.
    pub fn accepts(&self, name: &str, generation: u64) -> bool {
        self.lock()
            .floor
            .get(name)
            .is_none_or(|floor| generation >= *floor)
    }

    /// Installs a listing from the upstream configuration of `generation`, unless a
    /// newer one of that name has published since; returns whether it was installed.
    /// `quarantine` says what of it is held back; it is asked under the catalog's
    /// lock, so a concurrent approval cannot be overtaken by an older judgement.
    pub fn install(
        &self,
        generation: u64,
        mut listing: UpstreamListing,
        quarantine: impl FnOnce(&mut UpstreamListing) -> Quarantine,
    ) -> bool {
        let mut state = self.lock();
        let name = listing.upstream.to_string();
        if state
            .floor
            .get(&name)
            .is_some_and(|floor| generation < *floor)
        {
            tracing::debug!(upstream = %name, generation, "dropping a listing from a replaced upstream");
            return false;
        }
        state.floor.insert(name.clone(), generation);
        listing.quarantine = quarantine(&mut listing);
        let mut part = self.build_part(&mut state, &listing);
        if let Some(installed) = state.by_upstream.get(&name) {
            part = installed.in_place_of(part);
        }
        state.by_upstream.insert(name, part);
        self.rebuild(&mut state);
        self.installed.send_modify(|count| *count += 1);
        true
    }

    /// Builds an upstream's part of the catalog, reporting what is wrong in it and
    /// how much of it is held.
    fn build_part(&self, state: &mut Listings, listing: &UpstreamListing) -> Arc<UpstreamPart> {
        let (part, warnings) = UpstreamPart::build(listing, state.options.name_budget);
        self.report(state, warnings);
        self.metrics
            .quarantined_entries
            .with_label_values(&[&listing.upstream])
            .set(part.held_count() as i64);
        Arc::new(part)
    }

    /// Judges again what of an upstream's installed listing is held (after an
    /// approval, a reset, or a policy change) and publishes the result if it changed.
    /// Returns whether the part was built anew.
    pub fn update_quarantine(
        &self,
        name: &str,
        quarantine: impl FnOnce(&mut UpstreamListing) -> Quarantine,
    ) -> bool {
        let mut state = self.lock();
        let Some(part) = state.by_upstream.get(name) else {
            return false;
        };
        let mut listing = part.listing();
        let judged = quarantine(&mut listing);
        // Judged anew either way: the listing was parsed again to be judged.
        self.installed.send_modify(|count| *count += 1);
        if judged == listing.quarantine {
            return false;
        }
        listing.quarantine = judged;
        let part = self.build_part(&mut state, &listing);
        state.by_upstream.insert(name.to_string(), part);
        self.rebuild(&mut state);
        true
    }

    /// Takes an upstream out of the catalog; listings of `generation` or older that
    /// arrive later are dropped.
    pub fn remove(&self, name: &str, generation: u64) {
        let mut state = self.lock();
        state.floor.insert(name.to_string(), generation + 1);
        if state.by_upstream.remove(name).is_some() {
            self.rebuild(&mut state);
        }
        let path = self.cache_path(name);
        self.writes.spawn_blocking(move || {
            if let Err(error) = std::fs::remove_file(&path) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), %error, "could not remove a removed upstream's listing");
                }
            }
        });
    }

    /// New names and filters for an upstream's entries (a reload changed them in place).
    pub fn rename(&self, name: &str, prefix: &str, filter: ToolFilter) {
        let mut state = self.lock();
        let Some(part) = state.by_upstream.get(name) else {
            return;
        };
        let mut listing = part.listing();
        listing.prefix = prefix.to_string();
        listing.tool_filter = filter;
        let part = self.build_part(&mut state, &listing);
        state.by_upstream.insert(name.to_string(), part);
        self.rebuild(&mut state);
    }

    /// New naming budget and page size (a reload changed them).
    pub fn set_options(&self, options: CatalogOptions) {
        let mut state = self.lock();
        if state.options != options {
            let renamed = state.options.name_budget != options.name_budget;
            state.options = options;
            if renamed {
                // Every exposed name may change: every part is built again.
                let listings: Vec<UpstreamListing> = state
                    .by_upstream
                    .values()
                    .map(|part| part.listing())
                    .collect();
                for listing in listings {
                    let part = self.build_part(&mut state, &listing);
                    state.by_upstream.insert(listing.upstream.to_string(), part);
                }
            }
            self.rebuild(&mut state);
        }
    }

    pub fn lists(&self, name: &str) -> bool {
        self.lock().by_upstream.contains_key(name)
    }

    /// Whether the catalog readers see (the published snapshot) lists `name`: a
    /// listing installed under [`CatalogHost::hold`] is not there until the release.
    pub fn publishes(&self, name: &str) -> bool {
        self.catalog.borrow().listed.contains(name)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Listings> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Defers publishing until [`CatalogHost::release`].
    pub fn hold(&self) {
        self.lock().held += 1;
    }

    /// Publishes what changed while held, as one snapshot, once no holder is left.
    pub fn release(&self) {
        let mut state = self.lock();
        state.held = state.held.saturating_sub(1);
        if state.held == 0 && std::mem::take(&mut state.dirty) {
            self.rebuild(&mut state);
        }
    }

    fn rebuild(&self, state: &mut Listings) {
        if state.held > 0 {
            state.dirty = true;
            return;
        }
        // The assembly's cost in real time (it is CPU work, no tokio clock runs it).
        #[allow(clippy::disallowed_types)]
        let started = std::time::Instant::now();
        let parts = state.by_upstream.values().cloned().collect();
        let listed = state.by_upstream.keys().cloned().collect();
        let (catalog, warnings) = Catalog::assemble(parts, &state.options);
        self.report(state, warnings);
        for kind in Kind::ALL {
            self.metrics
                .catalog_entries
                .with_label_values(&[kind.label()])
                .set(catalog.len(kind) as i64);
        }
        let views = state
            .views
            .iter()
            .map(|(name, view)| (name.clone(), Arc::new(catalog.restrict(view))))
            .collect();
        self.catalog.send_replace(Arc::new(Snapshot {
            all: Arc::new(catalog),
            views,
            listed,
        }));
        self.metrics
            .catalog_rebuild
            .observe(started.elapsed().as_secs_f64());
    }

    /// Logs and counts each warning the first time it is seen.
    fn report(&self, state: &mut Listings, warnings: Vec<CatalogWarning>) {
        for warning in warnings {
            let text = warning.to_string();
            if state.reported.insert(text.clone()) {
                let reason = match warning {
                    CatalogWarning::Collision { .. } => "collision",
                    CatalogWarning::InvalidEntry { .. } => "invalid_entry",
                    CatalogWarning::SchemaPatched { .. } => "schema_patched",
                    CatalogWarning::Shadowing { .. } => "tool_shadowing",
                };
                self.metrics
                    .catalog_warnings
                    .with_label_values(&[reason])
                    .inc();
                tracing::warn!(reason, "{text}");
            }
        }
    }

    fn cache_path(&self, upstream: &str) -> PathBuf {
        self.directory.join(format!("{upstream}.json"))
    }

    /// Keeps a listing on disk, off the async runtime (serialised here, from the
    /// listing itself: a copy of its tree of values would be several times its text).
    pub fn save(&self, listing: &UpstreamListing, capabilities: &Value) {
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Kept<'a> {
            capabilities: &'a Value,
            tools: &'a [Value],
            prompts: &'a [Value],
            resources: &'a [Value],
            resource_templates: &'a [Value],
        }
        let kept = Kept {
            capabilities,
            tools: &listing.tools,
            prompts: &listing.prompts,
            resources: &listing.resources,
            resource_templates: &listing.resource_templates,
        };
        let bytes = serde_json::to_vec(&kept).unwrap_or_default();
        let path = self.cache_path(&listing.upstream);
        let upstream = listing.upstream.clone();
        self.writes.spawn_blocking(move || {
            if let Err(error) = write_atomically(&path, &bytes, 0o644) {
                tracing::warn!(upstream = %upstream, %error, "could not keep the upstream's listing on disk");
            }
        });
    }

    /// The listing kept from an earlier run, if there is one, with the capabilities
    /// the upstream advertised then. `empty` is the upstream's listing with no entries.
    pub fn load(&self, mut listing: UpstreamListing) -> Option<(UpstreamListing, Value)> {
        let name = listing.upstream.clone();
        let text = std::fs::read_to_string(self.cache_path(&name)).ok()?;
        let parse = || serde_json::from_str::<Value>(&text);
        let parsed = if text.len() >= PARSE_APART_FROM {
            memory::apart(parse)
        } else {
            parse()
        };
        let Ok(Value::Object(mut body)) = parsed else {
            tracing::warn!(upstream = %name, "ignoring an unreadable cached listing");
            return None;
        };
        let capabilities = body.remove("capabilities").unwrap_or(Value::Null);
        let mut take = |key: &str| match body.remove(key) {
            Some(Value::Array(entries)) => entries,
            _ => Vec::new(),
        };
        listing.tools = take("tools");
        listing.prompts = take("prompts");
        listing.resources = take("resources");
        listing.resource_templates = take("resourceTemplates");
        // Last known, not fresh: nothing about it may be cached downstream.
        listing.cache = [Some(registry::CacheHint::NONE); 4];
        tracing::info!(upstream = %name, tools = listing.tools.len(), "listing the upstream's last-known catalog until it starts");
        Some((listing, capabilities))
    }
}

/// Writes a file by renaming a complete, synced temporary one over it, created
/// with permissions `mode`.
pub fn write_atomically(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    write_atomically_with(path, mode, |file| file.write_all(body))
}

/// Like [`write_atomically`], the contents written by `write` through a buffer, so
/// a large file is never whole in memory.
pub fn write_atomically_with(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // Unique per write: two writes of one file may overlap on the blocking pool.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let temporary = dir.join(format!(
        ".{}.{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)?;
    let mut buffered = std::io::BufWriter::with_capacity(64 * 1024, file);
    let written = write(&mut buffered)
        .and_then(|()| buffered.flush())
        .and_then(|()| buffered.get_ref().sync_all());
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn host_in(directory: &Path) -> CatalogHost {
        let metrics = Arc::new(Metrics::new().unwrap());
        CatalogHost::new(CatalogOptions::default(), directory.into(), metrics)
    }

    /// `upstream`'s listing under `prefix`, nothing in it yet.
    fn listing(upstream: &str, prefix: &str) -> UpstreamListing {
        UpstreamListing::empty(Arc::from(upstream), prefix.into(), ToolFilter::default())
    }

    /// A request routes in the published snapshot, so "listed" means published:
    /// a request that stopped waiting for an upstream's first listing once it was
    /// installed, but before the pump's release published it, routed nowhere.
    #[test]
    fn a_listing_installed_while_held_is_published_only_at_the_release() {
        let dir = tempfile::tempdir().unwrap();
        let host = host_in(dir.path());
        let mut listing = listing("fx", "fx");
        listing.tools =
            vec![serde_json::json!({"name": "echo", "inputSchema": {"type": "object"}})];
        host.hold();
        host.install(1, listing, |_| Quarantine::default());
        assert!(host.lists("fx"));
        assert!(!host.publishes("fx"));
        assert!(host.view(None).route_tool("fx__echo").is_none());
        host.release();
        assert!(host.publishes("fx"));
        assert!(host.view(None).route_tool("fx__echo").is_some());
    }

    #[test]
    fn a_hostile_cached_listing_is_loaded_or_ignored_and_never_panics() {
        let directory = tempfile::tempdir().unwrap();
        let host = host_in(directory.path());
        let empty = || listing("cached", "c");
        let seed = serde_json::json!({
            "capabilities": {"tools": {"listChanged": true}},
            "tools": [{"name": "echo", "inputSchema": {"type": "object"}}],
            "prompts": [{"name": "greet"}],
            "resources": [{"uri": "file:///a", "name": "a"}],
            "resourceTemplates": [{"uriTemplate": "x://{id}", "name": "x"}],
        });
        let mut cases = mutations::cases(&[seed.to_string().as_bytes()], 800, 0xCAC4);
        cases.extend(mutations::value_mutants(&seed, 800, 0xCAC5));
        let path = directory.path().join("cached.json");
        mutations::check("a cached listing", &cases, 256, |file| {
            std::fs::write(&path, file).unwrap();
            if let Some((listing, _)) = host.load(empty()) {
                // As any listing: it builds a catalog.
                let _ = Catalog::build(&[listing], &CatalogOptions::default());
            }
        });
    }
}
