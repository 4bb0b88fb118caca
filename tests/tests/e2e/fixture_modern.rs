//! The fixture's `ask` tool against real rmcp clients over stdio: a 2026-07-28
//! client (`--modern`) is asked through input-required results that rmcp's
//! `call_tool` fulfils and retries, a handshake-era client through
//! server-to-client requests, and both get the same texts. Without `--modern`
//! the fixture stays handshake-only.

// The SDK marks sampling and roots deprecated in favour of the 2026-07-28 forms;
// `ask` exercises exactly them.
#![allow(deprecated)]

use anyhow::{bail, ensure, Context};
use plexus_tests::{arguments, json_of};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, Implementation, InputRequiredResult, InputResponses, ListRootsResult,
    ProtocolVersion, Root, SamplingMessage,
};
use rmcp::service::{ClientInitializeError, RequestContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{
    ClientHandler, ClientLifecycleMode, ClientServiceExt, ErrorData, RoleClient, ServiceExt,
};
use serde_json::json;
use tokio::process::Command;

/// What the test client answers, and so what `ask` returns.
const SAMPLED: &str = "sampled text";
const NAME: &str = "Ada";
const ROOTS: [&str; 2] = ["file:///work/a", "file:///work/b"];

/// Every kind with the text `ask` returns for this client's fixed answers.
const EXPECTED: [(&str, &str); 3] = [
    ("sampling", SAMPLED),
    ("elicitation", "accept:Ada"),
    ("roots", "file:///work/a,file:///work/b"),
];

/// A client that declares sampling, form elicitation and roots and answers each
/// with a fixed value.
#[derive(Clone, Copy)]
struct AskClient;

impl ClientHandler for AskClient {
    fn get_info(&self) -> ClientConfig {
        // The protocol version matters only to the handshake; Discover mode takes
        // its versions from the lifecycle and sends these capabilities in `_meta`.
        let capabilities = ClientCapabilities::builder()
            .enable_roots()
            .enable_sampling()
            .enable_elicitation()
            .build();
        ClientConfig::new(capabilities, Implementation::new("ask-client", "1"))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(SAMPLED),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"name": NAME})))
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        Ok(ListRootsResult::new(
            ROOTS.iter().map(|uri| Root::new(*uri)).collect(),
        ))
    }
}

/// A handshake-era client that declares no capabilities at all.
fn bare_client() -> ClientConfig {
    ClientConfig::default().with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

fn fixture(args: &[&str]) -> anyhow::Result<TokioChildProcess> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plexus-fixture"));
    command.args(args).env("RUST_LOG", "warn");
    Ok(TokioChildProcess::new(command)?)
}

fn discover() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

async fn connect_modern<H: ClientHandler>(
    handler: H,
) -> anyhow::Result<RunningService<RoleClient, H>> {
    let client = handler
        .serve_with_lifecycle(fixture(&["--modern"])?, discover())
        .await
        .context("Discover-mode connect to `plexus-fixture --modern`")?;
    ensure_version(&client, &ProtocolVersion::V_2026_07_28)?;
    Ok(client)
}

fn ensure_version<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    expected: &ProtocolVersion,
) -> anyhow::Result<()> {
    let info = client.peer_info().context("no server info")?;
    ensure!(
        &info.protocol_version == expected,
        "negotiated {}, expected {expected}",
        info.protocol_version
    );
    Ok(())
}

fn ask_params(kind: &str) -> CallToolRequestParams {
    CallToolRequestParams::new("ask").with_arguments(arguments(json!({"kind": kind})))
}

/// The single text content of a successful result.
fn text_of(result: &CallToolResult) -> anyhow::Result<String> {
    let json = json_of(result);
    ensure!(json["isError"] != json!(true), "tool error: {json}");
    match json["content"].as_array().map(Vec::as_slice) {
        Some([only]) => only["text"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("not text: {json}")),
        _ => bail!("expected one content block: {json}"),
    }
}

