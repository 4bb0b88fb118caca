//! A `WWW-Authenticate: Bearer …` challenge read into its parameters (RFC 6750
//! §3, RFC 9728 §5.1): `resource_metadata`, `scope`, `error`.

use std::collections::BTreeMap;

/// One Bearer challenge's parameters, names lowercased.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Challenge {
    params: BTreeMap<String, String>,
}

impl Challenge {
    /// The Bearer challenge of a `WWW-Authenticate` value (which may hold
    /// several challenges), if there is one.
    pub fn parse(header: &str) -> Option<Challenge> {
        let mut rest = header.trim_start();
        loop {
            let (scheme, after) = token(rest);
            if scheme.is_empty() {
                return None;
            }
            let (params, after) = params(after);
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(Challenge { params });
            }
            rest = after.trim_start_matches([',', ' ', '\t']);
        }
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// Where the protected resource metadata is (RFC 9728 §5.1).
    pub fn resource_metadata(&self) -> Option<&str> {
        self.param("resource_metadata")
    }

    /// The scopes the resource asks for, in order.
    pub fn scopes(&self) -> Vec<String> {
        self.param("scope")
            .map(|scope| scope.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// A 403's `error="insufficient_scope"`: the token lacks a scope (step-up).
    pub fn is_insufficient_scope(&self) -> bool {
        self.param("error") == Some("insufficient_scope")
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A token at the start of `text` and what follows it.
fn token(text: &str) -> (&str, &str) {
    let end = text.find(|c| !is_token_char(c)).unwrap_or(text.len());
    (&text[..end], &text[end..])
}

/// `name=value` pairs (a value a token or a quoted string) up to the next
/// challenge's scheme or the end.
fn params(mut text: &str) -> (BTreeMap<String, String>, &str) {
    let mut params = BTreeMap::new();
    loop {
        let trimmed = text.trim_start_matches([',', ' ', '\t']);
        let (name, after) = token(trimmed);
        let after_name = after.trim_start();
        if name.is_empty() || !after_name.starts_with('=') {
            // The next challenge's scheme, or the end.
            return (params, trimmed);
        }
        let value_text = after_name[1..].trim_start();
        let (value, rest) = if let Some(quoted) = value_text.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((at, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = at + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end.min(quoted.len())..])
        } else {
            let (value, rest) = token(value_text);
            // token68 values may end in '='.
            let pad = rest.len() - rest.trim_start_matches('=').len();
            (format!("{value}{}", &rest[..pad]), &rest[pad..])
        };
        params.insert(name.to_ascii_lowercase(), value);
        text = rest;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parameters_are_read_among_other_challenges() {
        let challenge = Challenge::parse(
            r#"Basic realm="x", Bearer error="insufficient_scope", scope="mcp:write mcp:read", resource_metadata="http://h/.well-known/oauth-protected-resource/mcp""#,
        )
        .unwrap();
        assert!(challenge.is_insufficient_scope());
        assert_eq!(challenge.scopes(), ["mcp:write", "mcp:read"]);
        assert_eq!(
            challenge.resource_metadata(),
            Some("http://h/.well-known/oauth-protected-resource/mcp")
        );
        let bare = Challenge::parse("Bearer").unwrap();
        assert!(bare.scopes().is_empty() && bare.resource_metadata().is_none());
        assert!(Challenge::parse(r#"Basic realm="a, b""#).is_none());
        let escaped = Challenge::parse(r#"bearer realm="a \"q\"", scope=s1"#).unwrap();
        assert_eq!(escaped.param("realm"), Some(r#"a "q""#));
        assert_eq!(escaped.scopes(), ["s1"]);
    }

    #[test]
    fn hostile_challenges_are_read_or_refused_and_never_panic() {
        let seeds: [&[u8]; 3] = [
            br#"Basic realm="x", Bearer error="insufficient_scope", scope="mcp:write mcp:read", resource_metadata="http://h/.well-known/oauth-protected-resource/mcp""#,
            br#"bearer realm="a \"q\"", scope=s1"#,
            b"Bearer token68value==, Basic realm=\"a, b\"",
        ];
        let cases = mutations::cases(&seeds, 4_000, 0xC4A1);
        mutations::check("Challenge::parse", &cases, 16, |header| {
            let Some(challenge) = Challenge::parse(&String::from_utf8_lossy(header)) else {
                return;
            };
            for (name, value) in &challenge.params {
                assert!(!name.is_empty() && name.chars().all(is_token_char));
                assert_eq!(name, &name.to_ascii_lowercase());
                assert!(value.len() <= header.len() * 3);
            }
            let _ = (challenge.scopes(), challenge.is_insufficient_scope());
        });
    }
}
