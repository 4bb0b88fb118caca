//! The method match: which request goes where. A request is registered in
//! flight (so a cancel reaches it), its `_meta` and arguments checked, then
//! answered by plexus (lifecycle, lists, levels, subscriptions) or routed to
//! the owning upstream; a 2026-07-28 request runs in a scope of its own.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use adapters::{Reply, WrittenMember};
use registry::{Catalog, Kind};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::audit_lines::RequestRecord;
use super::forward::{expose_content_uris, expose_error_uri, expose_prompt_uris, with_string};
use super::lists::{cursor_of, list_kind};
use super::routing::{unrouted, Router};
use super::search::{self, MetaCall};
use super::{
    scoped, task_extension, ClientHello, Handled, Session, LATEST_VERSION, SUPPORTED_VERSIONS,
};
use crate::client_message;
use crate::era::{self, Era};
use crate::fanout::Client;
use crate::jsonrpc::{self, RelayError};
use crate::logging::LogLevel;

/// Serves one request of a session (its method match): answered by plexus, or
/// routed and relayed upstream; messages related to it go to `related`.
pub(super) struct Dispatch<'a> {
    session: &'a Session,
    related: &'a mpsc::Sender<Value>,
}

impl<'a> Dispatch<'a> {
    pub(super) fn new(session: &'a Session, related: &'a mpsc::Sender<Value>) -> Dispatch<'a> {
        Dispatch { session, related }
    }

    /// `capabilities`: the request's `_meta` client capabilities, when the front
    /// took them out (see [`ClientMessage`]); `era`: the request's, as its front
    /// decided.
    pub(super) async fn request(
        &self,
        id: Value,
        method: String,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
        capabilities: Option<Arc<Value>>,
        era: Era,
    ) -> Handled {
        let Some(registered) = self.session.in_flight.register(id.to_string()) else {
            return invalid(id, "a request with this id is already in flight");
        };
        let modern = era == Era::Modern;
        // A 2026-07-28 request's `_meta` is checked as it is taken.
        let checked = if modern {
            Ok(())
        } else {
            check_meta_member(params.as_ref())
        };
        if let Err(error) = checked.and_then(|()| check_arguments(&method, params.as_ref())) {
            return failed(id, &error, era);
        }
        // Pinned where it is: `select!` moves what it is given, and this future holds
        // the whole of the request's handling (kilobytes).
        let outcome = {
            let serving = std::pin::pin!(async {
                if modern {
                    self.serve_modern(&id, &method, params, arguments, capabilities)
                        .await
                        .map(Served::Reply)
                } else if let Some(kind) = list_kind(&method) {
                    self.session
                        .lister
                        .page_written(&self.session.hub, self.session.view(), kind, params, &id)
                        .await
                        .map(Served::Page)
                } else {
                    self.serve(&method, params, arguments)
                        .await
                        .map(Served::Reply)
                }
            });
            tokio::select! {
                outcome = serving => Some(outcome),
                _ = registered.token.cancelled() => None,
            }
        };
        match outcome {
            Some(Ok(Served::Page(answer))) => Handled::Respond(answer),
            Some(Ok(Served::Reply(reply))) => {
                Handled::Respond(era::answer(era, &method, id, reply))
            }
            Some(Err(error)) => failed(id, &error, era),
            // Ended with its session (plexus shutting down, or the session deleted or
            // expired): the client still gets an answer.
            None if self.session.closed.is_cancelled() => {
                let error = if self.session.shutting_down.load(Ordering::Relaxed)
                    || self.session.hub.is_stopping()
                {
                    RelayError::ShuttingDown
                } else {
                    RelayError::InvalidRequest("the session ended while this request ran".into())
                };
                failed(id, &error, era)
            }
            // A cancelled request gets no response (the client said it no longer wants one).
            None => Handled::Nothing,
        }
    }

    /// A 2026-07-28 request: its `_meta` is checked, and it runs in a scope of its own.
    async fn serve_modern(
        &self,
        id: &Value,
        method: &str,
        mut params: Option<Value>,
        arguments: Option<WrittenMember>,
        capabilities: Option<Arc<Value>>,
    ) -> Result<Reply, RelayError> {
        let meta = era::take_meta(&mut params, capabilities)?;
        match method {
            "server/discover" => {
                let catalog = self.session.catalog();
                let upstream_extension = self
                    .session
                    .hub
                    .offers_tasks_extension(|upstream| catalog.shows_upstream(upstream));
                Ok(Reply::Result(era::discover_result(
                    era::tasks::advertised(self.capabilities(), upstream_extension),
                    self.instructions(),
                )))
            }
            "tasks/get" | "tasks/update" | "tasks/cancel"
                if !era::tasks::declared(&meta.capabilities) =>
            {
                Err(era::tasks::missing(&format!("`{method}`")))
            }
            "subscriptions/listen" => scoped::listen(self.session, id, params, meta, self.related).await,
            // Replaced in this revision by `_meta` log levels and `subscriptions/listen`;
            // it has no handshake and no ping.
            "logging/setLevel"
            | "resources/subscribe"
            | "resources/unsubscribe"
            | "initialize"
            | "ping"
            // The tasks extension has neither: `tasks/get` inlines the outcome.
            | "tasks/list"
            | "tasks/result" => Err(RelayError::MethodNotFound(method.to_string())),
            _ => scoped::serve(self.session, method, params, arguments, meta, self.related).await,
        }
    }

    /// Serves a request; a tool call's `arguments`, when given, are not in `params`.
    pub(super) async fn serve(
        &self,
        method: &str,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
    ) -> Result<Reply, RelayError> {
        if method == "tools/call" && search::names_meta_tool(params.as_ref()) {
            // A session's first request may be a search, before any upstream has
            // listed: until then the snapshot is empty and no search view's, so it
            // waits as a first list does.
            let hub = &self.session.hub;
            self.session.lister.wait_for_first_list(hub).await;
        }
        // The one snapshot a routed request is routed in, audited in, and has the
        // URIs in its result exposed from.
        let router = Router::new(&self.session.hub, self.session.view());
        // Under a search view, `search_tools` is answered and `call_tool` unwrapped here.
        let (mut params, arguments) = if method == "tools/call" {
            let (mut params, mut arguments) = (params, arguments);
            // `search_tools` is answered here, so it leaves its audit line here.
            let record = if search::is_search(router.catalog(), params.as_ref())
                && RequestRecord::wanted(method, self.session.hub.audit())
            {
                Some(RequestRecord::take(method, &mut params, arguments.take())?)
            } else {
                None
            };
            let meta = self.session.lister.found.meta_call(
                router.catalog(),
                params,
                arguments,
                &self.session.outbound,
            );
            match (meta, record) {
                (Ok(MetaCall::Call { params, arguments }), _) => (params, arguments),
                (Ok(MetaCall::Answered(reply)), record) => {
                    let reply = Ok(reply);
                    if let Some(record) = record {
                        record.write(&self.session.audit(), &reply);
                    }
                    return reply;
                }
                (Err(error), record) => {
                    let reply = Err(error);
                    if let Some(record) = record {
                        record.write(&self.session.audit(), &reply);
                    }
                    return reply;
                }
            }
        } else {
            (params, arguments)
        };
        if !RequestRecord::wanted(method, self.session.hub.audit()) {
            return self
                .serve_routed(method, params, arguments, router, None)
                .await;
        }
        let mut record = RequestRecord::take(method, &mut params, arguments)?;
        let reply = self
            .serve_routed(method, params, None, router, Some(&mut record))
            .await;
        record.write(&self.session.audit(), &reply);
        reply
    }

    /// Serves a request with `router`; an audited one's `record` is told the route
    /// it is sent by.
    async fn serve_routed(
        &self,
        method: &str,
        params: Option<Value>,
        arguments: Option<WrittenMember>,
        mut router: Router<'_>,
        record: Option<&mut RequestRecord>,
    ) -> Result<Reply, RelayError> {
        // The route an audited request took, for its line: the one it is sent by.
        let audit_route = |route: &registry::Route| {
            if let Some(record) = record {
                record.routed(route);
            }
        };
        if let Some(kind) = list_kind(method) {
            return self
                .session
                .lister
                .page(
                    &self.session.hub,
                    self.session.view(),
                    self.session.era,
                    kind,
                    params,
                )
                .await
                .map(Reply::Result);
        }
        match method {
            "initialize" => Ok(Reply::Result(self.initialize(params))),
            "ping" => Ok(Reply::Result(json!({}))),
            "tools/call" => {
                let (mut params, name) = take_string(params, "name")?;
                let route = router.tool(&name).await?;
                audit_route(&route);
                let catalog = router.catalog();
                // What the tool's schema mirrors into headers, for an HTTP upstream.
                let designated = catalog.param_headers(&name);
                let arguments = match arguments {
                    Some(arguments) if !designated.is_empty() => {
                        client_message::put_back(&mut params, &arguments)?;
                        None
                    }
                    arguments => arguments,
                };
                let headers: Vec<(String, String)> = designated
                    .iter()
                    .filter_map(|designated| {
                        let value = designated.value_in(params.get("arguments"))?;
                        Some((
                            designated.header_name(),
                            registry::headers::encode_header_value(&value),
                        ))
                    })
                    .collect();
                let params = if self.session.era == Era::Modern {
                    era::tasks::as_task_if_wanted(
                        params,
                        catalog.task_support(&name),
                        &self.session.declared_capabilities(),
                    )?
                } else {
                    params
                };
                let forwarder = self.session.forwarder(self.related);
                let reply = forwarder
                    .forward_named(method, params, arguments.as_ref(), &route, &headers)
                    .await?;
                Ok(forwarder.tool_result(catalog, &route.upstream, reply))
            }
            "prompts/get" => {
                let (params, name) = take_string(params, "name")?;
                let route = router.prompt(&name).await?;
                audit_route(&route);
                let reply = self
                    .session
                    .forwarder(self.related)
                    .forward_named(method, params, None, &route, &[])
                    .await?;
                Ok(expose_prompt_uris(router.catalog(), &route.upstream, reply))
            }
            "resources/read" => {
                let (params, uri) = take_string(params, "uri")?;
                let route = router.resource(&uri).await?;
                audit_route(&route);
                let params = with_string(params, "uri", &route.original);
                let forwarder = self.session.forwarder(self.related);
                let call = forwarder.call(None);
                let reply = forwarder
                    .forward_with_input(&route.upstream, method, params, call)
                    .await?;
                let reply = expose_error_uri(reply, &route.original, &uri);
                Ok(expose_content_uris(
                    router.catalog(),
                    &route.upstream,
                    reply,
                ))
            }
            "completion/complete" => self.complete(params, router.catalog()).await,
            "tasks/get" | "tasks/update" | "tasks/cancel" if self.session.era == Era::Modern => {
                task_extension::serve(self.session, method, params, self.related).await
            }
            "tasks/get" | "tasks/result" | "tasks/cancel" => {
                task_extension::serve(self.session, method, params, self.related).await
            }
            "tasks/list" => {
                // One page, every upstream's tasks in it: a cursor is none plexus issued.
                if cursor_of(&params).is_some() {
                    return Err(RelayError::InvalidParams(
                        "plexus's tasks/list is one page; it issued no cursor".into(),
                    ));
                }
                let reply = self
                    .session
                    .hub
                    .list_tasks(self.session.call_context(None, self.related))
                    .await?;
                Ok(task_extension::own_tasks(self.session, reply))
            }
            "logging/setLevel" => {
                let level = params
                    .as_ref()
                    .and_then(|p| p.get("level"))
                    .and_then(Value::as_str)
                    .and_then(LogLevel::parse)
                    .ok_or_else(|| {
                        RelayError::InvalidParams("`level` must be a syslog level name".into())
                    })?;
                *self
                    .session
                    .log_level
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(level);
                self.session.hub.log_levels_changed().await;
                Ok(Reply::Result(json!({})))
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let (_, uri) = take_string(params, "uri")?;
                let subscribe = method == "resources/subscribe";
                // A held resource cannot be subscribed to; one subscribed before it
                // was held can still be let go.
                let route = match router.catalog().route_resource(&uri) {
                    Some(route) => route,
                    None => match router.catalog().held(Kind::Resources, &uri) {
                        Some(held) if !subscribe => held.route,
                        _ => return Err(unrouted(router.catalog(), Kind::Resources, &uri)),
                    },
                };
                if subscribe {
                    self.session.subscribe(&uri, &route).await?;
                } else if self.session.lock_subscriptions().remove(&uri) {
                    self.session
                        .hub
                        .subscription(self.session.id, &self.session.outbound, &route, false)
                        .await?;
                }
                Ok(Reply::Result(json!({})))
            }
            other => Err(RelayError::MethodNotFound(other.to_string())),
        }
    }

    /// `completion/complete`, routed by the prompt name or resource template in `ref`.
    async fn complete(
        &self,
        params: Option<Value>,
        catalog: &Catalog,
    ) -> Result<Reply, RelayError> {
        let Some(Value::Object(mut params)) = params else {
            return Err(RelayError::InvalidParams("params must be an object".into()));
        };
        let reference = params
            .get_mut("ref")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| RelayError::InvalidParams("`ref` must be an object".into()))?;
        let kind = reference
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (key, route) = match kind.as_str() {
            "ref/prompt" => {
                let name = reference
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let route = catalog
                    .route_prompt(name)
                    .ok_or_else(|| unrouted(catalog, Kind::Prompts, name))?;
                ("name", route)
            }
            "ref/resource" => {
                let uri = reference
                    .get("uri")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let route = catalog
                    .route_template(uri)
                    .or_else(|| catalog.route_resource(uri))
                    .ok_or_else(|| unrouted(catalog, Kind::ResourceTemplates, uri))?;
                ("uri", route)
            }
            other => {
                return Err(RelayError::InvalidParams(format!(
                    "unknown ref type `{other}`"
                )))
            }
        };
        reference.insert(key.into(), Value::String(route.original.clone()));
        let call = self.session.call_context(None, self.related);
        self.session
            .hub
            .forward(
                &route.upstream,
                "completion/complete",
                Some(Value::Object(params)),
                call,
            )
            .await
    }

    fn initialize(&self, params: Option<Value>) -> Value {
        let params = params.unwrap_or(Value::Null);
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        // Answer the client's version when plexus speaks it, else the newest plexus speaks.
        let version = requested
            .filter(|v| SUPPORTED_VERSIONS.contains(v))
            .unwrap_or(LATEST_VERSION)
            .to_string();
        *self
            .session
            .hello
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = ClientHello {
            protocol_version: Some(version.clone()),
            capabilities: Arc::new(params.get("capabilities").cloned().unwrap_or(Value::Null)),
        };
        json!({
            "protocolVersion": version,
            "capabilities": self.capabilities(),
            "serverInfo": {"name": "plexus", "version": env!("CARGO_PKG_VERSION")},
            "instructions": self.instructions(),
        })
    }

    /// What plexus can relay from the upstreams this client's view shows.
    fn capabilities(&self) -> Value {
        let catalog = self.session.catalog();
        self.session
            .hub
            .capabilities(|upstream| catalog.shows_upstream(upstream))
    }

    /// Tells the client which upstreams stand behind the names it sees.
    fn instructions(&self) -> String {
        let mut lines =
            vec!["plexus aggregates these MCP servers; names carry their prefix:".to_string()];
        // From the snapshot: instructions changed since they were pinned are held back.
        let catalog = self.session.catalog();
        for upstream in self.session.hub.upstreams().values() {
            // A view's hidden upstreams are not named at all.
            if !upstream.config().enabled || !catalog.shows_upstream(upstream.name()) {
                continue;
            }
            let mut line = format!("- {}", upstream.name());
            if let Some(text) = catalog.instructions(upstream.name()) {
                line.push_str(": ");
                line.push_str(text.trim());
            }
            lines.push(line);
        }
        lines.join("\n")
    }
}

