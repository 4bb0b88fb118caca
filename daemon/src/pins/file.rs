//! The pin file's layout and the operations on it, shared by the daemon and the
//! offline `plexus pins` commands: what each upstream's catalog was pinned as (every
//! entry's hashes and definition, the server's name, version and instructions, when),
//! what was last seen where that differs (`pending`), and the history of approvals.
//!
//! Sorted maps and pretty JSON, one block per upstream and per entry, so the file
//! reads and diffs well under version control.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use registry::fingerprint::{self, Change, ChangeClass, ListingSnapshot};
use registry::{EntryText, Kind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::keyed::{PinKey, PinMap};

pub const FORMAT: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid pin file (line {line}, column {column}): {reason}")]
    Parse {
        path: String,
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("{path} has pin format {found}; this plexus reads formats 1 and {FORMAT}")]
    Format { path: String, found: u64 },
    #[error("no upstream `{0}` in the pin file")]
    UnknownUpstream(String),
    #[error("nothing of upstream `{0}` is waiting for approval: its catalog is as pinned")]
    NothingPending(String),
    #[error(
        "upstream `{upstream}` lists nothing named `{name}`, and nothing of that name is pinned"
    )]
    UnknownEntry { upstream: String, name: String },
}

/// The whole file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PinFile {
    pub format: u32,
    pub upstreams: BTreeMap<String, UpstreamRecord>,
}

/// One upstream: what was approved, what was seen since if it differs, and how it got here.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UpstreamRecord {
    /// None until first sight (trust on first use) or, with `pin = "strict"`, approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<Pinned>,
    /// The last catalog seen that differs from `pinned`: what an approval pins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Seen>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Approval>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Server {
    pub name: Option<String>,
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pinned {
    /// RFC 3339: when this upstream was first pinned.
    pub pinned_at: String,
    /// RFC 3339: the last approval, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<String>,
    pub catalog_fingerprint: String,
    pub server: Server,
    /// `<kind>/<name, URI or template>` → the entry as pinned.
    #[serde(serialize_with = "with_digests")]
    pub entries: PinMap<EntryPin>,
}

/// An entry as pinned. The file gives each its compatibility and security digests
/// too; they are a function of the definition, written from it (`with_digests`)
/// and not held: nothing here reads them, and they were half of a catalog's pins.
#[derive(Clone, Debug, Deserialize)]
pub struct EntryPin {
    /// RFC 3339: when this definition was pinned.
    pub pinned_at: Stamp,
    /// The entry exactly as the upstream sent it, so a change can be shown field by field.
    pub definition: Definition,
}

impl EntryPin {
    /// `entry`, whose definition is `definition`, pinned `at`; `None` for an entry
    /// without a name (nothing to pin it by).
    fn of(kind: Kind, entry: &Value, at: &Stamp, definition: Definition) -> Option<EntryPin> {
        fingerprint::identity(kind, entry)?;
        Some(EntryPin {
            pinned_at: at.clone(),
            definition,
        })
    }
}

/// Pinned entries as the file has them: each one's digests (SHA-256, hex), then
/// when it was pinned and its definition.
fn with_digests<S: serde::Serializer>(
    entries: &PinMap<EntryPin>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    #[derive(Serialize)]
    struct Written<'a> {
        compatibility: &'a str,
        security: &'a str,
        pinned_at: &'a Stamp,
        definition: &'a Value,
    }
    let mut map = serializer.serialize_map(Some(entries.len()))?;
    for (key, pin) in entries {
        let definition = pin.definition.value();
        let print = key
            .kind()
            .and_then(|kind| fingerprint::fingerprint(kind, &definition));
        let (compatibility, security) = print.as_ref().map_or(("", ""), |print| {
            (print.compatibility.as_str(), print.security.as_str())
        });
        let written = Written {
            compatibility,
            security,
            pinned_at: &pin.pinned_at,
            definition: &definition,
        };
        map.serialize_entry(key, &written)?;
    }
    map.end()
}

/// A time an entry was pinned, held once however many entries were pinned then
/// (most of a catalog's are pinned at one time, and a copy each was a fifth of them),
/// behind a thin pointer: every pinned entry holds one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Stamp(#[serde(with = "shared_str")] Arc<String>);

impl Stamp {
    pub fn new(at: &str) -> Stamp {
        Stamp(Arc::new(at.to_string()))
    }

