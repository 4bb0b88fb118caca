//! BM25F over a snapshot's tools: the parts' inverted indexes, each tool's place
//! mapped to its position in the snapshot (or to nothing: a tool the snapshot
//! does not show is never found), field lengths averaged over what is shown, and
//! each upstream's own text (its name and instructions) as a field every one of
//! its tools shares, so a query naming a server lifts that server's tools.

use std::collections::HashMap;
use std::sync::Arc;

use super::analyze::Analyzer;
use super::part_index::{PartIndex, FIELDS};

/// BM25's term-frequency saturation.
const K1: f32 = 1.2;
/// Field weights: name, title, description, parameters; then the upstream's text.
/// A word in a tool's name says more about it than one in a parameter's description.
const WEIGHTS: [f32; FIELDS] = [3.0, 2.0, 1.0, 0.5];
const UPSTREAM_WEIGHT: f32 = 0.6;
/// How much a tool's server's routing score adds, as a share of the best tool's
/// score (the best server adds that share, the others less).
const ROUTING: f32 = 0.3;
/// Length normalisation per field: names are short and alike in length, so
/// barely; descriptions and instructions vary widely.
const B: [f32; FIELDS] = [0.3, 0.3, 0.75, 0.75];
const UPSTREAM_B: f32 = 0.75;

/// A place with no position in the snapshot.
pub const NOT_SHOWN: u32 = u32::MAX;

/// One upstream's share of the index.
#[derive(Debug)]
struct IndexedPart {
    index: Arc<PartIndex>,
    /// Per tool place, its position in the snapshot's tool list, or [`NOT_SHOWN`].
    positions: Vec<u32>,
    /// The upstream's own terms (name and instructions) with their counts.
    upstream_terms: HashMap<String, u16>,
    upstream_length: f32,
}

/// What [`SearchIndex::build`] takes per upstream.
pub struct PartInput<'a> {
    pub index: Arc<PartIndex>,
    pub positions: Vec<u32>,
    /// The upstream's name and instructions (those a client may see).
    pub upstream_texts: Vec<&'a str>,
}

/// A tool found: its position in the snapshot, the part it is of, its score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub position: u32,
    pub part: u32,
    pub score: f32,
}

/// A snapshot's tools, searchable; see the module's documentation.
#[derive(Debug, Default)]
pub struct SearchIndex {
    parts: Vec<IndexedPart>,
    /// Tools shown.
    docs: usize,
    /// One past the highest position.
    positions: usize,
    average: [f32; FIELDS],
    average_upstream: f32,
}

