//! An incremental Server-Sent Events decoder with a cap on each event's data, so
//! an upstream cannot make plexus buffer without bound. Lines end in CRLF, LF or
//! CR; comments (`:`) are skipped; `data` lines are joined with `\n`.

/// Bytes of an oversized event kept so the request it answers can be found.
const HEAD_BYTES: usize = 512;
/// Room for a field name and separator on top of the data cap.
const FIELD_SLACK: usize = 64;

/// One decoded item of an event stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SseItem {
    Event {
        /// The `event` field; `None` means the default type, `message`.
        kind: Option<String>,
        data: Vec<u8>,
    },
    /// An event whose data exceeded the cap; its first bytes.
    TooLong { head: Vec<u8> },
}

pub(crate) struct SseDecoder {
    max_data: usize,
    line: Vec<u8>,
    /// The current line outgrew the cap: its tail is discarded.
    line_overflow: bool,
    /// The previous chunk ended in CR, so a leading LF belongs to that line end.
    skip_lf: bool,
    data: Vec<u8>,
    has_data: bool,
    data_overflow: bool,
    kind: Option<String>,
    /// The last `id` field seen (it persists across events, as in browsers).
    pub(crate) last_event_id: Option<String>,
    /// The last `retry` field, in milliseconds.
    pub(crate) retry_ms: Option<u64>,
}

impl SseDecoder {
    pub(crate) fn new(max_data: usize) -> SseDecoder {
        SseDecoder {
            max_data,
            line: Vec::new(),
            line_overflow: false,
            skip_lf: false,
            data: Vec::new(),
            has_data: false,
            data_overflow: false,
            kind: None,
            last_event_id: None,
            retry_ms: None,
        }
    }

    /// Decodes `bytes`, appending every event they complete to `out`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<SseItem>) {
        if self.skip_lf {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while !bytes.is_empty() {
            match memchr::memchr2(b'\n', b'\r', bytes) {
                Some(end) => {
                    self.push_line_bytes(&bytes[..end]);
                    let crlf = bytes[end] == b'\r';
                    bytes = &bytes[end + 1..];
                    if crlf {
                        match bytes.first() {
                            Some(b'\n') => bytes = &bytes[1..],
                            None => self.skip_lf = true,
                            Some(_) => {}
                        }
                    }
                    self.end_line(out);
                }
                None => {
                    self.push_line_bytes(bytes);
                    bytes = &[];
                }
            }
        }
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        let room = (self.max_data + FIELD_SLACK).saturating_sub(self.line.len());
        if bytes.len() > room {
            self.line.extend_from_slice(&bytes[..room]);
            self.line_overflow = true;
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self, out: &mut Vec<SseItem>) {
        let line = std::mem::take(&mut self.line);
        let overflow = std::mem::replace(&mut self.line_overflow, false);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                if self.has_data && !self.data_overflow {
                    self.data.push(b'\n');
                }
                self.has_data = true;
                if overflow || self.data_overflow || self.data.len() + value.len() > self.max_data {
                    if !self.data_overflow {
                        self.data_overflow = true;
                        self.data.extend_from_slice(value);
                        self.data.truncate(HEAD_BYTES);
                    }
                } else {
                    self.data.extend_from_slice(value);
                }
            }
            b"event" => self.kind = Some(String::from_utf8_lossy(value).into_owned()),
            b"id" if !value.contains(&0) => {
                self.last_event_id = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" => {
                if let Ok(ms) = std::str::from_utf8(value).unwrap_or("").parse() {
                    self.retry_ms = Some(ms);
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let kind = self.kind.take();
        let data = std::mem::take(&mut self.data);
        let had_data = std::mem::replace(&mut self.has_data, false);
        if std::mem::replace(&mut self.data_overflow, false) {
            out.push(SseItem::TooLong { head: data });
        } else if had_data {
            out.push(SseItem::Event { kind, data });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]], max: usize) -> (Vec<SseItem>, SseDecoder) {
        let mut decoder = SseDecoder::new(max);
        let mut out = Vec::new();
        for chunk in chunks {
            decoder.feed(chunk, &mut out);
        }
        (out, decoder)
    }

    fn event(kind: Option<&str>, data: &str) -> SseItem {
        SseItem::Event {
            kind: kind.map(str::to_string),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn events_split_anywhere_decode_the_same() {
        let stream = b"id: 0\nretry: 3000\ndata:\n\n: keep-alive\n\nevent: message\r\ndata: {\"a\":1}\r\n\r\nevent: endpoint\rdata: /messages?s=1\r\rdata: one\ndata: two\n\n";
        let expected = [
            event(Some("message"), "{\"a\":1}"),
            event(Some("endpoint"), "/messages?s=1"),
            event(None, "one\ntwo"),
        ];
        // The priming event (an id and empty data) dispatches with empty data.
        let whole = decode(&[stream], 1024).0;
        assert_eq!(whole[0], event(None, ""));
        assert_eq!(whole[1..], expected[..]);
        for split in 0..stream.len() {
            let (head, tail) = stream.split_at(split);
            let (items, decoder) = decode(&[head, tail], 1024);
            assert_eq!(items[1..], expected[..], "split at {split}");
            assert_eq!(decoder.last_event_id.as_deref(), Some("0"));
            assert_eq!(decoder.retry_ms, Some(3000));
        }
    }

    #[test]
    fn oversized_events_are_cut_and_the_stream_goes_on() {
        let big = format!("data: {{\"id\":7,\"result\":\"{}\"}}\n\n", "x".repeat(5000));
        let stream = format!("{big}data: small\n\n");
        let (items, _) = decode(&[stream.as_bytes()], 100);
        match &items[0] {
            SseItem::TooLong { head } => {
                assert!(head.starts_with(b"{\"id\":7"));
                assert!(head.len() <= HEAD_BYTES);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(items[1], event(None, "small"));
        // Many data lines that together exceed the cap count as one oversized event.
        let lines = "data: 0123456789\n".repeat(20) + "\ndata: ok\n\n";
        let (items, _) = decode(&[lines.as_bytes()], 100);
        assert!(matches!(items[0], SseItem::TooLong { .. }));
        assert_eq!(items[1], event(None, "ok"));
    }

    #[test]
    fn hostile_streams_decode_within_the_cap_however_they_are_split() {
        let seeds: [&[u8]; 3] = [
            b"id: 0\nretry: 3000\ndata:\n\n: keep-alive\n\nevent: message\r\ndata: {\"a\":1}\r\n\r\nevent: endpoint\rdata: /messages?s=1\r\rdata: one\ndata: two\n\n",
            b"event: endpoint\ndata: /messages?sessionId=abc\n\n",
            b"data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\ndata: ok\n\n",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0x55E);
        mutations::check("SseDecoder", &cases, 256, |input| {
            let (whole, decoder) = decode(&[input], 100);
            for item in &whole {
                match item {
                    SseItem::Event { kind, data } => {
                        assert!(data.len() <= 100);
                        assert!(kind
                            .as_ref()
                            .is_none_or(|kind| kind.len() <= 3 * (100 + FIELD_SLACK)));
                    }
                    SseItem::TooLong { head } => assert!(head.len() <= HEAD_BYTES),
                }
            }
            assert!(decoder.line.len() <= 100 + FIELD_SLACK);
            // Where the reads happen to end changes nothing.
            let chunks: Vec<&[u8]> = input.chunks(7).collect();
            assert_eq!(decode(&chunks, 100).0, whole);
            let (head, tail) = input.split_at(input.len() / 2);
            assert_eq!(decode(&[head, tail], 100).0, whole);
        });
    }
}
