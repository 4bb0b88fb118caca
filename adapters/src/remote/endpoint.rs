//! The upstream's URL and headers, checked; the user and password in a URL taken
//! out for Basic authentication; references (an HTTP+SSE endpoint, a redirect's
//! `Location`) resolved on its origin only.

use std::fmt;

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use http::Uri;
use url::Url;

use super::{tls, HttpError};
use crate::launch::percent_decode;

/// Header names plexus sets itself; a configured one would contradict it.
const MANAGED_HEADERS: &[&str] = &[
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "last-event-id",
    "mcp-method",
    "mcp-name",
    "mcp-protocol-version",
    "mcp-session-id",
    "transfer-encoding",
];

/// Checks that `url` is an absolute `http://` (or, with TLS, `https://`) URL.
pub fn check_url(url: &str) -> Result<Uri, HttpError> {
    let bad = |reason: &str| HttpError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|error: http::uri::InvalidUri| bad(&error.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if tls::AVAILABLE => {}
        Some("https") => return Err(bad(tls::MISSING)),
        _ => return Err(bad("the scheme must be http or https")),
    }
    if uri
        .authority()
        .is_none_or(|authority| authority.host().is_empty())
    {
        return Err(bad("it names no host"));
    }
    Ok(uri)
}

/// The user and password a URL carries (`https://user:pw@host/…`), decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    /// Empty when the URL names none.
    pub password: String,
}

impl Credentials {
    /// The `Authorization` value they make (RFC 7617: `user:password`, base64).
    pub fn basic_authorization(&self) -> String {
        let pair = format!("{}:{}", self.user, self.password);
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        format!("Basic {encoded}")
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"…")
            .finish()
    }
}

/// `url` without its user and password, so it can be logged, and them, decoded.
/// A URL without them is returned as written. An error never shows them.
pub fn split_credentials(url: &str) -> Result<(String, Option<Credentials>), HttpError> {
    let mut parsed = match Url::parse(url) {
        Ok(parsed) => parsed,
        // check_url says what is wrong with it, when that cannot show a password.
        Err(_) if !url.contains('@') => return Ok((url.to_string(), None)),
        Err(error) => {
            let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
            return Err(HttpError::BadUrl {
                url: format!("{scheme}://…"),
                reason: error.to_string(),
            });
        }
    };
    if parsed.username().is_empty() && parsed.password().is_none() {
        return Ok((url.to_string(), None));
    }
    let user = percent_decode(parsed.username());
    let password = percent_decode(parsed.password().unwrap_or_default());
    // Cannot fail for a URL with a host, which one with a user has.
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let url = parsed.to_string();
    match (user, password) {
        (Ok(user), Ok(password)) => Ok((url, Some(Credentials { user, password }))),
        _ => Err(HttpError::BadCredentials { url }),
    }
}

/// Checks one configured header; the value is never part of an error.
pub fn check_header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), HttpError> {
    let bad = |reason: &str| HttpError::BadHeader {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    let header =
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("not a valid HTTP header name"))?;
    if MANAGED_HEADERS.contains(&header.as_str()) {
        return Err(bad("plexus sets this header itself"));
    }
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| bad("the value has characters HTTP headers cannot carry"))?;
    value.set_sensitive(true);
    Ok((header, value))
}

/// A URL as it may appear in logs and errors: the query (which may hold a key) left out.
pub(super) fn display_url(uri: &Uri) -> String {
    let mut text = format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map(|a| a.as_str()).unwrap_or(""),
        uri.path()
    );
    if uri.query().is_some() {
        text.push_str("?…");
    }
    text
}

/// Resolves an HTTP+SSE `endpoint` against the URL; it must stay on the same
/// origin, since every POST carries the configured headers.
pub(super) fn resolve_endpoint(base: &Uri, endpoint: &str) -> Result<Uri, String> {
    resolve_on_origin(base, endpoint).map_err(|reason| format!("the endpoint {reason}"))
}

