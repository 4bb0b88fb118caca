//! A hosted upstream's OAuth login in the daemon: the tokens `plexus login`
//! stored put on its connection at every start, refreshed before they expire,
//! one refresh at a time per upstream whatever the number of calls waiting. The
//! daemon never runs an interactive grant: a refusal it cannot answer with a
//! refresh sends the upstream to `needs_login` until `plexus login NAME`.
//! Tokens are read only through `adapters::oauth` (the one reader of the store)
//! and held only in its client and the connection's bearer slot.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use adapters::handshake::HandshakeError;
use adapters::oauth::{
    self, Challenge, Interaction, OAuthClient, OAuthError, Settings, TokenStore,
};
use adapters::{ConnectionError, UpstreamConnection};
use prometheus::IntCounterVec;

use crate::config::{Config, Launch, UpstreamConfig};

/// Where the daemon's upstreams keep their tokens, and what they share.
pub struct Logins {
    /// `state_dir/oauth`.
    directory: PathBuf,
    client_metadata_url: Option<String>,
    refreshes: IntCounterVec,
}

impl Logins {
    pub fn new(config: &Config, refreshes: IntCounterVec) -> Logins {
        Logins {
            directory: config.daemon.state_dir.join("oauth"),
            client_metadata_url: config.daemon.oauth_client_metadata_url.clone(),
            refreshes,
        }
    }
}

/// Nothing is due: no token, or one that does not expire.
const NEVER: u64 = u64::MAX;
/// After a refresh that failed for another reason than `invalid_grant` (the
/// server unreachable), calls wait this long before one tries again.
const RETRY_REFRESH_S: u64 = 5;

/// One upstream's login.
pub struct Login {
    upstream: Arc<str>,
    server_url: String,
    settings: Settings,
    logins: Arc<Logins>,
    /// The client, made afresh from the store at each start; the lock makes a
    /// refresh single-flight.
    client: tokio::sync::Mutex<Option<OAuthClient>>,
    /// When the token held is due for a refresh (seconds since the epoch): read
    /// by every call without the lock.
    due: AtomicU64,
    /// A refusal was already answered with a refresh since the last start that
    /// came up: a second one means a login is needed (no refresh loop).
    refused_once: AtomicBool,
    /// A call's refusal already asked for a start since the last one came up.
    restart_asked: AtomicBool,
    /// Counts the tokens put on connections: a refused call's refresh is skipped
    /// when another call already replaced the token it was sent with.
    generation: AtomicU64,
}

/// What a call should do after [`Login::before_call`].
#[derive(Debug, PartialEq, Eq)]
pub enum BeforeCall {
    /// Go on with the connection (its token is fresh, or no newer one was had).
    Proceed,
    /// The refresh token is no longer good: the upstream needs a login.
    NeedsLogin,
}