/// The single text content of a tool error.
fn error_text_of(result: &CallToolResult) -> anyhow::Result<String> {
    let json = json_of(result);
    ensure!(
        json["isError"] == json!(true),
        "expected a tool error: {json}"
    );
    json["content"][0]["text"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no text: {json}"))
}

/// Calls `ask` once and insists on an input-required answer.
async fn ask_once<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    params: CallToolRequestParams,
) -> anyhow::Result<InputRequiredResult> {
    match client.call_tool_once(params).await? {
        CallToolResponse::InputRequired(result) => Ok(result),
        other => bail!("expected input_required, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_client_completes_ask_through_input_required_rounds() -> anyhow::Result<()> {
    let client = connect_modern(AskClient).await?;
    let tools = client.list_all_tools().await?;
    ensure!(tools.iter().any(|tool| tool.name == "ask"), "{tools:?}");

    // rmcp's `call_tool` fulfils each input request through the handler and retries.
    for (kind, expected) in EXPECTED {
        let result = client.call_tool(ask_params(kind)).await?;
        let text = text_of(&result).with_context(|| format!("ask {kind}"))?;
        ensure!(
            text == expected,
            "ask {kind}: {text:?}, expected {expected:?}"
        );
    }
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modern_first_answer_is_input_required_and_the_retry_completes() -> anyhow::Result<()> {
    let client = connect_modern(AskClient).await?;

    // Each kind asks under its own key, with a state naming the kind and round.
    let methods = [
        ("sampling", "sampling/createMessage"),
        ("elicitation", "elicitation/create"),
        ("roots", "roots/list"),
    ];
    for (kind, method) in methods {
        let first = json_of(&ask_once(&client, ask_params(kind)).await?);
        ensure!(first["resultType"] == "input_required", "{first}");
        ensure!(first["requestState"] == format!("ask:{kind}:1"), "{first}");
        let requests = first["inputRequests"]
            .as_object()
            .context("inputRequests")?;
        ensure!(
            requests.len() == 1 && requests[kind]["method"] == method,
            "{first}"
        );
    }

    // The exact requests, as the spec has them on the wire.
    let sampling = json_of(&ask_once(&client, ask_params("sampling")).await?);
    ensure!(
        sampling["inputRequests"]["sampling"]["params"]
            == json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": "say something"}}],
                "maxTokens": 16,
            }),
        "{sampling}"
    );
    let elicitation = json_of(&ask_once(&client, ask_params("elicitation")).await?);
    let params = &elicitation["inputRequests"]["elicitation"]["params"];
    ensure!(
        params["mode"] == "form"
            && params["message"] == "your name?"
            && params["requestedSchema"]["properties"]["name"]["type"] == "string"
            && params["requestedSchema"]["required"] == json!(["name"]),
        "{elicitation}"
    );

    // A retry with the state but without the answer is asked again, one round on.
    let again = ask_once(
        &client,
        ask_params("sampling").with_request_state("ask:sampling:1"),
    )
    .await?;
    ensure!(
        again.request_state.as_deref() == Some("ask:sampling:2"),
        "{again:?}"
    );

    // Answering by hand: the retry carries inputResponses and the echoed state.
    let answer = json!({
        "role": "assistant",
        "content": {"type": "text", "text": "by hand"},
        "model": "m",
    });
    let responses = InputResponses::from([("sampling".to_owned(), answer)]);
    let retry = ask_params("sampling")
        .with_input_responses(responses)
        .with_request_state("ask:sampling:2");
    match client.call_tool_once(retry).await? {
        CallToolResponse::Complete(result) => ensure!(text_of(&result)? == "by hand"),
        other => bail!("expected a complete result, got {other:?}"),
    }
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_client_is_asked_by_server_requests_with_the_same_texts() -> anyhow::Result<()> {
    // Both the default fixture and the dual-era one serve the handshake.
    for args in [&[][..], &["--modern"][..]] {
        let client = AskClient.serve(fixture(args)?).await?;
        ensure_version(&client, &ProtocolVersion::LATEST_WITH_INITIALIZE)?;
        for (kind, expected) in EXPECTED {
            // One round: a handshake-era call never answers input_required.
            let result = match client.call_tool_once(ask_params(kind)).await? {
                CallToolResponse::Complete(result) => result,
                other => bail!("{args:?} ask {kind}: expected a complete result, got {other:?}"),
            };
            let text = text_of(&result).with_context(|| format!("{args:?} ask {kind}"))?;
            ensure!(
                text == expected,
                "{args:?} ask {kind}: {text:?}, expected {expected:?}"
            );
        }
        client.cancel().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_capability_is_refused_in_each_eras_way() -> anyhow::Result<()> {
    let handshake = bare_client().serve(fixture(&["--modern"])?).await?;
    let modern = connect_modern(bare_client()).await?;
    for kind in ["sampling", "elicitation", "roots"] {
        let expected = format!("the client did not declare the `{kind}` capability");
        // The handshake era: a tool error. 2026-07-28: that revision's -32021.
        let old = error_text_of(&handshake.call_tool(ask_params(kind)).await?)?;
        ensure!(old == expected, "{kind}: {old:?}");
        let refused = modern
            .call_tool(ask_params(kind))
            .await
            .err()
            .with_context(|| {
                format!("{kind}: a 2026-07-28 call without the capability succeeded")
            })?;
        ensure!(refused.to_string().contains("-32021"), "{kind}: {refused}");
    }
    handshake.cancel().await?;
    modern.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_modern_a_discover_client_cannot_connect() -> anyhow::Result<()> {
    match AskClient
        .serve_with_lifecycle(fixture(&[])?, discover())
        .await
    {
        Err(ClientInitializeError::NoCompatibleProtocolVersion {
            server_supported, ..
        }) => {
            ensure!(
                server_supported
                    == ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE),
                "{server_supported:?}"
            );
            Ok(())
        }
        Err(other) => bail!("expected no compatible version, got {other}"),
        Ok(client) => {
            let info = client.peer_info().map(|info| json_of(&*info));
            client.cancel().await?;
            bail!("a Discover client connected to the handshake-only fixture: {info:?}")
        }
    }
}
