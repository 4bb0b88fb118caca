//! Opaque pagination cursors: base64url (no padding) of `p1:{offset}`.
//!
//! A cursor is valid when it is exactly what [`encode`] produces for some offset and that
//! offset is inside the list (`offset < len`). We only hand out cursors for offsets where
//! entries remain, so an offset equal to the length is invalid too, and any cursor for an
//! empty list is invalid. A snapshot that shrank under a client's cursor therefore answers
//! with an error rather than a silently empty page.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Tags the cursor format so that a later format can be told apart.
const CURSOR_TAG: &str = "p1:";

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("invalid cursor: not a cursor this server handed out")]
    Malformed,
    #[error("invalid cursor: offset {offset} is beyond the {len} entries of the list")]
    OutOfRange { offset: usize, len: usize },
}

/// The cursor for the page starting at `offset`.
pub fn encode(offset: usize) -> String {
    URL_SAFE_NO_PAD.encode(format!("{CURSOR_TAG}{offset}"))
}

/// The offset a cursor points at, checked against a list of `len` entries.
pub fn decode(cursor: &str, len: usize) -> Result<usize, CursorError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| CursorError::Malformed)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| CursorError::Malformed)?;
    let digits = text
        .strip_prefix(CURSOR_TAG)
        .ok_or(CursorError::Malformed)?;
    let offset: usize = digits.parse().map_err(|_| CursorError::Malformed)?;
    // Only the canonical spelling is ours: this rejects `+5`, `007` and the like.
    if encode(offset) != cursor {
        return Err(CursorError::Malformed);
    }
    if offset >= len {
        return Err(CursorError::OutOfRange { offset, len });
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        for offset in [0, 1, 100, 249, 123_456] {
            assert_eq!(decode(&encode(offset), offset + 1), Ok(offset));
        }
    }

    #[test]
    fn cursor_is_base64url_of_the_tagged_offset() {
        assert_eq!(encode(100), "cDE6MTAw");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(encode(200)).ok(),
            Some(b"p1:200".to_vec())
        );
    }

    #[test]
    fn bad_cursors_are_rejected() {
        let other_tag = URL_SAFE_NO_PAD.encode("p2:5");
        let not_a_number = URL_SAFE_NO_PAD.encode("p1:five");
        let signed = URL_SAFE_NO_PAD.encode("p1:+5");
        let zero_padded = URL_SAFE_NO_PAD.encode("p1:05");
        let padded_base64 = base64::engine::general_purpose::URL_SAFE.encode("p1:5");
        let cases = [
            ("", CursorError::Malformed),
            ("!!!", CursorError::Malformed),
            (other_tag.as_str(), CursorError::Malformed),
            (not_a_number.as_str(), CursorError::Malformed),
            (signed.as_str(), CursorError::Malformed),
            (zero_padded.as_str(), CursorError::Malformed),
            (padded_base64.as_str(), CursorError::Malformed),
        ];
        for (cursor, expected) in cases {
            assert_eq!(decode(cursor, 10), Err(expected), "cursor {cursor:?}");
        }
    }

    #[test]
    fn offsets_at_or_past_the_end_are_out_of_range() {
        assert_eq!(
            decode(&encode(10), 10),
            Err(CursorError::OutOfRange {
                offset: 10,
                len: 10
            })
        );
        assert_eq!(
            decode(&encode(0), 0),
            Err(CursorError::OutOfRange { offset: 0, len: 0 })
        );
        assert!(CursorError::Malformed
            .to_string()
            .starts_with("invalid cursor"));
    }
}
