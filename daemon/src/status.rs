//! What `GET /status`, the console and `plexus status` show: each
//! upstream's state, process, uptime, restarts, last exit with its stderr tail,
//! calls in flight and waiting, entries by kind, protocol and pin; the sessions
//! by front and principal; the
//! daemon's version, config and uptime.

use std::collections::BTreeMap;
// The uptime is real elapsed time, whatever a test does with tokio's clock.
#[allow(clippy::disallowed_types)]
use std::time::Instant;

use registry::Kind;
use serde_json::{json, Map, Value};

use crate::hub::Hub;

/// The status as JSON. `http_sessions` counts open HTTP sessions by principal.
#[allow(clippy::disallowed_types)] // `started`: see the import
pub fn status(hub: &Hub, http_sessions: BTreeMap<String, usize>, started: Instant) -> Value {
    let catalog = hub.catalog();
    let counts: Vec<_> = Kind::ALL
        .iter()
        .map(|kind| (kind.label(), catalog.counts_by_upstream(*kind)))
        .collect();
    let pins = hub.pins_status().ok();
    let mut upstreams = Vec::new();
    for upstream in hub.upstreams().values() {
        let name = upstream.name();
        let instance = &upstream.shared;
        let state = instance.reported_state();
        let history = instance.history();
        let (pid, live_tail) = instance.process();
        let stderr_tail = if live_tail.is_empty() {
            history.stderr_tail.clone()
        } else {
            live_tail
        };
        let limiter = upstream.limiter();
        let mut entries = Map::new();
        let mut held = 0;
        for (label, by_upstream) in &counts {
            let (exposed, held_here) = by_upstream.get(name).copied().unwrap_or_default();
            entries.insert((*label).to_string(), json!(exposed));
            held += held_here;
        }
        let pin = pins
            .as_ref()
            .and_then(|pins| pins["upstreams"].get(name))
            .map(|pin| json!({"state": pin["state"], "held": held}))
            .unwrap_or_else(|| json!({"state": "not pinned", "held": held}));
        let uptime = (state.label() == "ready")
            .then(|| history.since.map(|since| since.elapsed().as_secs_f64()))
            .flatten();
        upstreams.push(json!({
            "name": name,
            "state": state.label(),
            "pid": pid,
            "uptime_s": uptime,
            "restarts": history.restarts,
            "last_exit": history.last_exit,
            "last_error": instance.last_error(),
            "stderr_tail": stderr_tail,
            "in_flight": limiter.in_flight(),
            "pending": limiter.pending(),
            "entries": entries,
            "protocol": instance.hello().map(|hello| hello.protocol_version),
            "pin": pin,
        }));
    }
    let stdio = hub
        .metrics()
        .sessions_active
        .with_label_values(&["stdio"])
        .get();
    let (config, sha256) = hub.config_identity();
    json!({
        "daemon": {
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "uptime_s": started.elapsed().as_secs_f64(),
            "config": config,
            "config_sha256": sha256,
        },
        "upstreams": upstreams,
        "sessions": {"http": http_sessions, "stdio": stdio},
    })
}

