//! Search views (`expose = "search"` / `"search+found"`): `tools/list` offers
//! `search_tools` and `call_tool` instead of the catalog (with `search+found`,
//! also every tool this session's searches returned). `search_tools` is
//! answered from the snapshot's index; `call_tool` becomes the `tools/call` it
//! names before anything else sees it, so the view, holds, limits, audit,
//! progress, cancellation and server-to-client requests apply as to a direct call.

use std::sync::{Mutex, PoisonError};

use adapters::{Reply, WrittenMember};
use registry::search::{self, Expose};
use registry::{Catalog, Found};
use serde_json::{json, Map, Value};

use crate::client_message;
use crate::jsonrpc::{self, RelayError};
use tokio::sync::mpsc;

pub(super) const SEARCH_TOOLS: &str = "search_tools";
pub(super) const CALL_TOOL: &str = "call_tool";

/// Most tools one session's searches add to its list (`search+found`): a
/// session searching all day does not grow without end; the earliest go first.
const MOST_FOUND: usize = 500;

/// The exposed names a session's searches found, in the order first found.
#[derive(Default)]
pub(super) struct FoundTools(Mutex<Vec<String>>);

impl FoundTools {
    /// Adds `names`; whether any was new.
    fn add<'a>(&self, names: impl Iterator<Item = &'a str>) -> bool {
        let mut found = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut added = false;
        for name in names {
            if !found.iter().any(|known| known == name) {
                found.push(name.to_string());
                added = true;
            }
        }
        if found.len() > MOST_FOUND {
            let over = found.len() - MOST_FOUND;
            found.drain(..over);
        }
        added
    }

    fn names(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Whether a `tools/call` with `params` is a `search_tools` call this catalog answers.
pub(super) fn is_search(catalog: &Catalog, params: Option<&Value>) -> bool {
    catalog.expose() != Expose::All
        && params
            .and_then(|params| params.get("name"))
            .and_then(Value::as_str)
            == Some(SEARCH_TOOLS)
}

/// Whether a `tools/call` with `params` names `search_tools` or `call_tool`.
pub(super) fn names_meta_tool(params: Option<&Value>) -> bool {
    let name = params
        .and_then(|params| params.get("name"))
        .and_then(Value::as_str);
    matches!(name, Some(SEARCH_TOOLS | CALL_TOOL))
}

/// What a `tools/call` under a search view turned out to be.
pub(super) enum MetaCall {
    /// `search_tools`, answered.
    Answered(Reply),
    /// Any other call, or `call_tool` rewritten into the call it names.
    Call {
        params: Option<Value>,
        arguments: Option<WrittenMember>,
    },
}

/// The two tools a search view lists.
fn meta_tools() -> [Value; 2] {
    let found = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The name to call it by (with call_tool)."},
            "upstream": {"type": "string", "description": "The server it belongs to."},
            "tool": {"type": "string", "description": "The server's own name for it."},
            "title": {"type": "string"},
            "description": {"type": "string"},
            "score": {"type": "number", "description": "Relevance; higher is better."},
            "inputSchema": {"type": "object", "description": "The arguments it takes."}
        },
        "required": ["name", "upstream", "tool", "description", "score", "inputSchema"]
    });
    [
        json!({
            "name": SEARCH_TOOLS,
            "title": "Search tools",
            "description": "Finds the tools best suited to a task among every tool of every \
                connected server, best first, with their descriptions and input schemas. \
                Describe what you want to do in plain words; then run a tool with call_tool.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you want to do, in words."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": search::MAX_LIMIT,
                              "default": search::DEFAULT_LIMIT,
                              "description": "How many tools to return."},
                    "upstream": {"type": "string",
                                 "description": "Only tools of this server."}
                },
                "required": ["query"]
            },
            "outputSchema": {
                "type": "object",
                "properties": {"tools": {"type": "array", "items": found}},
                "required": ["tools"]
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }),
        json!({
            "name": CALL_TOOL,
            "title": "Call a tool",
            "description": "Runs a tool found with search_tools, by its name, with arguments \
                that match its input schema, and returns that tool's result.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's name, as search_tools gave it."},
                    "arguments": {"type": "object", "description": "The tool's arguments."}
                },
                "required": ["name"]
            }
        }),
    ]
}

impl FoundTools {
    /// The tools `tools/list` shows under a search view (one page, no cursor);
    /// None when the catalog lists its tools itself.
    pub(super) fn listing(&self, catalog: &Catalog) -> Option<Vec<Value>> {
        let mut tools = match catalog.expose() {
            Expose::All => return None,
            Expose::Search | Expose::SearchFound => meta_tools().to_vec(),
        };
        if catalog.expose() == Expose::SearchFound {
            // Found once, listed while the snapshot still shows it.
            tools.extend(self.names().iter().filter_map(|name| catalog.tool(name)));
        }
        Some(tools)
    }

