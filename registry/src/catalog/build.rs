//! Building a catalog snapshot from the upstreams' listings.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::entry::{check_entry, exposed_entry, EntryCheck, SchemaFix};
use super::{
    digest_entries, Catalog, CatalogOptions, CatalogWarning, Held, Kind, Route, TemplateHead,
    UpstreamListing,
};
use crate::{names, uris};

/// A later upstream whose prefix derives a URI namespace an earlier one already holds.
struct NamespaceConflict {
    namespace: String,
    owner: Arc<str>,
}

pub(super) fn build(
    listings: &[UpstreamListing],
    options: &CatalogOptions,
) -> (Catalog, Vec<CatalogWarning>) {
    let mut catalog = Catalog::with_page_size(options.page_size);
    let namespace_conflicts = claim_namespaces(&mut catalog, listings);
    let mut builder = Builder {
        catalog,
        warnings: Vec::new(),
        name_budget: options.name_budget,
        namespace_conflicts,
    };
    for listing in listings {
        builder
            .catalog
            .upstream_cache
            .insert(listing.upstream.clone(), listing.cache);
        if listing.prefix.is_empty() {
            builder
                .catalog
                .unprefixed_upstreams
                .push(listing.upstream.clone());
        }
        if let Some(reason) = &listing.quarantine.whole {
            builder
                .catalog
                .held_upstreams
                .insert(listing.upstream.clone(), reason.clone());
        }
        if let Some(text) = &listing.instructions {
            if !listing.quarantine.instructions {
                builder
                    .catalog
                    .instructions
                    .insert(listing.upstream.clone(), text.clone());
            }
        }
        for kind in Kind::ALL {
            for (index, entry) in listing.listed(kind).iter().enumerate() {
                builder.add_entry(listing, kind, index, entry);
            }
        }
    }
    let Builder {
        mut catalog,
        warnings,
        ..
    } = builder;
    for kind in Kind::ALL {
        catalog.digests[kind.index()] = digest_entries(catalog.entries(kind));
    }
    catalog.merge_cache();
    let unprefixed: Vec<&UpstreamListing> =
        listings.iter().filter(|l| l.prefix.is_empty()).collect();
    if let [only] = unprefixed.as_slice() {
        if only.quarantine.admits_unlisted
            && only.tool_filter.is_open()
            && only.quarantine.whole.is_none()
        {
            catalog.unlisted_tools_to = Some(only.upstream.clone());
        }
    }
    let mut warnings = warnings;
    warnings.extend(shadowing(&catalog, listings));
    (catalog, warnings)
}

/// Tools whose model-facing text names another upstream's prefix (`{prefix}__…`) or
/// one of its exposed tools: a description steering calls to another server's tool
/// is a known attack, so each is reported.
fn shadowing(catalog: &Catalog, listings: &[UpstreamListing]) -> Vec<CatalogWarning> {
    let routes = &catalog.routes[Kind::Tools.index()];
    let prefixes: HashMap<&str, &Arc<str>> = listings
        .iter()
        .filter(|listing| !listing.prefix.is_empty())
        .map(|listing| (listing.prefix.as_str(), &listing.upstream))
        .collect();
    let mut warnings = Vec::new();
    for entry in catalog.entries(Kind::Tools) {
        let Some(route) = entry
            .get("name")
            .and_then(Value::as_str)
            .and_then(|name| routes.get(name))
        else {
            continue;
        };
        let mut mentions = std::collections::BTreeSet::new();
        let mut texts = Vec::new();
        model_facing_text(entry, &mut texts);
        for word in texts.iter().flat_map(|text| {
            text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        }) {
            let names_other = routes
                .get(word)
                .is_some_and(|other| other.upstream != route.upstream)
                || word.split_once("__").is_some_and(|(prefix, _)| {
                    prefixes
                        .get(prefix)
                        .is_some_and(|other| **other != route.upstream)
                });
            if names_other {
                mentions.insert(word.to_string());
            }
        }
        if !mentions.is_empty() {
            warnings.push(CatalogWarning::Shadowing {
                upstream: route.upstream.clone(),
                tool: route.original.clone(),
                mentions: mentions.into_iter().collect(),
            });
        }
    }
    warnings
}

