//! 2026-07-28 clients through plexus. They never send `initialize`: each
//! request carries its version and capabilities in `_meta`. Upstreams here are
//! handshake era, so plexus bridges: an upstream's sampling, elicitation or roots
//! request during a 2026-07-28 client's call reaches the client as an
//! input-required result, and the client's retry completes the call.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::answering::{
    call, exercise_common, fixture_with_cancel_log, len_of, AnsweringClient, AnsweringService,
};
use plexus_tests::{answer_of, fixture_upstream, heard_on, json_of, plexus_stdio_command, Daemon};
use rmcp::model::{
    CallToolRequestParams, GetPromptRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ServerNotification, SubscriptionFilter,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use serde_json::{json, Value};

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

type Client = AnsweringService;

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

fn everything_section() -> String {
    format!("[upstreams.everything]\nnpx = \"{EVERYTHING}\"\ninit_timeout = \"180s\"\n")
}

/// Everything a 2026-07-28 client does, against a handshake-era upstream.
async fn exercise(
    client: &Client,
    handler: &AnsweringClient,
    cancel_log: &std::path::Path,
) -> anyhow::Result<()> {
    let info = client.peer_info().context("no server info")?;
    ensure!(
        info.protocol_version == ProtocolVersion::V_2026_07_28,
        "negotiated {:?}",
        info.protocol_version
    );
    exercise_common(client, handler, cancel_log).await?;

    // The first attempt alone shows the round: input_required, with plexus's state.
    let first = client
        .peer()
        .call_tool_once(
            CallToolRequestParams::new("everything__trigger-sampling-request").with_arguments(
                plexus_tests::arguments(json!({"prompt": "once", "maxTokens": 5})),
            ),
        )
        .await?;
    let rmcp::model::CallToolResponse::InputRequired(first) = first else {
        anyhow::bail!("the first attempt was not input_required: {first:?}");
    };
    let first = json_of(&first);
    ensure!(first["resultType"] == "input_required", "{first}");
    let requests = first["inputRequests"]
        .as_object()
        .context("inputRequests")?;
    ensure!(requests.len() == 1, "{first}");
    ensure!(
        requests
            .values()
            .all(|r| r["method"] == "sampling/createMessage"),
        "{first}"
    );
    ensure!(
        first["requestState"]
            .as_str()
            .is_some_and(|s| s.starts_with("plexus.")),
        "{first}"
    );

    // Logging: a request that names a level in `_meta` gets the log messages its
    // upstream sends while it runs (the simulated logger speaks every 5 s).
    call(client, "everything__toggle-simulated-logging", json!({})).await?;
    let meta: rmcp::model::RequestMetaObject =
        serde_json::from_value(json!({"io.modelcontextprotocol/logLevel": "debug"}))?;
    let from_everything = || {
        handler
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|l| {
                l["logger"]
                    .as_str()
                    .is_some_and(|l| l.starts_with("everything"))
            })
            .count()
    };
    // A request to another upstream hears nothing from this one, whatever its level.
    let mut elsewhere = CallToolRequestParams::new("fx__sleep")
        .with_arguments(plexus_tests::arguments(json!({"ms": 5500})));
    elsewhere.meta = Some(meta.clone());
    client.call_tool(elsewhere).await?;
    ensure!(
        from_everything() == 0,
        "a call to fx heard everything's log messages"
    );
    let mut logged = CallToolRequestParams::new("everything__trigger-long-running-operation")
        .with_arguments(plexus_tests::arguments(json!({"duration": 6, "steps": 3})));
    logged.meta = Some(meta);
    client.call_tool(logged).await?;
    call(client, "everything__toggle-simulated-logging", json!({})).await?;
    ensure!(from_everything() > 0, "no log message from everything");

    // Resources read under their namespaced URIs.
    let resources = client.list_all_resources().await?;
    let uri = resources
        .iter()
        .map(|r| r.uri.clone())
        .find(|uri| uri.starts_with("everything+"))
        .context("no everything resource")?;
    let read = client
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await?;
    ensure!(json_of(&read)["contents"][0]["uri"] == json!(uri));

    // subscriptions/listen replaces resources/subscribe: updates arrive on the stream.
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = Some(true);
    filter.resource_subscriptions = Some(vec![uri.clone()]);
    let mut subscription = client.peer().listen(filter).await?;
    ensure!(
        subscription.acknowledged().resource_subscriptions == Some(vec![uri.clone()]),
        "{:?}",
        subscription.acknowledged()
    );
    call(client, "everything__toggle-subscriber-updates", json!({})).await?;
    let update = heard_on(
        &mut subscription,
        Duration::from_secs(15),
        plexus_tests::updated_uri,
    )
    .await
    .context("no resource update on the listen stream")?;
    ensure!(update == uri, "{update} for {uri}");
    call(client, "everything__toggle-subscriber-updates", json!({})).await?;
    drop(subscription);

    let unknown = client
        .call_tool(CallToolRequestParams::new("nope__echo"))
        .await
        .err()
        .context("an unknown tool succeeded")?;
    ensure!(
        unknown.to_string().contains("-32602") || unknown.to_string().contains("unknown tool"),
        "{unknown}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_over_http_and_stdio_is_bridged_to_handshake_era_upstreams(
) -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    let sections = |cancel_log: &std::path::Path| {
        format!(
            "{}{}",
            everything_section(),
            fixture_with_cancel_log(cancel_log)
        )
    };
    let daemon = Daemon::builder()
        .upstreams(sections(&logs.path().join("http")))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;

    let over_http = AnsweringClient::named("http-modern").modern();
    let started = Instant::now();
    let http = over_http.connect_modern(&daemon.url).await?;
    let connect = started.elapsed();
    ensure!(
        connect < Duration::from_secs(1),
        "connecting took {connect:?}"
    );
    exercise(&http, &over_http, &logs.path().join("http"))
        .await
        .with_context(|| format!("over HTTP\n{}", daemon.log()))?;
    http.cancel().await?;

    let config = daemon.stdio_config(&sections(&logs.path().join("stdio")))?;
    let command = plexus_stdio_command(&config);
    let over_stdio = AnsweringClient::named("stdio-modern").modern();
    let stdio = over_stdio
        .clone()
        .serve_with_lifecycle(TokioChildProcess::new(command)?, modern())
        .await?;
    exercise(&stdio, &over_stdio, &logs.path().join("stdio"))
        .await
        .context("over stdio")?;
    stdio.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// What the HTTP front checks on a 2026-07-28 request, before any upstream sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_front_enforces_the_2026_rules() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = reqwest::Client::new();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let post = |headers: Vec<(&'static str, String)>, body: Value| {
        let mut request = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move { answer_of(request.send().await?).await }
    };
    let standard = |method: &str| {
        vec![
            ("mcp-protocol-version", "2026-07-28".to_string()),
            ("mcp-method", method.to_string()),
        ]
    };

    // Discovery answers at once, without a session, and names every revision.
    let started = Instant::now();
    let (status, discover, session) = post(
        standard("server/discover"),
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
    )
    .await?;
    ensure!(started.elapsed() < Duration::from_secs(1));
    ensure!(status == 200 && session.is_none(), "{status} {discover}");
    let result = &discover["result"];
    ensure!(result["resultType"] == "complete", "{discover}");
    ensure!(result["supportedVersions"][0] == "2026-07-28", "{discover}");
    ensure!(
        result["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&json!("2025-11-25"))),
        "{discover}"
    );
    ensure!(result["capabilities"]["tools"].is_object(), "{discover}");
    ensure!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "plexus",
        "{discover}"
    );

    // A call: the result is typed; the Mcp-Name header must match the body.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "fx__echo", "arguments": {"text": "hi"}, "_meta": meta}});
    let mut named = standard("tools/call");
    named.push(("mcp-name", "fx__echo".into()));
    let (status, answer, _) = post(named, call.clone()).await?;
    ensure!(status == 200, "{status} {answer}");
    ensure!(answer["result"]["resultType"] == "complete", "{answer}");
    ensure!(answer["result"]["content"][0]["text"] == "hi", "{answer}");

    let mut encoded = standard("tools/call");
    encoded.push(("mcp-name", "=?base64?ZnhfX2VjaG8=?=".into()));
    let (status, answer, _) = post(encoded, call.clone()).await?;
    ensure!(status == 200, "base64 Mcp-Name: {status} {answer}");

    let (status, answer, _) = post(standard("tools/call"), call.clone()).await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "missing Mcp-Name: {status} {answer}"
    );
    let mut wrong = standard("tools/call");
    wrong.push(("mcp-name", "fx__add".into()));
    let (status, answer, _) = post(wrong, call.clone()).await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "mismatched Mcp-Name: {status} {answer}"
    );
    let (status, answer, _) = post(
        vec![("mcp-protocol-version", "2026-07-28".into())],
        call.clone(),
    )
    .await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32020,
        "no Mcp-Method: {status} {answer}"
    );

    // An unknown version: -32022 naming what plexus serves.
    let (status, answer, _) = post(
        vec![
            ("mcp-protocol-version", "1900-01-01".into()),
            ("mcp-method", "server/discover".into()),
        ],
        json!({"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "1900-01-01",
            "io.modelcontextprotocol/clientCapabilities": {}}}}),
    )
    .await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32022,
        "{status} {answer}"
    );
    ensure!(
        answer["error"]["data"]["requested"] == "1900-01-01",
        "{answer}"
    );

    // Missing capabilities: malformed, -32602 and 400.
    let (status, answer, _) = post(
        standard("tools/list"),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}),
    )
    .await?;
    ensure!(
        status == 400 && answer["error"]["code"] == -32602,
        "{status} {answer}"
    );

    // A retry's members of the wrong type: plexus says which, where an upstream's
    // SDK answered -32601 (relayed as 404).
    for (member, value) in [("inputResponses", json!(5)), ("requestState", json!({}))] {
        let mut retry = standard("tools/call");
        retry.push(("mcp-name", "fx__echo".into()));
        let mut params = json!({"name": "fx__echo", "arguments": {"text": "hi"}, "_meta": meta});
        params[member] = value;
        let (status, answer, _) = post(
            retry,
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params}),
        )
        .await?;
        ensure!(
            answer["error"]["code"] == -32602
                && answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(member)),
            "{member}: {status} {answer}"
        );
    }

    // An unknown log level is refused, as logging/setLevel refuses it.
    let mut loud = meta.clone();
    loud["io.modelcontextprotocol/logLevel"] = json!("loud");
    let (status, answer, _) = post(
        standard("tools/list"),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": loud}}),
    )
    .await?;
    ensure!(
        answer["error"]["code"] == -32602,
        "logLevel: {status} {answer}"
    );

    // An unknown method: 404 with -32601, and the retired methods are unknown.
    for method in ["no/such", "logging/setLevel"] {
        let (status, answer, _) = post(
            standard(method),
            json!({"jsonrpc": "2.0", "id": 5, "method": method, "params": {"_meta": meta}}),
        )
        .await?;
        ensure!(
            status == 404 && answer["error"]["code"] == -32601,
            "{method}: {status} {answer}"
        );
    }

    // A missing resource is -32602 in this revision (-32002 is retired).
    let mut read = standard("resources/read");
    read.push(("mcp-name", "nowhere://x".into()));
    let (_, answer, _) = post(
        read,
        json!({"jsonrpc": "2.0", "id": 6, "method": "resources/read", "params": {"uri": "nowhere://x", "_meta": meta}}),
    )
    .await?;
    ensure!(answer["error"]["code"] == -32602, "{answer}");

    // A retry naming state plexus never issued is refused, not guessed at.
    let mut named = standard("tools/call");
    named.push(("mcp-name", "fx__echo".into()));
    let (_, answer, _) = post(
        named,
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "fx__echo",
            "arguments": {"text": "x"}, "requestState": "plexus.0000", "inputResponses": {}, "_meta": meta}}),
    )
    .await?;
    ensure!(answer["error"]["code"] == -32602, "{answer}");

    // A call's arguments that are not an object: -32602, said by plexus (the
    // upstream's SDK calls the method unknown, which would be a 404).
    let mut named = standard("tools/call");
    named.push(("mcp-name", "fx__echo".into()));
    let (status, answer, _) = post(
        named,
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "fx__echo",
            "arguments": 1, "_meta": meta}}),
    )
    .await?;
    ensure!(
        status != 404
            && answer["error"]["code"] == -32602
            && answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("`arguments`")),
        "{status} {answer}"
    );

    // The handshake era is served alongside, on the same endpoint.
    let (status, hello, session) = post(
        vec![],
        json!({"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "0"}}}),
    )
    .await?;
    ensure!(status == 200 && session.is_some(), "{status} {hello}");
    ensure!(
        hello["result"]["protocolVersion"] == "2025-11-25",
        "{hello}"
    );
    ensure!(hello["result"].get("resultType").is_none(), "{hello}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A handshake-era client and a 2026-07-28 one of the daemon at `url`, named "old"
/// and "new", each answering the daemon's input requests; with their handlers,
/// which record what each was asked.
async fn old_and_new_clients(
    url: &str,
) -> anyhow::Result<(
    (AnsweringClient, AnsweringService),
    (AnsweringClient, AnsweringService),
)> {
    let old = AnsweringClient::named("old");
    let legacy = rmcp::ServiceExt::serve(
        old.clone(),
        StreamableHttpClientTransport::from_uri(url.to_string()),
    )
    .await?;
    let new = AnsweringClient::named("new").modern();
    let modern = new.connect_modern(url).await?;
    Ok(((old, legacy), (new, modern)))
}

/// What `ask` answers when `client` fulfils its input request.
fn expected_ask(kind: &str, client: &str) -> String {
    match kind {
        "sampling" => format!("sampled by {client}"),
        "elicitation" => format!("accept:{client} answered"),
        _ => format!("file:///roots/{client}"),
    }
}

async fn ask(client: &Client, tool: &str, kind: &str) -> anyhow::Result<String> {
    let result = call(client, tool, json!({"kind": kind})).await?;
    ensure!(result["isError"] != true, "{tool} {kind}: {result}");
    result["content"][0]["text"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("{tool} {kind}: {result}"))
}

/// Each upstream is spoken to in one era, chosen as it starts, and clients of the
/// other era are bridged; no second process is started for an era. Under
/// `protocol = "auto"` an upstream whose `server/discover` offers 2026-07-28 is
/// spoken to in it: one of both eras, one that lists 2026-07-28 alone yet answers
/// `initialize` (as SDKs of both eras do), and one of 2026-07-28 alone.
/// `protocol = "handshake"` forces the older era. Clients of either era get every
/// tool's input requests (sampling, elicitation) answered, from every one of them,
/// shared or per session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_is_spoken_to_in_one_era_chosen_as_it_starts() -> anyhow::Result<()> {
    let per_session = "share = \"session\"";
    let handshake = "protocol = \"handshake\"";
    let sections = [
        fixture_upstream("sdk", "", &["--modern", "--discover-modern-only"]),
        fixture_upstream("dual", "", &["--modern"]),
        fixture_upstream(
            "strict",
            "",
            &["--modern", "--discover-modern-only", "--refuse-handshake"],
        ),
        fixture_upstream("old", handshake, &["--modern"]),
        // Each session's own instance speaks the era its upstream's config chooses.
        fixture_upstream(
            "mine",
            &format!("{per_session}\n{handshake}"),
            &["--modern", "--discover-modern-only"],
        ),
        fixture_upstream(
            "mynew",
            per_session,
            &["--modern", "--discover-modern-only"],
        ),
    ]
    .concat();
    let upstreams = ["sdk", "dual", "strict", "old", "mine", "mynew"];
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let ((_, legacy), (_, modern_client)) = old_and_new_clients(&daemon.url).await?;
    for round in 0..2 {
        for (client, name) in [(&legacy, "old"), (&modern_client, "new")] {
            for upstream in upstreams {
                for kind in ["sampling", "elicitation"] {
                    let text = ask(client, &format!("{upstream}__ask"), kind)
                        .await
                        .with_context(|| {
                            format!(
                                "{name} client, {upstream}, {kind}, round {round}\n{}",
                                daemon.log()
                            )
                        })?;
                    ensure!(
                        text == expected_ask(kind, name),
                        "{name}, {upstream}: {text}"
                    );
                }
            }
        }
    }
    let log = daemon.log();
    let initialized = |upstream: &str, protocol: &str| {
        log.lines()
            .filter(|l| {
                l.contains("upstream initialized")
                    && l.contains(&format!("upstream={upstream} "))
                    && l.contains(&format!("protocol={protocol}"))
            })
            .count()
    };
    for (upstream, era, other) in [
        ("sdk", "2026-07-28", "2025-11-25"),
        ("dual", "2026-07-28", "2025-11-25"),
        ("strict", "2026-07-28", "2025-11-25"),
        ("old", "2025-11-25", "2026-07-28"),
    ] {
        ensure!(
            initialized(upstream, era) == 1 && initialized(upstream, other) == 0,
            "{upstream}: one process, spoken to in {era}\n{log}"
        );
    }
    // Per session: the discovery run and every session's own instance alike.
    ensure!(
        initialized("mine", "2025-11-25") >= 2 && initialized("mine", "2026-07-28") == 0,
        "{log}"
    );
    ensure!(
        initialized("mynew", "2026-07-28") >= 2 && initialized("mynew", "2025-11-25") == 0,
        "{log}"
    );
    // The status shows one process per shared upstream, whatever clients came.
    let (_, status) = daemon.admin_get("/status").await?;
    let status: Value = serde_json::from_str(&status)?;
    for upstream in ["sdk", "dual", "strict", "old"] {
        let entry = status["upstreams"]
            .as_array()
            .and_then(|all| all.iter().find(|u| u["name"] == upstream))
            .with_context(|| format!("{upstream} in {status}"))?;
        ensure!(entry["pid"].is_u64(), "{entry}");
        ensure!(entry.get("handshake_twin").is_none(), "{entry}");
    }
    legacy.cancel().await?;
    modern_client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A 2026-07-28 upstream (the fixture with `--modern`, found by plexus's
/// `server/discover` probe) and a handshake-era one, each used by clients of
/// both eras: every client gets the same answers. A handshake-era client is
/// asked the modern upstream's input requests as real requests; a 2026-07-28
/// client gets the upstream's input-required results as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_and_clients_of_both_eras_meet_through_plexus() -> anyhow::Result<()> {
    let sections = format!(
        "{}{}",
        fixture_upstream("fxm", "", &["--modern"]),
        fixture_upstream("fx", "", &[])
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let log = daemon.log();
    ensure!(
        log.lines().any(|l| l.contains("upstream initialized")
            && l.contains("upstream=fxm")
            && l.contains("protocol=2026-07-28")),
        "fxm was not reached as 2026-07-28\n{log}"
    );
    ensure!(
        log.lines().any(|l| l.contains("upstream initialized")
            && l.contains("upstream=fx ")
            && l.contains("protocol=2025-11-25")),
        "fx was not reached with the handshake\n{log}"
    );

    let ((old, legacy), (new, modern_client)) = old_and_new_clients(&daemon.url).await?;

    for (client, name) in [(&legacy, "old"), (&modern_client, "new")] {
        for upstream in ["fxm", "fx"] {
            let echoed = call(
                client,
                &format!("{upstream}__echo"),
                json!({"text": "both"}),
            )
            .await?;
            ensure!(echoed["content"][0]["text"] == "both", "{echoed}");
            // Linked and embedded resources name their URIs as the client reads them.
            let linked = call(
                client,
                &format!("{upstream}__echo"),
                json!({"text": "both", "link": "fixture://items/7"}),
            )
            .await?;
            let exposed = format!("{upstream}+fixture://items/7");
            ensure!(
                linked["content"][1]["resource"]["uri"] == exposed.as_str()
                    && linked["content"][1]["resource"]["text"] == "both"
                    && linked["content"][2]["type"] == "resource_link"
                    && linked["content"][2]["uri"] == exposed.as_str(),
                "{name} client, {upstream}: {linked}"
            );
            // So do a prompt's.
            let prompt = client
                .get_prompt(
                    GetPromptRequestParams::new(format!("{upstream}__greet")).with_arguments(
                        json!({"name": "Ada", "link": "fixture://items/7"})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    ),
                )
                .await?;
            let messages = serde_json::to_value(&prompt.messages)?;
            ensure!(
                messages[1]["content"]["resource"]["uri"] == exposed.as_str()
                    && messages[2]["content"]["type"] == "resource_link"
                    && messages[2]["content"]["uri"] == exposed.as_str(),
                "{name} client, {upstream}: {messages}"
            );
            for kind in ["sampling", "elicitation", "roots"] {
                let text = ask(client, &format!("{upstream}__ask"), kind)
                    .await
                    .with_context(|| {
                        format!("{name} client, {upstream}, {kind}\n{}", daemon.log())
                    })?;
                ensure!(
                    text == expected_ask(kind, name),
                    "{name} client, {upstream}, {kind}: {text}"
                );
            }
        }
    }
    // A call that asks again after each answer: a 2026-07-28 client's call pauses,
    // resumes and pauses again, once per round, and still ends with its result.
    for (client, name) in [(&legacy, "old"), (&modern_client, "new")] {
        let asked = call(client, "fx__ask", json!({"kind": "sampling", "times": 3}));
        let result = tokio::time::timeout(Duration::from_secs(30), asked)
            .await
            .with_context(|| {
                format!("{name} client: three rounds never ended\n{}", daemon.log())
            })??;
        let expected = vec![expected_ask("sampling", name); 3].join("|");
        ensure!(
            result["content"][0]["text"] == json!(expected),
            "{name} client, three rounds: {result}"
        );
    }
    ensure!(
        len_of(&old.sampled) == 5,
        "old client sampled {}",
        len_of(&old.sampled)
    );
    ensure!(
        len_of(&new.sampled) == 5,
        "new client sampled {}",
        len_of(&new.sampled)
    );

    // The modern upstream's round reaches a 2026-07-28 client untouched: its own state.
    let first = modern_client
        .peer()
        .call_tool_once(
            CallToolRequestParams::new("fxm__ask")
                .with_arguments(plexus_tests::arguments(json!({"kind": "roots"}))),
        )
        .await?;
    let rmcp::model::CallToolResponse::InputRequired(first) = first else {
        anyhow::bail!("not input_required: {first:?}");
    };
    let first = json_of(&first);
    ensure!(first["requestState"] == "ask:roots:1", "{first}");
    ensure!(
        first["inputRequests"]["roots"]["method"] == "roots/list",
        "{first}"
    );

    legacy.cancel().await?;
    modern_client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A listen stream opened before an upstream joins announces the tools it brings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_announces_list_changes() -> anyhow::Result<()> {
    let late = format!(
        "[upstreams.late]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep 1; exec {}\"]\n",
        plexus_tests::fixture_binary().display()
    );
    // No first-list wait: the upstream is to join through the listen stream.
    let daemon = Daemon::builder()
        .daemon("first_list_wait = \"0s\"")
        .upstreams(&late)
        .start()
        .await?;
    let client = AnsweringClient::named("listener")
        .connect_modern(&daemon.url)
        .await?;
    ensure!(
        client.list_all_tools().await?.is_empty(),
        "the upstream should not have joined yet"
    );
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = Some(true);
    let mut subscription = client.peer().listen(filter).await?;
    ensure!(subscription.acknowledged().tools_list_changed == Some(true));
    heard_on(&mut subscription, Duration::from_secs(30), |heard| {
        matches!(heard, ServerNotification::ToolListChangedNotification(_)).then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "no tools/list_changed on the listen stream\n{}",
            daemon.log()
        )
    })?;
    let tools = client.list_all_tools().await?;
    ensure!(tools.iter().any(|t| t.name == "late__echo"), "{tools:?}");
    drop(subscription);
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Wire details of 2026-07-28 found by probing: an unsupported version's error
/// echoes the request's id; `initialize` and `ping` sent as 2026-07-28 requests are
/// unknown methods (404, -32601), and `initialize` opens no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2026_wire_details_hold() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = reqwest::Client::new();
    let post = |version: &'static str, method: &'static str, id: u64| {
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        });
        let request = client
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", version)
            .header("mcp-method", method)
            .body(
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"_meta": meta}})
                    .to_string(),
            );
        async move { answer_of(request.send().await?).await }
    };
    let (status, answer, _) = post("1999-01-01", "server/discover", 41).await?;
    ensure!(status == 400, "{status} {answer}");
    ensure!(answer["error"]["code"] == -32022, "{answer}");
    ensure!(
        answer["id"] == 41,
        "the error does not echo the request's id: {answer}"
    );
    for (method, id) in [("initialize", 42), ("ping", 43)] {
        let (status, answer, session) = post("2026-07-28", method, id).await?;
        ensure!(status == 404, "{method}: {status} {answer}");
        ensure!(answer["error"]["code"] == -32601, "{method}: {answer}");
        ensure!(answer["id"] == id, "{method}: {answer}");
        ensure!(session.is_none(), "{method} opened a session");
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A 2026-07-28 upstream is told the calling client's own capabilities, not
/// plexus's: a client that declared no elicitation gets the upstream's -32021 for a
/// tool that needs it, while a client that declared it is asked as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstream_hears_the_clients_capabilities_not_plexuss() -> anyhow::Result<()> {
    let section = fixture_upstream("fx", "", &["--modern"]);
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let bare = rmcp::model::ClientConfig::default()
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(daemon.url.clone()),
            modern(),
        )
        .await?;
    let ask_bare = || async {
        let refused = bare
            .call_tool(
                CallToolRequestParams::new("fx__ask".to_string())
                    .with_arguments(plexus_tests::arguments(json!({"kind": "elicitation"}))),
            )
            .await
            .err()
            .context("a client without the elicitation capability had its call run")?;
        ensure!(refused.to_string().contains("-32021"), "{refused}");
        anyhow::Ok(())
    };
    ask_bare().await?;

    let handler = AnsweringClient::named("capable").modern();
    let capable = handler.connect_modern(&daemon.url).await?;
    let answer = call(&capable, "fx__ask", json!({"kind": "elicitation"})).await?;
    ensure!(answer.to_string().contains("accept:"), "{answer}");
    // Taking turns, each is still told apart.
    ask_bare().await?;
    let answer = call(&capable, "fx__ask", json!({"kind": "elicitation"})).await?;
    ensure!(answer.to_string().contains("accept:"), "{answer}");
    bare.cancel().await?;
    capable.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A dual-era upstream (the fixture with `--conformance --modern`: `server/discover`
/// lists 2026-07-28 and the handshake versions) is one process, spoken to in one era,
/// and clients of both eras get what they get from the fixture directly, whichever:
/// `dual` (`protocol = "auto"`: 2026-07-28) and `hs` (`protocol = "handshake"`).
/// `test_sampling` and `test_elicitation` ask a handshake-era client with
/// server-to-client requests (from `dual`, plexus turns its input-required rounds into
/// them); `ask` of a 2026-07-28 client is an input-required round (from `hs`, plexus
/// turns the upstream's request into one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_era_upstream_meets_each_client_in_its_own_era() -> anyhow::Result<()> {
    let fixture = plexus_tests::fixture_binary();
    let args = ["--conformance", "--modern"];
    let sections = format!(
        "{}{}",
        fixture_upstream("dual", "", &args),
        fixture_upstream("hs", "protocol = \"handshake\"\n", &args)
    );
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;

    let direct_handler = AnsweringClient::named("old");
    let mut command = tokio::process::Command::new(&fixture);
    command.args(args);
    let direct =
        rmcp::ServiceExt::serve(direct_handler.clone(), TokioChildProcess::new(command)?).await?;
    let handler = AnsweringClient::named("old");
    let legacy = rmcp::ServiceExt::serve(
        handler.clone(),
        StreamableHttpClientTransport::from_uri(daemon.url.clone()),
    )
    .await?;
    let asks = [
        ("test_sampling", json!({"prompt": "era?"})),
        ("test_elicitation", json!({"message": "who?"})),
    ];
    for (tool, args) in &asks {
        let expected = call(&direct, tool, args.clone()).await?;
        ensure!(expected["isError"] != true, "directly, {tool}: {expected}");
        for upstream in ["dual", "hs"] {
            let through = match call(&legacy, &format!("{upstream}__{tool}"), args.clone()).await {
                Ok(through) => through,
                Err(error) => {
                    anyhow::bail!(
                        "{upstream}__{tool} through plexus: {error:?}\n{}",
                        daemon.log()
                    )
                }
            };
            ensure!(
                through == expected,
                "{upstream}__{tool} through plexus: {through}\ndirectly: {expected}"
            );
        }
    }
    ensure!(
        len_of(&handler.sampled) == 2,
        "{}",
        len_of(&handler.sampled)
    );
    // One process of each, in its era.
    let log = daemon.log();
    let initialized = |upstream: &str, protocol: &str| {
        log.lines()
            .filter(|l| {
                l.contains("upstream initialized")
                    && l.contains(&format!("upstream={upstream} "))
                    && l.contains(&format!("protocol={protocol}"))
            })
            .count()
    };
    ensure!(
        initialized("dual", "2026-07-28") == 1 && initialized("dual", "2025-11-25") == 0,
        "dual: one 2026-07-28 process\n{log}"
    );
    ensure!(
        initialized("hs", "2025-11-25") == 1 && initialized("hs", "2026-07-28") == 0,
        "hs: one handshake-era process\n{log}"
    );

    // A 2026-07-28 client: `ask` pauses as an input-required round, answered by the
    // client, as directly, relayed from `dual` and bridged from `hs`.
    let new = AnsweringClient::named("new").modern();
    let modern_client = new.connect_modern(&daemon.url).await?;
    let direct_new = AnsweringClient::named("new").modern();
    let mut command = tokio::process::Command::new(&fixture);
    command.args(args);
    let direct_modern = direct_new
        .clone()
        .serve_with_lifecycle(TokioChildProcess::new(command)?, modern())
        .await?;
    for kind in ["sampling", "elicitation", "roots"] {
        let expected = ask(&direct_modern, "ask", kind).await?;
        for upstream in ["dual", "hs"] {
            let through = ask(&modern_client, &format!("{upstream}__ask"), kind).await?;
            ensure!(
                through == expected,
                "{upstream}, {kind}: {through} vs {expected}"
            );
            ensure!(through == expected_ask(kind, "new"), "{kind}: {through}");
        }
    }
    // The same tool's first round reaches the 2026-07-28 client as input_required.
    for upstream in ["dual", "hs"] {
        let first = modern_client
            .peer()
            .call_tool_once(
                CallToolRequestParams::new(format!("{upstream}__ask"))
                    .with_arguments(plexus_tests::arguments(json!({"kind": "sampling"}))),
            )
            .await?;
        ensure!(
            matches!(first, rmcp::model::CallToolResponse::InputRequired(_)),
            "{upstream}: {first:?}"
        );
    }

    for client in [direct, legacy, modern_client, direct_modern] {
        client.cancel().await?;
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// The cache hints of a merged list are true of the merge: the shortest TTL of the
/// upstreams in it, `private` as soon as one of them is (or has no hints: every
/// handshake-era upstream), and the same catalog gives the same bytes every time.
/// Handshake-era clients get no hints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_carry_the_cache_hints_true_of_the_merge() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = plexus_tests::fixture_binary().display().to_string();
    let section = |name: &str, hints: &str| {
        format!("[upstreams.{name}]\ncommand = {fixture:?}\nargs = [\"--modern\", \"--cache-hints\", \"{hints}\"]\n\n")
    };
    let public = format!(
        "{}{}",
        section("long", "60000:public"),
        section("short", "5000:public")
    );
    let cases = [
        (public.clone(), 5000, "public"),
        (
            format!("{public}{}", section("mine", "60000:private")),
            5000,
            "private",
        ),
        (
            format!("{public}[upstreams.old]\ncommand = {fixture:?}\n"),
            0,
            "private",
        ),
    ];
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    for (i, (sections, ttl, scope)) in cases.into_iter().enumerate() {
        let config = dir.path().join(format!("plexus-{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "[daemon]\nstate_dir = {:?}\n\n{sections}",
                dir.path().join(format!("state-{i}")).display().to_string()
            ),
        )?;
        let config = config.to_str().context("config path")?;
        let args = ["serve", "--stdio", "--config", config];
        let mut client =
            plexus_tests::RawStdioSession::start(&plexus_tests::plexus_binary(), &args).await?;
        let mut listed = Vec::new();
        for _ in 0..2 {
            let answer = client.request("tools/list", json!({"_meta": meta})).await?;
            listed.push(serde_json::to_string(&answer["result"])?);
            let result = &answer["result"];
            ensure!(
                result["ttlMs"] == ttl && result["cacheScope"] == scope,
                "case {i}: want {ttl} {scope}: {result}"
            );
            ensure!(
                result["tools"].as_array().is_some_and(|t| !t.is_empty()),
                "{result}"
            );
        }
        ensure!(listed[0] == listed[1], "case {i}: {listed:?}");
        for kind in ["prompts/list", "resources/list", "resources/templates/list"] {
            let answer = client.request(kind, json!({"_meta": meta})).await?;
            ensure!(
                answer["result"]["ttlMs"] == ttl && answer["result"]["cacheScope"] == scope,
                "case {i}, {kind}: {answer}"
            );
        }
        client.close().await;
    }

    let config = dir.path().join("plexus-0.toml");
    let config = config.to_str().context("config path")?;
    let args = ["serve", "--stdio", "--config", config];
    let mut legacy =
        plexus_tests::RawStdioSession::spawn(&plexus_tests::plexus_binary(), &args).await?;
    let answer = legacy.request("tools/list", json!({})).await?;
    ensure!(
        answer["result"]["tools"].is_array()
            && answer["result"].get("ttlMs").is_none()
            && answer["result"].get("cacheScope").is_none(),
        "{answer}"
    );
    legacy.close().await;
    Ok(())
}

/// A listen stream's resource subscriptions are bounded as a session's are: of
/// 1,005 URIs, the first 1,000 are honoured and the acknowledgement says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_streams_subscriptions_are_bounded() -> anyhow::Result<()> {
    let sections = fixture_upstream("fx", "", &["--name", "fx", "--conformance"]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = AnsweringClient::named("listener")
        .connect_modern(&daemon.url)
        .await?;
    let uris: Vec<String> = (0..1005)
        .map(|n| format!("fx+test://template/{n}/data"))
        .collect();
    let mut filter = SubscriptionFilter::new();
    filter.resource_subscriptions = Some(uris.clone());
    let subscription = client.peer().listen(filter).await?;
    let honoured = subscription
        .acknowledged()
        .resource_subscriptions
        .clone()
        .unwrap_or_default();
    ensure!(
        honoured == uris[..1000],
        "{} honoured, from {:?} to {:?}",
        honoured.len(),
        honoured.first(),
        honoured.last()
    );
    drop(subscription);
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A server of 2026-07-28 alone that is slow to start (a cold `uvx` install, heavy
/// imports) answers the `server/discover` probe after plexus has given up on it and
/// sent `initialize`, which it refuses naming the versions it serves. plexus
/// discovers again and starts it, in its first run: it failed that start and every
/// later one as slow, and ended `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_of_2026_alone_is_started_when_it_refuses_the_handshake() -> anyhow::Result<()>
{
    let log = a_2026_upstream_echoes(
        "slow",
        "",
        &[
            "--name",
            "slow",
            "--modern",
            "--refuse-handshake",
            "--slow-start",
            "6000",
        ],
        "late but here",
    )
    .await?;
    ensure!(!log.contains("upstream initialize failed"), "{log}");
    Ok(())
}

/// A server that refuses `server/discover` for its version (-32022) while naming
/// 2026-07-28, the version asked, among those it supports is a server of that
/// revision: plexus asks again, as the error invites, rather than taking it for a
/// handshake-era server (none sends -32022) and falling back to `initialize`,
/// which the dual fixture would answer in the older era.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discover_refused_for_the_version_it_names_is_asked_again() -> anyhow::Result<()> {
    a_2026_upstream_echoes(
        "picky",
        "",
        &["--name", "picky", "--modern", "--refuse-first-discover"],
        "second time",
    )
    .await?;
    Ok(())
}

/// A daemon whose one upstream `name` is the fixture run with `args` (and the
/// section's `extra` keys): it is reached as 2026-07-28 and echoes `text` to a
/// 2026-07-28 client. Returns the daemon's log as it stood once the upstream was ready.
async fn a_2026_upstream_echoes(
    name: &str,
    extra: &str,
    args: &[&str],
    text: &str,
) -> anyhow::Result<String> {
    let daemon = Daemon::builder()
        .upstreams(fixture_upstream(name, extra, args))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let log = daemon.log();
    ensure!(
        log.contains(&format!(
            "upstream initialized upstream={name} protocol=2026-07-28"
        )),
        "{log}"
    );
    let client = AnsweringClient::named("caller")
        .connect_modern(&daemon.url)
        .await?;
    let answer = call(&client, &format!("{name}__echo"), json!({"text": text})).await?;
    ensure!(answer["content"][0]["text"] == text, "{answer}");
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(log)
}

/// An upstream of 2026-07-28 may name itself in each result's `_meta`; relayed to a
/// 2026-07-28 client, the result names plexus, the server its client talks to (it
/// would otherwise take each upstream's name for its server's, call by call). A
/// handshake-era client, whose era names the server once, in `initialize`, gets no
/// `serverInfo` in results, as such a server answers that era. Small and large
/// results alike (the large one is passed on unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_results_name_plexus_as_their_server() -> anyhow::Result<()> {
    let sections = fixture_upstream("fx", "", &["--modern", "--server-info-in-results"]);
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    });
    let http = reqwest::Client::new();
    let mut handshake = plexus_tests::RawHttpSession::connect(&daemon.url).await?;
    let named_plexus = |answer: &Value| {
        answer["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]
            == json!({"name": "plexus", "version": env!("CARGO_PKG_VERSION")})
    };
    for text in ["small".to_string(), "large ".repeat(20_000)] {
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "fx__echo", "arguments": {"text": text}, "_meta": meta}});
        let request = http
            .post(&daemon.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "fx__echo")
            .body(call.to_string());
        let (status, modern, _) = answer_of(request.send().await?).await?;
        ensure!(status == 200 && named_plexus(&modern), "{modern:.400}");
        ensure!(modern["result"]["content"][0]["text"] == text.as_str());
        let old = handshake
            .request(
                "tools/call",
                json!({"name": "fx__echo", "arguments": {"text": text}}),
            )
            .await?;
        ensure!(
            old["result"]["_meta"]
                .get("io.modelcontextprotocol/serverInfo")
                .is_none(),
            "{old:.400}"
        );
        ensure!(old["result"]["content"][0]["text"] == text.as_str());
    }
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A handshake-era upstream's requests to the client mark no round: those its tool
/// sends together (here a form, a sampling request and `roots/list`) reach a
/// 2026-07-28 client in one input-required result, not one per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_handshake_era_tool_sends_together_are_one_round() -> anyhow::Result<()> {
    let section = fixture_upstream(
        "hs",
        "protocol = \"handshake\"\n",
        &["--conformance", "--modern"],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let client = AnsweringClient::named("new")
        .connect_modern(&daemon.url)
        .await?;
    let first = client
        .peer()
        .call_tool_once(CallToolRequestParams::new(
            "hs__test_input_required_result_multiple_inputs",
        ))
        .await?;
    let rmcp::model::CallToolResponse::InputRequired(first) = first else {
        anyhow::bail!("not input_required: {first:?}\n{}", daemon.log());
    };
    let first = json_of(&first);
    let mut methods: Vec<&str> = first["inputRequests"]
        .as_object()
        .context("inputRequests")?
        .values()
        .filter_map(|request| request["method"].as_str())
        .collect();
    methods.sort_unstable();
    ensure!(
        methods == ["elicitation/create", "roots/list", "sampling/createMessage"],
        "{first}"
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An upstream that asks its client during a request that cannot be answered
/// `input_required` in 2026-07-28 (only tools, prompts and reads can): a 2026-07-28
/// client's completion is not paused for it, plexus refuses the upstream's question
/// and the completion comes back; a handshake-era client is asked, as directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_during_a_completion_does_not_pause_a_2026_client() -> anyhow::Result<()> {
    let section = fixture_upstream("fx", "", &["--conformance"]);
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    daemon.wait_ready(Duration::from_secs(30)).await?;
    let complete = json!({
        "ref": {"type": "ref/prompt", "name": "fx__test_prompt_with_arguments"},
        "argument": {"name": "arg1", "value": "ask the client first"},
    });
    let new = AnsweringClient::named("new")
        .connect_modern(&daemon.url)
        .await?;
    let answered = new
        .peer()
        .complete(serde_json::from_value(complete.clone())?)
        .await
        .with_context(|| daemon.log())?;
    let value = &answered.completion.values[0];
    ensure!(value.starts_with("not asked"), "{answered:?}");
    let old = rmcp::ServiceExt::serve(
        AnsweringClient::named("old"),
        StreamableHttpClientTransport::from_uri(daemon.url.clone()),
    )
    .await?;
    let answered = old
        .peer()
        .complete(serde_json::from_value(complete)?)
        .await?;
    ensure!(answered.completion.values == ["asked"], "{answered:?}");
    new.cancel().await?;
    old.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}
