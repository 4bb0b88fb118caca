//! The front as an OAuth 2.1 resource server (`[daemon.oauth]`): JWT access tokens
//! checked for signature (RS256, ES256, EdDSA against the issuer's JWKS), `iss`,
//! `aud`, `exp` and `nbf`; their principal and claim-bound view; the RFC 9728
//! protected-resource metadata and the challenge that points to it. With `access`
//! (static tokens), the only code that reads a client's token; the token itself is
//! never logged, stored or passed on.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::config::FrontOAuth;

/// Signature algorithms admitted; the key's family must match (no HS256 with a
/// public key as the secret).
const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];
/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 60;
/// A token naming a key the cached set lacks refetches the set at most this often.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(60);
/// With no key set yet (the provider was down), a fetch is tried at most this often.
const RETRY_INTERVAL: Duration = Duration::from_secs(5);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// Longest principal taken from a claim (it is shown in status and metrics).
const MAX_PRINCIPAL_CHARS: usize = 256;
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Why a token is not admitted. Says nothing of the token itself.
#[derive(Debug, thiserror::Error)]
pub enum TokenRefused {
    #[error("not a JWT")]
    Malformed(#[source] jsonwebtoken::errors::Error),
    #[error("signed with an algorithm not admitted ({0:?})")]
    Algorithm(Algorithm),
    #[error("signed with a key the issuer does not list")]
    UnknownKey,
    #[error("refused")]
    Invalid(#[source] jsonwebtoken::errors::Error),
    #[error("it has no claim `{0}` naming a principal")]
    NoPrincipal(String),
    #[error("the issuer's keys could not be fetched")]
    KeysUnavailable(#[source] FetchError),
}

impl TokenRefused {
    /// Whether the fault is the provider's, not the token's (503, not 401).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, TokenRefused::KeysUnavailable(_))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: no answer within {} s", FETCH_TIMEOUT.as_secs())]
    TimedOut { url: String },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: StatusCode },
    #[error("GET {url}: the body could not be read (or passed {MAX_DOCUMENT_BYTES} bytes)")]
    Body { url: String },
    #[error("GET {url}: not the JSON expected")]
    Json {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{url} is not a URL")]
    BadUrl { url: String },
    #[error("no discovery document of {issuer} names it as issuer with a jwks_uri")]
    NoDiscovery { issuer: String },
    #[error("https needs the TLS setup, which failed: {0}")]
    Tls(String),
}

/// An admitted token: who it names and the view its claims bind it to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub principal: String,
    pub view: Option<String>,
}

type Connector = adapters::remote::HttpsConnector;

struct Keys {
    set: JwkSet,
}

/// Where the key set is, and when it was last fetched.
#[derive(Default)]
struct FetchState {
    jwks_uri: Option<String>,
    last_attempt: Option<Instant>,
    last_refetch: Option<Instant>,
}

/// Checks access tokens for one `[daemon.oauth]`; rebuilt when it changes.
pub struct Verifier {
    settings: FrontOAuth,
    client: Client<Connector, Empty<Bytes>>,
    keys: RwLock<Option<Arc<Keys>>>,
    /// Held while fetching: concurrent requests naming an unknown key cause one fetch.
    fetch: tokio::sync::Mutex<FetchState>,
    refetch_interval: Duration,
}

impl Verifier {
    pub fn new(settings: FrontOAuth) -> Result<Verifier, FetchError> {
        Verifier::with_refetch_interval(settings, REFETCH_INTERVAL)
    }

    fn with_refetch_interval(
        settings: FrontOAuth,
        refetch_interval: Duration,
    ) -> Result<Verifier, FetchError> {
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector()?);
        let fetch = FetchState {
            jwks_uri: settings.jwks_uri.clone(),
            ..FetchState::default()
        };
        Ok(Verifier {
            settings,
            client,
            keys: RwLock::new(None),
            fetch: tokio::sync::Mutex::new(fetch),
            refetch_interval,
        })
    }

    pub fn settings(&self) -> &FrontOAuth {
        &self.settings
    }

    /// Admits `token` or says why not.
    pub async fn check(&self, token: &str) -> Result<Admitted, TokenRefused> {
        let header = jsonwebtoken::decode_header(token).map_err(TokenRefused::Malformed)?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(TokenRefused::Algorithm(header.alg));
        }
        let kid = header.kid.as_deref();
        let key = match self.find_key(kid, header.alg) {
            Some(key) => key,
            None => {
                self.refresh_keys(kid, header.alg).await?;
                self.find_key(kid, header.alg)
                    .ok_or(TokenRefused::UnknownKey)?
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(TokenRefused::Invalid)?
            .claims;
        let claim = &self.settings.principal_claim;
        let principal = match claims.get(claim) {
            Some(Value::String(text)) if !text.is_empty() => text.clone(),
            Some(Value::Number(number)) => number.to_string(),
            _ => return Err(TokenRefused::NoPrincipal(claim.clone())),
        };
        if principal.chars().count() > MAX_PRINCIPAL_CHARS
            || principal.chars().any(char::is_control)
        {
            return Err(TokenRefused::NoPrincipal(claim.clone()));
        }
        Ok(Admitted {
            view: bound_view(&self.settings.view_claims, &claims),
            principal,
        })
    }

    /// The cached key for `kid` (or, with no kid, the one key of the algorithm's
    /// family), if it may verify `alg`.
    fn find_key(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        let fits = |jwk: &&Jwk| key_fits(jwk, alg);
        let jwk = match kid {
            Some(kid) => keys
                .set
                .keys
                .iter()
                .filter(fits)
                .find(|jwk| jwk.common.key_id.as_deref() == Some(kid))?,
            None => {
                let mut candidates = keys.set.keys.iter().filter(fits);
                match (candidates.next(), candidates.next()) {
                    (Some(only), None) => only,
                    _ => return None,
                }
            }
        };
        DecodingKey::from_jwk(jwk).ok()
    }

    /// Fetches the key set again unless that was done too lately: at most once a
    /// `refetch_interval` once a set is held, every few seconds while none is.
    async fn refresh_keys(&self, kid: Option<&str>, alg: Algorithm) -> Result<(), TokenRefused> {
        let have_keys = || {
            self.keys
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
        };
        let mut state = self.fetch.lock().await;
        if self.find_key(kid, alg).is_some() {
            // Another request fetched while this one waited: its keys do.
            return Ok(());
        }
        let now = Instant::now();
        let (last, interval) = if have_keys() {
            (state.last_refetch, self.refetch_interval)
        } else {
            (state.last_attempt, RETRY_INTERVAL)
        };
        if last.is_some_and(|last| now.duration_since(last) < interval) {
            return if have_keys() {
                Err(TokenRefused::UnknownKey)
            } else {
                Err(TokenRefused::KeysUnavailable(FetchError::NoDiscovery {
                    issuer: self.settings.issuer.clone(),
                }))
            };
        }
        if have_keys() {
            state.last_refetch = Some(now);
        }
        state.last_attempt = Some(now);
        let jwks_uri = match &state.jwks_uri {
            Some(uri) => uri.clone(),
            None => {
                let uri = self
                    .discover_jwks_uri()
                    .await
                    .map_err(TokenRefused::KeysUnavailable)?;
                state.jwks_uri = Some(uri.clone());
                uri
            }
        };
        let set: JwkSet = self
            .get_json(&jwks_uri)
            .await
            .map_err(TokenRefused::KeysUnavailable)?;
        tracing::info!(
            jwks_uri,
            keys = set.keys.len(),
            "fetched the identity provider's signing keys"
        );
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Keys { set }));
        Ok(())
    }

