//! A 2026-07-28 client through plexus to the published servers: bridged to the
//! handshake-era filesystem and memory servers, and through to mcp-server-git in its
//! own 2026-07-28 era, each against the server called directly.

use std::path::Path;

use anyhow::{ensure, Context};
use plexus_tests::{answer_of, post_2026, RawStdioSession};
use serde_json::{json, Value};

use super::{exposed_uri, outcome, own_entries, same_entries, GIT};

/// `_meta` of a 2026-07-28 request made directly.
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    })
}

/// Every tool plexus lists to a session-less 2026-07-28 client, every page read.
async fn listed_tools(url: &str) -> anyhow::Result<Vec<Value>> {
    let mut tools = Vec::new();
    let mut params = json!({});
    for page in 0.. {
        let (status, listing, _) =
            answer_of(post_2026(url, json!(page), "tools/list", params, None).await?).await?;
        ensure!(status == 200, "{status} {listing}");
        let result = &listing["result"];
        tools.extend(
            result["tools"]
                .as_array()
                .with_context(|| format!("2026-07-28 tools/list: {listing}"))?
                .iter()
                .cloned(),
        );
        match result.get("nextCursor") {
            Some(cursor) if !cursor.is_null() => params = json!({"cursor": cursor}),
            _ => break,
        }
    }
    Ok(tools)
}

/// A 2026-07-28 client, session-less, bridged to the handshake-era filesystem
/// server: the same listing entries and the same result as the handshake client
/// directly, but for `resultType`.
pub(super) async fn client_bridged(
    url: &str,
    filesystem: &mut RawStdioSession,
    root: &Path,
    relayed_tools: &[Value],
) -> anyhow::Result<()> {
    let modern_tools = listed_tools(url).await?;
    same_entries(
        "filesystem: 2026-07-28 tools/list",
        &own_entries("filesystem", relayed_tools, "name")?,
        &own_entries("filesystem", &modern_tools, "name")?,
    )?;
    let arguments = json!({"path": root.join("files/alpha.txt")});
    let want = filesystem
        .request(
            "tools/call",
            json!({"name": "read_text_file", "arguments": arguments}),
        )
        .await?;
    let tool = "filesystem__read_text_file";
    let (status, got, _) = answer_of(
        post_2026(
            url,
            json!(2),
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
            Some(tool),
        )
        .await?,
    )
    .await?;
    ensure!(status == 200, "{status} {got}");
    let mut result = got["result"].clone();
    ensure!(
        result["resultType"] == "complete",
        "2026-07-28 tools/call: {got}"
    );
    if let Some(object) = result.as_object_mut() {
        object.remove("resultType");
    }
    ensure!(
        serde_json::to_string(&result)? == serde_json::to_string(&want["result"])?,
        "filesystem: 2026-07-28 read_text_file\n  directly:       {want}\n  through plexus: {got}"
    );
    Ok(())
}

/// A 2026-07-28 client through plexus to mcp-server-git in its 2026-07-28 era
/// (`git-modern`), against the same server called directly in that era.
pub(super) async fn client_to_modern_server(url: &str, root: &Path) -> anyhow::Result<()> {
    let repo = root.join("repo").display().to_string();
    let mut direct =
        RawStdioSession::start(Path::new("uvx"), &[GIT, "--repository", &repo]).await?;
    let discovered = direct
        .request("server/discover", json!({"_meta": meta()}))
        .await?;
    ensure!(
        discovered["result"]["supportedVersions"]
            .as_array()
            .is_some_and(|versions| versions.contains(&json!("2026-07-28"))),
        "mcp-server-git does not speak 2026-07-28: {discovered}"
    );
    let want = direct
        .request("tools/list", json!({"_meta": meta()}))
        .await?;
    let tools = want["result"]["tools"].as_array().context("tools")?;
    let modern_tools = listed_tools(url).await?;
    same_entries(
        "git-modern: 2026-07-28 tools/list",
        tools,
        &own_entries("git-modern", &modern_tools, "name")?,
    )?;
    let calls = [
        ("git_log", json!({"repo_path": repo, "max_count": 5})),
        (
            "git_show",
            json!({"repo_path": repo, "revision": "no-such-revision"}),
        ),
    ];
    for (id, (tool, arguments)) in (4..).zip(calls) {
        let want = direct
            .request(
                "tools/call",
                json!({"name": tool, "arguments": arguments, "_meta": meta()}),
            )
            .await?;
        let exposed = format!("git-modern__{tool}");
        let (status, got, _) = answer_of(
            post_2026(
                url,
                json!(id),
                "tools/call",
                json!({"name": exposed, "arguments": arguments}),
                Some(&exposed),
            )
            .await?,
        )
        .await?;
        ensure!(status == 200, "{status} {got}");
        // A result's serverInfo names the server the client talks to: plexus.
        let server_info = "io.modelcontextprotocol/serverInfo";
        ensure!(
            got["result"]["_meta"][server_info]["name"] == "plexus",
            "git-modern: 2026-07-28 {tool}: {got}"
        );
        let mut want = want;
        want["result"]["_meta"][server_info] = got["result"]["_meta"][server_info].clone();
        ensure!(
            outcome(&want)? == outcome(&got)?,
            "git-modern: 2026-07-28 {tool}\n  directly:       {want}\n  through plexus: {got}"
        );
    }
    direct.close().await;
    Ok(())
}

/// A 2026-07-28 client reading server-memory's graph, and a resource it does not
/// have, through plexus: the handshake-era server's own contents and error, but for
/// what that era adds (`resultType`, the cache hints) and the namespaced URI.
pub(super) async fn client_reads_bridged(
    url: &str,
    memory: &mut RawStdioSession,
) -> anyhow::Result<()> {
    for uri in ["memory://knowledge-graph", "memory://no-such-graph"] {
        let want = memory
            .request("resources/read", json!({"uri": uri}))
            .await?;
        let exposed = exposed_uri("memory", uri);
        let (_, mut got, _) = answer_of(
            post_2026(
                url,
                json!(5),
                "resources/read",
                json!({"uri": exposed}),
                Some(&exposed),
            )
            .await?,
        )
        .await?;
        if let Some(result) = got.get_mut("result").and_then(Value::as_object_mut) {
            ensure!(
                result.get("resultType") == Some(&json!("complete")),
                "{result:?}"
            );
            for added in ["resultType", "ttlMs", "cacheScope"] {
                result.remove(added);
            }
            for content in result
                .get_mut("contents")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                ensure!(content["uri"] == exposed.as_str(), "{content}");
                content["uri"] = json!(uri);
            }
        }
        ensure!(
            outcome(&want)? == outcome(&got)?,
            "memory: 2026-07-28 resources/read {uri}\n  directly:       {want}\n  through plexus: {got}"
        );
    }
    Ok(())
}
