//! The operations on the pin file, shared by the daemon and the offline `plexus
//! pins` commands: `observe` a fresh listing (a first sight is pinned, a listing
//! that differs is kept as pending), `approve` what is pending, `reset` a pin; and
//! `share_texts`, the catalog's texts lent to the definitions.

use std::collections::HashSet;
use std::time::SystemTime;

use registry::fingerprint::{self, Change, ListingSnapshot, SecurityDigests};
use registry::{EntryText, Kind};
use serde_json::Value;

use super::format::{snapshot_of, ChangeLine, PinFile, Pinned, Seen, UpstreamRecord};
use super::keyed::{PinKey, PinMap};
use super::sharing::{self, Definition, EntryPin, Stamp};

/// What the operations answer with (the hub names them here).
pub use super::format::{Approval, PinError};

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
}

impl PinFile {
    /// `upstream`'s pinned and pending definitions take the equal texts among
    /// `texts` (its catalog's), so an entry's JSON is kept once.
    pub fn share_texts(&mut self, upstream: &str, texts: &[EntryText]) {
        let Some(record) = self.upstreams.get_mut(upstream) else {
            return;
        };
        sharing::share_texts(
            record.pinned.as_mut().map(|pinned| &mut pinned.entries),
            record.pending.as_mut().map(|pending| &mut pending.entries),
            texts,
        );
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
        let security = fingerprint::security_digests(snapshot);
        let current = fingerprint::catalog_fingerprint_with(snapshot, &security);
        self.observe_fingerprinted(upstream, snapshot, (current, &security), strict)
    }

    /// [`PinFile::observe`] of a snapshot whose catalog fingerprint and entries'
    /// security digests the caller has already.
    pub fn observe_fingerprinted(
        &mut self,
        upstream: &str,
        snapshot: &ListingSnapshot,
        (current, security): (String, &SecurityDigests),
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
            record.pinned = Some(Pinned::of(snapshot, current, &now(), Some(security)));
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
                Pinned::of(
                    &pending_snapshot,
                    pending.catalog_fingerprint.clone(),
                    &at,
                    None,
                ),
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
                        EntryPin::of(kind, &definition, &stamp, Definition::of(&definition), None)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    /// Two tools, `add` described as `description`: the catalog the pin tests observe.
    pub(in crate::pins) fn listing(description: &str) -> ListingSnapshot {
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

        // The file reads back as written.
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
    }

    #[test]
    fn strict_waits_for_the_first_approval() {
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
    }
}