    /// The issuer's `jwks_uri`: OpenID discovery, then RFC 8414 (path inserted
    /// after the host), then OpenID with the path inserted; the document must name
    /// the configured issuer.
    async fn discover_jwks_uri(&self) -> Result<String, FetchError> {
        let issuer = &self.settings.issuer;
        let mut last_error = None;
        for url in discovery_urls(issuer) {
            match self.get_json::<Map<String, Value>>(&url).await {
                Ok(document) => {
                    let names_issuer =
                        document.get("issuer").and_then(Value::as_str) == Some(issuer.as_str());
                    if let (true, Some(uri)) = (
                        names_issuer,
                        document.get("jwks_uri").and_then(Value::as_str),
                    ) {
                        return Ok(uri.to_string());
                    }
                }
                Err(error) => {
                    tracing::debug!(error = %adapters::error_chain(&error), "discovery document not found");
                    last_error = Some(error);
                }
            }
        }
        Err(match last_error {
            Some(error @ (FetchError::Request { .. } | FetchError::TimedOut { .. })) => error,
            _ => FetchError::NoDiscovery {
                issuer: issuer.clone(),
            },
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, FetchError> {
        let bad_url = || FetchError::BadUrl {
            url: url.to_string(),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad_url())?;
        let request = Request::get(uri)
            .header(header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|_| bad_url())?;
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|source| FetchError::Request {
                        url: url.to_string(),
                        source,
                    })?;
            if !response.status().is_success() {
                return Err(FetchError::Status {
                    url: url.to_string(),
                    status: response.status(),
                });
            }
            Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .map_err(|_| FetchError::Body {
                    url: url.to_string(),
                })
        };
        let body = tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .map_err(|_| FetchError::TimedOut {
                url: url.to_string(),
            })??;
        serde_json::from_slice(&body).map_err(|source| FetchError::Json {
            url: url.to_string(),
            source,
        })
    }
}

/// Whether `jwk` may verify a signature of `alg`: a signing key of its family,
/// and of that algorithm if it names one.
fn key_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    use jsonwebtoken::jwk::AlgorithmParameters as Params;
    let family = matches!(
        (&jwk.algorithm, alg),
        (Params::RSA(_), Algorithm::RS256)
            | (Params::EllipticCurve(_), Algorithm::ES256)
            | (Params::OctetKeyPair(_), Algorithm::EdDSA)
    );
    let usage =
        !matches!(&jwk.common.public_key_use, Some(usage) if *usage != PublicKeyUse::Signature);
    let named = jwk.common.key_algorithm.is_none_or(|named| {
        matches!(
            (named, alg),
            (KeyAlgorithm::RS256, Algorithm::RS256)
                | (KeyAlgorithm::ES256, Algorithm::ES256)
                | (KeyAlgorithm::EdDSA, Algorithm::EdDSA)
        )
    });
    family && usage && named
}

