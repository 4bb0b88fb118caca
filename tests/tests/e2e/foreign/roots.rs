//! What published servers ask of their client and tell it, directly and through
//! plexus: server-filesystem narrowed to its client's roots (asked for at start and
//! again when they change), and server-memory announcing a change to a subscribed
//! resource (to a handshake-era subscriber and on a 2026-07-28 listen stream).

// The SDK marks roots and resources/subscribe deprecated in favour of the 2026-07-28
// forms; the published servers here still use them.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::answering::AnsweringClient;
use plexus_tests::{arguments, eventually, heard_on, json_of, Daemon, RawStdioSession};
use rmcp::model::{
    CallToolRequestParams, ClientConfig, ListRootsResult, ResourceUpdatedNotificationParam, Root,
    SubscribeRequestParams, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{json, Value};

use super::{exposed_uri, make_scenario, servers, start_directly};

/// A client that lists the one root it is given and records the resource updates
/// it hears.
#[derive(Clone, Default)]
struct RootedClient {
    root: Arc<Mutex<String>>,
    updates: Arc<Mutex<Vec<String>>>,
}

impl RootedClient {
    fn set_root(&self, uri: &str) {
        *self.root.lock().unwrap_or_else(|e| e.into_inner()) = uri.to_string();
    }

    /// The URIs of the updates heard so far.
    fn updates(&self) -> Vec<String> {
        self.updates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ClientHandler for RootedClient {
    fn get_info(&self) -> ClientConfig {
        serde_json::from_value(json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"roots": {"listChanged": true}},
            "clientInfo": {"name": "rooted", "version": "1"},
        }))
        .unwrap_or_default()
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let root = self.root.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(ListRootsResult::new(vec![Root::new(root)]))
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
}

/// The text of a `list_allowed_directories` result.
fn allowed(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The roots a raw client answers with.
fn roots_answer(uri: &str) -> impl Fn(&str) -> Value + '_ {
    move |method: &str| match method {
        "roots/list" => json!({"roots": [{"uri": uri}]}),
        _ => json!({}),
    }
}

/// Calls `list_allowed_directories` directly until it names `dir` (the server
/// asks for roots on its own time, so a call may come first).
async fn direct_allowed(
    direct: &mut RawStdioSession,
    uri: &str,
    dir: &str,
) -> anyhow::Result<Value> {
    let list = json!({"name": "list_allowed_directories", "arguments": {}});
    let mut got = Value::Null;
    for _ in 0..200 {
        got = direct
            .request_answering("tools/call", list.clone(), &roots_answer(uri))
            .await?;
        if allowed(&got["result"]).ends_with(dir) {
            return Ok(got["result"].clone());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("server-filesystem never took the root {uri}: {got}")
}

/// `list_allowed_directories` through plexus.
async fn relayed_allowed(
    service: &RunningService<RoleClient, RootedClient>,
) -> anyhow::Result<Value> {
    let params = CallToolRequestParams::new("filesystem__list_allowed_directories");
    Ok(json_of(&service.call_tool(params).await?))
}

/// How often server-filesystem has said what it made of roots it was given.
fn roots_taken(log: &str) -> usize {
    log.lines()
        .filter(|line| {
            line.contains("upstream=filesystem")
                && (line.contains("No valid root directories")
                    || line.contains("Updated allowed directories from MCP roots"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_servers_get_roots_and_send_updates_through_plexus_as_directly(
) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("scenario");
    make_scenario(&root)?;
    let servers = servers(&root);
    let (filesystem, memory) = (&servers[0], &servers[1]);
    // server-filesystem takes its client's roots as its allowed directories: one
    // instance per client session, so the roots it asks for are its one client's.
    let sections = format!(
        "[upstreams.filesystem]\n{}share = \"session\"\ninit_timeout = \"180s\"\n\n[upstreams.memory]\n{}init_timeout = \"180s\"\n",
        filesystem.section, memory.section
    );
    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(sections)
        .start()
        .await?;
    let uri_of = |dir: &str| format!("file://{}", root.join("files").join(dir).display());
    let (notes, more) = (uri_of("notes"), uri_of("more"));

    // Directly: the roots at start, then changed.
    let (mut direct, _) = start_directly(filesystem, &root).await?;
    direct
        .initialize(json!({"roots": {"listChanged": true}}))
        .await?;
    let want_first = direct_allowed(&mut direct, &notes, "notes").await?;
    direct
        .send_notification("notifications/roots/list_changed", json!({}))
        .await?;
    let want = direct_allowed(&mut direct, &more, "more").await?;

    // Through plexus: the session's instance starts on its first call and asks for
    // roots then; when they change, it asks again with no call in flight.
    daemon.wait_ready(Duration::from_secs(180)).await?;
    let client = RootedClient::default();
    client.set_root(&notes);
    let service = client
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    let got_first = eventually(Duration::from_secs(30), async || {
        let got = relayed_allowed(&service).await?;
        ensure!(allowed(&got).ends_with("notes"), "{got}");
        Ok(got)
    })
    .await;
    ensure!(
        got_first.as_ref().ok() == Some(&want_first),
        "roots at start\n  directly:       {want_first}\n  through plexus: {got_first:?}\n{}",
        daemon.log()
    );
    let taken = roots_taken(&daemon.log());
    client.set_root(&more);
    service.notify_roots_list_changed().await?;
    // No call in flight until the upstream has asked and taken what it was given.
    eventually(Duration::from_secs(20), async || {
        ensure!(roots_taken(&daemon.log()) > taken, "roots not asked again");
        Ok(())
    })
    .await?;
    let got = relayed_allowed(&service).await?;
    ensure!(
        serde_json::to_string(&got)? == serde_json::to_string(&want)?,
        "changed roots\n  directly:       {want}\n  through plexus: {got}\n{}",
        daemon.log()
    );

    // Outside the roots now: the same refusal on both sides.
    let outside = json!({"path": root.join("files/alpha.txt")});
    let want = direct
        .request_answering(
            "tools/call",
            json!({"name": "read_text_file", "arguments": outside}),
            &roots_answer(&more),
        )
        .await?;
    let got = json_of(
        &service
            .call_tool(
                CallToolRequestParams::new("filesystem__read_text_file")
                    .with_arguments(arguments(outside.clone())),
            )
            .await?,
    );
    ensure!(want["result"]["isError"] == true, "{want}");
    ensure!(
        serde_json::to_string(&got)? == serde_json::to_string(&want["result"])?,
        "read outside the roots\n  directly:       {want}\n  through plexus: {got}"
    );
    direct.close().await;

    // Subscribed to the memory graph, a change to it is announced on both sides.
    let (mut direct, _) = start_directly(memory, &root).await?;
    let uri = "memory://knowledge-graph";
    let subscribed = direct
        .request("resources/subscribe", json!({"uri": uri}))
        .await?;
    ensure!(subscribed.get("result").is_some(), "{subscribed}");
    let entities =
        json!({"entities": [{"name": "Ada", "entityType": "person", "observations": []}]});
    direct
        .request(
            "tools/call",
            json!({"name": "create_entities", "arguments": entities}),
        )
        .await?;
    let heard: Vec<&Value> = direct
        .heard
        .iter()
        .filter(|message| message["method"] == "notifications/resources/updated")
        .collect();
    ensure!(
        heard.len() == 1 && heard[0]["params"]["uri"] == uri,
        "directly, after a change: {:?}",
        direct.heard
    );
    direct.close().await;
    let exposed = exposed_uri("memory", uri);
    service
        .subscribe(SubscribeRequestParams::new(exposed.clone()))
        .await?;
    service
        .call_tool(
            CallToolRequestParams::new("memory__create_entities")
                .with_arguments(arguments(entities)),
        )
        .await?;
    eventually(Duration::from_secs(10), async || {
        let updates = client.updates();
        ensure!(
            updates == vec![exposed.clone()],
            "through plexus, after a change: {updates:?}"
        );
        Ok(())
    })
    .await?;

    // A 2026-07-28 client listening for the same resource hears the next change,
    // made by the handshake-era client, on its listen stream.
    let modern = AnsweringClient::named("listener")
        .connect_modern(&daemon.url)
        .await?;
    let mut filter = SubscriptionFilter::new();
    filter.resource_subscriptions = Some(vec![exposed.clone()]);
    let mut subscription = modern.peer().listen(filter).await?;
    ensure!(
        subscription.acknowledged().resource_subscriptions == Some(vec![exposed.clone()]),
        "{:?}",
        subscription.acknowledged()
    );
    let more = json!({"observations": [{"entityName": "Ada", "contents": ["listened to"]}]});
    service
        .call_tool(
            CallToolRequestParams::new("memory__add_observations").with_arguments(arguments(more)),
        )
        .await?;
    let heard = heard_on(
        &mut subscription,
        Duration::from_secs(15),
        plexus_tests::updated_uri,
    )
    .await
    .context("no update on the 2026-07-28 listen stream")?;
    ensure!(heard == exposed, "{heard} for {exposed}");
    // The subscriber hears that change once too, as it would directly.
    eventually(Duration::from_secs(10), async || {
        let updates = client.updates();
        ensure!(
            updates == vec![exposed.clone(), exposed.clone()],
            "through plexus, after two changes: {updates:?}"
        );
        Ok(())
    })
    .await?;
    drop(subscription);
    modern.cancel().await?;
    service.cancel().await?;
    println!(
        "foreign servers, roots and updates: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
