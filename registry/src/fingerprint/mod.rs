//! Schema fingerprints and drift classification. Every entry an upstream lists
//! gets two hashes, taken from the entry exactly as the upstream sent it: a
//! *compatibility* hash over what callers depend on (its identity, required
//! parameters and parameter types, local `$ref`s resolved) and a *security* hash
//! over the whole definition in canonical JSON (RFC 8785), so that any change a
//! model could read counts. Two listings of one upstream are compared field by
//! field into classified changes.

mod classify;
mod hold;
mod shape;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::Kind;

pub use classify::{classify, Change, ChangeClass};
pub use hold::{drift, summary};

/// The two hashes of one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryFingerprint {
    /// The tool or prompt name, the resource URI, or the template's URI template.
    pub identity: String,
    pub compatibility: String,
    pub security: String,
}

/// One upstream's listing as received, with what it said of itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListingSnapshot {
    pub server_name: Option<String>,
    pub server_version: Option<String>,
    pub instructions: Option<String>,
    pub tools: Vec<Value>,
    pub prompts: Vec<Value>,
    pub resources: Vec<Value>,
    pub resource_templates: Vec<Value>,
}

impl ListingSnapshot {
    pub fn entries(&self, kind: Kind) -> &[Value] {
        match kind {
            Kind::Tools => &self.tools,
            Kind::Prompts => &self.prompts,
            Kind::Resources => &self.resources,
            Kind::ResourceTemplates => &self.resource_templates,
        }
    }

    pub fn entries_mut(&mut self, kind: Kind) -> &mut Vec<Value> {
        match kind {
            Kind::Tools => &mut self.tools,
            Kind::Prompts => &mut self.prompts,
            Kind::Resources => &mut self.resources,
            Kind::ResourceTemplates => &mut self.resource_templates,
        }
    }
}

/// The member that names an entry of `kind`.
pub fn identity(kind: Kind, entry: &Value) -> Option<&str> {
    let key = match kind {
        Kind::Tools | Kind::Prompts => "name",
        Kind::Resources => "uri",
        Kind::ResourceTemplates => "uriTemplate",
    };
    entry.get(key)?.as_str()
}

/// `entries` with each identity listed once, at its first place, and the
/// identities listed more than once. Pins, holds and routes are by identity: a
/// second definition under one name would be judged against the first (and hold
/// both back), or route to a tool the client never saw.
pub fn first_of_each(kind: Kind, mut entries: Vec<Value>) -> (Vec<Value>, Vec<String>) {
    // Names borrowed, not copied: a large listing would leave thousands of small
    // freed blocks among the catalog's.
    let mut repeated: Vec<String> = Vec::new();
    let keep: Vec<bool> = {
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        entries
            .iter()
            .map(|entry| match identity(kind, entry) {
                Some(name) if !seen.insert(name) => {
                    if !repeated.iter().any(|known| known == name) {
                        repeated.push(name.to_string());
                    }
                    false
                }
                // Entries without an identity stay, for the catalog to report.
                _ => true,
            })
            .collect()
    };
    if !repeated.is_empty() {
        let mut keep = keep.into_iter();
        entries.retain(|_| keep.next().unwrap_or(true));
    }
    (entries, repeated)
}

/// Both hashes of an entry; None when it has no identity.
pub fn fingerprint(kind: Kind, entry: &Value) -> Option<EntryFingerprint> {
    Some(EntryFingerprint {
        identity: identity(kind, entry)?.to_string(),
        compatibility: compatibility_hash(kind, entry),
        security: security_hash(entry),
    })
}

/// The compatibility hash of an entry as bytes.
pub fn compatibility_digest(kind: Kind, entry: &Value) -> [u8; 32] {
    sha256(&canonical(&compatibility_summary(kind, entry)))
}

/// The security hash of an entry as bytes.
pub fn security_digest(entry: &Value) -> [u8; 32] {
    sha256(&canonical(entry))
}

