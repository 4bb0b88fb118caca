//! Relaying a routed request upstream: the exposed name or URI rewritten to the
//! upstream's own, the URIs in its result given back their exposed form, an
//! unread result kept unread unless plexus changes it, and a 2026-07-28
//! upstream's input-required rounds asked of a handshake-era client.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use adapters::{Reply, WrittenMember};
use registry::Catalog;
use serde_json::{json, Map, Value};

use super::audit_lines::SessionAudit;
use super::client_bound::ClientBoundRequests;
use super::ClientHello;
use crate::era::{self, Era};
use crate::hub::{CallContext, Hub};
use crate::jsonrpc::{self, RelayError};

/// Input-required rounds a call may take before plexus gives up on it.
const MAX_INPUT_ROUNDS: usize = 10;

/// Relays one session's routed requests upstream, with what that takes of it:
/// its era, its ids, where the request's related messages go, and for a
/// 2026-07-28 upstream's input rounds its capabilities, its client-bound table
/// and its side of the audit trail.
pub(super) struct Forwarder<'a> {
    pub(super) hub: &'a Arc<Hub>,
    pub(super) era: Era,
    /// Its calls' context: the session's ids and where related messages go.
    pub(super) base: CallContext<'a>,
    /// Read when a round asks for input, as the client declared it then.
    pub(super) hello: &'a Mutex<ClientHello>,
    pub(super) client: &'a ClientBoundRequests,
    pub(super) audit: SessionAudit<'a>,
}

