//! OpenTelemetry across the hop, with real parts only: a Python SDK client with
//! OpenTelemetry on (`tests/python/traced_client.py`), plexus exporting over
//! OTLP/HTTP, a Python SDK upstream that exports its own spans and reports the
//! `_meta` it received (`tests/python/traced_server.py`), and an OTLP/HTTP receiver
//! on loopback built on `opentelemetry-proto` (`tests/python/otlp_receiver.py`;
//! the Collector ships in no package this machine reaches). All of it installed
//! into `target/python-venv` by `scripts/ensure-python-sdk`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use plexus_tests::{
    fixture_upstream, plexus_binary, restartable_port, venv_python, workspace_root, Daemon,
    RawHttpSession,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A receiver writing what it decodes to `out`, one JSON line per span or series.
struct Receiver {
    _child: Child,
    endpoint: String,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    /// None, and the test skipped, when the Python packages are not installed.
    async fn start() -> anyhow::Result<Option<Receiver>> {
        if !venv_python().exists() {
            println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
            return Ok(None);
        }
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("otlp.jsonl");
        let mut child = Command::new(venv_python())
            .arg(workspace_root().join("tests/python/otlp_receiver.py"))
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("receiver stdout")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await??;
        let port = line
            .trim()
            .strip_prefix("listening ")
            .context("receiver did not say its port")?;
        Ok(Some(Receiver {
            endpoint: format!("http://127.0.0.1:{port}"),
            _child: child,
            out,
            _dir: dir,
        }))
    }

    fn received(&self, kind: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["kind"] == kind)
            .collect()
    }
}

fn upstreams(endpoint: Option<&str>) -> String {
    let python = venv_python().display().to_string();
    let script = workspace_root()
        .join("tests/python/traced_server.py")
        .display()
        .to_string();
    let env = match endpoint {
        Some(endpoint) => format!(
            "env = {{ OTEL_EXPORTER_OTLP_ENDPOINT = {endpoint:?}, PYTHONUNBUFFERED = \"1\" }}"
        ),
        None => "env = { OTEL_SDK_DISABLED = \"true\" }".into(),
    };
    // `lazy` speaks the handshake era and stops after 1 s idle: the client's call
    // to it, made later than that, waits for its start.
    format!(
        "[upstreams.tr]\ncommand = {python:?}\nargs = [{script:?}]\n{env}\n\n\
         [upstreams.lazy]\ncommand = {python:?}\nargs = [{script:?}]\n{env}\n\
         start = \"lazy\"\nidle_timeout = \"1s\"\nprotocol = \"handshake\"\n"
    )
}

/// What `traced_client.py` does: its calls, the same through `plexus connect`, or its rounds.
#[derive(PartialEq)]
enum Run {
    Calls,
    Connect,
    Rounds,
}

async fn run_client(url: &str, mode: &str, endpoint: &str, run: Run) -> anyhow::Result<Value> {
    let mut command = Command::new(venv_python());
    command
        .arg(workspace_root().join("tests/python/traced_client.py"))
        .args(["--url", url, "--mode", mode]);
    match run {
        Run::Calls => {}
        Run::Connect => {
            command.arg("--connect").arg(plexus_binary());
        }
        Run::Rounds => {
            command.arg("--rounds");
        }
    }
    command
        .env("PYTHONUNBUFFERED", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output()).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "traced_client.py failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let last = stdout.lines().last().context("no output")?;
    Ok(serde_json::from_str(last)?)
}

fn span<'a>(
    spans: &'a [Value],
    service: &str,
    name: &str,
    trace: &str,
) -> anyhow::Result<&'a Value> {
    spans
        .iter()
        .find(|span| {
            span["service"] == service && span["name"] == name && span["trace_id"] == trace
        })
        .with_context(|| {
            let seen: Vec<String> = spans
                .iter()
                .map(|span| format!("{} {} {}", span["service"], span["name"], span["span_kind"]))
                .collect();
            format!("no span `{name}` of {service} in trace {trace}; seen: {seen:#?}")
        })
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|span| span["parent_span_id"] == parent["span_id"])
        .collect()
}

/// The `traceparent` naming `span`, but for its flags (the W3C level 2 random bit may be set).
fn traceparent_of(span: &Value) -> String {
    format!(
        "00-{}-{}-",
        span["trace_id"].as_str().unwrap_or_default(),
        span["span_id"].as_str().unwrap_or_default()
    )
}

/// A client's trace context, as a W3C `traceparent` header.
const HEADER_PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn attributes_say(span: &Value, key: &str, value: &str) -> bool {
    span["attributes"][key] == value
}

