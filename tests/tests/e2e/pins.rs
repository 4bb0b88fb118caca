//! Pins against a real daemon and the fixture: first sight is pinned to a private
//! file; every kind of drift (across a daemon restart and at runtime through
//! `list_changed`) is found, classified, held back on every path under `block`
//! until `plexus pins approve` (live and offline), while the rest of the upstream
//! keeps working; `warn`, `ignore` and `strict` behave as named; a corrupt pin file
//! fails closed; `plexus hash` equals what the daemon pins; an approval reaches a
//! `serve --stdio` daemon through the pin file it watches.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::answering::AnsweringClient;
use plexus_tests::{
    eventually, fixture_upstream, plexus_binary, Daemon, RawHttpSession, RawStdioSession,
};
use rmcp::model::SubscriptionFilter;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

fn alpha(schema: &str) -> String {
    fixture_upstream("alpha", "", &["--name", "pinned", "--add-schema", schema])
}

/// The fixture as `name`, drifting as `drift_file` says, with extra config keys.
fn drifting(name: &str, drift_file: &Path, extra: &str) -> String {
    fixture_upstream(
        name,
        extra,
        &["--drift-file", &drift_file.display().to_string()],
    )
}

/// Calls `tool` until plexus refuses it as quarantined (the drift has been seen).
async fn refused_until_quarantined(
    session: &mut RawHttpSession,
    tool: &str,
    daemon: &Daemon,
) -> anyhow::Result<Value> {
    eventually(WAIT, async || {
        let answer = call(session, tool, json!({})).await?;
        ensure!(
            answer["error"]["code"] == -33006,
            "{tool} was never quarantined: {answer}\n{}",
            daemon.log()
        );
        Ok(answer)
    })
    .await
}

async fn metrics(daemon: &Daemon) -> anyhow::Result<String> {
    Ok(daemon.admin_get("/metrics").await?.1)
}

/// `plexus pins ARGS --config <the daemon's config>`: exit code, stdout, stderr.
async fn pins(dir: &Path, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let output = tokio::process::Command::new(plexus_binary())
        .arg("pins")
        .args(args)
        .arg("--config")
        .arg(dir.join("config.toml"))
        .output()
        .await?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// The names (or URIs) a list method returns.
async fn listed(session: &mut RawHttpSession, kind: &str) -> anyhow::Result<Vec<String>> {
    walk(session, kind)
        .await?
        .with_context(|| format!("{kind} changed while it was being paged"))
}

/// Every page of a list, or `None` when the list shrank under the walk's cursor (the
/// daemon refuses a cursor past the end of a changed list; a client lists again).
async fn walk(session: &mut RawHttpSession, kind: &str) -> anyhow::Result<Option<Vec<String>>> {
    let (method, key, field) = match kind {
        "tools" => ("tools/list", "tools", "name"),
        "prompts" => ("prompts/list", "prompts", "name"),
        "resources" => ("resources/list", "resources", "uri"),
        _ => (
            "resources/templates/list",
            "resourceTemplates",
            "uriTemplate",
        ),
    };
    // Every page: held entries are absent from pages too.
    let mut names = Vec::new();
    let mut params = json!({});
    loop {
        let paging = params.get("cursor").is_some();
        let answer = session.request(method, params).await?;
        if paging
            && answer["error"]["code"] == -32602
            && answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("invalid cursor"))
        {
            return Ok(None);
        }
        let entries = answer["result"][key]
            .as_array()
            .with_context(|| format!("{method}: {answer}"))?;
        names.extend(
            entries
                .iter()
                .filter_map(|entry| entry[field].as_str().map(str::to_string)),
        );
        match answer["result"]["nextCursor"].as_str() {
            Some(cursor) => params = json!({ "cursor": cursor }),
            None => return Ok(Some(names)),
        }
    }
}

/// A session on a ready daemon, once `kind` lists `name`.
async fn session_listing(
    daemon: &Daemon,
    kind: &str,
    name: &str,
) -> anyhow::Result<RawHttpSession> {
    daemon.wait_ready(WAIT).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    listed_until(&mut session, kind, |names| has(names, name), daemon).await?;
    Ok(session)
}

/// Lists `kind` until `wanted` holds of the names.
async fn listed_until(
    session: &mut RawHttpSession,
    kind: &str,
    wanted: impl Fn(&[String]) -> bool,
    daemon: &Daemon,
) -> anyhow::Result<Vec<String>> {
    eventually(WAIT, async || {
        // The list changes while this waits, so a walk may meet a shrunk list: list again.
        let names = walk(session, kind).await?;
        match names.as_deref().filter(|names| wanted(names)) {
            Some(names) => Ok(names.to_vec()),
            None => bail!("{kind} never became as wanted: {names:?}\n{}", daemon.log()),
        }
    })
    .await
}

async fn call(session: &mut RawHttpSession, tool: &str, arguments: Value) -> anyhow::Result<Value> {
    session
        .request("tools/call", json!({"name": tool, "arguments": arguments}))
        .await
}

