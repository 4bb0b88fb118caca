//! A client that answers everything an upstream may ask (sampling, elicitation
//! in form and URL mode, roots) and records what it is told (log messages,
//! progress, resource updates), for end-to-end tests in either protocol era.

// The SDK marks sampling, roots and logging deprecated (SEP-2577); relaying them
// is exactly what these tests check.
#![allow(deprecated)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::ProtocolVersion;
use rmcp::model::{
    CallToolRequestParams, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    CustomNotification, ElicitRequestParams, ElicitResult, ElicitationAction, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ResourceUpdatedNotificationParam,
    Root, SamplingMessage,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ErrorData, RoleClient};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::{arguments, json_of};

#[derive(Clone)]
pub struct AnsweringClient {
    pub name: String,
    /// The revision it declares: `2025-11-25` unless made `modern`.
    pub version: &'static str,
    pub sampled: Arc<Mutex<Vec<Value>>>,
    pub logs: Arc<Mutex<Vec<Value>>>,
    pub updates: Arc<Mutex<Vec<String>>>,
    pub progress: Arc<Mutex<Vec<Value>>>,
    /// How often an upstream asked this client for its roots.
    pub roots_asked: Arc<AtomicUsize>,
    /// How many elicitations it was asked.
    pub elicitations_asked: Arc<AtomicUsize>,
    /// When set, each elicitation is answered only once a permit is added here: the
    /// client "thinks" until the test lets it answer.
    pub elicitation_gate: Option<Arc<Semaphore>>,
    /// The elicitation ids `notifications/elicitation/complete` named to it.
    pub elicitations_completed: Arc<Mutex<Vec<Value>>>,
}

pub type AnsweringService = RunningService<RoleClient, AnsweringClient>;

impl AnsweringClient {
    pub fn named(name: &str) -> AnsweringClient {
        AnsweringClient {
            name: name.to_string(),
            version: "2025-11-25",
            sampled: Arc::default(),
            logs: Arc::default(),
            updates: Arc::default(),
            progress: Arc::default(),
            roots_asked: Arc::default(),
            elicitations_asked: Arc::default(),
            elicitation_gate: None,
            elicitations_completed: Arc::default(),
        }
    }

    /// Declares 2026-07-28 (connect it with a discover lifecycle).
    pub fn modern(mut self) -> AnsweringClient {
        self.version = "2026-07-28";
        self
    }

    /// This client, made `modern`, as a 2026-07-28 client of the HTTP front at `url`
    /// (it discovers the revision rather than sending `initialize`).
    pub async fn connect_modern(&self, url: &str) -> anyhow::Result<AnsweringService> {
        let transport = StreamableHttpClientTransport::from_uri(url.to_string());
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        Ok(self
            .clone()
            .modern()
            .serve_with_lifecycle(transport, lifecycle)
            .await?)
    }

    /// The text its sampling answers carry.
    pub fn sampled_text(&self) -> String {
        format!("sampled by {}", self.name)
    }

    /// The root it lists.
    pub fn root(&self) -> String {
        format!("file:///roots/{}", self.name)
    }

    pub fn roots_asked(&self) -> usize {
        self.roots_asked.load(Ordering::SeqCst)
    }
}

