//! A client's message as a front reads it: a JSON value, but for a tool call's
//! arguments of a kilobyte or more, which stay the text the client wrote and go to
//! the upstream as they are. plexus reads them only where it must look inside
//! them: the audit trail's hash, and parameters a tool mirrors into headers.

use std::ops::Range;

use adapters::raw_object::named_twice;
use adapters::WrittenMember;
use bytes::Bytes;
use serde_json::{Map, Value};

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
}

impl From<Value> for ClientMessage {
    fn from(message: Value) -> ClientMessage {
        ClientMessage {
            message,
            arguments: None,
        }
    }
}

impl ClientMessage {
    /// Reads a message. A tool call's large arguments object is skimmed, not read:
    /// one scan finds where it is and checks its syntax.
    pub fn read(bytes: Bytes) -> Result<ClientMessage, serde_json::Error> {
        if bytes.len() >= UNREAD_ARGUMENTS_MIN {
            if let Some(read) = skim_call(&bytes) {
                return Ok(read);
            }
        }
        serde_json::from_slice::<Value>(&bytes).map(ClientMessage::from)
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
    fn arguments_a_reader_refuses_are_refused_at_once() {
        // Half a surrogate pair passes a skim; the message is read, and refused.
        let text = call(&large("\\ud800"));
        assert!(ClientMessage::read(Bytes::from(text)).is_err());
        let text = call(&large("\\ud83d\\ude00"));
        assert!(ClientMessage::read(Bytes::from(text)).is_ok_and(|read| read.arguments.is_some()));
    }
}