    /// Whether both are the one stamp, not equal copies.
    #[cfg(test)]
    pub fn is_shared_with(&self, other: &Stamp) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

mod shared_str {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(text: &Arc<String>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<String>, D::Error> {
        String::deserialize(deserializer).map(Arc::new)
    }
}

/// Every entry's stamp that equals another's becomes the same one.
fn share_stamps<'a>(stamps: impl Iterator<Item = &'a mut Stamp>) {
    let mut seen: HashSet<Stamp> = HashSet::new();
    for stamp in stamps {
        match seen.get(stamp) {
            Some(shared) => *stamp = shared.clone(),
            None => {
                seen.insert(stamp.clone());
            }
        }
    }
}

/// Moves `definitions` into one buffer. Read from the file, each was allocated among
/// the keys and times kept beside it; once the catalog's texts replace them, a
/// buffer is freed whole, where scattered texts would leave pages the allocator
/// cannot return.
fn pack<'a>(definitions: impl Iterator<Item = &'a mut Definition>) {
    let mut definitions: Vec<&mut Definition> = definitions.collect();
    let packed = EntryText::pack(definitions.iter().map(|definition| definition.0.as_str()));
    for (definition, text) in definitions.iter_mut().zip(packed) {
        definition.0 = text;
    }
}

/// An entry's definition, held as compact JSON (a tree of values is about ten
/// times its text) and written to the file pretty-printed like the rest. Where the
/// catalog lists the same entry, the text is the catalog's, not a copy.
#[derive(Clone, Debug, PartialEq)]
pub struct Definition(EntryText);

impl Definition {
    pub fn of(value: &Value) -> Definition {
        Definition(EntryText::own(
            serde_json::to_string(value).unwrap_or_default(),
        ))
    }

    /// The definitions of `values`, written into one buffer: a catalog's are made
    /// together, and freed together once the catalog's own texts replace them.
    fn packed<'a>(values: impl IntoIterator<Item = &'a Value>) -> Vec<Definition> {
        EntryText::pack_with(values, |value, out| {
            if serde_json::to_writer(&mut *out, value).is_err() {
                out.extend_from_slice(b"null");
            }
        })
        .into_iter()
        .map(Definition)
        .collect()
    }

    /// The definition as values; written by `of` from a value, so it reads back.
    pub fn value(&self) -> Value {
        serde_json::from_str(self.0.as_str()).unwrap_or(Value::Null)
    }

    /// Takes the equal text among `texts`, if there is one; otherwise a text of its
    /// own, so a changed entry does not keep a whole earlier buffer alive.
    fn share(&mut self, texts: &HashMap<&str, &EntryText>) {
        self.0 = match texts.get(self.0.as_str()) {
            Some(text) => (*text).clone(),
            None => self.0.detached(),
        };
    }
}

impl Serialize for Definition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Definition {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|value| Definition::of(&value))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Seen {
    /// RFC 3339: when this catalog was first seen.
    pub seen_at: String,
    pub catalog_fingerprint: String,
    pub server: Server,
    /// `<kind>/<name, URI or template>` → the entry as seen.
    pub entries: PinMap<Definition>,
}

/// One approval: what was approved, between which fingerprints, and the changes it accepted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Approval {
    pub at: String,
    /// `*` for the whole catalog, else the approved entry's name, URI or template.
    pub approved: String,
    pub from: Option<String>,
    pub to: String,
    pub changes: Vec<ChangeLine>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChangeLine {
    pub class: ChangeClass,
    pub entry: String,
    pub path: String,
    pub reason: String,
}

impl ChangeLine {
    fn of(change: &Change) -> ChangeLine {
        ChangeLine {
            class: change.class,
            entry: format!("{}/{}", change.kind, change.identity),
            path: change.path.clone(),
            reason: change.reason.clone(),
        }
    }
}