/// How many entries `items` holds once it holds any, or after `within`.
pub async fn eventually_len<T>(items: &Arc<Mutex<Vec<T>>>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let len = items.lock().unwrap_or_else(|e| e.into_inner()).len();
        if len > 0 || Instant::now() > deadline {
            return len;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn len_of<T>(items: &Arc<Mutex<Vec<T>>>) -> usize {
    items.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// Calls a tool and returns its result as JSON.
pub async fn call(client: &AnsweringService, name: &str, args: Value) -> anyhow::Result<Value> {
    let params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments(args));
    Ok(json_of(&client.call_tool(params).await?))
}

/// Waits until the catalog lists `tool` (a cold `npx` start can take minutes).
pub async fn wait_for_tool(client: &AnsweringService, tool: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(240);
    while !client
        .list_all_tools()
        .await?
        .iter()
        .any(|t| t.name == tool)
    {
        anyhow::ensure!(Instant::now() < deadline, "{tool} never listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

impl ClientHandler for AnsweringClient {
    fn get_info(&self) -> ClientConfig {
        serde_json::from_value(json!({
            "protocolVersion": self.version,
            "capabilities": {
                "sampling": {"tools": {}},
                "elicitation": {"form": {}, "url": {}},
                "roots": {"listChanged": true},
            },
            "clientInfo": {"name": self.name, "version": "1"},
        }))
        .unwrap_or_default()
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.sampled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(json_of(&params));
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(self.sampled_text()),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.elicitations_asked.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.elicitation_gate {
            // Closed by no one: the error is unreachable, and answering then is harmless.
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        // Fill every requested field with a value of its type (URL mode has none).
        let request = json_of(&request);
        let mut content = serde_json::Map::new();
        if let Some(properties) = request["requestedSchema"]["properties"].as_object() {
            for (key, schema) in properties {
                let value = match (schema["enum"].get(0), schema["type"].as_str()) {
                    (Some(first), _) => first.clone(),
                    (None, Some("number" | "integer")) => json!(1),
                    (None, Some("boolean")) => json!(true),
                    _ => json!(format!("{} answered", self.name)),
                };
                content.insert(key.clone(), value);
            }
        }
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content)))
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.roots_asked.fetch_add(1, Ordering::SeqCst);
        Ok(ListRootsResult::new(vec![Root::new(self.root())]))
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(json_of(&params));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.updates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(params.uri);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(json_of(&params));
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        if notification.method == "notifications/elicitation/complete" {
            let id = notification
                .params
                .as_ref()
                .and_then(|params| params.get("elicitationId"))
                .cloned()
                .unwrap_or(Value::Null);
            self.elicitations_completed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(id);
        }
    }
}

/// What a client of either era does against the `everything` upstream
/// (@modelcontextprotocol/server-everything) and the `fx` fixture (with
/// `FIXTURE_CANCEL_LOG = cancel_log`) through plexus: sampling, elicitation in
/// form and URL mode, the fixture's `ask` for each kind, completion, progress and
/// cancellation. Roots, logging and subscriptions differ between eras and are
/// left to the caller.
pub async fn exercise_common(
    client: &AnsweringService,
    handler: &AnsweringClient,
    cancel_log: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::ensure;
    wait_for_tool(client, "everything__trigger-sampling-request").await?;
    let echoed = call(client, "fx__echo", json!({"text": "relayed"})).await?;
    ensure!(echoed["content"][0]["text"] == "relayed", "{echoed}");

    let sampled = call(
        client,
        "everything__trigger-sampling-request",
        json!({"prompt": "hello", "maxTokens": 20}),
    )
    .await?;
    ensure!(
        sampled.to_string().contains(&handler.sampled_text()),
        "{sampled}"
    );
    ensure!(eventually_len(&handler.sampled, Duration::from_secs(1)).await >= 1);

    let elicited = call(client, "everything__trigger-elicitation-request", json!({})).await?;
    ensure!(elicited.to_string().contains("accept"), "{elicited}");
    let by_url = call(
        client,
        "everything__trigger-url-elicitation",
        json!({"url": "https://example.com/consent"}),
    )
    .await?;
    ensure!(
        by_url.to_string().contains("completed the URL elicitation"),
        "{by_url}"
    );

    // The fixture asks on every call, so each kind reaches this client.
    for (kind, expected) in [
        ("sampling", handler.sampled_text()),
        ("elicitation", format!("accept:{} answered", handler.name)),
        ("roots", handler.root()),
    ] {
        let asked = call(client, "fx__ask", json!({ "kind": kind })).await?;
        ensure!(
            asked["content"][0]["text"] == expected.as_str(),
            "{kind}: {asked}"
        );
    }

    let completion = client
        .peer()
        .complete(serde_json::from_value(json!({
            "ref": {"type": "ref/prompt", "name": "everything__completable-prompt"},
            "argument": {"name": "department", "value": "Eng"},
        }))?)
        .await?;
    ensure!(
        json_of(&completion).to_string().contains("Engineering"),
        "{}",
        json_of(&completion)
    );

    // Progress arrives under the client's own token.
    let before = len_of(&handler.progress);
    let long = call(
        client,
        "everything__trigger-long-running-operation",
        json!({"duration": 1, "steps": 3}),
    )
    .await?;
    ensure!(long["isError"] != true, "{long}");
    crate::eventually(Duration::from_secs(2), async || {
        ensure!(
            len_of(&handler.progress) > before,
            "no progress reached the client"
        );
        Ok(())
    })
    .await?;

    // Cancellation: abandoning a call cancels it upstream; the client goes on.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        call(client, "fx__sleep", json!({"ms": 5000})),
    )
    .await;
    ensure!(abandoned.is_err(), "a 5 s sleep finished in 300 ms");
    crate::eventually(Duration::from_secs(5), async || {
        ensure!(
            std::fs::read_to_string(cancel_log).is_ok_and(|text| text.contains("cancelled sleep")),
            "the upstream never saw the cancel"
        );
        Ok(())
    })
    .await?;
    let after = call(client, "fx__echo", json!({"text": "after"})).await?;
    ensure!(after["content"][0]["text"] == "after", "{after}");
    Ok(())
}

/// The `fx` fixture section, writing the cancels it receives to `cancel_log`.
pub fn fixture_with_cancel_log(cancel_log: &std::path::Path) -> String {
    crate::fixture_upstream(
        "fx",
        &format!(
            "env = {{ FIXTURE_CANCEL_LOG = {:?} }}",
            cancel_log.display().to_string()
        ),
        &[],
    )
}
