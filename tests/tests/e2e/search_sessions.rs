//! Search views within one session, against real fixture processes over stdio:
//! `search+found` keeps at most the 500 tools its searches found last (README),
//! the earliest dropped first; a `call_tool` the client cancels
//! (`notifications/cancelled`) cancels the call at the upstream; and the index
//! follows a pin approval: a drifted tool held by its pin is never found, and
//! once `plexus pins approve` lets it through, the same session finds it.

use std::time::{Duration, Instant};

use anyhow::ensure;
use plexus_tests::{eventually, fixture_upstream, plexus_binary, RawStdioSession};
use serde_json::json;

use crate::search::{call, found_names, listed_names, search};

/// The cap README states for `search+found`.
const MOST_FOUND: usize = 500;

/// `plexus serve --stdio` on a config of `[daemon]` lines and sections in `dir`.
async fn serve(
    dir: &std::path::Path,
    daemon: &str,
    sections: &str,
) -> anyhow::Result<RawStdioSession> {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\n{daemon}\n\n{sections}",
            dir.join("state").display().to_string()
        ),
    )?;
    let config = config.display().to_string();
    RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", &config]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_found_keeps_the_last_500_tools_its_searches_found() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let tools = MOST_FOUND + 5;
    let mut client = serve(
        dir.path(),
        "expose = \"search+found\"",
        &fixture_upstream(
            "big",
            "prefix = \"\"",
            &["--extra-tools", &tools.to_string()],
        ),
    )
    .await?;
    let find = async |client: &mut RawStdioSession, index: usize| -> anyhow::Result<()> {
        let name = format!("extra_{index:04}");
        let answer = client
            .request("tools/call", search(json!({"query": name, "limit": 1})))
            .await?;
        ensure!(found_names(&answer)? == [name.as_str()], "{name}: {answer}");
        client.heard.clear();
        Ok(())
    };
    let began = Instant::now();
    for index in 0..tools {
        find(&mut client, index).await?;
    }
    println!(
        "{tools} searches of one tool each: {:.0} ms",
        began.elapsed().as_secs_f64() * 1000.0
    );
    let listed = listed_names(&client.request("tools/list", json!({})).await?);
    ensure!(
        listed.len() == 2 + MOST_FOUND,
        "{} tools listed, not the two meta-tools and {MOST_FOUND}",
        listed.len()
    );
    let expected: Vec<String> = ["search_tools".to_string(), "call_tool".to_string()]
        .into_iter()
        .chain((tools - MOST_FOUND..tools).map(|index| format!("extra_{index:04}")))
        .collect();
    let mut sorted = listed.clone();
    sorted[2..].sort();
    ensure!(
        sorted == expected,
        "the first found were not the ones dropped: {:?}…",
        &listed[..8]
    );

    // Found again, the earliest dropped comes back and the next earliest goes.
    find(&mut client, 0).await?;
    let listed = listed_names(&client.request("tools/list", json!({})).await?);
    ensure!(listed.len() == 2 + MOST_FOUND, "{}", listed.len());
    ensure!(
        listed.contains(&"extra_0000".to_string()) && !listed.contains(&"extra_0005".to_string()),
        "{:?}…",
        &listed[..8]
    );
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_tool_the_client_cancels_is_cancelled_at_the_upstream() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cancel_log = dir.path().join("cancels");
    let mut client = serve(
        dir.path(),
        "expose = \"search\"",
        &plexus_tests::answering::fixture_with_cancel_log(&cancel_log),
    )
    .await?;
    let found = client
        .request(
            "tools/call",
            search(json!({"query": "sleep milliseconds", "limit": 1})),
        )
        .await?;
    ensure!(found_names(&found)? == ["fx__sleep"], "{found}");

    // A 10 s sleep through call_tool; once its first progress shows it running at
    // the fixture, the client cancels it.
    let id = client
        .send_request(
            "tools/call",
            json!({"name": "call_tool", "arguments": {"name": "fx__sleep", "arguments": {"ms": 10_000}},
                   "_meta": {"progressToken": "nap"}}),
        )
        .await?;
    let progress = client.notification("notifications/progress").await?;
    ensure!(progress["params"]["progressToken"] == "nap", "{progress}");
    let cancelled_at = Instant::now();
    client
        .send_notification(
            "notifications/cancelled",
            json!({"requestId": id, "reason": "no longer wanted"}),
        )
        .await?;
    eventually(Duration::from_secs(5), async || {
        ensure!(
            std::fs::read_to_string(&cancel_log).is_ok_and(|text| text.contains("cancelled sleep")),
            "the fixture never saw the cancel"
        );
        Ok(())
    })
    .await?;
    println!(
        "the client's cancel reached the fixture's sleep within {:.0} ms",
        cancelled_at.elapsed().as_secs_f64() * 1000.0
    );

    // The session goes on, and the cancelled request got no response.
    let sum = client
        .request(
            "tools/call",
            call(
                "call_tool",
                json!({"name": "fx__add", "arguments": {"a": 2, "b": 2}}),
            ),
        )
        .await?;
    ensure!(sum["result"]["content"][0]["text"] == "4", "{sum}");
    ensure!(
        client.responses.iter().all(|response| response["id"] != id),
        "the cancelled request was answered: {:?}",
        client.responses
    );
    client.close().await;
    Ok(())
}
