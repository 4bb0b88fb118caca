//! plexus in front of published MCP servers written elsewhere (server-filesystem,
//! server-memory, server-sequential-thinking via npx; mcp-server-git via uvx), each
//! compared with the same server called directly over stdio: the capabilities
//! relayed, every listing entry field by field once the namespace is removed, and
//! the results of real calls, tool errors included. Both sides are raw JSON-RPC, so
//! what is compared is exactly what went over the wire. One daemon fronts all four.
//! What the servers ask of their client and tell it: `roots.rs`; a 2026-07-28
//! client's view: `modern.rs`.

use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::{Daemon, RawHttpSession, RawStdioSession};
use serde_json::{json, Value};

mod modern;
mod roots;

const FILESYSTEM: &str = "@modelcontextprotocol/server-filesystem@2026.8.31";
const MEMORY: &str = "@modelcontextprotocol/server-memory@2026.8.31";
const THINKING: &str = "@modelcontextprotocol/server-sequential-thinking@2026.8.31";
const GIT: &str = "mcp-server-git@2026.10.19";

/// A JSON-RPC peer: the server directly over stdio, or plexus over HTTP.
trait Peer {
    fn call(&mut self, method: &str, params: Value) -> impl Future<Output = anyhow::Result<Value>>;
}

impl Peer for RawStdioSession {
    fn call(&mut self, method: &str, params: Value) -> impl Future<Output = anyhow::Result<Value>> {
        self.request(method, params)
    }
}

impl Peer for RawHttpSession {
    fn call(&mut self, method: &str, params: Value) -> impl Future<Output = anyhow::Result<Value>> {
        self.request(method, params)
    }
}

/// Every entry of a listing over all its pages, or None when the peer answers
/// the method with an error (it does not offer it).
async fn list_all(
    peer: &mut impl Peer,
    method: &str,
    key: &str,
) -> anyhow::Result<Option<Vec<Value>>> {
    let mut entries = Vec::new();
    let mut cursor: Option<Value> = None;
    loop {
        let params = match &cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        };
        let response = peer.call(method, params).await?;
        if response.get("error").is_some() {
            return Ok(None);
        }
        let page = &response["result"];
        entries.extend(
            page[key]
                .as_array()
                .with_context(|| format!("{method}: {response}"))?
                .iter()
                .cloned(),
        );
        match page.get("nextCursor") {
            Some(next) if !next.is_null() => cursor = Some(next.clone()),
            _ => return Ok(Some(entries)),
        }
    }
}

