//! Newline-delimited JSON framing with a hard line-length cap.
//!
//! Upstream stdout is untrusted: a line may be huge, may not be JSON (banners),
//! or may not be UTF-8. The decoder never fails the stream for any of these; it
//! reports them so the connection can count, log and carry on.

use bytes::{Buf, Bytes, BytesMut};

/// How much of an oversized line is kept to identify it.
pub const HEAD_BYTES: usize = 256;
/// A buffer grown past this for one long line is let go once that line is out:
/// an idle connection keeps no more than a short line's worth.
const RETAINED_BYTES: usize = 64 * 1024;
/// A fresh buffer's room: what a new `FramedRead` starts with.
const FRESH_BYTES: usize = 8 * 1024;
use tokio_util::codec::Decoder;

/// One unit read off a newline-delimited stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its terminating newline (and without a trailing `\r`).
    Line(BytesMut),
    /// A line longer than the cap; its bytes were discarded. Carries the cap and
    /// the line's first bytes, so the message it belonged to can be identified.
    TooLong { limit: usize, head: Bytes },
}

/// Splits a byte stream into lines of at most `max_line_bytes`.
#[derive(Debug)]
pub struct LineDecoder {
    max_line_bytes: usize,
    /// Set while skipping the rest of an oversized line.
    discarding: bool,
    /// How far the buffer has already been scanned for a newline.
    scanned: usize,
}

impl LineDecoder {
    pub fn new(max_line_bytes: usize) -> LineDecoder {
        LineDecoder {
            max_line_bytes,
            discarding: false,
            scanned: 0,
        }
    }
}

/// UTF-8's byte-order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

fn bom_length(line: &[u8]) -> usize {
    if line.starts_with(BOM) {
        BOM.len()
    } else {
        0
    }
}

