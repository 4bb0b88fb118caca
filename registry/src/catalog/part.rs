//! One upstream's share of a catalog, built once per listing and reused by every
//! snapshot until that upstream lists again: its entries checked, named and
//! routed, held back as its quarantine says, and kept as the compact JSON the
//! upstream sent (a few offsets say where the exposed name and the schema fix go),
//! so a snapshot holds no `Value` per entry and a rebuild touches only what changed.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::entry::{check_entry, key_field, EntryCheck, SchemaFix};
use super::words::{Words, WordsBuilder};
use super::{CatalogWarning, Held, Kind, Route, TaskSupport, TemplateHead, UpstreamListing};
use crate::cache::CacheHint;
use crate::filter::ToolFilter;
use crate::headers::ParamHeader;
use crate::quarantine::Quarantine;
use crate::search::{PartIndex, ToolText};
use crate::{names, uris};

/// The exposed key of each exposed entry of one kind, and the upstream's own key
/// where the entry's JSON does not spell it plainly, one after the other in one
/// text: a route is two offsets into it, not an allocation or two per entry (at
/// 10,000 entries those were a megabyte).
#[derive(Debug, Default)]
struct Keys {
    text: String,
    /// Per entry, where its exposed key ends and where its original key ends
    /// (empty: read it from the entry's JSON, between the quotes of its key field).
    ends: Vec<(u32, u32)>,
    /// Some exposed key needs escapes in JSON (else each is copied between quotes).
    escaped: bool,
}

impl Keys {
    /// `original` is empty when the entry's JSON spells it without escapes.
    fn push(&mut self, exposed: &str, original: &str) {
        self.escaped |= needs_escapes(exposed);
        let end = |text: &String| u32::try_from(text.len()).unwrap_or(u32::MAX);
        self.text.push_str(exposed);
        let exposed_end = end(&self.text);
        self.text.push_str(original);
        self.ends.push((exposed_end, end(&self.text)));
    }

    fn start(&self, index: usize) -> u32 {
        match index {
            0 => 0,
            _ => self.ends.get(index - 1).map_or(0, |ends| ends.1),
        }
    }

    fn slice(&self, start: u32, end: u32) -> &str {
        self.text
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    fn exposed(&self, index: usize) -> &str {
        let end = self.ends.get(index).map_or(0, |ends| ends.0);
        self.slice(self.start(index).min(end), end)
    }

    fn original(&self, index: usize) -> &str {
        match self.ends.get(index) {
            Some(&(start, end)) => self.slice(start, end),
            None => "",
        }
    }

    fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// Where the schema fix-up goes in an entry's JSON (offsets from the entry's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fix {
    None,
    /// `"type":"object"` before the schema's closing brace (a comma first unless
    /// the schema is `{}`).
    AddType {
        at: u32,
        empty: bool,
    },
    /// `,"inputSchema":{"type":"object"}` before the entry's closing brace.
    AddSchema {
        at: u32,
    },
}

/// One listed entry of a part: what it is exposed as, and how its JSON becomes the
/// exposed JSON.
#[derive(Clone, Debug)]
pub(super) struct Exposed {
    /// Its position among the part's listed entries of its kind.
    listed: u32,
    /// The key field's value in the entry's JSON (offsets from the entry's start).
    key_span: (u32, u32),
    fix: Fix,
    /// The first 64 bits of SHA-256 of the exposed JSON: snapshots digest these to
    /// tell clients of a change (pins, not these, guard against a crafted one).
    pub hash: [u8; 8],
}

/// The entries of one kind as the upstream listed them, as compact JSON one after
/// another: one allocation per kind, not a tree of them per entry.
#[derive(Debug, Default)]
struct Listed {
    text: SharedText,
    /// Where each entry's JSON ends in `text` (it starts where the one before ends).
    ends: Vec<u32>,
}

impl Listed {
    fn span(&self, index: usize) -> (u32, u32) {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1],
        };
        (start, self.ends[index])
    }

    fn get(&self, index: usize) -> &str {
        let (start, end) = self.span(index);
        &self.text[start as usize..end as usize]
    }

    fn values(&self) -> Vec<Value> {
        (0..self.ends.len())
            .map(|index| serde_json::from_str(self.get(index)).unwrap_or(Value::Null))
            .collect()
    }
}

