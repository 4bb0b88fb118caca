//! The rest of the protocol through plexus with a real rmcp client that declares
//! sampling, elicitation and roots: server-to-client requests reach the calling
//! session and come back, log messages and resource updates reach the sessions
//! that asked, completions route by prompt, and two sessions sharing an upstream
//! never receive each other's traffic.

// The SDK marks the handshake-era sampling, roots and logging types deprecated in
// favour of 2026-07-28 forms; these tests exercise exactly those handshake-era paths.
#![allow(deprecated)]

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::answering::{
    call, eventually_len, exercise_common, fixture_with_cancel_log, wait_for_tool, AnsweringClient,
    AnsweringService,
};
use plexus_tests::{arguments, json_of, plexus_stdio_command, Daemon};
use rmcp::model::{CallToolRequestParams, SetLevelRequestParams, SubscribeRequestParams};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::json;

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";

type Client = AnsweringService;

fn everything_section(extra: &str) -> String {
    format!("[upstreams.everything]\nnpx = \"{EVERYTHING}\"\ninit_timeout = \"180s\"\n{extra}\n")
}

/// Every server-to-client request and notification kind, through one client
/// (`only_client`: the daemon's only one, as `serve --stdio` serves).
async fn exercise(
    client: &Client,
    handler: &AnsweringClient,
    cancel_log: &std::path::Path,
    only_client: bool,
) -> anyhow::Result<()> {
    exercise_common(client, handler, cancel_log).await?;

    // server-everything keeps the answer to its first roots request, which it sends
    // 350 ms after its start and plexus answers itself (no client is there yet); a
    // client arriving with roots has plexus tell it the roots changed, and it asks
    // again. When that second request came with no call of this client in flight
    // (a loaded machine), the list is refreshed while one is: the call's client
    // answers.
    let mut roots = call(client, "everything__get-roots-list", json!({})).await?;
    if !roots.to_string().contains(&handler.root()) {
        let asked = handler.roots_asked();
        let long = call(
            client,
            "everything__trigger-long-running-operation",
            // Long enough to still be in flight when a loaded machine's server asks.
            json!({"duration": 6, "steps": 3}),
        );
        let refresh = async {
            client.peer().notify_roots_list_changed().await?;
            plexus_tests::eventually(Duration::from_secs(10), async || {
                ensure!(handler.roots_asked() > asked, "not asked for roots");
                Ok(())
            })
            .await
        };
        let (long, refreshed) = tokio::join!(long, refresh);
        long?;
        refreshed?;
        roots = call(client, "everything__get-roots-list", json!({})).await?;
    }
    ensure!(roots.to_string().contains(&handler.root()), "{roots}");
    // After roots/list_changed it asks again with no call in flight. A daemon with
    // many clients cannot tell which one that is for, so plexus answers itself and
    // this client is not asked; the only client of `serve --stdio` is asked.
    let asked = handler.roots_asked();
    client.peer().notify_roots_list_changed().await?;
    if only_client {
        plexus_tests::eventually(Duration::from_secs(10), async || {
            ensure!(
                handler.roots_asked() > asked,
                "the only client was not asked for roots"
            );
            Ok(())
        })
        .await?;
    } else {
        // Nothing tells when plexus has answered the upstream's roots request
        // itself (server-everything does not always refresh its list at once, so
        // its list is no signal either): the client's silence is watched for a while.
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure!(
            handler.roots_asked() == asked,
            "the client was asked for roots outside any call of its own"
        );
    }

    // Log messages after setting a level, tagged with the upstream.
    client
        .peer()
        .set_level(serde_json::from_value::<SetLevelRequestParams>(
            json!({"level": "debug"}),
        )?)
        .await?;
    call(client, "everything__toggle-simulated-logging", json!({})).await?;
    ensure!(
        eventually_len(&handler.logs, Duration::from_secs(15)).await > 0,
        "no log message arrived"
    );
    let first_log = handler.logs.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    ensure!(
        first_log["logger"]
            .as_str()
            .is_some_and(|l| l.starts_with("everything")),
        "{first_log}"
    );
    call(client, "everything__toggle-simulated-logging", json!({})).await?;

    // Resource updates reach a subscriber, under the namespaced URI.
    let resources = client.list_all_resources().await?;
    let uri = resources
        .iter()
        .map(|r| r.uri.clone())
        .find(|uri| uri.starts_with("everything+"))
        .context("no everything resource")?;
    client
        .peer()
        .subscribe(SubscribeRequestParams::new(uri.clone()))
        .await?;
    call(client, "everything__toggle-subscriber-updates", json!({})).await?;
    ensure!(
        eventually_len(&handler.updates, Duration::from_secs(15)).await > 0,
        "no resource update arrived"
    );
    let updates = handler
        .updates
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    ensure!(updates.iter().all(|u| u == &uri), "{updates:?} for {uri}");
    call(client, "everything__toggle-subscriber-updates", json!({})).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_to_client_requests_and_notifications_over_http_and_stdio() -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    let sections = |cancel_log: &std::path::Path| {
        format!(
            "{}{}",
            everything_section(""),
            fixture_with_cancel_log(cancel_log)
        )
    };
    let daemon = Daemon::builder()
        .upstreams(sections(&logs.path().join("http")))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;

    let over_http = AnsweringClient::named("http-client");
    let http = over_http
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
        .await?;
    exercise(&http, &over_http, &logs.path().join("http"), false)
        .await
        .with_context(|| format!("over HTTP\n{}", daemon.log()))?;
    http.cancel().await?;

    let config = daemon.stdio_config(&sections(&logs.path().join("stdio")))?;
    let command = plexus_stdio_command(&config);
    let over_stdio = AnsweringClient::named("stdio-client");
    let stdio = over_stdio
        .clone()
        .serve(TokioChildProcess::new(command)?)
        .await?;
    exercise(&stdio, &over_stdio, &logs.path().join("stdio"), true)
        .await
        .context("over stdio")?;
    stdio.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Session A has a long call in flight while session B's call makes the shared
/// upstream sample: plexus cannot know whom to ask, so it refuses clearly; with
/// `share = "session"` each session has its own instance and B is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_on_one_shared_upstream_never_cross() -> anyhow::Result<()> {
    for (share, expect_sampled) in [("shared", false), ("session", true)] {
        let daemon = Daemon::builder()
            .upstreams(everything_section(&format!("share = \"{share}\"")))
            .start()
            .await?;
        let alice_handler = AnsweringClient::named("alice");
        let bob_handler = AnsweringClient::named("bob");
        let alice = alice_handler
            .clone()
            .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
            .await?;
        let bob = bob_handler
            .clone()
            .serve(StreamableHttpClientTransport::from_uri(daemon.url.clone()))
            .await?;
        wait_for_tool(&alice, "everything__trigger-long-running-operation").await?;

        let long = {
            let peer = alice.peer().clone();
            tokio::spawn(async move {
                let params =
                    CallToolRequestParams::new("everything__trigger-long-running-operation")
                        .with_arguments(arguments(json!({"duration": 4, "steps": 4})));
                peer.call_tool(params).await
            })
        };
        daemon.wait_for_in_flight("everything", 1).await?;
        let sampled = call(
            &bob,
            "everything__trigger-sampling-request",
            json!({"prompt": "who?", "maxTokens": 5}),
        )
        .await;
        let long = long.await??;
        ensure!(json_of(&long)["isError"] != true, "{}", json_of(&long));

        let alice_sampled = alice_handler
            .sampled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let bob_sampled = bob_handler
            .sampled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        ensure!(
            alice_sampled == 0,
            "alice was asked to sample for bob's call ({share})"
        );
        if expect_sampled {
            let sampled = sampled?;
            ensure!(sampled.to_string().contains("sampled by bob"), "{sampled}");
            ensure!(bob_sampled == 1);
        } else {
            // The upstream's sampling request was refused; bob learns why.
            let text = match sampled {
                Ok(result) => result.to_string(),
                Err(error) => error.to_string(),
            };
            ensure!(
                bob_sampled == 0,
                "bob was asked although plexus could not know ({share})"
            );
            ensure!(
                text.contains("client sessions") && text.contains("share"),
                "{text}"
            );
        }
        alice.cancel().await?;
        bob.cancel().await?;
        ensure!(daemon.stop().await?.success());
    }
    Ok(())
}