/// Every `description` and `title` inside an entry, at any depth.
fn model_facing_text<'a>(value: &'a Value, texts: &mut Vec<&'a str>) {
    match value {
        Value::Object(object) => {
            for (key, member) in object {
                match member {
                    Value::String(text) if key == "description" || key == "title" => {
                        texts.push(text)
                    }
                    _ => model_facing_text(member, texts),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| model_facing_text(item, texts)),
        _ => {}
    }
}

/// The snapshot being filled and what it has to report.
struct Builder {
    catalog: Catalog,
    warnings: Vec<CatalogWarning>,
    name_budget: usize,
    namespace_conflicts: HashMap<Arc<str>, NamespaceConflict>,
}

/// Fills the namespace tables, first come first served, and returns the later upstreams
/// whose namespace was already taken: their URIs could not be routed back unambiguously.
fn claim_namespaces(
    catalog: &mut Catalog,
    listings: &[UpstreamListing],
) -> HashMap<Arc<str>, NamespaceConflict> {
    let mut conflicts = HashMap::new();
    for listing in listings {
        let Some(namespace) = uris::uri_namespace(&listing.prefix) else {
            continue;
        };
        match catalog.upstreams_by_namespace.entry(namespace.clone()) {
            Entry::Occupied(owner) if *owner.get() != listing.upstream => {
                conflicts.insert(
                    listing.upstream.clone(),
                    NamespaceConflict {
                        namespace,
                        owner: owner.get().clone(),
                    },
                );
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(slot) => {
                slot.insert(listing.upstream.clone());
                catalog
                    .namespaces_by_upstream
                    .insert(listing.upstream.clone(), namespace);
            }
        }
    }
    conflicts
}

impl Builder {
    /// Checks entry number `index` of `listing`'s `kind` and adds its exposed copy and route,
    /// or records why it is left out.
    fn add_entry(&mut self, listing: &UpstreamListing, kind: Kind, index: usize, entry: &Value) {
        let (catalog, warnings) = (&mut self.catalog, &mut self.warnings);
        let (original, schema_fix) = match check_entry(kind, entry, index, &listing.tool_filter) {
            EntryCheck::Keep {
                original,
                schema_fix,
            } => (original, schema_fix),
            EntryCheck::Filtered => return,
            EntryCheck::Invalid { entry, reason } => {
                warnings.push(CatalogWarning::InvalidEntry {
                    kind,
                    upstream: listing.upstream.clone(),
                    entry,
                    reason,
                });
                return;
            }
        };
        let exposed_key = match kind {
            Kind::Tools | Kind::Prompts => {
                names::exposed_name(&listing.prefix, &original, self.name_budget)
            }
            Kind::Resources | Kind::ResourceTemplates => {
                if let Some(conflict) = self.namespace_conflicts.get(&listing.upstream) {
                    let reason = format!(
                        "its prefix `{}` gives the URI namespace `{}`, \
                         which upstream `{}` already uses",
                        listing.prefix, conflict.namespace, conflict.owner
                    );
                    warnings.push(CatalogWarning::InvalidEntry {
                        kind,
                        upstream: listing.upstream.clone(),
                        entry: original,
                        reason,
                    });
                    return;
                }
                let namespace = catalog.namespaces_by_upstream.get(&listing.upstream);
                uris::expose(namespace.map(String::as_str), &original)
            }
        };
        let route = Route {
            upstream: listing.upstream.clone(),
            original,
        };
        if let Some(change) = listing.quarantine.holds(kind, &route.original) {
            // Held back: not listed, not routed, but known, so a caller learns why.
            if kind == Kind::ResourceTemplates {
                catalog.templates.push(TemplateHead {
                    template: exposed_key.clone(),
                    literal_head: uris::template_literal_head(&exposed_key).to_string(),
                    upstream: listing.upstream.clone(),
                    unprefixed: listing.prefix.is_empty(),
                    held: Some(change.clone()),
                });
            }
            catalog.held[kind.index()]
                .entry(exposed_key)
                .or_insert_with(|| Held {
                    route,
                    change: change.clone(),
                });
            return;
        }
        match catalog.routes[kind.index()].entry(exposed_key.clone()) {
            Entry::Occupied(kept) => {
                warnings.push(CatalogWarning::Collision {
                    kind,
                    exposed: exposed_key,
                    kept: kept.get().clone(),
                    rejected: route,
                });
                return;
            }
            Entry::Vacant(slot) => {
                slot.insert(route.clone());
            }
        }
        if schema_fix != SchemaFix::None {
            warnings.push(CatalogWarning::SchemaPatched {
                upstream: listing.upstream.clone(),
                tool: route.original.clone(),
            });
        }
        if kind == Kind::Tools {
            let designated = entry
                .get("inputSchema")
                .map(crate::headers::param_headers)
                .and_then(Result::ok)
                .unwrap_or_default();
            if !designated.is_empty() {
                catalog
                    .param_headers
                    .insert(exposed_key.clone(), designated.into());
            }
            if let Some(support) = super::TaskSupport::of_tool(entry) {
                catalog.task_support.insert(exposed_key.clone(), support);
            }
        }
        catalog.entries[kind.index()].push(exposed_entry(kind, entry, &exposed_key, schema_fix));
        remember_for_resource_routing(catalog, listing, kind, &exposed_key, route);
    }
}

/// Feeds steps 2 to 4 of the resource routing rule in [`crate::uris`].
fn remember_for_resource_routing(
    catalog: &mut Catalog,
    listing: &UpstreamListing,
    kind: Kind,
    exposed_key: &str,
    route: Route,
) {
    match kind {
        Kind::Resources => match catalog.echoed_originals.entry(route.original.clone()) {
            Entry::Occupied(mut listed) => {
                let listed_by_another = listed
                    .get()
                    .as_ref()
                    .is_some_and(|earlier| earlier.upstream != route.upstream);
                if listed_by_another {
                    listed.insert(None);
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(Some(route));
            }
        },
        Kind::ResourceTemplates => {
            let literal_head = uris::template_literal_head(exposed_key);
            // An empty head would match every URI and shadow steps that can decide better.
            if !literal_head.is_empty() {
                catalog.templates.push(TemplateHead {
                    template: exposed_key.to_string(),
                    literal_head: literal_head.to_string(),
                    upstream: route.upstream,
                    unprefixed: listing.prefix.is_empty(),
                    held: None,
                });
            }
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
