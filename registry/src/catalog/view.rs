//! Views: named subsets of a catalog (by upstream and by glob on exposed names and
//! URIs), computed once per snapshot. A view is itself a catalog, so lists, pages,
//! routes, held entries and instructions all hold within it; what it hides is
//! unknown there, exactly as if it did not exist.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use super::entries::{exposed_key_of, listed_key_of, original_key_of};
use super::{Catalog, Kind};
use crate::filter::ToolFilter;
use crate::uris;

/// What a view shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The upstreams whose entries it may show; None for every upstream.
    pub upstreams: Option<BTreeSet<String>>,
    /// Globs on exposed tool names (allow, then deny).
    pub tools: ToolFilter,
    pub prompts: ToolFilter,
    /// Globs on exposed resource URIs and URI templates.
    pub resources: ToolFilter,
    /// Whether `resources` restricts anything (else every URI of a shown upstream reads).
    pub restricts_resources: bool,
    /// How the view offers its tools.
    pub expose: crate::search::Expose,
}

impl View {
    fn shows_upstream(&self, upstream: &str) -> bool {
        self.upstreams
            .as_ref()
            .is_none_or(|upstreams| upstreams.contains(upstream))
    }

    fn filter(&self, kind: Kind) -> &ToolFilter {
        match kind {
            Kind::Tools => &self.tools,
            Kind::Prompts => &self.prompts,
            Kind::Resources | Kind::ResourceTemplates => &self.resources,
        }
    }

    fn shows(&self, kind: Kind, exposed: &str, upstream: &str) -> bool {
        self.shows_upstream(upstream) && self.filter(kind).permits(exposed)
    }
}

impl Catalog {
    /// The part of this catalog `view` shows, as a catalog of its own.
    pub fn restrict(&self, view: &View) -> Catalog {
        let mut restricted = Catalog::with_page_size(self.page_size);
        restricted.expose = view.expose;
        // The view's entries live in the same parts: nothing of them is copied.
        restricted.parts = self.parts.clone();
        for kind in Kind::ALL {
            let index = kind.index();
            let exposed_key = exposed_key_of(&self.parts, kind);
            for entry in &self.entries[index] {
                let upstream = &self.part(entry).upstream;
                if view.shows(kind, exposed_key(entry), upstream) {
                    let entries = &mut restricted.entries[index];
                    let position = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                    entries.push(*entry);
                    let listed = listed_key_of(&self.parts, entries, kind);
                    restricted.routes[index].insert(position, listed);
                }
            }
            restricted.held[index] = self.held[index]
                .iter()
                .filter(|(key, held)| view.shows(kind, key, &held.route.upstream))
                .map(|(key, held)| (key.clone(), held.clone()))
                .collect();
            restricted.digests[index] = restricted.digest_of(kind);
        }
        // Shown: the upstreams the view names, or else those with anything in it.
        let visible: HashSet<Arc<str>> = match &view.upstreams {
            Some(upstreams) => upstreams
                .iter()
                .map(|name| Arc::from(name.as_str()))
                .collect(),
            None => restricted
                .entries
                .iter()
                .flat_map(|entries| {
                    entries
                        .iter()
                        .map(|entry| self.part(entry).upstream.clone())
                })
                .chain(
                    restricted
                        .held
                        .iter()
                        .flat_map(|held| held.values().map(|held| held.route.upstream.clone())),
                )
                .chain(
                    self.held_upstreams
                        .keys()
                        .filter(|upstream| view.shows_upstream(upstream))
                        .cloned(),
                )
                .collect(),
        };
        let shown = |upstream: &Arc<str>| visible.contains(upstream);
        restricted.upstream_cache = self
            .upstream_cache
            .iter()
            .filter(|(upstream, _)| shown(upstream))
            .map(|(upstream, hints)| (upstream.clone(), *hints))
            .collect();
        restricted.merge_cache();
        restricted.instructions = self
            .instructions
            .iter()
            .filter(|(upstream, _)| visible.contains(*upstream))
            .map(|(upstream, text)| (upstream.clone(), text.clone()))
            .collect();
        restricted.upstreams_by_namespace = self
            .upstreams_by_namespace
            .iter()
            .filter(|(_, upstream)| shown(upstream))
            .map(|(namespace, upstream)| (namespace.clone(), upstream.clone()))
            .collect();
        restricted.namespaces_by_upstream = self
            .namespaces_by_upstream
            .iter()
            .filter(|(upstream, _)| shown(upstream))
            .map(|(upstream, namespace)| (upstream.clone(), namespace.clone()))
            .collect();
        restricted.templates = self
            .templates
            .iter()
            .filter(|template| {
                shown(&template.upstream) && view.resources.permits(&template.template)
            })
            .cloned()
            .collect();
        restricted.unprefixed_upstreams = self
            .unprefixed_upstreams
            .iter()
            .filter(|upstream| shown(upstream))
            .cloned()
            .collect();
        restricted.held_upstreams = self
            .held_upstreams
            .iter()
            .filter(|(upstream, _)| shown(upstream))
            .map(|(upstream, reason)| (upstream.clone(), reason.clone()))
            .collect();
        let originals = original_key_of(&self.parts, Kind::Resources);
        for (entry, unique) in self.echoed_originals.iter() {
            let upstream = &self.part(entry).upstream;
            let exposed = uris::expose(
                self.namespaces_by_upstream
                    .get(upstream)
                    .map(String::as_str),
                originals(entry),
            );
            if *unique && view.shows(Kind::Resources, &exposed, upstream) {
                restricted
                    .echoed_originals
                    .insert((*entry, true), |(entry, _)| originals(entry));
            }
        }
        restricted.visible = Some(visible);
        restricted.uri_filter = view.restricts_resources.then(|| view.resources.clone());
        restricted
    }

    /// In a view with resource globs, a URI is read only if the globs allow it or
    /// one of the view's templates produced it.
    pub(super) fn view_permits_uri(&self, uri: &str) -> bool {
        match &self.uri_filter {
            None => true,
            Some(filter) => {
                filter.permits(uri)
                    || self.templates.iter().any(|template| {
                        template.held.is_none()
                            && !template.literal_head.is_empty()
                            && uri.starts_with(&template.literal_head)
                    })
            }
        }
    }
}