impl Login {
    /// The login of `config`'s upstream: an HTTP upstream that configures no
    /// `Authorization` header (whose 401 OAuth answers).
    pub fn of(config: &UpstreamConfig, logins: &Arc<Logins>) -> Option<Login> {
        let Launch::Http(endpoint) = &config.launch else {
            return None;
        };
        let has_header = endpoint
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("authorization"));
        if has_header {
            return None;
        }
        let settings = match settings(config, logins.client_metadata_url.clone()) {
            Ok(settings) => settings,
            Err(reason) => {
                tracing::warn!(upstream = %config.name, reason, "the upstream's OAuth settings are unusable; it logs in with none");
                Settings::default()
            }
        };
        Some(Login {
            upstream: Arc::from(config.name.as_str()),
            server_url: endpoint.url.clone(),
            settings,
            logins: logins.clone(),
            client: tokio::sync::Mutex::new(None),
            due: AtomicU64::new(NEVER),
            refused_once: AtomicBool::new(false),
            restart_asked: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        })
    }

    fn store(&self) -> TokenStore {
        TokenStore::for_server(&self.logins.directory, &self.server_url)
    }

    fn count(&self, outcome: &str) {
        self.logins
            .refreshes
            .with_label_values(&[&self.upstream, outcome])
            .inc();
    }

    /// A client that never asks a person: the daemon has none to ask.
    fn client(&self) -> Option<OAuthClient> {
        let interaction = Interaction {
            browser: None,
            device: false,
            prompt: Arc::new(|_: &oauth::Prompt<'_>| {}),
            wait: std::time::Duration::ZERO,
        };
        match OAuthClient::new(
            &self.server_url,
            self.settings.clone(),
            self.store(),
            interaction,
        ) {
            Ok(client) => Some(client),
            Err(error) => {
                tracing::warn!(upstream = %self.upstream, error = %adapters::error_chain(&error), "no OAuth client");
                None
            }
        }
    }

    /// At a start: the stored tokens (refreshed first if due) on `connection`.
    pub async fn start(&self, connection: &UpstreamConnection) {
        let mut held = self.client.lock().await;
        let mut client = self.client();
        if let Some(client) = client.as_mut().filter(|client| client.has_tokens()) {
            let due = client.refresh_due().is_some_and(|due| due <= oauth::now());
            if due {
                let refreshed = client.refresh_now().await;
                self.counted(&refreshed);
            }
            if let Some(token) = client.access_token() {
                connection.set_bearer_token(Some(token));
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
        self.due.store(
            client
                .as_ref()
                .and_then(OAuthClient::refresh_due)
                .unwrap_or(NEVER),
            Ordering::Release,
        );
        *held = client;
    }

    /// The start came up: a later refusal may be answered with a refresh again.
    pub fn started(&self) {
        self.refused_once.store(false, Ordering::Release);
        self.restart_asked.store(false, Ordering::Release);
    }

    /// A call was refused (401, a Bearer challenge) while the upstream was
    /// ready: true the first time since it came up, when it should start again
    /// (its start refreshes the token once, else waits for a login).
    pub fn refused_while_ready(&self) -> bool {
        !self.restart_asked.swap(true, Ordering::AcqRel)
    }

    /// Which token a call is sent with, for [`Login::refresh_refused`].
    pub fn token_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A call sent with the token of `generation` was refused (401, a Bearer
    /// challenge) while the upstream was ready: true when a newer token is on
    /// `connection` (another call's refresh, or this one's), so the call may be
    /// sent again; false when none is to be had. One refresh per refusal until a
    /// call sent again gets through ([`Login::refusal_answered`]): a token
    /// refused again waits for a login.
    pub async fn refresh_refused(&self, connection: &UpstreamConnection, generation: u64) -> bool {
        let mut held = self.client.lock().await;
        if self.generation.load(Ordering::Acquire) != generation {
            return true;
        }
        if self.refused_once.swap(true, Ordering::AcqRel) {
            return false;
        }
        let Some(client) = held.as_mut().filter(|client| client.has_tokens()) else {
            return false;
        };
        let refreshed = client.refresh_now().await;
        self.counted(&refreshed);
        let Ok(token) = refreshed else {
            return false;
        };
        connection.set_bearer_token(Some(&token));
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.due
            .store(client.refresh_due().unwrap_or(NEVER), Ordering::Release);
        true
    }

    /// A call sent again with a refreshed token got through: a later refusal may
    /// be answered with a refresh again.
    pub fn refusal_answered(&self) {
        self.refused_once.store(false, Ordering::Release);
    }

    /// A refusal at a start: true when a refresh got a new token (start again
    /// at once), false when a person must log in.
    pub async fn answer_refusal(&self) -> bool {
        if self.refused_once.swap(true, Ordering::AcqRel) {
            return false;
        }
        let mut held = self.client.lock().await;
        let Some(client) = held.as_mut().filter(|client| client.has_tokens()) else {
            return false;
        };
        let refreshed = client.refresh_now().await;
        self.counted(&refreshed);
        refreshed.is_ok()
    }

    /// Before a call: refreshes the token when it is due, once however many
    /// calls find it due (the others wait for that refresh and use its token).
    pub async fn before_call(&self, connection: &UpstreamConnection) -> BeforeCall {
        if self.due.load(Ordering::Acquire) > oauth::now() {
            return BeforeCall::Proceed;
        }
        let mut held = self.client.lock().await;
        // Another call refreshed while this one waited for the lock.
        if self.due.load(Ordering::Acquire) > oauth::now() {
            return BeforeCall::Proceed;
        }
        let Some(client) = held.as_mut() else {
            return BeforeCall::Proceed;
        };
        let refreshed = client.refresh_now().await;
        self.counted(&refreshed);
        match refreshed {
            Ok(token) => {
                connection.set_bearer_token(Some(&token));
                self.generation.fetch_add(1, Ordering::AcqRel);
                self.due
                    .store(client.refresh_due().unwrap_or(NEVER), Ordering::Release);
                BeforeCall::Proceed
            }
            Err(error) if error.is_invalid_grant() => {
                tracing::warn!(upstream = %self.upstream, "the upstream's refresh token was refused (invalid_grant): it needs a login");
                self.due.store(NEVER, Ordering::Release);
                BeforeCall::NeedsLogin
            }
            Err(error) => {
                tracing::warn!(upstream = %self.upstream, error = %adapters::error_chain(&error), "refreshing the upstream's OAuth token failed; the call goes on with the current one");
                self.due
                    .store(oauth::now() + RETRY_REFRESH_S, Ordering::Release);
                BeforeCall::Proceed
            }
        }
    }

    fn counted(&self, refreshed: &Result<String, OAuthError>) {
        let outcome = match refreshed {
            Ok(_) => "ok",
            Err(error) if error.is_invalid_grant() => "invalid_grant",
            Err(_) => "error",
        };
        self.count(outcome);
    }
}

/// Whether a start failed because the server wants an OAuth token: a 401 with a
/// `WWW-Authenticate: Bearer` challenge.
pub fn wants_login(error: &HandshakeError) -> bool {
    match error {
        HandshakeError::Connection(error) => refuses_token(error),
        _ => false,
    }
}

/// Whether a request was refused for its token: a 401 with a Bearer challenge.
pub fn refuses_token(error: &ConnectionError) -> bool {
    let ConnectionError::HttpStatus {
        status: 401,
        challenge: Some(challenge),
        ..
    } = error
    else {
        return false;
    };
    Challenge::parse(challenge).is_some()
}

/// The OAuth client settings of `config`'s `[upstreams.NAME.oauth]`.
pub fn settings(
    config: &UpstreamConfig,
    client_metadata_url: Option<String>,
) -> Result<Settings, String> {
    let oauth = config.oauth.clone();
    let private_key_pem = match oauth.as_ref().and_then(|o| o.private_key_file.as_ref()) {
        Some(path) => Some(std::fs::read(path).map_err(|error| {
            format!(
                "upstreams.{}.oauth.private_key_file: cannot read {}: {error}",
                config.name,
                path.display()
            )
        })?),
        None => None,
    };
    Ok(Settings {
        client_id: oauth.as_ref().and_then(|o| o.client_id.clone()),
        client_secret: oauth.as_ref().and_then(|o| o.client_secret.clone()),
        scopes: oauth.as_ref().and_then(|o| o.scopes.clone()),
        grant: oauth.as_ref().map(|o| o.grant).unwrap_or_default(),
        private_key_pem,
        signing_algorithm: oauth.as_ref().and_then(|o| o.signing_algorithm.clone()),
        client_metadata_url,
    })
}
