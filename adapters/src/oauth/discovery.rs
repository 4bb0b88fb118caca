//! Discovery: the protected resource's metadata (RFC 9728), then its authorization
//! server's (RFC 8414 or OpenID Connect Discovery), in the order the MCP
//! authorization specification (2025-11-25) gives, with the issuer checked.

use serde_json::Value;

use super::http::Http;
use super::OAuthError;

/// What the MCP server says of itself as a protected resource.
#[derive(Clone, Debug)]
pub struct ProtectedResource {
    /// The resource identifier exactly as published: sent as RFC 8707 `resource`.
    pub resource: String,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Option<Vec<String>>,
}

/// An authorization server's metadata, the fields plexus uses.
#[derive(Clone, Debug)]
pub struct ServerMetadata {
    pub issuer: String,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: String,
    pub registration_endpoint: Option<String>,
    pub device_authorization_endpoint: Option<String>,
    pub scopes_supported: Option<Vec<String>>,
    pub grant_types_supported: Option<Vec<String>>,
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    pub client_id_metadata_document_supported: bool,
    /// RFC 9207: the authorization response must carry `iss`.
    pub iss_parameter_supported: bool,
}

/// `scheme://host[:port]` and the path of `url` (no query), or None.
fn split_origin(url: &str) -> Option<(String, String)> {
    let parsed = url::Url::parse(url).ok()?;
    let origin = parsed.origin();
    if !origin.is_tuple() {
        return None;
    }
    let path = parsed.path().trim_end_matches('/').to_string();
    Some((origin.ascii_serialization(), path))
}

/// Where to look for the protected resource metadata of `server_url`: the
/// challenge's `resource_metadata`, then the path-aware well-known URL, then the root.
pub fn resource_metadata_urls(server_url: &str, from_challenge: Option<&str>) -> Vec<String> {
    let mut urls: Vec<String> = from_challenge.map(str::to_string).into_iter().collect();
    if let Some((origin, path)) = split_origin(server_url) {
        if !path.is_empty() {
            urls.push(format!(
                "{origin}/.well-known/oauth-protected-resource{path}"
            ));
        }
        urls.push(format!("{origin}/.well-known/oauth-protected-resource"));
    }
    urls.dedup();
    urls
}

/// The metadata URLs of an issuer, in the specification's order: with a path,
/// OAuth path insertion, OpenID path insertion, OpenID path appending; without,
/// OAuth then OpenID at the root.
pub fn server_metadata_urls(issuer: &str) -> Vec<String> {
    let Some((origin, path)) = split_origin(issuer) else {
        return Vec::new();
    };
    if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    }
}

/// Whether the published `resource` covers the server at `server_url`: the same
/// origin, and a path that is the server's or one of its leading segments.
pub fn resource_covers(resource: &str, server_url: &str) -> bool {
    match (split_origin(resource), split_origin(server_url)) {
        (Some((resource_origin, resource_path)), Some((origin, path))) => {
            resource_origin == origin
                && (path == resource_path
                    || resource_path.is_empty()
                    || path.starts_with(&format!("{resource_path}/")))
        }
        _ => false,
    }
}

fn strings(value: &Value, key: &str) -> Option<Vec<String>> {
    value.get(key).and_then(Value::as_array).map(|items| {
        items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    })
}

fn string(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The protected resource metadata of `server_url`, or None when the server
/// publishes none (a server of 2025-03-26). A published resource that does not
/// cover the server is refused: its tokens would be for someone else.
pub(super) async fn protected_resource(
    http: &Http,
    server_url: &str,
    from_challenge: Option<&str>,
) -> Result<Option<ProtectedResource>, OAuthError> {
    for url in resource_metadata_urls(server_url, from_challenge) {
        let answer = match http.get(&url).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::debug!(url, error = %error, "no protected resource metadata here");
                continue;
            }
        };
        if !answer.is_success() || !answer.json.is_object() {
            continue;
        }
        let json = answer.json;
        let Some(resource) = string(&json, "resource") else {
            return Err(OAuthError::Metadata {
                url,
                reason: "it names no `resource`".into(),
            });
        };
        if !resource_covers(&resource, server_url) {
            return Err(OAuthError::ResourceMismatch {
                resource,
                server: server_url.to_string(),
            });
        }
        return Ok(Some(ProtectedResource {
            resource,
            authorization_servers: strings(&json, "authorization_servers").unwrap_or_default(),
            scopes_supported: strings(&json, "scopes_supported"),
        }));
    }
    Ok(None)
}

