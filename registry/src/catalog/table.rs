//! A hash table of entries keyed by text their parts hold: the table keeps only
//! each entry's place (a route's is four bytes), and its key is read from the part
//! when the table hashes or compares it, so a route table holds no string of its own.

use std::hash::{BuildHasher, RandomState};

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

#[derive(Clone, Debug)]
pub(super) struct Table<T> {
    table: HashTable<T>,
    state: RandomState,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            table: HashTable::new(),
            state: RandomState::new(),
        }
    }
}

impl<T> Table<T> {
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.table.iter()
    }

    /// The item whose key is `key`.
    pub fn get<'k>(&self, key: &str, key_of: impl Fn(&T) -> &'k str) -> Option<&T> {
        self.table
            .find(self.state.hash_one(key), |item| key_of(item) == key)
    }

    /// Inserts `item` unless an item with its key is there; then that item is
    /// returned and `item` is dropped.
    pub fn insert<'k>(&mut self, item: T, key_of: impl Fn(&T) -> &'k str) -> Option<&mut T> {
        let Table { table, state } = self;
        let key = key_of(&item);
        let found = table.entry(
            state.hash_one(key),
            |other| key_of(other) == key,
            |other| state.hash_one(key_of(other)),
        );
        match found {
            Entry::Occupied(occupied) => Some(occupied.into_mut()),
            Entry::Vacant(vacant) => {
                vacant.insert(item);
                None
            }
        }
    }

    pub fn reserve<'k>(&mut self, additional: usize, key_of: impl Fn(&T) -> &'k str) {
        let Table { table, state } = self;
        table.reserve(additional, |item| state.hash_one(key_of(item)));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_a_key_it_does_not_hold_and_keeps_the_first_of_a_key() {
        let keys = ["alpha", "beta", "alpha", "gamma"];
        let key_of = |index: &usize| keys[*index];
        let mut table = Table::default();
        table.reserve(1, key_of);
        let refused: Vec<Option<usize>> = (0..keys.len())
            .map(|index| table.insert(index, key_of).map(|kept| *kept))
            .collect();
        assert_eq!(refused, [None, None, Some(0), None]);
        assert_eq!(table.iter().count(), 3);
        assert_eq!(table.get("gamma", key_of), Some(&3));
        assert_eq!(table.get("alpha", key_of), Some(&0));
        assert_eq!(table.get("delta", key_of), None);
        let mut all: Vec<usize> = table.iter().copied().collect();
        all.sort();
        assert_eq!(all, [0, 1, 3]);
    }
}
