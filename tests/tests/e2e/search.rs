//! Search views: `expose = "search"` lists `search_tools` and `call_tool` instead of
//! the catalog; `"search+found"` adds what a session's searches found and says so
//! with `list_changed`. Against real fixture processes (one with 10,000 generated
//! tools, one held whole by `pin = "strict"`), over stdio and HTTP, with a reload in
//! the middle of a session; a 2026-07-28 client calling what it found with no
//! session to keep it; and the Python SDK against server-everything,
//! mcp-server-time and the fixture, calling through `call_tool` with progress and an
//! elicitation relayed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    eventually, fixture_upstream, plexus_binary, venv_python, workspace_root, Daemon,
    RawHttpSession, RawStdioSession,
};
use serde_json::{json, Value};

pub(crate) fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

pub(crate) fn search(arguments: Value) -> Value {
    call("search_tools", arguments)
}

/// The exposed names a `search_tools` answer found, checking its two forms agree.
pub(crate) fn found_names(answer: &Value) -> anyhow::Result<Vec<String>> {
    let result = answer.get("result").with_context(|| format!("{answer}"))?;
    let structured = &result["structuredContent"];
    let text = result["content"][0]["text"]
        .as_str()
        .context("text block")?;
    ensure!(
        serde_json::from_str::<Value>(text)? == *structured,
        "text and structured content differ: {result}"
    );
    let tools = structured["tools"].as_array().context("tools")?;
    for tool in tools {
        for key in [
            "name",
            "upstream",
            "tool",
            "description",
            "score",
            "inputSchema",
        ] {
            ensure!(tool.get(key).is_some(), "found tool lacks {key}: {tool}");
        }
    }
    Ok(tools
        .iter()
        .filter_map(|tool| tool["name"].as_str().map(str::to_string))
        .collect())
}

pub(crate) fn listed_names(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str().map(str::to_string))
        .collect()
}