/// Resolves `reference` (an endpoint, a redirect's `Location`) against `base` as
/// RFC 3986 §5 says, on `base`'s origin only: every request carries the configured
/// headers. A fragment is left out: no request target carries one.
pub(super) fn resolve_on_origin(base: &Uri, reference: &str) -> Result<Uri, String> {
    let reference = reference.trim();
    let not_a_url = || format!("`{reference}` is not a URL");
    let base = Url::parse(&base.to_string()).map_err(|error| error.to_string())?;
    let mut resolved = base.join(reference).map_err(|_| not_a_url())?;
    resolved.set_fragment(None);
    let uri: Uri = resolved.as_str().parse().map_err(|_| not_a_url())?;
    if resolved.origin() != base.origin() {
        return Err(format!("`{}` is on another origin", display_url(&uri)));
    }
    Ok(uri)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_headers_are_checked_without_showing_values() {
        assert!(check_url("http://127.0.0.1:8080/mcp").is_ok());
        assert_eq!(
            check_url("https://example.invalid/mcp").is_ok(),
            cfg!(feature = "tls")
        );
        assert!(check_url("ftp://example.invalid/mcp").is_err());
        assert!(check_url("/mcp").is_err());
        assert!(check_url("http:///mcp").is_err());
        let error = check_header("Authorization", "Bearer \nsecret").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
        assert!(check_header("Mcp-Session-Id", "x").is_err());
        assert!(check_header("bad header", "x").is_err());
        let (name, value) = check_header("X-Api-Key", "k").unwrap();
        assert_eq!((name.as_str(), value.is_sensitive()), ("x-api-key", true));
    }

    #[test]
    fn endpoints_resolve_on_the_same_origin_only() {
        let base: Uri = "http://127.0.0.1:9/sse".parse().unwrap();
        let resolve = |endpoint| resolve_endpoint(&base, endpoint).map(|uri| uri.to_string());
        assert_eq!(
            resolve("/messages/?session_id=ab").unwrap(),
            "http://127.0.0.1:9/messages/?session_id=ab"
        );
        assert_eq!(
            resolve("messages?s=1").unwrap(),
            "http://127.0.0.1:9/messages?s=1"
        );
        assert_eq!(
            resolve("http://127.0.0.1:9/m?s=2").unwrap(),
            "http://127.0.0.1:9/m?s=2"
        );
        assert!(resolve("http://elsewhere.invalid/m").is_err());
        let nested: Uri = "http://h/a/b/sse?key=secret".parse().unwrap();
        assert_eq!(
            resolve_endpoint(&nested, "post").unwrap().to_string(),
            "http://h/a/b/post"
        );
        assert_eq!(display_url(&nested), "http://h/a/b/sse?…");
    }

    /// `reference` resolved against `base` as a URL, or None when it is refused.
    fn resolved(base: &str, reference: &str) -> Option<String> {
        let base: Uri = base.parse().unwrap();
        resolve_on_origin(&base, reference)
            .ok()
            .map(|uri| uri.to_string())
    }

    /// RFC 3986 §5.4.1 and §5.4.2, base `http://a/b/c/d;p?q`. A fragment is left
    /// out of what is resolved (a request target carries none), and a reference to
    /// another origin (`g:h`, `//g`) is refused.
    #[test]
    fn references_resolve_as_rfc_3986_says() {
        let base = "http://a/b/c/d;p?q";
        let normal = [
            ("g:h", None),
            ("g", Some("http://a/b/c/g")),
            ("./g", Some("http://a/b/c/g")),
            ("g/", Some("http://a/b/c/g/")),
            ("/g", Some("http://a/g")),
            ("//g", None),
            ("?y", Some("http://a/b/c/d;p?y")),
            ("g?y", Some("http://a/b/c/g?y")),
            ("#s", Some("http://a/b/c/d;p?q")),
            ("g#s", Some("http://a/b/c/g")),
            ("g?y#s", Some("http://a/b/c/g?y")),
            (";x", Some("http://a/b/c/;x")),
            ("g;x", Some("http://a/b/c/g;x")),
            ("g;x?y#s", Some("http://a/b/c/g;x?y")),
            ("", Some("http://a/b/c/d;p?q")),
            (".", Some("http://a/b/c/")),
            ("./", Some("http://a/b/c/")),
            ("..", Some("http://a/b/")),
            ("../", Some("http://a/b/")),
            ("../g", Some("http://a/b/g")),
            ("../..", Some("http://a/")),
            ("../../", Some("http://a/")),
            ("../../g", Some("http://a/g")),
        ];
        let abnormal = [
            ("../../../g", Some("http://a/g")),
            ("../../../../g", Some("http://a/g")),
            ("/./g", Some("http://a/g")),
            ("/../g", Some("http://a/g")),
            ("g.", Some("http://a/b/c/g.")),
            (".g", Some("http://a/b/c/.g")),
            ("g..", Some("http://a/b/c/g..")),
            ("..g", Some("http://a/b/c/..g")),
            ("./../g", Some("http://a/b/g")),
            ("./g/.", Some("http://a/b/c/g/")),
            ("g/./h", Some("http://a/b/c/g/h")),
            ("g/../h", Some("http://a/b/c/h")),
            ("g;x=1/./y", Some("http://a/b/c/g;x=1/y")),
            ("g;x=1/../y", Some("http://a/b/c/y")),
            ("g?y/./x", Some("http://a/b/c/g?y/./x")),
            ("g?y/../x", Some("http://a/b/c/g?y/../x")),
            ("g#s/./x", Some("http://a/b/c/g")),
            ("g#s/../x", Some("http://a/b/c/g")),
            // §5.4.2 allows either; a scheme-relative `http:g` is taken as `g`.
            ("http:g", Some("http://a/b/c/g")),
        ];
        for (reference, expected) in normal.into_iter().chain(abnormal) {
            assert_eq!(
                resolved(base, reference).as_deref(),
                expected,
                "`{reference}` against {base}"
            );
        }
    }

    #[test]
    fn queries_network_paths_and_dot_segments_resolve_on_the_origin() {
        assert_eq!(resolved("http://h/mcp", "?x").unwrap(), "http://h/mcp?x");
        assert_eq!(
            resolved("http://h/a/b/sse", "../messages?s=1").unwrap(),
            "http://h/a/messages?s=1"
        );
        assert_eq!(
            resolved("http://h:8080/mcp", "//h:8080/other").unwrap(),
            "http://h:8080/other"
        );
        // Another host, port or scheme is another origin.
        assert_eq!(resolved("http://h:8080/mcp", "//elsewhere/p"), None);
        assert_eq!(resolved("http://h:8080/mcp", "//h:9090/p"), None);
        assert_eq!(resolved("http://h/mcp", "https://h/mcp"), None);
        // The default port names the same origin.
        assert_eq!(
            resolved("http://h/mcp", "http://h:80/mcp/").unwrap(),
            "http://h/mcp/"
        );
        let refused = resolve_on_origin(&"http://h/mcp".parse().unwrap(), "//elsewhere/p?key=1");
        assert_eq!(
            refused.unwrap_err(),
            "`http://elsewhere/p?…` is on another origin"
        );
    }

    #[test]
    fn credentials_leave_the_url_decoded() {
        let split = |url| split_credentials(url).unwrap();
        let credentials = |user: &str, password: &str| {
            Some(Credentials {
                user: user.to_string(),
                password: password.to_string(),
            })
        };
        assert_eq!(
            split("https://me:p%40ss@notes.example:8443/mcp?x=1"),
            (
                "https://notes.example:8443/mcp?x=1".to_string(),
                credentials("me", "p@ss")
            )
        );
        // The last `@` ends them; `:` and `@` may be escaped.
        assert_eq!(
            split("http://me:p@ss@h/mcp"),
            ("http://h/mcp".to_string(), credentials("me", "p@ss"))
        );
        assert_eq!(
            split("http://ops:p%40ss%3Aword@h/mcp").1,
            credentials("ops", "p@ss:word")
        );
        // `${NAME}` comes back as written, for the configuration to expand.
        assert_eq!(
            split("http://ops:${PW}@h/mcp").1,
            credentials("ops", "${PW}")
        );
        assert_eq!(split("http://me@h/mcp").1, credentials("me", ""));
        assert_eq!(
            split("https://notes.example/a@b"),
            ("https://notes.example/a@b".to_string(), None)
        );
        assert_eq!(split("http://h:8080"), ("http://h:8080".to_string(), None));
        for bad in ["http://me:p%zz@h/mcp", "http://me:%ff@h/mcp"] {
            let error = split_credentials(bad).unwrap_err();
            assert_eq!(
                error.to_string(),
                "the user and password in `http://h/mcp` are not valid percent-encoding"
            );
        }
        let error = split_credentials("http://me:secret@h:99999/mcp").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[test]
    fn credentials_make_basic_authorization() {
        let credentials = |user: &str, password: &str| Credentials {
            user: user.to_string(),
            password: password.to_string(),
        };
        // RFC 7617's example.
        assert_eq!(
            credentials("Aladdin", "open sesame").basic_authorization(),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        // The colon is there without a password.
        assert_eq!(credentials("me", "").basic_authorization(), "Basic bWU6");
        assert!(!format!("{:?}", credentials("me", "secret")).contains("secret"));
    }

    #[test]
    fn hostile_urls_endpoints_and_headers_are_checked_and_never_panic() {
        let seeds: [&[u8]; 6] = [
            b"https://user:p%40ss@mcp.example.com:8443/sse?key=1#frag",
            b"/messages?sessionId=abc",
            b"//127.0.0.1:9/messages",
            b"../../a/./b/../c?x=%41",
            b"http://[::1]:80/mcp",
            b"X-Api-Key: v\xc3\xa9",
        ];
        let base: Uri = "http://127.0.0.1:9/sse/".parse().unwrap();
        let mut cases = mutations::cases(&seeds, 3_000, 0xE9D);
        // These come from the config or a response's header (hyper reads heads of
        // at most 64 KiB): the megabyte cases would only time the URL parser.
        cases.retain(|case| case.len() <= 64 * 1024);
        mutations::check("URLs and endpoints", &cases, 64, |input| {
            let text = String::from_utf8_lossy(input);
            if let Ok(uri) = check_url(&text) {
                assert!(uri.host().is_some());
                let _ = display_url(&uri);
            }
            // The credentials are gone from what may be logged.
            if let Ok((url, Some(Credentials { user, .. }))) = split_credentials(&text) {
                assert!(user.is_empty() || !url.contains(&format!("{user}@")));
            }
            if let Ok(uri) = resolve_endpoint(&base, &text) {
                assert_eq!(uri.authority(), base.authority(), "{text}");
                assert_eq!(uri.scheme(), base.scheme());
            }
            if let Some((name, value)) = text.split_once(':') {
                let _ = check_header(name, value.trim());
            }
        });
    }
}
