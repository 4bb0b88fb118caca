//! Checking one upstream entry and producing its exposed copy.
//!
//! The exposed copy differs from what the upstream sent only in the namespaced field
//! (`name`, `uri` or `uriTemplate`) and, for tools, the one schema fix-up: SDK clients
//! reject a whole `tools/list` when one `inputSchema` lacks `"type": "object"`.

use serde_json::{Map, Value};

use super::Kind;
use crate::filter::ToolFilter;

/// The field holding what an entry is addressed by.
pub(super) fn key_field(kind: Kind) -> &'static str {
    match kind {
        Kind::Tools | Kind::Prompts => "name",
        Kind::Resources => "uri",
        Kind::ResourceTemplates => "uriTemplate",
    }
}

/// What a tool's `inputSchema` needs before clients accept it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SchemaFix {
    None,
    /// No `inputSchema` at all: add `{"type": "object"}`.
    AddSchema,
    /// An object schema without `type`: append `"type": "object"`.
    AddType,
}

#[derive(Debug, PartialEq)]
pub(super) enum EntryCheck {
    Keep {
        original: String,
        schema_fix: SchemaFix,
    },
    /// A tool the upstream's filter does not permit; left out without a warning.
    Filtered,
    Invalid {
        entry: String,
        reason: String,
    },
}

/// Checks entry number `index` of a listing of `kind`.
pub(super) fn check_entry(
    kind: Kind,
    entry: &Value,
    index: usize,
    filter: &ToolFilter,
) -> EntryCheck {
    let Some(object) = entry.as_object() else {
        return invalid(
            format!("#{index}"),
            format!("it is {}, not a JSON object", json_type(entry)),
        );
    };
    let field = key_field(kind);
    let original = match object.get(field) {
        Some(Value::String(text)) if !text.is_empty() => text.clone(),
        Some(Value::String(_)) => {
            return invalid(
                entry_label(object, index),
                format!("its `{field}` is empty"),
            )
        }
        Some(other) => {
            return invalid(
                entry_label(object, index),
                format!("its `{field}` is {}, not a string", json_type(other)),
            )
        }
        None => return invalid(entry_label(object, index), format!("it has no `{field}`")),
    };
    if kind != Kind::Tools {
        return EntryCheck::Keep {
            original,
            schema_fix: SchemaFix::None,
        };
    }
    if !filter.permits(&original) {
        return EntryCheck::Filtered;
    }
    match check_input_schema(object.get("inputSchema")) {
        Ok(schema_fix) => EntryCheck::Keep {
            original,
            schema_fix,
        },
        Err(reason) => invalid(original, reason),
    }
}

fn check_input_schema(schema: Option<&Value>) -> Result<SchemaFix, String> {
    let schema = match schema {
        None => return Ok(SchemaFix::AddSchema),
        Some(Value::Object(schema)) => schema,
        Some(other) => {
            return Err(format!(
                "its inputSchema is {}, not a JSON object",
                json_type(other)
            ))
        }
    };
    let fix = match schema.get("type") {
        None => SchemaFix::AddType,
        Some(Value::String(schema_type)) if schema_type == "object" => SchemaFix::None,
        Some(other) => {
            return Err(format!(
                "its inputSchema has \"type\": {other}, but a tool's must be \"object\""
            ))
        }
    };
    // A client over HTTP must leave out a tool whose header designation is invalid.
    crate::headers::param_headers(&Value::Object(schema.clone()))?;
    Ok(fix)
}

/// The exposed copy of `entry`: `exposed_key` in its key field, the schema fix applied,
/// everything else (order, unknown keys, number spellings) untouched. Snapshots splice
/// the same into the entry's JSON instead (`part.rs`); this is what that must equal.
#[cfg(test)]
pub(super) fn exposed_entry(
    kind: Kind,
    entry: &Value,
    exposed_key: &str,
    schema_fix: SchemaFix,
) -> Value {
    let mut exposed = entry.clone();
    if let Value::Object(object) = &mut exposed {
        // With `preserve_order`, replacing an existing key keeps its position.
        object.insert(
            key_field(kind).to_string(),
            Value::String(exposed_key.to_string()),
        );
        match schema_fix {
            SchemaFix::None => {}
            SchemaFix::AddSchema => {
                object.insert("inputSchema".to_string(), object_type_schema());
            }
            SchemaFix::AddType => {
                if let Some(Value::Object(schema)) = object.get_mut("inputSchema") {
                    schema.insert("type".to_string(), Value::String("object".to_string()));
                }
            }
        }
    }
    exposed
}

#[cfg(test)]
fn object_type_schema() -> Value {
    let mut schema = Map::new();
    schema.insert("type".to_string(), Value::String("object".to_string()));
    Value::Object(schema)
}

/// An entry's name for messages: its non-empty string `name`, else `#<index>`.
fn entry_label(object: &Map<String, Value>, index: usize) -> String {
    match object.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => format!("#{index}"),
    }
}

