//! What `plexus pins status` and `plexus pins diff` show, as JSON (the admin
//! listener's answer, or computed from the file when no daemon runs) and as text
//! for people. One rendering, whichever way the data came.

use std::collections::BTreeMap;

use registry::fingerprint;
use serde_json::{json, Map, Value};

use super::class_label;
use super::format::{PinError, PinFile, UpstreamRecord};

/// Per upstream: where its pin stands. `held` gives the number of entries held
/// back, when it is known.
pub fn status(file: &PinFile, held: &dyn Fn(&str, &UpstreamRecord) -> Option<usize>) -> Value {
    let mut upstreams = Map::new();
    for (name, record) in &file.upstreams {
        let mut entry = Map::new();
        let state = match (&record.pinned, &record.pending) {
            (None, _) => "unapproved",
            (Some(_), Some(_)) => "changed",
            (Some(_), None) => "pinned",
        };
        entry.insert("state".into(), json!(state));
        if let Some(pinned) = &record.pinned {
            entry.insert("pinned_at".into(), json!(pinned.pinned_at));
            entry.insert("approved_at".into(), json!(pinned.approved_at));
            entry.insert("fingerprint".into(), json!(pinned.catalog_fingerprint));
            entry.insert("entries".into(), json!(pinned.entries.len()));
            entry.insert("server".into(), json!(pinned.server));
        }
        if let Some(pending) = &record.pending {
            let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
            for change in record.changes() {
                *classes.entry(class_label(change.class)).or_default() += 1;
            }
            entry.insert(
                "pending".into(),
                json!({
                    "seen_at": pending.seen_at,
                    "fingerprint": pending.catalog_fingerprint,
                    "server": pending.server,
                    "changes": classes,
                }),
            );
        }
        if let Some(count) = held(name, record) {
            entry.insert("held".into(), json!(count));
        }
        entry.insert("approvals".into(), json!(record.history.len()));
        upstreams.insert(name.clone(), Value::Object(entry));
    }
    json!({ "upstreams": upstreams })
}

/// Field by field, what approving would accept: for `upstream`, or for every
/// upstream with something pending.
pub fn diff(file: &PinFile, upstream: Option<&str>) -> Result<Value, PinError> {
    let mut upstreams = Map::new();
    let records: Vec<(&String, &UpstreamRecord)> = match upstream {
        Some(name) => {
            let record = file
                .upstreams
                .get_key_value(name)
                .ok_or_else(|| PinError::UnknownUpstream(name.to_string()))?;
            vec![record]
        }
        None => file
            .upstreams
            .iter()
            .filter(|(_, record)| record.pending.is_some())
            .collect(),
    };
    for (name, record) in records {
        let changes = record.changes();
        upstreams.insert(
            name.clone(),
            json!({
                "from": record.pinned.as_ref().map(|p| &p.catalog_fingerprint),
                "to": record.pending.as_ref().map(|p| &p.catalog_fingerprint),
                "pinned_at": record.pinned.as_ref().map(|p| &p.pinned_at),
                "seen_at": record.pending.as_ref().map(|p| &p.seen_at),
                "changes": changes,
            }),
        );
    }
    Ok(json!({ "upstreams": upstreams }))
}

/// The status as a table.
pub fn status_text(status: &Value) -> String {
    let mut lines = vec![format!(
        "{:<20} {:<11} {:>7} {:>5}  {:<14} {}",
        "UPSTREAM", "STATE", "ENTRIES", "HELD", "FINGERPRINT", "CHANGES"
    )];
    for (name, entry) in status["upstreams"].as_object().into_iter().flatten() {
        let changes = entry["pending"]["changes"]
            .as_object()
            .map(|classes| {
                classes
                    .iter()
                    .map(|(class, count)| format!("{count} {class}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "-".into());
        let fingerprint = entry["fingerprint"].as_str().unwrap_or("-");
        lines.push(format!(
            "{:<20} {:<11} {:>7} {:>5}  {:<14} {}",
            name,
            entry["state"].as_str().unwrap_or("?"),
            entry["entries"]
                .as_u64()
                .map_or("-".into(), |n| n.to_string()),
            entry["held"].as_u64().map_or("-".into(), |n| n.to_string()),
            short(fingerprint),
            changes
        ));
    }
    lines.join("\n") + "\n"
}

/// The diff for people: each change with its class, entry, path, and old and new values.
pub fn diff_text(diff: &Value) -> String {
    let mut out = String::new();
    let upstreams = diff["upstreams"].as_object();
    if upstreams.is_none_or(Map::is_empty) {
        return "every upstream's catalog is as pinned\n".into();
    }
    for (name, upstream) in upstreams.into_iter().flatten() {
        let changes = upstream["changes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if changes.is_empty() {
            out.push_str(&format!("{name}: as pinned\n"));
            continue;
        }
        out.push_str(&format!(
            "{name}: {} change{} since {} (pinned {} → seen {})\n",
            changes.len(),
            if changes.len() == 1 { "" } else { "s" },
            upstream["pinned_at"].as_str().unwrap_or("never pinned"),
            short(upstream["from"].as_str().unwrap_or("-")),
            short(upstream["to"].as_str().unwrap_or("-")),
        ));
        let mut entries = Vec::new();
        for change in changes {
            let Ok(change) = serde_json::from_value::<fingerprint::Change>(change.clone()) else {
                continue;
            };
            let entry = format!("{}/{}", change.kind, change.identity);
            out.push_str(&format!(
                "  {:<9} {}  {}  {}\n",
                class_label(change.class),
                entry,
                if change.path.is_empty() {
                    "(whole entry)"
                } else {
                    &change.path
                },
                change.reason
            ));
            out.push_str(&format!("      - {}\n", shown(change.old.as_ref())));
            out.push_str(&format!("      + {}\n", shown(change.new.as_ref())));
            if change.kind != "server" && !entries.contains(&change.identity) {
                entries.push(change.identity);
            }
        }
        out.push_str(&format!("  approve all: plexus pins approve {name}\n"));
        for entry in entries {
            out.push_str(&format!(
                "  approve one: plexus pins approve {name}/{entry}\n"
            ));
        }
    }
    out
}

fn shown(value: Option<&Value>) -> String {
    match value {
        None => "(absent)".into(),
        Some(value) => {
            let text = value.to_string();
            if text.chars().count() > 200 {
                text.chars().take(197).collect::<String>() + "…"
            } else {
                text
            }
        }
    }
}

fn short(fingerprint: &str) -> String {
    fingerprint.chars().take(12).collect()
}