impl<'a> Forwarder<'a> {
    /// A call's context, for `tool` if it is a tool call.
    pub(super) fn call(&self, tool: Option<&'a str>) -> CallContext<'a> {
        CallContext { tool, ..self.base }
    }

    /// Relays a request naming a tool or prompt, under the upstream's own name.
    /// Not an `async fn`: the call is [`Forwarder::forward_with_input`]'s future,
    /// one frame fewer on the hot path.
    pub(super) fn forward_named<'f>(
        &'f self,
        method: &'f str,
        params: Map<String, Value>,
        arguments: Option<&'a WrittenMember>,
        route: &'a registry::Route,
        headers: &'a [(String, String)],
    ) -> impl Future<Output = Result<Reply, RelayError>> + 'f {
        let is_tool = method == "tools/call";
        let params = with_string(params, "name", &route.original);
        let mut call = self.call(is_tool.then_some(route.original.as_str()));
        call.headers = headers;
        call.arguments = arguments;
        // A tool's result usually passes as the upstream wrote it.
        call.result_unread = is_tool;
        self.forward_with_input(&route.upstream, method, params, call)
    }

    /// A tool's result as the client sees it: its linked resources' URIs exposed
    /// from `catalog` (the snapshot the call was routed in), and a task-augmented
    /// call's task named by its upstream.
    pub(super) fn tool_result(&self, catalog: &Catalog, upstream: &str, reply: Reply) -> Reply {
        let reply = expose_linked_uris(catalog, upstream, reply);
        self.hub
            .expose_tasks(upstream, Some(self.base.session), reply)
    }

    /// Relays a request that may need client input: a 2026-07-28 upstream answers
    /// with an input-required result. A 2026-07-28 client gets it as it is (its
    /// retry carries the upstream's state back); a handshake-era client is asked
    /// each input request as a real request, and plexus retries for it. The reply
    /// crosses back into the client's era here, once (`era::relayed`).
    pub(super) async fn forward_with_input(
        &self,
        upstream: &str,
        method: &str,
        params: Value,
        call: CallContext<'a>,
    ) -> Result<Reply, RelayError> {
        // The one lookup of the upstream for this call.
        let target = self.hub.upstream_named(upstream)?;
        // A 2026-07-28 client retries for itself, and a handshake-era client is
        // answered input_required only by a 2026-07-28 upstream: the params are
        // kept for a retry unless neither can happen.
        let may_retry = self.era == Era::Handshake && !target.speaks_handshake();
        let reply = if !may_retry {
            let reply = self
                .hub
                .forward_to(target, method, Some(params), call)
                .await?;
            self.unread_unless_changed(upstream, reply)
        } else {
            // Each input request of an input-required result is asked of the
            // client as a real request, and the call retried with the answers.
            let reply = 'rounds: {
                let mut reply = read_unless_complete(
                    self.hub
                        .forward_to(target, method, Some(params.clone()), call)
                        .await?,
                );
                for _ in 0..MAX_INPUT_ROUNDS {
                    let Reply::Result(result) = &mut reply else {
                        break 'rounds reply;
                    };
                    if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
                        break 'rounds reply;
                    }
                    let requests = result
                        .get("inputRequests")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let mut responses = Map::new();
                    let mut minted = Vec::new();
                    for (key, request) in requests {
                        let asked = request.get("method").and_then(Value::as_str).unwrap_or("");
                        let mut asked_params = request.get("params").cloned();
                        let elicitation = era::mint_elicitation_id(asked, &mut asked_params);
                        if let Some(capability) =
                            crate::fanout::required_capability(asked, asked_params.as_ref())
                        {
                            let declared = self
                                .hello
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .has_capability(&capability);
                            if !declared {
                                return Err(RelayError::InvalidRequest(format!(
                                    "upstream `{upstream}` needs `{asked}`, and this client did not declare the `{}` capability",
                                    capability.join(".")
                                )));
                            }
                        }
                        let sent = tokio::time::Instant::now();
                        let answered = self.client.ask(call.related, asked, asked_params).await;
                        self.audit
                            .client_request(Some(upstream), asked, sent, &answered);
                        match answered?.into_result() {
                            Ok(answer) => {
                                if answer.get("action").and_then(Value::as_str) == Some("accept") {
                                    minted.extend(elicitation);
                                }
                                responses.insert(key, answer);
                            }
                            // The client refused: the call ends with its answer.
                            Err(error) => break 'rounds Reply::Error(error),
                        }
                    }
                    let mut retry = params.clone();
                    if let Some(object) = retry.as_object_mut() {
                        object.insert("inputResponses".into(), Value::Object(responses));
                        match result.get("requestState") {
                            Some(state) => object.insert("requestState".into(), state.clone()),
                            None => object.remove("requestState"),
                        };
                    }
                    // By name: a reload may have replaced the upstream between rounds.
                    reply = read_unless_complete(
                        self.hub
                            .forward(upstream, method, Some(retry), call)
                            .await?,
                    );
                    // The upstream has taken the accepted URL elicitations' outcome (its
                    // retry answered): their completion, before the call's own answer.
                    for id in minted {
                        let complete = jsonrpc::notification(
                            "notifications/elicitation/complete",
                            Some(json!({ "elicitationId": id })),
                        );
                        let _ = call.related.send(complete).await;
                    }
                }
                return Err(RelayError::InvalidRequest(format!(
                    "upstream `{upstream}` still asked for input after {MAX_INPUT_ROUNDS} rounds"
                )));
            };
            self.unread_unless_changed(upstream, reply)
        };
        Ok(era::relayed(self.era, method, reply))
    }

    /// A result that came unread stays so unless plexus has something to change in
    /// it: a linked resource's URI or a task (`forward_named`), or, for a
    /// handshake-era client, a `resultType`.
    fn unread_unless_changed(&self, upstream: &str, reply: Reply) -> Reply {
        let Reply::Unread(raw) = &reply else {
            return reply;
        };
        // memchr's search is vectorised: a megabyte of content is searched twice.
        let mentions = |member: &str, what: &[&str]| {
            raw.member(member).is_some_and(|text| {
                what.iter()
                    .any(|word| memchr::memmem::find(text, word.as_bytes()).is_some())
            })
        };
        let unchanged = raw.member("task").is_none()
            && raw.member("taskId").is_none()
            && raw.member("tasks").is_none()
            && !mentions("_meta", &["task", "\\u"])
            // Escapes could spell a block's type: such content is read.
            && !mentions("content", &["resource", "\\u"])
            // A handshake-era client's complete result loses its type unread (`era::relayed`).
            && (self.era == Era::Modern
                || raw.member("resultType").is_none_or(|t| era::is_complete(Some(t))));
        if unchanged {
            return reply;
        }
        match reply.try_read() {
            Ok(read) => read,
            Err(error) => Reply::Error(json!({
                "code": jsonrpc::UPSTREAM_FAILED,
                "message": format!("upstream `{upstream}` sent a result plexus cannot read: {error}"),
            })),
        }
    }
}

/// A round's result, read unless it is complete: only a read one is looked into
/// for input requests, and a complete one (nearly every one) passes unread.
fn read_unless_complete(reply: Reply) -> Reply {
    match &reply {
        Reply::Unread(raw) if !era::is_complete(raw.member("resultType")) => {
            match reply.into_result() {
                Ok(result) => Reply::Result(result),
                Err(error) => Reply::Error(error),
            }
        }
        _ => reply,
    }
}