/// The error of a refusal by quarantine, checked to name the upstream and the class.
fn quarantined<'a>(answer: &'a Value, class: &str) -> anyhow::Result<&'a Value> {
    let error = &answer["error"];
    ensure!(error["code"] == -33006, "not quarantined: {answer}");
    ensure!(error["data"]["kind"] == "quarantined", "{answer}");
    ensure!(error["data"]["retryable"] == false, "{answer}");
    ensure!(error["data"]["change"]["class"] == class, "class: {answer}");
    Ok(&error["data"]["change"])
}

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// The pin file is written a moment after a change, so the changes of upstreams
/// starting together share one write; a daemon stopped within that moment writes
/// it as it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pins_are_on_disk_when_plexus_stops_right_after_pinning() -> anyhow::Result<()> {
    let daemon = Daemon::builder().upstreams(alpha("v1")).start().await?;
    daemon.wait_ready(WAIT).await?;
    let log = daemon.log();
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success(), "{log}");
    let pin_path = dir.path().join("plexus.lock");
    let pinned: Value = serde_json::from_str(
        &std::fs::read_to_string(&pin_path).with_context(|| format!("no pin file: {log}"))?,
    )?;
    ensure!(
        pinned["upstreams"]["alpha"]["pinned"]["entries"]["tools/add"]["definition"]["name"]
            == "add",
        "{pinned}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_across_a_restart_is_held_until_approved_offline() -> anyhow::Result<()> {
    let daemon = Daemon::builder().upstreams(alpha("v1")).start().await?;
    daemon.wait_ready(WAIT).await?;
    let pin_path = daemon.dir.path().join("plexus.lock");
    eventually(Duration::from_secs(10), async || {
        ensure!(pin_path.exists(), "no pin file: {}", daemon.log());
        Ok(())
    })
    .await?;
    let mode = std::fs::metadata(&pin_path)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "pin file mode {mode:o}");
    let pinned: Value = serde_json::from_str(&std::fs::read_to_string(&pin_path)?)?;
    let record = &pinned["upstreams"]["alpha"]["pinned"];
    let entry = &record["entries"]["tools/add"];
    ensure!(
        entry["security"].as_str().is_some_and(|h| h.len() == 64)
            && entry["compatibility"]
                .as_str()
                .is_some_and(|h| h.len() == 64),
        "{pinned}"
    );
    ensure!(
        entry["definition"]["name"] == "add",
        "the definition is kept: {pinned}"
    );
    ensure!(record["server"]["name"] == "pinned", "{pinned}");
    ensure!(
        record["pinned_at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{pinned}"
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(r#"plexus_schema_checks_total{outcome="pinned",upstream="alpha"} 1"#),
        "{text}"
    );
    ensure!(
        text.contains("plexus_catalog_fingerprint_info{fingerprint=\""),
        "{text}"
    );

    // The upstream comes back with `add` requiring a third parameter.
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success());
    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(alpha("v2"))
        .start()
        .await?;
    daemon.wait_ready(WAIT).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = listed_until(
        &mut session,
        "tools",
        |names| !has(names, "alpha__add") && has(names, "alpha__echo"),
        &daemon,
    )
    .await?;
    ensure!(has(&tools, "alpha__whoami"), "{tools:?}");
    let answer = call(&mut session, "alpha__add", json!({"a": 1, "b": 2, "c": 3})).await?;
    let change = quarantined(&answer, "breaking")?;
    ensure!(
        change["fields"].as_array().is_some_and(|fields| fields
            .iter()
            .any(|f| f["path"] == "/inputSchema/required" && f["reason"] == "required_added")),
        "{answer}"
    );
    ensure!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("plexus pins approve alpha/add")),
        "{answer}"
    );
    // The rest of the upstream works.
    let echoed = call(&mut session, "alpha__echo", json!({"text": "still here"})).await?;
    ensure!(
        echoed["result"]["content"][0]["text"] == "still here",
        "{echoed}"
    );
    let log = daemon.log();
    let drift = log
        .lines()
        .find(|line| line.contains("schema changed") && line.contains("required_added"))
        .with_context(|| format!("no required_added change: {log}"))?;
    ensure!(
        drift.contains("breaking")
            && drift.contains("/inputSchema/required")
            && drift.contains("entry=add"),
        "{drift}"
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(r#"plexus_schema_changes_total{class="breaking",upstream="alpha"}"#),
        "{text}"
    );
    ensure!(
        text.contains(r#"plexus_quarantined_entries{upstream="alpha"} 1"#),
        "{text}"
    );
    // The status and the diff, from the running daemon.
    let (code, out, err) = pins(daemon.dir.path(), &["status", "--json"]).await?;
    ensure!(code == 0, "{out} {err}");
    let status: Value = serde_json::from_str(&out)?;
    ensure!(
        status["upstreams"]["alpha"]["state"] == "changed",
        "{status}"
    );
    ensure!(status["upstreams"]["alpha"]["held"] == 1, "{status}");
    let (code, out, err) = pins(daemon.dir.path(), &["diff", "alpha"]).await?;
    ensure!(code == 0, "{err}");
    ensure!(
        out.contains("breaking  tools/add  /inputSchema/required  required_added")
            && out.contains("+ \"c\"")
            && out.contains("plexus pins approve alpha/add"),
        "{out}"
    );

    // Approved offline, with no daemon running: the next start exposes it.
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success());
    let (code, out, err) = pins(dir.path(), &["status"]).await?;
    ensure!(
        code == 0 && out.contains("no daemon running"),
        "{out} {err}"
    );
    ensure!(
        out.lines().any(|line| line.starts_with("alpha")
            && line.contains("changed")
            && line.contains("1 breaking")),
        "{out}"
    );
    let (code, out, err) = pins(dir.path(), &["diff", "--json"]).await?;
    ensure!(code == 0, "{err}");
    let diff: Value = serde_json::from_str(&out)?;
    ensure!(
        diff["upstreams"]["alpha"]["changes"][0]["reason"] == "required_added",
        "{diff}"
    );
    let (code, out, err) = pins(dir.path(), &["approve", "alpha/add"]).await?;
    ensure!(code == 0, "{out} {err}");
    ensure!(out.contains("no daemon running"), "{out}");
    let approved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("plexus.lock"))?)?;
    let history = &approved["upstreams"]["alpha"]["history"];
    ensure!(history[0]["approved"] == "add", "{approved}");
    ensure!(
        history[0]["changes"][0]["reason"] == "required_added",
        "{approved}"
    );
    let (code, _, err) = pins(dir.path(), &["approve", "alpha/add"]).await?;
    ensure!(
        code == 1 && err.contains("nothing of upstream `alpha` is waiting"),
        "{err}"
    );

    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(alpha("v2"))
        .start()
        .await?;
    let mut session = session_listing(&daemon, "tools", "alpha__add").await?;
    let answer = call(&mut session, "alpha__add", json!({"a": 1, "b": 2, "c": 3})).await?;
    ensure!(answer["result"]["content"][0]["text"] == "6", "{answer}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An upstream that lists a second definition under a name it already listed
/// (names must be unique) has the first kept and the second left out, before
/// pinning: the first is pinned, exposed and callable, nothing is held, and the log
/// names the repeated name. (The second was judged against the first, holding both.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_listed_twice_keeps_its_first_definition_and_holds_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "duplicate-tool")?;
    let daemon = Daemon::builder()
        .upstreams(drifting("twice", &drift_file, ""))
        .start()
        .await?;
    let mut session = session_listing(&daemon, "tools", "twice__echo").await?;
    let answer = session.request("tools/list", json!({})).await?;
    let echoes: Vec<&Value> = answer["result"]["tools"]
        .as_array()
        .context("tools/list")?
        .iter()
        .filter(|tool| tool["name"] == "twice__echo")
        .collect();
    ensure!(echoes.len() == 1, "{answer}");
    ensure!(
        !echoes[0]["description"]
            .as_str()
            .is_some_and(|d| d.contains("second echo")),
        "the second definition was kept: {answer}"
    );
    let echoed = call(&mut session, "twice__echo", json!({"text": "once"})).await?;
    ensure!(echoed["result"]["content"][0]["text"] == "once", "{echoed}");
    let (_, status) = daemon.admin_get("/status").await?;
    let status: Value = serde_json::from_str(&status)?;
    ensure!(status["upstreams"][0]["pin"]["held"] == 0, "{status}");
    let (code, out, err) = pins(daemon.dir.path(), &["diff"]).await?;
    ensure!(code == 0 && out.contains("as pinned"), "{code} {out} {err}");
    // Written before the daemon was ready.
    let log = daemon.log();
    ensure!(
        log.contains("only the first of each is kept") && log.contains(r#"names=["echo"]"#),
        "{log}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An upstream that sends `list_changed` without pause is still listed again and
/// checked against its pin: a description swapped under cover of the storm is held
/// within seconds. (Each notification put the listing off again, and the schedule
/// waited behind them: the swap went unseen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_list_changed_does_not_hide_a_drift() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    let section = fixture_upstream(
        "storm",
        "",
        &[
            "--drift-file",
            &drift_file.display().to_string(),
            "--list-changed-every",
            "50",
        ],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let mut session = session_listing(&daemon, "tools", "storm__echo").await?;
    std::fs::write(&drift_file, "description")?;
    let started = Instant::now();
    let answer = refused_until_quarantined(&mut session, "storm__echo", &daemon).await?;
    quarantined(&answer, "security")?;
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "held after {:?}",
        started.elapsed()
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runtime_drift_is_classified_held_and_approved_live() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    // Small pages: held entries leave no hole in any page.
    let daemon = Daemon::builder()
        .daemon("page_size = 2")
        .upstreams(drifting("alpha", &drift_file, ""))
        .start()
        .await?;
    let mut session = session_listing(&daemon, "tools", "alpha__echo").await?;

    // Each step adds one drift to those already approved: (drift, the exposed tool it
    // holds, its class, a path or reason its change names).
    let steps = [
        (
            "rename-required",
            "alpha__add",
            "breaking",
            "required_added",
        ),
        ("description", "alpha__echo", "security", "/description"),
        (
            "nested-description",
            "alpha__ask",
            "security",
            "/inputSchema/properties/kind/description",
        ),
        (
            "optional-param",
            "alpha__echo",
            "security",
            "optional_parameter_added",
        ),
        ("annotation", "alpha__whoami", "security", "/annotations"),
        ("new-tool", "alpha__exfiltrate", "security", "entry_added"),
        ("rename-tool", "alpha__who_am_i", "security", "entry_added"),
    ];
    let mut drifts: Vec<&str> = Vec::new();
    for (drift, tool, class, named) in steps {
        drifts.push(drift);
        std::fs::write(&drift_file, drifts.join(","))?;
        let answer = refused_until_quarantined(&mut session, tool, &daemon)
            .await
            .with_context(|| format!("{drift} was not held"))?;
        let change = quarantined(&answer, class).with_context(|| drift.to_string())?;
        let tools = listed(&mut session, "tools").await?;
        ensure!(
            !has(&tools, tool),
            "{drift}: a held tool is listed: {tools:?}"
        );
        // Unchanged entries of the same upstream keep working.
        ensure!(has(&tools, "alpha__sleep"), "{drift}: {tools:?}");
        ensure!(
            change["fields"].as_array().is_some_and(|fields| fields
                .iter()
                .any(|f| f["path"] == named || f["reason"] == named)),
            "{drift}: {answer}"
        );
        let slept = call(&mut session, "alpha__sleep", json!({"ms": 1})).await?;
        ensure!(slept.get("result").is_some(), "{drift}: {slept}");

        // The diff names it; approving that one entry, live, lists it again at once.
        let (code, out, err) = pins(daemon.dir.path(), &["diff", "alpha", "--json"]).await?;
        ensure!(code == 0, "{err}");
        let diff: Value = serde_json::from_str(&out)?;
        let original = tool.trim_start_matches("alpha__");
        ensure!(
            diff["upstreams"]["alpha"]["changes"]
                .as_array()
                .is_some_and(|changes| changes
                    .iter()
                    .any(|c| c["identity"] == original && c["class"] == class)),
            "{drift}: {diff}"
        );
        let (code, out, err) = pins(
            daemon.dir.path(),
            &["approve", &format!("alpha/{original}")],
        )
        .await?;
        ensure!(code == 0, "{drift}: {out} {err}");
        ensure!(out.contains("listed to connected clients now"), "{out}");
        let tools = listed(&mut session, "tools").await?;
        ensure!(
            has(&tools, tool),
            "{drift}: approved but not listed: {tools:?}"
        );
    }
    let log = daemon.log();
    for reason in [
        "required_removed",
        "description_changed",
        "optional_parameter_added",
        "entry_added",
    ] {
        ensure!(
            log.lines()
                .any(|line| line.contains("schema changed") && line.contains(reason)),
            "{reason} not logged\n{log}"
        );
    }

    // A removed tool: nothing left to hide, a breaking change to approve.
    drifts.push("remove-tool");
    std::fs::write(&drift_file, drifts.join(","))?;
    listed_until(
        &mut session,
        "tools",
        |names| !has(names, "alpha__fail"),
        &daemon,
    )
    .await?;
    let (code, out, _) = pins(daemon.dir.path(), &["diff", "alpha"]).await?;
    ensure!(
        code == 0 && out.contains("breaking  tools/fail  (whole entry)  entry_removed"),
        "{out}"
    );
    let (code, out, err) = pins(daemon.dir.path(), &["approve", "alpha"]).await?;
    ensure!(code == 0, "{out} {err}");
    let (_, out, _) = pins(daemon.dir.path(), &["status", "--json"]).await?;
    let status: Value = serde_json::from_str(&out)?;
    ensure!(
        status["upstreams"]["alpha"]["state"] == "pinned",
        "{status}"
    );
    ensure!(status["upstreams"]["alpha"]["held"] == 0, "{status}");
    ensure!(status["upstreams"]["alpha"]["approvals"] == 8, "{status}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_prompts_resources_and_templates_are_refused_on_every_path() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    // --conformance: the fixture also serves subscriptions (of its `test://` resources).
    let section = fixture_upstream(
        "alpha",
        "",
        &[
            "--conformance",
            "--drift-file",
            &drift_file.display().to_string(),
        ],
    );
    let daemon = Daemon::builder().upstreams(&section).start().await?;
    let mut session = session_listing(&daemon, "prompts", "alpha__greet").await?;

    std::fs::write(&drift_file, "prompt,resource,template")?;
    listed_until(
        &mut session,
        "prompts",
        |names| !has(names, "alpha__greet"),
        &daemon,
    )
    .await?;
    let resources = listed_until(
        &mut session,
        "resources",
        |uris| !has(uris, "alpha+fixture://text"),
        &daemon,
    )
    .await?;
    ensure!(has(&resources, "alpha+fixture://blob"), "{resources:?}");
    let templates = listed(&mut session, "templates").await?;
    ensure!(
        !has(&templates, "alpha+fixture://items/{id}"),
        "{templates:?}"
    );

    let answer = session
        .request("prompts/get", json!({"name": "alpha__greet"}))
        .await?;
    quarantined(&answer, "security").context("prompts/get")?;
    let answer = session
        .request("resources/read", json!({"uri": "alpha+fixture://text"}))
        .await?;
    quarantined(&answer, "security").context("resources/read")?;
    let answer = session
        .request("resources/read", json!({"uri": "alpha+fixture://items/7"}))
        .await?;
    quarantined(&answer, "security").context("a held template's read")?;
    let answer = session
        .request("resources/read", json!({"uri": "alpha+fixture://blob"}))
        .await?;
    ensure!(
        answer.get("result").is_some(),
        "an unchanged resource: {answer}"
    );
    let answer = session
        .request("completion/complete", json!({"ref": {"type": "ref/prompt", "name": "alpha__greet"}, "argument": {"name": "name", "value": "a"}}))
        .await?;
    quarantined(&answer, "security").context("completion of a prompt")?;
    let answer = session
        .request("completion/complete", json!({"ref": {"type": "ref/resource", "uri": "alpha+fixture://items/{id}"}, "argument": {"name": "id", "value": "1"}}))
        .await?;
    quarantined(&answer, "security").context("completion of a template")?;
    let answer = session
        .request(
            "resources/subscribe",
            json!({"uri": "alpha+fixture://text"}),
        )
        .await?;
    quarantined(&answer, "security").context("resources/subscribe")?;

    // The 2026-07-28 paths: a request without a session, and a listen stream.
    let response = plexus_tests::post_2026(
        &daemon.url,
        json!(1),
        "prompts/get",
        json!({"name": "alpha__greet"}),
        Some("alpha__greet"),
    )
    .await?;
    let (_, answer, _) = plexus_tests::answer_of(response).await?;
    quarantined(&answer, "security").context("a 2026-07-28 prompts/get")?;
    let client = AnsweringClient::named("listener")
        .connect_modern(&daemon.url)
        .await?;
    let mut filter = SubscriptionFilter::new();
    filter.resource_subscriptions = Some(vec![
        "alpha+fixture://text".into(),
        "alpha+test://watched-resource".into(),
    ]);
    let subscription = client.peer().listen(filter).await?;
    ensure!(
        subscription.acknowledged().resource_subscriptions
            == Some(vec!["alpha+test://watched-resource".to_string()]),
        "a held resource was subscribed on a listen stream: {:?}",
        subscription.acknowledged()
    );
    drop(subscription);
    client.cancel().await?;

    // Approving the whole upstream brings everything back.
    let (code, out, err) = pins(daemon.dir.path(), &["approve", "alpha"]).await?;
    ensure!(code == 0, "{out} {err}");
    let answer = session
        .request(
            "prompts/get",
            json!({"name": "alpha__greet", "arguments": {"name": "pins"}}),
        )
        .await?;
    ensure!(answer.get("result").is_some(), "{answer}");
    let answer = session
        .request("resources/read", json!({"uri": "alpha+fixture://items/7"}))
        .await?;
    ensure!(answer.get("result").is_some(), "{answer}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_ignore_and_strict_behave_as_named() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (warned_file, ignored_file) = (dir.path().join("warned"), dir.path().join("ignored"));
    std::fs::write(&warned_file, "")?;
    std::fs::write(&ignored_file, "")?;
    let sections = [
        drifting("warned", &warned_file, "on_schema_change = \"warn\""),
        drifting("ignored", &ignored_file, "on_schema_change = \"ignore\""),
        fixture_upstream("strict", "pin = \"strict\"", &[]),
        // Never started: only its floating version is warned about.
        "[upstreams.floating]\nnpx = \"@modelcontextprotocol/server-everything\"\nenabled = false\n".to_string(),
    ]
    .join("\n");
    let daemon = Daemon::builder().upstreams(&sections).start().await?;
    daemon.wait_ready(WAIT).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = listed_until(
        &mut session,
        "tools",
        |names| has(names, "warned__echo") && has(names, "ignored__echo"),
        &daemon,
    )
    .await?;
    // Strict: nothing of it is exposed before approval, on any path.
    ensure!(
        !tools.iter().any(|name| name.starts_with("strict__")),
        "{tools:?}"
    );
    let answer = call(&mut session, "strict__echo", json!({"text": "x"})).await?;
    quarantined(&answer, "unapproved")?;
    let answer = session
        .request("resources/read", json!({"uri": "strict+fixture://items/1"}))
        .await?;
    quarantined(&answer, "unapproved")?;
    let (_, out, _) = pins(daemon.dir.path(), &["status"]).await?;
    ensure!(
        out.lines()
            .any(|line| line.starts_with("strict") && line.contains("unapproved")),
        "{out}"
    );
    ensure!(
        daemon.log().contains("the package names no exact version"),
        "{}",
        daemon.log()
    );

    std::fs::write(&warned_file, "description")?;
    std::fs::write(&ignored_file, "description")?;
    let description = |answer: &Value, tool: &str| {
        answer["result"]["tools"]
            .as_array()
            .and_then(|tools| tools.iter().find(|t| t["name"] == tool))
            .and_then(|t| t["description"].as_str())
            .map(str::to_string)
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = session.request("tools/list", json!({})).await?;
        let changed = |tool| description(&answer, tool).is_some_and(|d| d.contains("id_rsa"));
        if changed("warned__echo") && changed("ignored__echo") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "changes were not exposed: {answer}\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = call(&mut session, "warned__echo", json!({"text": "warned"})).await?;
    ensure!(
        answer["result"]["content"][0]["text"] == "warned",
        "{answer}"
    );
    let log = daemon.log();
    ensure!(
        log.lines().any(
            |l| l.contains("schema changed") && l.contains("upstream=\"warned\"")
                || l.contains("schema changed") && l.contains("upstream=warned")
        ),
        "warn did not alert\n{log}"
    );
    ensure!(
        !log.lines()
            .any(|l| l.contains("schema changed") && l.contains("ignored")),
        "ignore alerted\n{log}"
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(r#"plexus_schema_checks_total{outcome="changed",upstream="ignored"}"#),
        "{text}"
    );

    // A reload re-reads the policy without restarting the upstream: `block` now holds
    // the change `warn` let through.
    let config_path = daemon.dir.path().join("config.toml");
    let config = std::fs::read_to_string(&config_path)?;
    std::fs::write(
        &config_path,
        config.replace(
            "on_schema_change = \"warn\"",
            "on_schema_change = \"block\"",
        ),
    )?;
    let report = daemon.reload().await?;
    ensure!(
        report["updated"] == json!(["warned"]) && report["restarted"] == json!([]),
        "{report}"
    );
    let answer = call(&mut session, "warned__echo", json!({"text": "held"})).await?;
    quarantined(&answer, "security").context("after the policy became block")?;

    let (code, out, err) = pins(daemon.dir.path(), &["approve", "strict"]).await?;
    ensure!(code == 0, "{out} {err}");
    let tools = listed(&mut session, "tools").await?;
    ensure!(has(&tools, "strict__echo"), "{tools:?}");
    let answer = call(&mut session, "strict__echo", json!({"text": "approved"})).await?;
    ensure!(
        answer["result"]["content"][0]["text"] == "approved",
        "{answer}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_pin_file_fails_closed_until_mended() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pin_path = dir.path().join("plexus.lock");
    let corrupt = "{\n  \"format\": 2,\n  \"upstreams\": { oops\n";
    std::fs::write(&pin_path, corrupt)?;
    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(alpha("v1"))
        .start()
        .await?;
    daemon.wait_ready(WAIT).await?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            daemon.log().contains("is not a valid pin file (line 3"),
            "the error does not name the line: {}",
            daemon.log()
        );
        Ok(())
    })
    .await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = listed(&mut session, "tools").await?;
    ensure!(tools.is_empty(), "a corrupt pin file exposed {tools:?}");
    let answer = call(&mut session, "alpha__echo", json!({"text": "x"})).await?;
    let change = quarantined(&answer, "pin_file_unreadable")?;
    ensure!(
        change["reason"]
            .as_str()
            .is_some_and(|r| r.contains("line 3")),
        "{answer}"
    );
    let text = metrics(&daemon).await?;
    ensure!(
        text.contains(
            r#"plexus_schema_checks_total{outcome="pin_file_unreadable",upstream="alpha"}"#
        ),
        "{text}"
    );
    let (code, _, err) = pins(daemon.dir.path(), &["approve", "alpha"]).await?;
    ensure!(code == 1 && err.contains("line 3"), "{err}");
    ensure!(
        std::fs::read_to_string(&pin_path)? == corrupt,
        "the pin file was overwritten"
    );

    // Mended (here: removed) and reloaded, the upstream is pinned afresh and exposed.
    std::fs::remove_file(&pin_path)?;
    daemon.reload().await?;
    listed_until(
        &mut session,
        "tools",
        |names| has(names, "alpha__echo"),
        &daemon,
    )
    .await?;
    eventually(Duration::from_secs(10), async || {
        ensure!(
            pin_path.exists(),
            "not pinned after the mend: {}",
            daemon.log()
        );
        Ok(())
    })
    .await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An upstream a reload adds is judged as it enters, against the pins as they read
/// then; when the same reload finds the pin file readable again, it is judged once
/// more: a lazy upstream's cached listing is not left held for a file that now reads
/// (held, it would never be called, so never listed afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_added_by_the_reload_that_mends_the_pin_file_is_judged_against_it(
) -> anyhow::Result<()> {
    let lazy = |name: &str| fixture_upstream(name, "start = \"lazy\"", &["--name", name]);
    // A first run lists both lazy upstreams once (nothing of them is cached yet).
    let daemon = Daemon::builder()
        .upstreams(format!("{}{}", lazy("beta"), lazy("gamma")))
        .start()
        .await?;
    daemon.wait_ready(WAIT).await?;
    let cached = |dir: &Path, name: &str| {
        dir.join("state")
            .join("catalog")
            .join(format!("{name}.json"))
            .exists()
    };
    let dir = daemon.dir.path().to_path_buf();
    eventually(WAIT, async || {
        ensure!(
            cached(&dir, "beta") && cached(&dir, "gamma"),
            "nothing cached: {}",
            daemon.log()
        );
        Ok(())
    })
    .await?;
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success(), "plexus exited with {status}");

    // Restarted with a corrupt pin file and gamma alone: its cached listing is held.
    let pin_path = dir.path().join("plexus.lock");
    std::fs::write(&pin_path, "{ oops")?;
    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(lazy("gamma"))
        .start()
        .await?;
    daemon.wait_ready(WAIT).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let tools = listed(&mut session, "tools").await?;
    ensure!(tools.is_empty(), "a corrupt pin file exposed {tools:?}");

    // One reload mends the file (here: removes it) and adds beta, which enters with
    // its cached listing while the pins still cannot be read.
    std::fs::remove_file(&pin_path)?;
    let config_path = daemon.dir.path().join("config.toml");
    let config = std::fs::read_to_string(&config_path)?;
    std::fs::write(&config_path, format!("{config}\n{}", lazy("beta")))?;
    let report = daemon.reload().await?;
    ensure!(report["added"] == json!(["beta"]), "{report}");
    let tools = listed(&mut session, "tools").await?;
    ensure!(
        has(&tools, "beta__echo") && has(&tools, "gamma__echo"),
        "still held after the mend: {tools:?}\n{}",
        daemon.log()
    );
    let answer = call(&mut session, "beta__echo", json!({"text": "mended"})).await?;
    ensure!(
        answer["result"]["content"][0]["text"] == "mended",
        "{answer}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexus_hash_equals_what_the_daemon_pinned() -> anyhow::Result<()> {
    // `explore` counts this uvx package's processes.
    let _census = plexus_tests::PROCESS_CENSUS.lock().await;
    let section =
        "[upstreams.time]\nuvx = \"mcp-server-time@2026.10.19\"\ninit_timeout = \"120s\"\n";
    let daemon = Daemon::builder().upstreams(section).start().await?;
    daemon.wait_ready(Duration::from_secs(120)).await?;
    let pin_path = daemon.dir.path().join("plexus.lock");
    eventually(Duration::from_secs(10), async || {
        ensure!(pin_path.exists(), "no pin file: {}", daemon.log());
        Ok(())
    })
    .await?;
    let output = tokio::process::Command::new(plexus_binary())
        .args(["hash", "time", "--config"])
        .arg(daemon.dir.path().join("config.toml"))
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let hashed: Value = serde_json::from_slice(&output.stdout)?;
    let pinned: Value = serde_json::from_str(&std::fs::read_to_string(&pin_path)?)?;
    let record = &pinned["upstreams"]["time"]["pinned"];
    ensure!(
        hashed["catalogFingerprint"] == record["catalog_fingerprint"],
        "hash {} != pinned {}",
        hashed["catalogFingerprint"],
        record["catalog_fingerprint"]
    );
    for tool in hashed["entries"]["tools"].as_array().context("tools")? {
        let name = tool["identity"].as_str().context("identity")?;
        let pin = &record["entries"][format!("tools/{name}")];
        ensure!(
            tool["security"] == pin["security"] && tool["compatibility"] == pin["compatibility"],
            "{name}: {tool} vs {pin}"
        );
    }
    ensure!(
        record["server"]["version"].is_string(),
        "the resolved version is pinned: {record}"
    );
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// A tool that changes under a session's own instance (`share = "session"`) is held
/// for that session as it would be under a shared one: every instance's listing,
/// at its start and after its `list_changed`, goes through the catalog and the
/// pin check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_changes_under_a_sessions_own_instance_is_held() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    let daemon = Daemon::builder()
        .upstreams(drifting("mine", &drift_file, "share = \"session\""))
        .start()
        .await?;
    let mut session = session_listing(&daemon, "tools", "mine__add").await?;
    // The session's own instance starts with its first call.
    let added = call(&mut session, "mine__add", json!({"a": 2, "b": 3})).await?;
    ensure!(added["result"]["content"][0]["text"] == "5", "{added}");
    let started = daemon
        .log()
        .matches("upstream initialized upstream=mine ")
        .count();
    // Its process now lists `add` with a renamed required parameter and says so.
    std::fs::write(&drift_file, "rename-required")?;
    let answer = refused_until_quarantined(&mut session, "mine__add", &daemon).await?;
    quarantined(&answer, "breaking")?;
    // Held in the session's own instance's run: no other process listed it.
    ensure!(
        daemon
            .log()
            .matches("upstream initialized upstream=mine ")
            .count()
            == started,
        "{}",
        daemon.log()
    );
    let (_, pins_status) = daemon.admin_get("/pins").await?;
    ensure!(pins_status.contains("pending"), "{pins_status}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_taken_just_before_a_stop_are_on_disk_after_it() -> anyhow::Result<()> {
    // Stopped as soon as it is ready: the first pins' write, which waits a moment
    // for more changes, is made before the daemon exits.
    let daemon = Daemon::builder().upstreams(alpha("v1")).start().await?;
    daemon.wait_ready(WAIT).await?;
    let started = Instant::now();
    let (status, dir) = daemon.stop_keeping_state().await?;
    println!("stopped {:?} after ready", started.elapsed());
    ensure!(status.success(), "{status}");
    let pin_path = dir.path().join("plexus.lock");
    let pinned: Value = serde_json::from_str(
        &std::fs::read_to_string(&pin_path).context("no pin file after the stop")?,
    )?;
    ensure!(
        pinned["upstreams"]["alpha"]["pinned"]["entries"]["tools/add"].is_object(),
        "{pinned}"
    );
    Ok(())
}

/// A `serve --stdio` daemon has no admin listener: `plexus pins approve` changes its
/// pin file (kept away from the config here), which the daemon watches, and is not
/// answered by the HTTP daemon of another config listening at the admin address
/// this config names (as the default port would be), which has nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_reaches_a_stdio_daemon_past_another_configs_daemon() -> anyhow::Result<()> {
    let other = Daemon::builder().upstreams(alpha("v1")).start().await?;
    other.wait_ready(WAIT).await?;

    let dir = tempfile::tempdir()?;
    let drift_file = dir.path().join("drift");
    std::fs::write(&drift_file, "")?;
    std::fs::create_dir(dir.path().join("pins"))?;
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nadmin_listen = {:?}\nstate_dir = {:?}\npins = {:?}\n\n{}",
            other.admin.trim_start_matches("http://"),
            dir.path().join("state").display().to_string(),
            dir.path().join("pins/plexus.lock").display().to_string(),
            drifting("alpha", &drift_file, ""),
        ),
    )?;
    let config = config.display().to_string();
    let mut stdio =
        RawStdioSession::spawn(&plexus_binary(), &["serve", "--stdio", "--config", &config])
            .await?;
    // The drift renames `a` to `x` in the listing only: the fixture still adds `a`.
    let add = |arguments: Value| json!({"name": "alpha__add", "arguments": arguments});
    let first = stdio
        .request("tools/call", add(json!({"a": 1, "b": 2})))
        .await?;
    ensure!(first.get("result").is_some(), "{first}");

    std::fs::write(&drift_file, "rename-required")?;
    let held = eventually(WAIT, async || {
        let answer = stdio
            .request("tools/call", add(json!({"x": 1, "a": 1, "b": 2})))
            .await?;
        ensure!(answer["error"]["code"] == -33006, "never held: {answer}");
        Ok(answer)
    })
    .await?;
    quarantined(&held, "breaking")?;
    // The change is on disk once its write's moment has passed.
    eventually(WAIT, async || {
        let (code, out, err) = pins(dir.path(), &["status", "--json"]).await?;
        let status: Value = serde_json::from_str(&out).with_context(|| format!("{code} {err}"))?;
        ensure!(
            status["upstreams"]["alpha"]["state"] == "changed",
            "{status}"
        );
        ensure!(
            status["stdio_daemons"]
                .as_array()
                .is_some_and(|pids| pids.len() == 1),
            "{status}"
        );
        Ok(())
    })
    .await?;

    let (code, out, err) = pins(dir.path(), &["approve", "alpha/add"]).await?;
    ensure!(code == 0, "approve refused ({code}): {out} {err}");
    ensure!(
        out.contains("approved `add` of upstream `alpha` (2 changes)")
            && out.contains("`plexus serve --stdio` daemon, pid"),
        "{out}"
    );
    let started = Instant::now();
    let called = eventually(WAIT, async || {
        let answer = stdio
            .request("tools/call", add(json!({"x": 1, "a": 1, "b": 2})))
            .await?;
        ensure!(answer.get("result").is_some(), "still held: {answer}");
        Ok(answer)
    })
    .await?;
    println!(
        "the stdio daemon serves the approved tool {:?} after the approval",
        started.elapsed()
    );
    ensure!(
        called["result"]["structuredContent"]["sum"] == 3,
        "{called}"
    );

    // The daemon's record of itself goes with it.
    let records = || -> anyhow::Result<usize> {
        Ok(std::fs::read_dir(dir.path().join("state"))?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("stdio-"))
            .count())
    };
    ensure!(records()? == 1, "no stdio-<pid>.json while it serves");
    stdio.close().await;
    ensure!(records()? == 0, "stdio-<pid>.json outlived its daemon");

    // The other config's daemon and its pin file are untouched.
    let (_, theirs) = other.admin_get("/pins").await?;
    let theirs: Value = serde_json::from_str(&theirs)?;
    ensure!(
        theirs["upstreams"]["alpha"]["state"] == "pinned",
        "{theirs}"
    );
    ensure!(theirs["upstreams"]["alpha"]["approvals"] == 0, "{theirs}");
    ensure!(other.stop().await?.success());
    Ok(())
}