/// The first view (by name) whose every claim the token carries: equal, or held
/// by an array claim.
fn bound_view(
    view_claims: &[(String, BTreeMap<String, String>)],
    claims: &Map<String, Value>,
) -> Option<String> {
    let holds = |claim: &str, wanted: &str| match claims.get(claim) {
        Some(Value::String(value)) => value == wanted,
        Some(Value::Array(values)) => values.iter().any(|v| v.as_str() == Some(wanted)),
        _ => false,
    };
    view_claims
        .iter()
        .find(|(_, wanted)| wanted.iter().all(|(claim, value)| holds(claim, value)))
        .map(|(name, _)| name.clone())
}

/// Where an issuer's metadata may be, in the order tried.
fn discovery_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let mut urls = vec![format!("{trimmed}/.well-known/openid-configuration")];
    if let Ok(url) = url::Url::parse(trimmed) {
        let path = url.path().trim_end_matches('/');
        let origin = url.origin().ascii_serialization();
        urls.push(format!(
            "{origin}/.well-known/oauth-authorization-server{path}"
        ));
        if !path.is_empty() {
            urls.push(format!("{origin}/.well-known/openid-configuration{path}"));
        }
    }
    urls
}

/// The RFC 9728 metadata URL of the resource `audience`: the well-known path
/// inserted between its host and its path.
pub fn metadata_url(audience: &str) -> String {
    match url::Url::parse(audience) {
        Ok(url) => {
            let path = url.path().trim_end_matches('/');
            format!(
                "{}{METADATA_PATH}{path}",
                url.origin().ascii_serialization()
            )
        }
        Err(_) => format!("{}{METADATA_PATH}", audience.trim_end_matches('/')),
    }
}