/// What a request was served with: an upstream's or plexus's reply, or a list
/// page's answer serialised already.
enum Served {
    Reply(Reply),
    Page(jsonrpc::Answer),
}

/// plexus's own error for a request, in the client's era.
fn failed(id: Value, error: &RelayError, era: Era) -> Handled {
    Handled::Respond(era::refusal(era, id, error))
}

fn invalid(id: Value, reason: &'static str) -> Handled {
    Handled::Respond(jsonrpc::NotJsonRpc { id, reason }.answer().into())
}

/// The schema makes a request's `_meta` an object; an upstream may drop a request
/// unanswered when it is not (an SDK that cannot read a request may not know its id
/// either).
fn check_meta_member(params: Option<&Value>) -> Result<(), RelayError> {
    object_or_null(params, "_meta")
}

/// The same of a tool call's or a prompt's `arguments`. Arguments left unread
/// (`ClientMessage`) are an object: only an object is left so.
fn check_arguments(method: &str, params: Option<&Value>) -> Result<(), RelayError> {
    if !matches!(method, "tools/call" | "prompts/get") {
        return Ok(());
    }
    object_or_null(params, "arguments")
}

/// The params' member `key`, if present, is an object; `null` passes, as absent.
fn object_or_null(params: Option<&Value>, key: &str) -> Result<(), RelayError> {
    match params.and_then(|params| params.get(key)) {
        Some(value) if !value.is_object() && !value.is_null() => Err(RelayError::InvalidParams(
            format!("`{key}` must be an object"),
        )),
        _ => Ok(()),
    }
}