/// Task-augmented calls (2025-11-25): task ids come back namespaced by upstream, and
/// `tasks/get`, `tasks/list`, `tasks/result` and `tasks/cancel` route by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_namespaced_and_routed_by_id() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(everything_section(""))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    let mut session = plexus_tests::RawHttpSession::connect(&daemon.url).await?;
    let hello = session
        .request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tasks", "version": "1"}}),
        )
        .await?;
    ensure!(
        hello["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{hello}"
    );

    let start = |topic: &str| json!({"name": "everything__simulate-research-query", "arguments": {"topic": topic}, "task": {"ttl": 60000}});
    let created = session.request("tools/call", start("plexus")).await?;
    let task_id = created["result"]["task"]["taskId"]
        .as_str()
        .with_context(|| format!("no task in {created}"))?
        .to_string();
    ensure!(task_id.starts_with("everything:"), "{created}");

    let listed = session.request("tasks/list", json!({})).await?;
    ensure!(listed.to_string().contains(&task_id), "{listed}");
    // Every task is on that one page: a cursor is not one plexus issued.
    let paged = session
        .request("tasks/list", json!({"cursor": "Mg=="}))
        .await?;
    ensure!(paged["error"]["code"] == -32602, "{paged}");
    let first = session
        .request("tasks/list", json!({"cursor": null}))
        .await?;
    ensure!(first.to_string().contains(&task_id), "{first}");

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = session
            .request("tasks/get", json!({"taskId": task_id}))
            .await?;
        ensure!(status["result"]["taskId"] == task_id.as_str(), "{status}");
        match status["result"]["status"].as_str() {
            Some("completed") => break,
            Some("working") => {}
            other => anyhow::bail!("unexpected status {other:?}: {status}"),
        }
        ensure!(Instant::now() < deadline, "the task never completed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let result = session
        .request("tasks/result", json!({"taskId": task_id}))
        .await?;
    ensure!(
        result["result"]["content"]
            .as_array()
            .is_some_and(|c| !c.is_empty()),
        "{result}"
    );

    let second = session.request("tools/call", start("cancel me")).await?;
    let second_id = second["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let cancelled = session
        .request("tasks/cancel", json!({"taskId": second_id}))
        .await?;
    ensure!(
        cancelled["result"]["taskId"] == second_id.as_str(),
        "{cancelled}"
    );
    ensure!(cancelled["result"]["status"] == "cancelled", "{cancelled}");

    let unknown = session
        .request("tasks/get", json!({"taskId": "nowhere:1"}))
        .await?;
    ensure!(unknown["error"]["code"] == -32602, "{unknown}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// Two principals share one upstream, which lists every task it holds: each sees
/// and reaches only the tasks plexus handed to it; another's is unknown, as one
/// never created is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_sees_and_reaches_only_its_own_tasks() -> anyhow::Result<()> {
    const ALICE: &str = "alice-token-0123456789abcdef0123456789";
    const BOB: &str = "bob-token-0123456789abcdef0123456789abc";
    let daemon = Daemon::builder()
        .daemon(format!(
            "auth_tokens = {{ alice = \"{ALICE}\", bob = \"{BOB}\" }}"
        ))
        .upstreams(everything_section(""))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    let bearer = |token: &str| format!("Bearer {token}");
    let (alice_token, bob_token) = (bearer(ALICE), bearer(BOB));
    let mut alice =
        plexus_tests::RawHttpSession::connect_with(&daemon.url, &[("authorization", &alice_token)])
            .await?;
    let mut bob =
        plexus_tests::RawHttpSession::connect_with(&daemon.url, &[("authorization", &bob_token)])
            .await?;
    async fn start_task(session: &mut plexus_tests::RawHttpSession) -> anyhow::Result<String> {
        let start = json!({"name": "everything__simulate-research-query", "arguments": {"topic": "mine"}, "task": {"ttl": 60000}});
        let created = session.request("tools/call", start).await?;
        Ok(created["result"]["task"]["taskId"]
            .as_str()
            .with_context(|| format!("no task in {created}"))?
            .to_string())
    }
    let (alices, bobs) = (start_task(&mut alice).await?, start_task(&mut bob).await?);
    // Eleven more of alice's: the server lists ten tasks a page, so hers and bob's
    // are on several pages.
    let mut alices_all = vec![alices.clone()];
    for _ in 0..11 {
        alices_all.push(start_task(&mut alice).await?);
    }
    alices_all.sort();
    let (alices, bobs) = (&alices, &bobs);
    let bobs_all = vec![bobs.clone()];
    for (session, all, own, other) in [
        (&mut alice, &alices_all, alices, bobs),
        (&mut bob, &bobs_all, bobs, alices),
    ] {
        let listed = session.request("tasks/list", json!({})).await?;
        let mut listed_ids: Vec<String> = listed["result"]["tasks"]
            .as_array()
            .with_context(|| format!("{listed}"))?
            .iter()
            .filter_map(|task| task["taskId"].as_str().map(str::to_string))
            .collect();
        listed_ids.sort();
        ensure!(&listed_ids == all, "{listed}");
        let own_status = session.request("tasks/get", json!({"taskId": own})).await?;
        ensure!(
            own_status["result"]["taskId"] == own.as_str(),
            "{own_status}"
        );
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let refused = session.request(method, json!({"taskId": other})).await?;
            ensure!(
                refused["error"]["code"] == -32602
                    && refused["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("unknown task")),
                "{method} of another's task: {refused}"
            );
        }
    }
    // Neither refusal touched the other's task: it still finishes.
    let status = bob.request("tasks/result", json!({"taskId": bobs})).await?;
    ensure!(status["result"]["content"].is_array(), "{status}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}
