//! A run of a snapshot's exposed entries (a whole list, or one page of it): each
//! entry is its upstream's JSON with the exposed name spliced in, so a page is
//! written without building or cloning a tree of values, and parsed only when a
//! caller asks for `Value`s.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::part::UpstreamPart;
use super::Kind;

/// Where a snapshot's entry lives: its part, and its place among that part's
/// exposed entries of the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EntryRef {
    pub part: u32,
    pub index: u32,
}

/// Reads a key of an entry of `kind` from its part; `read` says which.
fn key_of<'p>(
    parts: &'p [Arc<UpstreamPart>],
    kind: Kind,
    read: fn(&'p UpstreamPart, Kind, usize) -> &'p str,
) -> impl Fn(&EntryRef) -> &'p str + 'p {
    move |entry| {
        parts
            .get(entry.part as usize)
            .map_or("", |part| read(part, kind, entry.index as usize))
    }
}

/// Reads the exposed key of an entry of `kind` from its part (what the route
/// tables are keyed by).
pub(super) fn exposed_key_of<'p>(
    parts: &'p [Arc<UpstreamPart>],
    kind: Kind,
) -> impl Fn(&EntryRef) -> &'p str + 'p {
    key_of(parts, kind, UpstreamPart::exposed_key)
}

/// Reads the exposed key of the entry at a position of `entries` (of `kind`):
/// what a snapshot's route tables hold, four bytes a route.
pub(super) fn listed_key_of<'p>(
    parts: &'p [Arc<UpstreamPart>],
    entries: &'p [EntryRef],
    kind: Kind,
) -> impl Fn(&u32) -> &'p str + 'p {
    let exposed_key = exposed_key_of(parts, kind);
    move |position| entries.get(*position as usize).map_or("", &exposed_key)
}

/// Reads the upstream's own key of an entry of `kind` from its part.
pub(super) fn original_key_of<'p>(
    parts: &'p [Arc<UpstreamPart>],
    kind: Kind,
) -> impl Fn(&EntryRef) -> &'p str + 'p {
    key_of(parts, kind, UpstreamPart::original)
}

/// Exposed entries of one kind, in list order.
#[derive(Clone)]
pub struct Entries<'a> {
    pub(super) kind: Kind,
    pub(super) parts: &'a [Arc<UpstreamPart>],
    pub(super) refs: &'a [EntryRef],
}

impl<'a> Entries<'a> {
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Entry `index` as a `Value`.
    pub fn get(&self, index: usize) -> Option<Value> {
        let entry = self.refs.get(index)?;
        Some(self.parts[entry.part as usize].exposed_value(self.kind, entry.index as usize))
    }

    /// Every entry as a `Value`.
    pub fn iter(&self) -> impl Iterator<Item = Value> + 'a {
        let (kind, parts) = (self.kind, self.parts);
        self.refs
            .iter()
            .map(move |entry| parts[entry.part as usize].exposed_value(kind, entry.index as usize))
    }

    /// The entries as `Value`s (each parsed from its JSON).
    pub fn to_vec(&self) -> Vec<Value> {
        self.iter().collect()
    }

    /// Entry `index`'s compact JSON, appended to `out`.
    pub fn write_json(&self, index: usize, out: &mut Vec<u8>) {
        if let Some(entry) = self.refs.get(index) {
            self.parts[entry.part as usize].write_exposed(self.kind, entry.index as usize, out);
        }
    }

    /// About how long [`Entries::write_json_array`]'s JSON is: a buffer this large
    /// is written without growing (and copying) on the way.
    pub fn json_size_hint(&self) -> usize {
        self.refs
            .iter()
            .map(|entry| {
                self.parts[entry.part as usize].exposed_size_hint(self.kind, entry.index as usize)
            })
            .sum::<usize>()
            + 2
    }

    /// The entries as one compact JSON array, appended to `out`: what serialising
    /// [`Entries::to_vec`] gives, without building it.
    pub fn write_json_array(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for index in 0..self.len() {
            if index > 0 {
                out.push(b',');
            }
            self.write_json(index, out);
        }
        out.push(b']');
    }
}

impl fmt::Debug for Entries<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_list().entries(self.iter()).finish()
    }
}

/// Equal when their JSON is.
impl PartialEq for Entries<'_> {
    fn eq(&self, other: &Entries<'_>) -> bool {
        if self.len() != other.len() || self.kind != other.kind {
            return false;
        }
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        (0..self.len()).all(|index| {
            mine.clear();
            theirs.clear();
            self.write_json(index, &mut mine);
            other.write_json(index, &mut theirs);
            mine == theirs
        })
    }
}
