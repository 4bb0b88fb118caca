//! plexus as the OAuth client of a hosted upstream, end to end against a real
//! authorization server (oidc-provider, `tests/idp/provider.mjs`) and a real
//! protected MCP server (plexus A, whose front admits the provider's tokens,
//! fronting the fixture). plexus B lists A as an upstream with no headers: it
//! waits in `needs_login`; `plexus login` (a `$BROWSER` that signs in on the
//! provider's form) stores encrypted tokens and brings the upstream up without
//! a restart; 50 concurrent calls on a token due for refresh cause one refresh; a
//! call refused when A's audience moves is sent again after a refresh;
//! `plexus logout` sends it back to `needs_login`, where calls get -33001 with
//! `data.login` and the cached catalog is still listed. `plexus login --device`
//! prints a user code that a person enters at the provider's device page
//! (`tests/python/oauth_device.py`), and the upstream comes up the same way.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{
    fixture_upstream, plexus_binary, restartable_port, venv_python, workspace_root, Daemon,
    RawHttpSession,
};
use serde_json::{json, Value};
use tokio::process::Command;

use crate::sso::{audience, daemon_lines, installed, Idp};

/// The access tokens' lifetime at the provider: due for a refresh at half of it.
const ACCESS_TTL_S: u64 = 20;

