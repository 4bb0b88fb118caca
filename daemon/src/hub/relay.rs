//! The hot path: [`Hub::forward`], the one way a request reaches an upstream (a
//! limiter slot, the instance, the deadline, the relay metrics, failures mapped to
//! `RelayError`), and the requests built on it (tasks routed by id, subscriptions).

use std::sync::Arc;

use adapters::{ConnectionError, Reply, WrittenMember};
use registry::Route;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::Hub;
use crate::jsonrpc::RelayError;
use crate::telemetry::{self, Wait};
use crate::upstreams::login::{self, BeforeCall};
use crate::upstreams::Upstream;

/// What a relayed request carries besides its method and params.
#[derive(Clone, Copy)]
pub struct CallContext<'a> {
    /// The downstream session the call belongs to (requests the upstream sends
    /// while serving it are attributed to it).
    pub session: u64,
    /// The session that owns per-session instances: the session itself, or for a
    /// 2026-07-28 request served inside a stdio connection, that connection's.
    pub owner: u64,
    /// The upstream's own tool name, for per-tool deadlines.
    pub tool: Option<&'a str>,
    /// Where messages related to this call go (its progress, requests the upstream
    /// sends while serving it): the request's own stream, or the session's.
    pub related: &'a mpsc::Sender<Value>,
    /// `Mcp-Param-*` headers the tool's schema asks for (sent to HTTP upstreams).
    pub headers: &'a [(String, String)],
    /// The caller relays the result as the upstream wrote it unless it must change
    /// it, so it may come unread ([`Reply::Unread`]).
    pub result_unread: bool,
    /// A tool call's arguments as the client wrote them, not among the params:
    /// passed on unread.
    pub arguments: Option<&'a WrittenMember>,
}

impl Hub {
    /// Sends a request to an upstream under plexus's own id and waits, within the
    /// call's deadline (extended by progress, up to the hard maximum), for its answer.
    pub async fn forward(
        self: &Arc<Self>,
        upstream_name: &str,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let upstream = self.upstream_named(upstream_name)?;
        self.forward_to(upstream, method, params, call).await
    }

