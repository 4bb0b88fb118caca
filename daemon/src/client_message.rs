//! A client's message as a front reads it: a JSON value, but for a tool call's
//! arguments of a kilobyte or more, which stay the text the client wrote and go to
//! the upstream as they are (plexus reads them only where it must look inside
//! them: the audit trail's hash, and parameters a tool mirrors into headers), and
//! for a 2026-07-28 request's client capabilities and info in `_meta`, which a
//! front serving the request takes out: the capabilities are read once per
//! distinct text (a client sends the same with every request), the info not at all.

use std::cell::Cell;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use adapters::raw_object::named_twice;
use adapters::WrittenMember;
use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::era::{META_CLIENT_CAPABILITIES, META_CLIENT_INFO};
use crate::jsonrpc::RelayError;

/// Arguments shorter than this are read with the rest of the message: reading a
/// few hundred bytes costs about what skimming them does.
const UNREAD_ARGUMENTS_MIN: usize = 1024;

/// One message from a client.
#[derive(Debug)]
pub struct ClientMessage {
    pub message: Value,
    /// A `tools/call` request's `params.arguments`, left out of `message`.
    pub arguments: Option<WrittenMember>,
    /// A request's `params._meta` client capabilities (an object), left out of
    /// `message` with the client info beside them; only [`ClientMessage::read_served`]
    /// takes them out.
    pub capabilities: Option<Arc<Value>>,
}

impl From<Value> for ClientMessage {
    fn from(message: Value) -> ClientMessage {
        ClientMessage {
            message,
            arguments: None,
            capabilities: None,
        }
    }
}

impl ClientMessage {
    /// Reads a message to pass on whole. A tool call's large arguments object is
    /// skimmed, not read: one scan finds where it is and checks its syntax.
    pub fn read(bytes: Bytes) -> Result<ClientMessage, serde_json::Error> {
        ClientMessage::read_paired(with_paired_surrogates(bytes))
    }

    /// [`ClientMessage::read`] of a message without lone surrogate escapes.
    fn read_paired(bytes: Bytes) -> Result<ClientMessage, serde_json::Error> {
        if bytes.len() >= UNREAD_ARGUMENTS_MIN {
            if let Some(read) = skim_call(&bytes) {
                return Ok(read);
            }
        }
        serde_json::from_slice::<Value>(&bytes).map(ClientMessage::from)
    }

    /// Reads a message plexus serves: as [`ClientMessage::read`], and a request's
    /// client capabilities and info are taken out of its `_meta` (the capabilities
    /// through `known`). A message of `UNREAD_ARGUMENTS_MIN` bytes or more keeps
    /// them: the checks find them where the client put them.
    pub fn read_served(
        bytes: Bytes,
        known: &KnownCapabilities,
    ) -> Result<ClientMessage, serde_json::Error> {
        let bytes = with_paired_surrogates(bytes);
        if bytes.len() >= UNREAD_ARGUMENTS_MIN {
            return ClientMessage::read_paired(bytes);
        }
        read_without_client_fields(&bytes, known)
    }

    /// Puts the arguments, read, back into the message's params (an object: the
    /// skim found them there).
    pub fn read_arguments(&mut self) -> Result<(), RelayError> {
        let Some(arguments) = self.arguments.take() else {
            return Ok(());
        };
        match self.message.get_mut("params") {
            Some(Value::Object(params)) => put_back(params, &arguments),
            _ => Ok(()),
        }
    }
}

/// A client's message with each `\u` escape naming half a UTF-16 surrogate pair made
/// U+FFFD, as an upstream's is (`adapters::escapes`). JavaScript writes one for a
/// string cut inside an emoji, and no reader of UTF-8 takes it: refused, the message
/// could only be answered with a parse error whose id is null, which no client
/// matches to its request (it would wait for good). Mended, it is answered.
fn with_paired_surrogates(bytes: Bytes) -> Bytes {
    match adapters::escapes::repair_lone_surrogates(&bytes) {
        Some(repaired) => {
            tracing::debug!("a client escaped half a UTF-16 surrogate pair; read as U+FFFD");
            Bytes::from(repaired)
        }
        None => bytes,
    }
}

