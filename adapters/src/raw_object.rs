//! A JSON object passed on unread (a tool's result, a call's params): its bytes,
//! kept in the buffer they arrived in, with its top-level members found by the same
//! skim that found its end. A relay looks at a few members (`isError`, `_meta`,
//! `name`...) and passes the rest on; skimming once and copying nothing keeps a
//! megabyte message's cost to one scan of it.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;

/// An object as its sender wrote it: spacing and member order included. One that
/// spans lines is read instead: relayed as it is, it would break the line it goes on.
#[derive(Clone)]
pub struct RawObject {
    /// The message the object came in (or the object alone).
    message: Bytes,
    /// Where the object is in it, from `{` to `}`.
    span: Range<usize>,
    /// Its members in order: each key's text (between its quotes; it has no escapes)
    /// and its value's.
    members: Vec<(Range<usize>, Range<usize>)>,
}

impl RawObject {
    /// Skims an object on its own. `None` unless it is an object with at least one
    /// member, no key that needs unescaping and none named twice (anything else is
    /// read instead).
    pub fn skim(text: impl Into<Bytes>) -> Option<RawObject> {
        let message = text.into();
        let skimmed = crate::skim::object(&message, None)?;
        RawObject::of(&message, skimmed.span, skimmed.members)
    }

    /// The object a skim of `message` found at `span`, with its `members`. `None`
    /// as for [`RawObject::skim`].
    pub fn of(
        message: &Bytes,
        span: Range<usize>,
        members: Vec<crate::skim::Member>,
    ) -> Option<RawObject> {
        // A key named twice is left to a reader to settle (readers keep the last).
        if members.is_empty() || named_twice(members.iter().map(|(name, _)| &message[name.clone()]))
        {
            return None;
        }
        if !one_line(message.get(span.clone())?) {
            return None;
        }
        Some(RawObject {
            message: message.clone(),
            span,
            members,
        })
    }

    /// The object's JSON text.
    pub fn bytes(&self) -> &[u8] {
        &self.message[self.span.clone()]
    }

    /// The JSON text of the member named `key`.
    pub fn member(&self, key: &str) -> Option<&[u8]> {
        self.members
            .iter()
            .find(|(name, _)| &self.message[name.clone()] == key.as_bytes())
            .map(|(_, value)| &self.message[value.clone()])
    }

    /// The object with the value of its member `key` (which it has) written as
    /// `value` (one JSON value, on one line), the rest as it was; `None` without
    /// such a member. One copy of the object, no second skim.
    pub fn with_member(&self, key: &str, value: &[u8]) -> Option<RawObject> {
        let at = self
            .members
            .iter()
            .position(|(name, _)| &self.message[name.clone()] == key.as_bytes())?;
        let old = self.members[at].1.clone();
        let mut bytes = Vec::with_capacity(self.span.len() - old.len() + value.len());
        bytes.extend_from_slice(&self.message[self.span.start..old.start]);
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(&self.message[old.end..self.span.end]);
        // Ranges move to the object's own buffer; those after the value, by the change.
        let moved = |position: usize| {
            let position = position - self.span.start;
            if position >= old.end - self.span.start {
                position + value.len() - old.len()
            } else {
                position
            }
        };
        let members = self
            .members
            .iter()
            .enumerate()
            .map(|(index, (name, member))| {
                let value_range = if index == at {
                    moved(member.start)..moved(member.start) + value.len()
                } else {
                    moved(member.start)..moved(member.end)
                };
                (moved(name.start)..moved(name.end), value_range)
            })
            .collect();
        Some(RawObject {
            span: 0..bytes.len(),
            message: Bytes::from(bytes),
            members,
        })
    }

    /// The object without its member `key`, the rest as it was; `None` without
    /// such a member, or when it is the only one. One copy, no second skim.
    pub fn without_member(&self, key: &str) -> Option<RawObject> {
        let at = self
            .members
            .iter()
            .position(|(name, _)| &self.message[name.clone()] == key.as_bytes())?;
        // From its key's opening quote to the next key's, or, for the last member,
        // from the end of the value before it: the separators go with it.
        let cut = match (self.members.get(at + 1), at.checked_sub(1)) {
            (Some((next, _)), _) => self.members[at].0.start - 1..next.start - 1,
            (None, Some(before)) => self.members[before].1.end..self.members[at].1.end,
            (None, None) => return None,
        };
        let mut bytes = Vec::with_capacity(self.span.len() - cut.len());
        bytes.extend_from_slice(&self.message[self.span.start..cut.start]);
        bytes.extend_from_slice(&self.message[cut.end..self.span.end]);
        let moved = |position: usize| {
            if position >= cut.end {
                position - cut.len() - self.span.start
            } else {
                position - self.span.start
            }
        };
        let members = self
            .members
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != at)
            .map(|(_, (name, value))| {
                (
                    moved(name.start)..moved(name.end),
                    moved(value.start)..moved(value.end),
                )
            })
            .collect();
        Some(RawObject {
            span: 0..bytes.len(),
            message: Bytes::from(bytes),
            members,
        })
    }

    /// Reads the object into a value. Skimming checks less than reading (a lone
    /// surrogate escape passes it), so this may fail.
    pub fn read(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(self.bytes())
    }
}