/// Whether `path` asks for the metadata: the bare well-known path, or it with the
/// path of the audience or of an MCP endpoint after it.
pub fn is_metadata_path(path: &str) -> bool {
    path.strip_prefix(METADATA_PATH)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The RFC 9728 protected-resource metadata document.
pub fn metadata(settings: &FrontOAuth) -> Value {
    let mut document = serde_json::json!({
        "resource": settings.audience,
        "authorization_servers": [settings.issuer],
        "bearer_methods_supported": ["header"],
    });
    if !settings.scopes.is_empty() {
        document["scopes_supported"] = serde_json::json!(settings.scopes);
    }
    document
}

/// The `WWW-Authenticate` value of a 401: RFC 6750 with the RFC 9728 pointer,
/// and `error="invalid_token"` when a token was given and refused.
pub fn challenge(settings: &FrontOAuth, presented: bool) -> String {
    let mut value = format!(
        "Bearer realm=\"plexus\", resource_metadata=\"{}\"",
        metadata_url(&settings.audience)
    );
    if let Some(scope) = (!settings.scopes.is_empty()).then(|| settings.scopes.join(" ")) {
        value.push_str(&format!(", scope=\"{scope}\""));
    }
    if presented {
        value.push_str(", error=\"invalid_token\"");
    }
    value
}

fn connector() -> Result<Connector, FetchError> {
    adapters::remote::https_connector(FETCH_TIMEOUT).map_err(FetchError::Tls)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_insert_the_well_known_path() {
        assert_eq!(
            metadata_url("https://plexus.example/mcp"),
            "https://plexus.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:7464"),
            "http://127.0.0.1:7464/.well-known/oauth-protected-resource"
        );
        assert!(is_metadata_path("/.well-known/oauth-protected-resource"));
        assert!(is_metadata_path(
            "/.well-known/oauth-protected-resource/mcp"
        ));
        assert!(!is_metadata_path("/.well-known/oauth-protected-resourcex"));
    }

    #[test]
    fn discovery_tries_openid_then_rfc_8414() {
        assert_eq!(
            discovery_urls("https://idp.example/realms/one"),
            [
                "https://idp.example/realms/one/.well-known/openid-configuration",
                "https://idp.example/.well-known/oauth-authorization-server/realms/one",
                "https://idp.example/.well-known/openid-configuration/realms/one",
            ]
        );
        assert_eq!(
            discovery_urls("https://idp.example"),
            [
                "https://idp.example/.well-known/openid-configuration",
                "https://idp.example/.well-known/oauth-authorization-server",
            ]
        );
    }

    #[test]
    fn views_bind_to_claims_or_to_members_of_array_claims() {
        let views = vec![
            (
                "ops".to_string(),
                BTreeMap::from([("groups".to_string(), "sre".to_string())]),
            ),
            (
                "team".to_string(),
                BTreeMap::from([
                    ("dept".to_string(), "eng".to_string()),
                    ("level".to_string(), "2".to_string()),
                ]),
            ),
        ];
        let claims = |value: Value| value.as_object().unwrap().clone();
        assert_eq!(
            bound_view(
                &views,
                &claims(serde_json::json!({"groups": ["dev", "sre"]}))
            ),
            Some("ops".into())
        );
        assert_eq!(
            bound_view(&views, &claims(serde_json::json!({"groups": "sre"}))),
            Some("ops".into())
        );
        assert_eq!(
            bound_view(&views, &claims(serde_json::json!({"dept": "eng"}))),
            None,
            "every claim of a view must match"
        );
        assert_eq!(
            bound_view(
                &views,
                &claims(serde_json::json!({"dept": "eng", "level": "2"}))
            ),
            Some("team".into())
        );
        assert_eq!(
            bound_view(&views, &claims(serde_json::json!({"groups": ["srex"]}))),
            None
        );
    }

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A key set server on loopback: it serves an RSA key for each of `kids` and
    /// counts its fetches. Each answer closes its connection.
    async fn jwks_server(kids: Arc<Mutex<Vec<String>>>, fetches: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(read) => request.extend_from_slice(&buffer[..read]),
                    }
                }
                fetches.fetch_add(1, Ordering::SeqCst);
                let keys: Vec<Value> = kids
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|kid| serde_json::json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": "sXch", "e": "AQAB"}))
                    .collect();
                let body = serde_json::json!({ "keys": keys }).to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://{address}/jwks")
    }

    /// A token naming `kid`; its signature is not checked before its key is found.
    fn token(kid: &str) -> String {
        let part = |value: Value| URL_SAFE_NO_PAD.encode(value.to_string());
        format!(
            "{}.{}.{}",
            part(serde_json::json!({"alg": "RS256", "kid": kid, "typ": "at+jwt"})),
            part(serde_json::json!({"sub": "alice"})),
            URL_SAFE_NO_PAD.encode(b"not a signature")
        )
    }

    #[tokio::test]
    async fn an_unknown_kid_refetches_the_keys_at_most_once_an_interval() {
        let kids = Arc::new(Mutex::new(vec!["first".to_string()]));
        let fetches = Arc::new(AtomicUsize::new(0));
        let jwks_uri = jwks_server(kids.clone(), fetches.clone()).await;
        let interval = Duration::from_secs(2);
        let verifier = Verifier::with_refetch_interval(
            FrontOAuth {
                issuer: "http://idp.invalid".into(),
                audience: "http://plexus.invalid".into(),
                jwks_uri: Some(jwks_uri),
                principal_claim: "sub".into(),
                scopes: Vec::new(),
                view_claims: Vec::new(),
            },
            interval,
        )
        .unwrap();
        let fetched = || fetches.load(Ordering::SeqCst);

        // The first token fetches the set; its key is found (the signature fails).
        let refused = verifier.check(&token("first")).await.unwrap_err();
        assert!(matches!(refused, TokenRefused::Invalid(_)), "{refused:?}");
        assert_eq!(fetched(), 1);

        // The provider rotates: an unknown kid refetches once and finds it.
        kids.lock().unwrap().push("second".into());
        let started = Instant::now();
        let refused = verifier.check(&token("second")).await.unwrap_err();
        assert!(matches!(refused, TokenRefused::Invalid(_)), "{refused:?}");
        assert_eq!(fetched(), 2);

        // Another unknown kid within the interval: no fetch, refused as unknown.
        kids.lock().unwrap().push("third".into());
        let refused = verifier.check(&token("third")).await.unwrap_err();
        assert!(
            started.elapsed() < interval,
            "the machine took the whole interval"
        );
        assert!(matches!(refused, TokenRefused::UnknownKey), "{refused:?}");
        let refused = verifier.check(&token("unheard-of")).await.unwrap_err();
        assert!(matches!(refused, TokenRefused::UnknownKey), "{refused:?}");
        assert_eq!(
            fetched(),
            2,
            "a second unknown kid within the interval fetched"
        );

        // Past the interval an unknown kid may refetch again.
        tokio::time::sleep(interval + Duration::from_millis(100)).await;
        let refused = verifier.check(&token("third")).await.unwrap_err();
        assert!(matches!(refused, TokenRefused::Invalid(_)), "{refused:?}");
        assert_eq!(fetched(), 3);
    }

    #[test]
    fn an_rsa_key_does_not_verify_another_family() {
        let jwk: Jwk = serde_json::from_value(serde_json::json!({
            "kty": "RSA", "kid": "one", "use": "sig", "alg": "RS256",
            "n": "sXch", "e": "AQAB"
        }))
        .unwrap();
        assert!(key_fits(&jwk, Algorithm::RS256));
        assert!(!key_fits(&jwk, Algorithm::ES256));
        assert!(!key_fits(&jwk, Algorithm::EdDSA));
        let encryption: Jwk = serde_json::from_value(serde_json::json!({
            "kty": "RSA", "kid": "two", "use": "enc", "n": "sXch", "e": "AQAB"
        }))
        .unwrap();
        assert!(!key_fits(&encryption, Algorithm::RS256));
    }

    /// A verifier holding one Ed25519 key (`kid` "k"), and tokens signed with it
    /// over any header and claims: a hostile token that the signature admits.
    fn signed_with_one_key() -> (Verifier, impl Fn(&[u8], &[u8]) -> String) {
        use ring::signature::{Ed25519KeyPair, KeyPair as _};
        let random = ring::rand::SystemRandom::new();
        let document = Ed25519KeyPair::generate_pkcs8(&random).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(document.as_ref()).unwrap();
        let jwk: Jwk = serde_json::from_value(serde_json::json!({
            "kty": "OKP", "crv": "Ed25519", "kid": "k", "use": "sig", "alg": "EdDSA",
            "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
        }))
        .unwrap();
        let verifier = Verifier::with_refetch_interval(
            FrontOAuth {
                issuer: "http://idp.invalid".into(),
                audience: "http://plexus.invalid".into(),
                // Nothing listens: a token naming another key fails at once.
                jwks_uri: Some("http://127.0.0.1:1/jwks".into()),
                principal_claim: "sub".into(),
                scopes: Vec::new(),
                view_claims: vec![(
                    "team".into(),
                    BTreeMap::from([("groups".to_string(), "eng".to_string())]),
                )],
            },
            Duration::from_secs(3600),
        )
        .unwrap();
        *verifier.keys.write().unwrap() = Some(Arc::new(Keys {
            set: JwkSet { keys: vec![jwk] },
        }));
        let sign = move |header: &[u8], claims: &[u8]| {
            let signed = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims)
            );
            let signature = pair.sign(signed.as_bytes());
            format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
        };
        (verifier, sign)
    }

    #[test]
    fn hostile_access_tokens_are_refused_and_never_panic() {
        let (verifier, sign) = signed_with_one_key();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let header = br#"{"alg":"EdDSA","kid":"k","typ":"at+jwt"}"#;
        let claims = format!(
            r#"{{"iss":"http://idp.invalid","aud":"http://plexus.invalid","exp":{},"sub":"alice","groups":["eng"],"scope":"mcp"}}"#,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                + 600
        );
        let valid = sign(header, claims.as_bytes());
        let admitted = runtime.block_on(verifier.check(&valid)).unwrap();
        assert_eq!(
            (admitted.principal.as_str(), admitted.view.as_deref()),
            ("alice", Some("team"))
        );
        let check = |token: &str| {
            let Ok(admitted) = runtime.block_on(verifier.check(token)) else {
                return;
            };
            // A principal is a short line of text.
            let principal = &admitted.principal;
            assert!(!principal.is_empty() && principal.chars().count() <= MAX_PRINCIPAL_CHARS);
            assert!(!principal.chars().any(char::is_control), "{principal:?}");
        };
        // The token itself mangled (almost always a bad signature or encoding).
        // A token arrives in a request's head, which hyper reads into at most
        // ~400 KiB: the megabyte cases would only time base64 and the hash.
        let within_a_head = |mut cases: Vec<Vec<u8>>| {
            cases.retain(|case| case.len() <= 64 * 1024);
            cases
        };
        let cases = within_a_head(mutations::cases(&[valid.as_bytes()], 800, 0x55A));
        mutations::check("a mangled access token", &cases, 64, |token| {
            check(&String::from_utf8_lossy(token))
        });
        // Hostile claims and headers, signed: what is past the signature is read.
        let cases = within_a_head(mutations::cases(&[claims.as_bytes()], 1_000, 0x55B));
        mutations::check("signed hostile claims", &cases, 64, |claims| {
            check(&sign(header, claims))
        });
        let cases = within_a_head(mutations::cases(&[header], 600, 0x55C));
        mutations::check("a signed hostile header", &cases, 64, |header| {
            check(&sign(header, claims.as_bytes()))
        });
    }
}
