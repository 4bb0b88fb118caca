//! `\u` escapes that name half a UTF-16 surrogate pair without its other half.
//!
//! JSON's grammar allows them; UTF-8 cannot carry what they stand for, and strict
//! readers (serde_json, so rmcp) refuse the whole message. JavaScript writes one
//! whenever a string is cut inside a pair (`text.slice(0, n)` through an emoji),
//! and lenient readers take it. An upstream's message gets U+FFFD in their place,
//! as Go's decoder and a browser's do: a reader of any strictness can then take it,
//! unread or read.

use memchr::memmem;

/// Where the first lone surrogate escape in `text` starts (its backslash), if any.
/// `text` need not be valid JSON: a backslash that another escapes starts nothing,
/// and an escape without four hex digits is left to a reader to refuse.
pub fn lone_surrogate(text: &[u8]) -> Option<usize> {
    lone_surrogate_from(text, 0)
}

/// Each lone surrogate escape in `text` replaced by `\ufffd`, the same length, so
/// every other byte keeps its place; `None` when there is none.
pub fn repair_lone_surrogates(text: &[u8]) -> Option<Vec<u8>> {
    let first = lone_surrogate(text)?;
    let mut repaired = text.to_vec();
    let mut at = Some(first);
    while let Some(start) = at {
        repaired[start..start + ESCAPE].copy_from_slice(REPLACEMENT);
        at = lone_surrogate_from(text, start + ESCAPE);
    }
    Some(repaired)
}

/// `\uXXXX`.
const ESCAPE: usize = 6;
/// U+FFFD REPLACEMENT CHARACTER, escaped.
const REPLACEMENT: &[u8; ESCAPE] = b"\\ufffd";

fn lone_surrogate_from(text: &[u8], from: usize) -> Option<usize> {
    // Most text has no backslash at all: one memchr pass (several times faster
    // than the two-byte search) settles it.
    let from = from + memchr::memchr(b'\\', text.get(from..)?)?;
    // Past a pair's low half, which the finder would otherwise meet again.
    let mut skip_to = from;
    for found in memmem::find_iter(&text[from..], b"\\u") {
        let start = from + found;
        if start < skip_to || escaped(text, start) {
            continue;
        }
        match unit(text, start) {
            Some(0xD800..=0xDBFF) => {
                if unit(text, start + ESCAPE).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) {
                    skip_to = start + 2 * ESCAPE;
                } else {
                    return Some(start);
                }
            }
            Some(0xDC00..=0xDFFF) => return Some(start),
            _ => {}
        }
    }
    None
}

/// Whether the backslash at `at` is itself escaped: an odd run of backslashes
/// ends just before it.
fn escaped(text: &[u8], at: usize) -> bool {
    text[..at].iter().rev().take_while(|b| **b == b'\\').count() % 2 == 1
}

/// The code unit of the `\uXXXX` escape at `at`, if there is one.
fn unit(text: &[u8], at: usize) -> Option<u16> {
    let escape = text.get(at..at + ESCAPE)?;
    if &escape[..2] != b"\\u" {
        return None;
    }
    let digits = std::str::from_utf8(&escape[2..]).ok()?;
    // from_str_radix takes a sign; an escape does not.
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_plain_escapes_and_escaped_backslashes_are_not_lone() {
        for text in [
            r#"{"t":"plain"}"#,
            r#"{"t":"\u00e9 \ud83d\ude00 \uD83D\uDE00"}"#,
            r#"{"t":"\\ud800"}"#,
            r#"{"t":"\\\\ud800 \\\"\\ud800"}"#,
            r#"{"t":"\u12"}"#,
            r#"{"t":"\u+d80"}"#,
        ] {
            assert_eq!(lone_surrogate(text.as_bytes()), None, "{text}");
            assert_eq!(repair_lone_surrogates(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn each_lone_half_becomes_a_replacement_character() {
        for (text, repaired) in [
            (r#""\ud800""#, r#""\ufffd""#),
            (r#""\ud83dx""#, r#""\ufffdx""#),
            (r#""\uD800\u0041""#, r#""\ufffd\u0041""#),
            (r#""\udc00""#, r#""\ufffd""#),
            (r#""\\\ud800""#, r#""\\\ufffd""#),
            (r#""\ud800\ud83d\ude00""#, r#""\ufffd\ud83d\ude00""#),
            (
                r#""\ud83d\ude00\ude00 \ud800""#,
                r#""\ud83d\ude00\ufffd \ufffd""#,
            ),
            (r#""\ud800"#, r#""\ufffd"#),
        ] {
            let fixed = repair_lone_surrogates(text.as_bytes());
            assert_eq!(fixed.as_deref(), Some(repaired.as_bytes()), "{text}");
            if text.len() > 1 && text.ends_with('"') {
                assert!(
                    serde_json::from_str::<String>(repaired).is_ok(),
                    "{repaired}"
                );
            }
        }
        let text = r#"{"a":"\ud83d\ude00","b":"\n\ude00"}"#;
        assert_eq!(lone_surrogate(text.as_bytes()), text.rfind(r"\ude00"));
    }

    #[test]
    fn text_that_is_not_json_is_scanned_without_panicking() {
        for text in [
            &b"\\"[..],
            b"\\u",
            b"\\ud8",
            b"\\ud800\\",
            b"\\ud800\\u",
            b"\xff\\u\xffd800",
        ] {
            // Mended in place or left alone: nothing moves.
            assert!(repair_lone_surrogates(text).is_none_or(|mended| mended.len() == text.len()));
        }
        // An even run of backslashes escapes itself; an odd one ends in an escape.
        let long = "\\".repeat(100_000) + "ud800";
        assert_eq!(lone_surrogate(long.as_bytes()), None);
        let long = "\\".repeat(100_001) + "ud800";
        assert_eq!(lone_surrogate(long.as_bytes()), Some(100_000));
    }
}
