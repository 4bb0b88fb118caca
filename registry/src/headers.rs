//! Tool parameters mirrored into HTTP headers (2026-07-28 `x-mcp-header`): which
//! parameters a tool's input schema designates, the rules the designation must
//! follow (a tool that breaks them is left out of the catalog), and the header
//! value encoding, `=?base64?…?=` for anything that is not plain ASCII.

use std::borrow::Cow;

use base64::Engine;
use serde_json::Value;

const ANNOTATION: &str = "x-mcp-header";
const SENTINEL_START: &str = "=?base64?";
const SENTINEL_END: &str = "?=";
/// Integers outside JavaScript's safe range cannot be mirrored.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// A parameter mirrored into the header `Mcp-Param-{name}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamHeader {
    /// The name part of the header, as the schema gives it.
    pub name: String,
    /// The chain of `properties` keys from the schema root to the parameter.
    pub path: Vec<String>,
}

impl ParamHeader {
    /// The header's name, lowercase as HTTP/1 and HTTP/2 carry it.
    pub fn header_name(&self) -> String {
        format!("mcp-param-{}", self.name.to_ascii_lowercase())
    }

    /// The parameter's value in `arguments` as header text (before encoding):
    /// None when absent or null, and then no header is sent or expected.
    pub fn value_in(&self, arguments: Option<&Value>) -> Option<String> {
        let mut value = arguments?;
        for key in &self.path {
            value = value.get(key)?;
        }
        match value {
            Value::String(text) => Some(text.clone()),
            Value::Bool(flag) => Some(flag.to_string()),
            Value::Number(number) => number
                .as_i64()
                // Not `abs`: i64::MIN has none (a panic unoptimised, itself when not).
                .filter(|n| (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(n))
                .map(|n| n.to_string()),
            _ => None,
        }
    }
}

/// The parameters `schema` designates for headers, or why the designation is invalid.
pub fn param_headers(schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut found = Vec::new();
    collect(schema, &mut Vec::new(), &mut found)?;
    // An annotation anywhere else (under `items`, `anyOf`, `$defs`, …) is invalid.
    if count_annotations(schema) != found.len() {
        return Err(format!(
            "its inputSchema has an `{ANNOTATION}` on a parameter not reachable through `properties` alone"
        ));
    }
    let mut seen: Vec<String> = Vec::with_capacity(found.len());
    for header in &found {
        let lower = header.name.to_ascii_lowercase();
        if seen.contains(&lower) {
            return Err(format!(
                "its inputSchema names the header `{}` twice",
                header.name
            ));
        }
        seen.push(lower);
    }
    Ok(found)
}

fn collect(
    schema: &Value,
    path: &mut Vec<String>,
    found: &mut Vec<ParamHeader>,
) -> Result<(), String> {
    let Some(Value::Object(properties)) = schema.get("properties") else {
        return Ok(());
    };
    for (key, property) in properties {
        path.push(key.clone());
        if let Some(annotation) = property.get(ANNOTATION) {
            found.push(check_annotation(annotation, property, path)?);
        }
        collect(property, path, found)?;
        path.pop();
    }
    Ok(())
}

fn check_annotation(
    annotation: &Value,
    property: &Value,
    path: &[String],
) -> Result<ParamHeader, String> {
    let at = path.join(".");
    let name = annotation
        .as_str()
        .ok_or_else(|| format!("the `{ANNOTATION}` of `{at}` is not a string"))?;
    if name.is_empty() || !name.bytes().all(is_token_char) {
        return Err(format!(
            "the `{ANNOTATION}` of `{at}` (`{name}`) is not an HTTP header name token"
        ));
    }
    match property.get("type").and_then(Value::as_str) {
        Some("string" | "integer" | "boolean") => {}
        _ => {
            return Err(format!(
                "`{at}` has an `{ANNOTATION}` but is not a string, integer or boolean"
            ))
        }
    }
    Ok(ParamHeader {
        name: name.to_string(),
        path: path.to_vec(),
    })
}

fn count_annotations(value: &Value) -> usize {
    match value {
        Value::Object(object) => {
            usize::from(object.contains_key(ANNOTATION))
                + object.values().map(count_annotations).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(count_annotations).sum(),
        _ => 0,
    }
}

/// RFC 9110 `tchar`.
fn is_token_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// The header text for `text`: as it is when plain printable ASCII without
/// surrounding blanks (and not itself shaped like the sentinel), else base64
/// between `=?base64?` and `?=`.
pub fn encode_header_value(text: &str) -> String {
    let printable = text.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let padded = text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']);
    let sentinel_shaped = text.starts_with(SENTINEL_START) && text.ends_with(SENTINEL_END);
    if printable && !padded && !sentinel_shaped {
        return text.to_string();
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    format!("{SENTINEL_START}{encoded}{SENTINEL_END}")
}

/// The text a header value stands for (the sentinel decoded); None when the
/// sentinel's content is not base64 of UTF-8.
pub fn decode_header_value(value: &str) -> Option<Cow<'_, str>> {
    match value
        .strip_prefix(SENTINEL_START)
        .and_then(|rest| rest.strip_suffix(SENTINEL_END))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(Cow::Owned),
        None => Some(Cow::Borrowed(value)),
    }
}

/// Whether the header text `sent` stands for `expected`; integers compare as
/// numbers (`42.0` is `42`).
pub fn header_matches(sent: &str, expected: &str) -> bool {
    if sent == expected {
        return true;
    }
    match (sent.parse::<f64>(), expected.parse::<i64>()) {
        (Ok(sent), Ok(expected)) => sent == expected as f64,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object_schema(properties: Value) -> Value {
        json!({"type": "object", "properties": properties})
    }

    #[test]
    fn annotated_parameters_are_found_through_properties() {
        let schema = object_schema(json!({
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"},
            "opts": {"type": "object", "properties": {
                "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
            }},
        }));
        let Ok(headers) = param_headers(&schema) else {
            panic!("a valid designation refused");
        };
        assert_eq!(headers.len(), 2);
        let region = headers.iter().find(|h| h.name == "Region");
        assert_eq!(
            region.map(|h| h.header_name()),
            Some("mcp-param-region".into())
        );
        let dry = headers.iter().find(|h| h.name == "Dry-Run");
        assert_eq!(
            dry.map(|h| h.path.clone()),
            Some(vec!["opts".into(), "dry".into()])
        );
        let arguments = json!({"region": "us-west1", "opts": {"dry": true}});
        assert_eq!(
            region.and_then(|h| h.value_in(Some(&arguments))),
            Some("us-west1".into())
        );
        assert_eq!(
            dry.and_then(|h| h.value_in(Some(&arguments))),
            Some("true".into())
        );
        assert_eq!(
            region.and_then(|h| h.value_in(Some(&json!({"region": null})))),
            None
        );
    }

    #[test]
    fn invalid_designations_are_refused() {
        for (schema, why) in [
            (
                object_schema(json!({"n": {"type": "number", "x-mcp-header": "N"}})),
                "number",
            ),
            (
                object_schema(json!({"a": {"type": "string", "x-mcp-header": ""}})),
                "empty",
            ),
            (
                object_schema(json!({"a": {"type": "string", "x-mcp-header": "A B"}})),
                "space",
            ),
            (
                object_schema(json!({
                    "a": {"type": "string", "x-mcp-header": "Same"},
                    "b": {"type": "string", "x-mcp-header": "same"},
                })),
                "duplicate",
            ),
            (
                object_schema(
                    json!({"list": {"type": "array", "items": {"type": "string", "x-mcp-header": "Item"}}}),
                ),
                "under items",
            ),
            (
                json!({"type": "object", "anyOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
                "under anyOf",
            ),
        ] {
            assert!(param_headers(&schema).is_err(), "{why}: {schema}");
        }
        assert_eq!(param_headers(&json!({"type": "object"})), Ok(Vec::new()));
    }

    #[test]
    fn values_are_encoded_as_the_revision_says() {
        assert_eq!(encode_header_value("us-west1"), "us-west1");
        assert_eq!(
            encode_header_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(
            encode_header_value("line1\nline2"),
            "=?base64?bGluZTEKbGluZTI=?="
        );
        assert_eq!(
            encode_header_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        for text in ["plain", "Hello, 世界", " padded ", "=?base64?literal?="] {
            assert_eq!(
                decode_header_value(&encode_header_value(text)).as_deref(),
                Some(text)
            );
        }
        assert_eq!(decode_header_value("=?base64?!!?="), None);
        assert!(header_matches("42.0", "42"));
        assert!(!header_matches("43", "42"));
    }

    #[test]
    fn hostile_schemas_and_arguments_make_headers_or_none_and_never_panic() {
        let schema = br#"{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"},"n":{"type":"integer","x-mcp-header":"N"},"deep":{"type":"object","properties":{"on":{"type":"boolean","x-mcp-header":"On"}}}}}"#;
        let arguments = br#"{"region":"eu-west \u00e9","n":-9007199254740991,"deep":{"on":true}}"#;
        let fixed = serde_json::from_slice(schema).map(|schema| param_headers(&schema));
        let Ok(Ok(fixed)) = fixed else {
            panic!("the seed schema is valid")
        };
        let cases = mutations::cases(&[schema, arguments], 3_000, 0x4EAD);
        mutations::check("x-mcp-header", &cases, 128, |bytes| {
            let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            // As a schema: its headers are tokens, each once.
            if let Ok(found) = param_headers(&value) {
                for header in &found {
                    assert!(!header.name.is_empty() && header.name.bytes().all(is_token_char));
                }
            }
            // As a call's arguments: each header's text, encoded, decodes to itself.
            for header in &fixed {
                let Some(text) = header.value_in(Some(&value)) else {
                    continue;
                };
                if let Ok(number) = text.parse::<i64>() {
                    assert!(number.unsigned_abs() <= MAX_SAFE_INTEGER as u64, "{text}");
                }
                let encoded = encode_header_value(&text);
                assert!(
                    encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)),
                    "{encoded}"
                );
                assert_eq!(
                    decode_header_value(&encoded).as_deref(),
                    Some(text.as_str())
                );
            }
        });
    }
}
