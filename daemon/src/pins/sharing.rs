//! What a pinned entry holds, kept small: its definition is the catalog's own text
//! where the catalog lists the same entry (`share_texts`, a `registry::EntryText`),
//! the definitions read from the file share one buffer, entries pinned at one time
//! share one `Stamp`, and the digests are held as bytes once taken (the security
//! digest when the catalog fingerprint is, the compatibility digest from the file).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use registry::fingerprint;
use registry::{EntryText, Kind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::keyed::PinMap;

/// An entry as pinned. The file gives each its compatibility and security digests
/// too, a function of the definition: the security digest is kept from the catalog
/// fingerprint and both are read back from the file, so a write hashes only what was
/// pinned since the file was read (hashing every entry at each write of a large
/// file cost more than the rest of a start).
#[derive(Clone, Debug, Deserialize)]
pub struct EntryPin {
    /// RFC 3339: when this definition was pinned.
    pub pinned_at: Stamp,
    /// The entry exactly as the upstream sent it, so a change can be shown field by field.
    pub definition: Definition,
    /// SHA-256 digests; `None` where the file's were missing or not hex (then they
    /// are taken from the definition when written).
    #[serde(default, deserialize_with = "digest")]
    compatibility: Option<[u8; 32]>,
    #[serde(default, deserialize_with = "digest")]
    security: Option<[u8; 32]>,
}

/// A digest as the file writes it (64 hex digits), or `None` for anything else.
fn digest<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<[u8; 32]>, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    let mut bytes = [0u8; 32];
    Ok(hex::decode_to_slice(text.as_bytes(), &mut bytes)
        .ok()
        .map(|()| bytes))
}

impl EntryPin {
    /// `entry`, whose definition is `definition`, pinned `at`; `None` for an entry
    /// without a name (nothing to pin it by). `security` is its security digest if
    /// the caller took it already.
    pub fn of(
        kind: Kind,
        entry: &Value,
        at: &Stamp,
        definition: Definition,
        security: Option<[u8; 32]>,
    ) -> Option<EntryPin> {
        fingerprint::identity(kind, entry)?;
        Some(EntryPin {
            pinned_at: at.clone(),
            definition,
            // Taken by the writer of the file when missing, off the path that
            // brings an upstream up.
            compatibility: None,
            security,
        })
    }
}

/// Pinned entries as the file has them: each one's digests (SHA-256, hex), then
/// when it was pinned and its definition.
pub fn with_digests<S: serde::Serializer>(
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
        let (compatibility, security) = match key.kind() {
            Some(kind) if fingerprint::identity(kind, &definition).is_some() => (
                pin.compatibility
                    .unwrap_or_else(|| fingerprint::compatibility_digest(kind, &definition)),
                pin.security
                    .unwrap_or_else(|| fingerprint::security_digest(&definition)),
            ),
            _ => ([0; 32], [0; 32]),
        };
        let (compatibility, security) = (hex::encode(compatibility), hex::encode(security));
        let written = Written {
            compatibility: &compatibility,
            security: &security,
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
pub struct Definition(pub(super) EntryText);

impl Definition {
    pub fn of(value: &Value) -> Definition {
        Definition(EntryText::own(
            serde_json::to_string(value).unwrap_or_default(),
        ))
    }

    /// The definitions of `values`, written into one buffer: a catalog's are made
    /// together, and freed together once the catalog's own texts replace them.
    pub fn packed<'a>(values: impl IntoIterator<Item = &'a Value>) -> Vec<Definition> {
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

/// `pinned` and `pending` (one upstream's definitions) take the equal texts among
/// `texts` (its catalog's), so an entry's JSON is kept once; the keys follow.
pub fn share_texts(
    pinned: Option<&mut PinMap<EntryPin>>,
    pending: Option<&mut PinMap<Definition>>,
    texts: &[EntryText],
) {
    let texts: HashMap<&str, &EntryText> = texts.iter().map(|text| (text.as_str(), text)).collect();
    if let Some(entries) = pinned {
        for pin in entries.values_mut() {
            pin.definition.share(&texts);
        }
        entries.key_into(|pin| &pin.definition.0);
    }
    if let Some(entries) = pending {
        for definition in entries.values_mut() {
            definition.share(&texts);
        }
        entries.key_into(|definition| &definition.0);
    }
}

/// The definitions as read moved into one buffer per map, the stamps shared, and
/// the keys made views of the definitions.
pub fn pack_read(pinned: Option<&mut PinMap<EntryPin>>, pending: Option<&mut PinMap<Definition>>) {
    if let Some(entries) = pinned {
        pack(entries.values_mut().map(|pin| &mut pin.definition));
        share_stamps(entries.values_mut().map(|pin| &mut pin.pinned_at));
        entries.key_into(|pin| &pin.definition.0);
    }
    if let Some(entries) = pending {
        pack(entries.values_mut());
        entries.key_into(|definition| &definition.0);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use registry::fingerprint::ListingSnapshot;

    use super::*;
    use crate::pins::file::tests::listing;
    use crate::pins::format::PinFile;
    use crate::pins::keyed::PinKey;

    #[test]
    fn definitions_take_the_catalogs_texts_and_the_file_reads_the_same() {
        let mut file = PinFile::empty();
        let (pinned, drifted) = (listing("Adds."), listing("Adds. Then mails the sum."));
        file.observe("alpha", &pinned, false);
        file.observe("alpha", &drifted, false);
        let before = file.to_bytes();
        let part = |snapshot: &ListingSnapshot| {
            let mut listing = registry::UpstreamListing::empty(
                "alpha".into(),
                "alpha".into(),
                registry::ToolFilter::default(),
            );
            listing.tools = snapshot.tools.clone();
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
}