/// A text shared by its views: a thin pointer (`Arc<str>` is two words), since a
/// catalog's pins hold two views per entry.
type SharedText = Arc<String>;

/// One entry's compact JSON as its upstream listed it, sharing its part's text, so
/// whoever else keeps the entry (the pins) need not keep a copy.
#[derive(Clone, Debug)]
pub struct EntryText {
    text: SharedText,
    start: u32,
    end: u32,
}

impl EntryText {
    /// A text of its own.
    pub fn own(text: String) -> EntryText {
        let end = u32::try_from(text.len()).unwrap_or(u32::MAX);
        EntryText {
            text: Arc::new(text),
            start: 0,
            end,
        }
    }

    /// The texts copied into one buffer, each returned as a view of it: one
    /// allocation for many small texts, freed as one.
    pub fn pack<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<EntryText> {
        EntryText::pack_with(texts, |text, out| out.extend_from_slice(text.as_bytes()))
    }

    /// Like [`EntryText::pack`], each text written into the buffer by `write` (as
    /// UTF-8), so none is ever a string of its own.
    pub fn pack_with<T>(
        items: impl IntoIterator<Item = T>,
        mut write: impl FnMut(T, &mut Vec<u8>),
    ) -> Vec<EntryText> {
        let mut buffer = Vec::new();
        let mut spans = Vec::new();
        for item in items {
            let start = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
            write(item, &mut buffer);
            spans.push((start, u32::try_from(buffer.len()).unwrap_or(u32::MAX)));
        }
        let text = Arc::new(match String::from_utf8(buffer) {
            Ok(text) => text,
            Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
        });
        spans
            .into_iter()
            .map(|(start, end)| EntryText {
                text: text.clone(),
                start,
                end,
            })
            .collect()
    }

    /// The same text, on a buffer of its own if it is a view of a larger one: a
    /// view keeps its whole buffer (a catalog part's, a packed file's) alive.
    pub fn detached(&self) -> EntryText {
        if self.start == 0 && self.end as usize == self.text.len() {
            self.clone()
        } else {
            EntryText::own(self.as_str().to_string())
        }
    }

    /// A view of the first place in this text that spells `part`, on the same
    /// buffer: what is kept beside an entry's JSON and appears in it (its name)
    /// then costs no text of its own.
    pub fn view_of(&self, part: &str) -> Option<EntryText> {
        let at = u32::try_from(self.as_str().find(part)?).ok()?;
        let len = u32::try_from(part.len()).ok()?;
        Some(EntryText {
            text: self.text.clone(),
            start: self.start.checked_add(at)?,
            end: self.start.checked_add(at)?.checked_add(len)?,
        })
    }

    /// Whether both are views of one text, not equal copies.
    pub fn shares_text_with(&self, other: &EntryText) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }

    pub fn as_str(&self) -> &str {
        self.text
            .get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }
}

impl PartialEq for EntryText {
    fn eq(&self, other: &EntryText) -> bool {
        self.as_str() == other.as_str()
    }
}

/// Where, in an entry's compact JSON, the key field's value and the schema fix go.
#[derive(Default)]
struct Spans {
    key: Option<(u32, u32)>,
    /// The `inputSchema` object's closing brace, and whether it is `{}`.
    schema_close: Option<(u32, bool)>,
    close: u32,
}

/// One upstream's share of a snapshot; see the module's documentation.
#[derive(Clone, Debug)]
pub struct UpstreamPart {
    pub(super) upstream: Arc<str>,
    pub(super) prefix: String,
    tool_filter: ToolFilter,
    /// The URI namespace its prefix gives (a snapshot may find it taken).
    pub(super) namespace: Option<String>,
    /// What its entries make: shared by a part that differs only in what is not
    /// an entry (a listing listed again after a restart, whose cache hints the
    /// kept one lacks), so installing that one copies nothing.
    pub(super) tables: Arc<Tables>,
    instructions: Option<String>,
    quarantine: Quarantine,
    pub(super) cache: [Option<CacheHint>; 4],
}

