//! One upstream part's tools as an inverted index: per term, the tools that have
//! it with their term frequency in each field. Built once per part (a part lives
//! until its upstream lists again), so a snapshot rebuilt after one upstream's
//! `list_changed` analyses only that upstream's tools again.

use std::collections::HashMap;

use serde_json::Value;

use super::analyze::Analyzer;

/// The fields of a tool that are indexed, in the order of their weights.
pub const NAME: usize = 0;
pub const TITLE: usize = 1;
pub const DESCRIPTION: usize = 2;
/// Parameter names and their descriptions.
pub const PARAMS: usize = 3;
pub const FIELDS: usize = 4;

/// One tool that has a term, and how often in each field (saturated at 255).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posting {
    pub place: u32,
    pub tf: [u8; FIELDS],
}

/// What one tool offers to be searched by.
#[derive(Debug, Default)]
pub struct ToolText<'a> {
    pub name: &'a str,
    pub title: Option<&'a str>,
    pub description: Option<&'a str>,
    pub schema: Option<&'a Value>,
}

impl<'a> ToolText<'a> {
    /// The searchable texts of a tool's JSON; `name` is the upstream's own name.
    pub fn of(name: &'a str, tool: &'a Value) -> ToolText<'a> {
        let text = |pointer: &str| tool.pointer(pointer).and_then(Value::as_str);
        ToolText {
            name,
            title: text("/title").or_else(|| text("/annotations/title")),
            description: text("/description"),
            schema: tool.get("inputSchema"),
        }
    }
}

/// A part's tools, inverted.
#[derive(Debug, Default)]
pub struct PartIndex {
    /// Term → its place in `ends`.
    terms: HashMap<Box<str>, u32>,
    /// Where each term's postings end in `postings`.
    ends: Vec<u32>,
    postings: Vec<Posting>,
    /// Per tool, its length in terms per field (saturated).
    pub lengths: Vec<[u16; FIELDS]>,
}

impl PartIndex {
    /// Indexes tools given in place order.
    pub fn build<'a>(tools: impl Iterator<Item = ToolText<'a>>) -> PartIndex {
        let mut analyzer = Analyzer::default();
        let mut terms: HashMap<Box<str>, u32> = HashMap::new();
        let mut per_term: Vec<Vec<Posting>> = Vec::new();
        let mut lengths = Vec::new();
        let mut counts: HashMap<String, [u8; FIELDS]> = HashMap::new();
        for (place, tool) in tools.enumerate() {
            counts.clear();
            let mut length = [0u16; FIELDS];
            let mut add = |analyzer: &mut Analyzer, field: usize, text: &str| {
                analyzer.terms(text, |term| {
                    length[field] = length[field].saturating_add(1);
                    let tf = match counts.get_mut(term) {
                        Some(tf) => tf,
                        None => counts.entry(term.to_string()).or_default(),
                    };
                    tf[field] = tf[field].saturating_add(1);
                });
            };
            add(&mut analyzer, NAME, tool.name);
            if let Some(title) = tool.title {
                add(&mut analyzer, TITLE, title);
            }
            if let Some(description) = tool.description {
                add(&mut analyzer, DESCRIPTION, description);
            }
            if let Some(schema) = tool.schema {
                for_each_parameter(schema, 0, &mut |name, description| {
                    add(&mut analyzer, PARAMS, name);
                    if let Some(description) = description {
                        add(&mut analyzer, PARAMS, description);
                    }
                });
            }
            lengths.push(length);
            let place = u32::try_from(place).unwrap_or(u32::MAX);
            for (term, tf) in counts.drain() {
                let id = match terms.get(term.as_str()) {
                    Some(id) => *id as usize,
                    None => {
                        let id = per_term.len();
                        terms.insert(term.into_boxed_str(), offset(id));
                        per_term.push(Vec::new());
                        id
                    }
                };
                per_term[id].push(Posting { place, tf });
            }
        }
        let mut postings = Vec::with_capacity(per_term.iter().map(Vec::len).sum());
        let mut ends = Vec::with_capacity(per_term.len());
        for list in per_term {
            postings.extend(list);
            ends.push(offset(postings.len()));
        }
        terms.shrink_to_fit();
        PartIndex {
            terms,
            ends,
            postings,
            lengths,
        }
    }

    /// The tools that have `term`, in place order.
    pub fn postings(&self, term: &str) -> &[Posting] {
        let Some(&id) = self.terms.get(term) else {
            return &[];
        };
        let start = match id.checked_sub(1) {
            Some(before) => self.ends[before as usize] as usize,
            None => 0,
        };
        self.postings
            .get(start..self.ends[id as usize] as usize)
            .unwrap_or_default()
    }

    /// About what it holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        let term_bytes: usize = self.terms.keys().map(|term| term.len()).sum();
        // A hash table entry: the boxed key (16), the id (4), control byte and slack.
        term_bytes
            + self.terms.capacity() * 24
            + self.ends.capacity() * 4
            + self.postings.capacity() * std::mem::size_of::<Posting>()
            + self.lengths.capacity() * std::mem::size_of::<[u16; FIELDS]>()
    }
}

/// Calls `found` with each parameter's name and description: the schema's
/// properties, and those of object (or array of object) properties one level down.
fn for_each_parameter(schema: &Value, depth: u8, found: &mut impl FnMut(&str, Option<&str>)) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        found(name, property.get("description").and_then(Value::as_str));
        if depth == 0 {
            for_each_parameter(property, 1, found);
            if let Some(items) = property.get("items") {
                for_each_parameter(items, 1, found);
            }
        }
    }
}

fn offset(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}
