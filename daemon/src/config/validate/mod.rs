//! Raw sections checked into [`Config`]: one function per section (`daemon`,
//! `upstream`, the views here, which name both), shared value checks in `values`;
//! every problem collected with its key.

mod cluster;
mod daemon;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
mod tracing;
mod upstream;
mod values;

use std::collections::BTreeMap;
use std::path::Path;

use super::raw::{RawDaemon, RawUpstream, RawView};
use super::*;
use registry::ToolFilter;

pub use daemon::default_state_dir;
use daemon::validate_daemon;
use upstream::validate_upstream;
use values::valid_upstream_name;

/// Parses and validates configuration text; relative paths resolve against `base`.
pub fn parse(
    text: &str,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, Vec<ConfigIssue>> {
    let mut issues = Vec::new();
    let issue = |key: &str, message: String| ConfigIssue {
        key: key.to_string(),
        message,
    };
    let mut document: toml::Table = toml::from_str(text).map_err(|error| {
        let line = error
            .span()
            .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
        let at = line
            .map(|line| format!(" at line {line}"))
            .unwrap_or_default();
        let reason = error.message().replace('\n', " ");
        vec![issue("(file)", format!("not valid TOML{at}: {reason}"))]
    })?;

    // Sections are deserialized one by one so that one bad upstream does not hide another's errors.
    let raw_daemon = match document.remove("daemon") {
        None => RawDaemon::default(),
        Some(value) => value.try_into::<RawDaemon>().unwrap_or_else(|error| {
            issues.push(issue("daemon", error.message().to_string()));
            RawDaemon::default()
        }),
    };
    let raw_upstreams = match document.remove("upstreams") {
        None => toml::Table::new(),
        Some(toml::Value::Table(table)) => table,
        Some(_) => {
            issues.push(issue("upstreams", "must be a table of upstreams".into()));
            toml::Table::new()
        }
    };
    let raw_views = match document.remove("views") {
        None => toml::Table::new(),
        Some(toml::Value::Table(table)) => table,
        Some(_) => {
            issues.push(issue("views", "must be a table of views".into()));
            toml::Table::new()
        }
    };
    let raw_cluster = document.remove("cluster");
    for key in document.keys() {
        issues.push(issue(
            key,
            "unknown section (expected `daemon`, `upstreams`, `views` or `cluster`)".into(),
        ));
    }
    let cluster =
        raw_cluster.and_then(|raw| cluster::validate_cluster(raw, base, environment, &mut issues));

    let mut daemon = validate_daemon(raw_daemon, base, environment, &mut issues);
    let mut upstreams = BTreeMap::new();
    for (name, value) in raw_upstreams {
        let key = format!("upstreams.{name}");
        if !valid_upstream_name(&name) {
            issues.push(issue(
                &key,
                "upstream names use only lowercase letters, digits and `-`".into(),
            ));
        }
        let raw = match value.try_into::<RawUpstream>() {
            Ok(raw) => raw,
            Err(error) => {
                issues.push(issue(&key, error.message().to_string()));
                continue;
            }
        };
        if let Some(upstream) = validate_upstream(&name, raw, base, environment, &mut issues) {
            upstreams.insert(name, upstream);
        }
    }
    let views = validate_views(raw_views, &upstreams, &daemon, &mut issues);
    if let Some(oauth) = daemon.oauth.as_mut() {
        oauth.view_claims = views
            .iter()
            .filter(|(_, view)| !view.claims.is_empty())
            .map(|(name, view)| (name.clone(), view.claims.clone()))
            .collect();
    }
    if issues.is_empty() {
        Ok(Config {
            daemon,
            upstreams,
            views,
            cluster,
        })
    } else {
        Err(issues)
    }
}

/// `[views.<name>]`: names like upstreams', upstreams that exist, tokens that exist
/// and are bound to one view at most, claims only where `[daemon.oauth]` admits
/// access tokens.
fn validate_views(
    raw_views: toml::Table,
    upstreams: &BTreeMap<String, UpstreamConfig>,
    daemon: &DaemonSettings,
    issues: &mut Vec<ConfigIssue>,
) -> BTreeMap<String, ViewConfig> {
    let mut views = BTreeMap::new();
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in raw_views {
        let key = format!("views.{name}");
        if !valid_upstream_name(&name) {
            issues.push(ConfigIssue {
                key: key.clone(),
                message: "view names use only lowercase letters, digits and `-`".into(),
            });
        }
        let raw = match value.try_into::<RawView>() {
            Ok(raw) => raw,
            Err(error) => {
                issues.push(ConfigIssue {
                    key,
                    message: error.message().to_string(),
                });
                continue;
            }
        };
        for upstream in raw.upstreams.iter().flatten() {
            if !upstreams.contains_key(upstream) {
                issues.push(ConfigIssue {
                    key: format!("{key}.upstreams"),
                    message: format!("there is no upstream `{upstream}`"),
                });
            }
        }
        for token in &raw.tokens {
            if !daemon.auth_tokens.0.iter().any(|(known, _)| known == token) {
                issues.push(ConfigIssue {
                    key: format!("{key}.tokens"),
                    message: format!("there is no token `{token}` in [daemon] auth_tokens"),
                });
            }
            if let Some(other) = bound.insert(token.clone(), name.clone()) {
                issues.push(ConfigIssue {
                    key: format!("{key}.tokens"),
                    message: format!("token `{token}` is already bound to view `{other}`"),
                });
            }
        }
        if !raw.claims.is_empty() && daemon.oauth.is_none() {
            issues.push(ConfigIssue {
                key: format!("{key}.claims"),
                message: "claims come from access tokens: configure [daemon.oauth] first".into(),
            });
        }
        if raw
            .claims
            .iter()
            .any(|(claim, value)| claim.is_empty() || value.is_empty())
        {
            issues.push(ConfigIssue {
                key: format!("{key}.claims"),
                message: "claim names and values must not be empty".into(),
            });
        }
        let restricts_resources = !raw.resources.is_empty() || !raw.deny_resources.is_empty();
        let view = registry::View {
            upstreams: raw.upstreams.map(|names| names.into_iter().collect()),
            tools: ToolFilter::new(raw.tools, raw.deny_tools),
            prompts: ToolFilter::new(raw.prompts, raw.deny_prompts),
            resources: ToolFilter::new(raw.resources, raw.deny_resources),
            restricts_resources,
            expose: raw.expose.unwrap_or_default(),
        };
        views.insert(
            name,
            ViewConfig {
                view,
                tokens: raw.tokens,
                claims: raw.claims,
            },
        );
    }
    views
}
