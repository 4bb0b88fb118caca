//! The `private_key_jwt` client assertion (RFC 7523 §2.2, RFC 7521): a short-lived
//! JWT signed with the client's key, `iss` and `sub` its client id, `aud` the
//! authorization server's issuer.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use super::OAuthError;

pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
    jti: String,
}

/// The algorithm named, if a private key can sign with it.
pub fn algorithm(name: &str) -> Result<Algorithm, OAuthError> {
    match name.parse::<Algorithm>() {
        Ok(
            algorithm @ (Algorithm::ES256
            | Algorithm::ES384
            | Algorithm::EdDSA
            | Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512),
        ) => Ok(algorithm),
        _ => Err(OAuthError::Assertion(format!(
            "`{name}` is not a signing algorithm for a private key"
        ))),
    }
}

/// A signed assertion for `client_id` toward `audience`, with the PEM key
/// (`ES256`, `ES384`, `RS256`, … by `algorithm`; ES256 when none is named).
pub fn sign(
    client_id: &str,
    audience: &str,
    key_pem: &[u8],
    algorithm: Option<&str>,
) -> Result<String, OAuthError> {
    let algorithm = self::algorithm(algorithm.unwrap_or("ES256"))?;
    let key = match algorithm {
        Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(key_pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(key_pem),
        _ => EncodingKey::from_rsa_pem(key_pem),
    }
    .map_err(|error| OAuthError::Assertion(format!("the private key: {error}")))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    let claims = Claims {
        iss: client_id,
        sub: client_id,
        aud: audience,
        iat: now,
        exp: now + 300,
        jti: super::random_text(16),
    };
    jsonwebtoken::encode(&Header::new(algorithm), &claims, &key)
        .map_err(|error| OAuthError::Assertion(format!("signing: {error}")))
}