/// Rewrites the routed name in place; everything else is relayed as sent.
pub(super) fn with_string(mut params: Map<String, Value>, key: &str, value: &str) -> Value {
    params.insert(key.into(), Value::String(value.to_string()));
    Value::Object(params)
}

/// Gives `contents[].uri` of a read result the namespaced form the client used.
pub(super) fn expose_content_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    in_result(
        reply,
        "contents",
        |content| content.get_mut("uri"),
        catalog,
        upstream,
    )
}

/// An upstream's error about the resource it was asked for (its `data.uri`, as a
/// "resource not found" carries it) names the URI the client asked for, not the
/// upstream's own form of it; a URI other than that one is left as it is.
pub(super) fn expose_error_uri(
    reply: adapters::Reply,
    original: &str,
    asked: &str,
) -> adapters::Reply {
    let Reply::Error(mut error) = reply else {
        return reply;
    };
    if let Some(uri) = error.get_mut("data").and_then(|data| data.get_mut("uri")) {
        if uri.as_str() == Some(original) {
            *uri = Value::from(asked);
        }
    }
    Reply::Error(error)
}

/// Gives the resource links and embedded resources of a tool result the exposed
/// form of their URIs, so a read of them routes back to the upstream they came from.
fn expose_linked_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    in_result(reply, "content", linked_uri, catalog, upstream)
}

/// The same for a prompt's messages: each message's content is one block (or, as
/// a tool result's, a list of them).
pub(super) fn expose_prompt_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    let Reply::Result(mut result) = reply else {
        return reply;
    };
    if let Some(Value::Array(messages)) = result.get_mut("messages") {
        for content in messages.iter_mut().filter_map(|m| m.get_mut("content")) {
            let blocks: Vec<&mut Value> = match content {
                Value::Array(blocks) => blocks.iter_mut().collect(),
                block => vec![block],
            };
            for block in blocks {
                if let Some(Value::String(uri)) = linked_uri(block) {
                    *uri = catalog.expose_uri(upstream, uri);
                }
            }
        }
    }
    Reply::Result(result)
}

/// The URI of a content block that names a resource: a link, or one embedded.
fn linked_uri(block: &mut Value) -> Option<&mut Value> {
    match block.get("type").and_then(Value::as_str) {
        Some("resource_link") => block.get_mut("uri"),
        Some("resource") => block.get_mut("resource").and_then(|r| r.get_mut("uri")),
        _ => None,
    }
}

/// Exposes the URI that `uri_of` finds in each element of the result's `list` array.
fn in_result(
    reply: adapters::Reply,
    list: &str,
    uri_of: impl Fn(&mut Value) -> Option<&mut Value>,
    catalog: &Catalog,
    upstream: &str,
) -> adapters::Reply {
    let adapters::Reply::Result(mut result) = reply else {
        return reply;
    };
    if let Some(Value::Array(elements)) = result.get_mut(list) {
        for element in elements {
            if let Some(Value::String(uri)) = uri_of(element) {
                *uri = catalog.expose_uri(upstream, uri);
            }
        }
    }
    Reply::Result(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_error_names_the_uri_the_client_asked_for() {
        let error = |uri: &str| {
            Reply::Error(
                json!({"code": -32002, "message": "resource not found", "data": {"uri": uri}}),
            )
        };
        let exposed = expose_error_uri(error("file:///a"), "file:///a", "fs+file:///a");
        assert!(matches!(exposed, Reply::Error(e) if e["data"]["uri"] == "fs+file:///a"));
        // Another URI, a result, an error without data: as they came.
        let other = expose_error_uri(error("file:///b"), "file:///a", "fs+file:///a");
        assert!(matches!(other, Reply::Error(e) if e["data"]["uri"] == "file:///b"));
        let result = expose_error_uri(Reply::Result(json!({})), "file:///a", "fs+file:///a");
        assert!(matches!(result, Reply::Result(r) if r == json!({})));
        let bare = Reply::Error(json!({"code": -32603, "message": "x"}));
        let bare = expose_error_uri(bare, "file:///a", "fs+file:///a");
        assert!(matches!(bare, Reply::Error(e) if e == json!({"code": -32603, "message": "x"})));
    }

    #[test]
    fn params_rewrite_keeps_every_other_member() {
        let params = json!({"name": "fixture__echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": 7, "x": 1}});
        let Value::Object(map) = params else {
            unreachable!()
        };
        let rewritten = with_string(map, "name", "echo");
        assert_eq!(
            rewritten,
            json!({"name": "echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": 7, "x": 1}})
        );
    }
}
