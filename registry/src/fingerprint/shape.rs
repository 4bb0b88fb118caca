//! The part of a JSON Schema a caller depends on: types, members and which are
//! required, with local `$ref`s (`#/$defs/…`, `#/definitions/…`, `#/components/…`,
//! any local JSON pointer) resolved, so a type hidden behind a reference counts.

use serde_json::{json, Map, Value};

/// Deeper schemas are summarised to this depth (a guard against hostile input).
const MAX_DEPTH: usize = 32;

/// The shape of a whole schema.
pub fn of_schema(root: &Value) -> Value {
    of(root, root)
}

/// The shape of `schema`, a part of `root` (where its references point).
pub fn of(schema: &Value, root: &Value) -> Value {
    shape(schema, root, 0, &mut Vec::new())
}

fn shape(schema: &Value, root: &Value, depth: usize, visiting: &mut Vec<String>) -> Value {
    if depth > MAX_DEPTH {
        return json!({"depth-limit": true});
    }
    let Some(object) = schema.as_object() else {
        // `true`, `false`, or something that is not a schema at all.
        return json!({"schema": schema});
    };
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        if visiting.iter().any(|seen| seen == reference) {
            return json!({"$ref-cycle": reference});
        }
        return match resolve(root, reference) {
            Some(target) => {
                visiting.push(reference.to_string());
                let resolved = shape(target, root, depth + 1, visiting);
                visiting.pop();
                resolved
            }
            // Unresolvable (remote, or dangling): the reference text itself counts.
            None => json!({"$ref": reference}),
        };
    }
    let mut out = Map::new();
    if let Some(kind) = object.get("type") {
        let kind = match kind {
            Value::Array(kinds) => {
                let mut kinds: Vec<String> = kinds.iter().map(ToString::to_string).collect();
                kinds.sort();
                kinds.dedup();
                json!(kinds)
            }
            other => other.clone(),
        };
        out.insert("type".into(), kind);
    }
    if let Some(Value::Object(properties)) = object.get("properties") {
        let members: Map<String, Value> = properties
            .iter()
            .map(|(name, member)| (name.clone(), shape(member, root, depth + 1, visiting)))
            .collect();
        out.insert("properties".into(), Value::Object(members));
    }
    if let Some(Value::Array(required)) = object.get("required") {
        let mut names: Vec<&str> = required.iter().filter_map(Value::as_str).collect();
        names.sort_unstable();
        names.dedup();
        out.insert("required".into(), json!(names));
    }
    for key in ["items", "additionalProperties", "prefixItems"] {
        match object.get(key) {
            Some(Value::Array(schemas)) => {
                let shapes: Vec<Value> = schemas
                    .iter()
                    .map(|item| shape(item, root, depth + 1, visiting))
                    .collect();
                out.insert(key.into(), Value::Array(shapes));
            }
            Some(item @ Value::Object(_)) => {
                out.insert(key.into(), shape(item, root, depth + 1, visiting));
            }
            _ => {}
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(choices)) = object.get(key) {
            // The order of alternatives does not change what a caller may send.
            let mut shapes: Vec<(Vec<u8>, Value)> = choices
                .iter()
                .map(|choice| {
                    let shape = shape(choice, root, depth + 1, visiting);
                    (
                        serde_json_canonicalizer::to_vec(&shape).unwrap_or_default(),
                        shape,
                    )
                })
                .collect();
            shapes.sort_by(|a, b| a.0.cmp(&b.0));
            out.insert(
                key.into(),
                Value::Array(shapes.into_iter().map(|(_, shape)| shape).collect()),
            );
        }
    }
    Value::Object(out)
}

/// The target of a local reference (`#` followed by a JSON pointer, `~0`/`~1`
/// escapes and all), if there is one.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}