impl Decoder for LineDecoder {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        loop {
            let newline =
                memchr::memchr(b'\n', &buf[self.scanned..]).map(|offset| self.scanned + offset);
            match newline {
                Some(end) if self.discarding => {
                    buf.advance(end + 1);
                    self.discarding = false;
                    self.scanned = 0;
                    // The oversized line was already reported when discarding began.
                    continue;
                }
                Some(end) => {
                    let mut line = buf.split_to(end + 1);
                    self.scanned = 0;
                    if buf.is_empty() && buf.capacity() > RETAINED_BYTES {
                        // The line keeps the allocation until it is dropped. The next
                        // read starts where a new reader's would, not at a few bytes
                        // (a long line would then take eighteen reads per MiB).
                        *buf = BytesMut::with_capacity(FRESH_BYTES);
                    }
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    // A byte-order mark (some runtimes write one before their first
                    // line) starts no JSON-RPC message: the message after it counts.
                    if line.starts_with(BOM) {
                        line.advance(BOM.len());
                    }
                    if line.len() > self.max_line_bytes {
                        return Ok(Some(Frame::TooLong {
                            limit: self.max_line_bytes,
                            head: Bytes::copy_from_slice(&line[..HEAD_BYTES.min(line.len())]),
                        }));
                    }
                    return Ok(Some(Frame::Line(line)));
                }
                None if self.discarding => {
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                }
                // A byte-order mark is not the line's: it counts neither for the cap
                // nor in the head, as once the line's end has arrived (whether a
                // line passes must not depend on where the reads ended).
                None if buf.len() - bom_length(buf) > self.max_line_bytes => {
                    let line = &buf[bom_length(buf)..];
                    let head = Bytes::copy_from_slice(&line[..HEAD_BYTES.min(line.len())]);
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    return Ok(Some(Frame::TooLong {
                        limit: self.max_line_bytes,
                        head,
                    }));
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        if buf.is_empty() || self.discarding {
            buf.clear();
            return Ok(None);
        }
        // A final line without a newline still counts as a line.
        let mut line = buf.split();
        if line.starts_with(BOM) {
            line.advance(BOM.len());
        }
        self.scanned = 0;
        Ok(Some(Frame::Line(line)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], limit: usize) -> Vec<Frame> {
        let mut decoder = LineDecoder::new(limit);
        let mut frames = Vec::new();
        // Feed byte by byte to exercise partial reads.
        let mut buf = BytesMut::new();
        for byte in input {
            buf.extend_from_slice(&[*byte]);
            while let Some(frame) = decoder.decode(&mut buf).unwrap() {
                frames.push(frame);
            }
        }
        while let Some(frame) = decoder.decode_eof(&mut buf).unwrap() {
            frames.push(frame);
        }
        frames
    }

    fn line(text: &str) -> Frame {
        Frame::Line(BytesMut::from(text.as_bytes()))
    }

    #[test]
    fn splits_lines_and_strips_carriage_returns() {
        assert_eq!(
            decode_all(b"{\"a\":1}\r\nbanner\n{}", 100),
            vec![line("{\"a\":1}"), line("banner"), line("{}")]
        );
    }

    #[test]
    fn a_byte_order_mark_before_a_line_is_dropped() {
        assert_eq!(
            decode_all(
                b"\xEF\xBB\xBF{\"a\":1}\n\xEF\xBB\xBF{}\r\n\xEF\xBB\xBF[]",
                100
            ),
            vec![line("{\"a\":1}"), line("{}"), line("[]")]
        );
        // Only at the start: inside a line it is the line's.
        assert_eq!(
            decode_all(b"{\"t\":\"\xEF\xBB\xBF\"}\n", 100),
            vec![line("{\"t\":\"\u{FEFF}\"}")]
        );
    }

    #[test]
    fn oversized_line_is_reported_once_and_skipped() {
        let mut input = vec![b'x'; 50];
        input.extend_from_slice(b"\nok\n");
        assert_eq!(
            decode_all(&input, 10),
            vec![
                Frame::TooLong {
                    limit: 10,
                    head: Bytes::from(vec![b'x'; 11]),
                },
                line("ok")
            ]
        );
    }

    #[test]
    fn line_exactly_at_the_limit_passes() {
        assert_eq!(decode_all(b"0123456789\n", 10), vec![line("0123456789")]);
    }

    #[test]
    fn a_buffer_grown_for_a_long_line_is_let_go_after_it() {
        let mut decoder = LineDecoder::new(1 << 20);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&vec![b'x'; 200_000]);
        assert_eq!(decoder.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"\n");
        let Some(Frame::Line(long)) = decoder.decode(&mut buf).unwrap() else {
            panic!("no line")
        };
        assert_eq!(long.len(), 200_000);
        assert!(buf.capacity() <= RETAINED_BYTES, "{}", buf.capacity());
        buf.extend_from_slice(b"{}\n");
        assert_eq!(decoder.decode(&mut buf).unwrap(), Some(line("{}")));
    }

    /// Every line decoded in chunks of the given sizes (cycled), then at the end.
    fn decode_chunked(input: &[u8], limit: usize, sizes: &[usize]) -> Vec<Frame> {
        let mut decoder = LineDecoder::new(limit);
        let (mut frames, mut buf, mut rest) = (Vec::new(), BytesMut::new(), input);
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, tail) = rest.split_at((*size).min(rest.len()));
            buf.extend_from_slice(chunk);
            rest = tail;
            while let Some(frame) = decoder.decode(&mut buf).unwrap() {
                frames.push(frame);
            }
        }
        while let Some(frame) = decoder.decode_eof(&mut buf).unwrap() {
            frames.push(frame);
        }
        frames
    }

    #[test]
    fn hostile_streams_frame_within_the_cap_however_they_are_split() {
        let seeds: [&[u8]; 4] = [
            b"{\"a\":1}\r\nbanner\n{}",
            b"\xEF\xBB\xBF{\"a\":1}\n\xEF\xBB\xBF{}\r\n\xEF\xBB\xBF[]",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[]}}\n",
            b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nok\n",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0xF4A3);
        let sizes = [1, 7, 4096, 3, 65_536];
        // The frames are kept (about 80 bytes each), one per input byte at most.
        mutations::check("LineDecoder", &cases, 256, |input| {
            let whole = decode_chunked(input, 1_000, &[usize::MAX]);
            for frame in &whole {
                match frame {
                    Frame::Line(line) => assert!(line.len() <= 1_000),
                    Frame::TooLong { head, .. } => assert!(head.len() <= HEAD_BYTES),
                }
            }
            // Where the reads happen to end changes nothing.
            assert_eq!(decode_chunked(input, 1_000, &sizes), whole);
        });
    }
}
