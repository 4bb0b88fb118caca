//! Pins: the fingerprints of each upstream's catalog as first seen (trust on first
//! use), with the definitions they were taken from, kept in a pin file
//! (`plexus.lock` beside the config). Every fresh listing is checked against them;
//! a change is classified field by field, logged once per change with its path and
//! old and new values, and counted.
//!
//! A pin file that cannot be read or parsed is never overwritten: nothing is
//! pinned or checked until it is mended, and the error names the file and line.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use registry::fingerprint::{self, ListingSnapshot};
use registry::Kind;
use serde::{Deserialize, Serialize};

use crate::catalog_host::write_atomically;
use crate::metrics::Metrics;

/// The pin file's layout: sorted maps, one block per upstream and entry.
#[derive(Debug, Default, Serialize, Deserialize)]
struct PinFile {
    format: u32,
    upstreams: BTreeMap<String, UpstreamPin>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct UpstreamPin {
    /// Unix seconds.
    pinned_at: u64,
    catalog_fingerprint: String,
    /// `<kind>/<identity>` → both hashes.
    entries: BTreeMap<String, EntryPin>,
    /// What was pinned, so a change can be shown field by field.
    listing: ListingSnapshot,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct EntryPin {
    compatibility: String,
    security: String,
}

enum PinState {
    Loaded(PinFile),
    /// Unreadable: left alone, and the reason repeated at every check.
    Unreadable(String),
}

pub struct Pins {
    path: PathBuf,
    state: Mutex<PinState>,
    /// The catalog fingerprint whose changes were last reported, per upstream, so a
    /// drift is logged once, not at every check.
    reported: Mutex<HashMap<String, String>>,
    metrics: Arc<Metrics>,
}

const FORMAT: u32 = 1;

impl Pins {
    /// Reads the pin file; a missing one is empty.
    pub fn load(path: &Path, metrics: Arc<Metrics>) -> Pins {
        let state = match std::fs::read_to_string(path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                PinState::Loaded(PinFile {
                    format: FORMAT,
                    ..PinFile::default()
                })
            }
            Err(error) => PinState::Unreadable(format!("cannot read {}: {error}", path.display())),
            Ok(text) => match serde_json::from_str::<PinFile>(&text) {
                Ok(file) => PinState::Loaded(file),
                Err(error) => PinState::Unreadable(format!(
                    "{} is not a valid pin file (line {}, column {}): {error}",
                    path.display(),
                    error.line(),
                    error.column()
                )),
            },
        };
        if let PinState::Unreadable(reason) = &state {
            tracing::error!(
                "{reason}; nothing is pinned or checked, and the file is left as it is"
            );
        }
        Pins {
            path: path.to_path_buf(),
            state: Mutex::new(state),
            reported: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Checks a fresh listing of `upstream` against its pin, pinning it if it has none.
    pub fn check(&self, upstream: &str, snapshot: ListingSnapshot) {
        let current = fingerprint::catalog_fingerprint(&snapshot);
        self.metrics.catalog_fingerprint(upstream, &current);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let file = match &mut *state {
            PinState::Unreadable(reason) => {
                tracing::error!(upstream, "{reason}; the upstream's catalog is not checked");
                self.count(upstream, "pin_file_unreadable");
                return;
            }
            PinState::Loaded(file) => file,
        };
        let Some(pin) = file.upstreams.get(upstream) else {
            tracing::info!(upstream, fingerprint = %current, entries = entry_count(&snapshot), "pinned the upstream's catalog on first sight");
            file.upstreams
                .insert(upstream.to_string(), pin_of(snapshot, current));
            self.count(upstream, "pinned");
            self.save(file);
            return;
        };
        if pin.catalog_fingerprint == current {
            self.count(upstream, "unchanged");
            return;
        }
        self.count(upstream, "changed");
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        if reported.get(upstream) == Some(&current) {
            return;
        }
        reported.insert(upstream.to_string(), current.clone());
        for change in fingerprint::classify(&pin.listing, &snapshot) {
            let class = serde_json::to_value(change.class)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default();
            self.metrics
                .schema_changes
                .with_label_values(&[upstream, &class])
                .inc();
            let old = change.old.map(|v| v.to_string()).unwrap_or_default();
            let new = change.new.map(|v| v.to_string()).unwrap_or_default();
            tracing::warn!(
                upstream,
                class,
                kind = %change.kind,
                entry = %change.identity,
                path = %change.path,
                reason = %change.reason,
                %old,
                %new,
                pinned = %pin.catalog_fingerprint,
                now = %current,
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

    /// Writes the pin file (mode 0600) off the runtime.
    fn save(&self, file: &PinFile) {
        let mut bytes = match serde_json::to_vec_pretty(file) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(%error, "cannot serialise the pins");
                return;
            }
        };
        bytes.push(b'\n');
        let path = self.path.clone();
        let write = move || {
            if let Err(error) = write_atomically(&path, &bytes, 0o600) {
                tracing::error!(path = %path.display(), %error, "cannot write the pin file");
            }
        };
        // Outside a runtime (tests), write in place.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(write)),
            Err(_) => write(),
        }
    }
}

fn pin_of(listing: ListingSnapshot, catalog_fingerprint: String) -> UpstreamPin {
    let mut entries = BTreeMap::new();
    for kind in Kind::ALL {
        for entry in listing.entries(kind) {
            if let Some(print) = fingerprint::fingerprint(kind, entry) {
                entries.insert(
                    format!("{}/{}", kind.result_key(), print.identity),
                    EntryPin {
                        compatibility: print.compatibility,
                        security: print.security,
                    },
                );
            }
        }
    }
    UpstreamPin {
        pinned_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs())
            .unwrap_or(0),
        catalog_fingerprint,
        entries,
        listing,
    }
}

fn entry_count(listing: &ListingSnapshot) -> usize {
    Kind::ALL
        .iter()
        .map(|kind| listing.entries(*kind).len())
        .sum()
}
