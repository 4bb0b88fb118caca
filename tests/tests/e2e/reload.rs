//! Hot reload against a real daemon and real fixture processes, with a client
//! session open across every reload: the file watcher, SIGHUP, `plexus reload`
//! and `POST /reload` all change only what the file changed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use plexus_tests::{
    eventually, fixture_binary, fixture_upstream, http_client, plexus_binary, processes_matching,
    tool_names, Client, Daemon, RawHttpSession, TestClient,
};
use serde_json::{json, Value};

/// A fixture upstream whose processes can be found by `--name <name>`.
fn fixture(name: &str, extra: &str) -> String {
    fixture_upstream(name, extra, &["--name", name])
}

const DAEMON: &str = "drain_timeout = \"1s\"";

/// Rewrites the daemon's config file with the same `[daemon]` section and these
/// upstream sections, replacing it in one step as editors do.
fn rewrite(daemon: &Daemon, sections: &str) -> anyhow::Result<()> {
    let text = config_text(daemon, sections);
    replace_file(&daemon.dir.path().join("config.toml"), &text)
}

fn config_text(daemon: &Daemon, sections: &str) -> String {
    let state = daemon.dir.path().join("state");
    format!(
        "[daemon]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nstate_dir = {:?}\n{DAEMON}\n\n{sections}",
        state.display().to_string()
    )
}

