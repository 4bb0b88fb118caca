//! The pin file's entry maps: `<kind>/<name, URI or template>` → what is pinned
//! or seen of the entry. A map is one sorted vector (two allocations for a whole
//! catalog, where a B-tree's thousand nodes, built while a file is read, were
//! left scattered through memory the reading freed), and its keys are views of
//! the entries' own texts.

use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;

use registry::{EntryText, Kind};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An entry's key in the file, `<kind>/<name, URI or template>`: its kind, and its
/// identity as a view of text. Where the entry's definition spells the identity
/// (its JSON does, unless escapes do), the view is of the definition's buffer
/// ([`PinMap::key_into`]): a buffer of keys beside the definitions was a sixth of
/// a large catalog's pins.
#[derive(Clone)]
pub struct PinKey {
    /// None: a kind this version does not know, kept as read; `text` is then the
    /// whole key.
    kind: Option<Kind>,
    text: EntryText,
}

/// `<kind>/`, the start of a key of that kind. No prefix starts another, so
/// keys of two kinds compare as their prefixes do.
fn prefix(kind: Kind) -> &'static str {
    match kind {
        Kind::Tools => "tools/",
        Kind::Prompts => "prompts/",
        Kind::Resources => "resources/",
        Kind::ResourceTemplates => "resource_templates/",
    }
}

/// `first` followed by `second`, against `other`.
fn cmp_joined(first: &str, second: &str, other: &str) -> Ordering {
    let (first, other) = (first.as_bytes(), other.as_bytes());
    let common = first.len().min(other.len());
    match first[..common].cmp(&other[..common]) {
        Ordering::Equal if first.len() <= other.len() => {
            second.as_bytes().cmp(&other[first.len()..])
        }
        Ordering::Equal => Ordering::Greater,
        unequal => unequal,
    }
}

impl PinKey {
    /// `<kind>/<identity>`, its identity a text of its own.
    pub fn of(kind: Kind, identity: &str) -> PinKey {
        PinKey {
            kind: Some(kind),
            text: EntryText::own(identity.to_string()),
        }
    }

    /// `<kind>/<identity>` into `out`, replacing what it held: a key to look up by
    /// without making one.
    pub fn write(kind: Kind, identity: &str, out: &mut String) {
        out.clear();
        out.push_str(prefix(kind));
        out.push_str(identity);
    }

    /// The key as the file spells it.
    pub fn parse(key: &str) -> PinKey {
        let known = Kind::ALL
            .into_iter()
            .find_map(|kind| Some((kind, key.strip_prefix(prefix(kind))?)));
        match known {
            Some((kind, identity)) => PinKey::of(kind, identity),
            None => PinKey {
                kind: None,
                text: EntryText::own(key.to_string()),
            },
        }
    }

    /// The kind its `<kind>/` names.
    pub fn kind(&self) -> Option<Kind> {
        self.kind
    }

    /// The name, URI or template after `<kind>/`.
    pub fn identity(&self) -> &str {
        match self.kind {
            Some(_) => self.text.as_str(),
            None => self.text.as_str().split_once('/').map_or("", |(_, id)| id),
        }
    }

    /// The identity made a view of `text` where `text` spells it, else a text of
    /// its own (so it keeps no other buffer alive).
    fn rest_in(&mut self, text: &EntryText) {
        let found = match self.kind {
            Some(_) => text.view_of(self.text.as_str()),
            None => None,
        };
        self.text = found.unwrap_or_else(|| self.text.detached());
    }

    /// Against a key as the file spells it.
    fn cmp_str(&self, key: &str) -> Ordering {
        match self.kind {
            Some(kind) => cmp_joined(prefix(kind), self.text.as_str(), key),
            None => self.text.as_str().cmp(key),
        }
    }

    /// Whether the identity is a view of `text`'s buffer.
    #[cfg(test)]
    pub fn is_view_of(&self, text: &EntryText) -> bool {
        self.text.shares_text_with(text)
    }
}

