//! The explore commands without a daemon, against real published servers (uvx
//! and npx) and the fixture by its configured name: JSON out, the upstream
//! stopped at the end, and hashes equal to the registry's fingerprints.

use std::process::Stdio;

use anyhow::{ensure, Context};
use plexus_tests::{fixture_upstream, plexus_binary, processes_matching};
use registry::fingerprint;
use registry::Kind;
use serde_json::Value;

const TIME: &str = "mcp+uvx://mcp-server-time@2026.10.19";
const EVERYTHING: &str = "mcp+npx://@modelcontextprotocol/server-everything@2026.8.31";

/// Runs `plexus <args>`: (exit code, stdout as JSON, stderr as JSON if it is).
async fn plexus(args: &[&str]) -> anyhow::Result<(i32, Value, Value)> {
    let output = tokio::process::Command::new(plexus_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // All of it (`--pretty` spans lines), else its last JSON line (after any log).
    let parsed = |text: &str| {
        serde_json::from_str::<Value>(text).ok().unwrap_or_else(|| {
            text.lines()
                .rev()
                .find_map(|line| serde_json::from_str::<Value>(line).ok())
                .unwrap_or(Value::Null)
        })
    };
    Ok((
        output.status.code().unwrap_or(-1),
        parsed(&stdout),
        parsed(&stderr),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uvx_server_is_explored_hashed_and_called_by_its_naked_uri() -> anyhow::Result<()> {
    // It counts the package's processes, which other tests start too.
    let _census = plexus_tests::PROCESS_CENSUS.lock().await;
    let (code, explored, _) = plexus(&["explore", TIME]).await?;
    ensure!(code == 0, "explore exit {code}");
    ensure!(
        explored["server"]["serverInfo"]["name"] == "mcp-time",
        "{explored}"
    );
    let tools = explored["tools"].as_array().context("tools")?;
    ensure!(
        tools.iter().any(|tool| tool["name"] == "get_current_time"),
        "{explored}"
    );

    let (code, schema, _) = plexus(&["schema", TIME, "get_current_time"]).await?;
    ensure!(
        code == 0 && schema["name"] == "get_current_time",
        "{schema}"
    );
    let (code, hashed, _) = plexus(&["hash", TIME]).await?;
    ensure!(code == 0, "hash exit {code}");
    let entry = hashed["entries"]["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["identity"] == "get_current_time"))
        .context("get_current_time hashed")?;
    // The printed hashes are the registry's fingerprint of the definition `schema` printed.
    let print = fingerprint::fingerprint(Kind::Tools, &schema).context("fingerprint")?;
    ensure!(entry["security"] == print.security.as_str(), "{entry}");
    ensure!(
        entry["compatibility"] == print.compatibility.as_str(),
        "{entry}"
    );
    // The same server twice: the same catalog fingerprint.
    let (_, again, _) = plexus(&["hash", TIME]).await?;
    ensure!(again["catalogFingerprint"] == hashed["catalogFingerprint"]);
    ensure!(hashed["catalogFingerprint"]
        .as_str()
        .is_some_and(|f| f.len() == 64));

    let (code, result, _) =
        plexus(&["call", TIME, "get_current_time", r#"{"timezone":"UTC"}"#]).await?;
    ensure!(code == 0, "call exit {code}");
    ensure!(result["structuredContent"]["timezone"] == "UTC", "{result}");
    // The seed's form: the tool and its arguments end the URI's query.
    let in_query = format!("{TIME}?tool=get_current_time&timezone=Europe%2FParis");
    let (code, result, _) = plexus(&["call", &in_query]).await?;
    ensure!(code == 0, "call exit {code}");
    ensure!(
        result["structuredContent"]["timezone"] == "Europe/Paris",
        "{result}"
    );
    ensure!(
        processes_matching("mcp-server-time@2026.10.19").is_empty(),
        "the upstream outlived the command"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_npx_server_and_a_configured_upstream_are_explored() -> anyhow::Result<()> {
    let (code, explored, _) = plexus(&["explore", EVERYTHING, "--pretty"]).await?;
    ensure!(code == 0, "explore exit {code}");
    ensure!(
        explored["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|tool| tool["name"] == "echo")),
        "{explored}"
    );
    ensure!(explored["resourceTemplates"].is_array());
    let (code, result, _) = plexus(&["call", EVERYTHING, "echo", r#"{"message":"hi"}"#]).await?;
    ensure!(code == 0, "call exit {code}");
    ensure!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("hi")),
        "{result}"
    );

    // A configured upstream, by name.
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        fixture_upstream("alpha", "", &["--name", "explored-fixture"]),
    )?;
    let config = config.display().to_string();
    let (code, hashed, _) = plexus(&["hash", "alpha", "--config", &config]).await?;
    ensure!(code == 0, "hash exit {code}");
    ensure!(hashed["server"]["name"] == "explored-fixture", "{hashed}");
    ensure!(
        hashed["entries"]["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["identity"] == "add")),
        "{hashed}"
    );
    let (code, added, _) = plexus(&[
        "call",
        "alpha",
        "add",
        r#"{"a": 2, "b": 3}"#,
        "--config",
        &config,
    ])
    .await?;
    ensure!(code == 0, "{added}");
    ensure!(added.to_string().contains('5'), "{added}");

    // Errors are JSON on stderr with a non-zero exit.
    let (code, _, error) = plexus(&["schema", "alpha", "nope", "--config", &config]).await?;
    ensure!(code == 1, "exit {code}");
    ensure!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.contains("no tool `nope`")),
        "{error}"
    );
    let (code, _, error) = plexus(&["explore", "missing", "--config", &config]).await?;
    ensure!(code == 1 && error["target"] == "missing", "{error}");
    let (code, _, error) = plexus(&["explore", "mcp+nope://thing"]).await?;
    ensure!(code == 1 && error["error"].is_string(), "{error}");
    let (code, _, error) = plexus(&["call", "alpha", "add", "[1]", "--config", &config]).await?;
    ensure!(code == 1 && error["error"].is_string(), "{error}");
    ensure!(
        processes_matching("--name explored-fixture").is_empty(),
        "the fixture outlived the commands"
    );
    Ok(())
}