/// A part's entries: their texts, keys and routes, and what is found from them.
#[derive(Debug, Default)]
pub(super) struct Tables {
    listed: [Listed; 4],
    pub(super) exposed: [Vec<Exposed>; 4],
    /// The exposed entries' keys, exposed and original, in the order of `exposed`.
    keys: [Keys; 4],
    /// Held entries by the exposed key they would have, in listing order.
    pub(super) held: [Vec<(String, Held)>; 4],
    /// Template heads in listing order, each with its place among the exposed
    /// templates (None: held).
    pub(super) templates: Vec<(Option<u32>, TemplateHead)>,
    /// Exposed tools that mirror parameters into headers, or may run as tasks.
    param_headers: Vec<(u32, Arc<[ParamHeader]>)>,
    task_support: Vec<(u32, TaskSupport)>,
    /// Each word of the exposed tools' descriptions and titles, with the tools
    /// (places among the exposed tools) whose text has it: shadowing is found from
    /// these, never by reading every description again.
    pub(super) words: Words,
    /// How many listed entries the quarantine holds.
    held_count: usize,
    /// The exposed tools inverted for search, built at the first search.
    search: OnceLock<Arc<PartIndex>>,
}

impl UpstreamPart {
    /// Checks, names and routes `listing`'s entries, with the warnings about them
    /// (collisions with other upstreams are found when the parts are put together).
    pub fn build(
        listing: &UpstreamListing,
        name_budget: usize,
    ) -> (UpstreamPart, Vec<CatalogWarning>) {
        let namespace = uris::uri_namespace(&listing.prefix);
        let mut tables = Tables::default();
        let mut warnings = Vec::new();
        let mut scratch = Vec::new();
        let mut words = WordsBuilder::default();
        for kind in Kind::ALL {
            let entries = listing.listed(kind);
            let mut text = Vec::new();
            let mut ends = Vec::with_capacity(entries.len());
            // Exposed key -> the place of the entry that has it, within this upstream.
            let mut taken: HashMap<String, usize> = HashMap::new();
            for (index, entry) in entries.iter().enumerate() {
                let start = text.len();
                let spans = write_listed(kind, entry, &mut text);
                ends.push(u32::try_from(text.len()).unwrap_or(u32::MAX));
                if let Some(identity) = entry.get(key_field(kind)).and_then(Value::as_str) {
                    tables.held_count +=
                        usize::from(listing.quarantine.holds(kind, identity).is_some());
                }
                let (original, schema_fix) =
                    match check_entry(kind, entry, index, &listing.tool_filter) {
                        EntryCheck::Keep {
                            original,
                            schema_fix,
                        } => (original, schema_fix),
                        EntryCheck::Filtered => continue,
                        EntryCheck::Invalid { entry, reason } => {
                            warnings.push(CatalogWarning::InvalidEntry {
                                kind,
                                upstream: listing.upstream.clone(),
                                entry,
                                reason,
                            });
                            continue;
                        }
                    };
                let exposed_key = match kind {
                    Kind::Tools | Kind::Prompts => {
                        names::exposed_name(&listing.prefix, &original, name_budget)
                    }
                    Kind::Resources | Kind::ResourceTemplates => {
                        uris::expose(namespace.as_deref(), &original)
                    }
                };
                let route = Route {
                    upstream: listing.upstream.clone(),
                    original,
                };
                if let Some(change) = listing.quarantine.holds(kind, &route.original) {
                    // Held back: not listed, not routed, but known, so a caller learns why.
                    if kind == Kind::ResourceTemplates {
                        tables.templates.push((
                            None,
                            template_head(listing, &exposed_key, Some(change.clone())),
                        ));
                    }
                    let held = Held {
                        route,
                        change: change.clone(),
                    };
                    tables.held[kind.index()].push((exposed_key, held));
                    continue;
                }
                let exposed = &mut tables.exposed[kind.index()];
                let keys = &mut tables.keys[kind.index()];
                if let Some(kept) = taken.get(&exposed_key) {
                    let kept = entries
                        .get(exposed[*kept].listed as usize)
                        .and_then(|entry| entry.get(key_field(kind)))
                        .and_then(Value::as_str);
                    warnings.push(CatalogWarning::Collision {
                        kind,
                        exposed: exposed_key,
                        kept: Route {
                            upstream: listing.upstream.clone(),
                            original: kept.unwrap_or_default().to_string(),
                        },
                        rejected: route,
                    });
                    continue;
                }
                if schema_fix != SchemaFix::None {
                    warnings.push(CatalogWarning::SchemaPatched {
                        upstream: listing.upstream.clone(),
                        tool: route.original.clone(),
                    });
                }
                let place = u32::try_from(exposed.len()).unwrap_or(u32::MAX);
                taken.insert(exposed_key.clone(), exposed.len());
                let fix = match (schema_fix, spans.schema_close) {
                    (SchemaFix::AddType, Some((at, empty))) => Fix::AddType { at, empty },
                    (SchemaFix::AddSchema, _) => Fix::AddSchema { at: spans.close },
                    _ => Fix::None,
                };
                let mut item = Exposed {
                    listed: u32::try_from(index).unwrap_or(u32::MAX),
                    key_span: spans.key.unwrap_or_default(),
                    fix,
                    hash: [0; 8],
                };
                // Most keys need no escaping; those are read from the JSON.
                let key_text = spans.key.and_then(|(from, to)| {
                    text.get(start + from as usize + 1..(start + to as usize).checked_sub(1)?)
                });
                let plain = key_text == Some(route.original.as_bytes());
                keys.push(&exposed_key, if plain { "" } else { &route.original });
                scratch.clear();
                item.write_json(&text[start..], &exposed_key, keys.escaped, &mut scratch);
                let digest = Sha256::digest(&scratch);
                item.hash.copy_from_slice(&digest[..8]);
                match kind {
                    Kind::Tools => {
                        let designated = entry
                            .get("inputSchema")
                            .map(crate::headers::param_headers)
                            .and_then(Result::ok)
                            .unwrap_or_default();
                        if !designated.is_empty() {
                            tables.param_headers.push((place, designated.into()));
                        }
                        if let Some(support) = TaskSupport::of_tool(entry) {
                            tables.task_support.push((place, support));
                        }
                        let mut texts = Vec::new();
                        model_facing_text(entry, &mut texts);
                        words.add(place, &texts);
                    }
                    Kind::ResourceTemplates => {
                        // An empty head would match every URI and shadow steps that can decide better.
                        if !uris::template_literal_head(&exposed_key).is_empty() {
                            tables
                                .templates
                                .push((Some(place), template_head(listing, &exposed_key, None)));
                        }
                    }
                    Kind::Prompts | Kind::Resources => {}
                }
                exposed.push(item);
            }
            // Grown by doubling; kept as long as the listing is.
            text.shrink_to_fit();
            tables.exposed[kind.index()].shrink_to_fit();
            tables.keys[kind.index()].shrink_to_fit();
            tables.held[kind.index()].shrink_to_fit();
            tables.listed[kind.index()] = Listed {
                text: String::from_utf8(text)
                    .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
                    .into(),
                ends,
            };
        }
        tables.words = words.finish();
        tables.templates.shrink_to_fit();
        tables.param_headers.shrink_to_fit();
        tables.task_support.shrink_to_fit();
        let part = UpstreamPart {
            upstream: listing.upstream.clone(),
            prefix: listing.prefix.clone(),
            tool_filter: listing.tool_filter.clone(),
            namespace,
            tables: Arc::new(tables),
            instructions: listing.instructions.clone(),
            quarantine: listing.quarantine.clone(),
            cache: listing.cache,
        };
        (part, warnings)
    }

