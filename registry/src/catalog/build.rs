//! Putting a snapshot together from the upstreams' parts: URI namespaces claimed
//! first come first served, collisions across upstreams (the first keeps the
//! name), the tables merged, digests, and shadowing found from each part's words.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::entries::{listed_key_of, original_key_of, EntryRef};
use super::part::UpstreamPart;
use super::{Catalog, CatalogOptions, CatalogWarning, Kind};

pub(super) fn assemble(
    parts: Vec<Arc<UpstreamPart>>,
    options: &CatalogOptions,
) -> (Catalog, Vec<CatalogWarning>) {
    let mut catalog = Catalog::with_page_size(options.page_size);
    catalog.expose = options.expose;
    let mut warnings = Vec::new();
    let taken = claim_namespaces(&mut catalog, &parts);
    for kind in Kind::ALL {
        let total = parts
            .iter()
            .map(|part| part.tables.exposed[kind.index()].len())
            .sum();
        catalog.entries[kind.index()].reserve(total);
        let listed = listed_key_of(&parts, &catalog.entries[kind.index()], kind);
        catalog.routes[kind.index()].reserve(total, listed);
    }
    for (position, part) in parts.iter().enumerate() {
        let upstream = &part.upstream;
        catalog.upstream_cache.insert(upstream.clone(), part.cache);
        if part.prefix.is_empty() {
            catalog.unprefixed_upstreams.push(upstream.clone());
        }
        if let Some(reason) = part.held_whole() {
            catalog
                .held_upstreams
                .insert(upstream.clone(), reason.clone());
        }
        if let Some(text) = part.shown_instructions() {
            catalog.instructions.insert(upstream.clone(), text.clone());
        }
        let part_number = u32::try_from(position).unwrap_or(u32::MAX);
        for kind in Kind::ALL {
            let uris = matches!(kind, Kind::Resources | Kind::ResourceTemplates);
            if let (true, Some(owner)) = (uris, taken.get(upstream)) {
                namespace_taken(part, kind, owner, &mut warnings);
                continue;
            }
            for (exposed, held) in &part.tables.held[kind.index()] {
                catalog.held[kind.index()]
                    .entry(exposed.clone())
                    .or_insert_with(|| held.clone());
            }
            // Places of this part's entries of `kind` that won their name.
            let mut won = vec![false; part.tables.exposed[kind.index()].len()];
            for (index, won) in won.iter_mut().enumerate() {
                let entry = EntryRef {
                    part: part_number,
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                };
                // Listed first, so the table can read its key; taken back if the
                // name is another's.
                let entries = &mut catalog.entries[kind.index()];
                let position = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                entries.push(entry);
                let listed = listed_key_of(&parts, entries, kind);
                let kept = catalog.routes[kind.index()]
                    .insert(position, listed)
                    .and_then(|kept| entries.get(*kept as usize))
                    .copied();
                if let Some(kept) = kept {
                    entries.pop();
                    let kept = parts[kept.part as usize].route(kind, kept.index as usize);
                    warnings.push(CatalogWarning::Collision {
                        kind,
                        exposed: part.exposed_key(kind, index).to_string(),
                        kept,
                        rejected: part.route(kind, index),
                    });
                    continue;
                }
                *won = true;
                if kind == Kind::Resources {
                    remember_original(&mut catalog, &parts, entry);
                }
            }
            if kind == Kind::ResourceTemplates {
                for (index, head) in &part.tables.templates {
                    if index.is_none_or(|index| won[index as usize]) {
                        catalog.templates.push(head.clone());
                    }
                }
            }
        }
    }
    catalog.parts = parts;
    for kind in Kind::ALL {
        catalog.digests[kind.index()] = catalog.digest_of(kind);
    }
    catalog.merge_cache();
    if let [only] = catalog.unprefixed_upstreams.as_slice() {
        let part = catalog.parts.iter().find(|part| part.upstream == *only);
        if part.is_some_and(|part| part.takes_unlisted_tools()) {
            catalog.unlisted_tools_to = Some(only.clone());
        }
    }
    warnings.extend(shadowing(&catalog));
    (catalog, warnings)
}

