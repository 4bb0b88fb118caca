//! A request for a session or paused round another node holds, passed to that
//! node once over HTTP and its answer (a JSON body or an event stream) streamed
//! back as it comes. Only the connection is bounded ([`CONNECT_TIMEOUT`]): a call
//! may rightly run for minutes once the owner has it.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Cluster, CONNECT_TIMEOUT, FORWARDED_BY_HEADER, PEER_AUTH_HEADER, SERVED_BY_HEADER};
use crate::listener::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type PeerBody = BoxBody<Bytes, BoxError>;

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
    #[error("the request cannot be forwarded")]
    Request(#[source] http::Error),
}

/// Pooled connections to the peers: a forwarded request costs no handshake.
pub(super) struct PeerClient {
    client: Client<HttpConnector, PeerBody>,
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
    pub async fn forward<B>(
        &self,
        node: &str,
        parts: http::request::Parts,
        body: B,
    ) -> Result<Response<Body>, ForwardError>
    where
        B: hyper::body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let base = self.address_of(node).await?;
        let path = parts.uri.path();
        let path_and_query = parts.uri.path_and_query().map_or(path, |p| p.as_str());
        let mut builder = Request::builder()
            .method(parts.method.clone())
            .uri(format!("{base}{path_and_query}"));
        for (name, value) in &parts.headers {
            if !is_hop_by_hop(name) && name != FORWARDED_BY_HEADER && name != PEER_AUTH_HEADER {
                // The client's Host stays: the owner checks it as this node did.
                builder = builder.header(name, value);
            }
        }
        let request = builder
            .header(FORWARDED_BY_HEADER, &self.node)
            .header(
                PEER_AUTH_HEADER,
                self.peer_auth(parts.method.as_str(), path),
            )
            .body(body.map_err(Into::into).boxed())
            .map_err(ForwardError::Request)?;
        let response = self
            .client
            .client
            .request(request)
            .await
            .map_err(|source| {
                if source.is_connect() {
                    ForwardError::Unreachable {
                        node: node.to_string(),
                        source,
                    }
                } else {
                    ForwardError::Failed {
                        node: node.to_string(),
                        source,
                    }
                }
            })?;
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