/// Takes the params object and one required string member of it.
fn take_string(
    params: Option<Value>,
    key: &str,
) -> Result<(Map<String, Value>, String), RelayError> {
    let Some(Value::Object(params)) = params else {
        return Err(RelayError::InvalidParams("params must be an object".into()));
    };
    let value = params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RelayError::InvalidParams(format!("`{key}` must be a string")))?
        .to_string();
    Ok((params, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_message::ClientMessage;

    #[test]
    fn meta_and_arguments_must_be_objects_or_null() {
        let refused = |method: &str, params: Value| {
            check_meta_member(Some(&params))
                .and_then(|()| check_arguments(method, Some(&params)))
                .err()
                .map(|error| error.to_string())
        };
        for meta in [json!(1), json!([]), json!("x"), json!(true)] {
            let params = json!({"name": "a__b", "arguments": {}, "_meta": meta});
            let message = refused("tools/call", params.clone());
            assert!(
                message
                    .as_deref()
                    .is_some_and(|m| m.contains("`_meta` must be an object")),
                "{params}: {message:?}"
            );
            assert!(refused("tools/list", json!({"_meta": meta})).is_some());
        }
        for arguments in [json!(1), json!([]), json!("x")] {
            for method in ["tools/call", "prompts/get"] {
                let message = refused(method, json!({"name": "a__b", "arguments": arguments}));
                assert!(
                    message
                        .as_deref()
                        .is_some_and(|m| m.contains("`arguments` must be an object")),
                    "{method} {arguments}: {message:?}"
                );
            }
            // Elsewhere `arguments` means something else (completion's is an object
            // anyway) and is the upstream's to judge.
            assert_eq!(
                refused(
                    "resources/read",
                    json!({"uri": "x", "arguments": arguments})
                ),
                None
            );
        }
        // A large call's arguments that are not an object are read with the message
        // (only an object is left unread), so they are judged like any others.
        for (text, ok) in [
            (format!("\"{}\"", "l".repeat(2048)), false),
            (format!("[{}1]", "1,".repeat(1024)), false),
            (format!("{{\"text\":\"{}\"}}", "o".repeat(2048)), true),
        ] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a__b","arguments":{text}}}}}"#
            );
            let Ok(read) = ClientMessage::read(bytes::Bytes::from(line)) else {
                panic!("unreadable: {text:.40}");
            };
            assert_eq!(read.arguments.is_some(), ok, "{text:.40}");
            let outcome = refused("tools/call", read.message["params"].clone());
            assert_eq!(outcome.is_none(), ok, "{text:.40}: {outcome:?}");
        }
        // What passes: objects, null, absence, and params that are not an object
        // (refused where they are read, with their own message).
        for params in [
            json!({"name": "a__b", "arguments": {"x": 1}, "_meta": {"progressToken": 1}}),
            json!({"name": "a__b", "arguments": null, "_meta": null}),
            json!({"name": "a__b"}),
            json!([1]),
        ] {
            assert_eq!(refused("tools/call", params.clone()), None, "{params}");
        }
        assert!(check_meta_member(None).is_ok());
        assert!(check_arguments("tools/call", None).is_ok());
    }
}
