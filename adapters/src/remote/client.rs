//! The hyper client: pooled connections (see `tls`), requests with the configured
//! headers, and 307/308 redirects followed on the same origin only.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE, LOCATION};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::endpoint::{display_url, resolve_on_origin};
use super::head::Head;
use super::{tls, Shared, SESSION_HEADER, VERSION_HEADER};
use crate::rpc::ConnectionError;

type Connector = tls::Connector;

pub(crate) type HttpClient = Client<Connector, Full<Bytes>>;

/// Why a POST got no response.
pub(super) enum PostFailure {
    /// No connection could be made: the request never left.
    Unreachable(SendFailure),
    /// The exchange failed after the request may have left.
    Failed(ExchangeError),
}

/// Why [`Shared::send`] got no response to hand back.
#[derive(Debug, thiserror::Error)]
pub enum SendFailure {
    #[error(transparent)]
    Http(hyper_util::client::legacy::Error),
    /// A redirect it does not follow, said whole.
    #[error("{0}")]
    Redirect(String),
}

impl SendFailure {
    pub(super) fn is_connect(&self) -> bool {
        matches!(self, SendFailure::Http(error) if error.is_connect())
    }
}

/// Why an HTTP exchange ended without the reply it carried: the source of a
/// [`ConnectionError::Broken`].
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    #[error(transparent)]
    Send(#[from] SendFailure),
    /// Reading the response body failed.
    #[error(transparent)]
    Body(#[from] hyper::Error),
    #[error("no acknowledgement within {} s", .0.as_secs())]
    Unacknowledged(Duration),
    #[error("the response ({content_type}) is not JSON")]
    NotJson {
        content_type: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the JSON response holds no reply to the request")]
    NoReply,
    #[error("the event stream ended before the reply")]
    StreamEnded,
}

/// How many redirects one request follows.
const MAX_REDIRECTS: usize = 5;

/// The pooled client every request of one connection goes through.
pub(crate) fn build(connect_timeout: Duration) -> Result<HttpClient, String> {
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build(tls::connector(connect_timeout)?))
}
impl Shared {
    /// Sends what `build` makes for `target`, following a 307 or 308 redirect (they keep the method and
    /// the body) on the same origin, up to [`MAX_REDIRECTS`] times: a server mounted
    /// at `/mcp/` answers `/mcp` so. A redirect to another origin is not followed,
    /// since every request carries the configured headers.
    pub(super) async fn send(
        &self,
        target: &Uri,
        build: impl Fn(&Uri) -> Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, SendFailure> {
        let mut target = target.clone();
        let mut redirects = 0;
        loop {
            // Built anew for each target: nothing is copied unless redirected.
            let response = self
                .client
                .request(build(&target))
                .await
                .map_err(SendFailure::Http)?;
            if !matches!(
                response.status(),
                StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
            ) {
                return Ok(response);
            }
            let Some(location) = response.headers().get(LOCATION) else {
                return Ok(response);
            };
            let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
            let from = display_url(&target);
            if redirects == MAX_REDIRECTS {
                return Err(SendFailure::Redirect(format!(
                    "{from} redirected more than {MAX_REDIRECTS} times"
                )));
            }
            redirects += 1;
            target = resolve_on_origin(&target, &location).map_err(|reason| {
                SendFailure::Redirect(format!(
                    "{from} redirected to {reason}, which plexus does not follow (set the upstream's `url` to it)"
                ))
            })?;
            if !self.redirect_noted.swap(true, Ordering::Relaxed) {
                tracing::warn!(upstream = %self.upstream, from = %from, to = %display_url(&target), "the upstream redirects; following (setting its `url` to where it points saves a round trip a request)");
            }
        }
    }

    /// A request to `target` with the configured headers.
    pub(super) fn request(
        &self,
        method: Method,
        target: &Uri,
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = target.clone();
        request.headers_mut().extend(self.headers.clone());
        let bearer = self
            .bearer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(bearer) = bearer {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, bearer);
        }
        request
    }

    /// Posts one message. Streamable HTTP adds its headers; a request's own
    /// (`head`) say what a 2026-07-28 request carries.
    pub(super) async fn post(
        &self,
        target: &Uri,
        head: Option<&Head>,
        body: Bytes,
        streamable: bool,
    ) -> Result<Response<Incoming>, PostFailure> {
        let build = |target: &Uri| self.post_request(target, head, body.clone(), streamable);
        self.send(target, build).await.map_err(|failure| {
            if failure.is_connect() {
                PostFailure::Unreachable(failure)
            } else {
                PostFailure::Failed(failure.into())
            }
        })
    }

    /// The exchange with the server failed before its reply arrived.
    pub(super) fn broken(&self, cause: impl Into<ExchangeError>) -> ConnectionError {
        ConnectionError::Broken {
            url: self.url_text.clone(),
            source: Arc::new(cause.into()),
        }
    }

    /// The server could not be reached; also the reason its connection closes.
    pub(super) fn unreachable(&self, failure: SendFailure) -> (ConnectionError, String) {
        let reason = format!("{}: {}", self.url_text, crate::error_chain(&failure));
        let error = ConnectionError::Unreachable {
            url: self.url_text.clone(),
            source: Arc::new(failure),
        };
        (error, reason)
    }

    /// The POST of one message to `target`: streamable HTTP adds its headers.
    pub(super) fn post_request(
        &self,
        target: &Uri,
        head: Option<&Head>,
        body: Bytes,
        streamable: bool,
    ) -> Request<Full<Bytes>> {
        let mut request = self.request(Method::POST, target, body);
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(traceparent) = head.and_then(|head| head.traceparent.clone()) {
            headers.insert("traceparent", traceparent);
        }
        if streamable {
            headers.insert(
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            if let Some(session) = self.session_id() {
                headers.insert(SESSION_HEADER, session);
            }
            let modern = head.and_then(|head| head.modern_version.clone());
            if let Some(version) = modern.clone().or_else(|| self.negotiated_version()) {
                headers.insert(VERSION_HEADER, version);
            }
            if let (Some(head), Some(_)) = (head, modern) {
                if let Some(method) = &head.method {
                    headers.insert("mcp-method", method.clone());
                }
                if let Some(name) = &head.name {
                    headers.insert("mcp-name", name.clone());
                }
                for (name, value) in &head.params {
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
        request
    }
}
