//! The plexus catalog: names and namespacing, route tables, immutable catalog snapshots
//! pagination cursors, and schema fingerprints with drift classification. Pure and synchronous: no I/O, no clock, no logging; problems
//! come back as [`CatalogWarning`] data.

pub mod cache;
pub mod catalog;
pub mod cursor;
pub mod filter;
pub mod fingerprint;
pub mod headers;
pub mod names;
pub mod quarantine;
pub mod search;
pub mod uris;

pub use cache::CacheHint;
pub use catalog::{
    Catalog, CatalogOptions, CatalogWarning, Entries, EntryText, Found, Held, Kind, Page, Route,
    TaskSupport, UpstreamListing, UpstreamPart, View,
};
pub use cursor::CursorError;
pub use filter::ToolFilter;
pub use quarantine::Quarantine;

/// Counts each test thread's allocations, for the parsers' randomized tests.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: mutations::Counting = mutations::Counting;