fn error_of(answer: &Value) -> (i64, String) {
    (
        answer["error"]["code"].as_i64().unwrap_or_default(),
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_found_lists_what_was_found_and_calls_run_every_check() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("plexus.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nstate_dir = {:?}\nexpose = \"search+found\"\n\n{}{}",
            dir.path().join("state").display().to_string(),
            fixture_upstream("fx", "prefix = \"fx\"", &[]),
            fixture_upstream("strict", "pin = \"strict\"", &[]),
        ),
    )?;
    let config = config.display().to_string();
    let mut client =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", &config])
            .await?;

    let listed = client.request("tools/list", json!({})).await?;
    ensure!(
        listed_names(&listed) == ["search_tools", "call_tool"],
        "{listed}"
    );
    ensure!(
        listed["result"]["tools"][0]["outputSchema"]["properties"]["tools"].is_object(),
        "{listed}"
    );

    // The first search may wait for the fixture's first listing.
    let answer = client
        .request(
            "tools/call",
            search(json!({"query": "sum of two integers"})),
        )
        .await?;
    let found = found_names(&answer)?;
    ensure!(
        found.first().map(String::as_str) == Some("fx__add"),
        "{answer}"
    );
    // The strict upstream's tools are held until approved: never found.
    ensure!(
        found.iter().all(|name| !name.starts_with("strict__")),
        "{answer}"
    );
    let held = client
        .request(
            "tools/call",
            search(json!({"query": "sum of two integers", "upstream": "strict"})),
        )
        .await?;
    ensure!(found_names(&held)?.is_empty(), "{held}");

    // search+found: the list grew.
    let listed = client.request("tools/list", json!({})).await?;
    let names = listed_names(&listed);
    ensure!(names[..2] == ["search_tools", "call_tool"], "{listed}");
    ensure!(names.contains(&"fx__add".to_string()), "{listed}");
    // Both upstreams have listed (the held one answered above), so the catalog's
    // own list_changed are behind us: one heard from now on is the search's.
    ensure!(!names.contains(&"fx__sleep".to_string()), "{listed}");
    client.heard.clear();
    let answer = client
        .request(
            "tools/call",
            search(json!({"query": "sleep milliseconds", "limit": 1})),
        )
        .await?;
    ensure!(found_names(&answer)? == ["fx__sleep"], "{answer}");
    let listed = client.request("tools/list", json!({})).await?;
    ensure!(
        listed_names(&listed).contains(&"fx__sleep".to_string()),
        "{listed}"
    );
    // Heard by the time the next answer is read.
    let told = client
        .heard
        .iter()
        .any(|message| message["method"] == "notifications/tools/list_changed");
    ensure!(
        told,
        "no list_changed after a search found a new tool: {:?}",
        client.heard
    );

    // call_tool runs the named tool; progress comes back under the caller's token.
    let sum = client
        .request(
            "tools/call",
            json!({"name": "call_tool", "arguments": {"name": "fx__add", "arguments": {"a": 2, "b": 3}}}),
        )
        .await?;
    ensure!(sum["result"]["content"][0]["text"] == "5", "{sum}");
    client.heard.clear();
    let slept = client
        .request(
            "tools/call",
            json!({"name": "call_tool", "arguments": {"name": "fx__sleep", "arguments": {"ms": 350}},
                   "_meta": {"progressToken": "mine"}}),
        )
        .await?;
    ensure!(slept.get("result").is_some(), "{slept}");
    let progress = client
        .heard
        .iter()
        .filter(|message| {
            message["method"] == "notifications/progress"
                && message["params"]["progressToken"] == "mine"
        })
        .count();
    ensure!(progress >= 2, "progress: {:?}", client.heard);

    // Bad input: a clear error each, and nothing else changes.
    let before = client.request("tools/list", json!({})).await?;
    let long = "tool ".repeat(20_000);
    let bad = [
        (search(json!({"query": ""})), "`query` is empty"),
        (search(json!({"query": long})), "at most 4096"),
        (search(json!({"query": "sum", "limit": 0})), "from 1 to 50"),
        (
            search(json!({"query": "sum", "limit": 10_000})),
            "from 1 to 50",
        ),
        (search(json!({"limit": 3})), "`query` must be a string"),
        (
            call("call_tool", json!({"name": "fx__nothing", "arguments": {}})),
            "fx__nothing",
        ),
        (
            call(
                "call_tool",
                json!({"name": "strict__add", "arguments": {"a": 1, "b": 2}}),
            ),
            "strict__add",
        ),
        (
            call("call_tool", json!({"arguments": {}})),
            "`name` must be a string",
        ),
    ];
    for (params, says) in bad {
        let answer = client.request("tools/call", params.clone()).await?;
        let (code, message) = error_of(&answer);
        ensure!(
            (-32602..=-32600).contains(&code) || code <= -33000,
            "{params}: {answer}"
        );
        ensure!(message.contains(says), "{params}: {message} lacks {says:?}");
    }
    let after = client.request("tools/list", json!({})).await?;
    ensure!(before["result"] == after["result"], "{before} / {after}");
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_view_over_ten_thousand_tools_follows_a_reload_in_the_same_session(
) -> anyhow::Result<()> {
    let sections = |beta: bool| {
        let mut sections = fixture_upstream("big", "prefix = \"\"", &["--extra-tools", "10000"]);
        sections += &fixture_upstream("fx", "prefix = \"fx\"", &[]);
        if beta {
            sections += &fixture_upstream("beta", "prefix = \"beta\"", &["--name", "beta"]);
        }
        // `found` leaves out `extra_4242`, the one tool whose name and description
        // hold "4242"; `everything` shows the whole catalog through search.
        sections
            + "[views.found]\nexpose = \"search\"\ndeny_tools = [\"fx__echo\", \"extra_4242\"]\n\n\
               [views.everything]\nexpose = \"search\"\n"
    };
    let daemon = Daemon::builder().upstreams(sections(false)).start().await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;
    let mut session = RawHttpSession::connect(&format!("{}/found", daemon.url)).await?;
    let listed = session.request("tools/list", json!({})).await?;
    ensure!(
        listed_names(&listed) == ["search_tools", "call_tool"],
        "{listed}"
    );
    // One page, no cursor issued: a cursor is one the list never gave (-32602).
    let paged = session
        .request("tools/list", json!({"cursor": "bm90LW91cnM"}))
        .await?;
    let (code, message) = error_of(&paged);
    ensure!(code == -32602 && message.contains("cursor"), "{paged}");
    // The whole catalog, for the context a search view saves.
    let mut whole = RawHttpSession::connect(&daemon.url).await?;
    let mut catalog_bytes = 0;
    let mut cursor: Option<String> = None;
    loop {
        let params = cursor.map_or(json!({}), |cursor| json!({"cursor": cursor}));
        let page = whole.request("tools/list", params).await?;
        catalog_bytes += page["result"]["tools"].to_string().len();
        cursor = page["result"]["nextCursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    println!(
        "tools/list: {catalog_bytes} bytes for the catalog, {} for the two meta-tools",
        listed["result"]["tools"].to_string().len()
    );

    let started = Instant::now();
    let answer = session
        .request(
            "tools/call",
            search(json!({"query": "echo text unchanged", "limit": 5})),
        )
        .await?;
    println!(
        "first search over 10,008 tools (index built): {:?}",
        started.elapsed()
    );
    let found = found_names(&answer)?;
    // Out of the view: never found.
    ensure!(!found.contains(&"fx__echo".to_string()), "{answer}");
    ensure!(found.contains(&"echo".to_string()), "{answer}");

    // A tool out of the view, the best match of its query: the whole catalog's
    // search puts it first; the view's never returns it, and calling it through
    // call_tool is refused exactly as calling it directly is.
    let query = search(json!({"query": "shipments of collection 4242", "limit": 50}));
    let mut everything = RawHttpSession::connect(&format!("{}/everything", daemon.url)).await?;
    let best = everything.request("tools/call", query.clone()).await?;
    ensure!(
        found_names(&best)?.first().map(String::as_str) == Some("extra_4242"),
        "extra_4242 is not the best match in the whole catalog: {best}"
    );
    for query in [
        query,
        search(json!({"query": "extra_4242", "limit": 50, "upstream": "big"})),
    ] {
        let answer = session.request("tools/call", query.clone()).await?;
        let found = found_names(&answer)?;
        ensure!(
            !found.is_empty() && !found.contains(&"extra_4242".to_string()),
            "{query}: the view's search returned a tool out of the view: {found:?}"
        );
    }
    let direct = session
        .request("tools/call", call("extra_4242", json!({"query": "x"})))
        .await?;
    let through = session
        .request(
            "tools/call",
            call(
                "call_tool",
                json!({"name": "extra_4242", "arguments": {"query": "x"}}),
            ),
        )
        .await?;
    ensure!(direct["error"].is_object(), "{direct}");
    ensure!(
        through["error"] == direct["error"],
        "call_tool on a tool out of the view: {through}, a direct call: {direct}"
    );
    let started = Instant::now();
    let again = session
        .request(
            "tools/call",
            search(json!({"query": "sum of two integers"})),
        )
        .await?;
    println!("a later search: {:?}", started.elapsed());
    ensure!(
        found_names(&again)?.first().map(String::as_str) == Some("add"),
        "{again}"
    );
    ensure!(
        !found_names(&again)?
            .iter()
            .any(|name| name.starts_with("beta__")),
        "{again}"
    );

    // A reload adds an upstream: the same session finds its tools at once.
    let text = std::fs::read_to_string(daemon.dir.path().join("config.toml"))?;
    let text = text.replace(&sections(false), &sections(true));
    std::fs::write(daemon.dir.path().join("config.toml"), text)?;
    daemon.reload().await?;
    eventually(Duration::from_secs(30), async || {
        let answer = session
            .request(
                "tools/call",
                search(json!({"query": "sum of two integers"})),
            )
            .await?;
        let found = found_names(&answer)?;
        ensure!(found.contains(&"beta__add".to_string()), "{answer}");
        Ok(())
    })
    .await?;
    let sum = session
        .request(
            "tools/call",
            json!({"name": "call_tool", "arguments": {"name": "beta__add", "arguments": {"a": 1, "b": 1}}}),
        )
        .await?;
    ensure!(sum["result"]["content"][0]["text"] == "2", "{sum}");
    Ok(())
}

const EVERYTHING: &str = "@modelcontextprotocol/server-everything@2026.8.31";
const TIME: &str = "mcp-server-time@2026.10.19";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_searches_and_calls_through_call_tool_with_progress_and_elicitation(
) -> anyhow::Result<()> {
    if !venv_python().exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return Ok(());
    }
    let sections = format!(
        "[upstreams.everything]\nnpx = \"{EVERYTHING}\"\ninit_timeout = \"180s\"\n\n\
         [upstreams.time]\nuvx = \"{TIME}\"\ninit_timeout = \"180s\"\n\n{}",
        fixture_upstream("fx", "prefix = \"fx\"", &[])
    );
    let daemon = Daemon::builder()
        .daemon("expose = \"search\"")
        .upstreams(sections)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(240)).await?;
    let script = workspace_root().join("tests/python/search_client.py");
    for mode in ["legacy", "auto"] {
        let child = tokio::process::Command::new(venv_python())
            .arg(&script)
            .args(["--url", &daemon.url, "--mode", mode])
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let output = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
            .await
            .context("the search client did not finish")??;
        let report = format!(
            "--- stdout\n{}--- stderr\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        println!("{mode}:\n{report}");
        ensure!(
            output.status.success(),
            "{mode}: {report}\n{}",
            daemon.log()
        );
    }
    Ok(())
}

/// `search_tools` is answered by plexus itself, yet leaves its audit line as any
/// call does (arguments hashed, never written); `call_tool` leaves the line of the
/// call it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_tools_and_call_tool_leave_audit_lines() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .daemon("audit_log = \"audit.jsonl\"\nexpose = \"search\"")
        .upstreams(fixture_upstream("fx", "prefix = \"fx\"", &[]))
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let trail = daemon.dir.path().join("audit.jsonl");
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let arguments = json!({"query": "sum of two secret-integers"});
    let answer = session
        .request("tools/call", search(arguments.clone()))
        .await?;
    ensure!(
        found_names(&answer)?.contains(&"fx__add".to_string()),
        "{answer}"
    );
    let line = crate::audit::line_for(&trail, "tools/call", "search_tools").await?;
    ensure!(line["outcome"] == "ok", "{line}");
    ensure!(
        line["arguments_sha256"] == registry::fingerprint::security_hash(&arguments).as_str(),
        "{line}"
    );
    // A refused search is a line too, with its error.
    session
        .request("tools/call", search(json!({"query": ""})))
        .await?;
    eventually(Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&trail)?;
        let refused = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["name"] == "search_tools")
            .any(|line| line["outcome"] == -32602);
        ensure!(refused, "no line for the refused search:\n{text}");
        Ok(())
    })
    .await?;
    session
        .request(
            "tools/call",
            call(
                "call_tool",
                json!({"name": "fx__add", "arguments": {"a": 1, "b": 2}}),
            ),
        )
        .await?;
    let line = crate::audit::line_for(&trail, "tools/call", "fx__add").await?;
    ensure!(
        line["upstream"] == "fx" && line["outcome"] == "ok",
        "{line}"
    );
    let text = std::fs::read_to_string(&trail)?;
    ensure!(
        !text.contains("secret-integers"),
        "an argument reached the trail"
    );
    Ok(())
}

