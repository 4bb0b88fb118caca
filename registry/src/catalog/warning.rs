//! Warnings a catalog build returns as data, for the daemon to log once and count.

use std::fmt;
use std::sync::Arc;

use super::{Kind, Route};

#[derive(Clone, Debug, PartialEq)]
pub enum CatalogWarning {
    /// Two entries would be exposed under the same name or URI; the later one is left out.
    Collision {
        kind: Kind,
        exposed: String,
        kept: Route,
        rejected: Route,
    },
    /// An entry that cannot be made valid is left out; `entry` is its name or `#<index>`.
    InvalidEntry {
        kind: Kind,
        upstream: Arc<str>,
        entry: String,
        reason: String,
    },
    /// A tool's `inputSchema` lacked `"type": "object"`, which plexus added.
    SchemaPatched { upstream: Arc<str>, tool: String },
    /// A tool's description or title names another upstream's prefix or exposed tools.
    Shadowing {
        upstream: Arc<str>,
        tool: String,
        mentions: Vec<String>,
    },
}

impl fmt::Display for CatalogWarning {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogWarning::Collision {
                kind,
                exposed,
                kept,
                rejected,
            } => write!(
                formatter,
                "leaving out {noun} `{rejected_original}` of upstream `{rejected_upstream}`: \
                 it would be exposed as `{exposed}`, which already routes to `{kept_original}` \
                 of upstream `{kept_upstream}`",
                noun = kind.entry_noun(),
                rejected_upstream = rejected.upstream,
                rejected_original = rejected.original,
                kept_upstream = kept.upstream,
                kept_original = kept.original,
            ),
            CatalogWarning::InvalidEntry {
                kind,
                upstream,
                entry,
                reason,
            } => write!(
                formatter,
                "leaving out {noun} `{entry}` of upstream `{upstream}`: {reason}",
                noun = kind.entry_noun(),
            ),
            CatalogWarning::SchemaPatched { upstream, tool } => write!(
                formatter,
                "tool `{tool}` of upstream `{upstream}` has an inputSchema without \
                 \"type\": \"object\"; plexus added it so clients accept the tool list"
            ),
            CatalogWarning::Shadowing {
                upstream,
                tool,
                mentions,
            } => write!(
                formatter,
                "tool `{tool}` of upstream `{upstream}` names another upstream's tools in its \
                 description ({}): a description can steer a model's calls to another server",
                mentions.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(upstream: &str, original: &str) -> Route {
        Route {
            upstream: Arc::from(upstream),
            original: original.to_string(),
        }
    }

    #[test]
    fn messages_name_every_source() {
        let cases = [
            (
                CatalogWarning::Collision {
                    kind: Kind::Tools,
                    exposed: "echo".to_string(),
                    kept: route("alpha", "echo"),
                    rejected: route("beta", "echo"),
                },
                "leaving out tool `echo` of upstream `beta`: it would be exposed as `echo`, \
                 which already routes to `echo` of upstream `alpha`",
            ),
            (
                CatalogWarning::InvalidEntry {
                    kind: Kind::ResourceTemplates,
                    upstream: Arc::from("files"),
                    entry: "#3".to_string(),
                    reason: "it has no string `uriTemplate`".to_string(),
                },
                "leaving out resource template `#3` of upstream `files`: it has no string `uriTemplate`",
            ),
            (
                CatalogWarning::SchemaPatched {
                    upstream: Arc::from("neuro-san"),
                    tool: "ask".to_string(),
                },
                "tool `ask` of upstream `neuro-san` has an inputSchema without \"type\": \"object\"; \
                 plexus added it so clients accept the tool list",
            ),
        ];
        for (warning, expected) in cases {
            assert_eq!(warning.to_string(), expected);
        }
    }
}
