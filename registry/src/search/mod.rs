//! Tool search: terms from text (`analyze`), one upstream's tools inverted
//! (`part_index`, built once per part), and BM25F over a snapshot (`index`). Knows
//! nothing of catalogs: `catalog/search.rs` feeds it a snapshot's parts.

mod analyze;
mod index;
mod part_index;

use serde::Deserialize;

pub use analyze::Analyzer;
pub use index::{Hit, PartInput, SearchIndex, NOT_SHOWN};
pub use part_index::{PartIndex, ToolText};

/// How a catalog (the root, or a view) offers its tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Expose {
    /// Every tool listed.
    #[default]
    #[serde(rename = "all")]
    All,
    /// `search_tools` and `call_tool` listed instead.
    #[serde(rename = "search")]
    Search,
    /// The two, and every tool a search in the session found.
    #[serde(rename = "search+found")]
    SearchFound,
}

impl Expose {
    pub fn as_str(self) -> &'static str {
        match self {
            Expose::All => "all",
            Expose::Search => "search",
            Expose::SearchFound => "search+found",
        }
    }
}

/// The longest query taken, in bytes: a task's description fits many times over.
pub const MAX_QUERY_BYTES: usize = 4096;
/// Results a search returns unless asked, and at most.
pub const DEFAULT_LIMIT: usize = 10;
pub const MAX_LIMIT: usize = 50;

/// A search refused before it runs.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    #[error("`query` is empty")]
    EmptyQuery,
    #[error("`query` is {bytes} bytes long; at most {MAX_QUERY_BYTES} are taken")]
    QueryTooLong { bytes: usize },
    #[error("`limit` is {limit}; it must be from 1 to {MAX_LIMIT}")]
    Limit { limit: u64 },
    #[error("there is no upstream `{0}` in this catalog")]
    UnknownUpstream(String),
}

/// Checks a query and a limit as a client gave them.
pub fn check(query: &str, limit: Option<u64>) -> Result<usize, SearchError> {
    if query.trim().is_empty() {
        return Err(SearchError::EmptyQuery);
    }
    if query.len() > MAX_QUERY_BYTES {
        return Err(SearchError::QueryTooLong { bytes: query.len() });
    }
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(limit) if (1..=MAX_LIMIT as u64).contains(&limit) => Ok(limit as usize),
        Some(limit) => Err(SearchError::Limit { limit }),
    }
}
