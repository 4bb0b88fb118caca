//! Start-up that waits instead of failing: a session's first list waits for an
//! upstream that is still starting and has nothing cached, and a call to an
//! upstream that is starting waits for it within the call's deadline.

use std::time::{Duration, Instant};

use anyhow::ensure;
use plexus_tests::{
    fixture_binary, http_client, plexus_binary, Daemon, RawStdioSession, TestClient,
};
use serde_json::json;

/// The fixture, started `delay` seconds late (a cold `npx`/`uvx` install, in small).
fn late(name: &str, delay: &str) -> String {
    format!(
        "[upstreams.{name}]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep {delay}; exec {}\"]\n",
        fixture_binary().display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_list_waits_for_a_starting_upstream_and_later_lists_do_not() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(late("late", "1"))
        .start()
        .await?;
    let started = Instant::now();
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let tools = client.list_all_tools().await?;
    ensure!(
        tools.iter().any(|tool| tool.name == "late__echo"),
        "the first list did not wait for the starting upstream: {tools:?}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());

    // An upstream slower than first_list_wait joins later; the list answers in time.
    // The wait is long enough that a later list which waited again cannot be taken
    // for one that was merely slow on a busy machine.
    let daemon = Daemon::builder()
        .daemon("first_list_wait = \"2s\"")
        .upstreams(late("later", "6"))
        .start()
        .await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let started = Instant::now();
    let tools = client.list_all_tools().await?;
    let waited = started.elapsed();
    ensure!(tools.is_empty(), "{tools:?}");
    ensure!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let started = Instant::now();
    client.list_all_tools().await?;
    ensure!(
        started.elapsed() < Duration::from_secs(1),
        "a later list waited: {:?}",
        started.elapsed()
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_list_stops_waiting_when_the_start_fails() -> anyhow::Result<()> {
    // The upstream exits a second into its start: the list is answered then, woken
    // by the state change, not at the end of a 30 s first_list_wait.
    let daemon = Daemon::builder()
        .daemon("first_list_wait = \"30s\"")
        .upstreams("[upstreams.doomed]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep 1; exit 3\"]\n")
        .start()
        .await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let started = Instant::now();
    let tools = client.list_all_tools().await?;
    let waited = started.elapsed();
    println!("the first list waited {waited:?} for a start that failed");
    ensure!(tools.is_empty(), "{tools:?}");
    ensure!(waited < Duration::from_secs(15), "{waited:?}");
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_to_a_starting_upstream_waits_and_succeeds() -> anyhow::Result<()> {
    // A first run caches the catalog, as Claude Desktop's earlier launch would have.
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let config = dir.path().join("config.toml");
    let write = |section: String| {
        std::fs::write(
            &config,
            format!(
                "[daemon]\nstate_dir = {:?}\n\n{section}",
                state.display().to_string()
            ),
        )
    };
    write(late("late", "0"))?;
    let config_arg = config.display().to_string();
    let args = ["serve", "--stdio", "--config", &config_arg];
    let mut first = RawStdioSession::spawn(&plexus_binary(), &args).await?;
    let listed = first.request("tools/list", json!({})).await?;
    ensure!(listed.to_string().contains("late__echo"), "{listed}");
    first.close().await;
    plexus_tests::eventually(Duration::from_secs(10), async || {
        ensure!(
            state.join("catalog/late.json").exists(),
            "the catalog was not cached"
        );
        Ok(())
    })
    .await?;

    // Now the upstream takes two seconds to start; the client lists (from the cache)
    // and calls at once.
    write(late("late", "2"))?;
    let mut session = RawStdioSession::spawn(&plexus_binary(), &args).await?;
    let listed = session.request("tools/list", json!({})).await?;
    ensure!(
        listed.to_string().contains("late__echo"),
        "not listed from the cache: {listed}"
    );
    let started = Instant::now();
    let answer = session
        .request(
            "tools/call",
            json!({"name": "late__echo", "arguments": {"text": "first"}}),
        )
        .await?;
    ensure!(
        answer["result"]["content"][0]["text"] == "first",
        "the first call did not wait for the starting upstream: {answer}"
    );
    ensure!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    session.close().await;
    Ok(())
}

/// On a first run, with nothing cached, a call made before any list names a tool
/// no catalog has yet: it waits for that upstream's first listing (as a first list
/// does) and is served, over HTTP and the stdio front; so does a read of a resource
/// under its URI namespace. A name under an upstream that cannot start fails at
/// once with its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_call_before_any_listing_waits_for_its_upstream() -> anyhow::Result<()> {
    let broken = "[upstreams.broken]\ncommand = \"/nonexistent/plexus-upstream\"\n";
    let bare = format!("{}prefix = \"\"\n", late("bare", "1.5"));
    let sections = format!("{}\n{broken}\n{bare}", late("late", "1.5"));
    let call = json!({"name": "late__echo", "arguments": {"text": "first"}});
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    let stdio = daemon.stdio_config(&sections)?.display().to_string();
    let mut http = plexus_tests::RawHttpSession::connect(&daemon.url).await?;
    let mut served =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", &stdio]).await?;
    let started = Instant::now();
    let answers = [
        ("http", http.request("tools/call", call.clone()).await?),
        ("stdio", served.request("tools/call", call).await?),
    ];
    for (front, answer) in answers {
        ensure!(
            answer["result"]["content"][0]["text"] == "first",
            "{front}: the first call did not wait for its upstream: {answer}"
        );
    }
    // A front of its own on a state of its own: nothing cached.
    let fresh = tempfile::tempdir()?;
    let fresh_config = fresh.path().join("config.toml");
    std::fs::write(
        &fresh_config,
        format!(
            "[daemon]\nstate_dir = {:?}\n\n{sections}",
            fresh.path().join("state").display().to_string()
        ),
    )?;
    let fresh_config = fresh_config.display().to_string();
    let stdio_started = Instant::now();
    let mut reader = RawStdioSession::spawn(
        &plexus_binary(),
        &["serve", "--stdio", "--config", &fresh_config],
    )
    .await?;
    let read = reader
        .request("resources/read", json!({"uri": "late+fixture://text"}))
        .await?;
    ensure!(
        read["result"]["contents"][0]["uri"] == "late+fixture://text",
        "the first read did not wait for its upstream: {read}"
    );
    ensure!(stdio_started.elapsed() >= Duration::from_millis(700));
    reader.close().await;
    // An upstream without a prefix may expose any name: a name nothing routes
    // waits for it too.
    std::fs::remove_dir_all(fresh.path().join("state"))?;
    let mut bare_client = RawStdioSession::spawn(
        &plexus_binary(),
        &["serve", "--stdio", "--config", &fresh_config],
    )
    .await?;
    let echo = bare_client
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "bare"}}),
        )
        .await?;
    ensure!(
        echo["result"]["content"][0]["text"] == "bare",
        "the first call to an unprefixed upstream did not wait for it: {echo}"
    );
    bare_client.close().await;
    ensure!(
        started.elapsed() >= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let refused = http
        .request(
            "tools/call",
            json!({"name": "broken__echo", "arguments": {}}),
        )
        .await?;
    ensure!(
        refused["error"]["code"] == -33001 && refused["error"]["data"]["upstream"] == "broken",
        "{refused}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    served.close().await;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// `start_concurrency` bounds how many upstreams are starting at once: with two
/// slots, two upstreams that hang in `initialize` hold both and the rest are not
/// even spawned; a reload that raises the limit lets them start at once.
#[tokio::test]
async fn upstreams_start_as_many_at_a_time_as_start_concurrency_allows() -> anyhow::Result<()> {
    let tag = format!("slots-{}", std::process::id());
    let sections: String = (0..4)
        .map(|n| {
            plexus_tests::fixture_upstream(
                &format!("hang{n}"),
                "init_timeout = \"120s\"",
                &["--name", &format!("{tag}-{n}"), "--hang-initialize"],
            )
        })
        .collect();
    let daemon = Daemon::builder()
        .daemon("start_concurrency = 2")
        .upstreams(&sections)
        .start()
        .await?;
    let starting = || plexus_tests::processes_matching(&format!("{tag}-")).len();
    plexus_tests::eventually(Duration::from_secs(20), async || {
        ensure!(
            starting() == 2,
            "expected two upstreams starting, saw {}",
            starting()
        );
        Ok(())
    })
    .await?;
    // And no more while both slots stay taken. A spawn that should not happen has
    // no event to wait for (the daemon reports all four `starting`, waiting for a
    // slot or not), so the count is watched for half a second.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ensure!(starting() == 2, "a third upstream started: {}", starting());
    }
    let config = daemon.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        text.replace("start_concurrency = 2", "start_concurrency = 4"),
    )?;
    daemon.reload().await?;
    plexus_tests::eventually(Duration::from_secs(20), async || {
        ensure!(
            starting() == 4,
            "raising the limit should start the rest, saw {}",
            starting()
        );
        Ok(())
    })
    .await?;
    let status = daemon.stop().await?;
    ensure!(status.success(), "plexus exited with {status}");
    plexus_tests::eventually(Duration::from_secs(10), async || {
        ensure!(starting() == 0, "upstreams outlived the daemon");
        Ok(())
    })
    .await?;
    Ok(())
}
