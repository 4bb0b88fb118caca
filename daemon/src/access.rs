//! Who may use an HTTP listener: the `Host` and `Origin` checks that keep a browser
//! page from reaching the daemon (DNS rebinding), and the bearer tokens that name
//! each request's principal. Shared by the MCP front and the admin listener; the
//! front hands a bearer token that is no static token to `sso` when
//! `[daemon.oauth]` admits access tokens.

use http::{header, HeaderMap};

use crate::config::DaemonSettings;
use crate::listener::is_loopback_host;

/// The principal of a request on an open loopback listener (no tokens configured).
pub const LOCAL_PRINCIPAL: &str = "local";

/// Why a request is refused before anything else looks at it.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed: two `Host` or two `Origin` headers, or none of `Host`.
    BadRequest(&'static str),
    /// A `Host` or `Origin` this daemon does not answer.
    Forbidden(&'static str),
    /// No valid bearer token; `presented` when one was sent but is not valid.
    Unauthorized { presented: bool },
    /// An access token could not be checked: the identity provider's keys are out of reach.
    KeysUnavailable,
}

impl Refusal {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Refusal::BadRequest(_) => http::StatusCode::BAD_REQUEST,
            Refusal::Forbidden(_) => http::StatusCode::FORBIDDEN,
            Refusal::Unauthorized { .. } => http::StatusCode::UNAUTHORIZED,
            Refusal::KeysUnavailable => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A word for the error's `data.kind` and the metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::BadRequest(_) => "bad_request",
            Refusal::Forbidden(_) => "forbidden",
            Refusal::Unauthorized { .. } => "unauthorized",
            Refusal::KeysUnavailable => "keys_unavailable",
        }
    }

    pub fn message(&self) -> &'static str {
        match self {
            Refusal::BadRequest(message) | Refusal::Forbidden(message) => message,
            Refusal::Unauthorized { presented: false } => {
                "unauthorized: send a bearer token (Authorization: Bearer <token>)"
            }
            Refusal::Unauthorized { presented: true } => {
                "unauthorized: the bearer token is not valid"
            }
            Refusal::KeysUnavailable => {
                "the identity provider's signing keys could not be fetched; try again later"
            }
        }
    }

    /// The `WWW-Authenticate` challenge a 401 carries (RFC 6750).
    pub fn challenge(&self) -> Option<&'static str> {
        match self {
            Refusal::Unauthorized { presented: false } => Some("Bearer realm=\"plexus\""),
            Refusal::Unauthorized { presented: true } => {
                Some("Bearer realm=\"plexus\", error=\"invalid_token\"")
            }
            _ => None,
        }
    }
}

/// Who a request to the front says it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Credential {
    /// A static token's name, or `local` on an open listener.
    Principal(String),
    /// A bearer token that is no static token, for `[daemon.oauth]` to check.
    AccessToken(String),
}

/// The front's principal: a static token's name, `local` when neither tokens nor
/// `[daemon.oauth]` are configured, else the bearer token for `sso` to check.
pub fn front_credential(
    headers: &HeaderMap,
    settings: &DaemonSettings,
) -> Result<Credential, Refusal> {
    if settings.oauth.is_none() {
        return authenticate(headers, settings).map(Credential::Principal);
    }
    let token = bearer(headers)?;
    match settings.auth_tokens.principal(token) {
        Some(name) => Ok(Credential::Principal(name.to_string())),
        None => Ok(Credential::AccessToken(token.to_string())),
    }
}

/// The one bearer token of `Authorization`.
fn bearer(headers: &HeaderMap) -> Result<&str, Refusal> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(Refusal::Unauthorized {
            presented: headers.contains_key(header::AUTHORIZATION),
        });
    };
    value
        .to_str()
        .ok()
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|token| !token.is_empty())
        .ok_or(Refusal::Unauthorized { presented: true })
}