/// Reads arguments left unread and puts them back among the params they were
/// taken from, for plexus to look inside them.
pub fn put_back(
    params: &mut Map<String, Value>,
    arguments: &WrittenMember,
) -> Result<(), RelayError> {
    let value = arguments.read().map_err(|error| {
        RelayError::InvalidParams(format!("`{}` cannot be read: {error}", arguments.key()))
    })?;
    params.insert(arguments.key().into(), value);
    Ok(())
}

/// How many distinct capability texts a front remembers, and how long one may be.
const KNOWN_TEXTS: usize = 16;
const KNOWN_TEXT_MAX: usize = 4096;

/// Client capabilities a front read lately, by their text.
#[derive(Default)]
pub struct KnownCapabilities {
    recent: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    texts: Vec<(Box<[u8]>, Arc<Value>)>,
    /// The entry the next new text replaces, once there are `KNOWN_TEXTS`.
    next: usize,
}

impl KnownCapabilities {
    /// The value of `text`, read unless it was lately.
    fn read(&self, text: &[u8]) -> Result<Arc<Value>, serde_json::Error> {
        let mut known = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, value)) = known.texts.iter().find(|(seen, _)| **seen == *text) {
            return Ok(value.clone());
        }
        let value = Arc::new(serde_json::from_slice::<Value>(text)?);
        if text.len() <= KNOWN_TEXT_MAX {
            let entry = (Box::from(text), value.clone());
            if known.texts.len() < KNOWN_TEXTS {
                known.texts.push(entry);
            } else {
                let next = known.next;
                known.texts[next] = entry;
                known.next = (next + 1) % KNOWN_TEXTS;
            }
        }
        Ok(value)
    }
}

/// A `tools/call` request whose arguments are an object of `UNREAD_ARGUMENTS_MIN`
/// bytes or more, read but for them; `None` for anything else (it is read whole).
fn skim_call(bytes: &Bytes) -> Option<ClientMessage> {
    // One pass: the message's members, and those of its params.
    let skimmed = adapters::skim::object(bytes, Some("params"))?;
    let text = |range: &Range<usize>| &bytes[range.clone()];
    let members = &skimmed.members;
    let method = members.iter().find(|(key, _)| text(key) == b"method")?;
    if text(&method.1) != b"\"tools/call\""
        || !members.iter().any(|(key, _)| text(key) == b"id")
        || named_twice(members.iter().map(|(key, _)| text(key)))
    {
        return None;
    }
    let params = skimmed.inner.as_ref()?;
    if named_twice(params.iter().map(|(key, _)| text(key))) {
        return None;
    }
    let arguments = params
        .iter()
        .find(|(key, _)| text(key) == b"arguments")
        .map(|(_, value)| value.clone())
        .filter(|value| value.len() >= UNREAD_ARGUMENTS_MIN && bytes[value.start] == b'{')?;
    // Keys have no escapes (the skim found them so): their text is the key.
    let key = |range: &Range<usize>| Some(std::str::from_utf8(text(range)).ok()?.to_string());
    let read = |range: &Range<usize>| serde_json::from_slice::<Value>(text(range)).ok();
    let mut message = Map::new();
    for (name, value) in members {
        let value = if text(name) == b"params" {
            Value::Object(
                params
                    .iter()
                    .filter(|(name, _)| text(name) != b"arguments")
                    .map(|(name, value)| Some((key(name)?, read(value)?)))
                    .collect::<Option<Map<_, _>>>()?,
            )
        } else {
            read(value)?
        };
        message.insert(key(name)?, value);
    }
    // Arguments a reader would refuse are read, and refused, with the message.
    let arguments = WrittenMember::new("arguments", bytes.slice(arguments))?;
    Some(ClientMessage {
        message: Value::Object(message),
        arguments: Some(arguments),
        capabilities: None,
    })
}

/// Reads a message as serde_json reads a `Value`, in the same single pass, but for
/// `params._meta`'s client capabilities (kept as written when they are an object,
/// for [`KnownCapabilities`]) and client info (checked, then dropped).
#[derive(Clone, Copy)]
struct Reader<'c, 'de> {
    level: Level,
    capabilities: &'c Cell<Option<&'de RawValue>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Message,
    Params,
    Meta,
}