/// Whether `meta.traceparent` names `span`.
fn parent_in(meta: &Value, span: &Value) -> bool {
    meta["traceparent"]
        .as_str()
        .is_some_and(|traceparent| traceparent.starts_with(&traceparent_of(span)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_client_through_plexus_to_the_upstream() -> anyhow::Result<()> {
    let Some(receiver) = Receiver::start().await? else {
        return Ok(());
    };
    let endpoint = receiver.endpoint.as_str();
    let daemon = Daemon::builder()
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "plexus-under-test"),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        ])
        .upstreams(upstreams(Some(endpoint)))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;
    let started = std::time::Instant::now();
    let seen = run_client(&daemon.url, "auto", endpoint, Run::Calls).await?;
    println!("client run: {:.2} s", started.elapsed().as_secs_f64());
    // A client that sends its trace context only in the HTTP `traceparent` header.
    let mut raw =
        RawHttpSession::connect_with(&daemon.url, &[("traceparent", HEADER_PARENT)]).await?;
    let answer = raw
        .request("tools/call", json!({"name": "tr__meta", "arguments": {}}))
        .await?;
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .context("no text")?;
    let header_meta: Value = serde_json::from_str(text)?;
    // A call of a tool whose name is longer than any real one's: no such tool.
    let long_name = "x".repeat(4096);
    let unknown = raw
        .request("tools/call", json!({"name": long_name, "arguments": {}}))
        .await?;
    ensure!(unknown["error"]["code"] == -32602, "{unknown}");
    // A client behind `plexus connect`: its `_meta` crosses the bridge as it is.
    let bridged = run_client(&daemon.url, "legacy", endpoint, Run::Connect).await?;
    // A stop flushes plexus's batch of spans and its histograms.
    daemon.stop().await?;
    let trace = seen["trace_id"].as_str().context("trace id")?.to_string();
    ensure!(
        seen["fail_is_error"] == true,
        "fail was not an error: {seen}"
    );

    let spans = receiver.received("span");
    let plexus = "plexus-under-test";
    // The call: client CLIENT → plexus SERVER → plexus CLIENT → upstream SERVER, one trace.
    let sent = span(
        &spans,
        "traced-client",
        "MCP send tools/call tr__meta",
        &trace,
    )?;
    let served = span(&spans, plexus, "tools/call tr__meta", &trace)?;
    ensure!(served["span_kind"] == "SERVER", "{served}");
    ensure!(
        served["parent_span_id"] == sent["span_id"],
        "{served} not under {sent}"
    );
    let attributes = &served["attributes"];
    ensure!(attributes["mcp.method.name"] == "tools/call", "{served}");
    ensure!(attributes["gen_ai.tool.name"] == "tr__meta", "{served}");
    ensure!(
        attributes["gen_ai.operation.name"] == "execute_tool",
        "{served}"
    );
    ensure!(
        attributes["mcp.protocol.version"] == "2026-07-28",
        "{served}"
    );
    ensure!(attributes["jsonrpc.request.id"].is_string(), "{served}");
    ensure!(attributes["mcp.session.id"].is_string(), "{served}");
    let relayed = children(&spans, served);
    ensure!(
        relayed.len() == 1,
        "one CLIENT span under the call: {relayed:#?}"
    );
    let relayed = relayed[0];
    ensure!(
        relayed["span_kind"] == "CLIENT" && relayed["name"] == "tools/call meta",
        "{relayed}"
    );
    ensure!(
        relayed["attributes"]["gen_ai.tool.name"] == "meta",
        "{relayed}"
    );
    ensure!(
        relayed["attributes"]["plexus.upstream"] == "tr",
        "{relayed}"
    );
    ensure!(
        relayed["attributes"]["jsonrpc.request.id"].is_string(),
        "{relayed}"
    );
    // The upstream got plexus's CLIENT span as its parent, in `_meta` and in its own span.
    ensure!(
        parent_in(&seen["meta"], relayed),
        "upstream's _meta {} is not under {relayed}",
        seen["meta"]
    );
    let upstream = span(&spans, "traced-upstream", "tools/call meta", &trace)?;
    ensure!(
        upstream["parent_span_id"] == relayed["span_id"],
        "{upstream}"
    );

    // A list is served from the catalog: a SERVER span in the trace, nothing upstream.
    let listed = span(&spans, plexus, "tools/list", &trace)?;
    ensure!(
        children(&spans, listed)
            .iter()
            .all(|span| span["span_kind"] != "CLIENT"),
        "tools/list asked an upstream"
    );

    // An `isError` result: error status and `error.type = tool_error` on both spans.
    let failed = span(&spans, plexus, "tools/call tr__fail", &trace)?;
    let failed_upstream = span(&spans, plexus, "tools/call fail", &trace)?;
    for span in [failed, failed_upstream] {
        ensure!(span["status"] == "ERROR", "{span}");
        ensure!(span["attributes"]["error.type"] == "tool_error", "{span}");
    }

    // The lazy upstream's call waited for its start under a span of its own, and its
    // (handshake-era) request carried the trace too.
    let woke = span(&spans, plexus, "tools/call lazy__meta", &trace)?;
    let under: Vec<&Value> = children(&spans, woke);
    let waited = under
        .iter()
        .find(|span| span["name"] == "plexus.upstream_start")
        .with_context(|| format!("no start wait under {woke}: {under:#?}"))?;
    ensure!(
        waited["attributes"]["plexus.upstream"] == "lazy",
        "{waited}"
    );
    let lazy_call = under
        .iter()
        .find(|span| span["span_kind"] == "CLIENT")
        .context("no CLIENT span under the lazy call")?;
    ensure!(
        waited["end"].as_u64() <= lazy_call["start"].as_u64(),
        "{waited} {lazy_call}"
    );
    ensure!(
        parent_in(&seen["lazy_meta"], lazy_call),
        "{}",
        seen["lazy_meta"]
    );

    // The header's context parents the SERVER span; the upstream's `_meta` names plexus's CLIENT span.
    let header_trace = &HEADER_PARENT[3..35];
    let served = span(&spans, plexus, "tools/call tr__meta", header_trace)?;
    ensure!(
        served["parent_span_id"] == HEADER_PARENT[36..52],
        "{served}"
    );
    ensure!(
        attributes_say(served, "mcp.protocol.version", "2025-11-25"),
        "{served}"
    );
    let relayed = children(&spans, served);
    ensure!(
        relayed.len() == 1 && parent_in(&header_meta, relayed[0]),
        "{header_meta} {relayed:#?}"
    );

    // Through `plexus connect`, the client's CLIENT span still parents the daemon's SERVER span.
    let bridged_trace = bridged["trace_id"].as_str().context("trace id")?;
    let sent = span(
        &spans,
        "traced-client",
        "MCP send tools/call tr__meta",
        bridged_trace,
    )?;
    let served = span(&spans, plexus, "tools/call tr__meta", bridged_trace)?;
    ensure!(
        served["parent_span_id"] == sent["span_id"],
        "{served} not under {sent}"
    );

    // The conventions' histograms, on the same exporter.
    let metrics = receiver.received("metric");
    for name in [
        "mcp.server.operation.duration",
        "mcp.client.operation.duration",
    ] {
        let series = metrics
            .iter()
            .find(|metric| {
                metric["name"] == name
                    && metric["service"] == plexus
                    && metric["attributes"]["gen_ai.tool.name"].is_string()
            })
            .with_context(|| format!("no {name}: {metrics:#?}"))?;
        ensure!(
            series["unit"] == "s" && series["count"].as_u64() >= Some(1),
            "{series}"
        );
    }
    // The long name is its span's, not a series' (which lives as long as the process).
    ensure!(
        spans
            .iter()
            .any(|span| span["attributes"]["gen_ai.tool.name"] == long_name.as_str()),
        "no span of the long name"
    );
    ensure!(
        metrics.iter().any(|metric| {
            metric["name"] == "mcp.server.operation.duration"
                && metric["attributes"]["gen_ai.tool.name"] == "_OTHER"
        }) && !metrics
            .iter()
            .any(|metric| metric["attributes"]["gen_ai.tool.name"] == long_name.as_str()),
        "{metrics:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untraced_plexus_passes_the_clients_trace_context_on_unchanged() -> anyhow::Result<()> {
    let Some(receiver) = Receiver::start().await? else {
        return Ok(());
    };
    let daemon = Daemon::builder().upstreams(upstreams(None)).start().await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;
    let seen = run_client(&daemon.url, "legacy", &receiver.endpoint, Run::Calls).await?;
    let trace = seen["trace_id"].as_str().context("trace id")?;
    let spans = receiver.received("span");
    // The client's own CLIENT span is the upstream's parent: plexus, exporting
    // nothing, made no span and rewrote no `_meta`.
    let sent = span(
        &spans,
        "traced-client",
        "MCP send tools/call tr__meta",
        trace,
    )?;
    ensure!(
        parent_in(&seen["meta"], sent),
        "{} is not the client's {sent}",
        seen["meta"]
    );
    ensure!(
        spans.iter().all(|span| span["service"] == "traced-client"),
        "{spans:#?}"
    );
    ensure!(
        !daemon.log().contains("OpenTelemetry export on"),
        "{}",
        daemon.log()
    );
    Ok(())
}

/// An HTTP upstream (streamable HTTP) gets the CLIENT span's context in its body's
/// `_meta` and in the `traceparent` header, over the client's own context; the
/// client's other `_meta` keys reach it as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_upstream_gets_the_context_in_meta_and_in_its_header() -> anyhow::Result<()> {
    let Some(receiver) = Receiver::start().await? else {
        return Ok(());
    };
    let endpoint = receiver.endpoint.as_str();
    let port = restartable_port()?;
    let _upstream = Command::new(venv_python())
        .arg(workspace_root().join("tests/python/traced_server.py"))
        .args(["--http", &port.to_string()])
        .env("OTEL_SDK_DISABLED", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let daemon = Daemon::builder()
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_SERVICE_NAME", "plexus-under-test"),
        ])
        .upstreams(format!(
            "[upstreams.web]\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
             transport = \"streamable-http\"\n"
        ))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;
    let mut client = RawHttpSession::connect(&daemon.url).await?;
    let meta: Value = serde_json::from_str(&text_of(&mut client, "web__meta").await?)?;
    let header = text_of(&mut client, "web__header").await?;
    daemon.stop().await?;

    let spans = receiver.received("span");
    let trace = &HEADER_PARENT[3..35];
    let sent_meta = span(&spans, "plexus-under-test", "tools/call meta", trace)?;
    let sent_header = span(&spans, "plexus-under-test", "tools/call header", trace)?;
    ensure!(parent_in(&meta, sent_meta), "{meta} {sent_meta}");
    ensure!(
        header.starts_with(&traceparent_of(sent_header)),
        "{header} {sent_header}"
    );
    ensure!(
        meta["kept"] == "yes" && meta["tracestate"] == "client=1",
        "{meta}"
    );
    Ok(())
}

