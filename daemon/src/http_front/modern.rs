//! The 2026-07-28 per-request path: no session; the headers mirror the body, and
//! each request is served by a session made for it alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{header, HeaderMap, StatusCode};
use hyper::Response;
use serde_json::Value;

use super::event_stream::answer_on_stream;
use super::{
    answer_response, empty, json_error, json_response, modern_status, HttpFront, METHOD_HEADER,
    NAME_HEADER, PROTOCOL_HEADER,
};
use crate::client_message::ClientMessage;
use crate::cluster::PeerListen;
use crate::era::{self, Era};
use crate::jsonrpc::{self, RelayError};
use crate::listener::Body;
use crate::session::{CloseOnDrop, Handled, Identity, Session};

impl HttpFront {
    /// A 2026-07-28 message: no session; the headers must mirror the body.
    /// `peers`: a client's listen, to be heard on the other nodes too.
    pub(super) async fn post_modern(
        &self,
        headers: &HeaderMap,
        mut received: ClientMessage,
        identity: Identity,
        peers: Option<PeerListen>,
    ) -> Response<Body> {
        let catalog = self.hub.catalog_for(identity.view.as_deref());
        // The headers are checked against the arguments a tool mirrors into them.
        let message = &received.message;
        let mirrors_arguments = message
            .get("method")
            .and_then(Value::as_str)
            .and_then(|method| era::mirrored_name(method, message.get("params")))
            .flatten()
            .is_some_and(|name| !catalog.param_headers(name).is_empty());
        let arguments_read = if mirrors_arguments {
            received.read_arguments()
        } else {
            Ok(())
        };
        let message = &received.message;
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return json_error(
                StatusCode::BAD_REQUEST,
                &RelayError::InvalidRequest("only requests and notifications are accepted".into()),
            );
        };
        if message.get("id").is_none() {
            // This revision defines no notification a client sends over HTTP.
            return empty(StatusCode::ACCEPTED);
        }
        let params = message.get("params");
        let checked = arguments_read
            .and_then(|()| check_mirrored_headers(headers, method, params, &catalog))
            .and_then(|()| era::check_meta(params, received.capabilities.is_some()));
        if let Err(error) = checked {
            let response = jsonrpc::error_object_response(id, error.to_modern_error_object());
            return json_response(StatusCode::BAD_REQUEST, &response);
        }
        let principal = identity.principal.clone();
        let session = Session::stateless(
            self.hub.clone(),
            self.paused.clone(),
            identity,
            &self.nowhere,
        );
        if self.stateless_added.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
            self.stateless
                .retain(|_, session| session.strong_count() > 0);
        }
        self.stateless
            .insert(session.id(), Arc::downgrade(&session));
        if accepts_event_stream(headers) {
            return answer_on_stream(
                session,
                received,
                Era::Modern,
                self.cluster.clone().map(|cluster| (cluster, principal)),
                peers,
            )
            .await;
        }
        let _closing = CloseOnDrop(session.clone());
        match session.handle(received, Era::Modern, None).await {
            Handled::Respond(response) => {
                // An upstream's paused round names this node and principal (in a cluster).
                let response = match &self.cluster {
                    Some(cluster) => cluster.seal_upstream_state(response, &principal),
                    None => response,
                };
                answer_response(modern_status(&response), response)
            }
            Handled::Nothing => empty(StatusCode::ACCEPTED),
        }
    }
}

fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"))
}

/// The headers a 2026-07-28 request must carry, mirroring its body, so that
/// anything routing on headers sees what plexus executes.
fn check_mirrored_headers(
    headers: &HeaderMap,
    method: &str,
    params: Option<&Value>,
    catalog: &registry::Catalog,
) -> Result<(), RelayError> {
    let header = |name: &str| -> Result<std::borrow::Cow<'_, str>, RelayError> {
        let value = headers
            .get(name)
            .ok_or_else(|| RelayError::HeaderMismatch(format!("the {name} header is required")))?;
        value
            .to_str()
            .ok()
            .and_then(registry::headers::decode_header_value)
            .ok_or_else(|| RelayError::HeaderMismatch(format!("the {name} header is malformed")))
    };
    let version = header(PROTOCOL_HEADER)?;
    if let Some(declared) = era::declared_version(params).and_then(Value::as_str) {
        if declared != version {
            return Err(RelayError::HeaderMismatch(format!(
                "MCP-Protocol-Version `{version}` does not match `_meta` `{declared}`"
            )));
        }
    }
    let sent = header(METHOD_HEADER)?;
    if sent != method {
        return Err(RelayError::HeaderMismatch(format!(
            "Mcp-Method `{sent}` does not match the body's `{method}`"
        )));
    }
    if let Some(name) = era::mirrored_name(method, params) {
        let sent = header(NAME_HEADER)?;
        if Some(&*sent) != name {
            return Err(RelayError::HeaderMismatch(format!(
                "Mcp-Name `{sent}` does not match the body's `{}`",
                name.unwrap_or_default()
            )));
        }
        // The tool's parameters that its schema mirrors into headers.
        if method == "tools/call" {
            let arguments = params.and_then(|p| p.get("arguments"));
            for designated in catalog.param_headers(name.unwrap_or_default()) {
                let Some(expected) = designated.value_in(arguments) else {
                    continue;
                };
                let header_name = designated.header_name();
                let sent = header(&header_name)?;
                if !registry::headers::header_matches(&sent, &expected) {
                    return Err(RelayError::HeaderMismatch(format!(
                        "Mcp-Param-{} `{sent}` does not match the argument `{expected}`",
                        designated.name
                    )));
                }
            }
        }
    }
    Ok(())
}