/// SHA-256 of the entry in RFC 8785 canonical JSON: key order and whitespace do
/// not count, every member and every value does.
pub fn security_hash(entry: &Value) -> String {
    hex_sha256(&canonical(entry))
}

/// SHA-256 over what a caller depends on: the identity, required parameters and
/// parameter types (with local `$ref`s resolved), in canonical JSON.
pub fn compatibility_hash(kind: Kind, entry: &Value) -> String {
    hex_sha256(&canonical(&compatibility_summary(kind, entry)))
}

/// What the compatibility hash is taken over.
pub fn compatibility_summary(kind: Kind, entry: &Value) -> Value {
    let identity = identity(kind, entry).unwrap_or_default();
    match kind {
        Kind::Tools => {
            let schema = entry.get("inputSchema").cloned().unwrap_or(Value::Null);
            json!({"name": identity, "input": shape::of_schema(&schema)})
        }
        Kind::Prompts => {
            let arguments: BTreeSet<(String, bool)> = prompt_arguments(entry)
                .into_iter()
                .map(|(name, required, _)| (name, required))
                .collect();
            json!({"name": identity, "arguments": arguments.into_iter().collect::<Vec<_>>()})
        }
        Kind::Resources => json!({"uri": identity}),
        Kind::ResourceTemplates => json!({"uriTemplate": identity}),
    }
}

/// A fingerprint of one upstream's whole catalog: every entry's identity and
/// security hash, and the server's name, version and instructions. A rename or a
/// removed entry changes it.
pub fn catalog_fingerprint(snapshot: &ListingSnapshot) -> String {
    catalog_fingerprint_with(snapshot, &security_digests(snapshot))
}

/// The security digest of each entry of a snapshot, by kind (`Kind::index`) and place.
pub type SecurityDigests = [Vec<[u8; 32]>; 4];

/// Every entry's security digest, for [`catalog_fingerprint_with`] and whoever pins
/// the entries, so each is hashed once.
pub fn security_digests(snapshot: &ListingSnapshot) -> SecurityDigests {
    security_digests_of(|kind| snapshot.entries(kind))
}

/// The security digest of each entry that `entries` gives for each kind.
pub fn security_digests_of<'a>(entries: impl Fn(Kind) -> &'a [Value]) -> SecurityDigests {
    Kind::ALL.map(|kind| entries(kind).iter().map(security_digest).collect())
}

/// [`catalog_fingerprint`] of a snapshot whose entries' security digests are `digests`.
pub fn catalog_fingerprint_with(snapshot: &ListingSnapshot, digests: &SecurityDigests) -> String {
    let mut entries = BTreeSet::new();
    for kind in Kind::ALL {
        let kind_digests = &digests[kind.index()];
        for (place, entry) in snapshot.entries(kind).iter().enumerate() {
            // The security hash alone: the compatibility hash is not part of it.
            if let Some(name) = identity(kind, entry) {
                let security = match kind_digests.get(place) {
                    Some(digest) => hex::encode(digest),
                    None => security_hash(entry),
                };
                entries.insert((kind.label(), name.to_string(), security));
            }
        }
    }
    let summary = json!({
        "server": {
            "name": snapshot.server_name,
            "version": snapshot.server_version,
            "instructions": snapshot.instructions,
        },
        "entries": entries.into_iter().collect::<Vec<_>>(),
    });
    hex_sha256(&canonical(&summary))
}

/// A prompt's arguments as (name, required, the argument itself).
fn prompt_arguments(entry: &Value) -> Vec<(String, bool, Value)> {
    entry
        .get("arguments")
        .and_then(Value::as_array)
        .map(|arguments| {
            arguments
                .iter()
                .filter_map(|argument| {
                    let name = argument.get("name")?.as_str()?.to_string();
                    let required = argument.get("required").and_then(Value::as_bool) == Some(true);
                    Some((name, required, argument.clone()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn canonical(value: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail (its keys are strings); an empty input
    // would still hash deterministically.
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(sha256(bytes))
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
