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

/// The longest text a cursor encodes: the tag and a 64-bit offset's 20 digits.
const PLAIN_MAX: usize = CURSOR_TAG.len() + 20;

/// The cursor for the page starting at `offset`.
pub fn encode(offset: usize) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(offset).as_bytes();
    let mut plain = [0u8; PLAIN_MAX];
    let length = CURSOR_TAG.len() + digits.len();
    plain[..CURSOR_TAG.len()].copy_from_slice(CURSOR_TAG.as_bytes());
    plain[CURSOR_TAG.len()..length].copy_from_slice(digits);
    URL_SAFE_NO_PAD.encode(&plain[..length])
}

/// The offset a cursor points at, checked against a list of `len` entries.
pub fn decode(cursor: &str, len: usize) -> Result<usize, CursorError> {
    let mut plain = [0u8; PLAIN_MAX];
    // Longer than any cursor this server writes: the slice is too small, an error.
    // The engine refuses padding and stray trailing bits, so only the canonical
    // base64 of a text decodes.
    let length = URL_SAFE_NO_PAD
        .decode_slice(cursor, &mut plain)
        .map_err(|_| CursorError::Malformed)?;
    let digits = plain[..length]
        .strip_prefix(CURSOR_TAG.as_bytes())
        .ok_or(CursorError::Malformed)?;
    // Only the canonical spelling is ours: this rejects `+5`, `007` and the like.
    let canonical = match digits {
        [] => false,
        [b'0', _, ..] => false,
        _ => digits.iter().all(u8::is_ascii_digit),
    };
    let offset = std::str::from_utf8(digits)
        .ok()
        .filter(|_| canonical)
        .and_then(|digits| digits.parse::<usize>().ok())
        .ok_or(CursorError::Malformed)?;
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
        // "cDE6NQ" with its last character's unused low bits set.
        let stray_bits = "cDE6NR";
        let too_large = URL_SAFE_NO_PAD.encode("p1:99999999999999999999");
        let too_long = URL_SAFE_NO_PAD.encode("p1:000000000000000000001");
        let cases = [
            ("", CursorError::Malformed),
            ("!!!", CursorError::Malformed),
            (other_tag.as_str(), CursorError::Malformed),
            (not_a_number.as_str(), CursorError::Malformed),
            (signed.as_str(), CursorError::Malformed),
            (zero_padded.as_str(), CursorError::Malformed),
            (padded_base64.as_str(), CursorError::Malformed),
            (stray_bits, CursorError::Malformed),
            (too_large.as_str(), CursorError::Malformed),
            (too_long.as_str(), CursorError::Malformed),
        ];
        for (cursor, expected) in cases {
            assert_eq!(decode(cursor, 10), Err(expected), "cursor {cursor:?}");
        }
    }

    /// What a cursor is, said the long way: the canonical base64 of the tag and
    /// an offset written as `encode` writes it.
    fn reference_decode(cursor: &str, len: usize) -> Result<usize, CursorError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| CursorError::Malformed)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| CursorError::Malformed)?;
        let digits = text
            .strip_prefix(CURSOR_TAG)
            .ok_or(CursorError::Malformed)?;
        let offset: usize = digits.parse().map_err(|_| CursorError::Malformed)?;
        if URL_SAFE_NO_PAD.encode(format!("{CURSOR_TAG}{offset}")) != cursor {
            return Err(CursorError::Malformed);
        }
        if offset >= len {
            return Err(CursorError::OutOfRange { offset, len });
        }
        Ok(offset)
    }

    #[test]
    fn decoding_agrees_with_the_long_way_on_mutated_cursors() {
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/!";
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |bound: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % bound as u64) as usize
        };
        let offsets = [0, 1, 9, 10, 99, 100, 12_345, usize::MAX];
        // Decoded, out of range, malformed: each outcome must come up.
        let mut outcomes = [0usize; 3];
        for round in 0..20_000 {
            let offset = offsets[round % offsets.len()];
            let mut cursor: Vec<u8> = encode(offset).into_bytes();
            for _ in 0..=next(3) {
                match next(3) {
                    0 if !cursor.is_empty() => {
                        let at = next(cursor.len());
                        cursor[at] = alphabet[next(alphabet.len())];
                    }
                    1 => cursor.insert(next(cursor.len() + 1), alphabet[next(alphabet.len())]),
                    _ if !cursor.is_empty() => {
                        cursor.remove(next(cursor.len()));
                    }
                    _ => {}
                }
            }
            let cursor = String::from_utf8(cursor).unwrap_or_default();
            for len in [5, 200, usize::MAX] {
                let decoded = decode(&cursor, len);
                assert_eq!(
                    decoded,
                    reference_decode(&cursor, len),
                    "cursor {cursor:?}, len {len}"
                );
                outcomes[match decoded {
                    Ok(_) => 0,
                    Err(CursorError::OutOfRange { .. }) => 1,
                    Err(CursorError::Malformed) => 2,
                }] += 1;
            }
        }
        assert!(outcomes.iter().all(|&n| n > 100), "{outcomes:?}");
        for offset in offsets {
            assert_eq!(
                decode(&encode(offset), usize::MAX),
                reference_decode(&encode(offset), usize::MAX)
            );
            assert_eq!(
                URL_SAFE_NO_PAD.decode(encode(offset)).ok(),
                Some(format!("p1:{offset}").into_bytes())
            );
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

    #[test]
    fn hostile_cursors_are_refused_or_name_an_entry() {
        let (first, last) = (encode(0), encode(123));
        let cases = mutations::cases(&[first.as_bytes(), last.as_bytes()], 4_000, 0xC0E5);
        mutations::check("cursor::decode", &cases, 16, |bytes| {
            let cursor = String::from_utf8_lossy(bytes);
            if let Ok(offset) = decode(&cursor, 200) {
                // Only the cursor this server writes for it.
                assert!(offset < 200);
                assert_eq!(encode(offset), cursor);
            }
        });
    }
}
