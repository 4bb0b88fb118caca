//! What the console shows, as JSON: the status of `GET /status` with, per
//! upstream, its last 15 minutes of calls, why it is not serving and when it last
//! restarted; the daemon's memory and last reload; the pins' pending changes; the
//! recent audit lines; and the catalog's entries as a view sees them.

use std::collections::BTreeMap;
#[allow(clippy::disallowed_types)] // the daemon's uptime is real elapsed time
use std::time::Instant;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use registry::{Catalog, Kind};
use serde_json::{json, Map, Value};

use crate::hub::Hub;
use crate::upstreams::UpstreamState;

/// Everything but the catalog (fetched on its own, when its digest changes).
#[allow(clippy::disallowed_types)] // `started`: see the import
pub fn state(hub: &Hub, http_sessions: BTreeMap<String, usize>, started: Instant) -> Value {
    let mut status = crate::status::status(hub, http_sessions, started);
    let now = unix_seconds(SystemTime::now());
    let upstreams = hub.upstreams();
    for shown in status["upstreams"].as_array_mut().into_iter().flatten() {
        let Some(upstream) = shown["name"].as_str().and_then(|name| upstreams.get(name)) else {
            continue;
        };
        let state = upstream.shared.reported_state();
        let history = upstream.shared.history();
        let since = history
            .since
            .map(|since| now - since.elapsed().as_secs_f64());
        // A restart is done once its run serves (or is starting); a crashed run's
        // `since` is when it went down, not a restart.
        let last_restart = (history.restarts > 0
            && matches!(state, UpstreamState::Ready | UpstreamState::Starting))
        .then_some(since)
        .flatten();
        if let UpstreamState::BackingOff { until } = state {
            let retry = until.saturating_duration_since(tokio::time::Instant::now());
            shown["retry_after_ms"] = json!(retry.as_millis() as u64);
        }
        shown["state_since"] = json!(since);
        shown["last_restart"] = json!(last_restart);
        shown["series"] = hub.metrics().recent.series(upstream.name());
    }
    let daemon = &mut status["daemon"];
    daemon["rss_bytes"] = json!(resident_bytes());
    daemon["last_reload"] = match hub.metrics().last_reload() {
        Some((outcome, at)) => json!({"outcome": outcome, "at": at}),
        None => Value::Null,
    };
    daemon["now"] = json!(now);
    let audit = hub.audit();
    status["activity"] = json!({
        "enabled": audit.enabled(),
        "events": if audit.enabled() { json!(audit.recent()) } else { json!([]) },
    });
    status["pins"] = hub
        .pins_diff(None)
        .unwrap_or_else(|error| json!({"error": error.to_string(), "upstreams": {}}));
    status["catalog_digest"] = json!(catalog_digest(hub));
    status
}

/// Changes whenever anything the console's catalog shows changes.
fn catalog_digest(hub: &Hub) -> String {
    let catalog = hub.catalog();
    let mut digest = String::new();
    for kind in Kind::ALL {
        digest.push_str(&hex::encode(&catalog.digest(kind)[..4]));
        digest.push_str(&format!(".{}.", catalog.held_entries(kind).len()));
    }
    digest
}

/// Every entry of the catalog a view sees (the whole one for `None`): exposed,
/// then held with why; each with its upstream, its schema and the views that
/// include it.
pub fn catalog(hub: &Hub, view: Option<&str>) -> Result<Value, String> {
    let view = hub.view_named(view)?;
    let snapshot = hub.subscribe().borrow().clone();
    let catalog = snapshot.view(view.as_deref());
    let mut views: Vec<(&String, &std::sync::Arc<Catalog>)> = snapshot.views.iter().collect();
    views.sort_by(|a, b| a.0.cmp(b.0));
    let mut entries = Vec::new();
    for kind in Kind::ALL {
        for entry in catalog.entries(kind).iter() {
            let Some(exposed) = exposed_key(kind, &entry) else {
                continue;
            };
            let route = route_in(&catalog, kind, &exposed);
            let in_views: Vec<&str> = views
                .iter()
                .filter(|(_, view)| route_in(view, kind, &exposed).is_some())
                .map(|(name, _)| name.as_str())
                .collect();
            let (upstream, original) = route.map_or((None, None), |route| {
                (Some(route.upstream.to_string()), Some(route.original))
            });
            entries.push(json!({
                "kind": kind.label(),
                "name": exposed,
                "upstream": upstream,
                "original": original,
                "description": entry.get("description"),
                "schema": schema(kind, &entry),
                "views": in_views,
            }));
        }
        let mut held: Vec<_> = catalog.held_entries(kind).iter().collect();
        held.sort_by(|a, b| a.0.cmp(b.0));
        for (exposed, held) in held {
            entries.push(json!({
                "kind": kind.label(),
                "name": exposed,
                "upstream": held.route.upstream.to_string(),
                "original": held.route.original,
                "held": &*held.change,
                "views": [],
            }));
        }
    }
    let names: Vec<&str> = views.iter().map(|(name, _)| name.as_str()).collect();
    Ok(json!({ "view": view.as_deref(), "views": names, "entries": entries }))
}

fn route_in(catalog: &Catalog, kind: Kind, exposed: &str) -> Option<registry::Route> {
    match kind {
        Kind::Tools => catalog.route_tool(exposed),
        Kind::Prompts => catalog.route_prompt(exposed),
        Kind::Resources => catalog.route_resource(exposed),
        Kind::ResourceTemplates => catalog.route_template(exposed),
    }
}

fn exposed_key(kind: Kind, entry: &Value) -> Option<String> {
    let key = match kind {
        Kind::Tools | Kind::Prompts => "name",
        Kind::Resources => "uri",
        Kind::ResourceTemplates => "uriTemplate",
    };
    entry.get(key).and_then(Value::as_str).map(str::to_string)
}

fn schema(kind: Kind, entry: &Value) -> Value {
    let mut schema = Map::new();
    for key in match kind {
        Kind::Tools => &["inputSchema", "outputSchema", "annotations"][..],
        Kind::Prompts => &["arguments"][..],
        Kind::Resources | Kind::ResourceTemplates => &["mimeType"][..],
    } {
        if let Some(value) = entry.get(*key) {
            schema.insert((*key).to_string(), value.clone());
        }
    }
    Value::Object(schema)
}

/// The daemon's resident memory, from `/proc/self/status` (None elsewhere).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}
