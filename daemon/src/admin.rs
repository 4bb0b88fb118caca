//! The admin listener: `/` (the console, `console/`), `/status` (JSON), `/metrics`
//! (Prometheus text), `/healthz`, `/readyz`, the pins
//! (`GET /pins`, `GET /pins/diff[?upstream=NAME]`), and the mutating endpoints
//! `POST /reload`, `POST /upstreams/<name>/restart`, `POST /pins/approve` and
//! `POST /pins/reset`, which go through the control path; and
//! `POST /upstreams/<name>/login|logout`, which start a hosted upstream again
//! with what its token store holds now.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Map, Value};

use tokio::sync::watch;

use crate::access;
use crate::config::DaemonSettings;
use crate::console;
use crate::control::{Action, ControlHandle, ReloadCause, ReloadOutcome};
use crate::http_front::HttpFront;
use crate::hub::Hub;
use crate::listener::Body;
use crate::upstreams::{RestartOutcome, UpstreamState};

/// What the admin listener serves with.
pub struct Admin {
    pub hub: Arc<Hub>,
    pub control: ControlHandle,
    /// Allowed hosts and origins, tokens: read per request.
    pub settings: watch::Receiver<DaemonSettings>,
    /// Where this listener is bound: beyond loopback every request needs a token.
    pub address: SocketAddr,
    /// The MCP front, for its sessions.
    pub front: Arc<HttpFront>,
    /// When the daemon started, for the status's uptime: real elapsed time.
    #[allow(clippy::disallowed_types)]
    pub started: std::time::Instant,
    /// Cancelled when plexus starts to stop: the console's event streams end then,
    /// so they never hold up the listener's drain.
    pub shutdown: tokio_util::sync::CancellationToken,
}

pub async fn handle(admin: Arc<Admin>, request: Request<Incoming>) -> Response<Body> {
    let mut response = route(admin, request).await;
    console::secure(&mut response);
    response
}

async fn route(admin: Arc<Admin>, request: Request<Incoming>) -> Response<Body> {
    if let Some(refusal) = admin.refuse(&request) {
        return refusal;
    }
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    if request.method() == Method::POST {
        if path == "/console/login" {
            let tokens = admin.settings.borrow().auth_tokens.clone();
            return match read_admin_body(&admin, request.into_body()).await {
                Ok(body) => console::login(&body, &tokens),
                Err(refusal) => refusal,
            };
        }
        if path == "/console/logout" {
            return console::logout();
        }
        if path == "/pins/approve" || path == "/pins/reset" {
            return pins_action(&admin, &path, request.into_body()).await;
        }
        if path == "/reload" {
            return match admin.control.reload(ReloadCause::Admin).await {
                Some(report) => {
                    let status = if report.outcome == ReloadOutcome::Rejected {
                        StatusCode::UNPROCESSABLE_ENTITY
                    } else {
                        StatusCode::OK
                    };
                    let body = serde_json::to_string(&report).unwrap_or_default();
                    text(status, "application/json", body)
                }
                None => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "plexus is shutting down\n".into(),
                ),
            };
        }
        // POST /upstreams/<name>/login and /logout: the token store changed.
        if let Some((name, login)) = path.strip_prefix("/upstreams/").and_then(|rest| {
            rest.strip_suffix("/login")
                .map(|name| (name, true))
                .or_else(|| rest.strip_suffix("/logout").map(|name| (name, false)))
        }) {
            return login_changed(&admin.hub, name, login).await;
        }
        // POST /upstreams/<name>/restart: start again now, even from `failed`;
        // answered once a serving upstream's successor serves (or did not start).
        let name = path
            .strip_prefix("/upstreams/")
            .and_then(|rest| rest.strip_suffix("/restart"));
        let Some(name) = name else {
            return text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        };
        return match admin.control.restart(name).await {
            Some(outcome) => {
                let (status, body) = restart_answer(name, &outcome);
                text(status, "application/json", body.to_string())
            }
            None => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "no such enabled upstream\n".into(),
            ),
        };
    }
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET, POST /reload, POST /upstreams/<name>/restart|login|logout, POST /pins/approve or POST /pins/reset\n".into(),
        );
    }
    let hub = &admin.hub;
    if let Some(asset) = console::asset(&path) {
        return asset;
    }
    match path.as_str() {
        "/" => {
            let tokens = &admin.settings.borrow().auth_tokens;
            console::page(
                request.headers(),
                console::guard::signed_in(request.headers(), tokens),
            )
        }
        "/console/state" => console::state_once(hub, &admin.front, admin.started),
        "/console/events" => console::events(
            hub.clone(),
            admin.front.clone(),
            admin.started,
            admin.shutdown.clone(),
        ),
        "/console/catalog" => console::catalog(hub, &query),
        "/status" => {
            let status =
                crate::status::status(hub, admin.front.sessions_by_principal(), admin.started);
            text(StatusCode::OK, "application/json", status.to_string())
        }
        "/pins" => json_answer(hub.pins_status()),
        "/pins/diff" => {
            let upstream = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("upstream="));
            json_answer(hub.pins_diff(upstream.filter(|name| !name.is_empty())))
        }
        "/metrics" => {
            hub.refresh_metrics();
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                hub.metrics().render(),
            )
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => readiness(hub, admin.front.draining()),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

