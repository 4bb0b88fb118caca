//! The console's credentials, signed with a key made at start (so a restart ends
//! them): the per-page token that lets the page's own requests change the daemon
//! (bound to the page's origin, sent in a header a cross-origin form cannot set),
//! and, beyond loopback, the sign-in cookie the login form sets for a valid admin
//! token (bound to that token: changing it ends the sign-in).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::AuthTokens;

/// The header the page's own requests carry their token in.
pub const TOKEN_HEADER: &str = "x-plexus-console";
/// The sign-in cookie's name.
pub const SIGN_IN_COOKIE: &str = "plexus_admin";
/// How long a sign-in lasts.
pub const SIGN_IN_LIFETIME: Duration = Duration::from_secs(12 * 3600);

fn key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(rand::random)
}

/// HMAC-SHA-256 (RFC 2104) under this run's key.
fn sign(parts: &[&[u8]]) -> String {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key());
    let pad = |byte: u8| block.map(|key| key ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update((part.len() as u64).to_be_bytes());
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    hex::encode(outer.finalize())
}

fn equal(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The request's one `Origin`, if it names this request's own `Host` (the page
/// served by this listener, not another port or site).
pub fn own_origin(headers: &HeaderMap) -> Option<String> {
    let origin = headers.get(header::ORIGIN)?.to_str().ok()?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))?;
    authority
        .eq_ignore_ascii_case(host)
        .then(|| origin.to_ascii_lowercase())
}

/// A new page's token, bound to the origin it is served under.
pub fn page_token(headers: &HeaderMap) -> String {
    let origin = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(|host| format!("http://{}", host.to_ascii_lowercase()))
        .unwrap_or_default();
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let signature = sign(&[b"page", origin.as_bytes(), nonce.as_bytes()]);
    format!("{nonce}.{signature}")
}

/// Whether a request comes from a page this listener served: same origin, and the
/// header holds a token signed for that origin.
pub fn from_own_page(headers: &HeaderMap) -> bool {
    let Some(origin) = own_origin(headers) else {
        return false;
    };
    let Some((nonce, signature)) = headers
        .get(TOKEN_HEADER)
        .and_then(|token| token.to_str().ok())
        .and_then(|token| token.split_once('.'))
    else {
        return false;
    };
    // A page served over TLS (behind a proxy) has its token signed for http://.
    let origin = origin.replacen("https://", "http://", 1);
    equal(
        &sign(&[b"page", origin.as_bytes(), nonce.as_bytes()]),
        signature,
    )
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// The `Set-Cookie` value signing in the holder of `token` (a configured admin
/// token, already checked), or None when it is not one.
pub fn sign_in(token: &str, tokens: &AuthTokens) -> Option<String> {
    let principal = tokens.principal(token)?;
    let expires = unix_now() + SIGN_IN_LIFETIME.as_secs();
    let value = sign_in_value(principal, token, expires);
    Some(format!(
        "{SIGN_IN_COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
        SIGN_IN_LIFETIME.as_secs()
    ))
}

fn sign_in_value(principal: &str, token: &str, expires: u64) -> String {
    let token_digest = Sha256::digest(token.as_bytes());
    let expires = expires.to_string();
    let signature = sign(&[
        b"sign-in",
        principal.as_bytes(),
        &token_digest,
        expires.as_bytes(),
    ]);
    // Principal names are `[A-Za-z0-9_-]` (config validation): safe in a cookie.
    format!("{expires}.{principal}.{signature}")
}

/// Whether the request carries a valid, unexpired sign-in for a token still configured.
pub fn signed_in(headers: &HeaderMap, tokens: &AuthTokens) -> bool {
    let Some(value) = cookie(headers, SIGN_IN_COOKIE) else {
        return false;
    };
    let mut parts = value.splitn(3, '.');
    let (Some(expires), Some(principal), Some(_)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    if expires < unix_now() {
        return false;
    }
    tokens
        .0
        .iter()
        .filter(|(name, _)| name == principal)
        .any(|(_, token)| equal(&sign_in_value(principal, token, expires), value))
}

/// The `Set-Cookie` value that ends a sign-in.
pub fn sign_out() -> String {
    format!("{SIGN_IN_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_page_token_admits_its_own_origin_only() {
        let served = headers(&[("host", "127.0.0.1:7000")]);
        let token = page_token(&served);
        let own = headers(&[
            ("host", "127.0.0.1:7000"),
            ("origin", "http://127.0.0.1:7000"),
            (TOKEN_HEADER, &token),
        ]);
        assert!(from_own_page(&own));
        for (origin, sent) in [
            ("http://127.0.0.1:7001", token.as_str()),
            ("http://127.0.0.1:7000", "00.00"),
            ("http://127.0.0.1:7000", ""),
        ] {
            let other = headers(&[
                ("host", "127.0.0.1:7000"),
                ("origin", origin),
                (TOKEN_HEADER, sent),
            ]);
            assert!(!from_own_page(&other), "{origin} {sent}");
        }
        // Served under another host, the same token is no good here.
        let elsewhere = page_token(&headers(&[("host", "localhost:7000")]));
        let replayed = headers(&[
            ("host", "127.0.0.1:7000"),
            ("origin", "http://127.0.0.1:7000"),
            (TOKEN_HEADER, &elsewhere),
        ]);
        assert!(!from_own_page(&replayed));
    }

    #[test]
    fn a_sign_in_holds_for_its_token_until_the_token_changes() {
        let mut settings = AuthTokens(vec![("ops".into(), "secret-one".into())]);
        assert!(sign_in("wrong", &settings).is_none());
        let set_cookie = sign_in("secret-one", &settings).unwrap();
        assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
        let pair = set_cookie.split(';').next().unwrap();
        assert!(!pair.contains("secret-one"));
        let request = headers(&[("cookie", &format!("theme=dark; {pair}"))]);
        assert!(signed_in(&request, &settings));
        settings = AuthTokens(vec![("ops".into(), "secret-two".into())]);
        assert!(!signed_in(&request, &settings));
        assert!(!signed_in(
            &headers(&[("cookie", "plexus_admin=1.ops.00")]),
            &settings
        ));
    }

    #[test]
    fn hostile_cookies_and_page_tokens_admit_no_one_and_never_panic() {
        let tokens = AuthTokens(vec![("ops".into(), "secret-one".into())]);
        let cookie = sign_in("secret-one", &tokens).unwrap();
        let pair = cookie.split(';').next().unwrap().to_string();
        let served = headers(&[("host", "127.0.0.1:7000")]);
        let token = page_token(&served);
        let seeds: [&[u8]; 2] = [pair.as_bytes(), token.as_bytes()];
        let cases = mutations::cases(&seeds, 4_000, 0xC00C);
        mutations::check("the console's cookie and page token", &cases, 16, |value| {
            let Ok(value) = http::HeaderValue::from_bytes(value) else {
                return;
            };
            let sent = value.to_str().unwrap_or_default();
            let mut request = headers(&[
                ("host", "127.0.0.1:7000"),
                ("origin", "http://127.0.0.1:7000"),
            ]);
            request.append(header::COOKIE, value.clone());
            request.append(TOKEN_HEADER, value.clone());
            // Only what was handed out admits (a cookie may gain other pairs).
            if signed_in(&request, &tokens) {
                assert!(sent.split(';').any(|part| part.trim() == pair), "{sent}");
            }
            if from_own_page(&request) {
                assert_eq!(sent, token);
            }
        });
    }
}