    /// What to install for `built`: this part itself if both were built from the
    /// same listing, a copy of its tables with `built`'s instructions, their
    /// judgement and cache hints if only those differ (a listing kept on disk has
    /// neither), else `built`. A listing listed again unchanged (a restart's fresh
    /// listing after the kept one, a scheduled re-check) then keeps the texts the
    /// pins share, and the memory the new part took is given back whole.
    pub fn in_place_of(self: &Arc<Self>, built: Arc<UpstreamPart>) -> Arc<UpstreamPart> {
        let (mine, theirs) = (&self.quarantine, &built.quarantine);
        let same_entries =
            self.upstream == built.upstream
                && self.prefix == built.prefix
                && self.tool_filter == built.tool_filter
                && mine.whole == theirs.whole
                && mine.entries == theirs.entries
                && mine.admits_unlisted == theirs.admits_unlisted
                && (Arc::ptr_eq(&self.tables, &built.tables)
                    || self.tables.listed.iter().zip(&built.tables.listed).all(
                        |(mine, theirs)| mine.ends == theirs.ends && mine.text == theirs.text,
                    ));
        if !same_entries {
            return built;
        }
        if self.instructions == built.instructions
            && mine.instructions == theirs.instructions
            && self.cache == built.cache
        {
            return self.clone();
        }
        Arc::new(UpstreamPart {
            instructions: built.instructions.clone(),
            quarantine: built.quarantine.clone(),
            cache: built.cache,
            ..UpstreamPart::clone(self)
        })
    }

