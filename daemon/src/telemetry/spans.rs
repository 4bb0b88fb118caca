//! The spans, named and attributed per the OpenTelemetry MCP conventions: a
//! SERVER span per client request ([`server_call`], begun and ended in
//! `Session::handle`), a CLIENT span per request sent upstream ([`client_span`],
//! in `Hub::forward_to`, its context carried by the request), a CLIENT span
//! per request an upstream sends the client during a call ([`client_round`]),
//! and INTERNAL spans for waits that did not finish at once ([`waited`]).

use std::borrow::Cow;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use tokio::time::Instant;

use adapters::Reply;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, StringValue};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};
use serde_json::Value;

use super::{active, names, propagate};
use crate::jsonrpc::{Answer, RelayError};

/// Set by a CLIENT span whose result had `isError`, read by its SERVER span.
#[derive(Clone, Default)]
struct ToolError(Arc<AtomicBool>);

thread_local! {
    /// The mark of the SERVER span whose request this thread is polling
    /// ([`ServerCall::serve`]): a context value instead cost four allocations a request.
    static SERVING: Cell<Option<ToolError>> = const { Cell::new(None) };
}

/// Puts back the mark that was current before a poll, however the poll ends.
struct Restore(Option<ToolError>);

impl Drop for Restore {
    fn drop(&mut self) {
        SERVING.set(self.0.take());
    }
}

/// A session's `mcp.session.id`, written once, when its first request is traced.
pub struct SessionTag {
    id: u64,
    text: OnceLock<StringValue>,
}

impl SessionTag {
    pub fn new(id: u64) -> SessionTag {
        SessionTag {
            id,
            text: OnceLock::new(),
        }
    }

    fn value(&self) -> StringValue {
        self.text
            .get_or_init(|| StringValue::from(Arc::<str>::from(decimal(self.id))))
            .clone()
    }
}

/// A client's request being served: its SERVER span and its start.
pub struct ServerCall {
    context: Context,
    started: Instant,
    facts: Vec<KeyValue>,
    tool_error: ToolError,
}

/// Begins the SERVER span of a client's request, a child of the context its
/// `_meta.traceparent` names, else of the one current (an HTTP `traceparent`).
pub fn server_call(
    method: &str,
    params: Option<&Value>,
    id: &Value,
    session: &SessionTag,
    // The version of the request's era: asked for only when exporting.
    protocol: impl FnOnce() -> Option<&'static str>,
) -> Option<ServerCall> {
    let telemetry = active()?;
    let started = Instant::now();
    let (name, mut facts) = described(method, params);
    if let Some(version) = protocol() {
        facts.push(KeyValue::new("mcp.protocol.version", version));
    }
    let tool_error = ToolError::default();
    let parent = propagate::meta_parent(params).unwrap_or_else(Context::current);
    let context = match &telemetry.tracer {
        Some(tracer) => {
            // The facts' values are static or shared: copying them copies no text.
            let mut attributes = Vec::with_capacity(facts.len() + 2);
            attributes.extend_from_slice(&facts);
            attributes.push(KeyValue::new("mcp.session.id", session.value()));
            attributes.push(KeyValue::new("jsonrpc.request.id", request_id(id)));
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Server)
                .with_attributes(attributes)
                .start_with_context(tracer, &parent);
            parent.with_span(span)
        }
        None => parent,
    };
    Some(ServerCall {
        context,
        started,
        facts,
        tool_error,
    })
}

impl ServerCall {
    /// Polls `work`, the request's handling, with the span's context current (the
    /// parent of what it sends upstream) and its tool-error mark where the CLIENT
    /// span of a call that returns `isError` sets it. Through a pointer: a future
    /// wrapped by value is copied whole into its wrapper.
    pub async fn serve<F: Future>(&self, mut work: Pin<&mut F>) -> F::Output {
        std::future::poll_fn(|cx| {
            let _current = self.context.clone().attach();
            let _restore = Restore(SERVING.replace(Some(self.tool_error.clone())));
            work.as_mut().poll(cx)
        })
        .await
    }