fn upstream_state(status: &str, name: &str) -> anyhow::Result<String> {
    let status: Value = serde_json::from_str(status)?;
    status["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|upstream| upstream["name"] == name)
        .and_then(|upstream| upstream["state"].as_str())
        .map(str::to_string)
        .with_context(|| format!("no upstream {name} in {status}"))
}

async fn wait_for_state(daemon: &Daemon, name: &str, wanted: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = daemon.admin_get("/status").await?;
        let state = upstream_state(&status, name)?;
        if state == wanted {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{name} stayed `{state}`, not `{wanted}`: {}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `plexus ARGS --config B's config` with `$BROWSER` signing in as alice.
async fn plexus(b: &Daemon, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let browser = format!(
        "{} {} --login alice --log {}",
        venv_python().display(),
        workspace_root()
            .join("tests/python/oauth_browser.py")
            .display(),
        b.dir.path().join("browser.log").display()
    );
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(plexus_binary())
            .args(args)
            .arg("--config")
            .arg(b.dir.path().join("config.toml"))
            .env("BROWSER", browser)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("plexus did not finish")??;
    Ok(output)
}

fn refreshes(outcome: &str) -> String {
    format!("plexus_oauth_refresh_total{{outcome=\"{outcome}\",upstream=\"hosted\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_upstream_waits_for_a_login_and_refreshes_once_for_many_calls(
) -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let port = restartable_port()?;
    let ttl = ACCESS_TTL_S.to_string();
    let idp = Idp::start_with(
        dir.path(),
        restartable_port()?,
        &audience(port),
        &[("IDP_ACCESS_TTL", &ttl), ("IDP_REFRESH", "1")],
    )
    .await?;
    let a = Daemon::builder()
        .listen(format!("127.0.0.1:{port}"))
        .daemon(daemon_lines(&idp.issuer(), port, ""))
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    a.wait_ready(Duration::from_secs(60)).await?;
    let audit = dir.path().join("b-audit.jsonl");
    let b = Daemon::builder()
        .daemon(format!("audit_log = {:?}", audit.display().to_string()))
        .upstreams(format!("[upstreams.hosted]\nurl = {:?}\n", a.url))
        .start()
        .await?;

    // No login yet: needs_login in /status and the state metric, not a restart loop.
    wait_for_state(&b, "hosted", "needs_login").await?;
    assert_eq!(
        b.metric("plexus_upstream_state{state=\"needs_login\",upstream=\"hosted\"}")
            .await?,
        Some(1.0)
    );
    let (_, text) = b.admin_get("/").await?;
    ensure!(
        text.contains("needs_login"),
        "the page shows no needs_login: {text}"
    );

    // plexus login: the browser signs in, the tokens are stored encrypted, and the
    // running daemon brings the upstream up.
    let started = Instant::now();
    let login = plexus(&b, &["login", "hosted"]).await?;
    ensure!(
        login.status.success(),
        "plexus login failed: {}\n{}\nbrowser: {}\nB: {}\nprovider: {}",
        String::from_utf8_lossy(&login.stdout),
        String::from_utf8_lossy(&login.stderr),
        std::fs::read_to_string(b.dir.path().join("browser.log")).unwrap_or_default(),
        b.log(),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    let logged_in_at = Instant::now();
    println!(
        "plexus login (discovery, registration, sign-in, exchange, upstream up) took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");
    let oauth_dir = b.dir.path().join("state/oauth");
    let mut token_files = 0;
    for entry in std::fs::read_dir(&oauth_dir)? {
        let path = entry?.path();
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path)?.permissions());
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        if path.extension().is_some_and(|e| e == "json") {
            token_files += 1;
            let bytes = std::fs::read(&path)?;
            // Every JWT starts `eyJ` (`{"` in base64url); the file holds none.
            ensure!(bytes.starts_with(b"plexus-oauth-v1\n"), "not encrypted");
            ensure!(
                !bytes.windows(3).any(|w| w == b"eyJ")
                    && !bytes.windows(12).any(|w| w == b"access_token"),
                "the token file holds token text"
            );
        }
    }
    assert_eq!(token_files, 1, "one token file in {}", oauth_dir.display());

    // Calls work through B.
    let mut session = RawHttpSession::connect(&b.url).await?;
    let listed = session.request("tools/list", json!({})).await?;
    ensure!(
        listed.to_string().contains("hosted__fx__echo"),
        "B lists no hosted tools: {listed}"
    );
    let called = session
        .request(
            "tools/call",
            json!({"name": "hosted__fx__echo", "arguments": {"text": "hi"}}),
        )
        .await?;
    ensure!(called["result"].is_object(), "the call failed: {called}");
    assert_eq!(b.metric(&refreshes("ok")).await?, None);

    // Past half its lifetime the token is due: 50 concurrent calls, one refresh.
    let due = Duration::from_secs(ACCESS_TTL_S / 2 + 1);
    tokio::time::sleep(due.saturating_sub(logged_in_at.elapsed())).await;
    let mut sessions = Vec::new();
    for _ in 0..50 {
        sessions.push(RawHttpSession::connect(&b.url).await?);
    }
    let calls = sessions.iter_mut().map(|session| {
        session.request(
            "tools/call",
            json!({"name": "hosted__fx__echo", "arguments": {"text": "again"}}),
        )
    });
    let began = Instant::now();
    let answers = futures::future::join_all(calls).await;
    println!(
        "50 concurrent calls with one refresh took {:.0} ms",
        began.elapsed().as_secs_f64() * 1000.0
    );
    for answer in answers {
        let answer = answer?;
        ensure!(answer["result"].is_object(), "a call failed: {answer}");
    }
    assert_eq!(b.metric(&refreshes("ok")).await?, Some(1.0));

    // A's audience moves (a reload) and the provider's tokens follow: the call
    // refused for its old token is sent again after one refresh, and its caller
    // sees no error; then both move back, the same way.
    let a_config = a.dir.path().join("config.toml");
    let accepted = std::fs::read_to_string(&a_config)?;
    let moved_audience = format!("{}/moved", audience(port));
    let moved = accepted.replace(&audience(port), &moved_audience);
    ensure!(moved != accepted, "no audience in A's config");
    let token_audience = |aud: String| {
        reqwest::Client::new()
            .post(format!("{}/test/token-audience", idp.issuer()))
            .body(json!({ "audience": aud }).to_string())
            .send()
    };
    let mut session = RawHttpSession::connect(&b.url).await?;
    for (step, (config, aud)) in [
        (&moved, moved_audience.clone()),
        (&accepted, audience(port)),
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&a_config, config)?;
        a.reload().await?;
        token_audience(aud).await?.error_for_status()?;
        let called = session
            .request(
                "tools/call",
                json!({"name": "hosted__fx__echo", "arguments": {"text": "refreshed"}}),
            )
            .await?;
        ensure!(
            called["result"].is_object(),
            "the refused call was not sent again with a new token: {called}\nB: {}",
            b.log()
        );
        assert_eq!(b.metric(&refreshes("ok")).await?, Some(2.0 + step as f64));
    }
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");

    // A stops accepting the token before it expires (its audience changed by a
    // reload, the provider's tokens not): the refused call is refreshed once and
    // refused again, and the upstream waits for a login with no more refreshes.
    std::fs::write(&a_config, &moved)?;
    a.reload().await?;
    let call = json!({"name": "hosted__fx__echo", "arguments": {"text": "moved"}});
    let refused = session.request("tools/call", call.clone()).await?;
    ensure!(refused["error"].is_object(), "A took the token: {refused}");
    wait_for_state(&b, "hosted", "needs_login").await?;
    let refused = session.request("tools/call", call).await?;
    assert_eq!(
        refused["error"]["data"]["state"], "needs_login",
        "{refused}"
    );
    assert_eq!(b.metric(&refreshes("ok")).await?, Some(4.0));
    std::fs::write(&a_config, &accepted)?;
    a.reload().await?;
    let back = plexus(&b, &["login", "hosted"]).await?;
    ensure!(
        back.status.success(),
        "logging in again failed: {}",
        String::from_utf8_lossy(&back.stderr)
    );

    // plexus logout: needs_login again; the cached catalog is still listed, and a
    // call says how to log in.
    let logout = plexus(&b, &["logout", "hosted"]).await?;
    ensure!(
        logout.status.success(),
        "plexus logout failed: {}",
        String::from_utf8_lossy(&logout.stderr)
    );
    wait_for_state(&b, "hosted", "needs_login").await?;
    let mut session = RawHttpSession::connect(&b.url).await?;
    let listed = session.request("tools/list", json!({})).await?;
    ensure!(
        listed.to_string().contains("hosted__fx__echo"),
        "the cached catalog is not listed: {listed}"
    );
    let refused = session
        .request(
            "tools/call",
            json!({"name": "hosted__fx__echo", "arguments": {"text": "hi"}}),
        )
        .await?;
    assert_eq!(refused["error"]["code"], -33001, "{refused}");
    assert_eq!(refused["error"]["data"]["state"], "needs_login");
    assert_eq!(refused["error"]["data"]["login"], "plexus login hosted");

    // Logged in again (the registration is reused), then the provider revokes the
    // refresh token: the next refresh gets invalid_grant, and the upstream waits for
    // a login, once, with no loop of refreshes or restarts.
    let again = plexus(&b, &["login", "hosted"]).await?;
    ensure!(
        again.status.success(),
        "the second login failed: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    let logged_in_at = Instant::now();
    let revoked: Value = reqwest::Client::new()
        .post(format!("{}/test/revoke-refresh", idp.issuer()))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        revoked["revoked"].as_u64() >= Some(1),
        "nothing revoked: {revoked}"
    );
    tokio::time::sleep(due.saturating_sub(logged_in_at.elapsed())).await;
    let mut session = RawHttpSession::connect(&b.url).await?;
    let call = json!({"name": "hosted__fx__echo", "arguments": {"text": "late"}});
    let refused = session.request("tools/call", call.clone()).await?;
    assert_eq!(refused["error"]["code"], -33001, "{refused}");
    assert_eq!(refused["error"]["data"]["login"], "plexus login hosted");
    wait_for_state(&b, "hosted", "needs_login").await?;
    let refused = session.request("tools/call", call).await?;
    assert_eq!(
        refused["error"]["data"]["state"], "needs_login",
        "{refused}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.metric(&refreshes("invalid_grant")).await?, Some(1.0));
    assert_eq!(b.metric(&refreshes("ok")).await?, Some(4.0));
    wait_for_state(&b, "hosted", "needs_login").await?;

    let listing = plexus(&b, &["login", "--status"]).await?;
    let listing = String::from_utf8_lossy(&listing.stdout).to_string();
    ensure!(
        listing.contains("hosted\tneeded") && listing.contains("needs_login"),
        "login --status: {listing}"
    );

    // No token text in B's log, audit trail or status.
    let (_, status) = b.admin_get("/status").await?;
    let audit_text = std::fs::read_to_string(&audit)?;
    ensure!(
        audit_text.contains("hosted__fx__echo"),
        "the audit trail has no calls: {audit_text}"
    );
    for (what, text) in [
        ("B's log", b.log()),
        ("B's audit trail", audit_text),
        ("B's status", status),
    ] {
        ensure!(!text.contains("eyJ"), "{what} holds a token");
    }
    idp.stop().await?;
    Ok(())
}

/// The user code and verification URI in `plexus login --device`'s prompt:
/// `… enter code CODE at URI` (with `)` closing the complete form's aside).
fn device_prompt(line: &str) -> Option<(String, String)> {
    let (_, rest) = line.split_once("enter code ")?;
    let (code, uri) = rest.split_once(" at ")?;
    Some((
        code.trim().to_string(),
        uri.trim().trim_end_matches(')').to_string(),
    ))
}

/// `plexus login hosted ARGS` with no `$BROWSER` (and `env` set, `unset`
/// removed): reads the user code from its stderr, has alice enter it at the
/// provider's device page, and waits for plexus to finish.
async fn device_login(
    b: &Daemon,
    idp: &Idp,
    args: &[&str],
    env: &[(&str, &str)],
    unset: &[&str],
) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    let started = Instant::now();
    let mut command = Command::new(plexus_binary());
    command
        .args(["login", "hosted"])
        .args(args)
        .arg("--config")
        .arg(b.dir.path().join("config.toml"))
        .env_remove("BROWSER")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in unset {
        command.env_remove(name);
    }
    let mut login = command.spawn()?;
    let mut stderr = BufReader::new(login.stderr.take().context("no stderr")?).lines();
    let mut shown = String::new();
    let (code, uri) = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await? {
            shown.push_str(&line);
            shown.push('\n');
            if let Some(found) = device_prompt(&line) {
                return Ok(found);
            }
        }
        anyhow::bail!("plexus login printed no device code: {shown}")
    })
    .await
    .context("no device code on stderr")??;
    ensure!(
        uri.starts_with(&idp.issuer()),
        "the verification URI {uri} is not the provider's"
    );
    ensure!(
        !shown.contains("open this URL"),
        "an authorization URL was printed: {shown}"
    );

    // The person, on another device: enters the code, signs in and confirms.
    let person = Command::new(venv_python())
        .arg(workspace_root().join("tests/python/oauth_device.py"))
        .args(["--login", "alice", "--code", &code, &uri])
        .output()
        .await?;
    ensure!(
        person.status.success(),
        "the device page: {}{}\nprovider: {}",
        String::from_utf8_lossy(&person.stdout),
        String::from_utf8_lossy(&person.stderr),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    let rest = tokio::spawn(async move {
        let mut text = String::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let status = tokio::time::timeout(Duration::from_secs(60), login.wait())
        .await
        .context("plexus login did not finish")??;
    let rest = rest.await?;
    ensure!(
        status.success(),
        "plexus login {args:?} failed: {shown}{rest}\nB: {}\nprovider: {}",
        b.log(),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    println!(
        "plexus login {args:?} (code shown, entered, polled, upstream up) took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn logout(b: &Daemon) -> anyhow::Result<()> {
    let logout = plexus(b, &["logout", "hosted"]).await?;
    ensure!(logout.status.success(), "plexus logout failed");
    wait_for_state(b, "hosted", "needs_login").await
}

async fn call_echo(b: &Daemon, text: &str) -> anyhow::Result<()> {
    let mut session = RawHttpSession::connect(&b.url).await?;
    let called = session
        .request(
            "tools/call",
            json!({"name": "hosted__fx__echo", "arguments": {"text": text}}),
        )
        .await?;
    ensure!(called["result"].is_object(), "the call failed: {called}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_no_browser_uses_the_device_grant() -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let port = restartable_port()?;
    let idp = Idp::start(dir.path(), restartable_port()?, &audience(port)).await?;
    let a = Daemon::builder()
        .listen(format!("127.0.0.1:{port}"))
        .daemon(daemon_lines(&idp.issuer(), port, ""))
        .upstreams(fixture_upstream("fx", "", &[]))
        .start()
        .await?;
    a.wait_ready(Duration::from_secs(60)).await?;
    let b = Daemon::builder()
        .upstreams(format!("[upstreams.hosted]\nurl = {:?}\n", a.url))
        .start()
        .await?;
    wait_for_state(&b, "hosted", "needs_login").await?;

    // First a login in a browser, which registers plexus with the provider; the
    // device login below reuses that registration.
    let login = plexus(&b, &["login", "hosted"]).await?;
    ensure!(
        login.status.success(),
        "plexus login failed: {}",
        String::from_utf8_lossy(&login.stderr)
    );
    logout(&b).await?;

    // A display is there: only `--device` asks for the device grant. plexus
    // prints the verification URI and the user code, and polls.
    device_login(&b, &idp, &["--device"], &[("DISPLAY", ":0")], &[]).await?;
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");
    call_echo(&b, "headless").await?;

    // The registration forgotten, then a login on a machine with no browser and
    // no display: the device grant with no flag, registering afresh.
    logout(&b).await?;
    for entry in std::fs::read_dir(b.dir.path().join("state/oauth"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::remove_file(path)?;
        }
    }
    device_login(&b, &idp, &[], &[], &["DISPLAY", "WAYLAND_DISPLAY"]).await?;
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");
    call_echo(&b, "headless again").await?;

    // That registration serves a browser login too.
    logout(&b).await?;
    let login = plexus(&b, &["login", "hosted"]).await?;
    ensure!(
        login.status.success(),
        "a browser login with the device login's registration failed: {}\nbrowser: {}",
        String::from_utf8_lossy(&login.stderr),
        std::fs::read_to_string(b.dir.path().join("browser.log")).unwrap_or_default()
    );
    call_echo(&b, "in a browser").await?;
    idp.stop().await?;
    Ok(())
}