impl<'de> DeserializeSeed<'de> for Reader<'_, 'de> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Reader<'_, 'de> {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let below = |level| Reader { level, ..self };
            let value = match (self.level, key.as_str()) {
                (Level::Message, "params") => map.next_value_seed(below(Level::Params))?,
                (Level::Params, "_meta") => map.next_value_seed(below(Level::Meta))?,
                (Level::Meta, META_CLIENT_INFO) => {
                    map.next_value::<IgnoredAny>()?;
                    members.shift_remove(&key);
                    continue;
                }
                (Level::Meta, META_CLIENT_CAPABILITIES) => {
                    let text = map.next_value::<&'de RawValue>()?;
                    // The last one named counts, as in a map; one that is not an
                    // object stays for the checks to refuse.
                    if text.get().starts_with('{') {
                        self.capabilities.set(Some(text));
                        members.shift_remove(&key);
                        continue;
                    }
                    self.capabilities.set(None);
                    serde_json::from_str(text.get()).map_err(serde::de::Error::custom)?
                }
                _ => map.next_value::<Value>()?,
            };
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// A message plexus serves, read in one pass with its client capabilities and
/// info left out of `_meta` (see [`Reader`]).
fn read_without_client_fields(
    bytes: &[u8],
    known: &KnownCapabilities,
) -> Result<ClientMessage, serde_json::Error> {
    let capabilities = Cell::new(None);
    let reader = Reader {
        level: Level::Message,
        capabilities: &capabilities,
    };
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let message = reader.deserialize(&mut deserializer)?;
    deserializer.end()?;
    let capabilities = match capabilities.get() {
        Some(text) => Some(known.read(text.get().as_bytes())?),
        None => None,
    };
    Ok(ClientMessage {
        message,
        arguments: None,
        capabilities,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(arguments: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"echo","arguments":{arguments},"_meta":{{"progressToken":"p"}}}}}}"#
        )
    }

    fn large(text: &str) -> String {
        format!(
            r#"{{ "text" : "{text}{}" , "n": [1, 2.5e3] }}"#,
            "x".repeat(2000)
        )
    }

    #[test]
    fn a_large_arguments_object_stays_as_written() {
        let arguments = large("caf\\u00e9 \\\"quoted\\\"");
        let text = call(&arguments);
        let read = ClientMessage::read(Bytes::from(text.clone())).unwrap();
        let written = read.arguments.as_ref().unwrap();
        assert_eq!(written.key(), "arguments");
        assert_eq!(written.text(), arguments.as_bytes());
        assert_eq!(
            read.message,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {"name": "echo", "_meta": {"progressToken": "p"}}})
        );
        // Read back, it is the message a reader makes of the whole text.
        let mut read = read;
        read.read_arguments().unwrap();
        assert!(read.arguments.is_none());
        assert_eq!(read.message, serde_json::from_str::<Value>(&text).unwrap());
    }

    #[test]
    fn anything_else_is_read_whole() {
        let big = large("y");
        let cases = [
            // Small arguments, arguments not an object, another method, a notification.
            call(r#"{"text":"short"}"#),
            call(&format!(r#"["{}"]"#, "x".repeat(2000))),
            call(&big).replace("tools/call", "prompts/get"),
            call(&big).replace(r#""id":3,"#, ""),
            // A key named twice, an escaped key, params not an object.
            call(&big).replace(r#""name":"echo""#, r#""name":"echo","name":"other""#),
            call(&big).replace(r#""id":3"#, r#""\u0069d":3"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[{big}]}}"#),
        ];
        for text in cases {
            let read = ClientMessage::read(Bytes::from(text.clone())).unwrap();
            assert!(read.arguments.is_none(), "{text}");
            assert_eq!(read.message, serde_json::from_str::<Value>(&text).unwrap());
        }
    }

    #[test]
    fn broken_json_is_a_parse_error_either_way() {
        let text = call(&large("z"));
        for broken in [&text[..text.len() - 1], &text.replace("\"n\"", "n")[..]] {
            assert!(ClientMessage::read(Bytes::from(broken.to_string())).is_err());
        }
    }

    #[test]
    fn half_a_surrogate_pair_is_read_as_a_replacement_character() {
        let known = KnownCapabilities::default();
        // Small arguments are read; large ones stay as written, mended alike; a
        // whole pair, and an escaped backslash before a `u`, are left as they are.
        let small = call(r#"{"text":"cut \ud83d here, \ud83d\ude00 kept, \\ud800 too"}"#);
        let large = call(&large(r"cut \\ud800 \udc00"));
        for read in [
            ClientMessage::read(Bytes::from(small.clone())).unwrap(),
            ClientMessage::read_served(Bytes::from(small), &known).unwrap(),
        ] {
            assert!(read.arguments.is_none());
            assert_eq!(
                read.message["params"]["arguments"]["text"],
                "cut \u{fffd} here, \u{1f600} kept, \\ud800 too"
            );
        }
        for read in [
            ClientMessage::read(Bytes::from(large.clone())).unwrap(),
            ClientMessage::read_served(Bytes::from(large), &known).unwrap(),
        ] {
            let written = read.arguments.as_ref().unwrap();
            let text = written.read().unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(text.starts_with("cut \\ud800 \u{fffd}x"), "{text:.40}");
        }
    }

    fn modern(meta: &str, arguments: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{{"name":"echo","arguments":{arguments},"_meta":{meta}}}}}"#
        )
    }

    const CAPABILITIES: &str = r#"{ "sampling" : {}, "roots": {"listChanged": true} }"#;

    fn meta_with(capabilities: &str) -> String {
        format!(
            r#"{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{capabilities},"io.modelcontextprotocol/clientInfo":{{"name":"c","version":"1"}},"progressToken":7}}"#
        )
    }

    /// The message a reader makes of `text`, without these members of `_meta`.
    fn read_without(text: &str, left_out: &[&str]) -> Value {
        let mut whole = serde_json::from_str::<Value>(text).unwrap();
        if let Some(meta) = whole["params"]["_meta"].as_object_mut() {
            for key in left_out {
                meta.shift_remove(*key);
            }
        }
        whole
    }

    const CLIENT_FIELDS: &[&str] = &[META_CLIENT_CAPABILITIES, META_CLIENT_INFO];

    #[test]
    fn a_served_request_leaves_its_client_fields_out_and_reads_capabilities_once() {
        let known = KnownCapabilities::default();
        let text = modern(&meta_with(CAPABILITIES), r#"{"text":"hi"}"#);
        let first = ClientMessage::read_served(Bytes::from(text.clone()), &known).unwrap();
        assert_eq!(first.message, read_without(&text, CLIENT_FIELDS));
        assert!(first.arguments.is_none());
        let capabilities = first.capabilities.unwrap();
        assert_eq!(
            *capabilities,
            serde_json::from_str::<Value>(CAPABILITIES).unwrap()
        );
        // The same text again: the same value, not read again.
        let again = ClientMessage::read_served(Bytes::from(text.clone()), &known).unwrap();
        assert!(Arc::ptr_eq(&again.capabilities.unwrap(), &capabilities));
        // Other capabilities are other values; escaped keys are the keys they spell.
        let other = modern(&meta_with(r#"{"roots":{}}"#), r#"{"text":"hi"}"#)
            .replace("clientCapabilities", "client\\u0043apabilities");
        let other = ClientMessage::read_served(Bytes::from(other), &known).unwrap();
        assert_eq!(*other.capabilities.unwrap(), json!({"roots": {}}));
        // Read to be passed on, it keeps everything.
        let passed = ClientMessage::read(Bytes::from(text.clone())).unwrap();
        assert!(passed.capabilities.is_none());
        assert_eq!(
            passed.message,
            serde_json::from_str::<Value>(&text).unwrap()
        );
        // A large message keeps them too (its arguments are left unread instead).
        let text = modern(&meta_with(CAPABILITIES), &large("y"));
        let mut read = ClientMessage::read_served(Bytes::from(text.clone()), &known).unwrap();
        assert!(read.capabilities.is_none() && read.arguments.is_some());
        read.read_arguments().unwrap();
        assert_eq!(read.message, serde_json::from_str::<Value>(&text).unwrap());
        // Anywhere but in a message's `params._meta`, nothing is taken.
        let elsewhere = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"_meta":{}}}}},"_meta":{}}}"#,
            meta_with(CAPABILITIES),
            meta_with(CAPABILITIES)
        );
        let read = ClientMessage::read_served(Bytes::from(elsewhere.clone()), &known).unwrap();
        assert!(read.capabilities.is_none());
        assert_eq!(
            read.message,
            serde_json::from_str::<Value>(&elsewhere).unwrap()
        );
    }

    #[test]
    fn client_capabilities_the_checks_must_refuse_stay_in_place() {
        let known = KnownCapabilities::default();
        let cases = [
            // Not an object; the last of two not one.
            modern(&meta_with("[]"), "{}"),
            modern(&meta_with("null"), "{}"),
            modern(
                &meta_with(CAPABILITIES).replace(
                    r#""progressToken""#,
                    r#""io.modelcontextprotocol/clientCapabilities":5,"p""#,
                ),
                "{}",
            ),
            // `_meta` not an object, or without capabilities.
            modern("[1]", "{}"),
            modern(
                r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
                "{}",
            ),
        ];
        for text in cases {
            let read = ClientMessage::read_served(Bytes::from(text.clone()), &known).unwrap();
            assert!(read.capabilities.is_none(), "{text}");
            assert_eq!(
                read.message,
                read_without(&text, &[META_CLIENT_INFO]),
                "{text}"
            );
        }
        // The last of two counts, as in a map.
        let text = modern(
            &meta_with("5").replace(
                r#""progressToken""#,
                r#""io.modelcontextprotocol/clientCapabilities":{"roots":{}},"p""#,
            ),
            "{}",
        );
        let read = ClientMessage::read_served(Bytes::from(text.clone()), &known).unwrap();
        assert_eq!(*read.capabilities.unwrap(), json!({"roots": {}}));
        assert_eq!(read.message, read_without(&text, CLIENT_FIELDS));
        // Broken JSON anywhere is an error where a reader finds one (skimmed
        // capabilities may word it differently).
        for text in [
            modern(&meta_with(r#"{"sampling":{},}"#), "{}"),
            modern(
                &meta_with(CAPABILITIES).replace(r#""name":"c""#, r#""name":c"#),
                "{}",
            ),
            modern(&meta_with(CAPABILITIES), "{"),
            format!("{} x", modern(&meta_with(CAPABILITIES), "{}")),
        ] {
            let served = ClientMessage::read_served(Bytes::from(text.clone()), &known);
            let whole = serde_json::from_str::<Value>(&text);
            let at = |error: serde_json::Error| (error.line(), error.column());
            assert_eq!(
                served.map(|read| read.message).map_err(at),
                whole.map_err(at),
                "{text}"
            );
        }
        // Whatever is not an object is read as a reader reads it.
        for text in ["[1, {\"a\": 2.5}]", "\"x\"", "null", "-3", "true"] {
            let read = ClientMessage::read_served(Bytes::from(text), &known).unwrap();
            assert_eq!(read.message, serde_json::from_str::<Value>(text).unwrap());
        }
    }

    /// What a served read must make of `text`: a reader's message, its `_meta`
    /// without client info, and without the capabilities when they are an object.
    fn served_reference(text: &[u8]) -> Option<(Value, Option<Value>)> {
        let mut whole = serde_json::from_slice::<Value>(text).ok()?;
        let meta = whole
            .as_object_mut()
            .and_then(|message| message.get_mut("params"))
            .and_then(Value::as_object_mut)
            .and_then(|params| params.get_mut("_meta"))
            .and_then(Value::as_object_mut);
        let mut taken = None;
        if let Some(meta) = meta {
            meta.shift_remove(META_CLIENT_INFO);
            if meta
                .get(META_CLIENT_CAPABILITIES)
                .is_some_and(Value::is_object)
            {
                taken = meta.shift_remove(META_CLIENT_CAPABILITIES);
            }
        }
        Some((whole, taken))
    }

    #[test]
    fn a_served_read_is_a_readers_on_mutated_texts() {
        let known = KnownCapabilities::default();
        let base = modern(&meta_with(CAPABILITIES), r#"{"text":"h\u00e9"}"#).into_bytes();
        let alphabet = b"{}[]\",:\\ 0-1eE.tnu\x01";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            usize::try_from(state >> 33).unwrap() % bound
        };
        let mut agreed_ok = 0;
        for _ in 0..20_000 {
            let mut text = base.clone();
            for _ in 0..1 + next(3) {
                let at = next(text.len());
                match next(3) {
                    0 => text[at] = alphabet[next(alphabet.len())],
                    1 => text.insert(at, alphabet[next(alphabet.len())]),
                    _ => {
                        text.remove(at);
                    }
                }
            }
            let served = ClientMessage::read_served(Bytes::from(text.clone()), &known);
            let reference = served_reference(&text);
            let shown = String::from_utf8_lossy(&text).into_owned();
            match (served, reference) {
                (Ok(read), Some((message, taken))) => {
                    assert_eq!(read.message, message, "{shown}");
                    assert_eq!(read.capabilities.as_deref(), taken.as_ref(), "{shown}");
                    agreed_ok += 1;
                }
                (Err(_), None) => {}
                (served, reference) => panic!(
                    "{shown}: served {:?}, reader {:?}",
                    served.map(|read| read.message),
                    reference.map(|(message, _)| message)
                ),
            }
        }
        assert!(
            agreed_ok > 1000,
            "too few mutations stayed valid: {agreed_ok}"
        );
    }

    #[test]
    fn known_capabilities_stay_few_and_small() {
        let known = KnownCapabilities::default();
        for n in 0..3 * KNOWN_TEXTS {
            let text = format!(r#"{{"n":{n}}}"#);
            assert_eq!(*known.read(text.as_bytes()).unwrap(), json!({ "n": n }));
        }
        let large = format!(r#"{{"x":"{}"}}"#, "x".repeat(KNOWN_TEXT_MAX));
        assert!(known.read(large.as_bytes()).is_ok());
        let held = known.recent.lock().unwrap();
        assert_eq!(held.texts.len(), KNOWN_TEXTS);
        assert!(held
            .texts
            .iter()
            .all(|(text, _)| text.len() <= KNOWN_TEXT_MAX));
    }

    #[test]
    fn large_arguments_with_half_a_surrogate_pair_stay_unread_once_mended() {
        // Mended before the skim: what is left unread is what any reader takes.
        let text = call(&large("\\ud800"));
        let read = ClientMessage::read(Bytes::from(text)).unwrap();
        let written = read.arguments.as_ref().unwrap();
        assert!(written.text().starts_with(br#"{ "text" : "\ufffd"#));
        let text = call(&large("\\ud83d\\ude00"));
        assert!(ClientMessage::read(Bytes::from(text)).is_ok_and(|read| read.arguments.is_some()));
    }

    #[test]
    fn hostile_client_messages_are_read_or_refused_and_never_panic() {
        let small = call(r#"{"a":1,"b":"\ud83d\ude00"}"#);
        let big = call(&large("caf\\u00e9 \\\"quoted\\\""));
        let served = modern(&meta_with(CAPABILITIES), r#"{"x":[1,2]}"#);
        let seeds: [&[u8]; 5] = [
            small.as_bytes(),
            big.as_bytes(),
            served.as_bytes(),
            br#"{"jsonrpc":"2.0","id":"s","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{}},"clientInfo":{"name":"c","version":"1"}}}"#,
            br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":null}]"#,
        ];
        let known = KnownCapabilities::default();
        let mut cases = mutations::cases(&seeds, 3_000, 0xC11E);
        for (index, seed) in seeds.iter().enumerate() {
            let seed = serde_json::from_slice(seed).unwrap();
            cases.extend(mutations::value_mutants(&seed, 400, index as u64));
        }
        mutations::check("a client's message", &cases, 128, |bytes| {
            for mut read in [
                ClientMessage::read(Bytes::copy_from_slice(bytes)),
                ClientMessage::read_served(Bytes::copy_from_slice(bytes), &known),
            ]
            .into_iter()
            .flatten()
            {
                let unread = read.arguments.as_ref().map(|arguments| arguments.read());
                match (read.read_arguments(), unread) {
                    // Arguments passed on unread are ones a reader takes (else the
                    // upstream could not answer the call), and put back, the same.
                    (Ok(()), Some(Ok(arguments))) => {
                        assert_eq!(read.message["params"]["arguments"], arguments)
                    }
                    (Ok(()), None) => {}
                    (put, unread) => panic!("put back {put:?} from {unread:?}"),
                }
                // What is read writes back as JSON that reads again.
                let written = adapters::json_out::to_vec(&read.message);
                assert_eq!(written, serde_json::to_vec(&read.message).unwrap());
                serde_json::from_slice::<Value>(&written).unwrap();
            }
        });
    }
}