    /// [`Hub::forward`] to an upstream the caller looked up already (once per call).
    pub async fn forward_to(
        self: &Arc<Self>,
        upstream: Arc<Upstream>,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let started = Instant::now();
        let name = upstream.name_arc().clone();
        let upstream_name: &str = &name;
        // One function, not two: a call's future is one frame deeper per `async fn`.
        let outcome = 'call: {
            let mut upstream = upstream;
            let mut params = params;
            if self.shutdown.is_cancelled() {
                break 'call Err(RelayError::ShuttingDown);
            }
            let _permit = loop {
                let config = upstream.config();
                let limiter = upstream.limiter();
                let acquire = limiter.acquire();
                let Some(permit) =
                    telemetry::waited(Wait::Queue, Some(upstream_name), acquire).await
                else {
                    break 'call Err(RelayError::Overloaded {
                        upstream: upstream_name.to_string(),
                        in_flight: config.max_in_flight,
                        pending: config.max_pending,
                    });
                };
                // A restart or reload put a successor in its place while this call
                // waited: the call goes there, not to an instance about to stop.
                match upstream
                    .retired()
                    .then(|| self.upstreams.get(upstream_name))
                {
                    Some(Some(next)) if next.generation() != upstream.generation() => {
                        upstream = next
                    }
                    _ => break permit,
                }
            };
            let config = upstream.config();
            let base = call
                .tool
                .and_then(|tool| config.tool_timeouts.get(tool))
                .copied()
                .unwrap_or(config.call_timeout);
            let instance = upstream.instance_for(call.owner);
            // A starting upstream is waited for within the call's own deadline (a client
            // that just launched plexus must not see its first call fail); an on-demand
            // start has its own budget.
            let on_demand = upstream.on_demand() || instance.on_demand();
            let wait = if on_demand { config.init_timeout } else { base };
            // A call refused for its token (401: not executed) is sent once more
            // when a refresh gives a new one.
            let spare_params = upstream.login().map(|_| params.clone());
            let mut resent = false;
            loop {
                let ready = instance.connection_for_call(on_demand, wait);
                let ready = telemetry::waited(Wait::UpstreamStart, Some(upstream_name), ready);
                let connection = match ready.await {
                    Ok(connection) => connection,
                    Err(error) => break 'call Err(error),
                };
                if let Some(login) = upstream.login() {
                    if login.before_call(&connection).await == BeforeCall::NeedsLogin {
                        // Started again, the upstream finds no token and waits for a login.
                        instance.retry();
                        break 'call Err(RelayError::NeedsLogin {
                            upstream: upstream.name().to_string(),
                        });
                    }
                }
                let sent_with = upstream.login().map_or(0, |login| login.token_generation());

                // The one crossing into the upstream's era (`era::to_upstream`).
                let relayed = connection
                    .is_per_request()
                    .then(|| self.fanout.relayable_capabilities(call.session));
                crate::era::to_upstream(method, &mut params, relayed);
                // The client's progress token never reaches a shared upstream: plexus's own does.
                let progress = self.progress.register(
                    &mut params,
                    call.related,
                    upstream.name_arc(),
                    instance.owner(),
                );
                let traced = telemetry::client_span(&name, method, params.as_ref());
                // The request gets its upstream-side id first, so whatever the upstream sends
                // while serving it (over HTTP, on this request's own stream) is attributed
                // to this call, and through it to this session.
                let request = match call.arguments {
                    Some(arguments) => {
                        connection.prepare_with_member(method, params, arguments.clone())
                    }
                    None => connection.prepare(method, params),
                };
                let mut request = request.with_headers(call.headers.to_vec());
                if let Some(trace) = traced.as_ref().and_then(telemetry::ClientSpan::carried) {
                    request = request.with_trace(trace);
                }
                if call.result_unread {
                    request = request.result_unread();
                }
                if let Some(traced) = &traced {
                    traced.request_id(request.id());
                }
                let _caller = instance.track_call(
                    call.session,
                    call.related.clone(),
                    request.id(),
                    traced.as_ref().map(telemetry::ClientSpan::trace),
                );
                let activity = progress.as_ref().map(|route| route.activity.clone());

                let call_started = Instant::now();
                let hard_deadline = call_started + base.max(config.max_call_timeout);
                let mut deadline = call_started + base;
                let request = request.send();
                tokio::pin!(request);
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut request => break Ok(outcome.and_then(Reply::checked)),
                        _ = tokio::time::sleep_until(deadline) => break Err(false),
                        _ = upstream.drained() => break Err(true),
                        _ = wait_for(activity.as_deref()) => {
                            // Progress shows the call is alive: give it another full deadline, up to the cap.
                            deadline = (Instant::now() + base).min(hard_deadline);
                        }
                    }
                };
                drop(progress);
                let result = match outcome {
                    Ok(Ok(reply)) => {
                        if let (true, Some(login)) = (resent, upstream.login()) {
                            login.refusal_answered();
                        }
                        Ok(crate::era::answering_as_plexus(reply))
                    }
                    Ok(Err(ConnectionError::Closed)) => Err(RelayError::FailedMidCall {
                        upstream: upstream_name.to_string(),
                        reason: "the upstream exited or its connection closed".into(),
                    }),
                    Ok(Err(ConnectionError::NotSent | ConnectionError::Unreachable { .. })) => {
                        Err(instance.unavailable())
                    }
                    Ok(Err(ConnectionError::TooLarge { limit })) => Err(RelayError::TooLarge {
                        upstream: upstream_name.to_string(),
                        limit,
                    }),
                    Ok(Err(error @ ConnectionError::InvalidReply { .. })) => {
                        let reason = adapters::error_chain(&error);
                        tracing::warn!(upstream = upstream_name, method, error = %reason, "its call failed");
                        Err(RelayError::FailedMidCall {
                            upstream: upstream_name.to_string(),
                            reason,
                        })
                    }
                    Ok(Err(error))
                        if login::refuses_token(&error) && upstream.login().is_some() =>
                    {
                        if let (false, Some(login), Some(again)) =
                            (resent, upstream.login(), spare_params.clone())
                        {
                            if login.refresh_refused(&connection, sent_with).await {
                                resent = true;
                                params = again;
                                continue;
                            }
                        }
                        // The token stopped working before its expiry and a refresh did
                        // not help: a start tries once more, else it waits for a login.
                        if upstream
                            .login()
                            .is_some_and(|login| login.refused_while_ready())
                        {
                            instance.retry();
                        }
                        Err(RelayError::FailedMidCall {
                            upstream: upstream_name.to_string(),
                            reason: adapters::error_chain(&error),
                        })
                    }
                    Ok(Err(
                        error @ (ConnectionError::HttpStatus { .. }
                        | ConnectionError::Broken { .. }
                        | ConnectionError::Malformed { .. }),
                    )) => Err(RelayError::FailedMidCall {
                        upstream: upstream_name.to_string(),
                        reason: adapters::error_chain(&error),
                    }),
                    // Dropping `request` (at the end of this scope) sends the cancel upstream.
                    Err(true) => Err(RelayError::Drained {
                        upstream: upstream_name.to_string(),
                    }),
                    Err(false) => Err(RelayError::Timeout {
                        upstream: upstream_name.to_string(),
                        after: call_started.elapsed(),
                    }),
                };
                if let Some(traced) = traced {
                    traced.end(&result);
                }
                break result;
            }
        };
        let label = match &outcome {
            Ok(Reply::Result(_) | Reply::Unread(_)) => "ok",
            Ok(Reply::Error(_)) => "upstream_error",
            Err(error) => error.kind(),
        };
        // Only an upstream still in the set once the call ends gets its series (a
        // removed one's are purged): looked up again for that, not for the call.
        if self.upstreams.get(upstream_name).is_some() {
            self.metrics
                .relay_requests
                .with_label_values(&[upstream_name, method, label])
                .inc();
            self.metrics
                .relay_duration
                .with_label_values(&[upstream_name, method])
                .observe(started.elapsed().as_secs_f64());
            let failed = label != "ok";
            self.metrics
                .recent
                .record(upstream_name, failed, started.elapsed());
        }
        outcome
    }

    /// Counts a session's subscription to a resource (see `Fanout::subscription`)
    /// and sends what that asks of the upstream through [`Hub::forward`], like any
    /// request: under its limits and deadline, counted in the relay metrics.
    /// `related` is where requests the upstream sends while serving it go.
    pub async fn subscription(
        self: &Arc<Self>,
        session: u64,
        related: &mpsc::Sender<Value>,
        route: &Route,
        subscribe: bool,
    ) -> Result<(), RelayError> {
        let Some(request) = self.fanout.subscription(session, route, subscribe)? else {
            return Ok(());
        };
        let call = CallContext {
            session,
            owner: session,
            tool: None,
            related,
            headers: &[],
            result_unread: false,
            arguments: None,
        };
        let outcome = match self
            .forward(
                &route.upstream,
                request.method,
                Some(request.params.clone()),
                call,
            )
            .await
        {
            Ok(Reply::Result(_) | Reply::Unread(_)) => Ok(()),
            Ok(Reply::Error(error)) => Err(refused(route, request.method, &error)),
            Err(error) => Err(error),
        };
        if outcome.is_err() {
            self.fanout.subscription_failed(route, &request);
        }
        outcome
    }

    /// Forgets a session: its own instances are stopped and its subscriptions
    /// released upstream (in the background: the session is gone).
    pub fn end_session(self: &Arc<Self>, session: u64, subscriptions: Vec<String>) {
        let routes = self.fanout.end_session(session, subscriptions);
        if routes.is_empty() {
            return;
        }
        let hub = self.clone();
        self.tasks.spawn(async move {
            // Nothing the upstream sends while serving these has a client to reach.
            let (nobody, _) = mpsc::channel(1);
            for route in routes {
                let _ = hub.subscription(session, &nobody, &route, false).await;
            }
        });
    }

    /// `tasks/get`, `tasks/result`, `tasks/cancel`: routed by the task id.
    pub async fn forward_task_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<Value>,
        call: CallContext<'_>,
    ) -> Result<Reply, RelayError> {
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        let exposed = params
            .get("taskId")
            .and_then(Value::as_str)
            .ok_or_else(|| RelayError::InvalidParams("`taskId` must be a string".into()))?
            .to_string();
        let (upstream, original) = self
            .task_route(&exposed)
            .ok_or_else(|| RelayError::InvalidParams(format!("unknown task `{exposed}`")))?;
        params.insert("taskId".into(), Value::String(original));
        let session = call.session;
        let reply = self
            .forward(&upstream, method, Some(Value::Object(params)), call)
            .await?;
        Ok(self.expose_tasks(&upstream, Some(session), reply))
    }

    /// `tasks/list`: every upstream that lists tasks, merged, ids exposed.
    pub async fn list_tasks(self: &Arc<Self>, call: CallContext<'_>) -> Result<Reply, RelayError> {
        let mut tasks = Vec::new();
        let listing: Vec<String> = self
            .upstreams()
            .values()
            .filter(|upstream| {
                upstream
                    .known_capabilities()
                    .get("tasks")
                    .and_then(|tasks| tasks.get("list"))
                    .is_some()
            })
            .map(|upstream| upstream.name().to_string())
            .collect();
        for upstream in listing {
            // Every page: the tasks a client may see can be on any of them.
            let mut cursor: Option<Value> = None;
            for _ in 0..MAX_TASK_PAGES {
                let context = CallContext {
                    session: call.session,
                    owner: call.owner,
                    tool: None,
                    related: call.related,
                    headers: &[],
                    result_unread: false,
                    arguments: None,
                };
                let params = match cursor.take() {
                    Some(cursor) => json!({ "cursor": cursor }),
                    None => json!({}),
                };
                match self
                    .forward(&upstream, "tasks/list", Some(params), context)
                    .await
                {
                    Ok(reply) => {
                        let Reply::Result(mut result) = self.expose_tasks(&upstream, None, reply)
                        else {
                            break;
                        };
                        if let Some(Value::Array(found)) = result.get_mut("tasks").map(Value::take)
                        {
                            tasks.extend(found);
                        }
                        match result.get_mut("nextCursor").map(Value::take) {
                            Some(next) if !next.is_null() => cursor = Some(next),
                            _ => break,
                        }
                    }
                    // One upstream being down leaves the others' tasks listed.
                    Err(error) => {
                        tracing::debug!(upstream, %error, "listing an upstream's tasks failed");
                        break;
                    }
                }
            }
        }
        Ok(Reply::Result(json!({ "tasks": tasks })))
    }
}

/// The most pages of one upstream's `tasks/list` a client's `tasks/list` reads (an
/// upstream that never stops paging is cut off there).
const MAX_TASK_PAGES: usize = 100;

/// An upstream refused a request plexus made on a session's behalf.
fn refused(route: &Route, method: &str, error: &Value) -> RelayError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("an error");
    RelayError::InvalidParams(format!(
        "upstream `{}` refused {method}: {message}",
        route.upstream
    ))
}

async fn wait_for(activity: Option<&Notify>) {
    match activity {
        Some(activity) => activity.notified().await,
        None => std::future::pending().await,
    }
}