    /// Ends the span with the answer's outcome: a JSON-RPC error, or a tool's `isError`.
    pub fn end(self, answer: Option<&Answer>) {
        let error = match answer.and_then(Answer::error_code) {
            Some(code) => Some(code.to_string()),
            None => self
                .tool_error
                .0
                .load(Ordering::Relaxed)
                .then(|| "tool_error".to_string()),
        };
        if let (Some(error), Some(_)) = (&error, answer.and_then(Answer::error_code)) {
            let span = self.context.span();
            span.set_attribute(KeyValue::new("rpc.response.status_code", error.clone()));
        }
        end_and_record(
            &self.context,
            self.facts,
            error,
            self.started,
            |histograms| &histograms.server,
        );
    }
}

/// A request sent upstream: its CLIENT span and its start.
pub struct ClientSpan {
    context: Context,
    started: Instant,
    facts: Vec<KeyValue>,
}

/// Begins the CLIENT span of a request to `upstream`, a child of the current
/// context; the request carries it as [`ClientSpan::carried`] says.
pub fn client_span(
    upstream: &Arc<str>,
    method: &str,
    params: Option<&Value>,
) -> Option<ClientSpan> {
    let telemetry = active()?;
    let started = Instant::now();
    let (name, mut facts) = described(method, params);
    facts.push(KeyValue::new(
        "plexus.upstream",
        StringValue::from(upstream.clone()),
    ));
    let parent = Context::current();
    let context = match &telemetry.tracer {
        Some(tracer) => {
            let mut attributes = Vec::with_capacity(facts.len() + 1);
            attributes.extend_from_slice(&facts);
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Client)
                .with_attributes(attributes)
                .start_with_context(tracer, &parent);
            parent.with_span(span)
        }
        None => parent,
    };
    Some(ClientSpan {
        context,
        started,
        facts,
    })
}

impl ClientSpan {
    /// The span, as the parent of the rounds the upstream has with the client
    /// while it serves this request.
    pub fn trace(&self) -> CallTrace {
        CallTrace(self.context.clone())
    }

    /// The span's trace context, for the request to carry upstream (none when only
    /// metrics are exported).
    pub fn carried(&self) -> Option<adapters::TraceContext> {
        active()?.tracer.as_ref()?;
        propagate::carried(&self.context)
    }

    /// plexus's id of the request, as the upstream sees it.
    pub fn request_id(&self, id: u64) {
        self.context
            .span()
            .set_attribute(KeyValue::new("jsonrpc.request.id", decimal(id)));
    }

    /// Ends the span with the reply's outcome; an `isError` result marks the
    /// SERVER span too.
    pub fn end(self, outcome: &Result<Reply, RelayError>) {
        let error = match outcome {
            Ok(Reply::Error(error)) => error
                .get("code")
                .and_then(Value::as_i64)
                .map(|code| code.to_string()),
            Ok(Reply::Result(result)) => (result.get("isError") == Some(&Value::Bool(true)))
                .then(|| "tool_error".to_string()),
            Ok(Reply::Unread(result)) => (result.member("isError") == Some(b"true".as_slice()))
                .then(|| "tool_error".to_string()),
            Err(error) => Some(error.kind().to_string()),
        };
        if error.as_deref() == Some("tool_error") {
            let mark = SERVING.take();
            if let Some(mark) = &mark {
                mark.0.store(true, Ordering::Relaxed);
            }
            SERVING.set(mark);
        }
        end_and_record(
            &self.context,
            self.facts,
            error,
            self.started,
            |histograms| &histograms.client,
        );
    }
}

/// A request in flight upstream, as the parent of what the upstream asks the
/// client while serving it (kept by the instance's table of calls).
#[derive(Clone)]
pub struct CallTrace(Context);

impl std::fmt::Debug for CallTrace {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CallTrace")
    }
}

/// An upstream's request (sampling, elicitation, roots) relayed to the client:
/// its CLIENT span, open until the client answers.
pub struct ClientRound {
    context: Context,
}

