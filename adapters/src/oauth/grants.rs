//! The grants that get a first token: authorization code with PKCE S256 and a
//! loopback redirect, client credentials, and the device grant.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::loopback::Loopback;
use super::{
    random_text, Authority, OAuthClient, OAuthError, Prompt, Registration, Tokens, DEVICE_GRANT,
};

impl OAuthClient {
    pub(super) fn open(&self, url: &str) {
        (self.interaction.prompt)(&Prompt::Url(url));
        let Some(browser) = &self.interaction.browser else {
            return;
        };
        let mut words = browser.split_whitespace();
        let Some(program) = words.next() else {
            return;
        };
        let spawned = tokio::process::Command::new(program)
            .args(words)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        // Not awaited: a browser may outlive the login; tokio reaps it when it exits.
        if let Err(error) = spawned {
            tracing::warn!(browser = program, %error, "could not start the browser; open the URL yourself");
        }
    }

    /// The authorization code grant with PKCE S256 and a loopback redirect.
    pub(super) async fn authorization_code(
        &mut self,
        authority: &Authority,
        scopes: &[String],
    ) -> Result<Tokens, OAuthError> {
        let metadata = &authority.metadata;
        let endpoint = metadata.authorization_endpoint.clone().ok_or_else(|| {
            OAuthError::GrantUnavailable(format!(
                "{} has no authorization endpoint",
                metadata.issuer
            ))
        })?;
        let loopback = Loopback::bind().await?;
        let registration = self
            .registration(metadata, Some(&loopback.redirect_uri))
            .await?;
        let verifier = random_text(32);
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        let state = random_text(16);
        let mut url = url::Url::parse(&endpoint).map_err(|error| OAuthError::Metadata {
            url: endpoint.clone(),
            reason: error.to_string(),
        })?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &registration.client_id)
                .append_pair("redirect_uri", &loopback.redirect_uri)
                .append_pair("code_challenge", &challenge)
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", &state)
                .append_pair("resource", &authority.resource);
            if !scopes.is_empty() {
                query.append_pair("scope", &scopes.join(" "));
            }
        }
        self.open(url.as_str());
        let answer = loopback.wait(&state, self.interaction.wait).await?;
        let param = |name: &str| {
            answer
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        if let Some(error) = param("error") {
            let description = param("error_description").unwrap_or_default();
            return Err(OAuthError::Authorization(
                format!("{error} {description}").trim().to_string(),
            ));
        }
        // RFC 9207: an `iss` present must be the issuer exactly; absent, it must
        // not have been promised.
        match param("iss") {
            Some(iss) if iss != metadata.issuer => {
                return Err(OAuthError::Issuer(format!(
                    "names issuer `{iss}`, not `{}`",
                    metadata.issuer
                )))
            }
            None if metadata.iss_parameter_supported => {
                return Err(OAuthError::Issuer(format!(
                    "lacks `iss`, which {} promises",
                    metadata.issuer
                )))
            }
            _ => {}
        }
        let code = param("code")
            .filter(|code| !code.is_empty())
            .ok_or_else(|| OAuthError::Authorization("the redirect carries no code".into()))?
            .to_string();
        let form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code),
            ("redirect_uri", loopback.redirect_uri.clone()),
            ("code_verifier", verifier),
        ];
        self.exchange(authority, &registration, scopes, form).await
    }

    /// A grant's token request to the authority it was discovered from.
    async fn exchange(
        &mut self,
        authority: &Authority,
        registration: &Registration,
        scopes: &[String],
        form: Vec<(&'static str, String)>,
    ) -> Result<Tokens, OAuthError> {
        let metadata = &authority.metadata;
        self.token_request(
            &metadata.issuer,
            metadata,
            registration,
            &authority.resource,
            scopes,
            form,
        )
        .await
    }

    /// The client credentials grant (no person involved).
    pub(super) async fn client_credentials(
        &mut self,
        authority: &Authority,
        scopes: &[String],
    ) -> Result<Tokens, OAuthError> {
        let metadata = &authority.metadata;
        if self.settings.client_id.is_none() {
            return Err(OAuthError::GrantUnavailable(
                "`grant = \"client_credentials\"` needs `client_id` (and `client_secret` or `private_key_file`)".into(),
            ));
        }
        let registration = self.registration(metadata, None).await?;
        let mut form = vec![("grant_type", "client_credentials".to_string())];
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        self.exchange(authority, &registration, scopes, form).await
    }

    /// The device authorization grant (RFC 8628): a code the person enters on
    /// any device, while plexus polls.
    pub(super) async fn device_code(
        &mut self,
        authority: &Authority,
        scopes: &[String],
    ) -> Result<Tokens, OAuthError> {
        let metadata = &authority.metadata;
        let Some(endpoint) = metadata.device_authorization_endpoint.clone() else {
            return Err(OAuthError::GrantUnavailable(
                "no device authorization endpoint".into(),
            ));
        };
        // A dynamic registration is kept for every later login, a browser's too:
        // it gets a loopback redirect URI (any port matches, RFC 8252 §7.3) where
        // the server also offers the code grant.
        let code_grant = metadata.authorization_endpoint.is_some()
            && metadata
                .grant_types_supported
                .as_ref()
                .is_none_or(|grants| grants.iter().any(|g| g == "authorization_code"));
        let redirect_uri = if code_grant {
            Some(Loopback::bind().await?.redirect_uri)
        } else {
            None
        };
        let registration = self.registration(metadata, redirect_uri.as_deref()).await?;
        let mut form = vec![("resource", authority.resource.clone())];
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        let authorization = self.client_authentication(&registration, metadata, &mut form)?;
        let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let answer = self
            .http
            .post_form(&endpoint, &pairs, authorization)
            .await?;
        if !answer.is_success() {
            return Err(OAuthError::Authorization(answer.oauth_error()));
        }
        let text = |key: &str| {
            answer
                .json
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let (Some(device_code), Some(user_code), Some(verification_uri)) = (
            text("device_code"),
            text("user_code"),
            text("verification_uri"),
        ) else {
            return Err(OAuthError::Authorization(
                "the device authorization answer is incomplete".into(),
            ));
        };
        let complete = text("verification_uri_complete");
        (self.interaction.prompt)(&Prompt::DeviceCode {
            verification_uri: &verification_uri,
            user_code: &user_code,
            complete: complete.as_deref(),
        });
        let mut interval = answer
            .json
            .get("interval")
            .and_then(Value::as_u64)
            .unwrap_or(5)
            .max(1);
        // The code dies at `expires_in`; the person's time to finish bounds it too.
        let lifetime = answer
            .json
            .get("expires_in")
            .and_then(Value::as_u64)
            .map_or(self.interaction.wait, |seconds| {
                self.interaction.wait.min(Duration::from_secs(seconds))
            });
        let deadline = tokio::time::Instant::now() + lifetime;
        let mut unanswered = 0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(poll_wait(interval, left)).await;
            if tokio::time::Instant::now() >= deadline {
                return Err(OAuthError::NoRedirect(lifetime));
            }
            let form = vec![
                ("grant_type", DEVICE_GRANT.to_string()),
                ("device_code", device_code.clone()),
            ];
            match self.exchange(authority, &registration, scopes, form).await {
                Ok(tokens) => return Ok(tokens),
                Err(OAuthError::Token {
                    code: Some(code), ..
                }) if code == "authorization_pending" => unanswered = 0,
                Err(OAuthError::Token {
                    code: Some(code), ..
                }) if code == "slow_down" => {
                    interval = interval.saturating_add(5);
                    unanswered = 0;
                }
                // A poll that got no answer (a kept-alive connection the server
                // closed as it was reused) is made again at the next interval; a
                // server that stays unreachable still ends the login.
                Err(OAuthError::Exchange { url, reason }) if unanswered < MAX_UNANSWERED_POLLS => {
                    unanswered += 1;
                    tracing::debug!(%url, %reason, "a device grant poll got no answer; polling again");
                    continue;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// How many device grant polls in a row may get no answer before the login fails.
const MAX_UNANSWERED_POLLS: u32 = 3;

/// How long a device grant waits before polling again: the server's interval,
/// but not past the code's deadline (an interval of u64::MAX seconds, or one
/// grown by `slow_down`, would otherwise wait for good).
fn poll_wait(interval: u64, left: Duration) -> Duration {
    Duration::from_secs(interval).min(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_poll_interval_never_outwaits_the_codes_deadline() {
        let seed = br#"{"device_code":"d","user_code":"U","verification_uri":"http://as/device","interval":5,"expires_in":600}"#;
        let cases = mutations::cases(&[seed], 2_000, 0xDE71);
        mutations::check("a device authorization's interval", &cases, 64, |bytes| {
            let Ok(json) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            let interval = json.get("interval").and_then(Value::as_u64).unwrap_or(5);
            for left in [
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(600),
            ] {
                let wait = poll_wait(interval, left);
                assert!(wait <= left, "{json}: waits {wait:?} with {left:?} left");
                assert!(wait <= Duration::from_secs(interval));
            }
        });
    }
}