impl Admin {
    /// The answer to a request this listener does not serve: a foreign or duplicated
    /// `Host` or `Origin`; beyond loopback, no valid bearer token or console sign-in
    /// (a browser asking for `/` gets the login form); and for a mutating POST, an
    /// `Origin` other than a page of this listener's own carrying its token, or a
    /// `Host` that is not this listener's own (its port).
    fn refuse(&self, request: &Request<Incoming>) -> Option<Response<Body>> {
        let headers = request.headers();
        let path = request.uri().path();
        let settings = self.settings.borrow();
        let mut checked = access::check_host_and_origin(headers, &settings);
        let login = request.method() == Method::POST && path == "/console/login";
        // The login form's style (and the script) hold nothing to protect; a
        // balancer's or the kubelet's probes carry no token and learn only whether
        // this node takes requests.
        let probe = request.method() == Method::GET && matches!(path, "/healthz" | "/readyz");
        let public =
            login || probe || (request.method() == Method::GET && console::asset(path).is_some());
        if checked.is_ok()
            && !self.address.ip().is_loopback()
            && !public
            && !console::guard::signed_in(headers, &settings.auth_tokens)
        {
            checked = access::authenticate(headers, &settings).map(drop);
            if checked.is_err() && request.method() == Method::GET && path == "/" {
                return Some(console::login_page(StatusCode::OK, false));
            }
        }
        if let Err(refusal) = checked {
            let mut response = text(
                refusal.status(),
                "text/plain",
                format!("{}\n", refusal.message()),
            );
            if let Some(challenge) = refusal.challenge() {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
            }
            return Some(response);
        }
        if request.method() != Method::POST {
            return None;
        }
        // A web page can send a cross-origin POST; an operator's tools send no Origin,
        // the console's page its own with the token it was served (the login form
        // has none yet: a cross-origin one still fails on its Origin).
        let own_page = if login {
            console::guard::own_origin(headers).is_some()
        } else {
            console::guard::from_own_page(headers)
        };
        if headers.contains_key(header::ORIGIN) && !own_page {
            return Some(text(
                StatusCode::FORBIDDEN,
                "text/plain",
                "cross-origin requests may not change the daemon\n".into(),
            ));
        }
        let own_port = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .and_then(|host| host.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .unwrap_or(80);
        (own_port != self.address.port()).then(|| {
            text(
                StatusCode::FORBIDDEN,
                "text/plain",
                "a change must name this listener's own host and port\n".into(),
            )
        })
    }
}

/// The most an admin request body may hold.
const ADMIN_BODY_LIMIT: usize = 64 * 1024;

/// A request's body, up to [`ADMIN_BODY_LIMIT`], or the answer refusing it.
async fn read_admin_body(admin: &Admin, body: Incoming) -> Result<Bytes, Response<Body>> {
    let timeout = admin.settings.borrow().body_read_timeout;
    crate::listener::read_body(body, ADMIN_BODY_LIMIT, timeout)
        .await
        .map_err(|error| {
            error.closing(error_answer(error.status(), &adapters::error_chain(&error)))
        })
}

/// `POST /pins/approve` (`{"upstream", "name"?}`) and `POST /pins/reset` (`{"upstream"}`),
/// through the control path.
async fn pins_action(admin: &Admin, path: &str, body: Incoming) -> Response<Body> {
    let bytes = match read_admin_body(admin, body).await {
        Ok(bytes) => bytes,
        Err(refusal) => return refusal,
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => {
            return error_answer(
                StatusCode::BAD_REQUEST,
                &format!("the body is not JSON: {error}"),
            )
        }
    };
    let Some(upstream) = request
        .get("upstream")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return error_answer(StatusCode::BAD_REQUEST, "the body names no `upstream`");
    };
    let name = request
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string);
    let answer = if path == "/pins/approve" {
        admin
            .control
            .pins(|reply| Action::ApprovePin {
                upstream,
                name,
                reply,
            })
            .await
    } else {
        admin
            .control
            .pins(|reply| Action::ResetPin { upstream, reply })
            .await
    };
    match answer {
        Some(Ok(outcome)) => text(StatusCode::OK, "application/json", outcome.to_string()),
        Some(Err(error)) => error_answer(StatusCode::CONFLICT, &error),
        None => error_answer(StatusCode::SERVICE_UNAVAILABLE, "plexus is shutting down"),
    }
}