fn invalid(entry: String, reason: String) -> EntryCheck {
    EntryCheck::Invalid { entry, reason }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(kind: Kind, entry: Value) -> EntryCheck {
        check_entry(kind, &entry, 7, &ToolFilter::default())
    }

    fn keep(original: &str, schema_fix: SchemaFix) -> EntryCheck {
        EntryCheck::Keep {
            original: original.to_string(),
            schema_fix,
        }
    }

    fn rejected(entry: &str, reason: &str) -> EntryCheck {
        EntryCheck::Invalid {
            entry: entry.to_string(),
            reason: reason.to_string(),
        }
    }

    #[test]
    fn tool_checks() {
        let cases = [
            (
                json!({"name": "ok", "inputSchema": {"type": "object"}}),
                keep("ok", SchemaFix::None),
            ),
            (json!({"name": "bare"}), keep("bare", SchemaFix::AddSchema)),
            (
                json!({"name": "untyped", "inputSchema": {"properties": {}}}),
                keep("untyped", SchemaFix::AddType),
            ),
            (
                json!("just a string"),
                rejected("#7", "it is a string, not a JSON object"),
            ),
            (
                json!({"description": "nameless"}),
                rejected("#7", "it has no `name`"),
            ),
            (json!({"name": ""}), rejected("#7", "its `name` is empty")),
            (
                json!({"name": 5}),
                rejected("#7", "its `name` is a number, not a string"),
            ),
            (
                json!({"name": "listy", "inputSchema": []}),
                rejected("listy", "its inputSchema is an array, not a JSON object"),
            ),
            (
                json!({"name": "stringy", "inputSchema": {"type": "string"}}),
                rejected(
                    "stringy",
                    "its inputSchema has \"type\": \"string\", but a tool's must be \"object\"",
                ),
            ),
        ];
        for (entry, expected) in cases {
            assert_eq!(check(Kind::Tools, entry.clone()), expected, "entry {entry}");
        }
    }

    #[test]
    fn other_kinds_need_their_key_field_only() {
        let cases = [
            (
                Kind::Prompts,
                json!({"name": "greet"}),
                keep("greet", SchemaFix::None),
            ),
            (
                Kind::Resources,
                json!({"uri": "file:///a", "name": "a"}),
                keep("file:///a", SchemaFix::None),
            ),
            (
                Kind::Resources,
                json!({"name": "no-uri"}),
                rejected("no-uri", "it has no `uri`"),
            ),
            (
                Kind::ResourceTemplates,
                json!({"uriTemplate": "x://{id}"}),
                keep("x://{id}", SchemaFix::None),
            ),
            (
                Kind::ResourceTemplates,
                json!({"uriTemplate": ""}),
                rejected("#7", "its `uriTemplate` is empty"),
            ),
        ];
        for (kind, entry, expected) in cases {
            assert_eq!(check(kind, entry.clone()), expected, "{kind:?} {entry}");
        }
    }

    #[test]
    fn filtered_tools_are_skipped_before_their_schema_is_judged() {
        let filter = ToolFilter::new(Vec::new(), vec!["hidden*".to_string()]);
        let entry = json!({"name": "hidden_tool", "inputSchema": 3});
        assert_eq!(
            check_entry(Kind::Tools, &entry, 0, &filter),
            EntryCheck::Filtered
        );
    }

    #[test]
    fn schema_fix_appends_type_and_touches_nothing_else() {
        let upstream_text = r#"{"name":"t","inputSchema":{"properties":{"n":{"type":"integer","default":5}},"required":["n"],"x-vendor":true},"_meta":{"k":1}}"#;
        let entry: Value = serde_json::from_str(upstream_text).unwrap();
        let exposed = exposed_entry(Kind::Tools, &entry, "srv__t", SchemaFix::AddType);
        assert_eq!(
            serde_json::to_string(&exposed).unwrap(),
            r#"{"name":"srv__t","inputSchema":{"properties":{"n":{"type":"integer","default":5}},"required":["n"],"x-vendor":true,"type":"object"},"_meta":{"k":1}}"#
        );
    }

    #[test]
    fn missing_schema_is_appended_as_an_object_schema() {
        let entry = json!({"name": "t", "description": "d"});
        let exposed = exposed_entry(Kind::Tools, &entry, "t", SchemaFix::AddSchema);
        assert_eq!(
            serde_json::to_string(&exposed).unwrap(),
            r#"{"name":"t","description":"d","inputSchema":{"type":"object"}}"#
        );
    }

    #[test]
    fn key_field_is_replaced_in_place() {
        let entry: Value =
            serde_json::from_str(r#"{"description":"d","uriTemplate":"x://{id}","name":"n"}"#)
                .unwrap();
        let exposed = exposed_entry(
            Kind::ResourceTemplates,
            &entry,
            "ns+x://{id}",
            SchemaFix::None,
        );
        assert_eq!(
            serde_json::to_string(&exposed).unwrap(),
            r#"{"description":"d","uriTemplate":"ns+x://{id}","name":"n"}"#
        );
    }
}
