//! Lazy upstreams (started on the first call, stopped when idle, listed from
//! their last-known catalog meanwhile) and per-session upstreams (one instance per
//! downstream session, stopped when the session ends).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::ensure;
use plexus_tests::{
    eventually, fixture_upstream, processes_matching, progress_is_not_spoofed, Daemon,
    RawHttpSession,
};
use serde_json::{json, Value};

/// Calls `mine__whoami` until the upstream (discovered, then started for this
/// session) answers with `name`; false if it never does.
async fn whoami_answers(session: &mut RawHttpSession, name: &str) -> anyhow::Result<bool> {
    for _ in 0..200 {
        let who = session
            .request(
                "tools/call",
                json!({"name": "mine__whoami", "arguments": {}}),
            )
            .await?;
        if who["result"]["content"][0]["text"] == name {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(false)
}

async fn state_of(daemon: &Daemon, upstream: &str) -> anyhow::Result<Value> {
    let (_, body) = daemon.admin_get("/readyz").await?;
    let readiness: Value = serde_json::from_str(&body)?;
    Ok(readiness["upstreams"][upstream].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_upstream_starts_on_demand_idles_out_and_stays_listed() -> anyhow::Result<()> {
    let lazy = fixture_upstream(
        "lazy",
        "start = \"lazy\"\nidle_timeout = \"1s\"",
        &["--name", "lazy-one"],
    );
    let daemon = Daemon::builder().upstreams(&lazy).start().await?;
    let running = || processes_matching("--name lazy-one").len();

    // With nothing known about it, it starts once to be listed, then idles out.
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let mut listed = false;
    for _ in 0..200 {
        let tools = session.request("tools/list", json!({})).await?;
        if tools.to_string().contains("lazy__whoami") {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        listed,
        "the lazy upstream was never listed\n{}",
        daemon.log()
    );
    // The process goes first; the state follows once the supervisor has reaped it.
    eventually(Duration::from_secs(10), async || {
        ensure!(running() == 0, "it did not idle out");
        ensure!(state_of(&daemon, "lazy").await? == "idle");
        Ok(())
    })
    .await?;

    // The first call starts it and is answered.
    let who = session
        .request(
            "tools/call",
            json!({"name": "lazy__whoami", "arguments": {}}),
        )
        .await?;
    ensure!(who["result"]["content"][0]["text"] == "lazy-one", "{who}");
    ensure!(running() == 1);
    eventually(Duration::from_secs(10), async || {
        ensure!(running() == 0, "it did not idle out again");
        Ok(())
    })
    .await?;

    // Restarted on the same state, the daemon lists it from disk without starting it.
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success());
    ensure!(dir.path().join("state/catalog/lazy.json").exists());
    let daemon = Daemon::builder().dir(dir).upstreams(&lazy).start().await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = session.request("tools/list", json!({})).await?;
    ensure!(tools.to_string().contains("lazy__whoami"), "{tools}");
    ensure!(state_of(&daemon, "lazy").await? == "idle");
    ensure!(running() == 0, "it was started without a call");
    let echo = session
        .request(
            "tools/call",
            json!({"name": "lazy__echo", "arguments": {"text": "woke"}}),
        )
        .await?;
    ensure!(echo["result"]["content"][0]["text"] == "woke", "{echo}");
    ensure!(daemon.stop().await?.success());
    ensure!(running() == 0);
    Ok(())
}

/// A last-known catalog large enough to be parsed on a thread of its own (64 KiB
/// and up) is listed after a restart exactly as it was before, its upstream not
/// started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_last_known_catalog_is_listed_as_before_after_a_restart() -> anyhow::Result<()> {
    let section = fixture_upstream(
        "big",
        "start = \"lazy\"\nidle_timeout = \"1s\"",
        &["--name", "big-one", "--extra-tools", "400"],
    );
    let daemon = Daemon::builder()
        .daemon("page_size = 1000")
        .upstreams(&section)
        .start()
        .await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let mut before = Value::Null;
    for _ in 0..200 {
        let tools = session.request("tools/list", json!({})).await?;
        if tools["result"]["tools"].as_array().map(Vec::len) == Some(406) {
            before = tools["result"]["tools"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(!before.is_null(), "never listed whole\n{}", daemon.log());

    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success());
    let kept = std::fs::metadata(dir.path().join("state/catalog/big.json"))?.len();
    ensure!(kept >= 64 * 1024, "the kept listing is only {kept} bytes");
    let daemon = Daemon::builder()
        .dir(dir)
        .daemon("page_size = 1000")
        .upstreams(&section)
        .start()
        .await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = session.request("tools/list", json!({})).await?;
    ensure!(
        tools["result"]["tools"] == before,
        "listed otherwise after the restart: {:.500}",
        tools.to_string()
    );
    ensure!(state_of(&daemon, "big").await? == "idle");
    ensure!(
        processes_matching("--name big-one").is_empty(),
        "it was started without a call"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_session_upstream_runs_one_instance_per_session() -> anyhow::Result<()> {
    let section = fixture_upstream("mine", "share = \"session\"", &["--name", "per-session"]);
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let running = || processes_matching("--name per-session").len();
    let mut first = RawHttpSession::connect(&daemon.url).await?;
    let mut second = RawHttpSession::connect(&daemon.url).await?;
    // The discovery run lists it and stops.
    let mut listed = false;
    for _ in 0..200 {
        if first
            .request("tools/list", json!({}))
            .await?
            .to_string()
            .contains("mine__whoami")
        {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(listed, "never listed\n{}", daemon.log());
    eventually(Duration::from_secs(10), async || {
        ensure!(running() == 0, "discovery instance left running");
        Ok(())
    })
    .await?;

    for session in [&mut first, &mut second] {
        let who = session
            .request(
                "tools/call",
                json!({"name": "mine__whoami", "arguments": {}}),
            )
            .await?;
        ensure!(
            who["result"]["content"][0]["text"] == "per-session",
            "{who}"
        );
    }
    ensure!(
        running() == 2,
        "expected one instance per session, found {}",
        running()
    );
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(
        metrics.contains(r#"plexus_upstream_session_instances{upstream="mine"} 2"#),
        "{metrics}"
    );

    // Ending a session stops its instance, and only its instance.
    let ended = reqwest::Client::new()
        .delete(&daemon.url)
        .header("mcp-session-id", first.session_id().unwrap_or_default())
        .send()
        .await?;
    ensure!(ended.status() == 204);
    eventually(Duration::from_secs(10), async || {
        ensure!(running() == 1, "instance of the ended session left running");
        Ok(())
    })
    .await?;
    let still = second
        .request(
            "tools/call",
            json!({"name": "mine__echo", "arguments": {"text": "mine"}}),
        )
        .await?;
    ensure!(still["result"]["content"][0]["text"] == "mine", "{still}");
    ensure!(daemon.stop().await?.success());
    ensure!(running() == 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_http_session_is_ended_with_its_instance() -> anyhow::Result<()> {
    let section = fixture_upstream(
        "mine",
        "share = \"session\"",
        &["--name", "abandoned-session"],
    );
    let daemon = Daemon::builder()
        .daemon("session_idle_timeout = \"600ms\"")
        .upstreams(&section)
        .start()
        .await?;
    let running = || processes_matching("--name abandoned-session").len();
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    ensure!(
        whoami_answers(&mut session, "abandoned-session").await?,
        "never answered\n{}",
        daemon.log()
    );
    // The instance that listed the catalog stops after listing; on a loaded machine
    // it may still be exiting as the session's own starts. The session stays busy
    // meanwhile (its idle timeout is 600 ms).
    eventually(Duration::from_secs(10), async || {
        ensure!(whoami_answers(&mut session, "abandoned-session").await?);
        ensure!(running() == 1, "{} instances running", running());
        Ok(())
    })
    .await?;
    // The client goes quiet without a DELETE.
    eventually(Duration::from_secs(10), async || {
        ensure!(running() == 0, "instance left running");
        Ok(())
    })
    .await?;
    let gone = reqwest::Client::new()
        .post(&daemon.url)
        .header("content-type", "application/json")
        .header("mcp-session-id", session.session_id().unwrap_or_default())
        .body(r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
        .send()
        .await?;
    ensure!(gone.status() == 404);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_session_upstream_takes_subscriptions_on_the_session_instance() -> anyhow::Result<()>
{
    let section = fixture_upstream(
        "mine",
        "share = \"session\"",
        &["--name", "subscribed-session", "--conformance"],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    ensure!(
        whoami_answers(&mut session, "subscribed-session").await?,
        "never answered\n{}",
        daemon.log()
    );
    let subscribed = session
        .request(
            "resources/subscribe",
            json!({"uri": "mine+test://watched-resource"}),
        )
        .await?;
    ensure!(subscribed["result"] == json!({}), "{subscribed}");
    let unsubscribed = session
        .request(
            "resources/unsubscribe",
            json!({"uri": "mine+test://watched-resource"}),
        )
        .await?;
    ensure!(unsubscribed["result"] == json!({}), "{unsubscribed}");
    ensure!(processes_matching("--name subscribed-session").len() == 1);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// What a per-session instance says on its own (a log message, a resource update)
/// reaches its own session alone: each session's process is its own, and its messages went to
/// every session that showed the upstream.
// Logging is deprecated (SEP-2577) but still served, and relayed.
#[allow(deprecated)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_session_instances_log_messages_reach_its_own_session_alone() -> anyhow::Result<()> {
    use plexus_tests::answering::{call, len_of, wait_for_tool, AnsweringClient};
    use rmcp::model::{LoggingLevel, SetLevelRequestParams};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let section = fixture_upstream(
        "mine",
        "share = \"session\"",
        &["--name", "private", "--conformance"],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let (alice, bob) = (
        AnsweringClient::named("alice"),
        AnsweringClient::named("bob"),
    );
    let transport = || StreamableHttpClientTransport::from_uri(daemon.url.clone());
    let alice_client = alice.clone().serve(transport()).await?;
    let bob_client = bob.clone().serve(transport()).await?;
    for client in [&alice_client, &bob_client] {
        client
            .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
            .await?;
        // Each has its own instance running.
        wait_for_tool(client, "mine__whoami").await?;
        call(client, "mine__whoami", json!({})).await?;
    }
    // Each call of the logging tool says three lines. A stray copy would come before
    // the lines of a later call on the same session (a session's messages keep their
    // order), so each session hearing a later call's lines is what the counts wait for.
    let heard = |logs: &Arc<Mutex<Vec<Value>>>, count: usize, who: &'static str| {
        let logs = logs.clone();
        async move {
            eventually(Duration::from_secs(10), async || {
                ensure!(
                    len_of(&logs) >= count,
                    "{who} heard {} lines",
                    len_of(&logs)
                );
                Ok(())
            })
            .await?;
            ensure!(
                len_of(&logs) == count,
                "{who} heard another instance's lines: {:?}",
                logs.lock().unwrap_or_else(|e| e.into_inner())
            );
            anyhow::Ok(())
        }
    };
    call(&alice_client, "mine__test_tool_with_logging", json!({})).await?;
    heard(&alice.logs, 3, "alice").await?;
    // bob's own call: his lines come after any stray copy of alice's.
    call(&bob_client, "mine__test_tool_with_logging", json!({})).await?;
    heard(&bob.logs, 3, "bob").await?;
    call(&alice_client, "mine__test_tool_with_logging", json!({})).await?;
    heard(&alice.logs, 6, "alice").await?;
    // Both subscribe to the same resource, each on their own instance: alice's
    // instance saying it changed is news to alice alone.
    let uri = "mine+test://watched-resource";
    for client in [&alice_client, &bob_client] {
        client
            .subscribe(rmcp::model::SubscribeRequestParams::new(uri))
            .await?;
    }
    let update = json!({"text": "x", "updated": "test://watched-resource"});
    call(&alice_client, "mine__echo", update.clone()).await?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            len_of(&alice.updates) == 1,
            "alice heard {} updates of her own instance",
            len_of(&alice.updates)
        );
        Ok(())
    })
    .await?;
    // bob's own instance's update comes after any stray copy of alice's.
    call(&bob_client, "mine__echo", update).await?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            len_of(&bob.updates) >= 1,
            "bob heard no update of his own instance"
        );
        Ok(())
    })
    .await?;
    ensure!(
        len_of(&bob.updates) == 1,
        "bob heard alice's instance's update: {:?}",
        bob.updates.lock().unwrap_or_else(|e| e.into_inner())
    );
    alice_client.cancel().await?;
    bob_client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// plexus's progress tokens are guessable (`plexus-<n>`), and each per-session
/// instance is a process of its own: one that names another session's call by its
/// token is the same upstream, but not the instance the call went to, and is not
/// heard. The victim sees its own progress alone, and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_session_instance_cannot_speak_into_another_sessions_call_by_its_progress_token(
) -> anyhow::Result<()> {
    let section = fixture_upstream("mine", "share = \"session\"", &["--name", "per-session"]);
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let mut victim = RawHttpSession::connect(&daemon.url).await?;
    let mut spoofer = RawHttpSession::connect(&daemon.url).await?;
    let mut listed = false;
    for _ in 0..200 {
        let tools = victim.request("tools/list", json!({})).await?;
        if tools.to_string().contains("mine__sleep") {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(listed, "never listed\n{}", daemon.log());
    // Each session's instance is running before the calls that matter.
    for session in [&mut victim, &mut spoofer] {
        let echo = session
            .request(
                "tools/call",
                json!({"name": "mine__echo", "arguments": {"text": "up"}}),
            )
            .await?;
        ensure!(echo["result"]["content"][0]["text"] == "up", "{echo}");
    }
    // The daemon's first progress token is `plexus-1`: the victim's call gets it.
    progress_is_not_spoofed(
        &daemon,
        "mine",
        &mut victim,
        "mine__sleep",
        &mut spoofer,
        "mine__sleep",
    )
    .await?;
    let log = daemon.log();
    ensure!(
        log.contains("or to another session's instance; dropped"),
        "{log}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
