//! Entries held back from the catalog: their definition differs from what was
//! pinned (or nothing of the upstream was approved yet), so they are neither listed
//! nor reachable until an operator approves them. Each held entry carries the
//! change that holds it, which callers are shown in their error.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::Kind;

/// What of one upstream's listing is held back, by the upstream's own names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quarantine {
    /// Every entry is held (pinning is strict and nothing was approved yet, or the
    /// pin file cannot be read), with why.
    pub whole: Option<Arc<Value>>,
    /// Held entries by kind and the upstream's own name, URI or template, each
    /// with the change that holds it.
    pub entries: HashMap<(Kind, String), Arc<Value>>,
    /// The server's instructions changed since they were pinned: they are not
    /// shown to clients until approved.
    pub instructions: bool,
    /// Names the upstream does not list may be passed to it (its pins do not block
    /// new entries, so relaying them bypasses nothing).
    pub admits_unlisted: bool,
}

impl Quarantine {
    /// Nothing held.
    pub fn none() -> Quarantine {
        Quarantine::default()
    }

    /// Everything held, for `reason`.
    pub fn whole(reason: Value) -> Quarantine {
        Quarantine {
            whole: Some(Arc::new(reason)),
            entries: HashMap::new(),
            instructions: true,
            admits_unlisted: false,
        }
    }

    /// The change holding the entry `identity` of `kind`, if it is held.
    pub fn holds(&self, kind: Kind, identity: &str) -> Option<&Arc<Value>> {
        self.whole
            .as_ref()
            .or_else(|| self.entries.get(&(kind, identity.to_string())))
    }

    pub fn is_empty(&self) -> bool {
        self.whole.is_none() && self.entries.is_empty() && !self.instructions
    }

    /// How many of `entries` (of `kind`, named by `identity`) are held.
    pub fn count<'a>(&self, kind: Kind, identities: impl IntoIterator<Item = &'a str>) -> usize {
        identities
            .into_iter()
            .filter(|identity| self.holds(kind, identity).is_some())
            .count()
    }
}
