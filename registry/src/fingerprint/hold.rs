//! Which entries of a fresh listing differ from what was pinned: each entry whose
//! security hash is not the pinned one (changed or new) is held, with a summary of
//! its classified changes that a caller is shown.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use super::{classify, identity, security_hash, Change, ChangeClass, ListingSnapshot};
use crate::{Kind, Quarantine};

/// The entries of `observed` that differ from `pinned`, and whether the instructions
/// do; entries `pinned` has and `observed` lacks hold nothing (nothing is left to hide).
pub fn drift(pinned: &ListingSnapshot, observed: &ListingSnapshot) -> Quarantine {
    let changes = classify(pinned, observed);
    let mut by_entry: BTreeMap<(Kind, &str), Vec<&Change>> = BTreeMap::new();
    for change in &changes {
        if let Some(kind) = Kind::from_label(&change.kind) {
            by_entry
                .entry((kind, change.identity.as_str()))
                .or_default()
                .push(change);
        }
    }
    let mut entries = HashMap::new();
    // Held entries mostly share a summary (every tool an upstream added says
    // `entry_added`): one value each would be a kilobyte per held entry.
    let mut summaries: HashMap<String, Arc<Value>> = HashMap::new();
    for kind in Kind::ALL {
        let pinned_entries: HashMap<&str, &Value> = pinned
            .entries(kind)
            .iter()
            .filter_map(|entry| Some((identity(kind, entry)?, entry)))
            .collect();
        for entry in observed.entries(kind) {
            let Some(name) = identity(kind, entry) else {
                continue;
            };
            // Only the security hash counts here, and equal values have equal
            // hashes: most entries of a listing are compared without hashing.
            let same = pinned_entries.get(name).is_some_and(|pinned| {
                *pinned == entry || security_hash(pinned) == security_hash(entry)
            });
            if same {
                continue;
            }
            let change = summary(
                by_entry
                    .get(&(kind, name))
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
            );
            let shared = summaries
                .entry(change.to_string())
                .or_insert_with(|| Arc::new(change))
                .clone();
            entries.insert((kind, name.to_string()), shared);
        }
    }
    Quarantine {
        whole: None,
        entries,
        instructions: pinned.instructions != observed.instructions,
        admits_unlisted: false,
    }
}

/// `{"class", "fields": [{"path", "reason", "class"}]}`: what a held entry's caller
/// is told. An entry whose hash changed without a classified field (a change the
/// walk does not name) still counts, as a security change of the whole entry.
pub fn summary(changes: &[&Change]) -> Value {
    let class = changes
        .iter()
        .map(|change| change.class)
        .max()
        .unwrap_or(ChangeClass::Security)
        .max(ChangeClass::Security);
    let mut fields: Vec<Value> = changes
        .iter()
        .filter(|change| change.class != ChangeClass::Cosmetic)
        .map(|change| json!({"path": change.path, "reason": change.reason, "class": change.class}))
        .collect();
    if fields.is_empty() {
        fields.push(json!({"path": "", "reason": "definition_changed", "class": "security"}));
    }
    json!({"class": class, "fields": fields})
}