    /// A `tools/call` under a search view: `search_tools` answered here, `call_tool`
    /// unwrapped; anything else (and everything under `expose = "all"`) passed on.
    pub(super) fn meta_call(
        &self,
        catalog: &Catalog,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
        outbound: &mpsc::Sender<Value>,
    ) -> Result<MetaCall, RelayError> {
        let name = params
            .as_ref()
            .and_then(|params| params.get("name"))
            .and_then(Value::as_str);
        let meta = matches!(name, Some(SEARCH_TOOLS | CALL_TOOL));
        if catalog.expose() == Expose::All || !meta {
            return Ok(MetaCall::Call { params, arguments });
        }
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        if let Some(arguments) = &arguments {
            client_message::put_back(&mut params, arguments)?;
        }
        let given = match params.remove("arguments") {
            Some(Value::Object(given)) => given,
            None | Some(Value::Null) => Map::new(),
            Some(_) => {
                return Err(RelayError::InvalidParams(
                    "`arguments` must be an object".into(),
                ))
            }
        };
        if params.get("name").and_then(Value::as_str) == Some(SEARCH_TOOLS) {
            return self
                .search(catalog, &given, outbound)
                .map(MetaCall::Answered);
        }
        let mut given = given;
        let inner = match given.remove("name") {
            Some(Value::String(inner)) => inner,
            _ => {
                return Err(RelayError::InvalidParams(
                    "call_tool: `name` must be a string (a name search_tools returned)".into(),
                ))
            }
        };
        if inner == SEARCH_TOOLS || inner == CALL_TOOL {
            return Err(RelayError::InvalidParams(format!(
                "call_tool: `{inner}` is called directly, not through call_tool"
            )));
        }
        let inner_arguments = match given.remove("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::Object(object)) => Value::Object(object),
            Some(_) => {
                return Err(RelayError::InvalidParams(
                    "call_tool: `arguments` must be an object".into(),
                ))
            }
        };
        // The call's own `_meta` (its progress token) and anything else stay.
        params.insert("name".into(), Value::String(inner));
        params.insert("arguments".into(), inner_arguments);
        Ok(MetaCall::Call {
            params: Some(Value::Object(params)),
            arguments: None,
        })
    }

    /// `search_tools`: checked, searched, and (`search+found`) remembered.
    fn search(
        &self,
        catalog: &Catalog,
        given: &Map<String, Value>,
        outbound: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let invalid =
            |message: String| RelayError::InvalidParams(format!("search_tools: {message}"));
        let query = match given.get("query") {
            Some(Value::String(query)) => query.as_str(),
            _ => return Err(invalid("`query` must be a string".into())),
        };
        let limit = match given.get("limit") {
            None | Some(Value::Null) => None,
            Some(limit) => Some(
                limit
                    .as_u64()
                    .ok_or_else(|| invalid(format!("`limit` must be an integer, not {limit}")))?,
            ),
        };
        let upstream = match given.get("upstream") {
            None | Some(Value::Null) => None,
            Some(Value::String(upstream)) => Some(upstream.as_str()),
            Some(_) => return Err(invalid("`upstream` must be a string".into())),
        };
        let limit = search::check(query, limit).map_err(|error| invalid(error.to_string()))?;
        let found = catalog
            .search_tools(query, limit, upstream)
            .map_err(|error| invalid(error.to_string()))?;
        if catalog.expose() == Expose::SearchFound
            && self.add(found.iter().map(|found| found.name.as_str()))
        {
            // The list holds what was found already: a client re-listing as soon
            // as it reads this sees it, even before the answer arrives.
            if outbound
                .try_send(jsonrpc::notification(
                    "notifications/tools/list_changed",
                    None,
                ))
                .is_err()
            {
                tracing::debug!("session's outbound queue is full; list change not announced");
            }
        }
        let tools: Vec<Value> = found.into_iter().map(described).collect();
        let structured = json!({ "tools": tools });
        Ok(Reply::Result(json!({
            "content": [{"type": "text", "text": structured.to_string()}],
            "structuredContent": structured,
        })))
    }
}

/// One found tool as `search_tools` gives it.
fn described(found: Found) -> Value {
    let mut entry = found.entry;
    let mut tool = Map::with_capacity(7);
    tool.insert("name".into(), Value::String(found.name));
    tool.insert("upstream".into(), Value::String(found.upstream.to_string()));
    tool.insert("tool".into(), Value::String(found.tool));
    if let Some(title) = entry.get_mut("title").map(Value::take) {
        tool.insert("title".into(), title);
    }
    let description = entry
        .get_mut("description")
        .map(Value::take)
        .unwrap_or_else(|| Value::String(String::new()));
    tool.insert("description".into(), description);
    // Three decimals say all a ranking needs.
    let score = (f64::from(found.score) * 1000.0).round() / 1000.0;
    tool.insert("score".into(), json!(score));
    let schema = entry
        .get_mut("inputSchema")
        .map(Value::take)
        .unwrap_or_else(|| json!({"type": "object"}));
    tool.insert("inputSchema".into(), schema);
    Value::Object(tool)
}
