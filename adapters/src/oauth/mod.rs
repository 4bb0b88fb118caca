//! plexus as an OAuth 2.1 client of a hosted MCP server (the MCP authorization
//! specification, 2025-11-25 and 2026-07-28): from a 401's `WWW-Authenticate:
//! Bearer` challenge to an access token, and the same again for a step-up (a
//! 403 `insufficient_scope`) or an expired token.
//!
//! Discovery (`discovery.rs`): protected resource metadata (RFC 9728), then the
//! authorization server's (RFC 8414 / OpenID), its `issuer` compared exactly.
//! Registration, in the specification's order: a Client ID Metadata Document URL
//! (when the server supports them and one is configured), a pre-registered
//! client, an RFC 7591 registration kept in the store and reused. Grants:
//! authorization code with PKCE S256 and a loopback redirect (`loopback.rs`),
//! the device grant (RFC 8628), client credentials with a secret or a
//! `private_key_jwt` assertion (`assertion.rs`); refresh. RFC 8707 `resource`
//! goes on every authorization and token request; RFC 9207 `iss` is checked.
//!
//! Tokens and secrets never reach a log or an error: errors carry the server's
//! `error` and `error_description`, never a request's form.

mod assertion;
mod challenge;
pub mod discovery;
mod grants;
mod http;
mod loopback;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::http::header::HeaderValue;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};

pub use challenge::Challenge;
use discovery::{ProtectedResource, ServerMetadata};
use http::{Answer, Http};
pub use store::{Registration, Stored, TokenStore, Tokens};

/// At most this many authorizations per client object: a server that keeps
/// refusing (a scope it never grants) ends in an error, not a loop.
pub const MAX_AUTHORIZATIONS: u32 = 3;
/// A token this close to its expiry is refreshed before use.
const EXPIRY_MARGIN_S: u64 = 60;
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("no HTTP client: {0}")]
    Client(String),
    #[error("{url}: {reason}")]
    Exchange { url: String, reason: String },
    #[error("the metadata at {url} is not usable: {reason}")]
    Metadata { url: String, reason: String },
    #[error("the server's protected resource metadata names `{resource}`, which is not {server}: refusing to obtain a token for it")]
    ResourceMismatch { resource: String, server: String },
    #[error("the authorization server metadata names issuer `{published}`, not `{expected}`: refusing it")]
    IssuerMismatch { expected: String, published: String },
    #[error("{server} names no authorization server")]
    NoAuthorizationServer { server: String },
    #[error("no client for {issuer}: it takes no dynamic registration; configure `client_id` (and `client_secret`) in the upstream's `oauth` table")]
    NoRegistration { issuer: String },
    #[error("registering with {issuer} failed: {reason}")]
    Registration { issuer: String, reason: String },
    #[error("the authorization was refused: {0}")]
    Authorization(String),
    #[error("the authorization response {0}: refusing its code (RFC 9207)")]
    Issuer(String),
    #[error("the token request to {endpoint} failed: {reason}")]
    Token {
        endpoint: String,
        reason: String,
        code: Option<String>,
    },
    #[error("no authorization arrived within {} s", .0.as_secs())]
    NoRedirect(Duration),
    #[error("the loopback redirect listener: {0}")]
    Loopback(#[source] std::io::Error),
    #[error("the token store {}", path.display())]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the client assertion: {0}")]
    Assertion(String),
    #[error("gave up after {0} authorizations: the server keeps refusing the token")]
    TooManyAttempts(u32),
    #[error("{0}")]
    GrantUnavailable(String),
}

impl OAuthError {
    /// The refresh token is no longer good (`invalid_grant`): a new login is needed.
    pub fn is_invalid_grant(&self) -> bool {
        matches!(self, OAuthError::Token { code: Some(code), .. } if code == "invalid_grant")
    }
}

/// Whether `name` is a JWS algorithm a `private_key_jwt` assertion can be signed with.
pub fn is_signing_algorithm(name: &str) -> bool {
    assertion::algorithm(name).is_ok()
}

/// How plexus obtains tokens (the upstream's `[upstreams.NAME.oauth]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Grant {
    #[default]
    AuthorizationCode,
    DeviceCode,
    ClientCredentials,
}

