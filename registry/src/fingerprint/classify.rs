//! Two listings of one upstream compared field by field. Each change names the
//! entry, the JSON pointer inside it, the old and new values, and its class:
//! *breaking* (a caller's request can fail: a required parameter added, removed or
//! renamed, a type changed, an entry removed), *security* (what a model reads
//! changed: any text, annotation, enum, default or other schema keyword, an
//! optional parameter, a new entry, the instructions), *cosmetic* (nothing a model
//! or a caller sees: the server's version).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{identity, prompt_arguments, security_hash, shape, ListingSnapshot};
use crate::Kind;

/// How much a change matters; ordered, so an entry's class is its largest change's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeClass {
    Cosmetic,
    Security,
    Breaking,
}

/// One difference between two listings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// `tools`, `prompts`, `resources`, `resourceTemplates`, or `server`.
    pub kind: String,
    /// The entry's name, URI or URI template (the server's name for `server`).
    pub identity: String,
    pub class: ChangeClass,
    /// A JSON pointer inside the entry; empty for the whole entry.
    pub path: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
    /// A short word for what changed, e.g. `required_added`, `description_changed`.
    pub reason: String,
}

/// Every change from `old` to `new`; entries with equal security hashes (key
/// order and whitespace aside, identical) have none.
pub fn classify(old: &ListingSnapshot, new: &ListingSnapshot) -> Vec<Change> {
    let mut changes = Vec::new();
    for kind in Kind::ALL {
        let before = by_identity(kind, old.entries(kind));
        let after = by_identity(kind, new.entries(kind));
        for (name, entry) in &before {
            if !after.contains_key(name) {
                changes.push(
                    Change::whole(kind, name, ChangeClass::Breaking, "entry_removed")
                        .with(Some(entry), None),
                );
            }
        }
        for (name, entry) in &after {
            match before.get(name) {
                None => changes.push(
                    Change::whole(kind, name, ChangeClass::Security, "entry_added")
                        .with(None, Some(entry)),
                ),
                // Equal values hash alike: only entries that differ are hashed.
                Some(previous)
                    if previous != entry && security_hash(previous) != security_hash(entry) =>
                {
                    let mut found = Differences {
                        kind,
                        identity: name,
                        changes: &mut changes,
                    };
                    match kind {
                        Kind::Tools => found.tool(previous, entry),
                        Kind::Prompts => found.prompt(previous, entry),
                        Kind::Resources | Kind::ResourceTemplates => {
                            found.walk(previous, entry, "", &|_| false)
                        }
                    }
                }
                Some(_) => {}
            }
        }
    }
    let server = new.server_name.clone().unwrap_or_default();
    if old.instructions != new.instructions {
        changes.push(Change {
            kind: "server".into(),
            identity: server.clone(),
            class: ChangeClass::Security,
            path: "/instructions".into(),
            old: old.instructions.clone().map(Value::String),
            new: new.instructions.clone().map(Value::String),
            reason: "instructions_changed".into(),
        });
    }
    if old.server_version != new.server_version || old.server_name != new.server_name {
        changes.push(Change {
            kind: "server".into(),
            identity: server,
            class: ChangeClass::Cosmetic,
            path: "/serverInfo".into(),
            old: Some(server_info(old)),
            new: Some(server_info(new)),
            reason: "server_version_changed".into(),
        });
    }
    changes
}

fn server_info(snapshot: &ListingSnapshot) -> Value {
    serde_json::json!({"name": snapshot.server_name, "version": snapshot.server_version})
}

fn by_identity(kind: Kind, entries: &[Value]) -> BTreeMap<String, &Value> {
    entries
        .iter()
        .filter_map(|entry| Some((identity(kind, entry)?.to_string(), entry)))
        .collect()
}

impl Change {
    fn whole(kind: Kind, identity: &str, class: ChangeClass, reason: &str) -> Change {
        Change {
            kind: kind.label().to_string(),
            identity: identity.to_string(),
            class,
            path: String::new(),
            old: None,
            new: None,
            reason: reason.to_string(),
        }
    }

    fn with(mut self, old: Option<&Value>, new: Option<&Value>) -> Change {
        self.old = old.cloned();
        self.new = new.cloned();
        self
    }
}

/// Collects the changes of one entry.
struct Differences<'a> {
    kind: Kind,
    identity: &'a str,
    changes: &'a mut Vec<Change>,
}

