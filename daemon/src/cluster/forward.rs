//! A request for a session or paused round another node holds, passed to that
//! node once over HTTP and its answer (a JSON body or an event stream) streamed
//! back as it comes. Only the connection is bounded ([`CONNECT_TIMEOUT`]): a call
//! may rightly run for minutes once the owner has it. The body is held, so a
//! pooled connection the owner closed as the request went out (it is stopping)
//! costs one more try on a new connection, not the call.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Cluster, CONNECT_TIMEOUT, FORWARDED_BY_HEADER, PEER_AUTH_HEADER, SERVED_BY_HEADER};
use crate::listener::Body;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("node `{0}` is not a peer of this cluster")]
    UnknownNode(String),
    #[error("cannot resolve the cluster's DNS name `{0}`")]
    Resolve(String, #[source] std::io::Error),
    #[error("node `{node}` cannot be reached (within {}s)", CONNECT_TIMEOUT.as_secs())]
    Unreachable {
        node: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("node `{node}` failed to answer")]
    Failed {
        node: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("node `{node}` has stopped answering (no reply to a probe within {}s)", PROBE_TIMEOUT.as_secs())]
    Unresponsive { node: String },
    #[error("the request cannot be forwarded")]
    Request(#[source] http::Error),
}

/// While a forwarded request waits for its answer (a call may rightly take
/// minutes), the owner is asked every so often for any answer at all: a node that
/// holds the connection but answers nothing (frozen, overloaded beyond reply) ends
/// the wait with a clear error instead of a hang.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Pooled connections to the peers: a forwarded request costs no handshake.
pub(super) struct PeerClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl PeerClient {
    pub(super) fn new() -> PeerClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        PeerClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl Cluster {
    /// Sends a request to `node`, which holds what it names, and returns its answer.
    pub async fn forward(
        &self,
        node: &str,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let base = self.address_of(node).await?;
        let path = parts.uri.path();
        let path_and_query = parts.uri.path_and_query().map_or(path, |p| p.as_str());
        let uri = format!("{base}{path_and_query}");
        let mut headers = http::HeaderMap::new();
        for (name, value) in &parts.headers {
            if !is_hop_by_hop(name) && name != FORWARDED_BY_HEADER && name != PEER_AUTH_HEADER {
                // The client's Host stays: the owner checks it as this node did.
                headers.append(name, value.clone());
            }
        }
        if let Ok(value) = HeaderValue::from_str(&self.node) {
            headers.insert(FORWARDED_BY_HEADER, value);
        }
        let mut retried = false;
        let response = loop {
            let mut request = Request::builder()
                .method(parts.method.clone())
                .uri(&uri)
                .body(Full::new(body.clone()))
                .map_err(ForwardError::Request)?;
            *request.headers_mut() = headers.clone();
            // Signed per try: the signature carries its time.
            if let Ok(value) = HeaderValue::from_str(&self.peer_auth(parts.method.as_str(), path)) {
                request.headers_mut().insert(PEER_AUTH_HEADER, value);
            }
            let answered = tokio::select! {
                answered = self.client.client.request(request) => answered,
                () = self.stops_answering(&base) => {
                    return Err(ForwardError::Unresponsive { node: node.to_string() });
                }
            };
            match answered {
                Ok(response) => break response,
                Err(source) if source.is_connect() => {
                    return Err(ForwardError::Unreachable {
                        node: node.to_string(),
                        source,
                    })
                }
                // Closed unanswered: an idle pooled connection the owner closed as
                // the request went out, or an owner gone (the new try is refused).
                Err(source) if !retried && closed_unanswered(&source) => {
                    tracing::debug!(
                        node,
                        "a pooled connection to a peer was closed; trying a new one"
                    );
                    retried = true;
                }
                Err(source) => {
                    return Err(ForwardError::Failed {
                        node: node.to_string(),
                        source,
                    })
                }
            }
        };
        let (mut parts, incoming) = response.into_parts();
        let hop: Vec<HeaderName> = parts
            .headers
            .keys()
            .filter(|name| is_hop_by_hop(name))
            .cloned()
            .collect();
        for name in hop {
            parts.headers.remove(name);
        }
        if let Ok(value) = HeaderValue::from_str(node) {
            parts.headers.insert(SERVED_BY_HEADER, value);
        }
        Ok(Response::from_parts(parts, relayed(incoming)))
    }
}

impl Cluster {
    /// Ends only when the node at `base` fails to answer a probe in time (any HTTP
    /// answer to `GET /` counts: it is a 404 from a live plexus). A refused probe
    /// does not: a node finishing its last exchanges takes no new connection, and
    /// one that died breaks the forwarded request's own.
    async fn stops_answering(&self, base: &str) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let Ok(probe) = Request::get(format!("{base}/")).body(Full::new(Bytes::new())) else {
                continue;
            };
            match tokio::time::timeout(PROBE_TIMEOUT, self.client.client.request(probe)).await {
                Ok(Err(error)) if timed_out(&error) => return,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

/// The owner's body as it arrives (an event stream included); a broken one ends
/// the client's, as the owner's going away would.
fn relayed(incoming: Incoming) -> Body {
    let frames = futures::stream::unfold(incoming, |mut incoming| async move {
        match incoming.frame().await {
            Some(Ok(frame)) => Some((Ok::<_, Infallible>(frame), incoming)),
            Some(Err(error)) => {
                tracing::info!(%error, "a forwarded answer broke off");
                None
            }
            None => None,
        }
    });
    BodyExt::boxed_unsync(StreamBody::new(frames))
}

/// Whether an error comes of a connection attempt that timed out.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// A connection closed with the request unanswered (hyper's incomplete message).
fn closed_unanswered(error: &hyper_util::client::legacy::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<hyper::Error>())
        .is_some_and(hyper::Error::is_incomplete_message)
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
}