impl fmt::Debug for RawObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawObject")
            .field(&String::from_utf8_lossy(self.bytes()))
            .finish()
    }
}

/// One member of a request's params passed on as its sender wrote it (a tool
/// call's arguments of many kilobytes): the rest of the params are values, this
/// member's value stays the JSON text it arrived as, in the buffer it arrived in.
#[derive(Clone)]
pub struct WrittenMember {
    key: &'static str,
    text: Bytes,
}

impl WrittenMember {
    /// `text` must be one JSON value (a skim found it); it is written out as it is.
    /// `None` if a `\u` escape in it names half a surrogate pair: a skim lets that
    /// pass, a reader refuses it, and some upstreams drop such a message unanswered.
    /// `None` too if it spans lines (see [`RawObject`]).
    pub fn new(key: &'static str, text: Bytes) -> Option<WrittenMember> {
        (one_line(&text) && crate::escapes::lone_surrogate(&text).is_none())
            .then_some(WrittenMember { key, text })
    }

    /// The member's key.
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// The value's JSON text.
    pub fn text(&self) -> &[u8] {
        &self.text
    }

    /// Reads the value. Skimming checks less than reading (nesting deeper than a
    /// reader goes passes it), so this may fail.
    pub fn read(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.text)
    }
}

impl fmt::Debug for WrittenMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrittenMember")
            .field("key", &self.key)
            .field("bytes", &self.text.len())
            .finish()
    }
}

/// Whether `text` has no line break. In JSON one can only be spacing between
/// tokens (a pretty-printed body's), and what is passed on unread must fit in one
/// line of newline-delimited JSON or one `data:` line of an event stream.
fn one_line(text: &[u8]) -> bool {
    memchr::memchr2(b'\n', b'\r', text).is_none()
}