fn replace_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let temporary = path.with_extension("toml.tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}

/// The one process serving upstream `name`.
fn pid_of(name: &str) -> anyhow::Result<i32> {
    let needle = format!("--name {name}");
    match processes_matching(&needle)[..] {
        [pid] => Ok(pid),
        ref pids => bail!("expected one process with `{needle}`, found {pids:?}"),
    }
}

async fn wait_for_pid_change(name: &str, old: i32) -> anyhow::Result<i32> {
    let needle = format!("--name {name}");
    eventually(Duration::from_secs(20), async || {
        ensure!(
            matches!(processes_matching(&needle)[..], [pid] if pid != old),
            "`{name}` was not replaced by one new process: {:?}",
            processes_matching(&needle)
        );
        Ok(())
    })
    .await?;
    pid_of(name)
}

/// Waits until the catalog's tool names satisfy `wanted`.
async fn until_tools(
    client: &Client,
    daemon: &Daemon,
    wanted: impl Fn(&[String]) -> bool,
) -> anyhow::Result<Vec<String>> {
    eventually(Duration::from_secs(10), async || {
        let names = tool_names(client).await?;
        ensure!(
            wanted(&names),
            "the catalog never got there: {names:?}\n{}",
            daemon.log()
        );
        Ok(names)
    })
    .await
}

async fn echo(session: &mut RawHttpSession, tool: &str, text: &str) -> anyhow::Result<()> {
    let answer = session
        .request(
            "tools/call",
            json!({"name": tool, "arguments": {"text": text}}),
        )
        .await?;
    ensure!(
        answer["result"]["content"][0]["text"] == text,
        "{tool}: {answer}"
    );
    Ok(())
}

async fn reloads(daemon: &Daemon, outcome: &str) -> anyhow::Result<f64> {
    let series = format!("plexus_config_reloads_total{{outcome=\"{outcome}\"}}");
    Ok(daemon.metric(&series).await?.unwrap_or(0.0))
}

async fn until_reloads(daemon: &Daemon, outcome: &str, at_least: f64) -> anyhow::Result<()> {
    eventually(Duration::from_secs(10), async || {
        ensure!(
            reloads(daemon, outcome).await? >= at_least,
            "no {outcome} reload: {}",
            daemon.log()
        );
        Ok(())
    })
    .await
}

/// `plexus reload --config <the daemon's file>`: (exit code, the JSON it printed).
async fn plexus_reload(daemon: &Daemon) -> anyhow::Result<(i32, Value)> {
    let output = tokio::process::Command::new(plexus_binary())
        .arg("reload")
        .arg("--config")
        .arg(daemon.dir.path().join("config.toml"))
        .stdin(Stdio::null())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).with_context(|| {
        format!(
            "plexus reload printed {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    Ok((output.status.code().unwrap_or(-1), report))
}

/// A ready daemon on `sections`; the tests' turn is held while the guard lives.
async fn started(sections: &str) -> anyhow::Result<(tokio::sync::MutexGuard<'static, ()>, Daemon)> {
    // The tests find upstream processes by name, so they run one at a time.
    let turn = plexus_tests::PROCESS_CENSUS.lock().await;
    check_built()?;
    let daemon = Daemon::builder()
        .daemon(DAEMON)
        .upstreams(sections)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    Ok((turn, daemon))
}

/// A client that hears list changes, once the catalog lists `tool`.
async fn watching(daemon: &Daemon, tool: &str) -> anyhow::Result<(TestClient, Client)> {
    let handler = TestClient::default();
    let client = http_client(&daemon.url, handler.clone()).await?;
    until_tools(&client, daemon, |names| {
        names.iter().any(|name| name == tool)
    })
    .await?;
    Ok((handler, client))
}

fn check_built() -> anyhow::Result<()> {
    ensure!(
        fixture_binary().exists() && plexus_binary().exists(),
        "run `cargo build --workspace --bins` first"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_are_added_and_removed_with_a_call_in_flight() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let (handler, client) = watching(&daemon, "alpha__echo").await?;
    let alpha = pid_of("alpha")?;

    // Added: started as at boot, announced, and callable.
    rewrite(&daemon, &(fixture("alpha", "") + &fixture("beta", "")))?;
    tokio::time::timeout(Duration::from_secs(20), handler.tools_changed.notified())
        .await
        .context("no tools/list_changed for the added upstream")?;
    until_tools(&client, &daemon, |names| {
        names.contains(&"beta__echo".into())
    })
    .await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    echo(&mut session, "beta__echo", "hello beta").await?;
    let beta = pid_of("beta")?;

    // Removed while a call runs longer than drain_timeout (1 s): its tools leave at
    // once, the call ends with -33007 when the drain time is over, the process goes.
    let url = daemon.url.clone();
    let long_call = tokio::spawn(async move {
        let mut session = RawHttpSession::connect(&url).await?;
        session
            .request(
                "tools/call",
                json!({"name": "beta__sleep", "arguments": {"ms": 10_000}}),
            )
            .await
    });
    daemon.wait_for_in_flight("beta", 1).await?;
    rewrite(&daemon, &fixture("alpha", ""))?;
    until_tools(&client, &daemon, |names| {
        !names.iter().any(|name| name.starts_with("beta__"))
    })
    .await?;
    let answer = tokio::time::timeout(Duration::from_secs(8), long_call)
        .await
        .context("the call on the removed upstream was not ended by the drain")???;
    ensure!(answer["error"]["code"] == -33007, "{answer}");
    ensure!(answer["error"]["data"]["upstream"] == "beta", "{answer}");
    eventually(Duration::from_secs(10), async || {
        ensure!(
            processes_matching("--name beta").is_empty(),
            "beta's process {beta} outlived its removal"
        );
        Ok(())
    })
    .await?;
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    ensure!(
        !metrics.contains("upstream=\"beta\""),
        "a removed upstream's series remain:\n{metrics}"
    );
    // A call to it now is refused precisely, and the session and alpha are untouched.
    let refused = session
        .request(
            "tools/call",
            json!({"name": "beta__echo", "arguments": {"text": "x"}}),
        )
        .await?;
    ensure!(refused["error"]["code"] == -32602, "{refused}");
    echo(&mut session, "alpha__echo", "still here").await?;
    ensure!(pid_of("alpha")? == alpha, "alpha was restarted");
    ensure!(reloads(&daemon, "applied").await? >= 2.0);
    ensure!(
        daemon
            .metric("plexus_config_last_reload_successful")
            .await?
            == Some(1.0)
    );

    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_upstream_is_replaced_while_another_call_runs() -> anyhow::Result<()> {
    let sections = fixture("alpha", "") + &fixture("beta", "");
    let (_turn, daemon) = started(&sections).await?;
    let client = http_client(&daemon.url, TestClient::default()).await?;
    let (alpha, beta) = (pid_of("alpha")?, pid_of("beta")?);

    let url = daemon.url.clone();
    let long_call = tokio::spawn(async move {
        let mut session = RawHttpSession::connect(&url).await?;
        session
            .request(
                "tools/call",
                json!({"name": "alpha__sleep", "arguments": {"ms": 2500}}),
            )
            .await
    });
    daemon.wait_for_in_flight("alpha", 1).await?;
    // beta's args change: a new process; alpha is untouched.
    let changed = fixture("alpha", "")
        + &fixture_upstream("beta", "", &["--name", "beta", "--add-schema", "v2"]);
    rewrite(&daemon, &changed)?;
    let new_beta = wait_for_pid_change("beta", beta).await?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    // New calls reach the new process once it serves.
    for _ in 0..100 {
        if pid_of("beta").is_ok() && processes_matching("--name beta --add-schema v2").len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    echo(&mut session, "beta__echo", "after the change").await?;
    let answer = long_call.await??;
    ensure!(
        answer.get("result").is_some(),
        "the call on the unchanged upstream failed: {answer}"
    );
    ensure!(pid_of("alpha")? == alpha, "alpha was restarted");
    ensure!(pid_of("beta")? == new_beta);
    let _ = tool_names(&client).await?;
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_command_that_fails_leaves_the_old_instance_serving() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let alpha = pid_of("alpha")?;
    let broken = "[upstreams.alpha]\ncommand = \"/nonexistent/plexus-fixture\"\nargs = [\"--name\", \"alpha\"]\n";
    std::fs::write(
        daemon.dir.path().join("config.toml"),
        config_text(&daemon, broken),
    )?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 1, "exit {code}: {report}");
    ensure!(report["outcome"] == "partial", "{report}");
    ensure!(report["failed"][0]["upstream"] == "alpha", "{report}");
    let reason = report["failed"][0]["error"].as_str().unwrap_or_default();
    ensure!(reason.contains("nonexistent"), "{report}");
    ensure!(pid_of("alpha")? == alpha, "the old instance was stopped");
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    echo(&mut session, "alpha__echo", "old instance").await?;
    ensure!(
        daemon
            .metric("plexus_config_last_reload_successful")
            .await?
            == Some(0.0)
    );

    // Fixed: the next reload replaces it.
    rewrite(
        &daemon,
        &fixture("alpha", "call_timeout = \"30s\"\nmax_in_flight = 8"),
    )?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 0, "exit {code}: {report}");
    ensure!(report["outcome"] == "applied", "{report}");
    echo(&mut session, "alpha__echo", "after the fix").await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_files_are_rejected_and_change_nothing() -> anyhow::Result<()> {
    let sections = fixture("alpha", "");
    let (_turn, daemon) = started(&sections).await?;
    let alpha = pid_of("alpha")?;
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    let good = config_text(&daemon, &sections);
    let cases = [
        (
            "a syntax error",
            format!("{good}\n[upstreams.beta\n"),
            "(file)",
        ),
        (
            "an unknown key",
            format!("{good}\nflavour = \"mint\"\n"),
            "upstreams.alpha",
        ),
        ("a duplicate name", format!("{good}\n{sections}"), "(file)"),
        (
            "a half-written file",
            good[..good.len() - 12].to_string(),
            "",
        ),
    ];
    for (number, (what, text, key)) in cases.iter().enumerate() {
        replace_file(&daemon.dir.path().join("config.toml"), text)?;
        let (code, report) = plexus_reload(&daemon).await?;
        ensure!(code == 1, "{what}: exit {code}: {report}");
        ensure!(report["outcome"] == "rejected", "{what}: {report}");
        let errors = report["errors"].as_array().context("errors")?;
        ensure!(!errors.is_empty(), "{what}: {report}");
        ensure!(
            errors
                .iter()
                .any(|e| e.as_str().unwrap_or_default().contains(key)),
            "{what}: no error names `{key}`: {report}"
        );
        until_reloads(&daemon, "rejected", (number + 1) as f64).await?;
        ensure!(
            daemon
                .metric("plexus_config_last_reload_successful")
                .await?
                == Some(0.0)
        );
        ensure!(pid_of("alpha")? == alpha, "{what}: alpha was restarted");
        echo(&mut session, "alpha__echo", what).await?;
    }
    // The next good file applies.
    rewrite(&daemon, &(sections.clone() + &fixture("beta", "")))?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 0 && report["outcome"] == "applied", "{report}");
    daemon.wait_ready(Duration::from_secs(20)).await?;
    echo(&mut session, "beta__echo", "valid again").await?;
    ensure!(pid_of("alpha")? == alpha);
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_sighups_while_the_file_changes_coalesces() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let alpha = pid_of("alpha")?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.pid().context("pid")?)?);
    let before = reloads(&daemon, "applied").await? + reloads(&daemon, "rejected").await?;
    for round in 0..50 {
        // The file changes under the signals: gamma comes and goes, and stays at the end.
        if round % 10 == 0 {
            let extra = if round % 20 == 0 {
                fixture("gamma", "")
            } else {
                String::new()
            };
            rewrite(&daemon, &(fixture("alpha", "") + &extra))?;
        }
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
        // The burst's pace: 50 signals over about a second, the file changing under them.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rewrite(&daemon, &(fixture("alpha", "") + &fixture("gamma", "")))?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
    // Settled: the final file's upstreams, one process each.
    eventually(Duration::from_secs(20), async || {
        ensure!(
            processes_matching("--name gamma").len() == 1,
            "gamma: {:?}\n{}",
            processes_matching("--name gamma"),
            daemon.log()
        );
        Ok(())
    })
    .await?;
    daemon.wait_ready(Duration::from_secs(20)).await?;
    // A reload that answers is queued behind every signal sent before it: once it has,
    // no reload of the burst is left to come. It is not one of the burst's.
    let barrier = daemon.reload().await?;
    ensure!(barrier["outcome"] == "applied", "{barrier}");
    let after = reloads(&daemon, "applied").await? + reloads(&daemon, "rejected").await?;
    let done = after - before - 1.0;
    println!("51 SIGHUPs and 6 writes gave {done} reloads");
    ensure!(
        (1.0..=6.0).contains(&done),
        "{done} reloads for 51 SIGHUPs and 6 writes: they should coalesce"
    );
    ensure!(processes_matching("--name gamma").len() == 1);
    ensure!(pid_of("alpha")? == alpha, "alpha was restarted");
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    echo(&mut session, "gamma__echo", "settled").await?;
    ensure!(daemon.stop().await?.success(), "the daemon did not survive");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editors_rename_over_save_and_a_prefix_change_apply_in_place() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let (handler, client) = watching(&daemon, "alpha__echo").await?;
    let alpha = pid_of("alpha")?;

    // Written to a temporary file and renamed over the config: no signal, no command.
    rewrite(&daemon, &fixture("alpha", "prefix = \"renamed\""))?;
    tokio::time::timeout(Duration::from_secs(20), handler.tools_changed.notified())
        .await
        .context("no tools/list_changed after the prefix change")?;
    let names = until_tools(&client, &daemon, |names| {
        names.contains(&"renamed__echo".into())
    })
    .await?;
    ensure!(
        !names.iter().any(|name| name.starts_with("alpha__")),
        "{names:?}"
    );
    ensure!(
        pid_of("alpha")? == alpha,
        "a prefix change restarted the process"
    );
    let mut session = RawHttpSession::connect(&daemon.url).await?;
    echo(&mut session, "renamed__echo", "same process").await?;
    ensure!(reloads(&daemon, "applied").await? >= 1.0);
    let (_, metrics) = daemon.admin_get("/metrics").await?;
    let file = std::fs::read(daemon.dir.path().join("config.toml"))?;
    let sha256: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(&file)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    ensure!(
        metrics.contains(&format!("plexus_config_info{{sha256=\"{sha256}\"}} 1")),
        "{metrics}"
    );
    client.cancel().await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}

/// An editor's save is applied by the watcher; `plexus reload` run a moment later
/// still reports what the edit changed, as the watcher's reload (`cause`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexus_reload_after_the_watcher_reports_the_edits_changes() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(
        code == 0 && report["cause"] == "admin",
        "exit {code}: {report}"
    );
    ensure!(report["added"] == json!([]), "{report}");

    let before = reloads(&daemon, "applied").await?;
    rewrite(
        &daemon,
        &format!("{}\n{}", fixture("alpha", ""), fixture("beta", "")),
    )?;
    // The watcher's reload has run (its metric counts it) before `plexus reload` asks.
    until_reloads(&daemon, "applied", before + 1.0).await?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 0, "exit {code}: {report}");
    ensure!(
        report["added"] == json!(["beta"]) && report["cause"] == "file_changed",
        "{report}"
    );

    // An explicit reload that changes something reports itself.
    rewrite(&daemon, &fixture("alpha", ""))?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 0, "exit {code}: {report}");
    ensure!(report["removed"] == json!(["beta"]), "{report}");
    ensure!(daemon.stop().await?.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexus_reload_reports_good_and_bad_files() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 0, "exit {code}: {report}");
    ensure!(report["outcome"] == "applied", "{report}");
    ensure!(report["errors"] == json!([]), "{report}");
    ensure!(
        report["sha256"].as_str().is_some_and(|s| s.len() == 64),
        "{report}"
    );
    ensure!(report["needs_restart"] == json!([]), "{report}");

    std::fs::write(
        daemon.dir.path().join("config.toml"),
        config_text(&daemon, &fixture("alpha", "max_in_flight = \"many\"")),
    )?;
    let (code, report) = plexus_reload(&daemon).await?;
    ensure!(code == 1, "exit {code}: {report}");
    ensure!(report["outcome"] == "rejected", "{report}");
    ensure!(
        report["errors"][0]
            .as_str()
            .is_some_and(|error| error.starts_with("upstreams.alpha")),
        "{report}"
    );

    // POST /reload answers the same report; a daemon that is gone is exit 69.
    let response = reqwest::Client::new()
        .post(format!("{}/reload", daemon.admin))
        .send()
        .await?;
    ensure!(response.status().as_u16() == 422);
    let body: Value = response.json().await?;
    ensure!(body["outcome"] == "rejected", "{body}");
    let dir = daemon.dir.path().to_path_buf();
    ensure!(daemon.stop_keeping_state().await?.0.success());
    let output = tokio::process::Command::new(plexus_binary())
        .arg("reload")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--admin")
        .arg("127.0.0.1:9")
        .output()
        .await?;
    ensure!(output.status.code() == Some(69), "{output:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_refuses_cross_origin_and_foreign_hosts() -> anyhow::Result<()> {
    let (_turn, daemon) = started(&fixture("alpha", "")).await?;
    let alpha = pid_of("alpha")?;
    let http = reqwest::Client::new();
    for path in ["/reload", "/upstreams/alpha/restart"] {
        let response = http
            .post(format!("{}{path}", daemon.admin))
            .header("origin", "http://evil.example")
            .send()
            .await?;
        ensure!(
            response.status().as_u16() == 403,
            "{path}: {}",
            response.status()
        );
    }
    let response = http
        .get(format!("{}/metrics", daemon.admin))
        .header("host", "evil.example:7465")
        .send()
        .await?;
    ensure!(response.status().as_u16() == 403, "{}", response.status());
    let response = http
        .post(format!("{}/reload", daemon.admin))
        .header("host", "rebound.example")
        .send()
        .await?;
    ensure!(response.status().as_u16() == 403, "{}", response.status());
    // Nothing was reloaded or restarted.
    ensure!(reloads(&daemon, "applied").await? == 0.0);
    ensure!(pid_of("alpha")? == alpha);
    // Scrapes and operators' own requests still work.
    let (status, _) = daemon.admin_get("/metrics").await?;
    ensure!(status == 200);
    let response = http
        .post(format!("{}/upstreams/alpha/restart", daemon.admin))
        .send()
        .await?;
    ensure!(response.status().as_u16() == 202, "{}", response.status());
    // It replaced the very process the refused requests found: none of them
    // restarted it, not even after its 403.
    let answer: Value = response.json().await?;
    ensure!(answer["previous_pid"] == alpha, "{answer}");
    wait_for_pid_change("alpha", alpha).await?;
    ensure!(daemon.stop().await?.success());
    Ok(())
}