/// What checking a fresh listing against the file found.
pub enum Observation {
    /// Nothing was pinned: it is now (trust on first use).
    PinnedOnFirstSight,
    /// Nothing is pinned and pinning is strict: waiting for approval.
    Unapproved,
    Unchanged,
    /// It differs from the pin; the changes, and whether this drift was seen before.
    Changed {
        changes: Vec<Change>,
        new: bool,
    },
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

impl Server {
    fn of(snapshot: &ListingSnapshot) -> Server {
        Server {
            name: snapshot.server_name.clone(),
            version: snapshot.server_version.clone(),
            instructions: snapshot.instructions.clone(),
        }
    }
}

/// The entries of a snapshot by key (each key's text its own until it is made a
/// view of its definition's).
fn keyed(snapshot: &ListingSnapshot) -> PinMap<(Kind, &Value)> {
    Kind::ALL
        .into_iter()
        .flat_map(|kind| {
            snapshot.entries(kind).iter().filter_map(move |entry| {
                let identity = fingerprint::identity(kind, entry)?;
                Some((PinKey::of(kind, identity), (kind, entry)))
            })
        })
        .collect::<PinMap<_>>()
}

/// A snapshot rebuilt from keyed definitions.
fn snapshot_of<'a>(
    server: &Server,
    entries: impl Iterator<Item = (&'a PinKey, &'a Definition)>,
) -> ListingSnapshot {
    let mut snapshot = ListingSnapshot {
        server_name: server.name.clone(),
        server_version: server.version.clone(),
        instructions: server.instructions.clone(),
        ..ListingSnapshot::default()
    };
    for (key, definition) in entries {
        let list = match key.kind() {
            Some(Kind::Tools) => &mut snapshot.tools,
            Some(Kind::Prompts) => &mut snapshot.prompts,
            Some(Kind::Resources) => &mut snapshot.resources,
            Some(Kind::ResourceTemplates) => &mut snapshot.resource_templates,
            None => continue,
        };
        list.push(definition.value());
    }
    snapshot
}

impl Pinned {
    /// The part of the pin and of `observed` that can differ: the observed entries
    /// whose JSON is not their pinned definition's, and those pinned definitions,
    /// with both sides' instructions. What `fingerprint::drift` holds of the pair is
    /// what it holds of the whole pin and listing, and an unchanged listing costs no
    /// parse of the pin.
    pub fn differing(&self, observed: &ListingSnapshot) -> (ListingSnapshot, ListingSnapshot) {
        let mut pinned = snapshot_of(&self.server, std::iter::empty());
        let mut seen = ListingSnapshot {
            server_name: observed.server_name.clone(),
            server_version: observed.server_version.clone(),
            instructions: observed.instructions.clone(),
            ..ListingSnapshot::default()
        };
        let mut taken: HashSet<&PinKey> = HashSet::new();
        let (mut key, mut json) = (String::new(), Vec::new());
        for kind in Kind::ALL {
            for entry in observed.entries(kind) {
                let Some(identity) = fingerprint::identity(kind, entry) else {
                    continue;
                };
                PinKey::write(kind, identity, &mut key);
                let pin = self.entries.get_key_value(key.as_str());
                json.clear();
                if serde_json::to_writer(&mut json, entry).is_ok()
                    && pin.is_some_and(|(_, pin)| pin.definition.0.as_str().as_bytes() == json)
                {
                    continue;
                }
                seen.entries_mut(kind).push(entry.clone());
                if let Some((key, pin)) = pin {
                    if taken.insert(key) {
                        pinned.entries_mut(kind).push(pin.definition.value());
                    }
                }
            }
        }
        (pinned, seen)
    }

    pub fn snapshot(&self) -> ListingSnapshot {
        snapshot_of(
            &self.server,
            self.entries.iter().map(|(key, pin)| (key, &pin.definition)),
        )
    }

    /// `snapshot`, whose catalog fingerprint is `fingerprint`, pinned `at`.
    fn of(snapshot: &ListingSnapshot, fingerprint: String, at: &str) -> Pinned {
        let stamp = Stamp::new(at);
        // Collected in key order, so the map is built with full nodes (inserted one
        // by one, its nodes would be half empty).
        let keyed = keyed(snapshot);
        let definitions = Definition::packed(keyed.values().map(|(_, entry)| *entry));
        let mut entries: PinMap<EntryPin> = keyed
            .into_iter()
            .zip(definitions)
            .filter_map(|((key, (kind, entry)), definition)| {
                Some((key, EntryPin::of(kind, entry, &stamp, definition)?))
            })
            .collect();
        entries.key_into(|pin| &pin.definition.0);
        Pinned {
            pinned_at: at.to_string(),
            approved_at: None,
            catalog_fingerprint: fingerprint,
            server: Server::of(snapshot),
            entries,
        }
    }
}

impl Seen {
    pub fn snapshot(&self) -> ListingSnapshot {
        snapshot_of(&self.server, self.entries.iter())
    }