/// Whether two of an object's keys are the same. A few are compared pairwise; many
/// (a hostile sender's hundred thousand) go through a set, so this stays linear.
pub fn named_twice<'k>(keys: impl ExactSizeIterator<Item = &'k [u8]> + Clone) -> bool {
    const PAIRWISE: usize = 16;
    if keys.len() <= PAIRWISE {
        return keys
            .clone()
            .enumerate()
            .any(|(index, key)| keys.clone().take(index).any(|earlier| earlier == key));
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    !keys.into_iter().all(|key| seen.insert(key))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_cut_out_with_its_separators_and_the_rest_kept_as_written() {
        let message = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result": { "resultType" : "complete","a":[2, {"b":3}] ,"c":"x" } }"#,
        );
        let Some(skimmed) = crate::skim::object(&message, Some("result")) else {
            panic!("not skimmed");
        };
        let span = skimmed.members[2].1.clone();
        let Some(members) = skimmed.inner else {
            panic!("no inner members");
        };
        let Some(raw) = RawObject::of(&message, span, members) else {
            panic!("not raw");
        };
        let Some(first) = raw.without_member("resultType") else {
            panic!("first not cut");
        };
        assert_eq!(first.bytes(), br#"{ "a":[2, {"b":3}] ,"c":"x" }"#);
        assert_eq!(first.member("c"), Some(&b"\"x\""[..]));
        assert_eq!(first.member("a"), Some(&br#"[2, {"b":3}]"#[..]));
        let Some(last) = raw.without_member("c") else {
            panic!("last not cut");
        };
        assert_eq!(
            last.bytes(),
            br#"{ "resultType" : "complete","a":[2, {"b":3}] }"#
        );
        assert_eq!(last.member("resultType"), Some(&b"\"complete\""[..]));
        let Some(middle) = raw.without_member("a") else {
            panic!("middle not cut");
        };
        assert_eq!(middle.bytes(), br#"{ "resultType" : "complete","c":"x" }"#);
        assert_eq!(middle.member("c"), Some(&b"\"x\""[..]));
        assert!(raw.without_member("absent").is_none());
        let Some(only) = RawObject::skim(&br#"{"a":1}"#[..]) else {
            panic!("not skimmed");
        };
        assert!(
            only.without_member("a").is_none(),
            "an object is never emptied"
        );
        // Cut twice, each result still reads as the object less what was cut.
        let Some(twice) = first.without_member("c") else {
            panic!("not cut twice");
        };
        assert_eq!(
            twice.read().ok(),
            Some(serde_json::json!({"a": [2, {"b": 3}]}))
        );
    }

    #[test]
    fn a_result_is_found_with_its_members_as_written() {
        let message = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result": { "b" : 1,"a":[2, {"b":3}] ,"c":"x" } }"#,
        );
        let skimmed = crate::skim::object(&message, Some("result"));
        let Some(skimmed) = skimmed else {
            panic!("not skimmed");
        };
        let span = skimmed.members[2].1.clone();
        let result = skimmed
            .inner
            .and_then(|members| RawObject::of(&message, span, members));
        let Some(result) = result else {
            panic!("not skimmed");
        };
        assert_eq!(result.bytes(), br#"{ "b" : 1,"a":[2, {"b":3}] ,"c":"x" }"#);
        assert_eq!(result.member("a"), Some(&br#"[2, {"b":3}]"#[..]));
        assert_eq!(result.member("b"), Some(&b"1"[..]));
        assert_eq!(result.member("c"), Some(&br#""x""#[..]));
        assert_eq!(result.member("d"), None);
        assert_eq!(
            result.read().ok(),
            Some(serde_json::json!({"b": 1, "a": [2, {"b": 3}], "c": "x"}))
        );
    }

    #[test]
    fn a_member_is_written_anew_and_the_rest_stays_as_written() {
        let message = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result": { "a" : [1], "_meta":{"x":1} ,"c":"z" } }"#,
        );
        let skimmed = crate::skim::object(&message, Some("result")).unwrap();
        let span = skimmed.members[2].1.clone();
        let raw = RawObject::of(&message, span, skimmed.inner.unwrap()).unwrap();
        for value in [&br#"{"y":"longer than before"}"#[..], b"0"] {
            let changed = raw.with_member("_meta", value).unwrap();
            let expected = format!(
                r#"{{ "a" : [1], "_meta":{} ,"c":"z" }}"#,
                String::from_utf8_lossy(value)
            );
            assert_eq!(changed.bytes(), expected.as_bytes());
            assert_eq!(changed.member("_meta"), Some(value));
            assert_eq!(changed.member("a"), Some(&b"[1]"[..]));
            assert_eq!(changed.member("c"), Some(&br#""z""#[..]));
            // The ranges are those a skim of the new text finds.
            let again = RawObject::skim(Bytes::from(expected)).unwrap();
            assert_eq!(changed.members, again.members);
        }
        assert!(raw.with_member("absent", b"1").is_none());
    }

    #[test]
    fn many_members_are_checked_for_repeats_in_linear_time() {
        let object = |keys: &mut dyn Iterator<Item = usize>| {
            let members: Vec<String> = keys.map(|k| format!("\"k{k}\":{k}")).collect();
            format!("{{{}}}", members.join(","))
        };
        let distinct = RawObject::skim(object(&mut (0..100_000)));
        assert!(distinct.is_some_and(|o| o.member("k99999") == Some(&b"99999"[..])));
        let repeated = object(&mut (0..100_000).chain(std::iter::once(5)));
        assert!(RawObject::skim(repeated).is_none());
    }

    #[test]
    fn a_member_with_half_a_surrogate_pair_is_refused() {
        let member =
            |text: &str| WrittenMember::new("arguments", Bytes::from(text.to_string())).is_some();
        assert!(member(
            r#"{"t":"plain \\u escaped \" \u00e9 \ud83d\ude00 \\ud800"}"#
        ));
        for lone in [
            r#"{"t":"\ud800"}"#,
            r#"{"t":"\ud800x"}"#,
            r#"{"t":"\uD800\u0041"}"#,
            r#"{"t":"\udc00"}"#,
            r#"{"t":"\\\ud800"}"#,
        ] {
            assert!(!member(lone), "{lone}");
        }
        assert!(!member("{\"t\":\n\"x\"}"));
        // Each escape is checked, not just the first.
        assert!(!member(r#"{"a":"\ud83d\ude00","b":"\n\ude00"}"#));
    }

    #[test]
    fn only_objects_with_plain_keys_are_skimmed() {
        assert!(RawObject::skim(&b"{\"a\":1}"[..]).is_some());
        assert!(RawObject::skim(&b" \n {\"a\" :1\t}\r\n"[..])
            .is_some_and(|r| r.bytes() == b"{\"a\" :1\t}"));
        for text in [
            &b"{}"[..],
            b"{ }",
            b"[1]",
            b"null",
            b"{\"\\u0061\":1}",
            b"{\"a\":1",
            b"{\"a\":}",
            b"{\"a\":1,\"a\":2}",
            // Pretty-printed: relayed as it is, it would break its line.
            b"{\n  \"a\": 1\n}",
            b"{\"a\":\r[1]}",
        ] {
            assert!(
                RawObject::skim(text).is_none(),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