    /// The listing this part was built from, entries and all (parsed again: asked
    /// for only when a listing is judged or named anew).
    pub fn listing(&self) -> UpstreamListing {
        UpstreamListing {
            upstream: self.upstream.clone(),
            prefix: self.prefix.clone(),
            tool_filter: self.tool_filter.clone(),
            tools: self.tables.listed[Kind::Tools.index()].values(),
            prompts: self.tables.listed[Kind::Prompts.index()].values(),
            resources: self.tables.listed[Kind::Resources.index()].values(),
            resource_templates: self.tables.listed[Kind::ResourceTemplates.index()].values(),
            instructions: self.instructions.clone(),
            quarantine: self.quarantine.clone(),
            cache: self.cache,
        }
    }

    /// Every listed entry's text (held ones too), sharing the part's.
    pub fn entry_texts(&self) -> impl Iterator<Item = EntryText> + '_ {
        self.tables.listed.iter().flat_map(|listed| {
            (0..listed.ends.len()).map(|index| {
                let (start, end) = listed.span(index);
                EntryText {
                    text: listed.text.clone(),
                    start,
                    end,
                }
            })
        })
    }

    pub fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    pub fn quarantine(&self) -> &Quarantine {
        &self.quarantine
    }

    /// How many of the listed entries (of every kind) the quarantine holds.
    pub fn held_count(&self) -> usize {
        self.tables.held_count
    }

    /// The instructions clients may see (None when there are none or they are held).
    pub(super) fn shown_instructions(&self) -> Option<&String> {
        self.instructions
            .as_ref()
            .filter(|_| !self.quarantine.instructions)
    }

    /// Whether tool names it does not list may be relayed to it, if it is the only
    /// unprefixed upstream.
    pub(super) fn takes_unlisted_tools(&self) -> bool {
        self.quarantine.admits_unlisted
            && self.tool_filter.is_open()
            && self.quarantine.whole.is_none()
    }

    pub(super) fn held_whole(&self) -> Option<&Arc<Value>> {
        self.quarantine.whole.as_ref()
    }

    /// The exposed JSON of exposed entry `index` of `kind`, appended to `out`.
    pub(super) fn write_exposed(&self, kind: Kind, index: usize, out: &mut Vec<u8>) {
        let item = &self.tables.exposed[kind.index()][index];
        item.write_json(
            self.tables.listed[kind.index()]
                .get(item.listed as usize)
                .as_bytes(),
            self.exposed_key(kind, index),
            self.tables.keys[kind.index()].escaped,
            out,
        );
    }

    /// About how long [`UpstreamPart::write_exposed`]'s JSON is: the upstream's
    /// JSON, and room for the schema fix and a prefix (a longer key grows the
    /// buffer once).
    pub(super) fn exposed_size_hint(&self, kind: Kind, index: usize) -> usize {
        let Some(item) = self.tables.exposed[kind.index()].get(index) else {
            return 0;
        };
        let (start, end) = self.tables.listed[kind.index()].span(item.listed as usize);
        (end - start) as usize + 96
    }

    /// The exposed name, URI or template of exposed entry `index` of `kind`.
    pub(super) fn exposed_key(&self, kind: Kind, index: usize) -> &str {
        self.tables.keys[kind.index()].exposed(index)
    }

    /// The upstream's own name, URI or template of exposed entry `index` of `kind`.
    pub(super) fn original(&self, kind: Kind, index: usize) -> &str {
        let kept = self.tables.keys[kind.index()].original(index);
        if !kept.is_empty() {
            return kept;
        }
        let Some(item) = self.tables.exposed[kind.index()].get(index) else {
            return "";
        };
        let (from, to) = (item.key_span.0 as usize, item.key_span.1 as usize);
        let entry = self.tables.listed[kind.index()].get(item.listed as usize);
        entry
            .get(from + 1..to.saturating_sub(1).max(from + 1))
            .unwrap_or_default()
    }

    /// The parameters exposed tool `index` mirrors into headers, if any.
    pub(super) fn param_headers(&self, index: u32) -> Option<&[ParamHeader]> {
        let found = self
            .tables
            .param_headers
            .binary_search_by_key(&index, |(place, _)| *place)
            .ok()?;
        Some(&self.tables.param_headers[found].1)
    }

    /// Whether exposed tool `index` may run as a task.
    pub(super) fn task_support(&self, index: u32) -> Option<TaskSupport> {
        let found = self
            .tables
            .task_support
            .binary_search_by_key(&index, |(place, _)| *place)
            .ok()?;
        Some(self.tables.task_support[found].1)
    }

    /// Where exposed entry `index` of `kind` goes.
    pub(super) fn route(&self, kind: Kind, index: usize) -> Route {
        Route {
            upstream: self.upstream.clone(),
            original: self.original(kind, index).to_string(),
        }
    }

    /// The exposed tools inverted for search (built once, at the first search).
    pub(super) fn search_index(&self) -> &Arc<PartIndex> {
        self.tables.search.get_or_init(|| {
            let listed = &self.tables.listed[Kind::Tools.index()];
            let tools: Vec<Value> = self.tables.exposed[Kind::Tools.index()]
                .iter()
                .map(|item| {
                    serde_json::from_str(listed.get(item.listed as usize)).unwrap_or_default()
                })
                .collect();
            Arc::new(PartIndex::build(tools.iter().enumerate().map(
                |(index, tool)| ToolText::of(self.original(Kind::Tools, index), tool),
            )))
        })
    }

    /// Exposed entry `index` of `kind` as a `Value`.
    pub(super) fn exposed_value(&self, kind: Kind, index: usize) -> Value {
        let mut json = Vec::new();
        self.write_exposed(kind, index, &mut json);
        serde_json::from_slice(&json).unwrap_or(Value::Null)
    }
}