fn json_answer<E: std::fmt::Display>(outcome: Result<Value, E>) -> Response<Body> {
    match outcome {
        Ok(value) => text(StatusCode::OK, "application/json", value.to_string()),
        Err(error) => error_answer(StatusCode::CONFLICT, &error.to_string()),
    }
}

fn error_answer(status: StatusCode, error: &str) -> Response<Body> {
    text(
        status,
        "application/json",
        json!({ "error": error }).to_string(),
    )
}

/// `plexus login` stored tokens (or `plexus logout` cleared them): the upstream
/// starts again with what the store holds now, without a restart of the daemon.
/// Answered once it is ready (login) or waits for a login (logout), or 409 with
/// where it went instead.
async fn login_changed(hub: &Hub, name: &str, login: bool) -> Response<Body> {
    let Some(upstream) = hub.upstreams().get(name).cloned() else {
        return error_answer(StatusCode::NOT_FOUND, "no such upstream");
    };
    if upstream.login().is_none() {
        return error_answer(
            StatusCode::CONFLICT,
            "this upstream does not log in with OAuth (it is not HTTP, or it configures an Authorization header)",
        );
    }
    let mut states = upstream.shared.state_changes();
    upstream.shared.retry();
    let wanted = if login {
        UpstreamState::Ready
    } else {
        UpstreamState::NeedsLogin
    };
    let settled = tokio::time::timeout(LOGIN_SETTLE, async {
        // The retry is taken up first: a state before a change is the old run's.
        loop {
            if states.changed().await.is_err() {
                return upstream.shared.state();
            }
            let state = *states.borrow_and_update();
            match state {
                UpstreamState::Ready
                | UpstreamState::NeedsLogin
                | UpstreamState::Failed
                | UpstreamState::BackingOff { .. }
                | UpstreamState::Disabled => return state,
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| upstream.shared.state());
    let body = json!({
        "upstream": name,
        "state": settled.label(),
        "error": (settled != wanted).then(|| upstream.shared.last_error()).flatten(),
    });
    let status = if settled == wanted {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    text(status, "application/json", body.to_string())
}

/// How long `POST /upstreams/<name>/login` waits for the upstream to settle.
const LOGIN_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Ready when every enabled upstream is serving or startable on demand; the body
/// says where each one is.
/// Ready: every upstream serves, and this node is not draining out of its cluster.
fn readiness(hub: &Hub, draining: bool) -> Response<Body> {
    let mut upstreams = Map::new();
    let mut ready = !draining;
    for (name, state) in hub.states() {
        if !matches!(
            state,
            UpstreamState::Ready | UpstreamState::Disabled | UpstreamState::Idle
        ) {
            ready = false;
        }
        upstreams.insert(name, Value::from(state.label()));
    }
    let mut body = json!({"ready": ready, "upstreams": upstreams});
    if draining {
        body["draining"] = Value::Bool(true);
    }
    let body = body.to_string();
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

/// The answer to `POST /upstreams/<name>/restart`: 202 when the restart was done
/// (`outcome` `restarted`: a successor serves, the predecessor drains) or asked of
/// an instance with nothing to keep serving (`in_place`), 502 when the successor
/// did not start (`failed`: the running instance serves on).
fn restart_answer(name: &str, outcome: &RestartOutcome) -> (StatusCode, Value) {
    match outcome {
        RestartOutcome::Replaced {
            generation,
            pid,
            previous_pid,
        } => (
            StatusCode::ACCEPTED,
            json!({
                "upstream": name,
                "restart": "requested",
                "outcome": "restarted",
                "generation": generation,
                "pid": pid,
                "previous_pid": previous_pid,
            }),
        ),
        RestartOutcome::InPlace { state } => (
            StatusCode::ACCEPTED,
            json!({
                "upstream": name,
                "restart": "requested",
                "outcome": "in_place",
                "state": state,
            }),
        ),
        RestartOutcome::Failed { reason } => (
            StatusCode::BAD_GATEWAY,
            json!({
                "upstream": name,
                "restart": "requested",
                "outcome": "failed",
                "error": reason,
            }),
        ),
    }
}
