//! Relaying a routed request upstream: the exposed name or URI rewritten to the
//! upstream's own, and the URIs in its result given back their exposed form.

use adapters::{Reply, WrittenMember};
use registry::Catalog;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::{task_extension, Session};
use crate::jsonrpc::RelayError;

impl Session {
    /// Relays a request naming a tool or prompt, under the upstream's own name.
    pub(super) async fn forward_named(
        &self,
        method: &str,
        params: Map<String, Value>,
        arguments: Option<&WrittenMember>,
        route: &registry::Route,
        headers: &[(String, String)],
        related: &mpsc::Sender<Value>,
    ) -> Result<Reply, RelayError> {
        let is_tool = method == "tools/call";
        let params = with_string(params, "name", &route.original);
        let mut call = self.call_context(is_tool.then_some(route.original.as_str()), related);
        call.headers = headers;
        call.arguments = arguments;
        // A tool's result usually passes as the upstream wrote it.
        call.result_unread = is_tool;
        let reply = self
            .forward_with_input(&route.upstream, method, params, call)
            .await?;
        // A task-augmented call answers with a task whose id must name its upstream.
        Ok(if is_tool {
            let reply = expose_linked_uris(&self.catalog(), &route.upstream, reply);
            let reply = self
                .hub
                .task_routes
                .expose(&route.upstream, Some(self.id), reply);
            if self.is_scope() {
                task_extension::created(reply)
            } else {
                task_extension::nested(reply)
            }
        } else {
            reply
        })
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

/// Gives the resource links and embedded resources of a tool result the exposed
/// form of their URIs, so a read of them routes back to the upstream they came from.
fn expose_linked_uris(
    catalog: &Catalog,
    upstream: &str,
    reply: adapters::Reply,
) -> adapters::Reply {
    in_result(
        reply,
        "content",
        |block| match block.get("type").and_then(Value::as_str) {
            Some("resource_link") => block.get_mut("uri"),
            Some("resource") => block.get_mut("resource").and_then(|r| r.get_mut("uri")),
            _ => None,
        },
        catalog,
        upstream,
    )
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
    use serde_json::json;

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