impl Exposed {
    /// The exposed JSON, from the entry's JSON as listed: the key field's value
    /// replaced, the schema fix inserted; byte for byte what serialising the
    /// exposed entry gives.
    /// `escaped`: the key may need escapes.
    fn write_json(&self, listed: &[u8], exposed_key: &str, escaped: bool, out: &mut Vec<u8>) {
        let (key_start, key_end) = (self.key_span.0 as usize, self.key_span.1 as usize);
        let fix: (usize, &[u8]) = match self.fix {
            Fix::None => (listed.len(), b""),
            Fix::AddType { at, empty: true } => (at as usize, br#""type":"object""#),
            Fix::AddType { at, empty: false } => (at as usize, br#","type":"object""#),
            Fix::AddSchema { at } => (at as usize, br#","inputSchema":{"type":"object"}"#),
        };
        // Written straight into `out`: a page of a hundred entries made a value
        // and two buffers for each.
        let key = |out: &mut Vec<u8>| write_json_str(out, exposed_key, escaped);
        if key_start <= fix.0 {
            out.extend_from_slice(&listed[..key_start]);
            key(out);
            out.extend_from_slice(&listed[key_end..fix.0]);
            out.extend_from_slice(fix.1);
            out.extend_from_slice(&listed[fix.0..]);
        } else {
            out.extend_from_slice(&listed[..fix.0]);
            out.extend_from_slice(fix.1);
            out.extend_from_slice(&listed[fix.0..key_start]);
            key(out);
            out.extend_from_slice(&listed[key_end..]);
        }
    }
}

fn template_head(
    listing: &UpstreamListing,
    exposed: &str,
    held: Option<Arc<Value>>,
) -> TemplateHead {
    TemplateHead {
        template: exposed.to_string(),
        literal_head: uris::template_literal_head(exposed).to_string(),
        upstream: listing.upstream.clone(),
        unprefixed: listing.prefix.is_empty(),
        held,
    }
}

/// Appends `entry` as compact JSON, exactly as serde_json writes it, and says where
/// its key field's value and its `inputSchema`'s closing brace are.
fn write_listed(kind: Kind, entry: &Value, out: &mut Vec<u8>) -> Spans {
    let start = out.len();
    let offset = |at: usize| u32::try_from(at - start).unwrap_or(u32::MAX);
    let Value::Object(object) = entry else {
        write_json(out, entry);
        return Spans::default();
    };
    let mut spans = Spans::default();
    out.push(b'{');
    for (position, (name, value)) in object.iter().enumerate() {
        if position > 0 {
            out.push(b',');
        }
        write_json(out, &Value::from(name.as_str()));
        out.push(b':');
        let value_start = out.len();
        write_json(out, value);
        if name == key_field(kind) {
            spans.key = Some((offset(value_start), offset(out.len())));
        }
        if let ("inputSchema", Value::Object(schema)) = (name.as_str(), value) {
            spans.schema_close = Some((offset(out.len() - 1), schema.is_empty()));
        }
    }
    out.push(b'}');
    spans.close = offset(out.len() - 1);
    spans
}

/// Whether serde_json writes `text` with escapes.
fn needs_escapes(text: &str) -> bool {
    text.bytes()
        .any(|byte| byte < 0x20 || byte == b'"' || byte == b'\\')
}

/// `text` as serde_json writes a string; without escapes (as a part's keys
/// most often are, known when it is built) it is copied between quotes.
fn write_json_str(out: &mut Vec<u8>, text: &str, escaped: bool) {
    if !escaped {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, text).is_err() {
        out.extend_from_slice(b"null");
    }
}

fn write_json(out: &mut Vec<u8>, value: &Value) {
    // Writing a `Value` into memory cannot fail: its keys are strings, and a
    // `Vec` takes every byte.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::catalog::entry::exposed_entry;
    use crate::catalog::test_support::listing;
    use serde_json::json;

    /// The spliced JSON of every exposed entry is byte for byte the serialised
    /// exposed copy, whatever the order of the key, the schema and the fix.
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        for text in [
            "plain__name",
            "",
            "a\"quote",
            "back\\slash",
            "tab\there",
            "é€😀",
            "\u{1f}\u{7f}",
        ] {
            let mut out = Vec::new();
            write_json_str(&mut out, text, needs_escapes(text));
            assert_eq!(out, serde_json::to_vec(text).unwrap(), "{text:?}");
            out.clear();
            write_json_str(&mut out, text, true);
            assert_eq!(out, serde_json::to_vec(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn a_view_of_a_part_shares_the_buffer() {
        let texts = EntryText::pack([r#"{"name":"a"}"#, r#"{"name":"b\u0041"}"#]);
        let name = texts[0].view_of("a").unwrap();
        assert_eq!(name.as_str(), "a");
        assert!(name.shares_text_with(&texts[0]));
        // The second text's view starts past the first text.
        assert_eq!(texts[1].view_of("name").unwrap().as_str(), "name");
        assert!(texts[1].view_of("bA").is_none());
        assert!(texts[1].view_of(r#"{"name":"a"}"#).is_none());
    }

    #[test]
    fn spliced_json_is_the_exposed_entry_serialised() {
        let texts = [
            r#"{"name":"plain","inputSchema":{"type":"object"}}"#,
            r#"{"inputSchema":{"properties":{"n":{"type":"integer"}}},"description":"schema first","name":"untyped"}"#,
            r#"{"name":"empty","inputSchema":{}}"#,
            r#"{"description":"no schema","name":"bare"}"#,
            r#"{"name":"bare_last"}"#,
            r#"{"name":"esc\"aped\u00e9","inputSchema":{"type":"object"},"x":[1.5,2,-3e-7,"\n"]}"#,
        ];
        let mut server = listing("srv", "p");
        server.tools = texts
            .iter()
            .map(|text| serde_json::from_str(text).unwrap())
            .collect();
        server.prompts = vec![json!({"description": "d", "name": "greet"})];
        server.resources = vec![
            json!({"name": "r", "uri": "x://r", "size": 3}),
            json!({"name": "q", "uri": "x://q\"uote\\"}),
        ];
        server.resource_templates = vec![json!({"uriTemplate": "x://{id}"})];
        let (part, _) = UpstreamPart::build(&server, 64);
        assert!(part.tables.keys[Kind::Resources.index()].escaped);
        assert!(!part.tables.keys[Kind::Prompts.index()].escaped);
        for kind in Kind::ALL {
            let listed = server.listed(kind);
            assert_eq!(
                part.tables.exposed[kind.index()].len(),
                listed.len(),
                "{kind:?}"
            );
            for (index, item) in part.tables.exposed[kind.index()].iter().enumerate() {
                let entry = &listed[item.listed as usize];
                let fix = match item.fix {
                    Fix::None => SchemaFix::None,
                    Fix::AddType { .. } => SchemaFix::AddType,
                    Fix::AddSchema { .. } => SchemaFix::AddSchema,
                };
                let expected = serde_json::to_vec(&exposed_entry(
                    kind,
                    entry,
                    part.exposed_key(kind, index),
                    fix,
                ))
                .unwrap();
                // The original is read from the entry's JSON unless it needs escapes.
                assert_eq!(
                    part.original(kind, index),
                    entry[key_field(kind)].as_str().unwrap()
                );
                let mut spliced = Vec::new();
                part.write_exposed(kind, index, &mut spliced);
                assert_eq!(
                    String::from_utf8(spliced).unwrap(),
                    String::from_utf8(expected).unwrap()
                );
            }
        }
    }

    #[test]
    fn packed_texts_read_back_and_share_one_buffer() {
        let texts = ["{\"name\":\"a\"}", "", "{\"name\":\"é\"}"];
        let packed = EntryText::pack(texts);
        let read: Vec<&str> = packed.iter().map(EntryText::as_str).collect();
        assert_eq!(read, texts);
        assert!(packed[0].shares_text_with(&packed[2]));
        assert!(!packed[0].shares_text_with(&EntryText::own(texts[0].to_string())));
        assert_eq!(packed[0], EntryText::own(texts[0].to_string()));
        let detached = packed[2].detached();
        assert_eq!(detached.as_str(), texts[2]);
        assert!(!detached.shares_text_with(&packed[2]));
        assert!(detached.detached().shares_text_with(&detached));
    }

    /// A listing built again unchanged installs the part already built (or a copy of
    /// its tables where only instructions, their judgement or cache hints differ);
    /// any change to an entry, a name or what is held installs the new part.
    #[test]
    fn an_unchanged_listing_keeps_the_installed_part() {
        let mut server = listing("srv", "p");
        server.tools = vec![json!({"name": "t", "inputSchema": {"type": "object"}})];
        let build = |listing: &UpstreamListing| Arc::new(UpstreamPart::build(listing, 64).0);
        let installed = build(&server);
        let again = build(&server);
        assert!(Arc::ptr_eq(&installed.in_place_of(again), &installed));

        let mut fresh = server.clone();
        fresh.instructions = Some("hello".into());
        fresh.cache = [Some(CacheHint::NONE); 4];
        let kept = installed.in_place_of(build(&fresh));
        assert!(!Arc::ptr_eq(&kept, &installed));
        assert!(Arc::ptr_eq(&kept.tables, &installed.tables));
        assert_eq!(kept.exposed_key(Kind::Tools, 0), "p__t");
        assert_eq!(kept.shown_instructions().map(String::as_str), Some("hello"));
        assert_eq!(kept.cache, fresh.cache);

        let mut changed = server.clone();
        changed.tools[0]["description"] = json!("new");
        let renamed = UpstreamListing {
            prefix: "q".into(),
            ..server.clone()
        };
        let mut held = server.clone();
        held.quarantine
            .entries
            .insert((Kind::Tools, "t".into()), Arc::new(json!("changed")));
        for other in [changed, renamed, held] {
            let built = build(&other);
            assert!(Arc::ptr_eq(&installed.in_place_of(built.clone()), &built));
        }
    }

    #[test]
    fn the_listing_comes_back_as_it_was_listed() {
        let mut server = listing("srv", "p");
        server.tools = vec![
            json!({"name": "t", "inputSchema": {"type": "object"}, "n": 5, "f": 5.0}),
            json!("not an entry"),
        ];
        server.instructions = Some("hello".into());
        let (part, warnings) = UpstreamPart::build(&server, 64);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let back = part.listing();
        assert_eq!(back.tools, server.tools);
        assert_eq!(back.instructions, server.instructions);
        assert_eq!(back.prefix, "p");
    }
}