impl SearchIndex {
    /// Puts the index together; linear in the tools, none of them analysed again.
    pub fn build<'a>(parts: impl IntoIterator<Item = PartInput<'a>>) -> SearchIndex {
        let mut analyzer = Analyzer::default();
        let mut totals = [0f64; FIELDS];
        let mut upstream_total = 0f64;
        let mut docs = 0usize;
        let mut positions = 0usize;
        let parts = parts
            .into_iter()
            .map(|input| {
                let mut upstream_terms: HashMap<String, u16> = HashMap::new();
                let mut upstream_length = 0u32;
                for text in &input.upstream_texts {
                    analyzer.terms(text, |term| {
                        upstream_length += 1;
                        let count = upstream_terms.entry(term.to_string()).or_default();
                        *count = count.saturating_add(1);
                    });
                }
                let mut shown = 0usize;
                for (place, &position) in input.positions.iter().enumerate() {
                    if position == NOT_SHOWN {
                        continue;
                    }
                    shown += 1;
                    positions = positions.max(position as usize + 1);
                    if let Some(lengths) = input.index.lengths.get(place) {
                        for (total, length) in totals.iter_mut().zip(lengths) {
                            *total += f64::from(*length);
                        }
                    }
                }
                docs += shown;
                upstream_total += f64::from(upstream_length) * shown as f64;
                IndexedPart {
                    index: input.index,
                    positions: input.positions,
                    upstream_terms,
                    upstream_length: upstream_length as f32,
                }
            })
            .collect();
        let per_doc = |total: f64| ((total / docs.max(1) as f64) as f32).max(1.0);
        SearchIndex {
            parts,
            docs,
            positions,
            average: totals.map(per_doc),
            average_upstream: per_doc(upstream_total),
        }
    }

    /// How many tools it finds among.
    pub fn len(&self) -> usize {
        self.docs
    }

    pub fn is_empty(&self) -> bool {
        self.docs == 0
    }

    /// About what it holds on the heap beyond its parts' indexes (see
    /// [`PartIndex::heap_bytes`]).
    pub fn heap_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|part| {
                std::mem::size_of::<IndexedPart>()
                    + part.positions.capacity() * 4
                    + part
                        .upstream_terms
                        .keys()
                        .map(|term| term.len() + 32)
                        .sum::<usize>()
            })
            .sum()
    }

    /// The parts' indexes, for measuring.
    pub fn part_indexes(&self) -> impl Iterator<Item = &Arc<PartIndex>> {
        self.parts.iter().map(|part| &part.index)
    }

    /// The best `limit` tools for `query`, best first (ties: catalog order); only
    /// tools of part `only` when it is given. A query with no searchable word finds
    /// nothing.
    pub fn search(&self, query: &str, limit: usize, only: Option<u32>) -> Vec<Hit> {
        let mut analyzer = Analyzer::default();
        let mut terms = analyzer.collect(query);
        if !terms.is_empty() {
            // Only a compound some tool has counts; the others find nothing.
            analyzer.compounds(query, |term| {
                if self
                    .parts
                    .iter()
                    .any(|part| !part.index.postings(term).is_empty())
                {
                    terms.push(term.to_string());
                }
            });
        }
        terms.sort_unstable();
        terms.dedup();
        if terms.is_empty() || limit == 0 || self.docs == 0 {
            return Vec::new();
        }
        let parts: Vec<(u32, &IndexedPart)> = self
            .parts
            .iter()
            .enumerate()
            .map(|(number, part)| (u32::try_from(number).unwrap_or(u32::MAX), part))
            .filter(|(number, _)| only.is_none_or(|only| only == *number))
            .collect();
        let mut scores = vec![0f32; self.positions];
        let mut part_of = vec![0u32; self.positions];
        let mut found: Vec<u32> = Vec::new();
        let mut term_tf = vec![0f32; self.positions];
        let mut term_found: Vec<u32> = Vec::new();
        let n = self.docs as f32;
        // Routing: each server scored as one document of all its tools' texts and
        // its own (a term's weight in a server: how many of its tools have it).
        let mut server = vec![0f32; parts.len()];
        let servers = parts.len() as f32;
        for term in &terms {
            let having: Vec<f32> = parts
                .iter()
                .map(|(_, part)| {
                    let tools = part.index.postings(term).len() as f32;
                    tools
                        + if part.upstream_terms.contains_key(term.as_str()) {
                            2.0
                        } else {
                            0.0
                        }
                })
                .collect();
            let df = having.iter().filter(|count| **count > 0.0).count() as f32;
            let idf = (1.0 + (servers - df + 0.5) / (df + 0.5)).ln();
            for (score, count) in server.iter_mut().zip(&having) {
                *score += idf * count / (count + 1.0);
            }
        }
        for term in &terms {
            for &(number, part) in &parts {
                let mut add = |position: u32, tf: f32| {
                    let at = position as usize;
                    if term_tf[at] == 0.0 {
                        term_found.push(position);
                        part_of[at] = number;
                    }
                    term_tf[at] += tf;
                };
                for posting in part.index.postings(term) {
                    let place = posting.place as usize;
                    let position = part.positions.get(place).copied().unwrap_or(NOT_SHOWN);
                    if position == NOT_SHOWN {
                        continue;
                    }
                    let lengths = part.index.lengths.get(place).copied().unwrap_or_default();
                    let mut tf = 0.0;
                    for field in 0..FIELDS {
                        if posting.tf[field] > 0 {
                            let norm = 1.0 - B[field]
                                + B[field] * f32::from(lengths[field]) / self.average[field];
                            tf += WEIGHTS[field] * f32::from(posting.tf[field]) / norm;
                        }
                    }
                    add(position, tf);
                }
                if let Some(&count) = part.upstream_terms.get(term.as_str()) {
                    let norm = 1.0 - UPSTREAM_B
                        + UPSTREAM_B * part.upstream_length / self.average_upstream;
                    let tf = UPSTREAM_WEIGHT * f32::from(count) / norm;
                    for &position in &part.positions {
                        if position != NOT_SHOWN {
                            add(position, tf);
                        }
                    }
                }
            }
            let df = term_found.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for position in term_found.drain(..) {
                let at = position as usize;
                let tf = std::mem::take(&mut term_tf[at]);
                if scores[at] == 0.0 {
                    found.push(position);
                }
                scores[at] += idf * tf * (K1 + 1.0) / (K1 + tf);
            }
        }
        let best_server = server.iter().copied().fold(0f32, f32::max);
        let best_tool = found
            .iter()
            .map(|at| scores[*at as usize])
            .fold(0f32, f32::max);
        if best_server > 0.0 {
            // Per part number, its share of the routing lift.
            let mut lift = vec![0f32; self.parts.len()];
            for ((number, _), score) in parts.iter().zip(&server) {
                if let Some(slot) = lift.get_mut(*number as usize) {
                    *slot = ROUTING * best_tool * score / best_server;
                }
            }
            for &position in &found {
                let at = position as usize;
                scores[at] += lift.get(part_of[at] as usize).copied().unwrap_or_default();
            }
        }
        let by_score = |a: &u32, b: &u32| {
            scores[*b as usize]
                .total_cmp(&scores[*a as usize])
                .then(a.cmp(b))
        };
        if found.len() > limit {
            found.select_nth_unstable_by(limit - 1, by_score);
            found.truncate(limit);
        }
        found.sort_unstable_by(by_score);
        found
            .into_iter()
            .map(|position| Hit {
                position,
                part: part_of[position as usize],
                score: scores[position as usize],
            })
            .collect()
    }
}
