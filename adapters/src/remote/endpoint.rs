//! The upstream's URL and headers, checked; references (an HTTP+SSE endpoint, a
//! redirect's `Location`) resolved on its origin only.

use http::header::{HeaderName, HeaderValue};
use http::Uri;

use super::{tls, HttpError};

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

/// Resolves `reference` (an endpoint, a redirect's `Location`) against `base`, on
/// `base`'s origin only: every request carries the configured headers.
pub(super) fn resolve_on_origin(base: &Uri, reference: &str) -> Result<Uri, String> {
    let endpoint = reference.trim();
    if endpoint.contains("://") {
        let uri: Uri = endpoint
            .parse()
            .map_err(|_| format!("`{endpoint}` is not a URL"))?;
        if uri.scheme() != base.scheme() || uri.authority() != base.authority() {
            return Err(format!("`{}` is on another origin", display_url(&uri)));
        }
        return Ok(uri);
    }
    let path_and_query = if endpoint.starts_with('/') {
        endpoint.to_string()
    } else {
        let path = base.path();
        let directory = &path[..path.rfind('/').map_or(0, |slash| slash + 1)];
        let directory = if directory.is_empty() { "/" } else { directory };
        format!("{directory}{endpoint}")
    };
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|_| format!("`{endpoint}` is not a path"))?,
    );
    Uri::from_parts(parts).map_err(|error| error.to_string())
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
}