/// The text `tool` answers a call that carries a client's trace context and one more `_meta` key.
async fn text_of(client: &mut RawHttpSession, tool: &str) -> anyhow::Result<String> {
    let params = json!({"name": tool, "arguments": {},
        "_meta": {"traceparent": HEADER_PARENT, "tracestate": "client=1", "kept": "yes"}});
    let answer = client.request("tools/call", params).await?;
    let text = answer["result"]["content"][0]["text"].as_str();
    Ok(text
        .with_context(|| format!("{tool}: {answer}"))?
        .to_string())
}

/// A span's start and end, in nanoseconds since the epoch.
fn times(span: &Value) -> (u64, u64) {
    (
        span["start"].as_u64().unwrap_or_default(),
        span["end"].as_u64().unwrap_or(u64::MAX),
    )
}

/// Whether `inner` lies within `outer`'s time.
fn within(inner: &Value, outer: &Value) -> bool {
    let ((inner_start, inner_end), (outer_start, outer_end)) = (times(inner), times(outer));
    outer_start <= inner_start && inner_end <= outer_end
}

/// A `tasks/list` fans out to every upstream that lists tasks: one CLIENT span each
/// under its SERVER span. An upstream's request to the client during a call gets a
/// CLIENT span of its own, under the upstream's context when the request carries one
/// and else under the call's CLIENT span, and the client sees it in `_meta`. A call
/// queued behind `max_in_flight` waits under a `plexus.queue` span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_a_round_with_the_client_and_a_queue_have_their_spans() -> anyhow::Result<()> {
    let Some(receiver) = Receiver::start().await? else {
        return Ok(());
    };
    let endpoint = receiver.endpoint.as_str();
    let python = venv_python().display().to_string();
    let script = workspace_root()
        .join("tests/python/traced_server.py")
        .display()
        .to_string();
    // `q` serves one call at a time, in the handshake era (where an upstream's
    // request reaches the client as it is sent); f1 asks too; t1 and t2 list tasks.
    let tasks = "protocol = \"handshake\"";
    let upstreams = format!(
        "[upstreams.q]\ncommand = {python:?}\nargs = [{script:?}]\n\
         env = {{ OTEL_EXPORTER_OTLP_ENDPOINT = {endpoint:?} }}\n\
         protocol = \"handshake\"\nmax_in_flight = 1\n\n{}\n{}\n{}",
        fixture_upstream("f1", "", &["--name", "f1"]),
        fixture_upstream("t1", tasks, &["--conformance", "--modern"]),
        fixture_upstream("t2", tasks, &["--conformance", "--modern"]),
    );
    let daemon = Daemon::builder()
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_SERVICE_NAME", "plexus-under-test"),
        ])
        .upstreams(upstreams)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;
    let started = std::time::Instant::now();
    let seen = run_client(&daemon.url, "legacy", endpoint, Run::Rounds).await?;
    println!("client rounds: {:.2} s", started.elapsed().as_secs_f64());
    ensure!(
        seen["asked"] == "sampled" && seen["fixture_asked"] == "sampled",
        "{seen}"
    );
    ensure!(seen["slow"] == json!(["slow", "slow"]), "{seen}");
    let mut raw =
        RawHttpSession::connect_with(&daemon.url, &[("traceparent", HEADER_PARENT)]).await?;
    let listed = raw.request("tasks/list", json!({})).await?;
    ensure!(listed["result"]["tasks"].is_array(), "{listed}");
    daemon.stop().await?;

    let spans = receiver.received("span");
    let plexus = "plexus-under-test";
    let trace = seen["trace_id"].as_str().context("trace id")?;

    // The fan-out: one SERVER span, one CLIENT span per upstream that lists tasks.
    let served = spans
        .iter()
        .find(|span| {
            span["service"] == plexus
                && span["name"] == "tasks/list"
                && span["span_kind"] == "SERVER"
        })
        .with_context(|| format!("no SERVER span of tasks/list: {spans:#?}"))?;
    ensure!(
        served["parent_span_id"] == HEADER_PARENT[36..52],
        "{served}"
    );
    let mut asked: Vec<&str> = children(&spans, served)
        .iter()
        .filter(|span| span["span_kind"] == "CLIENT" && span["name"] == "tasks/list")
        .filter_map(|span| span["attributes"]["plexus.upstream"].as_str())
        .collect();
    asked.sort_unstable();
    ensure!(
        asked == ["t1", "t2"],
        "{asked:?}: {:#?}",
        children(&spans, served)
    );

    // The round with a client, asked by an upstream that sends its own trace context:
    // under the upstream's span for its request, within plexus's call to it.
    let call = span(&spans, plexus, "tools/call q__ask", trace)?;
    let relayed = children(&spans, call);
    let relayed = relayed
        .iter()
        .find(|span| span["span_kind"] == "CLIENT")
        .with_context(|| format!("no CLIENT span under {call}"))?;
    let rounds: Vec<&Value> = spans
        .iter()
        .filter(|span| {
            span["service"] == plexus
                && span["name"] == "sampling/createMessage"
                && span["trace_id"] == trace
        })
        .collect();
    ensure!(rounds.len() == 2, "two rounds in the trace: {rounds:#?}");
    let round = rounds
        .iter()
        .find(|round| within(round, relayed))
        .with_context(|| format!("no round within {relayed}: {rounds:#?}"))?;
    ensure!(
        round["span_kind"] == "CLIENT" && attributes_say(round, "plexus.upstream", "q"),
        "{round}"
    );
    ensure!(
        round["attributes"]["jsonrpc.request.id"].is_string(),
        "{round}"
    );
    let sent = span(
        &spans,
        "traced-upstream",
        "MCP send sampling/createMessage",
        trace,
    )?;
    ensure!(
        round["parent_span_id"] == sent["span_id"],
        "{round} not under {sent}"
    );

    // The fixture's request carries no context: its round is under plexus's call to it.
    let call = span(&spans, plexus, "tools/call f1__ask", trace)?;
    let relayed = children(&spans, call);
    let relayed = relayed
        .iter()
        .find(|span| span["span_kind"] == "CLIENT")
        .with_context(|| format!("no CLIENT span under {call}"))?;
    let round = children(&spans, relayed);
    ensure!(
        round.len() == 1 && round[0]["name"] == "sampling/createMessage",
        "{round:#?}"
    );
    ensure!(
        attributes_say(round[0], "plexus.upstream", "f1") && within(round[0], relayed),
        "{}",
        round[0]
    );

    // Two calls at once to `q`: one of them waited for the other under `plexus.queue`.
    let slow: Vec<&Value> = spans
        .iter()
        .filter(|span| {
            span["service"] == plexus
                && span["name"] == "tools/call q__slow"
                && span["trace_id"] == trace
        })
        .collect();
    ensure!(slow.len() == 2, "{slow:#?}");
    let queued: Vec<&Value> = slow
        .iter()
        .flat_map(|call| children(&spans, call))
        .filter(|span| span["name"] == "plexus.queue")
        .collect();
    ensure!(queued.len() == 1, "one call queued: {queued:#?}");
    ensure!(
        attributes_say(queued[0], "plexus.upstream", "q"),
        "{}",
        queued[0]
    );
    let (start, end) = times(queued[0]);
    println!("queued for {:.3} s", (end - start) as f64 / 1e9);
    Ok(())
}
