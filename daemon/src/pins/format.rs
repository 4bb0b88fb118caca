//! The pin file's shape (format 2): what each upstream's catalog was pinned as
//! (every entry's hashes and definition, the server's name, version and
//! instructions, when), what was last seen where that differs (`pending`), and the
//! history of approvals; read (format 1 too, upgraded) and written.
//!
//! Sorted maps and pretty JSON, one block per upstream and per entry, so the file
//! reads and diffs well under version control.

use std::collections::BTreeMap;
use std::path::Path;

use registry::fingerprint::{self, Change, ChangeClass, ListingSnapshot, SecurityDigests};
use registry::Kind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::keyed::{PinKey, PinMap};
use super::sharing::{self, with_digests, Definition, EntryPin, Stamp};

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
    pub fn of(change: &Change) -> ChangeLine {
        ChangeLine {
            class: change.class,
            entry: format!("{}/{}", change.kind, change.identity),
            path: change.path.clone(),
            reason: change.reason.clone(),
        }
    }
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
fn keyed(snapshot: &ListingSnapshot) -> PinMap<(Kind, usize, &Value)> {
    Kind::ALL
        .into_iter()
        .flat_map(|kind| {
            snapshot
                .entries(kind)
                .iter()
                .enumerate()
                .filter_map(move |(place, entry)| {
                    let identity = fingerprint::identity(kind, entry)?;
                    Some((PinKey::of(kind, identity), (kind, place, entry)))
                })
        })
        .collect::<PinMap<_>>()
}

/// A snapshot rebuilt from keyed definitions.
pub(super) fn snapshot_of<'a>(
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
    pub fn snapshot(&self) -> ListingSnapshot {
        snapshot_of(
            &self.server,
            self.entries.iter().map(|(key, pin)| (key, &pin.definition)),
        )
    }

    /// `snapshot`, whose catalog fingerprint is `fingerprint`, pinned `at`; its
    /// entries' security digests are `security`, if the caller took them already.
    pub(super) fn of(
        snapshot: &ListingSnapshot,
        fingerprint: String,
        at: &str,
        security: Option<&SecurityDigests>,
    ) -> Pinned {
        let stamp = Stamp::new(at);
        // Collected in key order, so the map is built with full nodes (inserted one
        // by one, its nodes would be half empty).
        let keyed = keyed(snapshot);
        let definitions = Definition::packed(keyed.values().map(|(_, _, entry)| *entry));
        let mut entries: PinMap<EntryPin> = keyed
            .into_iter()
            .zip(definitions)
            .filter_map(|((key, (kind, place, entry)), definition)| {
                let digest = security.and_then(|all| all[kind.index()].get(place).copied());
                Some((key, EntryPin::of(kind, entry, &stamp, definition, digest)?))
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

    pub(super) fn of(snapshot: &ListingSnapshot, fingerprint: String, at: &str) -> Seen {
        let keyed = keyed(snapshot);
        let definitions = Definition::packed(keyed.values().map(|(_, _, entry)| *entry));
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

    /// The definitions as read moved into one buffer per map, and the keys made
    /// views of them.
    fn packed(mut self) -> PinFile {
        for record in self.upstreams.values_mut() {
            sharing::pack_read(
                record.pinned.as_mut().map(|pinned| &mut pinned.entries),
                record.pending.as_mut().map(|pending| &mut pending.entries),
            );
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
        #[serde(deserialize_with = "stamp")]
        pinned_at: String,
        listing: ListingSnapshot,
    }

    /// The last second RFC 3339 can write (9999-12-31T23:59:59Z).
    const LAST_STAMP: u64 = 253_402_300_799;

    /// Seconds since the epoch, as the second format writes them. A time past
    /// year 9999 has no RFC 3339 form: the file is refused, as a bad value is.
    fn stamp<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
        let seconds = u64::deserialize(deserializer)?;
        if seconds > LAST_STAMP {
            return Err(serde::de::Error::custom(format!(
                "`pinned_at` {seconds} is past the year 9999"
            )));
        }
        Ok(
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(seconds))
                .to_string(),
        )
    }

    impl PinFile {
        pub fn upgrade(self) -> super::PinFile {
            let upstreams = self
                .upstreams
                .into_iter()
                .map(|(name, pin)| {
                    let at = pin.pinned_at;
                    let record = UpstreamRecord {
                        pinned: Some(Pinned::of(
                            &pin.listing,
                            registry::fingerprint::catalog_fingerprint(&pin.listing),
                            &at,
                            None,
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
    use crate::pins::file::tests::listing;

    /// The first format still reads, upgraded; a file that is not one names where.
    #[test]
    fn the_first_format_is_upgraded_and_errors_name_the_line() {
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

        // A time with no RFC 3339 form is a bad value, not a panic.
        let far = v1
            .to_string()
            .replace("\"pinned_at\":0", "\"pinned_at\":9223372036854775807");
        let error = PinFile::parse(Path::new("old.lock"), &far).unwrap_err();
        assert!(error.to_string().contains("past the year 9999"), "{error}");

        let error = PinFile::parse(Path::new("/etc/plexus.lock"), "{\n  \"format\": 2,\n  oops")
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("/etc/plexus.lock is not a valid pin file (line 3"),
            "{error}"
        );
    }

    #[test]
    fn a_hostile_pin_file_is_read_or_refused_and_never_panics() {
        let v1 = json!({"format": 1, "upstreams": {"alpha": {
            "pinned_at": 0, "catalog_fingerprint": "x", "entries": {},
            "listing": serde_json::to_value(listing("Adds.")).unwrap()
        }}});
        let v1 = v1.to_string();
        let v2 = PinFile::parse(Path::new("old.lock"), &v1)
            .unwrap()
            .to_bytes();
        let seeds: [&[u8]; 2] = [v1.as_bytes(), &v2];
        let cases = mutations::cases(&seeds, 3_000, 0x7105);
        mutations::check("PinFile::parse", &cases, 128, |bytes| {
            let Ok(text) = std::str::from_utf8(bytes) else {
                return;
            };
            if let Ok(file) = PinFile::parse(Path::new("plexus.lock"), text) {
                // What is read is written back and reads the same.
                let written = file.to_bytes();
                let again = std::str::from_utf8(&written).unwrap();
                let reread = PinFile::parse(Path::new("plexus.lock"), again).unwrap();
                assert_eq!(reread.to_bytes(), written);
            }
        });
    }
}