/// A 2026-07-28 client under `expose = "search+found"`: every request stands
/// alone, so no session keeps what its searches found, yet it calls a tool it
/// found both through `call_tool` and by the tool's own name; a tool the view
/// leaves out is refused either way with the same error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_calls_the_tools_it_found_under_search_found() -> anyhow::Result<()> {
    let daemon = Daemon::builder()
        .upstreams(
            fixture_upstream("fx", "prefix = \"fx\"", &[])
                + "[views.agent]\nexpose = \"search+found\"\ndeny_tools = [\"fx__echo\"]\n",
        )
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    let url = format!("{}/agent", daemon.url);
    let client = reqwest::Client::new();
    let mut id = 0;
    let mut post = async |method: &str, params: Value| -> anyhow::Result<Value> {
        id += 1;
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "0"},
        });
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        if let Some(name) = params["name"].as_str() {
            request = request.header("mcp-name", name);
        }
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, answer, session) =
            plexus_tests::answer_of(request.body(body.to_string()).send().await?).await?;
        ensure!(session.is_none(), "a 2026-07-28 request got a session");
        ensure!(status == 200, "{method}: {status} {answer}");
        Ok(answer)
    };

    let listed = post("tools/list", json!({})).await?;
    ensure!(
        listed_names(&listed) == ["search_tools", "call_tool"],
        "{listed}"
    );
    let answer = post(
        "tools/call",
        search(json!({"query": "sum of two integers", "limit": 3})),
    )
    .await?;
    let found = found_names(&answer)?;
    ensure!(
        found.first().map(String::as_str) == Some("fx__add"),
        "{answer}"
    );
    // Nothing is kept between requests: the list is the two tools again.
    let listed = post("tools/list", json!({})).await?;
    ensure!(
        listed_names(&listed) == ["search_tools", "call_tool"],
        "{listed}"
    );

    // What it found, called through call_tool and by its own name.
    let through = post(
        "tools/call",
        call(
            "call_tool",
            json!({"name": "fx__add", "arguments": {"a": 2, "b": 3}}),
        ),
    )
    .await?;
    ensure!(through["result"]["content"][0]["text"] == "5", "{through}");
    ensure!(through["result"]["resultType"] == "complete", "{through}");
    let direct = post("tools/call", call("fx__add", json!({"a": 4, "b": 5}))).await?;
    ensure!(direct["result"]["content"][0]["text"] == "9", "{direct}");

    // Out of the view: refused either way, alike.
    let direct = post("tools/call", call("fx__echo", json!({"text": "x"}))).await?;
    let through = post(
        "tools/call",
        call(
            "call_tool",
            json!({"name": "fx__echo", "arguments": {"text": "x"}}),
        ),
    )
    .await?;
    ensure!(direct["error"]["code"] == -32602, "{direct}");
    ensure!(through["error"] == direct["error"], "{through} / {direct}");
    Ok(())
}
