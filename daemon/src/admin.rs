//! The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Map, Value};

use crate::hub::Hub;
use crate::listener::Body;
use crate::upstreams::UpstreamState;

pub async fn handle(hub: Arc<Hub>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path();
    if request.method() == Method::POST {
        // POST /upstreams/<name>/restart: start again now, even from `failed`.
        let name = path
            .strip_prefix("/upstreams/")
            .and_then(|rest| rest.strip_suffix("/restart"));
        return match name {
            Some(name) if hub.retry(name) => text(
                StatusCode::ACCEPTED,
                "application/json",
                json!({"upstream": name, "restart": "requested"}).to_string(),
            ),
            Some(_) => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "no such enabled upstream\n".into(),
            ),
            None => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        };
    }
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET, or POST /upstreams/<name>/restart\n".into(),
        );
    }
    match path {
        "/metrics" => {
            hub.refresh_metrics();
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                hub.metrics().render(),
            )
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => readiness(&hub),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Ready when every enabled upstream is serving or startable on demand; the body
/// says where each one is.
fn readiness(hub: &Hub) -> Response<Body> {
    let mut upstreams = Map::new();
    let mut ready = true;
    for (name, state) in hub.states() {
        if !matches!(
            state,
            UpstreamState::Ready | UpstreamState::Disabled | UpstreamState::Idle
        ) {
            ready = false;
        }
        upstreams.insert(name, Value::from(state.label()));
    }
    let body = json!({"ready": ready, "upstreams": upstreams}).to_string();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(status, "application/json", body)
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
