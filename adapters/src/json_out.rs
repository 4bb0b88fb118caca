//! Writing JSON values: byte for byte what serde_json writes, with strings scanned
//! eight bytes at a time for what needs escaping. serde_json looks at each byte in
//! turn, which made writing a call's arguments again (a 1 MiB string) the largest
//! cost of relaying it.

use serde_json::{Map, Value};

/// `value` as compact JSON, appended to `out`: the bytes `serde_json::to_writer`
/// gives.
pub fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => {
            // Writing a number to memory cannot fail.
            let _ = serde_json::to_writer(&mut *out, number);
        }
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(members) => write_map(out, members),
    }
}

/// An object's members as compact JSON, appended to `out`.
pub fn write_map(out: &mut Vec<u8>, members: &Map<String, Value>) {
    out.push(b'{');
    for (index, (key, member)) in members.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_str(out, key);
        out.push(b':');
        write_value(out, member);
    }
    out.push(b'}');
}

/// `value` as compact JSON, in a buffer of its own.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_value(&mut out, value);
    out
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether one of the eight bytes of `word` is a control character, a quote or a
/// backslash (the bytes serde_json escapes). Exact as a whole, though not per
/// byte: a borrow can only start at a byte that matches.
fn needs_escape(word: u64) -> bool {
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    let zero_at = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let quote = zero_at(word ^ (ONES * u64::from(b'"')));
    let backslash = zero_at(word ^ (ONES * u64::from(b'\\')));
    (below_space | quote | backslash) != 0
}

/// How many bytes a value serialises to, without building the text.
pub fn serialized_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// `text` as a JSON string, escaped as serde_json escapes it.
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let (mut run, mut at) = (0, 0);
    while at < bytes.len() {
        let word = bytes
            .get(at..at + 8)
            .and_then(|chunk| <[u8; 8]>::try_from(chunk).ok());
        if let Some(word) = word {
            if !needs_escape(u64::from_le_bytes(word)) {
                at += 8;
                continue;
            }
        }
        let byte = bytes[at];
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ],
            _ => {
                at += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[run..at]);
        out.extend_from_slice(escape);
        at += 1;
        run = at;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn same_as_serde_json(value: &Value) {
        assert_eq!(
            String::from_utf8(to_vec(value)).unwrap(),
            serde_json::to_string(value).unwrap()
        );
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        // Every byte below 0x80 at every offset across the eight-byte words.
        for byte in 0u8..0x80 {
            for offset in 0..17 {
                let mut text = "x".repeat(offset);
                text.push(char::from(byte));
                text.push_str("tail of more than eight bytes");
                same_as_serde_json(&Value::String(text));
            }
        }
        for text in [
            "",
            "é€😀 and \u{7f}",
            "\"\\\"\\",
            "\u{1}\u{1f}ab\ncd\tef\rgh\u{8}\u{c}",
        ] {
            same_as_serde_json(&Value::String(text.repeat(5)));
        }
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        same_as_serde_json(&json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "echo", "arguments": {
                "text": "a \"quoted\"\nline", "n": -1.5e-7, "big": u64::MAX, "neg": i64::MIN,
                "float": 0.1, "whole": 3.0, "list": [null, true, false, [], {}, [1, [2, {"k\u{0}": "v"}]]],
            }},
        }));
        same_as_serde_json(&json!(null));
        same_as_serde_json(&json!([]));
    }
}