/// The client's configuration. No `Debug`: it holds secrets.
#[derive(Clone, Default)]
pub struct Settings {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// Scopes asked for whatever the server says.
    pub scopes: Option<Vec<String>>,
    pub grant: Grant,
    /// The PEM of the key for `private_key_jwt`.
    pub private_key_pem: Option<Vec<u8>>,
    pub signing_algorithm: Option<String>,
    /// `[daemon] oauth_client_metadata_url`: a Client ID Metadata Document URL.
    pub client_metadata_url: Option<String>,
}

/// What a person must do for an authorization.
pub enum Prompt<'a> {
    /// Open this URL (done with `$BROWSER` when set).
    Url(&'a str),
    /// Enter `user_code` at `verification_uri`.
    DeviceCode {
        verification_uri: &'a str,
        user_code: &'a str,
        complete: Option<&'a str>,
    },
}

/// How a person is reached: `browser` is a command given the URL as its last
/// argument (`$BROWSER`); `prompt` shows what they must do (on stderr).
#[derive(Clone)]
pub struct Interaction {
    pub browser: Option<String>,
    /// No browser can be opened here (a headless machine, or `plexus login
    /// --device`): the device grant is used wherever the server offers it.
    pub device: bool,
    pub prompt: Arc<dyn Fn(&Prompt<'_>) + Send + Sync>,
    /// How long a person has to finish.
    pub wait: Duration,
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

/// `bytes` random bytes, base64url without padding.
pub(crate) fn random_text(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    rand::fill(&mut buffer[..]);
    URL_SAFE_NO_PAD.encode(buffer)
}

/// Where authorization happens for one MCP server.
struct Authority {
    resource: String,
    metadata: ServerMetadata,
    scopes_supported: Option<Vec<String>>,
}

/// The OAuth client of one MCP server.
pub struct OAuthClient {
    http: Http,
    server_url: String,
    settings: Settings,
    store: TokenStore,
    stored: Stored,
    interaction: Interaction,
    authorizations: u32,
    /// The current token was read from the store, not obtained now: a 401 for it
    /// is worth a refresh before a new authorization.
    token_from_store: bool,
}

impl OAuthClient {
    pub fn new(
        server_url: &str,
        settings: Settings,
        store: TokenStore,
        interaction: Interaction,
    ) -> Result<OAuthClient, OAuthError> {
        let stored = store.load();
        Ok(OAuthClient {
            http: Http::new()?,
            server_url: server_url.to_string(),
            settings,
            store,
            token_from_store: stored.tokens.is_some(),
            stored,
            interaction,
            authorizations: 0,
        })
    }

    /// The access token held, if any (possibly expired: see [`Self::fresh_token`]).
    pub fn access_token(&self) -> Option<&str> {
        self.stored
            .tokens
            .as_ref()
            .map(|tokens| tokens.access_token.as_str())
    }

    /// Whether tokens are held (from the store or obtained now).
    pub fn has_tokens(&self) -> bool {
        self.stored.tokens.is_some()
    }

    /// When the token held is due for a refresh, in seconds since the epoch: a
    /// minute before it expires, or half its lifetime before when it lives less
    /// than two minutes. None when it does not expire (or none is held).
    pub fn refresh_due(&self) -> Option<u64> {
        let tokens = self.stored.tokens.as_ref()?;
        let expires_at = tokens.expires_at?;
        let margin = match tokens.issued_at {
            Some(issued) => EXPIRY_MARGIN_S.min(expires_at.saturating_sub(issued) / 2),
            None => EXPIRY_MARGIN_S,
        };
        Some(expires_at.saturating_sub(margin))
    }

    /// Refreshes the token held now (RFC 6749 §6), whatever its expiry; an
    /// `invalid_grant` forgets it (a new login is needed).
    pub async fn refresh_now(&mut self) -> Result<String, OAuthError> {
        self.refresh().await
    }

    /// The token held, refreshed first when it is about to expire and can be.
    pub async fn fresh_token(&mut self) -> Result<Option<String>, OAuthError> {
        let expiring = self.refresh_due().is_some_and(|due| due <= now());
        if expiring {
            let refreshed = self.refresh().await;
            if let Err(error) = &refreshed {
                tracing::info!(server = %self.server_url, error = %error, "refreshing the OAuth token failed");
            }
        }
        Ok(self.access_token().map(str::to_string))
    }

    /// Obtains a token after `challenge` refused the current one (or its
    /// absence): refreshed when it came from the store, else a new
    /// authorization; a step-up asks for the scopes held plus those challenged.
    pub async fn answer(&mut self, challenge: &Challenge) -> Result<String, OAuthError> {
        let authority = self.authority(challenge).await?;
        let step_up = challenge.is_insufficient_scope();
        let held_here = self
            .stored
            .tokens
            .as_ref()
            .is_some_and(|tokens| tokens.issuer == authority.metadata.issuer);
        if self.token_from_store && held_here && !step_up {
            self.token_from_store = false;
            match self.refresh().await {
                Ok(token) => return Ok(token),
                Err(error) => {
                    tracing::info!(server = %self.server_url, error = %error, "refreshing the OAuth token failed; authorizing anew")
                }
            }
        }
        self.token_from_store = false;
        self.authorizations += 1;
        if self.authorizations > MAX_AUTHORIZATIONS {
            return Err(OAuthError::TooManyAttempts(MAX_AUTHORIZATIONS));
        }
        let scopes = self.scopes_for(challenge, &authority, held_here && step_up);
        let device_offered = authority.metadata.device_authorization_endpoint.is_some();
        let tokens = match self.settings.grant {
            Grant::ClientCredentials => self.client_credentials(&authority, &scopes).await?,
            Grant::DeviceCode if device_offered => self.device_code(&authority, &scopes).await?,
            Grant::AuthorizationCode if device_offered && self.interaction.device => {
                self.device_code(&authority, &scopes).await?
            }
            Grant::DeviceCode | Grant::AuthorizationCode => {
                self.authorization_code(&authority, &scopes).await?
            }
        };
        let token = tokens.access_token.clone();
        self.stored.tokens = Some(tokens);
        self.store.save(&self.stored)?;
        Ok(token)
    }

    /// Forgets the tokens (the registrations are kept: they are reused).
    pub fn forget_tokens(&mut self) -> Result<(), OAuthError> {
        self.stored.tokens = None;
        self.store.save(&self.stored)
    }

    /// Discovery: the resource, its authorization server and that server's metadata.
    async fn authority(&self, challenge: &Challenge) -> Result<Authority, OAuthError> {
        let resource = discovery::protected_resource(
            &self.http,
            &self.server_url,
            challenge.resource_metadata(),
        )
        .await?;
        let Some(ProtectedResource {
            resource,
            authorization_servers,
            scopes_supported,
        }) = resource
        else {
            // A server of 2025-03-26: its origin is the authorization server.
            let metadata = match discovery::fallback_metadata(&self.server_url) {
                Some(fallback) => discovery::server_metadata(&self.http, &fallback.issuer)
                    .await?
                    .unwrap_or(fallback),
                None => {
                    return Err(OAuthError::NoAuthorizationServer {
                        server: self.server_url.clone(),
                    })
                }
            };
            return Ok(Authority {
                resource: self.server_url.clone(),
                metadata,
                scopes_supported: None,
            });
        };
        let issuer =
            authorization_servers
                .first()
                .ok_or_else(|| OAuthError::NoAuthorizationServer {
                    server: self.server_url.clone(),
                })?;
        let metadata = discovery::server_metadata(&self.http, issuer)
            .await?
            .ok_or_else(|| OAuthError::Metadata {
                url: issuer.clone(),
                reason: "no authorization server metadata at any of its well-known URLs".into(),
            })?;
        Ok(Authority {
            resource,
            metadata,
            scopes_supported,
        })
    }

    /// The configured scopes; else the challenge's; else what the resource
    /// supports; else none. A step-up keeps the scopes held. `offline_access`
    /// is added when the authorization server lists it (a refresh token).
    fn scopes_for(
        &self,
        challenge: &Challenge,
        authority: &Authority,
        step_up: bool,
    ) -> Vec<String> {
        let mut scopes = if let Some(configured) = &self.settings.scopes {
            configured.clone()
        } else if !challenge.scopes().is_empty() {
            challenge.scopes()
        } else {
            authority.scopes_supported.clone().unwrap_or_default()
        };
        if step_up {
            if let Some(tokens) = &self.stored.tokens {
                for held in tokens.scopes.iter().rev() {
                    if !scopes.contains(held) {
                        scopes.insert(0, held.clone());
                    }
                }
            }
        }
        let offered = authority
            .metadata
            .scopes_supported
            .as_ref()
            .is_some_and(|supported| supported.iter().any(|s| s == "offline_access"));
        let refreshable = authority
            .metadata
            .grant_types_supported
            .as_ref()
            .is_none_or(|grants| grants.iter().any(|g| g == "refresh_token"));
        if offered
            && refreshable
            && self.settings.grant != Grant::ClientCredentials
            && !scopes.iter().any(|s| s == "offline_access")
        {
            scopes.push("offline_access".into());
        }
        scopes
    }

    /// The client at `metadata`'s server, in the specification's order.
    async fn registration(
        &mut self,
        metadata: &ServerMetadata,
        redirect_uri: Option<&str>,
    ) -> Result<Registration, OAuthError> {
        let supported = metadata
            .token_endpoint_auth_methods_supported
            .clone()
            .unwrap_or_else(|| vec!["client_secret_basic".into()]);
        let supports = |method: &str| supported.iter().any(|m| m == method);
        if let (Some(url), true) = (
            &self.settings.client_metadata_url,
            metadata.client_id_metadata_document_supported,
        ) {
            if self.settings.grant != Grant::ClientCredentials {
                return Ok(Registration {
                    client_id: url.clone(),
                    client_secret: None,
                    auth_method: "none".into(),
                    dynamic: false,
                });
            }
        }
        if let Some(client_id) = &self.settings.client_id {
            let secret = self.settings.client_secret.clone();
            let auth_method = if self.settings.private_key_pem.is_some() {
                "private_key_jwt"
            } else if secret.is_none() {
                "none"
            } else if supports("client_secret_basic") {
                "client_secret_basic"
            } else if supports("client_secret_post") {
                "client_secret_post"
            } else {
                "client_secret_basic"
            };
            return Ok(Registration {
                client_id: client_id.clone(),
                client_secret: secret,
                auth_method: auth_method.into(),
                dynamic: false,
            });
        }
        if let Some(registered) = self.stored.registrations.get(&metadata.issuer) {
            return Ok(registered.clone());
        }
        let Some(endpoint) = &metadata.registration_endpoint else {
            return Err(OAuthError::NoRegistration {
                issuer: metadata.issuer.clone(),
            });
        };
        let requested_method = if supports("none") {
            "none"
        } else if supports("client_secret_basic") {
            "client_secret_basic"
        } else {
            "client_secret_post"
        };
        // No redirect URI: the device grant, which takes no authorization response.
        // With one, the device grant too where the server offers it: the
        // registration is reused by a later login on a machine with no browser.
        let offers_device = metadata.device_authorization_endpoint.is_some()
            && metadata
                .grant_types_supported
                .as_ref()
                .is_none_or(|grants| grants.iter().any(|g| g == DEVICE_GRANT));
        let (grant_types, response_types): (Vec<&str>, Vec<&str>) = match redirect_uri {
            None => (vec![DEVICE_GRANT, "refresh_token"], vec![]),
            Some(_) if offers_device => (
                vec!["authorization_code", DEVICE_GRANT, "refresh_token"],
                vec!["code"],
            ),
            Some(_) => (vec!["authorization_code", "refresh_token"], vec!["code"]),
        };
        // RFC 8252 §7.3: a loopback redirect URI matches whatever port a later run gets.
        let mut body = json!({
            "client_name": "plexus",
            "grant_types": grant_types,
            "response_types": response_types,
            "token_endpoint_auth_method": requested_method,
            "application_type": "native",
        });
        if let Some(redirect_uri) = redirect_uri {
            body["redirect_uris"] = json!([redirect_uri]);
        }
        let answer = self.http.post_json(endpoint, &body).await?;
        let failed = |reason: String| OAuthError::Registration {
            issuer: metadata.issuer.clone(),
            reason,
        };
        if !answer.is_success() {
            return Err(failed(answer.oauth_error()));
        }
        let client_id = answer
            .json
            .get("client_id")
            .and_then(Value::as_str)
            .ok_or_else(|| failed("the answer holds no client_id".into()))?;
        let client_secret = answer
            .json
            .get("client_secret")
            .and_then(Value::as_str)
            .map(str::to_string);
        let auth_method = answer
            .json
            .get("token_endpoint_auth_method")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| {
                match &client_secret {
                    None => "none",
                    Some(_) if supports("client_secret_basic") => "client_secret_basic",
                    Some(_) => "client_secret_post",
                }
                .to_string()
            });
        let registration = Registration {
            client_id: client_id.to_string(),
            client_secret,
            auth_method,
            dynamic: true,
        };
        tracing::info!(server = %self.server_url, issuer = %metadata.issuer, "registered plexus as an OAuth client");
        self.stored
            .registrations
            .insert(metadata.issuer.clone(), registration.clone());
        self.store.save(&self.stored)?;
        Ok(registration)
    }

    /// The client's authentication on a token request: form fields and an
    /// `Authorization` header.
    fn client_authentication(
        &self,
        registration: &Registration,
        metadata: &ServerMetadata,
        form: &mut Vec<(&'static str, String)>,
    ) -> Result<Option<HeaderValue>, OAuthError> {
        let id = registration.client_id.clone();
        match (
            registration.auth_method.as_str(),
            &registration.client_secret,
        ) {
            ("private_key_jwt", _) => {
                let key = self.settings.private_key_pem.as_deref().ok_or_else(|| {
                    OAuthError::Assertion("`private_key_jwt` needs `private_key_file`".into())
                })?;
                let signed = assertion::sign(
                    &id,
                    &metadata.issuer,
                    key,
                    self.settings.signing_algorithm.as_deref(),
                )?;
                form.push(("client_id", id));
                form.push(("client_assertion_type", assertion::ASSERTION_TYPE.into()));
                form.push(("client_assertion", signed));
                Ok(None)
            }
            ("client_secret_basic", Some(secret)) => {
                // RFC 6749 §2.3.1: each part form-encoded before base64.
                let encode = |text: &str| {
                    url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>()
                };
                let pair = format!("{}:{}", encode(&id), encode(secret));
                let mut value = HeaderValue::from_str(&format!("Basic {}", STANDARD.encode(pair)))
                    .map_err(|_| {
                        OAuthError::Assertion("the client secret is not header text".into())
                    })?;
                value.set_sensitive(true);
                Ok(Some(value))
            }
            ("client_secret_post", Some(secret)) => {
                form.push(("client_id", id));
                form.push(("client_secret", secret.clone()));
                Ok(None)
            }
            _ => {
                form.push(("client_id", id));
                Ok(None)
            }
        }
    }

    /// Posts a token request and reads its tokens.
    async fn token_request(
        &mut self,
        authority_issuer: &str,
        metadata: &ServerMetadata,
        registration: &Registration,
        resource: &str,
        scopes: &[String],
        mut form: Vec<(&'static str, String)>,
    ) -> Result<Tokens, OAuthError> {
        form.push(("resource", resource.to_string()));
        let authorization = self.client_authentication(registration, metadata, &mut form)?;
        let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let answer = self
            .http
            .post_form(&metadata.token_endpoint, &pairs, authorization)
            .await?;
        self.read_tokens(
            answer,
            authority_issuer,
            metadata,
            registration,
            resource,
            scopes,
        )
    }

    fn read_tokens(
        &mut self,
        answer: Answer,
        issuer: &str,
        metadata: &ServerMetadata,
        registration: &Registration,
        resource: &str,
        scopes: &[String],
    ) -> Result<Tokens, OAuthError> {
        if !answer.is_success() {
            if answer.error_code() == Some("invalid_client") && registration.dynamic {
                // The server no longer knows the registration: the next
                // authorization registers again.
                self.stored.registrations.remove(issuer);
                self.store.save(&self.stored)?;
            }
            return Err(OAuthError::Token {
                endpoint: metadata.token_endpoint.clone(),
                reason: answer.oauth_error(),
                code: answer.error_code().map(str::to_string),
            });
        }
        tokens_of(&answer.json, issuer, resource, scopes, now()).ok_or_else(|| OAuthError::Token {
            endpoint: metadata.token_endpoint.clone(),
            reason: "the answer holds no access_token".into(),
            code: None,
        })
    }

    /// Refreshes the token held (RFC 6749 §6); a rotated refresh token is kept.
    async fn refresh(&mut self) -> Result<String, OAuthError> {
        let Some(held) = self.stored.tokens.clone() else {
            return Err(OAuthError::GrantUnavailable("no token to refresh".into()));
        };
        let Some(refresh_token) = held.refresh_token.clone() else {
            return Err(OAuthError::GrantUnavailable("no refresh token".into()));
        };
        let metadata = discovery::server_metadata(&self.http, &held.issuer)
            .await?
            .or_else(|| discovery::fallback_metadata(&self.server_url))
            .ok_or_else(|| OAuthError::NoAuthorizationServer {
                server: self.server_url.clone(),
            })?;
        let registration = self.registration(&metadata, None).await?;
        let form = vec![
            ("grant_type", "refresh_token".to_string()),
            ("refresh_token", refresh_token.clone()),
        ];
        let outcome = self
            .token_request(
                &held.issuer,
                &metadata,
                &registration,
                &held.resource,
                &held.scopes,
                form,
            )
            .await;
        let mut tokens = match outcome {
            Ok(tokens) => tokens,
            Err(error) => {
                if error.is_invalid_grant() {
                    self.forget_tokens()?;
                }
                return Err(error);
            }
        };
        if tokens.refresh_token.is_none() {
            tokens.refresh_token = Some(refresh_token);
        }
        let token = tokens.access_token.clone();
        self.stored.tokens = Some(tokens);
        self.store.save(&self.stored)?;
        Ok(token)
    }
}

/// The tokens a token endpoint's successful answer grants, issued at `issued`
/// (seconds since the epoch); None without an `access_token`. The server's
/// `expires_in` is believed only as far as a clock goes: one of u64::MAX expires
/// never, not (wrapped) at once.
fn tokens_of(
    json: &Value,
    issuer: &str,
    resource: &str,
    scopes: &[String],
    issued: u64,
) -> Option<Tokens> {
    let text = |key: &str| json.get(key).and_then(Value::as_str).map(str::to_string);
    let granted: Option<Vec<String>> = json
        .get("scope")
        .and_then(Value::as_str)
        .map(|scope| scope.split_whitespace().map(str::to_string).collect());
    Some(Tokens {
        issuer: issuer.to_string(),
        resource: resource.to_string(),
        access_token: text("access_token")?,
        refresh_token: text("refresh_token"),
        expires_at: json
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|seconds| issued.saturating_add(seconds)),
        scopes: granted.unwrap_or_else(|| scopes.to_vec()),
        issued_at: Some(issued),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hostile_token_answers_grant_tokens_that_expire_after_they_are_issued() {
        let seed = json!({"access_token": "a", "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": "r", "scope": "mcp:read mcp:write"});
        let mut cases = mutations::value_mutants(&seed, 3_000, 0x70E);
        cases.push(br#"{"access_token":"a","expires_in":18446744073709551615}"#.to_vec());
        let issued = now();
        mutations::check("a token endpoint's answer", &cases, 64, |bytes| {
            let Ok(json) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            let Some(tokens) = tokens_of(&json, "http://as", "http://h/mcp", &[], issued) else {
                assert!(json.get("access_token").and_then(Value::as_str).is_none());
                return;
            };
            if let Some(expires_at) = tokens.expires_at {
                assert!(expires_at >= issued, "{json}: expires before it is issued");
            }
        });
    }
}