    fn of(snapshot: &ListingSnapshot, fingerprint: String, at: &str) -> Seen {
        let keyed = keyed(snapshot);
        let definitions = Definition::packed(keyed.values().map(|(_, entry)| *entry));
        let mut entries: PinMap<Definition> = keyed
            .into_iter()
            .zip(definitions)
            .map(|((key, _), definition)| (key, definition))
            .collect();
        entries.key_into(|definition| &definition.0);
        Seen {
            seen_at: at.to_string(),
            catalog_fingerprint: fingerprint,
            server: Server::of(snapshot),
            entries,
        }
    }
}

impl UpstreamRecord {
    /// What an approval would accept: pinned → pending, field by field.
    pub fn changes(&self) -> Vec<Change> {
        match &self.pending {
            None => Vec::new(),
            Some(pending) => {
                let pinned = self
                    .pinned
                    .as_ref()
                    .map(Pinned::snapshot)
                    .unwrap_or_default();
                fingerprint::classify(&pinned, &pending.snapshot())
            }
        }
    }
}

impl PinFile {
    pub fn empty() -> PinFile {
        PinFile {
            format: FORMAT,
            upstreams: BTreeMap::new(),
        }
    }

    /// Reads `path`; a missing file is an empty one.
    pub fn read(path: &Path) -> Result<PinFile, PinError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PinFile::empty())
            }
            Err(source) => {
                return Err(PinError::Read {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        PinFile::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<PinFile, PinError> {
        let parse_error = |error: serde_json::Error| PinError::Parse {
            path: path.display().to_string(),
            line: error.line(),
            column: error.column(),
            reason: error.to_string(),
        };
        // Read straight into the types, never as one tree of values: that tree is
        // several times the file, and the definitions kept from it would be
        // scattered through its freed pages, which the allocator can then not return.
        #[derive(Deserialize)]
        struct Format {
            format: Option<Value>,
        }
        let format = serde_json::from_str::<Format>(text).map_err(parse_error)?;
        match format.format.as_ref().and_then(Value::as_u64) {
            Some(1) => {
                let old: v1::PinFile = serde_json::from_str(text).map_err(parse_error)?;
                Ok(old.upgrade().packed())
            }
            Some(2) => serde_json::from_str(text)
                .map(PinFile::packed)
                .map_err(parse_error),
            other => Err(PinError::Format {
                path: path.display().to_string(),
                found: other.unwrap_or(0),
            }),
        }
    }

    /// `upstream`'s pinned and pending definitions take the equal texts among
    /// `texts` (its catalog's), so an entry's JSON is kept once.
    pub fn share_texts(&mut self, upstream: &str, texts: &[EntryText]) {
        let Some(record) = self.upstreams.get_mut(upstream) else {
            return;
        };
        let texts: HashMap<&str, &EntryText> =
            texts.iter().map(|text| (text.as_str(), text)).collect();
        if let Some(pinned) = &mut record.pinned {
            for pin in pinned.entries.values_mut() {
                pin.definition.share(&texts);
            }
            pinned.entries.key_into(|pin| &pin.definition.0);
        }
        if let Some(pending) = &mut record.pending {
            for definition in pending.entries.values_mut() {
                definition.share(&texts);
            }
            pending.entries.key_into(|definition| &definition.0);
        }
    }

    /// The definitions as read moved into one buffer per map, and the keys made
    /// views of them.
    fn packed(mut self) -> PinFile {
        for record in self.upstreams.values_mut() {
            if let Some(pinned) = &mut record.pinned {
                pack(pinned.entries.values_mut().map(|pin| &mut pin.definition));
                share_stamps(pinned.entries.values_mut().map(|pin| &mut pin.pinned_at));
                pinned.entries.key_into(|pin| &pin.definition.0);
            }
            if let Some(pending) = &mut record.pending {
                pack(pending.entries.values_mut());
                pending.entries.key_into(|definition| &definition.0);
            }
        }
        self
    }

    /// Pretty JSON with a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        let _ = self.write_to(&mut bytes);
        bytes
    }

    /// Writes the file's contents (pretty JSON with a final newline) to `out`.
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        out.write_all(b"\n")
    }

    /// Checks a fresh listing of `upstream` and records what it found: a first
    /// sight is pinned (unless `strict`), a listing that differs is kept as pending.
    /// Returns what was found and whether the file changed.
    #[cfg(test)]
    pub fn observe(
        &mut self,
        upstream: &str,
        snapshot: &ListingSnapshot,
        strict: bool,
    ) -> (Observation, bool) {
        let current = fingerprint::catalog_fingerprint(snapshot);
        self.observe_fingerprinted(upstream, snapshot, current, strict)
    }

    /// [`PinFile::observe`] of a snapshot whose catalog fingerprint is `current`
    /// (every entry hashed: the caller has it already).
    pub fn observe_fingerprinted(
        &mut self,
        upstream: &str,
        snapshot: &ListingSnapshot,
        current: String,
        strict: bool,
    ) -> (Observation, bool) {
        let record = self.upstreams.entry(upstream.to_string()).or_default();
        let Some(pinned) = &record.pinned else {
            if strict {
                let dirty =
                    record.pending.as_ref().map(|p| &p.catalog_fingerprint) != Some(&current);
                if dirty {
                    record.pending = Some(Seen::of(snapshot, current, &now()));
                }
                return (Observation::Unapproved, dirty);
            }
            record.pinned = Some(Pinned::of(snapshot, current, &now()));
            record.pending = None;
            return (Observation::PinnedOnFirstSight, true);
        };
        if pinned.catalog_fingerprint == current {
            let dirty = record.pending.take().is_some();
            return (Observation::Unchanged, dirty);
        }
        let changes = fingerprint::classify(&pinned.snapshot(), snapshot);
        let new = record.pending.as_ref().map(|p| &p.catalog_fingerprint) != Some(&current);
        if new {
            record.pending = Some(Seen::of(snapshot, current, &now()));
        }
        (Observation::Changed { changes, new }, new)
    }

    /// Approves what is pending for `upstream`: all of it, or the entries named `name`
    /// (of any kind). Returns the approval recorded.
    pub fn approve(&mut self, upstream: &str, name: Option<&str>) -> Result<Approval, PinError> {
        let record = self
            .upstreams
            .get_mut(upstream)
            .ok_or_else(|| PinError::UnknownUpstream(upstream.to_string()))?;
        let pending = record
            .pending
            .clone()
            .ok_or_else(|| PinError::NothingPending(upstream.to_string()))?;
        let at = now();
        let from = record
            .pinned
            .as_ref()
            .map(|p| p.catalog_fingerprint.clone());
        let all_changes = record.changes();
        let pending_snapshot = pending.snapshot();
        let (pinned, approved, changes) = match name {
            None => (
                Pinned::of(&pending_snapshot, pending.catalog_fingerprint.clone(), &at),
                "*".to_string(),
                all_changes,
            ),
            Some(name) => {
                let mut pinned = record.pinned.clone().unwrap_or_else(|| Pinned {
                    pinned_at: at.clone(),
                    approved_at: None,
                    catalog_fingerprint: String::new(),
                    server: pending.server.clone(),
                    entries: PinMap::new(),
                });
                let named = |key: &PinKey| key.identity() == name;
                let seen: Vec<(PinKey, Value)> = pending
                    .entries
                    .iter()
                    .filter(|(key, _)| named(key))
                    .map(|(key, definition)| (key.clone(), definition.value()))
                    .collect();
                let gone: Vec<PinKey> = pinned
                    .entries
                    .keys()
                    .filter(|key| named(key) && !pending.entries.contains_key(&key.to_string()))
                    .cloned()
                    .collect();
                if seen.is_empty() && gone.is_empty() {
                    return Err(PinError::UnknownEntry {
                        upstream: upstream.to_string(),
                        name: name.to_string(),
                    });
                }
                for key in gone {
                    pinned.entries.remove(&key.to_string());
                }
                let stamp = Stamp::new(&at);
                for (key, definition) in seen {
                    let Some(pin) = key.kind().and_then(|kind| {
                        EntryPin::of(kind, &definition, &stamp, Definition::of(&definition))
                    }) else {
                        continue;
                    };
                    pinned.entries.insert(key, pin);
                }
                pinned.entries.key_into(|pin| &pin.definition.0);
                pinned.catalog_fingerprint = fingerprint::catalog_fingerprint(&pinned.snapshot());
                let changes = all_changes
                    .into_iter()
                    .filter(|change| change.kind != "server" && change.identity == name)
                    .collect();
                (pinned, name.to_string(), changes)
            }
        };
        let mut pinned = pinned;
        pinned.approved_at = Some(at.clone());
        if let Some(previous) = &record.pinned {
            pinned.pinned_at = previous.pinned_at.clone();
        }
        let approval = Approval {
            at,
            approved,
            from,
            to: pinned.catalog_fingerprint.clone(),
            changes: changes.iter().map(ChangeLine::of).collect(),
        };
        if pinned.catalog_fingerprint == pending.catalog_fingerprint {
            record.pending = None;
        }
        record.pinned = Some(pinned);
        record.history.push(approval.clone());
        Ok(approval)
    }

    /// Forgets `upstream`'s pin: its next sight is a first sight again.
    pub fn reset(&mut self, upstream: &str) -> Result<(), PinError> {
        self.upstreams
            .remove(upstream)
            .map(drop)
            .ok_or_else(|| PinError::UnknownUpstream(upstream.to_string()))
    }
}

