//! Immutable catalog snapshots: the exposed entries of each kind, their route tables,
//! content digests and pages. A snapshot is put together from one [`UpstreamPart`]
//! per upstream, each built once per listing and shared by every snapshot (and view)
//! until its upstream lists again.

mod build;
mod entries;
mod entry;
mod kind;
mod part;
mod search;
mod table;
#[cfg(test)]
mod test_support;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
mod view;
mod warning;
mod words;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::cache::CacheHint;
use crate::cursor::{self, CursorError};
use crate::filter::ToolFilter;
use crate::headers::ParamHeader;
use crate::quarantine::Quarantine;
use crate::search::{Expose, SearchIndex};
use crate::uris;

pub use entries::Entries;
pub use kind::Kind;
pub use part::{EntryText, UpstreamPart};
pub use search::Found;
pub use view::View;

use entries::{listed_key_of, original_key_of, EntryRef};
use table::Table;
pub use warning::CatalogWarning;

/// What one upstream listed, with how it is to be exposed.
#[derive(Clone, Debug)]
pub struct UpstreamListing {
    /// The configured upstream name, `[a-z0-9-]+`.
    pub upstream: Arc<str>,
    /// Prepended to tool and prompt names and turned into the URI namespace; `""` for none.
    pub prefix: String,
    pub tool_filter: ToolFilter,
    pub tools: Vec<Value>,
    pub prompts: Vec<Value>,
    pub resources: Vec<Value>,
    pub resource_templates: Vec<Value>,
    /// What the server told clients about itself at initialization.
    pub instructions: Option<String>,
    /// Entries (and instructions) held back until approved.
    pub quarantine: Quarantine,
    /// Per kind ([`Kind::index`]), the cache hints of the upstream's list; `None`
    /// for a kind it does not list.
    pub cache: [Option<CacheHint>; 4],
}

impl UpstreamListing {
    /// `upstream`'s listing under `prefix`, filtered by `tool_filter`, nothing in it yet.
    pub fn empty(upstream: Arc<str>, prefix: String, tool_filter: ToolFilter) -> UpstreamListing {
        UpstreamListing {
            upstream,
            prefix,
            tool_filter,
            tools: Vec::new(),
            prompts: Vec::new(),
            resources: Vec::new(),
            resource_templates: Vec::new(),
            instructions: None,
            quarantine: Quarantine::default(),
            cache: [None; 4],
        }
    }

    /// Every entry's security digest, by kind and place (what the pins judge a
    /// listing by), taken where the listing was read rather than where it is judged.
    pub fn security_digests(&self) -> crate::fingerprint::SecurityDigests {
        crate::fingerprint::security_digests_of(|kind| self.listed(kind))
    }

    /// The entries of `kind` as the upstream listed them.
    pub fn listed(&self, kind: Kind) -> &[Value] {
        match kind {
            Kind::Tools => &self.tools,
            Kind::Prompts => &self.prompts,
            Kind::Resources => &self.resources,
            Kind::ResourceTemplates => &self.resource_templates,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogOptions {
    /// The longest exposed tool or prompt name, in characters (at least 16 is used).
    pub name_budget: usize,
    /// Entries per list page (at least 1 is used).
    pub page_size: usize,
    /// How the whole catalog offers its tools (a view says for itself).
    pub expose: Expose,
}

impl Default for CatalogOptions {
    fn default() -> CatalogOptions {
        CatalogOptions {
            name_budget: 64,
            page_size: 100,
            expose: Expose::All,
        }
    }
}

/// Where an exposed entry lives: its upstream and the upstream's own name, URI or template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub upstream: Arc<str>,
    pub original: String,
}

/// One page of a list result.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<'a> {
    pub items: Entries<'a>,
    pub next_cursor: Option<String>,
    /// What every page of this list may be cached for, merged over its upstreams.
    pub cache: CacheHint,
}

/// A tool's `execution.taskSupport`, when it allows tasks at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskSupport {
    Optional,
    Required,
}

impl TaskSupport {
    fn of_tool(tool: &Value) -> Option<TaskSupport> {
        match tool.pointer("/execution/taskSupport")?.as_str()? {
            "optional" => Some(TaskSupport::Optional),
            "required" => Some(TaskSupport::Required),
            _ => None,
        }
    }
}

