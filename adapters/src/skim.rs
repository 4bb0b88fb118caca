//! One pass over a JSON object that checks its syntax as serde_json checks what it
//! skips, and finds its top-level members (and, for one of them, that object's
//! members) without building a value.
//!
//! A relay passes a tool call's arguments and its result on unread, but must know
//! they are JSON. serde_json skims a string eight bytes at a time, looking at each
//! for a quote, a backslash or a control character (about 2.5 instructions a
//! byte); here `memchr` finds the next quote or backslash (32 bytes at a time) and
//! a loop the compiler vectorises looks for control characters between: a
//! megabyte message's skim is a few times cheaper. What serde_json refuses, this
//! refuses, nesting deeper than its limit included (a peer reading the message
//! with serde_json could not answer it); a `tests` module checks that on many
//! random texts.

use std::ops::Range;

/// A member: its key's text (between the quotes; it has no escapes) and its value's.
pub type Member = (Range<usize>, Range<usize>);

/// What [`object`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Skimmed {
    /// The object, from `{` to `}`.
    pub span: Range<usize>,
    pub members: Vec<Member>,
    /// The members of the member named as `descend`, when its value is an object
    /// (the last such member, if it is named twice).
    pub inner: Option<Vec<Member>>,
}

/// Skims `text`: one JSON object, with nothing but whitespace around it, valid
/// UTF-8, every value's syntax checked. `None` if it is anything else, or if a key
/// of the object (or of `descend`'s object) has an escape: a reader handles those.
pub fn object(text: &[u8], descend: Option<&str>) -> Option<Skimmed> {
    std::str::from_utf8(text).ok()?;
    let mut scan = Scanner {
        text,
        at: 0,
        depth: 0,
    };
    scan.whitespace();
    let start = scan.at;
    let mut inner = None;
    let members = scan.members(descend.map(str::as_bytes), &mut inner)?;
    let span = start..scan.at;
    scan.whitespace();
    (scan.at == text.len()).then_some(Skimmed {
        span,
        members,
        inner,
    })
}

/// How many objects and arrays may be open at once: serde_json refuses the 128th
/// (its recursion limit), and so do most readers an upstream or client uses.
const MAX_DEPTH: usize = 127;

