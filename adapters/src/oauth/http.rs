//! The few HTTP exchanges of an OAuth client: a JSON document fetched, a form or
//! JSON posted, each answer read whole (capped) within a deadline. No redirect is
//! followed: metadata and token endpoints are named exactly.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use serde_json::Value;

use super::OAuthError;
use crate::remote::HttpClient;

/// The longest metadata document or token response read.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// How long one exchange may take, connecting included.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// An answer: its status and its body as JSON (Null when it is not JSON).
pub(super) struct Answer {
    pub status: u16,
    pub json: Value,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// An OAuth error response's `error` and `error_description`, said whole.
    pub fn oauth_error(&self) -> String {
        let code = self.json.get("error").and_then(Value::as_str);
        let description = self.json.get("error_description").and_then(Value::as_str);
        match (code, description) {
            (Some(code), Some(description)) => format!("{code}: {description}"),
            (Some(code), None) => code.to_string(),
            _ => format!("HTTP {}", self.status),
        }
    }

    pub fn error_code(&self) -> Option<&str> {
        self.json.get("error").and_then(Value::as_str)
    }
}

pub(super) struct Http {
    client: HttpClient,
}

impl Http {
    pub fn new() -> Result<Http, OAuthError> {
        let client =
            crate::remote::plain_client(Duration::from_secs(10)).map_err(OAuthError::Client)?;
        Ok(Http { client })
    }

    pub async fn get(&self, url: &str) -> Result<Answer, OAuthError> {
        self.exchange(Method::GET, url, None, None, Bytes::new())
            .await
    }

    /// Posts `form` (`application/x-www-form-urlencoded`), with `basic` as
    /// `Authorization` when given.
    pub async fn post_form(
        &self,
        url: &str,
        form: &[(&str, &str)],
        authorization: Option<HeaderValue>,
    ) -> Result<Answer, OAuthError> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let form_type = HeaderValue::from_static("application/x-www-form-urlencoded");
        self.exchange(
            Method::POST,
            url,
            Some(form_type),
            authorization,
            Bytes::from(body),
        )
        .await
    }

    pub async fn post_json(&self, url: &str, body: &Value) -> Result<Answer, OAuthError> {
        let json_type = HeaderValue::from_static("application/json");
        self.exchange(
            Method::POST,
            url,
            Some(json_type),
            None,
            Bytes::from(body.to_string()),
        )
        .await
    }

    async fn exchange(
        &self,
        method: Method,
        url: &str,
        content_type: Option<HeaderValue>,
        authorization: Option<HeaderValue>,
        body: Bytes,
    ) -> Result<Answer, OAuthError> {
        let failed = |reason: String| OAuthError::Exchange {
            url: url.to_string(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|error: http::uri::InvalidUri| failed(error.to_string()))?;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        if let Some(content_type) = content_type {
            headers.insert(CONTENT_TYPE, content_type);
        }
        if let Some(authorization) = authorization {
            headers.insert(AUTHORIZATION, authorization);
        }
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| failed(crate::error_chain(&error)))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|error| failed(format!("reading the answer: {error}")))?
                .to_bytes();
            let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
            Ok(Answer { status, json })
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(failed(format!(
                    "no answer within {} s",
                    EXCHANGE_TIMEOUT.as_secs()
                )))
            })
    }
}