/// A resource template's exposed literal head, for routing (or refusing) reads of
/// the URIs expanded from it.
#[derive(Clone, Debug)]
struct TemplateHead {
    /// The exposed URI template.
    template: String,
    literal_head: String,
    upstream: Arc<str>,
    /// Its upstream has prefix `""`, so its URIs carry no namespace.
    unprefixed: bool,
    /// The change holding it back, if it is held.
    held: Option<Arc<Value>>,
}

/// An entry held back from the catalog, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub route: Route,
    /// The change that holds it: its class and fields (see the daemon's pins).
    pub change: Arc<Value>,
}

/// An immutable snapshot of everything plexus exposes; share it behind an `Arc`.
#[derive(Clone, Debug)]
pub struct Catalog {
    /// The upstreams' parts the entries live in, in listing order.
    parts: Vec<Arc<UpstreamPart>>,
    /// Exposed entries per kind, indexed by [`Kind::index`].
    entries: [Vec<EntryRef>; 4],
    digests: [[u8; 32]; 4],
    /// Routes per kind: positions in `entries`, looked up by exposed name, URI or
    /// template (the keys are the parts').
    routes: [Table<u32>; 4],
    upstreams_by_namespace: HashMap<String, Arc<str>>,
    namespaces_by_upstream: HashMap<Arc<str>, String>,
    templates: Vec<TemplateHead>,
    /// Held entries per kind, by the exposed name, URI or template they would have.
    held: [HashMap<String, Held>; 4],
    /// Upstreams held back whole, with why.
    held_upstreams: HashMap<Arc<str>, Arc<Value>>,
    /// Upstreams exposed without a prefix (their URIs carry no namespace).
    unprefixed_upstreams: Vec<Arc<str>>,
    /// The sole unprefixed upstream, when tool names it does not list may be
    /// relayed to it (nothing plexus enforces on it would be bypassed).
    unlisted_tools_to: Option<Arc<str>>,
    /// The instructions of each upstream whose instructions are not held.
    instructions: HashMap<Arc<str>, String>,
    /// In a view: the upstreams it shows (None: every upstream).
    visible: Option<std::collections::HashSet<Arc<str>>>,
    /// In a view with resource globs: the URIs it lets be read beyond its listed
    /// resources and templates.
    uri_filter: Option<ToolFilter>,
    /// Resources by original URI, and whether only one upstream lists it.
    echoed_originals: Table<(EntryRef, bool)>,
    page_size: usize,
    /// Each upstream's cache hints per kind, and their merge over the upstreams
    /// shown (computed with the snapshot, so a page costs nothing more).
    upstream_cache: HashMap<Arc<str>, [Option<CacheHint>; 4]>,
    cache: [CacheHint; 4],
    expose: Expose,
    /// The tools' search index, built at the first search of this snapshot.
    search: OnceLock<Arc<SearchIndex>>,
}

impl Default for Catalog {
    fn default() -> Catalog {
        Catalog::empty()
    }
}

impl Catalog {
    pub fn empty() -> Catalog {
        Catalog::with_page_size(CatalogOptions::default().page_size)
    }

    fn with_page_size(page_size: usize) -> Catalog {
        let empty_digest = Sha256::digest([]).into();
        Catalog {
            parts: Vec::new(),
            entries: Default::default(),
            digests: [empty_digest; 4],
            routes: Default::default(),
            upstreams_by_namespace: HashMap::new(),
            namespaces_by_upstream: HashMap::new(),
            templates: Vec::new(),
            held: Default::default(),
            held_upstreams: HashMap::new(),
            unprefixed_upstreams: Vec::new(),
            unlisted_tools_to: None,
            instructions: HashMap::new(),
            visible: None,
            uri_filter: None,
            echoed_originals: Table::default(),
            page_size: page_size.max(1),
            upstream_cache: HashMap::new(),
            cache: [CacheHint::NONE; 4],
            expose: Expose::All,
            search: OnceLock::new(),
        }
    }

