//! plexus as the OAuth client of a hosted upstream, end to end against a real
//! authorization server (oidc-provider, `tests/idp/provider.mjs`) and a real
//! protected MCP server (plexus A, whose front admits the provider's tokens,
//! fronting the fixture). plexus B lists A as an upstream with no headers: it
//! waits in `needs_login`; `plexus login` (a `$BROWSER` that signs in on the
//! provider's form) stores encrypted tokens and brings the upstream up without
//! a restart; 50 concurrent calls on a token due for refresh cause one refresh;
//! 50 concurrent calls refused when A's audience moves (the token revoked for A)
//! cause one refresh grant at the provider and each is sent again once;
//! `plexus logout` sends it back to `needs_login`, where calls get -33001 with
//! `data.login` and the cached catalog is still listed. `plexus login --device`
//! prints a user code (and the complete verification URI when the server gives
//! one) that a person enters at the provider's device page
//! (`tests/python/oauth_device.py`); plexus polls at the server's interval, 5 s
//! more after a `slow_down`, gives up at the code's `expires_in`, and the
//! upstream comes up the same way; `plexus call` with no login held runs the
//! same grant inline.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::{plexus_binary, venv_python, workspace_root, Daemon, RawHttpSession};
use serde_json::{json, Value};
use tokio::process::Command;

use crate::sso::{audience, installed, Idp, Protected};

/// The access tokens' lifetime at the provider: due for a refresh at half of it.
const ACCESS_TTL_S: u64 = 20;