/// The first layout: one listing per upstream, hashes per entry, unix seconds.
mod v1 {
    use std::collections::BTreeMap;
    use std::time::{Duration, UNIX_EPOCH};

    use registry::fingerprint::ListingSnapshot;
    use serde::Deserialize;

    use super::{Pinned, UpstreamRecord, FORMAT};

    #[derive(Deserialize)]
    pub struct PinFile {
        upstreams: BTreeMap<String, UpstreamPin>,
    }

    #[derive(Deserialize)]
    struct UpstreamPin {
        pinned_at: u64,
        listing: ListingSnapshot,
    }

    impl PinFile {
        pub fn upgrade(self) -> super::PinFile {
            let upstreams = self
                .upstreams
                .into_iter()
                .map(|(name, pin)| {
                    let at = humantime::format_rfc3339_seconds(
                        UNIX_EPOCH + Duration::from_secs(pin.pinned_at),
                    )
                    .to_string();
                    let record = UpstreamRecord {
                        pinned: Some(Pinned::of(
                            &pin.listing,
                            registry::fingerprint::catalog_fingerprint(&pin.listing),
                            &at,
                        )),
                        pending: None,
                        history: Vec::new(),
                    };
                    (name, record)
                })
                .collect();
            super::PinFile {
                format: FORMAT,
                upstreams,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn listing(description: &str) -> ListingSnapshot {
        ListingSnapshot {
            server_name: Some("fx".into()),
            server_version: Some("1".into()),
            tools: vec![
                json!({"name": "add", "description": description, "inputSchema": {"type": "object"}}),
                json!({"name": "echo", "inputSchema": {"type": "object"}}),
            ],
            ..ListingSnapshot::default()
        }
    }

    /// What drift holds of the differing part of a pin and a listing is what it
    /// holds of the whole: changed, new and duplicated entries, an entry equal in
    /// value but not in text, changed instructions; an unchanged listing has no part.
    #[test]
    fn the_differing_part_holds_what_the_whole_does() {
        let mut file = PinFile::empty();
        let mut pinned = listing("Adds.");
        pinned
            .tools
            .push(json!({"name": "gone", "inputSchema": {"type": "object"}}));
        pinned.prompts = vec![json!({"name": "greet", "description": "Hi."})];
        file.observe("alpha", &pinned, false);
        let pin = file.upstreams["alpha"].pinned.clone().unwrap();

        let (was, now) = pin.differing(&pinned);
        assert!(was.tools.is_empty() && now.tools.is_empty() && now.prompts.is_empty());
        assert!(fingerprint::drift(&was, &now).entries.is_empty());

        let mut observed = listing("Adds. Then mails the sum.");
        observed.instructions = Some("new".into());
        observed.tools.extend([
            json!({"name": "new", "inputSchema": {"type": "object"}}),
            json!({"name": "echo", "inputSchema": {"type": "object"}, "description": "twin"}),
        ]);
        // Equal in value, written in another order.
        observed.prompts = vec![json!({"description": "Hi.", "name": "greet"})];
        let whole = fingerprint::drift(&pin.snapshot(), &observed);
        let (was, now) = pin.differing(&observed);
        let part = fingerprint::drift(&was, &now);
        assert_eq!(part.entries, whole.entries);
        assert_eq!(part.instructions, whole.instructions);
        let mut held: Vec<&str> = whole
            .entries
            .keys()
            .map(|(_, name)| name.as_str())
            .collect();
        held.sort_unstable();
        assert_eq!(held, ["add", "echo", "new"]);
        assert!(whole.instructions);
    }

    #[test]
    fn definitions_take_the_catalogs_texts_and_the_file_reads_the_same() {
        let mut file = PinFile::empty();
        let (pinned, drifted) = (listing("Adds."), listing("Adds. Then mails the sum."));
        file.observe("alpha", &pinned, false);
        file.observe("alpha", &drifted, false);
        let before = file.to_bytes();
        let part = |snapshot: &ListingSnapshot| {
            let listing = registry::UpstreamListing {
                upstream: "alpha".into(),
                prefix: "alpha".into(),
                tool_filter: registry::ToolFilter::default(),
                tools: snapshot.tools.clone(),
                prompts: Vec::new(),
                resources: Vec::new(),
                resource_templates: Vec::new(),
                instructions: None,
                quarantine: registry::Quarantine::default(),
                cache: [None; 4],
            };
            registry::UpstreamPart::build(&listing, 64).0
        };
        // The catalog lists the drifted tools: the pending definitions and the
        // pinned `echo` (unchanged) take its texts; the pinned `add` keeps its own.
        let texts: Vec<EntryText> = part(&drifted).entry_texts().collect();
        file.share_texts("alpha", &texts);
        let record = &file.upstreams["alpha"];
        let shared = |definition: &Definition| {
            texts
                .iter()
                .any(|text| text.shares_text_with(&definition.0))
        };
        let pending = &record.pending.as_ref().unwrap().entries;
        assert!(pending.values().all(shared));
        let pins = &record.pinned.as_ref().unwrap().entries;
        assert!(shared(&pins["tools/echo"].definition));
        assert!(!shared(&pins["tools/add"].definition));
        let add_text = pins["tools/add"].definition.0.as_str().to_string();
        // The changed entry's pin, once a view of the earlier catalog's texts, is
        // moved to a text of its own when the next catalog no longer lists it.
        let earlier: Vec<EntryText> = part(&pinned).entry_texts().collect();
        file.share_texts("alpha", &earlier);
        let add = file.upstreams["alpha"].pinned.as_ref().unwrap().entries["tools/add"]
            .definition
            .0
            .clone();
        assert!(earlier.iter().any(|text| text.shares_text_with(&add)));
        file.share_texts("alpha", &texts);
        let add = &file.upstreams["alpha"].pinned.as_ref().unwrap().entries["tools/add"]
            .definition
            .0;
        assert!(!earlier.iter().any(|text| text.shares_text_with(add)));
        assert_eq!(add.as_str(), add_text);
        // The keys follow their definitions to the texts they share.
        let pins = &file.upstreams["alpha"].pinned.as_ref().unwrap().entries;
        assert!(pins
            .iter()
            .all(|(key, pin)| key.is_view_of(&pin.definition.0)));
        assert_eq!(file.to_bytes(), before);
    }

    /// Entries pinned at one time share one stamp, their definitions one buffer,
    /// and their keys that buffer too, as pinned and as read back.
    #[test]
    fn entries_pinned_at_one_time_share_their_stamp_and_buffers() {
        let mut file = PinFile::empty();
        file.observe("alpha", &listing("Adds."), false);
        let shared = |file: &PinFile| {
            let pins = &file.upstreams["alpha"].pinned.as_ref().unwrap().entries;
            let (add, echo) = (&pins["tools/add"], &pins["tools/echo"]);
            assert_eq!(add.pinned_at, echo.pinned_at);
            assert_eq!(add.definition.value()["name"], "add");
            let keys: Vec<&PinKey> = pins.keys().collect();
            assert_eq!(keys[0].to_string(), "tools/add");
            add.pinned_at.is_shared_with(&echo.pinned_at)
                && add.definition.0.shares_text_with(&echo.definition.0)
                && keys[0].is_view_of(&add.definition.0)
                && keys[1].is_view_of(&echo.definition.0)
        };
        assert!(shared(&file));
        let bytes = file.to_bytes();
        let read = PinFile::parse(
            Path::new("plexus.lock"),
            std::str::from_utf8(&bytes).unwrap(),
        )
        .unwrap();
        assert!(shared(&read));
        assert_eq!(read.to_bytes(), bytes);
    }

    /// The digests the file gives each entry are its fingerprint, computed as the
    /// file is written, whether the pin was taken now or read from a file.
    #[test]
    fn the_file_gives_each_entry_its_fingerprint() {
        let mut file = PinFile::empty();
        let snapshot = listing("Adds.");
        file.observe("alpha", &snapshot, false);
        let check = |bytes: &[u8]| {
            let written: Value = serde_json::from_slice(bytes).unwrap();
            let entries = &written["upstreams"]["alpha"]["pinned"]["entries"];
            for tool in &snapshot.tools {
                let name = tool["name"].as_str().unwrap();
                let print = fingerprint::fingerprint(Kind::Tools, tool).unwrap();
                let entry = &entries[format!("tools/{name}")];
                assert_eq!(entry["compatibility"], print.compatibility.as_str());
                assert_eq!(entry["security"], print.security.as_str());
                assert_eq!(&entry["definition"], tool);
            }
        };
        let bytes = file.to_bytes();
        check(&bytes);
        let read = PinFile::parse(
            Path::new("plexus.lock"),
            std::str::from_utf8(&bytes).unwrap(),
        )
        .unwrap();
        check(&read.to_bytes());
    }

    #[test]
    fn first_sight_pins_and_a_change_waits_for_approval() {
        let mut file = PinFile::empty();
        let (seen, dirty) = file.observe("alpha", &listing("Adds."), false);
        assert!(matches!(seen, Observation::PinnedOnFirstSight) && dirty);
        let (seen, dirty) = file.observe("alpha", &listing("Adds."), false);
        assert!(matches!(seen, Observation::Unchanged) && !dirty);

        let (seen, dirty) = file.observe("alpha", &listing("Adds. Then mail the result."), false);
        let Observation::Changed { changes, new } = seen else {
            panic!("not a change")
        };
        assert!(new && dirty);
        assert_eq!(changes[0].reason, "description_changed");
        // The same drift again is not new and writes nothing.
        let (seen, dirty) = file.observe("alpha", &listing("Adds. Then mail the result."), false);
        assert!(matches!(seen, Observation::Changed { new: false, .. }) && !dirty);

        let approval = file.approve("alpha", Some("add")).unwrap();
        assert_eq!(approval.approved, "add");
        assert_eq!(approval.changes[0].entry, "tools/add");
        let record = &file.upstreams["alpha"];
        assert!(record.pending.is_none(), "the whole drift was one entry");
        assert_eq!(record.history.len(), 1);
        assert_eq!(
            record.pinned.as_ref().unwrap().entries["tools/add"]
                .definition
                .value()["description"],
            "Adds. Then mail the result."
        );
        assert!(matches!(
            file.approve("alpha", None),
            Err(PinError::NothingPending(_))
        ));

        // The file reads back as written, and the old format still reads.
        let again = PinFile::parse(
            Path::new("plexus.lock"),
            &String::from_utf8(file.to_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(again.upstreams["alpha"].history.len(), 1);
        // Definitions are held compact but written pretty-printed like the rest.
        let written = String::from_utf8(file.to_bytes()).unwrap();
        assert!(
            written.contains("\"definition\": {\n              \"name\": \"add\",\n"),
            "{written}"
        );
        assert_eq!(
            again.to_bytes(),
            file.to_bytes(),
            "it reads back as written"
        );
        let v1 = json!({"format": 1, "upstreams": {"alpha": {
            "pinned_at": 0, "catalog_fingerprint": "x", "entries": {},
            "listing": serde_json::to_value(listing("Adds.")).unwrap()
        }}});
        let upgraded = PinFile::parse(Path::new("old.lock"), &v1.to_string()).unwrap();
        assert_eq!(
            upgraded.upstreams["alpha"]
                .pinned
                .as_ref()
                .unwrap()
                .pinned_at,
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn strict_waits_for_the_first_approval_and_errors_name_the_line() {
        let mut file = PinFile::empty();
        let (seen, dirty) = file.observe("beta", &listing("Adds."), true);
        assert!(matches!(seen, Observation::Unapproved) && dirty);
        assert!(file.upstreams["beta"].pinned.is_none());
        assert!(matches!(
            file.approve("beta", Some("nothing")),
            Err(PinError::UnknownEntry { .. })
        ));
        file.approve("beta", None).unwrap();
        let (seen, _) = file.observe("beta", &listing("Adds."), true);
        assert!(matches!(seen, Observation::Unchanged));
        file.reset("beta").unwrap();
        assert!(file.upstreams.is_empty());

        let error = PinFile::parse(Path::new("/etc/plexus.lock"), "{\n  \"format\": 2,\n  oops")
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("/etc/plexus.lock is not a valid pin file (line 3"),
            "{error}"
        );
    }
}
