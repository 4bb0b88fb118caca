//! plexus's OAuth client of a hosted upstream across runs and faults, against the
//! real provider (`tests/idp/provider.mjs`) and a protected plexus A fronting the
//! fixture, as in `upstream_login.rs`: the dynamic registration is kept and reused
//! by every run, and made again (once) only when the token endpoint says
//! `invalid_client`; a refresh refused otherwise than with `invalid_grant` (a 500,
//! `temporarily_unavailable`) is counted as `error`, calls go on with the token
//! held, it is tried again later, and the upstream never waits for a login;
//! `plexus login` with no daemon running stores tokens the next `plexus serve`
//! starts the upstream with.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plexus_tests::Daemon;
use serde_json::{json, Value};

use crate::sso::{installed, Idp};
use crate::upstream_login::{
    call_echo, plexus, plexus_in, refreshes, upstream_state, wait_for_state, Hosted,
};

/// The access tokens' lifetime at the provider: due for a refresh at half of it.
/// A admits a token for 60 s past its expiry (its leeway), so a call sent with
/// the token held after a failed refresh is still admitted.
const ACCESS_TTL_S: u64 = 6;

/// What these tests ask of the hosted setup besides its start.
impl Hosted {
    /// plexus B, in `dir` when given (a restart on its state).
    async fn b(&self, dir: Option<tempfile::TempDir>) -> anyhow::Result<Daemon> {
        let mut builder = Daemon::builder().upstreams(self.sections.clone());
        if let Some(dir) = dir {
            builder = builder.dir(dir);
        }
        builder.start().await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(reqwest::get(format!("{}{path}", self.idp.issuer()))
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        Ok(reqwest::Client::new()
            .post(format!("{}{path}", self.idp.issuer()))
            .body(body.to_string())
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// The provider's count of dynamic client registrations.
    async fn registrations(&self) -> anyhow::Result<u64> {
        self.get("/test/registrations").await?["count"]
            .as_u64()
            .context("registrations")
    }

    /// The provider's count of token requests of `grant_type`.
    async fn token_requests(&self, grant_type: &str) -> anyhow::Result<u64> {
        Ok(self.get("/test/token-requests").await?[grant_type]
            .as_u64()
            .unwrap_or(0))
    }

    /// The next token request of `grant_type` answers `status` (with `{error}`
    /// when given, else a plain-text body).
    async fn fail_next(
        &self,
        grant_type: &str,
        status: u16,
        error: Option<&str>,
    ) -> anyhow::Result<()> {
        self.post(
            "/test/token-fail",
            json!({"grant_type": grant_type, "count": 1, "status": status, "error": error}),
        )
        .await?;
        Ok(())
    }
}

/// `plexus login hosted` for B, which must succeed.
async fn login(b: &Daemon, idp: &Idp) -> anyhow::Result<()> {
    let login = plexus(b, &["login", "hosted"]).await?;
    ensure!(
        login.status.success(),
        "plexus login failed: {}\nbrowser: {}\nB: {}\nprovider: {}",
        String::from_utf8_lossy(&login.stderr),
        std::fs::read_to_string(b.dir.path().join("browser.log")).unwrap_or_default(),
        b.log(),
        std::fs::read_to_string(&idp.log).unwrap_or_default()
    );
    Ok(())
}

async fn state_of(b: &Daemon) -> anyhow::Result<String> {
    upstream_state(&b.admin_get("/status").await?.1, "hosted")
}

/// Sleeps until the token obtained at `obtained` is due for a refresh.
async fn until_due(obtained: Instant) {
    let due = Duration::from_millis(ACCESS_TTL_S * 1000 / 2 + 500);
    tokio::time::sleep(due.saturating_sub(obtained.elapsed())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registration_is_reused_by_every_run_and_made_again_only_for_invalid_client(
) -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let hosted = Hosted::start(dir.path(), ACCESS_TTL_S).await?;
    let b = hosted.b(None).await?;
    wait_for_state(&b, "hosted", "needs_login").await?;
    login(&b, &hosted.idp).await?;
    assert_eq!(
        hosted.registrations().await?,
        1,
        "the first login registers"
    );

    // A new run of the daemon: the stored tokens, no registration.
    let (_, state) = b.stop_keeping_state().await?;
    let b = hosted.b(Some(state)).await?;
    wait_for_state(&b, "hosted", "ready").await?;
    call_echo(&b, "restarted").await?;
    // A new run of `plexus login`: new tokens, the same client.
    login(&b, &hosted.idp).await?;
    let obtained = Instant::now();
    assert_eq!(
        hosted.registrations().await?,
        1,
        "a second run registered again"
    );
    assert_eq!(hosted.token_requests("authorization_code").await?, 2);

    // The provider forgets the client. The token held is still admitted; its
    // refresh, once due, is refused with invalid_client: counted as an error, the
    // call goes on, and nothing registers yet.
    let forgotten = hosted.post("/test/forget-clients", json!({})).await?;
    assert_eq!(forgotten["forgotten"], 1, "{forgotten}");
    until_due(obtained).await;
    call_echo(&b, "due").await?;
    assert_eq!(hosted.token_requests("refresh_token").await?, 1);
    assert_eq!(b.metric(&refreshes("error")).await?, Some(1.0));
    assert_eq!(hosted.registrations().await?, 1);
    assert_eq!(state_of(&b).await?, "ready");

    // The next login registers once more, and succeeds with that client; the one
    // after reuses it.
    login(&b, &hosted.idp).await?;
    assert_eq!(
        hosted.registrations().await?,
        2,
        "invalid_client makes exactly one new registration"
    );
    assert_eq!(state_of(&b).await?, "ready");
    call_echo(&b, "registered again").await?;
    login(&b, &hosted.idp).await?;
    assert_eq!(hosted.registrations().await?, 2);
    call_echo(&b, "reused").await?;
    hosted.idp.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_failing_otherwise_than_invalid_grant_keeps_the_token_and_is_tried_again(
) -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let hosted = Hosted::start(dir.path(), ACCESS_TTL_S).await?;
    let b = hosted.b(None).await?;
    wait_for_state(&b, "hosted", "needs_login").await?;
    login(&b, &hosted.idp).await?;
    let obtained = Instant::now();

    // The token endpoint fails twice, each time otherwise than with invalid_grant:
    // a 500 with a plain-text body, then `temporarily_unavailable`. Each due refresh
    // is counted as an error, the call goes on with the token held, calls within
    // the next 5 s try no refresh, and the upstream stays ready.
    let failures = [
        (500, None, "failed: HTTP 500"),
        (
            400,
            Some("temporarily_unavailable"),
            "temporarily_unavailable",
        ),
    ];
    until_due(obtained).await;
    for (n, (status, error, logged)) in failures.into_iter().enumerate() {
        let failed_at = Instant::now();
        hosted.fail_next("refresh_token", status, error).await?;
        call_echo(&b, "due").await?;
        let tried = n as u64 + 1;
        assert_eq!(hosted.token_requests("refresh_token").await?, tried);
        assert_eq!(b.metric(&refreshes("error")).await?, Some(tried as f64));
        call_echo(&b, "not again yet").await?;
        assert_eq!(
            hosted.token_requests("refresh_token").await?,
            tried,
            "a refresh was tried again at once"
        );
        assert_eq!(state_of(&b).await?, "ready");
        ensure!(
            b.log().contains(logged),
            "B's log lacks {logged}: {}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(5_500).saturating_sub(failed_at.elapsed())).await;
    }

    // 5 s after the last failure, a call tries again: a new token.
    call_echo(&b, "refreshed").await?;
    assert_eq!(hosted.token_requests("refresh_token").await?, 3);
    assert_eq!(b.metric(&refreshes("ok")).await?, Some(1.0));
    assert_eq!(b.metric(&refreshes("error")).await?, Some(2.0));
    assert_eq!(b.metric(&refreshes("invalid_grant")).await?, None);
    assert_eq!(state_of(&b).await?, "ready");
    assert_eq!(
        b.metric("plexus_upstream_state{state=\"needs_login\",upstream=\"hosted\"}")
            .await?,
        Some(0.0)
    );
    hosted.idp.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_no_daemon_running_is_used_by_the_next_serve() -> anyhow::Result<()> {
    if !installed(true) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let hosted = Hosted::start(dir.path(), 600).await?;
    let b = hosted.b(None).await?;
    wait_for_state(&b, "hosted", "needs_login").await?;
    let (_, state) = b.stop_keeping_state().await?;

    // No daemon answers: the tokens are stored for its next start, exit 0.
    let login = plexus_in(state.path(), &["login", "hosted"]).await?;
    let stderr = String::from_utf8_lossy(&login.stderr);
    ensure!(
        login.status.success() && stderr.contains("no daemon answered"),
        "plexus login with no daemon: {stderr}\nbrowser: {}",
        std::fs::read_to_string(state.path().join("browser.log")).unwrap_or_default()
    );
    let held = plexus_in(state.path(), &["login", "--status"]).await?;
    let held = String::from_utf8_lossy(&held.stdout).to_string();
    ensure!(
        held.lines()
            .any(|line| line.starts_with("hosted\theld\t") && line.ends_with("\t-")),
        "login --status: {held}"
    );

    // The next serve starts the upstream with them: ready, no login, no refresh.
    let started = Instant::now();
    let b = hosted.b(Some(state)).await?;
    wait_for_state(&b, "hosted", "ready").await?;
    println!(
        "the next serve came up ready with the stored tokens in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    call_echo(&b, "stored").await?;
    assert_eq!(hosted.token_requests("authorization_code").await?, 1);
    assert_eq!(hosted.token_requests("refresh_token").await?, 0);
    assert_eq!(hosted.registrations().await?, 1);
    ensure!(
        !b.log().contains("needs a login"),
        "B waited for a login: {}",
        b.log()
    );
    hosted.idp.stop().await?;
    Ok(())
}
