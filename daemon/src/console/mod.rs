//! The console at `/` of the admin listener: one page, its script and style
//! embedded in the binary (no build step, nothing fetched from elsewhere), fed by
//! `GET /console/events` (server-sent events: the state every second) and `GET
//! /console/catalog[?view=NAME]`; its buttons call the admin endpoints the CLI
//! calls, with the page's token (`guard.rs`). Beyond loopback, `/` is a login form
//! until the admin token is given (`POST /console/login` sets the cookie).

pub mod guard;
pub mod state;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
#[allow(clippy::disallowed_types)] // the daemon's uptime is real elapsed time
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::AuthTokens;
use crate::http_front::HttpFront;
use crate::hub::Hub;
use crate::listener::Body;
use crate::upstreams::UpstreamState;

const PAGE: &str = include_str!("page.html");
const LOGIN: &str = include_str!("login.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

/// How often the event stream sends the state: what is not a change of an
/// upstream's state (calls, pins, activity) shows within this.
pub const STATE_INTERVAL: Duration = Duration::from_secs(1);

/// No script but our own file, no inline style, nothing from elsewhere, no frames.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// Adds the headers every answer of the admin listener carries.
pub fn secure(response: &mut Response<Body>) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The page, with a fresh token for its own requests; `signed_in` when it was
/// reached with a sign-in cookie (it then offers to sign out).
pub fn page(headers: &HeaderMap, signed_in: bool) -> Response<Body> {
    let token = guard::page_token(headers);
    answer(
        StatusCode::OK,
        "text/html; charset=utf-8",
        PAGE.replace("{{TOKEN}}", &token)
            .replace("{{SIGNED_IN}}", if signed_in { "true" } else { "false" }),
    )
}

/// The login form, saying why it is shown again when a token was refused.
pub fn login_page(status: StatusCode, refused: bool) -> Response<Body> {
    let note = if refused {
        "<p class=\"bad\" role=\"alert\">That is not an admin token.</p>"
    } else {
        ""
    };
    answer(
        status,
        "text/html; charset=utf-8",
        LOGIN.replace("{{NOTE}}", note),
    )
}

/// The script and the style, or None for another path.
pub fn asset(path: &str) -> Option<Response<Body>> {
    let (content_type, body) = match path {
        "/console/app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/console/style.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    };
    Some(answer(StatusCode::OK, content_type, body))
}

/// `POST /console/login` (a form: `token=…`): a cookie and back to `/`, or the form again.
pub fn login(body: &[u8], tokens: &AuthTokens) -> Response<Body> {
    let token = url::form_urlencoded::parse(body)
        .find(|(key, _)| key == "token")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    let Some(cookie) = guard::sign_in(token.trim(), tokens) else {
        return login_page(StatusCode::UNAUTHORIZED, true);
    };
    let mut response = answer(StatusCode::SEE_OTHER, "text/plain", "signed in\n");
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/"));
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /console/logout`: the cookie cleared, back to `/`.
pub fn logout() -> Response<Body> {
    let mut response = answer(StatusCode::SEE_OTHER, "text/plain", "signed out\n");
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/"));
    if let Ok(cookie) = HeaderValue::from_str(&guard::sign_out()) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `GET /console/state`: the state once, as JSON.
#[allow(clippy::disallowed_types)] // `started`: see the import
pub fn state_once(hub: &Hub, front: &HttpFront, started: Instant) -> Response<Body> {
    let state = state::state(hub, front.sessions_by_principal(), started);
    answer(StatusCode::OK, "application/json", state.to_string())
}

/// `GET /console/catalog[?view=NAME]`.
pub fn catalog(hub: &Hub, query: &str) -> Response<Body> {
    let view = url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "view")
        .map(|(_, value)| value.into_owned())
        .filter(|view| !view.is_empty());
    match state::catalog(hub, view.as_deref()) {
        Ok(catalog) => answer(StatusCode::OK, "application/json", catalog.to_string()),
        Err(error) => answer(
            StatusCode::NOT_FOUND,
            "application/json",
            serde_json::json!({ "error": error }).to_string(),
        ),
    }
}

/// `GET /console/events`: the state now, at every upstream's change of state (so a
/// crash followed by a quick restart is still seen), and every [`STATE_INTERVAL`];
/// until the page goes away (the stream is dropped with its connection) or
/// `stopping` is cancelled (plexus starts to stop: the listener's drain is not held
/// up). No task: the body is polled by its connection, which its listener tracks.
#[allow(clippy::disallowed_types)] // `started`: see the import
pub fn events(
    hub: Arc<Hub>,
    front: Arc<HttpFront>,
    started: Instant,
    stopping: CancellationToken,
) -> Response<Body> {
    let mut ticks = tokio::time::interval(STATE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = Stream {
        hub,
        front,
        started,
        ticks,
        states: Vec::new(),
        first: true,
    };
    let frames = futures::stream::unfold(stream, move |mut stream| {
        let stopping = stopping.clone();
        async move {
            if std::mem::take(&mut stream.first) {
                return Some((frame(Bytes::from_static(b"retry: 1000\n\n")), stream));
            }
            tokio::select! {
                _ = stream.ticks.tick() => {}
                _ = changed(&mut stream.states) => {}
                () = stopping.cancelled() => return None,
            }
            // Watched before the state is read: a change while it is built is
            // sent next, not lost.
            stream.states = stream
                .hub
                .upstreams()
                .values()
                .map(|upstream| upstream.shared.state_changes())
                .collect();
            let state = state::state(
                &stream.hub,
                stream.front.sessions_by_principal(),
                stream.started,
            );
            let data = Bytes::from(format!("event: state\ndata: {state}\n\n"));
            Some((frame(data), stream))
        }
    });
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What one event stream keeps between its events.
struct Stream {
    hub: Arc<Hub>,
    front: Arc<HttpFront>,
    #[allow(clippy::disallowed_types)] // see the import
    started: Instant,
    ticks: tokio::time::Interval,
    /// Each upstream's state, as of the last event.
    states: Vec<watch::Receiver<UpstreamState>>,
    first: bool,
}

fn frame(data: Bytes) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(data))
}

/// Resolves when any of `states` changes (never, when there are none).
async fn changed(states: &mut [watch::Receiver<UpstreamState>]) {
    if states.is_empty() {
        return std::future::pending().await;
    }
    let changes = states.iter_mut().map(|state| Box::pin(state.changed()));
    // An error is an instance gone (a reload replaced it): the event re-reads the set.
    let _ = futures::future::select_all(changes).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The console's whole weight, uncompressed, stays small enough to open on a phone.
    #[test]
    fn the_page_weighs_at_most_150_kb() {
        let weight = PAGE.len() + SCRIPT.len() + STYLE.len();
        println!("console weight: {weight} bytes");
        assert!(weight <= 150 * 1024, "{weight} bytes");
    }
}
