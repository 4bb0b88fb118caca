//! Lists served from the catalog snapshot, with plexus's cursors: a
//! handshake-era client's page spliced in as the catalog's own JSON, a
//! 2026-07-28 client's with its cache hints; only a session's first list waits
//! for upstreams still starting.

use std::sync::atomic::{AtomicBool, Ordering};

use registry::Kind;
use serde_json::{json, Map, Value};

use super::search::FoundTools;
use crate::era::Era;
use crate::hub::Hub;
use crate::jsonrpc::{self, RelayError};
use crate::telemetry::{self, Wait};

/// A session's lists: pages of its view of the catalog.
#[derive(Default)]
pub(super) struct Lister {
    /// Whether it listed anything yet (only its first list waits for starting upstreams).
    listed: AtomicBool,
    /// What its searches found (listed under `expose = "search+found"`).
    pub(super) found: FoundTools,
}

impl Lister {
    /// A handshake-era client's list page as the bytes of its `result`: the
    /// catalog's own JSON spliced in, never parsed into values and written again.
    pub(super) async fn page_written(
        &self,
        hub: &Hub,
        view: Option<&str>,
        kind: Kind,
        params: Option<Value>,
        id: &Value,
    ) -> Result<jsonrpc::Answer, RelayError> {
        self.wait_for_first_list(hub).await;
        let catalog = hub.catalog_for(view);
        if let Some(tools) = (kind == Kind::Tools)
            .then(|| self.found.listing(&catalog))
            .flatten()
        {
            // One page that never issued a cursor: any cursor is not one of its own.
            if cursor_of(&params).is_some() {
                return Err(RelayError::InvalidParams(
                    "this tools/list is one page (a search view); it issued no cursor".into(),
                ));
            }
            let result = json!({ "tools": tools });
            return Ok(jsonrpc::Answer::result_written(id, 1024, |out| {
                let _ = serde_json::to_writer(out, &result);
            }));
        }
        let page = catalog
            .page(kind, cursor_of(&params))
            .map_err(|error| RelayError::InvalidParams(error.to_string()))?;
        let size = page.items.json_size_hint() + 64;
        Ok(jsonrpc::Answer::result_written(id, size, |out| {
            out.push(b'{');
            // A result key is a plain identifier: no escaping needed.
            out.push(b'"');
            out.extend_from_slice(kind.result_key().as_bytes());
            out.extend_from_slice(b"\":");
            page.items.write_json_array(out);
            if let Some(next) = page.next_cursor {
                out.extend_from_slice(br#","nextCursor":"#);
                let _ = serde_json::to_writer(&mut *out, &next);
            }
            out.push(b'}');
        }))
    }

    /// Only a session's first list (or search) waits for upstreams still starting.
    pub(super) async fn wait_for_first_list(&self, hub: &Hub) {
        if !self.listed.swap(true, Ordering::Relaxed) {
            telemetry::waited(Wait::FirstList, None, hub.wait_for_first_listings()).await;
        }
    }

    /// A list page as a value; a 2026-07-28 client's (`era`) with its cache hints.
    pub(super) async fn page(
        &self,
        hub: &Hub,
        view: Option<&str>,
        era: Era,
        kind: Kind,
        params: Option<Value>,
    ) -> Result<Value, RelayError> {
        self.wait_for_first_list(hub).await;
        let catalog = hub.catalog_for(view);
        let page = catalog
            .page(kind, cursor_of(&params))
            .map_err(|error| RelayError::InvalidParams(error.to_string()))?;
        let mut result = Map::with_capacity(4);
        match (kind == Kind::Tools)
            .then(|| self.found.listing(&catalog))
            .flatten()
        {
            Some(tools) => {
                result.insert("tools".into(), Value::Array(tools));
            }
            None => {
                result.insert(kind.result_key().into(), Value::Array(page.items.to_vec()));
                if let Some(next) = page.next_cursor {
                    result.insert("nextCursor".into(), Value::String(next));
                }
            }
        }
        if era == Era::Modern {
            // What is true of the merge: its shortest-lived part's lifetime, and
            // shareable only if every part is, and the caller does not pick the view.
            let mut cache = page.cache;
            cache.public &= !hub.catalog_depends_on_caller();
            result.insert("ttlMs".into(), Value::from(cache.ttl_ms));
            result.insert("cacheScope".into(), Value::from(cache.scope()));
        }
        Ok(Value::Object(result))
    }
}

/// The kind a list method lists.
pub(super) fn list_kind(method: &str) -> Option<Kind> {
    match method {
        "tools/list" => Some(Kind::Tools),
        "prompts/list" => Some(Kind::Prompts),
        "resources/list" => Some(Kind::Resources),
        "resources/templates/list" => Some(Kind::ResourceTemplates),
        _ => None,
    }
}

/// A list request's cursor (a null or non-text one is none).
pub(super) fn cursor_of(params: &Option<Value>) -> Option<&str> {
    params.as_ref()?.get("cursor")?.as_str()
}