pub(crate) fn upstream_state(status: &str, name: &str) -> anyhow::Result<String> {
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

pub(crate) async fn wait_for_state(
    daemon: &Daemon,
    name: &str,
    wanted: &str,
) -> anyhow::Result<()> {
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
pub(crate) async fn plexus(b: &Daemon, args: &[&str]) -> anyhow::Result<std::process::Output> {
    plexus_in(b.dir.path(), args).await
}

/// `plexus ARGS --config DIR/config.toml` with `$BROWSER` signing in as alice:
/// the daemon of that config need not be running.
pub(crate) async fn plexus_in(
    dir: &std::path::Path,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    let browser = format!(
        "{} {} --login alice --log {}",
        venv_python().display(),
        workspace_root()
            .join("tests/python/oauth_browser.py")
            .display(),
        dir.join("browser.log").display()
    );
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(plexus_binary())
            .args(args)
            .arg("--config")
            .arg(dir.join("config.toml"))
            .env("BROWSER", browser)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("plexus did not finish")??;
    Ok(output)
}

/// The provider, A (protected by it, fronting the fixture) and B's config
/// sections: a hosted upstream `hosted` at A, with no credentials.
pub(crate) struct Hosted {
    pub(crate) idp: Idp,
    pub(crate) a: Daemon,
    /// A's port (the audience of the tokens it admits).
    pub(crate) port: u16,
    pub(crate) sections: String,
}

impl Hosted {
    /// Access tokens living `ttl` seconds, and refresh tokens.
    pub(crate) async fn start(dir: &std::path::Path, ttl: u64) -> anyhow::Result<Hosted> {
        let ttl = ttl.to_string();
        Hosted::start_with(dir, &[("IDP_ACCESS_TTL", &ttl), ("IDP_REFRESH", "1")]).await
    }

    /// With the provider's settings `idp_env`.
    pub(crate) async fn start_with(
        dir: &std::path::Path,
        idp_env: &[(&str, &str)],
    ) -> anyhow::Result<Hosted> {
        let Protected {
            idp,
            daemon: a,
            port,
        } = Protected::start(dir, idp_env).await?;
        let sections = format!("[upstreams.hosted]\nurl = {:?}\n", a.url);
        Ok(Hosted {
            idp,
            a,
            port,
            sections,
        })
    }
}

pub(crate) fn refreshes(outcome: &str) -> String {
    format!("plexus_oauth_refresh_total{{outcome=\"{outcome}\",upstream=\"hosted\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_upstream_waits_for_a_login_and_refreshes_once_for_many_calls(
) -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let Hosted {
        idp,
        a,
        port,
        sections,
    } = Hosted::start(dir.path(), ACCESS_TTL_S).await?;
    let audit = dir.path().join("b-audit.jsonl");
    let b = Daemon::builder()
        .daemon(format!("audit_log = {:?}", audit.display().to_string()))
        .upstreams(sections)
        .start()
        .await?;

    // No login yet: needs_login in /status and the state metric, not a restart loop.
    wait_for_state(&b, "hosted", "needs_login").await?;
    assert_eq!(
        b.metric("plexus_upstream_state{state=\"needs_login\",upstream=\"hosted\"}")
            .await?,
        Some(1.0)
    );
    let (_, text) = b.admin_get("/console/state").await?;
    ensure!(
        text.contains("needs_login"),
        "the console shows no needs_login: {text}"
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

    // A's audience moves (a reload) and the provider's tokens follow: A refuses
    // the token B holds (401) long before it expires. 50 concurrent calls refused
    // with it cause one refresh (B's count and the provider's own), each is sent
    // again once, and none of their callers sees an error; then both move back,
    // and one call refused the same way is sent again after one refresh.
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
    let refresh_grants = async || -> anyhow::Result<u64> {
        let counts: Value = reqwest::get(format!("{}/test/token-requests", idp.issuer()))
            .await?
            .json()
            .await?;
        Ok(counts["refresh_token"].as_u64().unwrap_or(0))
    };
    let a_executed = async || {
        a.metric(r#"plexus_relay_requests_total{method="tools/call",outcome="ok",upstream="fx"}"#)
            .await
            .map(Option::unwrap_or_default)
    };
    let a_refused = async || {
        a.metric(r#"plexus_http_refused_requests_total{reason="unauthorized"}"#)
            .await
            .map(Option::unwrap_or_default)
    };
    let mut sessions = Vec::new();
    for _ in 0..50 {
        sessions.push(RawHttpSession::connect(&b.url).await?);
    }
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
        let (grants, executed, refused) = (
            refresh_grants().await?,
            a_executed().await?,
            a_refused().await?,
        );
        let callers = if step == 0 { 50 } else { 1 };
        let calls = sessions.iter_mut().take(callers).map(|session| {
            session.request(
                "tools/call",
                json!({"name": "hosted__fx__echo", "arguments": {"text": "refreshed"}}),
            )
        });
        let began = Instant::now();
        let answers = futures::future::join_all(calls).await;
        let took = began.elapsed();
        for called in answers {
            let called = called?;
            ensure!(
                called["result"].is_object(),
                "a refused call was not sent again with a new token: {called}\nB: {}",
                b.log()
            );
        }
        let refused = a_refused().await? - refused;
        println!(
            "{callers} calls refused with a revoked token ({refused} refusals at A), one refresh, sent again: {:.0} ms",
            took.as_secs_f64() * 1000.0
        );
        ensure!(
            refused >= 1.0,
            "A refused no call: the token was not revoked"
        );
        assert_eq!(b.metric(&refreshes("ok")).await?, Some(2.0 + step as f64));
        assert_eq!(
            refresh_grants().await? - grants,
            1,
            "refresh grants at the provider"
        );
        // Each call ran once at A: a refused call was not executed, and was sent again once.
        assert_eq!(a_executed().await? - executed, callers as f64);
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

/// What a device login showed and printed.
struct DeviceLogin {
    /// The stderr line that asked for the code.
    prompt: String,
    user_code: String,
    /// The verification URI the person opened (the complete one when shown).
    opened: String,
    stdout: String,
}

/// `plexus ARGS --config B's config` with no `$BROWSER` (and `env` set, `unset`
/// removed): reads the user code from its stderr, has alice enter it at the
/// provider's device page (the complete URI when one is shown), and waits for
/// plexus to finish.
async fn device_login(
    b: &Daemon,
    idp: &Idp,
    args: &[&str],
    env: &[(&str, &str)],
    unset: &[&str],
) -> anyhow::Result<DeviceLogin> {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};

    let started = Instant::now();
    let mut command = Command::new(plexus_binary());
    command
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
    let mut stdout = login.stdout.take().context("no stdout")?;
    let stdout = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text).await;
        text
    });
    let mut stderr = BufReader::new(login.stderr.take().context("no stderr")?).lines();
    let mut shown = String::new();
    let (prompt, (code, uri)) = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await? {
            shown.push_str(&line);
            shown.push('\n');
            if let Some(found) = device_prompt(&line) {
                return Ok((line, found));
            }
        }
        anyhow::bail!("plexus {args:?} printed no device code: {shown}")
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
    // `open COMPLETE (or enter code …)`: the complete form is the one a person opens.
    let opened = prompt
        .split_once(" open ")
        .and_then(|(_, rest)| rest.split_once(" (or enter code"))
        .map_or(uri.clone(), |(complete, _)| complete.to_string());

    // The person, on another device: enters the code, signs in and confirms.
    let person = Command::new(venv_python())
        .arg(workspace_root().join("tests/python/oauth_device.py"))
        .args(["--login", "alice", "--code", &code, &opened])
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
    let Ok(status) = tokio::time::timeout(Duration::from_secs(30), login.wait()).await else {
        anyhow::bail!(
            "plexus {args:?} did not finish; the provider's polls: {:?}",
            device_polls(idp).await?
        );
    };
    let status = status?;
    let rest = rest.await?;
    let stdout = stdout.await?;
    ensure!(
        status.success(),
        "plexus {args:?} failed: {shown}{rest}{stdout}\nB: {}\nprovider: {}",
        b.log(),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    println!(
        "plexus {args:?} (code shown, entered, polled, done) took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(DeviceLogin {
        prompt,
        user_code: code,
        opened,
        stdout,
    })
}

/// The provider's record of the device codes' polls: per code, each poll's
/// answer and the gaps between polls in milliseconds.
async fn device_polls(idp: &Idp) -> anyhow::Result<Vec<(Vec<String>, Vec<i64>)>> {
    let record: Value = reqwest::get(format!("{}/test/device-polls", idp.issuer()))
        .await?
        .json()
        .await?;
    let codes = record["codes"].as_array().context("codes")?;
    Ok(codes
        .iter()
        .map(|code| {
            let polls = code["polls"].as_array().cloned().unwrap_or_default();
            let answers = polls
                .iter()
                .map(|poll| poll["answer"].as_str().unwrap_or_default().to_string())
                .collect();
            let times: Vec<i64> = polls
                .iter()
                .filter_map(|poll| poll["at_ms"].as_i64())
                .collect();
            let gaps = times.windows(2).map(|pair| pair[1] - pair[0]).collect();
            (answers, gaps)
        })
        .collect())
}

const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// The provider's count of device grant token requests (polls), answered or not.
async fn device_token_requests(idp: &Idp) -> anyhow::Result<u64> {
    let counts: Value = reqwest::get(format!("{}/test/token-requests", idp.issuer()))
        .await?
        .json()
        .await?;
    Ok(counts[DEVICE_GRANT].as_u64().unwrap_or(0))
}

async fn device_settings(idp: &Idp, settings: Value) -> anyhow::Result<()> {
    reqwest::Client::new()
        .post(format!("{}/test/device", idp.issuer()))
        .body(settings.to_string())
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

async fn logout(b: &Daemon) -> anyhow::Result<()> {
    let logout = plexus(b, &["logout", "hosted"]).await?;
    ensure!(logout.status.success(), "plexus logout failed");
    wait_for_state(b, "hosted", "needs_login").await
}

pub(crate) async fn call_echo(b: &Daemon, text: &str) -> anyhow::Result<()> {
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
    let Hosted {
        idp,
        a: _a,
        sections,
        ..
    } = Hosted::start_with(dir.path(), &[("IDP_DEVICE_INTERVAL", "1")]).await?;
    let b = Daemon::builder().upstreams(sections).start().await?;
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

    // A code no one enters: plexus polls until the code's `expires_in` (2 s),
    // then gives up and says so, exit 1.
    device_settings(&idp, json!({"expires_in": 2})).await?;
    let began = Instant::now();
    let expired = plexus(&b, &["login", "hosted", "--device"]).await?;
    let stderr = String::from_utf8_lossy(&expired.stderr);
    println!(
        "a device code left unentered: plexus gave up after {:.1} s",
        began.elapsed().as_secs_f64()
    );
    assert_eq!(expired.status.code(), Some(1), "{stderr}");
    ensure!(
        stderr.contains("enter code") && stderr.contains("no authorization arrived within 2 s"),
        "{stderr}"
    );
    device_settings(&idp, json!({"expires_in": null})).await?;

    // A display is there: only `--device` asks for the device grant. plexus
    // prints the complete verification URI (with the code in it) beside the URI
    // and the code, and polls every `interval` (1 s here). The provider answers
    // the first poll with `slow_down`, and enforces it: a poll sooner than the
    // raised interval (6 s) gets `slow_down` again.
    device_settings(&idp, json!({"slow_down_first": true})).await?;
    let shown = device_login(
        &b,
        &idp,
        &["login", "hosted", "--device"],
        &[("DISPLAY", ":0")],
        &[],
    )
    .await?;
    let device_page = format!("{}/device", idp.issuer());
    assert_eq!(
        shown.prompt,
        format!(
            "plexus: to authorize access, open {device_page}?user_code={code} (or enter code {code} at {device_page})",
            code = shown.user_code
        )
    );
    ensure!(shown.opened.contains("user_code="), "{}", shown.opened);
    let polls = device_polls(&idp).await?;
    let (answers, gaps) = polls.last().context("no device code polled")?;
    println!("device polls: {answers:?}, {gaps:?} ms apart");
    ensure!(
        answers.first().map(String::as_str) == Some("slow_down")
            && answers.last().map(String::as_str) == Some("token")
            && answers.iter().filter(|a| *a == "slow_down").count() == 1,
        "the client did not back off after slow_down: {answers:?}, {gaps:?} ms apart"
    );
    // 1 s, then 5 s more after the slow_down (a few ms of clock rounding).
    ensure!(
        gaps.first().is_some_and(|gap| *gap >= 5_990),
        "the poll after slow_down came {gaps:?} ms later, not at least 6 s"
    );
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");
    call_echo(&b, "headless").await?;

    // The registration forgotten, then a login on a machine with no browser and
    // no display: the device grant with no flag, registering afresh. A server
    // that gives no complete URI: the URI and the code alone.
    logout(&b).await?;
    for entry in std::fs::read_dir(b.dir.path().join("state/oauth"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::remove_file(path)?;
        }
    }
    device_settings(&idp, json!({"slow_down_first": false, "complete": false})).await?;
    let shown = device_login(
        &b,
        &idp,
        &["login", "hosted"],
        &[],
        &["DISPLAY", "WAYLAND_DISPLAY"],
    )
    .await?;
    assert_eq!(
        shown.prompt,
        format!(
            "plexus: to authorize access, enter code {} at {device_page}",
            shown.user_code
        )
    );
    let (_, status) = b.admin_get("/status").await?;
    assert_eq!(upstream_state(&status, "hosted")?, "ready");
    call_echo(&b, "headless again").await?;

    // Two polls in a row go unanswered, their connection closed (as a provider
    // closes a kept-alive connection just as it is reused): each is made again at
    // the next interval, and the login goes through.
    logout(&b).await?;
    reqwest::Client::new()
        .post(format!("{}/test/token-fail", idp.issuer()))
        .body(json!({"grant_type": DEVICE_GRANT, "count": 2, "drop": true}).to_string())
        .send()
        .await?
        .error_for_status()?;
    let polled_before = device_token_requests(&idp).await?;
    device_login(&b, &idp, &["login", "hosted", "--device"], &[], &[]).await?;
    let polled = device_token_requests(&idp).await? - polled_before;
    ensure!(
        polled >= 3,
        "{polled} polls: the two unanswered were not made again"
    );
    call_echo(&b, "after unanswered polls").await?;

    // A one-shot command with no login held logs in inline, headless: the
    // device grant, its prompt in the complete form, then the call.
    logout(&b).await?;
    device_settings(&idp, json!({"complete": true})).await?;
    let shown = device_login(
        &b,
        &idp,
        &["call", "hosted", "fx__echo", r#"{"text":"inline"}"#],
        &[],
        &["DISPLAY", "WAYLAND_DISPLAY"],
    )
    .await?;
    ensure!(
        shown.prompt.starts_with(&format!(
            "plexus: to authorize access, open {device_page}?user_code="
        )),
        "{}",
        shown.prompt
    );
    ensure!(shown.stdout.contains("inline"), "{}", shown.stdout);
    let polls = device_polls(&idp).await?;
    ensure!(
        polls
            .iter()
            .all(|(answers, _)| answers.iter().skip(1).all(|a| a != "slow_down")),
        "a client polled sooner than its interval: {polls:?}"
    );

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