impl Differences<'_> {
    fn push(
        &mut self,
        class: ChangeClass,
        path: &str,
        old: Option<&Value>,
        new: Option<&Value>,
        reason: &str,
    ) {
        self.changes.push(
            Change {
                path: path.to_string(),
                ..Change::whole(self.kind, self.identity, class, reason)
            }
            .with(old, new),
        );
    }

    fn tool(&mut self, old: &Value, new: &Value) {
        let null = Value::Null;
        let old_schema = old.get("inputSchema").unwrap_or(&null);
        let new_schema = new.get("inputSchema").unwrap_or(&null);
        let old_required = required(old_schema);
        let new_required = required(new_schema);
        let old_properties = properties(old_schema);
        let new_properties = properties(new_schema);
        for name in old_required.difference(&new_required) {
            let value = Value::String(name.clone());
            self.push(
                ChangeClass::Breaking,
                "/inputSchema/required",
                Some(&value),
                None,
                "required_removed",
            );
        }
        for name in new_required.difference(&old_required) {
            let value = Value::String(name.clone());
            self.push(
                ChangeClass::Breaking,
                "/inputSchema/required",
                None,
                Some(&value),
                "required_added",
            );
        }
        for (name, schema) in &old_properties {
            let path = format!("/inputSchema/properties/{}", escape(name));
            match new_properties.get(name) {
                None if !old_required.contains(name) => self.push(
                    ChangeClass::Security,
                    &path,
                    Some(schema),
                    None,
                    "optional_parameter_removed",
                ),
                // A required one's removal is reported above.
                None => {}
                Some(current) => {
                    let before = shape::of(schema, old_schema);
                    let after = shape::of(current, new_schema);
                    if before != after {
                        self.push(
                            ChangeClass::Breaking,
                            &path,
                            Some(&before),
                            Some(&after),
                            "type_changed",
                        );
                    }
                }
            }
        }
        for (name, schema) in &new_properties {
            if !old_properties.contains_key(name) && !new_required.contains(name) {
                let path = format!("/inputSchema/properties/{}", escape(name));
                self.push(
                    ChangeClass::Security,
                    &path,
                    None,
                    Some(schema),
                    "optional_parameter_added",
                );
            }
        }
        // Everything else, text above all, field by field. Added and removed
        // parameters, `required` and the types were judged above.
        let judged = |path: &str| {
            path == "/inputSchema/required"
                || (path.starts_with("/inputSchema/") && path.ends_with("/type"))
                || properties_path_of_other(path, &old_properties, &new_properties)
        };
        self.walk(old, new, "", &judged);
    }

    fn prompt(&mut self, old: &Value, new: &Value) {
        let before: BTreeMap<String, (bool, Value)> = prompt_arguments(old)
            .into_iter()
            .map(|(name, required, argument)| (name, (required, argument)))
            .collect();
        let after: BTreeMap<String, (bool, Value)> = prompt_arguments(new)
            .into_iter()
            .map(|(name, required, argument)| (name, (required, argument)))
            .collect();
        for (name, (required, argument)) in &before {
            let path = format!("/arguments/{}", escape(name));
            match after.get(name) {
                None => {
                    let (class, reason) = if *required {
                        (ChangeClass::Breaking, "required_removed")
                    } else {
                        (ChangeClass::Security, "optional_parameter_removed")
                    };
                    self.push(class, &path, Some(argument), None, reason);
                }
                Some((now_required, current)) => {
                    if required != now_required {
                        let reason = if *now_required {
                            "required_added"
                        } else {
                            "required_removed"
                        };
                        self.push(
                            ChangeClass::Breaking,
                            &path,
                            Some(argument),
                            Some(current),
                            reason,
                        );
                    }
                    self.walk(argument, current, &path, &|p: &str| {
                        p.ends_with("/required")
                    });
                }
            }
        }
        for (name, (required, argument)) in &after {
            if !before.contains_key(name) {
                let path = format!("/arguments/{}", escape(name));
                let (class, reason) = if *required {
                    (ChangeClass::Breaking, "required_added")
                } else {
                    (ChangeClass::Security, "optional_parameter_added")
                };
                self.push(class, &path, None, Some(argument), reason);
            }
        }
        self.walk(old, new, "", &|path: &str| path == "/arguments");
    }

    /// Reports every differing leaf below `path` as a security change, except
    /// where `judged` says the path was already classified.
    fn walk(&mut self, old: &Value, new: &Value, path: &str, judged: &dyn Fn(&str) -> bool) {
        if old == new || (!path.is_empty() && judged(path)) {
            return;
        }
        match (old, new) {
            (Value::Object(before), Value::Object(after)) => {
                let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
                for key in keys {
                    let child = format!("{path}/{}", escape(key));
                    match (before.get(key), after.get(key)) {
                        (Some(a), Some(b)) => self.walk(a, b, &child, judged),
                        (a, b) => {
                            if !judged(&child) {
                                self.push(ChangeClass::Security, &child, a, b, reason_of(&child));
                            }
                        }
                    }
                }
            }
            (Value::Array(before), Value::Array(after)) if before.len() == after.len() => {
                for (index, (a, b)) in before.iter().zip(after).enumerate() {
                    self.walk(a, b, &format!("{path}/{index}"), judged);
                }
            }
            _ => self.push(
                ChangeClass::Security,
                path,
                Some(old),
                Some(new),
                reason_of(path),
            ),
        }
    }
}

/// A word for a security change, from where it is.
fn reason_of(path: &str) -> &'static str {
    let last = path.rsplit('/').next().unwrap_or_default();
    if path.starts_with("/annotations") {
        "annotation_changed"
    } else if last == "description" {
        "description_changed"
    } else if last == "title" {
        "title_changed"
    } else if path.contains("/enum") || last == "const" {
        "enum_changed"
    } else if path.starts_with("/outputSchema") {
        "output_schema_changed"
    } else {
        "definition_changed"
    }
}

/// Whether `path` is an added or removed parameter's subtree (reported whole).
fn properties_path_of_other(
    path: &str,
    old: &Map<String, Value>,
    new: &Map<String, Value>,
) -> bool {
    let Some(rest) = path.strip_prefix("/inputSchema/properties/") else {
        return false;
    };
    let name = unescape(rest.split('/').next().unwrap_or_default());
    old.contains_key(&name) != new.contains_key(&name)
}

fn required(schema: &Value) -> BTreeSet<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn properties(schema: &Value) -> Map<String, Value> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// RFC 6901 escaping of one pointer segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}