/// Begins the span of an upstream's request to the client, and writes its
/// context into the request's `_meta`. Its parent is the context the request
/// itself carries (SEP-414: the upstream's own span for the request, as a
/// receiver parents its span), else the CLIENT span of the call it belongs to:
/// the round happens while the upstream serves that request, within its time,
/// so under the SERVER span it would read as a sibling of the call that caused it.
pub fn client_round(
    upstream: &str,
    method: &str,
    params: &mut Option<Value>,
    call: Option<&CallTrace>,
) -> Option<ClientRound> {
    let tracer = active()?.tracer.as_ref()?;
    let parent = propagate::meta_parent(params.as_ref())
        .or_else(|| call.map(|call| call.0.clone()))
        .unwrap_or_default();
    let span = tracer
        .span_builder(method.to_string())
        .with_kind(SpanKind::Client)
        .with_attributes([
            KeyValue::new("mcp.method.name", method.to_string()),
            KeyValue::new("plexus.upstream", upstream.to_string()),
        ])
        .start_with_context(tracer, &parent);
    let context = parent.with_span(span);
    propagate::inject(&context, params);
    Some(ClientRound { context })
}

impl ClientRound {
    /// plexus's id of the request, as the client sees it.
    pub fn request_id(&self, id: &str) {
        self.context
            .span()
            .set_attribute(KeyValue::new("jsonrpc.request.id", id.to_string()));
    }

    /// Ends the span with the client's answer (a JSON-RPC error is its status).
    pub fn end(self, reply: &Reply) {
        let span = self.context.span();
        if let Reply::Error(error) = reply {
            let code = error
                .get("code")
                .and_then(Value::as_i64)
                .map_or_else(|| "error".to_string(), |code| code.to_string());
            span.set_attribute(KeyValue::new("rpc.response.status_code", code.clone()));
            span.set_status(Status::error(code.clone()));
            span.set_attribute(KeyValue::new("error.type", code));
        }
        span.end();
    }
}

/// Ends `context`'s span with `error` (its status and `error.type`) and records the
/// time since `started` in the histogram `which` names, with `facts` (and the
/// error) as attributes but for the resource URI: a series per URI would be unbounded.
/// A text longer than a name is `_OTHER` there (a client may call a tool or a method
/// of a message's length, and a series keeps its attributes as long as the process).
fn end_and_record(
    context: &Context,
    mut facts: Vec<KeyValue>,
    error: Option<String>,
    started: Instant,
    which: fn(&super::Histograms) -> &super::Series,
) {
    let span = context.span();
    if let Some(error) = error {
        span.set_status(Status::error(error.clone()));
        span.set_attribute(KeyValue::new("error.type", error.clone()));
        facts.push(KeyValue::new("error.type", error));
    }
    span.end();
    if let Some(histograms) = active().and_then(|telemetry| telemetry.histograms.as_ref()) {
        facts.retain(|fact| fact.key.as_str() != "mcp.resource.uri");
        for fact in &mut facts {
            if let opentelemetry::Value::String(text) = &fact.value {
                if text.as_str().len() > names::MAX_NAME_BYTES {
                    fact.value = opentelemetry::Value::from("_OTHER");
                }
            }
        }
        which(histograms).record(started.elapsed().as_secs_f64(), facts);
    }
}

/// A wait worth a span of its own when it does not end at once.
#[derive(Clone, Copy)]
pub enum Wait {
    /// For a slot under the upstream's `max_in_flight`.
    Queue,
    /// For a starting (or on-demand) upstream to be ready.
    UpstreamStart,
    /// For a session's first list, while upstreams are still starting.
    FirstList,
    /// For the client's answer to a request plexus sent it (sampling, elicitation, roots).
    ClientRound,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Queue => "plexus.queue",
            Wait::UpstreamStart => "plexus.upstream_start",
            Wait::FirstList => "plexus.first_list",
            Wait::ClientRound => "plexus.client_request",
        }
    }
}