/// The status for people, as a table.
pub fn text(status: &Value) -> String {
    let daemon = &status["daemon"];
    let mut out = format!(
        "plexus {}  pid {}  up {}  config {} (sha256 {})\n\n",
        daemon["version"].as_str().unwrap_or("?"),
        daemon["pid"],
        duration(daemon["uptime_s"].as_f64()),
        daemon["config"].as_str().unwrap_or("?"),
        daemon["config_sha256"]
            .as_str()
            .map(|sha| &sha[..sha.len().min(12)])
            .unwrap_or("?"),
    );
    out.push_str(&format!(
        "{:<18} {:<12} {:>7} {:>8} {:>8} {:>9} {:>6} {:<11} {}\n",
        "UPSTREAM", "STATE", "PID", "UPTIME", "RESTARTS", "CALLS", "TOOLS", "PROTOCOL", "PIN"
    ));
    for upstream in status["upstreams"].as_array().into_iter().flatten() {
        let pin = &upstream["pin"];
        let pin_text = match pin["held"].as_u64() {
            Some(0) | None => pin["state"].as_str().unwrap_or("-").to_string(),
            Some(held) => format!("{} ({held} held)", pin["state"].as_str().unwrap_or("-")),
        };
        out.push_str(&format!(
            "{:<18} {:<12} {:>7} {:>8} {:>8} {:>9} {:>6} {:<11} {}\n",
            upstream["name"].as_str().unwrap_or("?"),
            upstream["state"].as_str().unwrap_or("?"),
            upstream["pid"]
                .as_u64()
                .map_or("-".into(), |pid| pid.to_string()),
            duration(upstream["uptime_s"].as_f64()),
            // As strings: a JSON value's `Display` ignores the column's width.
            upstream["restarts"].to_string(),
            format!("{}/{}", upstream["in_flight"], upstream["pending"]),
            upstream["entries"]["tools"].to_string(),
            upstream["protocol"].as_str().unwrap_or("-"),
            pin_text,
        ));
        let problem = upstream["last_error"].as_str().or_else(|| {
            upstream["last_exit"]
                .as_str()
                .filter(|exit| exit.starts_with("ended"))
        });
        if let Some(problem) = problem {
            out.push_str(&format!("    last: {problem}\n"));
            for line in upstream["stderr_tail"]
                .as_array()
                .into_iter()
                .flatten()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                out.push_str(&format!(
                    "    stderr: {}\n",
                    line.as_str().unwrap_or_default()
                ));
            }
        }
    }
    let sessions = &status["sessions"];
    let http: Vec<String> = sessions["http"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(principal, count)| format!("{principal}={count}"))
        .collect();
    out.push_str(&format!(
        "\nsessions: http {} · stdio {}\n",
        if http.is_empty() {
            "0".to_string()
        } else {
            http.join(" ")
        },
        sessions["stdio"]
    ));
    out
}

fn duration(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds else {
        return "-".into();
    };
    let seconds = seconds as u64;
    match seconds {
        0..=59 => format!("{seconds}s"),
        60..=3599 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_columns_line_up() {
        let upstream = |name: &str, restarts: u64, tools: u64, protocol: &str| {
            json!({"name": name, "state": "ready", "pid": 4242, "uptime_s": 75.0,
                   "restarts": restarts, "in_flight": 1, "pending": 0,
                   "entries": {"tools": tools}, "protocol": protocol,
                   "pin": {"state": "pinned", "held": 0}})
        };
        let status = json!({
            "daemon": {"version": "0", "pid": 1, "uptime_s": 1.0, "config": "c.toml"},
            "upstreams": [upstream("a", 0, 4, "2025-11-25"), upstream("longer-name", 12, 1000, "2026-07-28")],
        });
        let table = text(&status);
        let lines: Vec<&str> = table.lines().filter(|line| !line.is_empty()).collect();
        let header = lines
            .iter()
            .find(|line| line.starts_with("UPSTREAM"))
            .unwrap();
        let rows: Vec<&&str> = lines.iter().filter(|line| line.contains("ready")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        // Right-aligned counts end where their heading does; the protocol starts
        // where its heading does.
        for (heading, values) in [("RESTARTS", ["0", "12"]), ("TOOLS", ["4", "1000"])] {
            let end = header.find(heading).unwrap() + heading.len();
            for (row, value) in rows.iter().zip(values) {
                assert_eq!(&row[end - value.len()..end], value, "{heading}:\n{table}");
                assert_eq!(
                    &row[end - value.len() - 1..end - value.len()],
                    " ",
                    "{table}"
                );
            }
        }
        let protocol = header.find("PROTOCOL").unwrap();
        for row in rows {
            assert!(row[protocol..].starts_with("202"), "{table}");
        }
    }
}