    /// Merges the cache hints of this catalog's upstreams, per kind.
    fn merge_cache(&mut self) {
        for kind in Kind::ALL {
            self.cache[kind.index()] = CacheHint::merged(
                self.upstream_cache
                    .values()
                    .filter_map(|hints| hints[kind.index()]),
            );
        }
    }

    /// Builds a snapshot from listings in the order given (the daemon sorts them by
    /// upstream name); see the crate's rules on names, URIs, schemas and collisions.
    pub fn build(
        listings: &[UpstreamListing],
        options: &CatalogOptions,
    ) -> (Catalog, Vec<CatalogWarning>) {
        let mut warnings = Vec::new();
        let parts = listings
            .iter()
            .map(|listing| {
                let (part, found) = UpstreamPart::build(listing, options.name_budget);
                warnings.extend(found);
                Arc::new(part)
            })
            .collect();
        let (catalog, found) = Catalog::assemble(parts, options);
        warnings.extend(found);
        (catalog, warnings)
    }

    /// Puts a snapshot together from upstreams' parts in the order given, with the
    /// warnings only the whole shows (collisions across upstreams, URI namespaces
    /// taken, shadowing); the parts' own warnings came with each part. Nothing of an
    /// entry's JSON is read again: this is table work, linear in the entries.
    pub fn assemble(
        parts: Vec<Arc<UpstreamPart>>,
        options: &CatalogOptions,
    ) -> (Catalog, Vec<CatalogWarning>) {
        build::assemble(parts, options)
    }