/// `work`, under an INTERNAL span named for the wait once it does not finish at its
/// first poll (when exporting spans). Polled in place: a wait that ends at once, as
/// almost every one does, costs no span and no box, and an untraced caller's future
/// grows by a pointer or two.
pub fn waited<'a, F: Future>(wait: Wait, upstream: Option<&'a str>, work: F) -> Waited<'a, F> {
    Waited {
        work,
        tracer: active().and_then(|telemetry| telemetry.tracer.as_ref()),
        wait,
        upstream,
        span: None,
    }
}

pin_project_lite::pin_project! {
    /// See [`waited`].
    pub struct Waited<'a, F> {
        #[pin]
        work: F,
        // None once the first poll has passed (or when not exporting spans).
        tracer: Option<&'static SdkTracer>,
        wait: Wait,
        upstream: Option<&'a str>,
        // Boxed: the SDK's span is a few hundred bytes, needed only by a wait that waits.
        span: Option<Box<SdkSpan>>,
    }
}

impl<F: Future> Future for Waited<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let polled = this.work.poll(cx);
        if let (Poll::Pending, Some(tracer)) = (&polled, this.tracer.take()) {
            let mut builder = tracer
                .span_builder(this.wait.name())
                .with_kind(SpanKind::Internal);
            if let Some(upstream) = this.upstream {
                builder = builder
                    .with_attributes([KeyValue::new("plexus.upstream", upstream.to_string())]);
            }
            *this.span = Some(Box::new(
                builder.start_with_context(tracer, &Context::current()),
            ));
        }
        // A finished wait ends its span as it is dropped (or the future with it).
        if polled.is_ready() {
            this.span.take();
        }
        polled
    }
}

/// The methods named by a static string: their spans' names and `mcp.method.name`
/// cost no copy of the text.
const METHODS: &[&str] = &[
    "tools/call",
    "tools/list",
    "prompts/get",
    "prompts/list",
    "resources/read",
    "resources/list",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "ping",
    "initialize",
    "server/discover",
    "subscriptions/listen",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "tasks/update",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
];

/// The span name and the attributes the conventions give a request of `method`.
/// A call's or a prompt's names come from [`names::named`]; other texts are copied
/// once (a resource's URI into an `Arc` its span and histogram share).
fn described(method: &str, params: Option<&Value>) -> (Cow<'static, str>, Vec<KeyValue>) {
    let known = METHODS.iter().find(|known| **known == method).copied();
    let mut facts = Vec::with_capacity(6);
    facts.push(KeyValue::new(
        "mcp.method.name",
        match known {
            Some(method) => StringValue::from(method),
            None => StringValue::from(method.to_string()),
        },
    ));
    let text = |key: &str| params.and_then(|p| p.get(key)).and_then(Value::as_str);
    let shared = |text: &str| StringValue::from(Arc::<str>::from(text));
    let name = match method {
        "tools/call" => text("name").map(|tool| {
            let (span, tool) = names::named("tools/call", tool);
            facts.push(KeyValue::new("gen_ai.tool.name", tool));
            facts.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            span
        }),
        "prompts/get" => text("name").map(|prompt| {
            let (span, prompt) = names::named("prompts/get", prompt);
            facts.push(KeyValue::new("gen_ai.prompt.name", prompt));
            span
        }),
        _ => {
            if let Some(uri) = text("uri") {
                facts.push(KeyValue::new("mcp.resource.uri", shared(uri)));
            }
            None
        }
    };
    let name = name.unwrap_or_else(|| match known {
        Some(method) => Cow::Borrowed(method),
        None => Cow::Owned(method.to_string()),
    });
    (name, facts)
}

fn request_id(id: &Value) -> String {
    match id {
        Value::String(text) => text.clone(),
        Value::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(id), _) => decimal(id),
            (None, Some(id)) => decimal(id),
            (None, None) => number.to_string(),
        },
        other => other.to_string(),
    }
}

/// An integer in decimal, without the formatter's machinery (through `Display`, an
/// id cost four times the instructions).
fn decimal(value: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(value).to_string()
}