/// Step 4 of the resource routing rule: a listed resource by its original URI,
/// unless several upstreams list that URI.
fn remember_original(catalog: &mut Catalog, parts: &[Arc<UpstreamPart>], entry: EntryRef) {
    let originals = original_key_of(parts, Kind::Resources);
    let listed = catalog
        .echoed_originals
        .insert((entry, true), |(entry, _)| originals(entry));
    if let Some((listed, unique)) = listed {
        if parts[listed.part as usize].upstream != parts[entry.part as usize].upstream {
            *unique = false;
        }
    }
}

/// The warnings for a part's resources or templates when its URI namespace is
/// another upstream's: they could not be routed back unambiguously, so none is shown.
fn namespace_taken(
    part: &UpstreamPart,
    kind: Kind,
    owner: &Arc<str>,
    warnings: &mut Vec<CatalogWarning>,
) {
    let originals = (0..part.tables.exposed[kind.index()].len())
        .map(|index| part.original(kind, index))
        .chain(
            part.tables.held[kind.index()]
                .iter()
                .map(|(_, held)| held.route.original.as_str()),
        );
    for original in originals {
        warnings.push(CatalogWarning::InvalidEntry {
            kind,
            upstream: part.upstream.clone(),
            entry: original.to_string(),
            reason: format!(
                "its prefix `{}` gives the URI namespace `{}`, which upstream `{owner}` already uses",
                part.prefix,
                part.namespace.as_deref().unwrap_or_default(),
            ),
        });
    }
}

/// Fills the namespace tables, first come first served, and returns the later
/// upstreams whose namespace was already taken, with the upstream that has it.
fn claim_namespaces(
    catalog: &mut Catalog,
    parts: &[Arc<UpstreamPart>],
) -> HashMap<Arc<str>, Arc<str>> {
    let mut taken = HashMap::new();
    for part in parts {
        let Some(namespace) = &part.namespace else {
            continue;
        };
        match catalog.upstreams_by_namespace.entry(namespace.clone()) {
            Entry::Occupied(owner) if *owner.get() != part.upstream => {
                taken.insert(part.upstream.clone(), owner.get().clone());
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(slot) => {
                slot.insert(part.upstream.clone());
                catalog
                    .namespaces_by_upstream
                    .insert(part.upstream.clone(), namespace.clone());
            }
        }
    }
    taken
}

/// Tools whose model-facing text names another upstream's prefix (`{prefix}__…`) or
/// one of its exposed tools: a description steering calls to another server's tool
/// is a known attack, so each is reported. Found from each part's words, so the
/// cost follows the distinct words, not the text.
fn shadowing(catalog: &Catalog) -> Vec<CatalogWarning> {
    let prefixes: HashMap<&str, &Arc<str>> = catalog
        .parts
        .iter()
        .filter(|part| !part.prefix.is_empty())
        .map(|part| (part.prefix.as_str(), &part.upstream))
        .collect();
    let mut warnings = Vec::new();
    for (position, part) in catalog.parts.iter().enumerate() {
        let part_number = u32::try_from(position).unwrap_or(u32::MAX);
        let mut mentions: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
        for (word, tools) in part.tables.words.iter() {
            let names_other = catalog
                .routed(Kind::Tools, word)
                .is_some_and(|other| catalog.parts[other.part as usize].upstream != part.upstream)
                || word.split_once("__").is_some_and(|(prefix, _)| {
                    prefixes
                        .get(prefix)
                        .is_some_and(|other| **other != part.upstream)
                });
            if !names_other {
                continue;
            }
            for tool in tools {
                // Only a listed tool can steer anything.
                let entry = EntryRef {
                    part: part_number,
                    index: tool,
                };
                if catalog
                    .routed(Kind::Tools, part.exposed_key(Kind::Tools, tool as usize))
                    .is_some_and(|listed| *listed == entry)
                {
                    mentions.entry(tool).or_default().insert(word);
                }
            }
        }
        for (tool, words) in mentions {
            warnings.push(CatalogWarning::Shadowing {
                upstream: part.upstream.clone(),
                tool: part.original(Kind::Tools, tool as usize).to_string(),
                mentions: words.into_iter().map(str::to_string).collect(),
            });
        }
    }
    warnings
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
