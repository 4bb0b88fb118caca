//! The pin file's entry maps: `<kind>/<name, URI or template>` → what is pinned
//! or seen of the entry. A map is one sorted vector (two allocations for a whole
//! catalog, where a B-tree's thousand nodes, built while a file is read, were
//! left scattered through memory the reading freed), and its keys are views of
//! one buffer.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;

use registry::{EntryText, Kind};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An entry's key in the file, `<kind>/<name, URI or template>`. The keys of a
/// catalog read or pinned together are views of one buffer: a string each was a
/// twentieth of a large catalog's pins.
#[derive(Clone)]
pub struct PinKey(EntryText);

impl PinKey {
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// `<kind>/<identity>`.
    pub fn of(kind: Kind, identity: &str) -> PinKey {
        let mut key = String::new();
        PinKey::write(kind, identity, &mut key);
        PinKey(EntryText::own(key))
    }

    /// `<kind>/<identity>` into `out`, replacing what it held: a key to look up by
    /// without making one.
    pub fn write(kind: Kind, identity: &str, out: &mut String) {
        out.clear();
        out.push_str(kind.label());
        out.push('/');
        out.push_str(identity);
    }

    /// The kind its `<kind>/` names.
    pub fn kind(&self) -> Option<Kind> {
        let (kind, _) = self.as_str().split_once('/')?;
        Kind::from_label(kind)
    }

    /// Whether both are views of one buffer.
    #[cfg(test)]
    pub fn shares_buffer_with(&self, other: &PinKey) -> bool {
        self.0.shares_text_with(&other.0)
    }
}

impl Borrow<str> for PinKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for PinKey {
    fn eq(&self, other: &PinKey) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for PinKey {}

impl PartialOrd for PinKey {
    fn partial_cmp(&self, other: &PinKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PinKey {
    fn cmp(&self, other: &PinKey) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for PinKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl std::fmt::Debug for PinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl std::fmt::Display for PinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for PinKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for PinKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|key| PinKey(EntryText::own(key)))
    }
}

/// Entries sorted by key, each key once.
#[derive(Clone, Debug)]
pub struct PinMap<V>(Vec<(PinKey, V)>);

impl<V> Default for PinMap<V> {
    fn default() -> PinMap<V> {
        PinMap(Vec::new())
    }
}

impl<V> PinMap<V> {
    pub fn new() -> PinMap<V> {
        PinMap::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(have, _)| have.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.get_key_value(key).map(|(_, value)| value)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&PinKey, &V)> {
        let found = self.find(key).ok()?;
        self.0.get(found).map(|(key, value)| (key, value))
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key`'s value; the one it replaces, if any.
    pub fn insert(&mut self, key: PinKey, value: V) -> Option<V> {
        match self.find(key.as_str()) {
            Ok(found) => Some(std::mem::replace(&mut self.0[found].1, value)),
            Err(at) => {
                self.0.insert(at, (key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let found = self.find(key).ok()?;
        Some(self.0.remove(found).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PinKey, &V)> {
        self.0.iter().map(|(key, value)| (key, value))
    }

    pub fn keys(&self) -> impl Iterator<Item = &PinKey> {
        self.0.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, value)| value)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, value)| value)
    }

    /// The same entries, their keys moved into one buffer and the vector to its length.
    pub fn packed(self) -> PinMap<V> {
        let keys = EntryText::pack(self.0.iter().map(|(key, _)| key.as_str()));
        let mut entries: Vec<(PinKey, V)> = keys
            .into_iter()
            .map(PinKey)
            .zip(self.0.into_iter().map(|(_, value)| value))
            .collect();
        entries.shrink_to_fit();
        PinMap(entries)
    }
}

/// Sorted by key; of equal keys the last is kept, as a map's insertions would.
impl<V> FromIterator<(PinKey, V)> for PinMap<V> {
    fn from_iter<I: IntoIterator<Item = (PinKey, V)>>(items: I) -> PinMap<V> {
        let mut entries: Vec<(PinKey, V)> = items.into_iter().collect();
        // Stable: equal keys keep their order, and the last of them stays.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(PinKey, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        PinMap(kept)
    }
}

#[cfg(test)]
impl<V> std::ops::Index<&str> for PinMap<V> {
    type Output = V;

    /// Panics if `key` is absent, as a map's index does.
    fn index(&self, key: &str) -> &V {
        match self.get(key) {
            Some(value) => value,
            None => panic!("no entry `{key}`"),
        }
    }
}

impl<'a, V> IntoIterator for &'a PinMap<V> {
    type Item = (&'a PinKey, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (PinKey, V)>,
        fn(&'a (PinKey, V)) -> (&'a PinKey, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(key, value)| (key, value))
    }
}

impl<V> IntoIterator for PinMap<V> {
    type Item = (PinKey, V);
    type IntoIter = std::vec::IntoIter<(PinKey, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<V: Serialize> Serialize for PinMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (key, value) in self {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for PinMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<V>(PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
            type Value = PinMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of entries by `<kind>/<name>`")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<PinMap<V>, A::Error> {
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(4096));
                while let Some(entry) = access.next_entry()? {
                    entries.push(entry);
                }
                Ok(entries.into_iter().collect())
            }
        }

        deserializer.deserialize_map(Entries(PhantomData))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(text: &str) -> PinKey {
        PinKey(EntryText::own(text.to_string()))
    }

    #[test]
    fn a_sorted_map_of_each_key_once() {
        let mut map: PinMap<u32> = [("tools/b", 1), ("tools/a", 2), ("tools/b", 3)]
            .into_iter()
            .map(|(text, value)| (key(text), value))
            .collect();
        let read: Vec<(&str, u32)> = map
            .iter()
            .map(|(key, value)| (key.as_str(), *value))
            .collect();
        assert_eq!(read, [("tools/a", 2), ("tools/b", 3)]);
        assert_eq!(map.insert(key("prompts/p"), 4), None);
        assert_eq!(map.insert(key("tools/a"), 5), Some(2));
        assert_eq!(map.remove("tools/b"), Some(3));
        assert_eq!(map.remove("tools/b"), None);
        assert!(map.contains_key("prompts/p") && !map.contains_key("tools/b"));
        assert_eq!(map["tools/a"], 5);
        let packed = map.packed();
        let keys: Vec<&PinKey> = packed.keys().collect();
        assert_eq!(
            keys.iter().map(|key| key.as_str()).collect::<Vec<_>>(),
            ["prompts/p", "tools/a"]
        );
        assert!(keys[0].shares_buffer_with(keys[1]));
        assert_eq!(keys[1].kind(), Some(Kind::Tools));

        let json = serde_json::to_string(&packed).unwrap();
        assert_eq!(json, r#"{"prompts/p":4,"tools/a":5}"#);
        let read: PinMap<u32> = serde_json::from_str(r#"{"tools/z":1,"tools/a":2}"#).unwrap();
        assert_eq!(
            read.keys().map(PinKey::as_str).collect::<Vec<_>>(),
            ["tools/a", "tools/z"]
        );
    }
}
