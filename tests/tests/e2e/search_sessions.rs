//! Search views within one session, against real fixture processes over stdio:
//! `search+found` keeps at most the 500 tools its searches found last (README),
//! the earliest dropped first; a `call_tool` the client cancels
//! (`notifications/cancelled`) cancels the call at the upstream; and the index
//! follows a pin approval: a drifted tool held by its pin is never found, and
//! once `plexus pins approve` lets it through, the same session finds it.

use std::time::{Duration, Instant};

use anyhow::ensure;
use plexus_tests::{
    eventually, fixture_upstream, plexus_binary, Daemon, RawHttpSession, RawStdioSession,
};
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

/// `plexus pins ARGS --config DIR/config.toml`: exit code and output.
async fn pins(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<(i32, String)> {
    let output = tokio::process::Command::new(plexus_binary())
        .arg("pins")
        .args(args)
        .arg("--config")
        .arg(dir.join("config.toml"))
        .output()
        .await?;
    Ok((
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_tool_held_by_its_pin_is_found_once_approved() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    let daemon = Daemon::builder()
        .daemon("expose = \"search+found\"")
        .upstreams(fixture_upstream(
            "alpha",
            "",
            &["--drift-file", &drift_file.display().to_string()],
        ))
        .start()
        .await?;
    let mut client = RawHttpSession::connect(&daemon.url).await?;
    let query = search(json!({"query": "ssh id_rsa private key", "upstream": "alpha"}));
    let found = client.request("tools/call", query.clone()).await?;
    ensure!(
        !found_names(&found)?.contains(&"alpha__echo".to_string()),
        "{found}"
    );

    // echo's description turns into a rug pull: held by its pin, it is found by no
    // search, not even for its new words, nor listed, nor called.
    std::fs::write(&drift_file, "description")?;
    let echo = call(
        "call_tool",
        json!({"name": "alpha__echo", "arguments": {"text": "hi"}}),
    );
    eventually(Duration::from_secs(20), async || {
        let answer = client.request("tools/call", echo.clone()).await?;
        ensure!(
            answer["error"]["code"] == -33006,
            "echo was never held: {answer}"
        );
        Ok(())
    })
    .await?;
    for query in [
        query.clone(),
        search(json!({"query": "returns text unchanged"})),
    ] {
        let found = client.request("tools/call", query.clone()).await?;
        ensure!(
            !found_names(&found)?.contains(&"alpha__echo".to_string()),
            "{query}: a held tool was found: {found}"
        );
    }
    let listed = listed_names(&client.request("tools/list", json!({})).await?);
    ensure!(!listed.contains(&"alpha__echo".to_string()), "{listed:?}");

    // Approved, live: the same session finds it at once, with the new description.
    let (code, out) = pins(daemon.dir.path(), &["approve", "alpha/echo"]).await?;
    ensure!(
        code == 0 && out.contains("listed to connected clients now"),
        "{out}"
    );
    let found = client.request("tools/call", query).await?;
    let names = found_names(&found)?;
    ensure!(
        names.first().map(String::as_str) == Some("alpha__echo"),
        "approved but not found first: {found}"
    );
    ensure!(
        found["result"]["structuredContent"]["tools"][0]["description"]
            .as_str()
            .is_some_and(|text| text.contains("id_rsa")),
        "{found}"
    );
    let listed = listed_names(&client.request("tools/list", json!({})).await?);
    ensure!(listed.contains(&"alpha__echo".to_string()), "{listed:?}");
    let echoed = client.request("tools/call", echo).await?;
    ensure!(echoed["result"]["content"][0]["text"] == "hi", "{echoed}");
    Ok(())
}