struct Scanner<'t> {
    text: &'t [u8],
    at: usize,
    /// How many objects [`Scanner::members`] has open around `at`.
    depth: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The object at `at`, recording its members; `descend` names one whose
    /// object's members go to `inner` too (one level: `descend` is not passed on).
    fn members(
        &mut self,
        descend: Option<&[u8]>,
        inner: &mut Option<Vec<Member>>,
    ) -> Option<Vec<Member>> {
        if self.peek()? != b'{' || self.depth == MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        self.at += 1;
        self.whitespace();
        let mut members = Vec::with_capacity(4);
        if self.peek()? == b'}' {
            self.at += 1;
            self.depth -= 1;
            return Some(members);
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let key_start = self.at + 1;
            if self.string()? {
                return None;
            }
            let key = key_start..self.at - 1;
            self.colon()?;
            let value_start = self.at;
            if descend.is_some_and(|name| &self.text[key.clone()] == name) && self.peek()? == b'{' {
                *inner = Some(self.members(None, &mut None)?);
            } else {
                self.value()?;
            }
            members.push((key, value_start..self.at));
            self.whitespace();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.whitespace();
                }
                b'}' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Some(members);
                }
                _ => return None,
            }
        }
    }

    /// Whitespace, `:` and whitespace, after a key.
    fn colon(&mut self) -> Option<()> {
        self.whitespace();
        if self.peek()? != b':' {
            return None;
        }
        self.at += 1;
        self.whitespace();
        Some(())
    }

    /// A key at `at` (a string), then its colon.
    fn key(&mut self) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        self.string()?;
        self.colon()
    }

    /// One value at `at`, nested ones without recursion (a stack of what is
    /// open), so no depth overflows the stack before [`MAX_DEPTH`] refuses it.
    fn value(&mut self) -> Option<()> {
        let mut open: Vec<u8> = Vec::new();
        loop {
            let next = self.peek()?;
            if matches!(next, b'{' | b'[') && self.depth + open.len() == MAX_DEPTH {
                return None;
            }
            match next {
                b'{' => {
                    self.at += 1;
                    self.whitespace();
                    if self.peek()? == b'}' {
                        self.at += 1;
                    } else {
                        open.push(b'}');
                        self.key()?;
                        continue;
                    }
                }
                b'[' => {
                    self.at += 1;
                    self.whitespace();
                    if self.peek()? == b']' {
                        self.at += 1;
                    } else {
                        open.push(b']');
                        continue;
                    }
                }
                b'"' => {
                    self.string()?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return None,
            }
            // A value ended: close what it ends, up to the next element.
            loop {
                let Some(&close) = open.last() else {
                    return Some(());
                };
                self.whitespace();
                let next = self.peek()?;
                if next == close {
                    self.at += 1;
                    open.pop();
                } else if next == b',' {
                    self.at += 1;
                    self.whitespace();
                    if close == b'}' {
                        self.key()?;
                    }
                    break;
                } else {
                    return None;
                }
            }
        }
    }

    /// A string at `at` (its opening quote); whether it has an escape.
    fn string(&mut self) -> Option<bool> {
        self.at += 1;
        let mut escaped = false;
        loop {
            let rest = &self.text[self.at..];
            let found = memchr::memchr2(b'"', b'\\', rest)?;
            if has_control(&rest[..found]) {
                return None;
            }
            self.at += found;
            if rest[found] == b'"' {
                self.at += 1;
                return Some(escaped);
            }
            escaped = true;
            match self.text.get(self.at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                b'u' => {
                    let digits = self.text.get(self.at + 2..self.at + 6)?;
                    if !digits.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    self.at += 6;
                }
                _ => return None,
            }
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, within a float's range.
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => {
                self.at += 1;
                // One leading zero only.
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        let integer_digits = self.at - start;
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        } else if integer_digits < 20 {
            // No exponent and short: an integer or a float of modest size.
            return Some(());
        }
        // `1e999`, or an integer beyond 64 bits (read as a float): a reader refuses
        // one that is infinite, so an upstream could not read the call to answer
        // it. Rare: serde_json, which readers are held to, judges it.
        serde_json::from_slice::<serde_json::Number>(&self.text[start..self.at])
            .is_ok()
            .then_some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.text.get(self.at..self.at + word.len())? != word {
            return None;
        }
        self.at += word.len();
        Some(())
    }
}

/// Whether `bytes` holds a control character (below 0x20), which a JSON string may
/// not. Looked at in blocks the compiler turns into vector compares.
fn has_control(bytes: &[u8]) -> bool {
    const BLOCK: usize = 32;
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        if block.iter().fold(false, |seen, &b| seen | (b < 0x20)) {
            return true;
        }
    }
    blocks.remainder().iter().any(|&b| b < 0x20)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    /// The reference: an object's members as serde_json skims them, keys borrowed
    /// (so without escapes), values unread.
    struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

    impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Skim<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for Skim<'a> {
                type Value = Members<'a>;

                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }

                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'a>, A::Error> {
                    let mut members = Vec::new();
                    while let Some(key) = map.next_key::<&'de str>()? {
                        members.push((key, map.next_value::<&'de RawValue>()?));
                    }
                    Ok(Members(members))
                }
            }
            deserializer.deserialize_map(Skim(std::marker::PhantomData))
        }
    }

    /// What serde_json makes of `text` as a skimmed object: each member's key and
    /// value text; `None` where it refuses it, or where reading a value would
    /// refuse a number in it as out of range (a skim refuses that too).
    fn serde_members(text: &[u8]) -> Option<Vec<(String, String)>> {
        let members = serde_json::from_slice::<Members>(text).ok()?;
        let out_of_range = |value: &RawValue| {
            serde_json::from_str::<serde_json::Value>(value.get())
                .is_err_and(|error| error.to_string().contains("number out of range"))
        };
        if members.0.iter().any(|(_, value)| out_of_range(value)) {
            return None;
        }
        Some(
            members
                .0
                .iter()
                .map(|(key, value)| (key.to_string(), value.get().to_string()))
                .collect(),
        )
    }

    fn our_members(text: &[u8]) -> Option<Vec<(String, String)>> {
        let skimmed = object(text, None)?;
        let piece = |range: &Range<usize>| String::from_utf8(text[range.clone()].to_vec()).unwrap();
        Some(
            skimmed
                .members
                .iter()
                .map(|(key, value)| (piece(key), piece(value)))
                .collect(),
        )
    }

    /// A small deterministic generator (xorshift), so a failure can be replayed.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn value(&mut self, depth: usize) -> serde_json::Value {
            use serde_json::Value;
            let kinds = if depth == 0 { 5 } else { 7 };
            match self.below(kinds) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 0),
                2 => match self.below(3) {
                    0 => Value::from(self.next() as i64 >> self.below(60)),
                    1 => Value::from((self.next() % 100_000) as f64 / 7.0),
                    _ => Value::from(-((self.next() % 1000) as f64) * 1e-9),
                },
                3 | 4 => Value::String(self.text()),
                5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
                _ => Value::Object(
                    (0..self.below(4))
                        .map(|_| (self.key(), self.value(depth - 1)))
                        .collect(),
                ),
            }
        }

        /// Mostly a key without escapes (the skim's own case), now and then any text.
        fn key(&mut self) -> String {
            if self.below(6) == 0 {
                return self.text();
            }
            const PIECES: [&str; 6] = ["a", "key", "tool", " ", "é", "😀"];
            (0..self.below(4))
                .map(|_| PIECES[self.below(PIECES.len())])
                .collect()
        }

        fn text(&mut self) -> String {
            const PIECES: [&str; 12] = [
                "a", "key", " ", "\"", "\\", "/", "\n", "\u{1}", "é", "😀", "\u{7f}", "tool",
            ];
            (0..self.below(6))
                .map(|_| PIECES[self.below(PIECES.len())])
                .collect()
        }
    }

    /// Bytes a mutation puts in: JSON's own, and what breaks it.
    const NOISE: &[u8] = b"\"\\{}[],:0123456789-+.eE \n\t\r\x01\x1f\x7funtrfalsx\xc3\xa9\xff";

    #[test]
    fn random_texts_are_taken_or_refused_as_serde_json_does() {
        let mut random = Random(0x9E37_79B9_7F4A_7C15);
        let mut taken = 0;
        for case in 0..60_000 {
            let mut members = serde_json::Map::new();
            for _ in 0..random.below(5) {
                members.insert(random.key(), random.value(3));
            }
            let value = serde_json::Value::Object(members);
            let mut text = if random.below(4) == 0 {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            };
            for _ in 0..random.below(3) {
                if text.is_empty() {
                    break;
                }
                let at = random.below(text.len());
                let noise = NOISE[random.below(NOISE.len())];
                match random.below(4) {
                    0 => text[at] = noise,
                    1 => text.insert(at, noise),
                    2 => {
                        text.remove(at);
                    }
                    _ => text.truncate(at),
                }
            }
            let expected = serde_members(&text);
            assert_eq!(
                our_members(&text),
                expected,
                "case {case}: {:?}",
                String::from_utf8_lossy(&text)
            );
            taken += usize::from(expected.is_some());
        }
        // Both sides of the comparison were exercised.
        assert!(taken > 20_000 && taken < 59_000, "{taken} taken");
    }

    #[test]
    fn edge_cases_match_serde_json() {
        for text in [
            &b"{}"[..],
            b" {} ",
            b"{\"a\":01}",
            b"{\"a\":-}",
            b"{\"a\":1.}",
            b"{\"a\":1e}",
            b"{\"a\":1e+5,\"b\":-0.0E-0}",
            // Beyond a float's range (refused), and below it (zero: taken).
            b"{\"a\":1e999}",
            b"{\"a\":[-1.5E+400]}",
            b"{\"a\":1e-999,\"b\":18446744073709551616}",
            b"{\"a\":177777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777}",
            b"{\"a\":[1,]}",
            b"{\"a\":{\"b\":1,}}",
            b"{\"a\":[,1]}",
            b"{\"a\":tru}",
            b"{\"a\":nul}",
            b"{\"a\":\"\\u12g4\"}",
            b"{\"a\":\"\\ud800\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\x1f\"}",
            b"{\"a\":\"\x7f\"}",
            b"{\"\\u0061\":1}",
            b"{\"a\":{\"\\u0061\":1}}",
            b"{\"a\":1}x",
            b"{\"a\":1}}",
            b"{\"a\" 1}",
            b"{\"a\":1 \"b\":2}",
            b"{\"a\":\"\xff\"}",
            b"[1]",
            b"",
            b"{\"a\":1,\"a\":2}",
        ] {
            assert_eq!(
                our_members(text),
                serde_members(text),
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn nesting_is_refused_where_serde_json_refuses_it() {
        // Arrays, objects, objects in the member looked into, and empty arrays.
        let shapes = [
            ("{\"a\":", "[", "1", "]"),
            ("{\"a\":", "{\"b\":", "1", "}"),
            ("{\"result\":", "{\"b\":", "1", "}"),
            ("{\"a\":", "[", "", "]"),
        ];
        for (head, open, innermost, close) in shapes {
            let mut accepted = 0;
            for depth in 120..135 {
                let text = format!(
                    "{head}{}{innermost}{}}}",
                    open.repeat(depth),
                    close.repeat(depth)
                );
                let text = text.as_bytes();
                // serde_json reading the message, not skimming it into a
                // `RawValue` (which counts no depth), is what the peer does.
                let ours = object(text, Some("result")).is_some();
                let serde = serde_json::from_slice::<serde_json::Value>(text).is_ok();
                assert_eq!(ours, serde, "{head}{open} × {depth}");
                accepted += usize::from(ours);
            }
            // Both sides of the limit were tried.
            assert!(
                accepted > 0 && accepted < 15,
                "{head}{open}: {accepted} accepted"
            );
        }
    }

    #[test]
    fn one_member_is_looked_into_and_depth_costs_no_stack() {
        let text = br#"{"id":1, "result" : { "content":[{"t":"x"}], "isError":false }, "x":[]}"#;
        let skimmed = object(text, Some("result")).unwrap();
        let inner = skimmed.inner.unwrap();
        let key = |(key, _): &Member| &text[key.clone()];
        assert_eq!(
            inner.iter().map(key).collect::<Vec<_>>(),
            [&b"content"[..], b"isError"]
        );
        assert_eq!(&text[inner[1].1.clone()], b"false");
        assert_eq!(
            &text[skimmed.members[1].1.clone()],
            br#"{ "content":[{"t":"x"}], "isError":false }"#
        );
        // Not an object: nothing to look into.
        assert_eq!(
            object(br#"{"result":[1]}"#, Some("result")).unwrap().inner,
            None
        );
        // An escaped key one level in is left to a reader, as at the top.
        assert!(object(br#"{"result":{"\u0061":1}}"#, Some("result")).is_none());
        // Refused as serde_json refuses it, without a stack as deep.
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200_000), "]".repeat(200_000));
        assert!(object(deep.as_bytes(), None).is_none());
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(1 << 20));
        assert_eq!(
            object(long.as_bytes(), None).unwrap().members[0].1,
            5..long.len() - 1
        );
    }
}
