//! The session's lines of the audit trail (the trail's writer is `crate::audit`):
//! each says who acted (principal, view, the session's keyed hash), for the
//! requests it serves and those it is sent on an upstream's behalf.

use tokio::time::Instant;

use adapters::{Reply, WrittenMember};
use registry::Route;
use serde_json::Value;

use crate::audit::{Audit, Line};
use crate::client_message;
use crate::jsonrpc::RelayError;

/// Who a session's lines name, borrowed from it.
pub(super) struct SessionAudit<'a> {
    audit: &'a Audit,
    principal: &'a str,
    view: Option<&'a str>,
    owner: u64,
}

impl<'a> SessionAudit<'a> {
    /// The lines of the session that `owner` names, opened by `principal`, seeing `view`.
    pub(super) fn new(
        audit: &'a Audit,
        principal: &'a str,
        view: Option<&'a str>,
        owner: u64,
    ) -> SessionAudit<'a> {
        SessionAudit {
            audit,
            principal,
            view,
            owner,
        }
    }

    /// A line of the trail for `event`, saying who acted: principal, view and the
    /// session's keyed hash; `None` when nothing is audited.
    fn line(&self, event: &str) -> Option<Line> {
        let mut line = self.audit.line(event)?;
        line.field("principal", self.principal)
            .field("view", self.view)
            .field("session", self.audit.session_tag(self.owner));
        Some(line)
    }

    /// A request this client was sent on an upstream's behalf, and how it answered.
    pub(super) fn client_request(
        &self,
        upstream: Option<&str>,
        method: &str,
        sent: Instant,
        reply: &Result<Reply, RelayError>,
    ) {
        let Some(mut line) = self.line("client_request") else {
            return;
        };
        line.field("method", method)
            .field("upstream", upstream)
            .field("outcome", crate::audit::outcome(reply))
            .field("duration_ms", sent.elapsed().as_secs_f64() * 1000.0);
        self.audit.write(line);
    }
}

/// What the trail says of an audited request (`tools/call`, `prompts/get`,
/// `resources/read`), taken before the request is consumed.
pub(super) struct RequestRecord {
    method: String,
    name: String,
    route: Option<Route>,
    /// The keyed hash of its arguments.
    arguments: Value,
    started: Instant,
}

impl RequestRecord {
    /// Whether `method` is audited at all.
    pub(super) fn wanted(method: &str, audit: &Audit) -> bool {
        matches!(method, "tools/call" | "prompts/get" | "resources/read") && audit.enabled()
    }

    /// Takes the record; arguments left unread are put back in `params`, since the
    /// trail hashes them. Its route is the one the request is sent by ([`Self::routed`]).
    pub(super) fn take(
        method: &str,
        params: &mut Option<Value>,
        arguments: Option<WrittenMember>,
    ) -> Result<RequestRecord, RelayError> {
        // The trail hashes the arguments (a skim found them in params, an object).
        if let (Some(arguments), Some(Value::Object(object))) = (arguments, params.as_mut()) {
            client_message::put_back(object, &arguments)?;
        }
        let (name, arguments) = match method {
            "resources/read" => (params.as_ref().and_then(|p| p.get("uri")), None),
            _ => (
                params.as_ref().and_then(|p| p.get("name")),
                params.as_ref().and_then(|p| p.get("arguments")),
            ),
        };
        let name = name.and_then(Value::as_str).unwrap_or_default().to_string();
        Ok(RequestRecord {
            method: method.to_string(),
            name,
            route: None,
            arguments: crate::audit::arguments_hash(arguments),
            started: Instant::now(),
        })
    }

    /// The route the request is sent by (none: it routed nowhere).
    pub(super) fn routed(&mut self, route: &Route) {
        self.route = Some(route.clone());
    }

    /// Writes the request's line with how it was answered.
    pub(super) fn write(self, audit: &SessionAudit, reply: &Result<Reply, RelayError>) {
        let response_bytes = match reply {
            Ok(Reply::Result(result)) => adapters::json_out::serialized_len(result),
            Ok(Reply::Unread(raw)) => raw.bytes().len(),
            Ok(Reply::Error(error)) => adapters::json_out::serialized_len(error),
            Err(_) => 0,
        };
        if let Some(mut line) = audit.line("request") {
            let route = self.route.as_ref();
            line.field("method", &self.method)
                .field("name", &self.name)
                .field("upstream", route.map(|r| &*r.upstream))
                .field("original", route.map(|r| &r.original))
                .field("arguments_sha256", &self.arguments)
                .field("outcome", crate::audit::outcome(reply))
                .field("duration_ms", self.started.elapsed().as_secs_f64() * 1000.0)
                .field("response_bytes", response_bytes);
            audit.audit.write(line);
        }
    }
}
