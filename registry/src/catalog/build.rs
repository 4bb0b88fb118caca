//! Building a catalog snapshot from the upstreams' listings.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::entry::{check_entry, exposed_entry, EntryCheck, SchemaFix};
use super::{
    digest_entries, Catalog, CatalogOptions, CatalogWarning, Kind, Route, UnprefixedTemplate,
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
    (catalog, warnings)
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
        }
        catalog.entries[kind.index()].push(exposed_entry(kind, entry, &exposed_key, schema_fix));
        remember_for_resource_routing(catalog, listing, kind, route);
    }
}

/// Feeds steps 3 and 4 of the resource routing rule in [`crate::uris`].
fn remember_for_resource_routing(
    catalog: &mut Catalog,
    listing: &UpstreamListing,
    kind: Kind,
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
        Kind::ResourceTemplates if listing.prefix.is_empty() => {
            let literal_head = uris::template_literal_head(&route.original);
            // An empty head would match every URI and shadow steps that can decide better.
            if !literal_head.is_empty() {
                catalog.unprefixed_templates.push(UnprefixedTemplate {
                    literal_head: literal_head.to_string(),
                    upstream: route.upstream,
                });
            }
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
