//! Shared builders for the catalog's unit tests.

use std::sync::Arc;

use serde_json::Value;

use super::{Catalog, CatalogOptions, CatalogWarning, UpstreamListing};
use crate::filter::ToolFilter;

/// A listing of `upstream` under `prefix`, with nothing listed yet.
pub(crate) fn listing(upstream: &str, prefix: &str) -> UpstreamListing {
    UpstreamListing::empty(
        Arc::from(upstream),
        prefix.to_string(),
        ToolFilter::default(),
    )
}

/// A tool with a valid schema.
pub(crate) fn tool(name: &str) -> Value {
    serde_json::json!({"name": name, "inputSchema": {"type": "object"}})
}

pub(crate) fn build_default(listings: &[UpstreamListing]) -> (Catalog, Vec<CatalogWarning>) {
    Catalog::build(listings, &CatalogOptions::default())
}