/// Exactly one `Host`, a loopback name or one of `allowed_hosts`; at most one
/// `Origin`, a loopback origin or one of `allowed_origins`.
pub fn check_host_and_origin(
    headers: &HeaderMap,
    settings: &DaemonSettings,
) -> Result<(), Refusal> {
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin = origins.next();
    if origins.next().is_some() {
        return Err(Refusal::BadRequest("more than one Origin header"));
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::BadRequest("more than one Host header"));
    }
    if let Some(origin) = origin {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| origin_allowed(origin, &settings.allowed_origins));
        if !allowed {
            return Err(Refusal::Forbidden(
                "origin not allowed (a deployment behind a proxy lists it in [daemon] allowed_origins)",
            ));
        }
    }
    let Some(host) = host else {
        return Err(Refusal::BadRequest("missing Host header"));
    };
    let allowed = host
        .to_str()
        .is_ok_and(|host| host_allowed(host, &settings.allowed_hosts));
    if !allowed {
        return Err(Refusal::Forbidden(
            "host not allowed (a deployment beyond loopback lists its names in [daemon] allowed_hosts)",
        ));
    }
    Ok(())
}

/// The principal of a request: the name of the bearer token it carries, or `local`
/// when no tokens are configured (config validation allows that only on loopback).
pub fn authenticate(headers: &HeaderMap, settings: &DaemonSettings) -> Result<String, Refusal> {
    if settings.auth_tokens.is_empty() {
        return Ok(LOCAL_PRINCIPAL.to_string());
    }
    settings
        .auth_tokens
        .principal(bearer(headers)?)
        .map(str::to_string)
        .ok_or(Refusal::Unauthorized { presented: true })
}

fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if is_loopback_host(host) {
        return true;
    }
    let host = host.to_ascii_lowercase();
    // The name without its port (`name:port`, `[v6]:port`).
    let name = match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.contains(':') || name.ends_with(']')) =>
        {
            name
        }
        _ => host.as_str(),
    };
    allowed.iter().any(|entry| *entry == host || *entry == name)
}

fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    let loopback = ["http://", "https://"]
        .iter()
        .any(|scheme| origin.strip_prefix(scheme).is_some_and(is_loopback_host));
    loopback || {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        allowed.contains(&origin)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let allowed = vec![
            "plexus.example".to_string(),
            "tools.example:8443".to_string(),
        ];
        for host in [
            "localhost:7464",
            "127.0.0.1",
            "[::1]:7464",
            "plexus.example",
            "PLEXUS.example:443",
            "tools.example:8443",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in [
            "localhost.evil.example",
            "evil.example",
            "tools.example:9000",
            "tools.example",
            "127.0.0.1.evil.example:80",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
        let origins = vec!["https://app.example".to_string()];
        for origin in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "https://app.example",
            "https://APP.example/",
        ] {
            assert!(origin_allowed(origin, &origins), "{origin}");
        }
        for origin in [
            "null",
            "https://evil.example",
            "http://localhost.evil.example",
            "https://app.example.evil",
        ] {
            assert!(!origin_allowed(origin, &origins), "{origin}");
        }
    }

    #[test]
    fn hostile_hosts_origins_and_tokens_are_refused_and_never_panic() {
        let allowed = vec![
            "plexus.example".to_string(),
            "tools.example:8443".to_string(),
        ];
        let seeds: [&[u8]; 5] = [
            b"[::1]:7464",
            b"PLEXUS.example:443",
            b"https://127.0.0.1",
            b"Bearer a-token-long-enough-0000",
            b"localhost.evil.example",
        ];
        let config = r#"
            [daemon]
            auth_tokens = { ci = "a-token-long-enough-0000" }
            allowed_hosts = ["plexus.example", "tools.example:8443"]
        "#;
        let settings = crate::config::parse(config, std::path::Path::new("/etc/plexus"), &|_| None)
            .unwrap()
            .daemon;
        let cases = mutations::cases(&seeds, 4_000, 0xACCE);
        mutations::check("Host, Origin, Authorization", &cases, 16, |value| {
            let text = String::from_utf8_lossy(value);
            // A name allowed only for being loopback is one.
            if host_allowed(&text, &allowed) {
                let lower = text.to_ascii_lowercase();
                assert!(
                    is_loopback_host(&text)
                        || allowed.iter().any(|a| lower.starts_with(a.as_str())),
                    "{text}"
                );
            }
            if origin_allowed(&text, &[]) {
                assert!(text.starts_with("http://") || text.starts_with("https://"));
            }
            let Ok(value) = http::HeaderValue::from_bytes(value) else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, value.clone());
            headers.insert(header::ORIGIN, value.clone());
            headers.insert(header::AUTHORIZATION, value);
            let _ = check_host_and_origin(&headers, &settings);
            if let Ok(principal) = authenticate(&headers, &settings) {
                assert_eq!(principal, "ci");
                assert!(text.trim_end().ends_with("a-token-long-enough-0000"));
            }
        });
    }
}