/// The metadata of the authorization server `issuer`: the first of its
/// well-known URLs that answers, whose `issuer` must be `issuer` exactly (RFC
/// 8414 §3.3, no normalization). None when none answers.
pub(super) async fn server_metadata(
    http: &Http,
    issuer: &str,
) -> Result<Option<ServerMetadata>, OAuthError> {
    for url in server_metadata_urls(issuer) {
        let answer = match http.get(&url).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::debug!(url, error = %error, "no authorization server metadata here");
                continue;
            }
        };
        if !answer.is_success() || !answer.json.is_object() {
            continue;
        }
        let json = answer.json;
        let published = string(&json, "issuer").unwrap_or_default();
        if published != issuer {
            return Err(OAuthError::IssuerMismatch {
                expected: issuer.to_string(),
                published,
            });
        }
        let Some(token_endpoint) = string(&json, "token_endpoint") else {
            return Err(OAuthError::Metadata {
                url,
                reason: "it names no `token_endpoint`".into(),
            });
        };
        return Ok(Some(ServerMetadata {
            issuer: published,
            authorization_endpoint: string(&json, "authorization_endpoint"),
            token_endpoint,
            registration_endpoint: string(&json, "registration_endpoint"),
            device_authorization_endpoint: string(&json, "device_authorization_endpoint"),
            scopes_supported: strings(&json, "scopes_supported"),
            grant_types_supported: strings(&json, "grant_types_supported"),
            token_endpoint_auth_methods_supported: strings(
                &json,
                "token_endpoint_auth_methods_supported",
            ),
            client_id_metadata_document_supported: json
                .get("client_id_metadata_document_supported")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            iss_parameter_supported: json
                .get("authorization_response_iss_parameter_supported")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }));
    }
    Ok(None)
}

/// A server of 2025-03-26 without metadata: the default endpoints at the
/// authorization base URL (the MCP server's origin).
pub(super) fn fallback_metadata(server_url: &str) -> Option<ServerMetadata> {
    let (origin, _) = split_origin(server_url)?;
    Some(ServerMetadata {
        issuer: origin.clone(),
        authorization_endpoint: Some(format!("{origin}/authorize")),
        token_endpoint: format!("{origin}/token"),
        registration_endpoint: Some(format!("{origin}/register")),
        device_authorization_endpoint: None,
        scopes_supported: None,
        grant_types_supported: None,
        token_endpoint_auth_methods_supported: None,
        client_id_metadata_document_supported: false,
        iss_parameter_supported: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_urls_follow_the_specifications_order() {
        assert_eq!(
            resource_metadata_urls("http://h:1/mcp", Some("http://h:1/custom.json")),
            [
                "http://h:1/custom.json",
                "http://h:1/.well-known/oauth-protected-resource/mcp",
                "http://h:1/.well-known/oauth-protected-resource",
            ]
        );
        assert_eq!(
            server_metadata_urls("https://as.example/tenant1"),
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant1",
                "https://as.example/.well-known/openid-configuration/tenant1",
                "https://as.example/tenant1/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            server_metadata_urls("http://localhost:5"),
            [
                "http://localhost:5/.well-known/oauth-authorization-server",
                "http://localhost:5/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn a_resource_covers_its_server_and_nothing_else() {
        assert!(resource_covers("http://h:1/mcp", "http://h:1/mcp"));
        assert!(resource_covers("http://h:1", "http://h:1/mcp"));
        assert!(resource_covers("http://h:1/", "http://h:1/mcp"));
        assert!(!resource_covers(
            "https://evil.example.com/mcp",
            "http://h:1/mcp"
        ));
        assert!(!resource_covers("http://h:1/mc", "http://h:1/mcp"));
        assert!(!resource_covers("http://h:2/mcp", "http://h:1/mcp"));
    }

    #[test]
    fn hostile_urls_make_well_known_urls_on_their_own_origin_only() {
        let seeds: [&[u8]; 3] = [
            b"https://mcp.example.com:8443/tenant/mcp/",
            b"http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp",
            b"https://auth.example.com/realms/a?b=c#d",
        ];
        let mut cases = mutations::cases(&seeds, 3_000, 0xD15C);
        // These come from the config or a response's header (hyper reads heads of
        // at most 64 KiB): the megabyte cases would only time the URL parser.
        cases.retain(|case| case.len() <= 64 * 1024);
        mutations::check("well-known URLs", &cases, 64, |input| {
            let url = String::from_utf8_lossy(input);
            let origin = split_origin(&url).map(|(origin, _)| origin);
            for made in resource_metadata_urls(&url, None)
                .into_iter()
                .chain(server_metadata_urls(&url))
            {
                let made_origin = split_origin(&made).map(|(origin, _)| origin);
                assert_eq!(made_origin, origin, "{url} made {made}");
            }
            let _ = resource_covers(&url, "http://127.0.0.1:9/mcp");
        });
    }
}