impl PartialEq for PinKey {
    fn eq(&self, other: &PinKey) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PinKey {}

impl PartialOrd for PinKey {
    fn partial_cmp(&self, other: &PinKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// As the keys' spellings compare.
impl Ord for PinKey {
    fn cmp(&self, other: &PinKey) -> Ordering {
        let (mine, theirs) = (self.text.as_str(), other.text.as_str());
        match (self.kind, other.kind) {
            (Some(a), Some(b)) if a == b => mine.cmp(theirs),
            (Some(a), Some(b)) => prefix(a).cmp(prefix(b)),
            (Some(a), None) => cmp_joined(prefix(a), mine, theirs),
            (None, Some(b)) => cmp_joined(prefix(b), theirs, mine).reverse(),
            (None, None) => mine.cmp(theirs),
        }
    }
}

/// Equal keys are of one kind (a known kind's spelling is always parsed as such).
impl std::hash::Hash for PinKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.text.as_str().hash(state);
    }
}

impl fmt::Debug for PinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

impl fmt::Display for PinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(kind) = self.kind {
            f.write_str(prefix(kind))?;
        }
        f.write_str(self.text.as_str())
    }
}

impl Serialize for PinKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PinKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(|key| PinKey::parse(&key))
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
        self.0.binary_search_by(|(have, _)| have.cmp_str(key))
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
        match self.0.binary_search_by(|(have, _)| have.cmp(&key)) {
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

    /// Each key's identity made a view of its entry's text (`text_of`) where that
    /// spells it, else a text of its own: keys then cost no buffer of their own,
    /// and none keeps an earlier one alive. The vector is cut to its length.
    pub fn key_into(&mut self, text_of: impl Fn(&V) -> &EntryText) {
        for (key, value) in &mut self.0 {
            key.rest_in(text_of(value));
        }
        self.0.shrink_to_fit();
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
        PinKey::parse(text)
    }

    fn spelled<V>(map: &PinMap<V>) -> Vec<String> {
        map.keys().map(PinKey::to_string).collect()
    }

    #[test]
    fn a_sorted_map_of_each_key_once() {
        let mut map: PinMap<u32> = [("tools/b", 1), ("tools/a", 2), ("tools/b", 3)]
            .into_iter()
            .map(|(text, value)| (key(text), value))
            .collect();
        let read: Vec<(String, u32)> = map
            .iter()
            .map(|(key, value)| (key.to_string(), *value))
            .collect();
        assert_eq!(
            read,
            [("tools/a".to_string(), 2), ("tools/b".to_string(), 3)]
        );
        assert_eq!(map.insert(key("prompts/p"), 4), None);
        assert_eq!(map.insert(key("tools/a"), 5), Some(2));
        assert_eq!(map.remove("tools/b"), Some(3));
        assert_eq!(map.remove("tools/b"), None);
        assert!(map.contains_key("prompts/p") && !map.contains_key("tools/b"));
        assert_eq!(map["tools/a"], 5);
        assert_eq!(spelled(&map), ["prompts/p", "tools/a"]);
        let tools = map.keys().nth(1).unwrap();
        assert_eq!((tools.kind(), tools.identity()), (Some(Kind::Tools), "a"));

        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"prompts/p":4,"tools/a":5}"#);
        let read: PinMap<u32> = serde_json::from_str(r#"{"tools/z":1,"tools/a":2}"#).unwrap();
        assert_eq!(spelled(&read), ["tools/a", "tools/z"]);
    }

    #[test]
    fn keys_sort_as_they_are_spelled_whatever_their_kind() {
        let spellings = [
            "tools/a",
            "prompts/z",
            "resource_templates/file:///{x}",
            "resources/file:///a",
            "resourcez/q",
            "tool/x",
            "tools",
            "tools0/x",
            "",
            "zz",
        ];
        let map: PinMap<()> = spellings.iter().map(|text| (key(text), ())).collect();
        let mut sorted: Vec<&str> = spellings.to_vec();
        sorted.sort();
        assert_eq!(spelled(&map), sorted);
        for text in spellings {
            assert!(map.contains_key(text), "{text}");
        }
        assert!(!map.contains_key("tools/"));
        assert_eq!(key("resourcez/q").kind(), None);
        assert_eq!(key("resourcez/q").identity(), "q");
    }

    #[test]
    fn keys_become_views_of_their_entries_texts() {
        let texts = EntryText::pack([r#"{"name":"a"}"#, r#"{"name":"b\u0041"}"#]);
        let mut map: PinMap<EntryText> = [("tools/a", &texts[0]), ("tools/bA", &texts[1])]
            .into_iter()
            .map(|(text, entry)| (key(text), entry.clone()))
            .collect();
        map.key_into(|text| text);
        let keys: Vec<&PinKey> = map.keys().collect();
        assert!(keys[0].is_view_of(&texts[0]));
        // Escaped in the JSON: a text of its own.
        assert!(!keys[1].is_view_of(&texts[1]));
        assert_eq!(spelled(&map), ["tools/a", "tools/bA"]);
        assert!(map.contains_key("tools/bA"));
    }
}