    /// The exposed entries: listings in the order given, each in its upstream's order.
    pub fn entries(&self, kind: Kind) -> Entries<'_> {
        Entries {
            kind,
            parts: &self.parts,
            refs: &self.entries[kind.index()],
        }
    }

    pub fn len(&self, kind: Kind) -> usize {
        self.entries[kind.index()].len()
    }

    /// SHA-256 over the exposed entries' own hashes (the first 64 bits of SHA-256 of
    /// each one's compact JSON), in order: equal lists have equal digests, and a
    /// change to any entry, or to their order, changes it.
    pub fn digest(&self, kind: Kind) -> [u8; 32] {
        self.digests[kind.index()]
    }

    /// The exposed entry of `kind` with this exposed name, URI or template.
    fn routed(&self, kind: Kind, exposed: &str) -> Option<&EntryRef> {
        let entries = &self.entries[kind.index()];
        let position =
            self.routes[kind.index()].get(exposed, listed_key_of(&self.parts, entries, kind))?;
        entries.get(*position as usize)
    }

    fn part(&self, entry: &EntryRef) -> &UpstreamPart {
        &self.parts[entry.part as usize]
    }

    /// Where exposed `entry` of `kind` goes.
    fn route_of(&self, kind: Kind, entry: &EntryRef) -> Route {
        self.part(entry).route(kind, entry.index as usize)
    }

    /// Where the listed entry of `kind` exposed as `exposed` goes.
    fn route_listed(&self, kind: Kind, exposed: &str) -> Option<Route> {
        let entry = self.routed(kind, exposed)?;
        Some(self.route_of(kind, entry))
    }

    pub fn route_tool(&self, exposed_name: &str) -> Option<Route> {
        self.route_listed(Kind::Tools, exposed_name)
    }

    /// Where a tool name no table routes may still go: the one unprefixed upstream,
    /// when it has no tool filter and its pins admit unlisted names (servers answer
    /// names they do not list, with their own errors). Never in a view.
    pub fn route_unlisted_tool(&self, name: &str) -> Option<Route> {
        Some(Route {
            upstream: self.unlisted_tools_to.clone()?,
            original: name.to_string(),
        })
    }

    /// The parameters a tool mirrors into `Mcp-Param-*` headers (2026-07-28 over HTTP).
    pub fn param_headers(&self, exposed_tool: &str) -> &[ParamHeader] {
        self.routed(Kind::Tools, exposed_tool)
            .and_then(|entry| self.part(entry).param_headers(entry.index))
            .unwrap_or(&[])
    }

    /// Whether a tool may (or must) run as a task; `None` when it may not.
    pub fn task_support(&self, exposed_tool: &str) -> Option<TaskSupport> {
        let entry = self.routed(Kind::Tools, exposed_tool)?;
        self.part(entry).task_support(entry.index)
    }

    pub fn route_prompt(&self, exposed_name: &str) -> Option<Route> {
        self.route_listed(Kind::Prompts, exposed_name)
    }

    pub fn route_template(&self, exposed_uri_template: &str) -> Option<Route> {
        self.route_listed(Kind::ResourceTemplates, exposed_uri_template)
    }

    /// Routes a resource read by the four steps documented in [`crate::uris`]; a URI
    /// that is held back (see [`Catalog::held`]) has no route.
    pub fn route_resource(&self, exposed_uri: &str) -> Option<Route> {
        if let Some(route) = self.route_listed(Kind::Resources, exposed_uri) {
            return Some(route);
        }
        if self.held_resource(exposed_uri).is_some() || !self.view_permits_uri(exposed_uri) {
            return None;
        }
        if let Some((namespace, original)) = uris::split_namespace(exposed_uri) {
            if let Some(upstream) = self.upstreams_by_namespace.get(namespace) {
                if !original.is_empty() {
                    return Some(Route {
                        upstream: upstream.clone(),
                        original: original.to_string(),
                    });
                }
            }
        }
        if let Some(template) = self.unprefixed_template(exposed_uri) {
            return Some(Route {
                upstream: template.upstream.clone(),
                original: exposed_uri.to_string(),
            });
        }
        let originals = original_key_of(&self.parts, Kind::Resources);
        if let Some((listed, true)) = self
            .echoed_originals
            .get(exposed_uri, |(entry, _)| originals(entry))
        {
            return Some(self.route_of(Kind::Resources, listed));
        }
        // Servers serve URIs they do not list (resource links, dynamic resources): a
        // URI nothing above routes goes to the one unprefixed upstream, if there is one.
        self.sole_unprefixed_upstream()
            .filter(|upstream| !self.held_upstreams.contains_key(*upstream))
            .map(|upstream| Route {
                upstream: upstream.clone(),
                original: exposed_uri.to_string(),
            })
    }

    /// The only upstream exposed without a prefix, when exactly one is.
    fn sole_unprefixed_upstream(&self) -> Option<&Arc<str>> {
        match self.unprefixed_upstreams.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// Why a name, URI or template of `kind` that has no route is held back, if it
    /// is: a held entry, an entry of an upstream held whole, or a URI expanded from
    /// a held template. The route names the upstream and its own name or URI.
    pub fn held(&self, kind: Kind, exposed: &str) -> Option<Held> {
        if let Some(held) = self.held[kind.index()].get(exposed) {
            return Some(held.clone());
        }
        match kind {
            Kind::Resources | Kind::ResourceTemplates => self.held_resource(exposed),
            Kind::Tools | Kind::Prompts => None,
        }
    }

    /// Held entries of `kind` by exposed name, URI or template.
    pub fn held_entries(&self, kind: Kind) -> &HashMap<String, Held> {
        &self.held[kind.index()]
    }

    /// What a resource URI would be read from, when that is held: a held resource,
    /// a namespace of an upstream held whole, or the best-matching template when
    /// that template is held.
    fn held_resource(&self, uri: &str) -> Option<Held> {
        if let Some(held) = self.held[Kind::Resources.index()].get(uri) {
            return Some(held.clone());
        }
        let namespaced = uris::split_namespace(uri).and_then(|(namespace, original)| {
            Some((self.upstreams_by_namespace.get(namespace)?, original))
        });
        let (template, original) = match namespaced {
            Some((upstream, original)) => {
                if let Some(reason) = self.held_upstreams.get(upstream) {
                    return Some(Held {
                        route: Route {
                            upstream: upstream.clone(),
                            original: original.to_string(),
                        },
                        change: reason.clone(),
                    });
                }
                (
                    self.best_template(uri, |t| t.upstream == *upstream)?,
                    original,
                )
            }
            None => match self.best_template(uri, |t| t.unprefixed) {
                Some(template) => (template, uri),
                None => {
                    let upstream = self.sole_unprefixed_upstream()?;
                    let reason = self.held_upstreams.get(upstream)?;
                    return Some(Held {
                        route: Route {
                            upstream: upstream.clone(),
                            original: uri.to_string(),
                        },
                        change: reason.clone(),
                    });
                }
            },
        };
        Some(Held {
            route: Route {
                upstream: template.upstream.clone(),
                original: original.to_string(),
            },
            change: template.held.clone()?,
        })
    }

    /// The unprefixed, exposed template with the longest literal head that starts `uri`.
    fn unprefixed_template(&self, uri: &str) -> Option<&TemplateHead> {
        self.best_template(uri, |t| t.unprefixed)
            .filter(|template| template.held.is_none())
    }

    /// Among the templates `eligible` picks, the one with the longest literal head
    /// that starts `uri`; None when equally long heads of different upstreams make it
    /// ambiguous. Of equally long heads of one upstream, an exposed one wins.
    fn best_template(
        &self,
        uri: &str,
        eligible: impl Fn(&TemplateHead) -> bool,
    ) -> Option<&TemplateHead> {
        let mut best: Option<&TemplateHead> = None;
        let mut ambiguous = false;
        for template in self.templates.iter().filter(|t| eligible(t)) {
            if !uri.starts_with(&template.literal_head) {
                continue;
            }
            let head_length = template.literal_head.len();
            match best {
                Some(current) if head_length < current.literal_head.len() => {}
                Some(current) if head_length == current.literal_head.len() => {
                    ambiguous |= current.upstream != template.upstream;
                    if current.held.is_some() && template.held.is_none() {
                        best = Some(template);
                    }
                }
                _ => {
                    best = Some(template);
                    ambiguous = false;
                }
            }
        }
        best.filter(|_| !ambiguous)
    }

    /// How many entries of `kind` each upstream has exposed, and held.
    pub fn counts_by_upstream(&self, kind: Kind) -> HashMap<Arc<str>, (usize, usize)> {
        let mut counts: HashMap<Arc<str>, (usize, usize)> = HashMap::new();
        for entry in &self.entries[kind.index()] {
            let upstream = &self.part(entry).upstream;
            counts.entry(upstream.clone()).or_default().0 += 1;
        }
        for held in self.held[kind.index()].values() {
            counts.entry(held.route.upstream.clone()).or_default().1 += 1;
        }
        counts
    }

    /// Whether this catalog (a view, or the whole) shows `upstream` at all.
    pub fn shows_upstream(&self, upstream: &str) -> bool {
        self.visible
            .as_ref()
            .is_none_or(|visible| visible.contains(upstream))
    }

    /// The instructions of `upstream`, unless they are held back.
    pub fn instructions(&self, upstream: &str) -> Option<&str> {
        self.instructions.get(upstream).map(String::as_str)
    }

    /// The URI a client sees for `original_uri` of `upstream` (for URIs in content and
    /// notifications); unchanged for unprefixed or unknown upstreams.
    pub fn expose_uri(&self, upstream: &str, original_uri: &str) -> String {
        uris::expose(
            self.namespaces_by_upstream
                .get(upstream)
                .map(String::as_str),
            original_uri,
        )
    }

    /// The page starting at `cursor` (the first page for `None`); see [`crate::cursor`]
    /// for which cursors are valid.
    pub fn page(&self, kind: Kind, cursor: Option<&str>) -> Result<Page<'_>, CursorError> {
        let entries = &self.entries[kind.index()];
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor::decode(cursor, entries.len())?,
        };
        let end = start.saturating_add(self.page_size).min(entries.len());
        Ok(Page {
            items: Entries {
                kind,
                parts: &self.parts,
                refs: &entries[start..end],
            },
            next_cursor: (end < entries.len()).then(|| cursor::encode(end)),
            cache: self.cache[kind.index()],
        })
    }

    /// SHA-256 over the entries' own hashes, in order.
    fn digest_of(&self, kind: Kind) -> [u8; 32] {
        let mut hasher = Sha256::new();
        for entry in &self.entries[kind.index()] {
            hasher.update(
                self.parts[entry.part as usize].tables.exposed[kind.index()][entry.index as usize]
                    .hash,
            );
        }
        hasher.finalize().into()
    }
}