/// One published server: how to start it directly, its upstream section, the
/// calls compared (tool, arguments) and the resources read.
struct Server {
    upstream: &'static str,
    program: &'static str,
    args: Vec<String>,
    section: String,
    calls: Vec<(&'static str, Value)>,
    reads: Vec<&'static str>,
}

/// The URI namespace of an upstream (its prefix made scheme-safe; these are already).
fn exposed_uri(upstream: &str, uri: &str) -> String {
    format!("{upstream}+{uri}")
}

/// The entries of plexus's listing that belong to `upstream`, with its namespace
/// removed from the field that carries it.
fn own_entries(upstream: &str, entries: &[Value], field: &str) -> anyhow::Result<Vec<Value>> {
    let marker = match field {
        "name" => format!("{upstream}__"),
        _ => format!("{upstream}+"),
    };
    let mut own = Vec::new();
    for entry in entries {
        let exposed = entry[field]
            .as_str()
            .with_context(|| format!("no {field}: {entry}"))?;
        if let Some(original) = exposed.strip_prefix(&marker) {
            let mut entry = entry.clone();
            entry[field] = json!(original);
            own.push(entry);
        }
    }
    Ok(own)
}

/// Fails with every entry that differs, as the two sides wrote it.
fn same_entries(what: &str, direct: &[Value], relayed: &[Value]) -> anyhow::Result<()> {
    let text = |entries: &[Value]| -> Vec<String> {
        entries.iter().map(|entry| entry.to_string()).collect()
    };
    let (direct, relayed) = (text(direct), text(relayed));
    if direct == relayed {
        return Ok(());
    }
    let mut report = format!(
        "{what}: {} entries directly, {} through plexus\n",
        direct.len(),
        relayed.len()
    );
    for (index, entry) in direct.iter().enumerate() {
        if relayed.get(index) != Some(entry) {
            report += &format!(
                "  directly:      {entry}\n  through plexus: {}\n",
                relayed.get(index).map_or("(none)", String::as_str)
            );
        }
    }
    for extra in relayed.iter().skip(direct.len()) {
        report += &format!("  only through plexus: {extra}\n");
    }
    bail!(report)
}

/// The part of a response two runs must share: the result, or the error's code
/// and message.
fn outcome(response: &Value) -> anyhow::Result<String> {
    if let Some(result) = response.get("result") {
        return Ok(result.to_string());
    }
    let error = response
        .get("error")
        .with_context(|| format!("neither result nor error: {response}"))?;
    Ok(json!({"code": error["code"], "message": error["message"]}).to_string())
}

/// A file tree, a git repository with two commits and an unstaged change, and a
/// knowledge-graph file per side.
fn make_scenario(root: &Path) -> anyhow::Result<()> {
    let files = root.join("files");
    std::fs::create_dir_all(files.join("notes"))?;
    std::fs::write(files.join("alpha.txt"), "alpha\nsecond line\n")?;
    std::fs::write(files.join("notes/beta.md"), "# Beta\n\nunder notes/\n")?;
    std::fs::write(files.join("gamma.json"), "{\"k\": [1, 2, 3]}\n")?;
    std::fs::create_dir_all(files.join("more"))?;
    std::fs::write(files.join("more/delta.txt"), "delta\n")?;
    // Text a relay could mangle: escapes, line separators, astral characters,
    // bytes that are not UTF-8, over 2 MB in all (plexus passes large results on unread).
    let mut tricky = b"quote \" backslash \\ tab\t nul\0 bell\x07 \xe2\x80\xa8 \xf0\x9d\x84\x9e caf\xc3\xa9 \xff\xfe bad\n".to_vec();
    tricky.extend(
        "line with \u{1F600} and \u{2029}, repeated to make the file large\n"
            .repeat(30_000)
            .as_bytes(),
    );
    std::fs::write(files.join("tricky.txt"), tricky)?;
    // A 1x1 PNG, for a result with an image block.
    std::fs::write(
        files.join("pixel.png"),
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\rIDATx\x9cc\xf8\x0f\0\0\x01\x01\0\x05\x18\xd8N\0\0\0\0IEND\xaeB`\x82",
    )?;
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo)?;
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let status = Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_AUTHOR_NAME", "Ada")
            .env("GIT_AUTHOR_EMAIL", "ada@example.org")
            .env("GIT_COMMITTER_NAME", "Ada")
            .env("GIT_COMMITTER_EMAIL", "ada@example.org")
            .env("GIT_AUTHOR_DATE", "2026-01-02T03:04:05Z")
            .env("GIT_COMMITTER_DATE", "2026-01-02T03:04:05Z")
            .status()
            .context("running git")?;
        ensure!(status.success(), "git {args:?}: {status}");
        Ok(())
    };
    git(&["init", "-q", "-b", "main"])?;
    std::fs::write(repo.join("README"), "first\n")?;
    git(&["add", "README"])?;
    git(&["commit", "-q", "-m", "first commit"])?;
    std::fs::write(repo.join("README"), "first\nsecond\n")?;
    git(&["commit", "-q", "-a", "-m", "second commit"])?;
    std::fs::write(repo.join("README"), "first\nsecond\nthird, unstaged\n")?;
    Ok(())
}

/// What both sides write through server-filesystem, last through plexus: the file
/// must hold exactly this afterwards (a relay that changed it would be read back
/// the same way by both sides).
fn large_text() -> String {
    "caf\u{e9} \u{1F600} \"q\" \\ \u{2028}\n".repeat(200)
}

fn servers(root: &Path) -> Vec<Server> {
    let files = root.join("files").display().to_string();
    let repo = root.join("repo").display().to_string();
    let file = |name: &str| format!("{files}/{name}");
    vec![
        Server {
            upstream: "filesystem",
            program: "npx",
            args: vec!["-y".into(), FILESYSTEM.into(), files.clone()],
            section: format!("npx = \"{FILESYSTEM}\"\nargs = [{files:?}]\n"),
            calls: vec![
                ("list_allowed_directories", json!({})),
                ("list_directory", json!({"path": files})),
                ("read_text_file", json!({"path": file("alpha.txt")})),
                (
                    "read_text_file",
                    json!({"path": file("alpha.txt"), "head": 1}),
                ),
                (
                    "read_multiple_files",
                    json!({"paths": [file("gamma.json"), file("notes/beta.md")]}),
                ),
                ("directory_tree", json!({"path": files})),
                ("search_files", json!({"path": files, "pattern": "*.md"})),
                (
                    "write_file",
                    json!({"path": file("written.txt"), "content": "written through a test\n"}),
                ),
                ("read_text_file", json!({"path": file("written.txt")})),
                // Arguments of 1 KiB and more are passed on unread.
                (
                    "write_file",
                    json!({"path": file("large.txt"), "content": large_text()}),
                ),
                (
                    "read_text_file",
                    json!({"path": file("large.txt"), "head": 2}),
                ),
                (
                    "edit_file",
                    json!({"path": file("written.txt"), "edits": [{"oldText": "test", "newText": "check"}], "dryRun": true}),
                ),
                ("read_text_file", json!({"path": file("tricky.txt")})),
                (
                    "read_text_file",
                    json!({"path": file("tricky.txt"), "tail": 3}),
                ),
                ("read_media_file", json!({"path": file("pixel.png")})),
                // Outside the allowed directory: the server's own tool error.
                ("read_text_file", json!({"path": "/etc/hostname"})),
                // Arguments the schema refuses.
                ("read_text_file", json!({"path": 7})),
            ],
            reads: vec![],
        },
        Server {
            upstream: "memory",
            program: "npx",
            args: vec!["-y".into(), MEMORY.into()],
            section: format!(
                "npx = \"{MEMORY}\"\nenv = {{ MEMORY_FILE_PATH = {:?} }}\n",
                root.join("memory-plexus.jsonl").display().to_string()
            ),
            calls: vec![
                (
                    "create_entities",
                    json!({"entities": [
                        {"name": "Ada", "entityType": "person", "observations": ["writes programs"]},
                        {"name": "Engine", "entityType": "machine", "observations": ["analytical"]},
                    ]}),
                ),
                (
                    "create_relations",
                    json!({"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]}),
                ),
                (
                    "add_observations",
                    json!({"observations": [{"entityName": "Ada", "contents": ["born 1815"]}]}),
                ),
                ("read_graph", json!({})),
                ("search_nodes", json!({"query": "analytical"})),
                ("open_nodes", json!({"names": ["Ada"]})),
                (
                    "add_observations",
                    json!({"observations": [{"entityName": "Nobody", "contents": ["x"]}]}),
                ),
            ],
            reads: vec!["memory://knowledge-graph", "memory://no-such-graph"],
        },
        Server {
            upstream: "git",
            program: "uvx",
            args: vec![GIT.into(), "--repository".into(), repo.clone()],
            // The handshake era, as the direct client speaks: in the 2026-07-28 era
            // this server writes its schemas' members in another order (compared
            // in that era in `modern::client_to_modern_server`).
            section: format!(
                "uvx = \"{GIT}\"\nargs = [\"--repository\", {repo:?}]\nprotocol = \"handshake\"\n"
            ),
            calls: vec![
                ("git_status", json!({"repo_path": repo})),
                ("git_log", json!({"repo_path": repo, "max_count": 5})),
                ("git_diff_unstaged", json!({"repo_path": repo})),
                ("git_show", json!({"repo_path": repo, "revision": "HEAD"})),
                (
                    "git_branch",
                    json!({"repo_path": repo, "branch_type": "local"}),
                ),
                (
                    "git_show",
                    json!({"repo_path": repo, "revision": "no-such-revision"}),
                ),
            ],
            reads: vec![],
        },
        Server {
            upstream: "thinking",
            program: "npx",
            args: vec!["-y".into(), THINKING.into()],
            section: format!("npx = \"{THINKING}\"\n"),
            calls: vec![
                (
                    "sequentialthinking",
                    json!({"thought": "First, list the files.", "thoughtNumber": 1, "totalThoughts": 2, "nextThoughtNeeded": true}),
                ),
                (
                    "sequentialthinking",
                    json!({"thought": "Then read them.", "thoughtNumber": 2, "totalThoughts": 2, "nextThoughtNeeded": false}),
                ),
                ("sequentialthinking", json!({"thought": 3})),
            ],
            reads: vec![],
        },
    ]
}

/// Starts a server directly, as a client would: over stdio, its own process.
async fn start_directly(server: &Server, root: &Path) -> anyhow::Result<(RawStdioSession, Value)> {
    // The memory server's graph goes to a file of the direct side's own, so both
    // sides start empty; `env` sets it without a shell.
    let memory = format!(
        "MEMORY_FILE_PATH={}",
        root.join("memory-direct.jsonl").display()
    );
    let mut args: Vec<&str> = vec![&memory, server.program];
    args.extend(server.args.iter().map(String::as_str));
    let mut direct = RawStdioSession::start(Path::new("env"), &args).await?;
    let hello = tokio::time::timeout(Duration::from_secs(180), direct.initialize(json!({})))
        .await
        .with_context(|| format!("{} did not start within 180 s", server.upstream))??;
    Ok((direct, hello))
}

/// What plexus must relay of a server's capabilities: each feature it offers, and
/// subscriptions where it takes them.
fn capabilities_relayed(upstream: &str, direct: &Value, relayed: &Value) -> anyhow::Result<()> {
    ensure!(
        direct["result"]["protocolVersion"] == relayed["result"]["protocolVersion"],
        "{upstream} agreed on {}, plexus on {}",
        direct["result"]["protocolVersion"],
        relayed["result"]["protocolVersion"]
    );
    let direct = &direct["result"]["capabilities"];
    let relayed = &relayed["result"]["capabilities"];
    for feature in [
        "tools",
        "resources",
        "prompts",
        "logging",
        "completions",
        "tasks",
    ] {
        if direct.get(feature).is_some_and(|v| !v.is_null()) {
            ensure!(
                relayed.get(feature).is_some_and(Value::is_object),
                "{upstream} offers {feature}, plexus does not: {relayed}"
            );
        }
    }
    if direct["resources"]["subscribe"] == true {
        ensure!(
            relayed["resources"]["subscribe"] == true,
            "{upstream} takes subscriptions, plexus does not say so: {relayed}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_servers_answer_the_same_through_plexus_as_directly() -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("scenario");
    make_scenario(&root)?;
    let servers = servers(&root);
    let sections: String = servers
        .iter()
        .map(|server| {
            format!(
                "[upstreams.{}]\n{}init_timeout = \"180s\"\n\n",
                server.upstream, server.section
            )
        })
        .collect::<String>()
        + &format!(
            "[upstreams.git-modern]\nuvx = \"{GIT}\"\nargs = [\"--repository\", {:?}]\nprotocol = \"2026-07-28\"\ninit_timeout = \"180s\"\n",
            root.join("repo").display().to_string()
        );
    // Small pages: every listing is written across pages (entries spliced, cursors).
    let daemon = Daemon::builder()
        .dir(dir)
        .daemon("page_size = 7")
        .upstreams(sections)
        .start()
        .await?;
    let mut direct = Vec::new();
    for server in &servers {
        direct.push(start_directly(server, &root).await?);
    }
    daemon.wait_ready(Duration::from_secs(180)).await?;
    let ready = started.elapsed();
    let mut relayed = RawHttpSession::connect(&daemon.url).await?;
    let relayed_hello = relayed
        .request("initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}))
        .await?;
    let relayed_tools = list_all(&mut relayed, "tools/list", "tools")
        .await?
        .context("plexus lists tools")?;
    let relayed_resources = list_all(&mut relayed, "resources/list", "resources")
        .await?
        .unwrap_or_default();
    let relayed_templates = list_all(
        &mut relayed,
        "resources/templates/list",
        "resourceTemplates",
    )
    .await?
    .unwrap_or_default();
    let relayed_prompts = list_all(&mut relayed, "prompts/list", "prompts")
        .await?
        .unwrap_or_default();

    let mut compared = 0;
    let mut errors = 0;
    for (server, (session, hello)) in servers.iter().zip(direct.iter_mut()) {
        let name = server.upstream;
        capabilities_relayed(name, hello, &relayed_hello)?;
        let tools = list_all(session, "tools/list", "tools")
            .await?
            .context("tools/list")?;
        ensure!(!tools.is_empty(), "{name} lists no tools");
        same_entries(
            &format!("{name}: tools/list"),
            &tools,
            &own_entries(name, &relayed_tools, "name")?,
        )?;
        let capabilities = &hello["result"]["capabilities"];
        if capabilities.get("resources").is_some() {
            let resources = list_all(session, "resources/list", "resources")
                .await?
                .unwrap_or_default();
            same_entries(
                &format!("{name}: resources/list"),
                &resources,
                &own_entries(name, &relayed_resources, "uri")?,
            )?;
            let templates = list_all(session, "resources/templates/list", "resourceTemplates")
                .await?
                .unwrap_or_default();
            same_entries(
                &format!("{name}: resources/templates/list"),
                &templates,
                &own_entries(name, &relayed_templates, "uriTemplate")?,
            )?;
        }
        if capabilities.get("prompts").is_some() {
            let prompts = list_all(session, "prompts/list", "prompts")
                .await?
                .unwrap_or_default();
            same_entries(
                &format!("{name}: prompts/list"),
                &prompts,
                &own_entries(name, &relayed_prompts, "name")?,
            )?;
        }
        // Each call made directly, then through plexus, before the next: calls that
        // change state find the same state on both sides.
        let errors_before = errors;
        for (tool, arguments) in &server.calls {
            let want = session
                .request("tools/call", json!({"name": tool, "arguments": arguments}))
                .await?;
            let got = relayed
                .request(
                    "tools/call",
                    json!({"name": format!("{name}__{tool}"), "arguments": arguments}),
                )
                .await?;
            ensure!(
                outcome(&want)? == outcome(&got)?,
                "{name}: {tool} {arguments}\n  directly:       {want}\n  through plexus: {got}"
            );
            compared += 1;
            if got.get("error").is_some() || got["result"]["isError"] == true {
                errors += 1;
            }
        }
        if name == "filesystem" {
            let written = std::fs::read_to_string(root.join("files/large.txt"))?;
            ensure!(written == large_text(), "plexus changed what it wrote");
        }
        // Each server's list ends in calls it refuses: its errors are compared too.
        ensure!(
            errors > errors_before,
            "{name}: no call came back as an error"
        );
        for uri in &server.reads {
            let want = session
                .request("resources/read", json!({"uri": uri}))
                .await?;
            let mut got = relayed
                .request("resources/read", json!({"uri": exposed_uri(name, uri)}))
                .await?;
            // plexus names each content by the URI the client read (namespaced).
            // (`get_mut`: indexing would add a null `result` to an error response.)
            let contents = got
                .get_mut("result")
                .and_then(|result| result.get_mut("contents"))
                .and_then(Value::as_array_mut);
            for content in contents.into_iter().flatten() {
                let exposed = content["uri"].as_str().unwrap_or_default();
                let original = exposed
                    .strip_prefix(&format!("{name}+"))
                    .with_context(|| format!("{name}: {uri} read as {exposed}"))?;
                content["uri"] = json!(original);
            }
            ensure!(
                outcome(&want)? == outcome(&got)?,
                "{name}: resources/read {uri}\n  directly:       {want}\n  through plexus: {got}"
            );
            compared += 1;
        }
    }

    // A handshake-era client bridged to mcp-server-git in its 2026-07-28 era
    // (`git-modern`): what the handshake-era server answers directly.
    let (git, _) = &mut direct[2];
    let repo = root.join("repo").display().to_string();
    // Its listing holds the same entries; the server writes their members in
    // another order in that era, so they are compared as JSON values here.
    let direct_git = list_all(git, "tools/list", "tools")
        .await?
        .context("git tools/list")?;
    let bridged = own_entries("git-modern", &relayed_tools, "name")?;
    ensure!(
        direct_git == bridged,
        "git-modern, bridged: tools/list\n  directly:       {direct_git:?}\n  through plexus: {bridged:?}"
    );
    let git_calls = [
        ("git_status", json!({"repo_path": repo})),
        ("git_log", json!({"repo_path": repo, "max_count": 5})),
        (
            "git_show",
            json!({"repo_path": repo, "revision": "no-such-revision"}),
        ),
    ];
    for (tool, arguments) in git_calls {
        let want = git
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await?;
        let got = relayed
            .request(
                "tools/call",
                json!({"name": format!("git-modern__{tool}"), "arguments": arguments}),
            )
            .await?;
        ensure!(
            outcome(&want)? == outcome(&got)?,
            "git-modern, bridged: {tool} {arguments}\n  directly:       {want}\n  through plexus: {got}"
        );
        compared += 1;
        if got["result"]["isError"] == true {
            errors += 1;
        }
    }

    let (filesystem, _) = &mut direct[0];
    modern::client_bridged(&daemon.url, filesystem, &root, &relayed_tools).await?;
    let (memory, _) = &mut direct[1];
    modern::client_reads_bridged(&daemon.url, memory).await?;
    modern::client_to_modern_server(&daemon.url, &root).await?;
    compared += 5;

    for (session, _) in direct {
        session.close().await;
    }
    println!(
        "foreign servers: {} servers, {compared} calls compared ({errors} of them errors); upstreams ready after {:.1} s, all done in {:.1} s",
        servers.len(),
        ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}
