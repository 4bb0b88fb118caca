//! The configuration file: raw serde types (`deny_unknown_fields`, in `raw`),
//! validated into [`Config`] with every error reported at once, each naming its
//! key (`validate`), and compared by upstream name for reloads (`diff`).

mod diff;
mod raw;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use adapters::{HttpEndpoint, LaunchSpec};
use serde::Deserialize;

pub use diff::{daemon_keys_needing_restart, ClusterChange, ConfigDiff};
pub use validate::{default_state_dir, parse};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7464";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:7465";
pub const DEFAULT_NAME_BUDGET: usize = 64;
pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(90);
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How much of one list an upstream's pages may hold: 64 MiB of entries' JSON
/// (about 250,000 tools of a common size).
pub const DEFAULT_MAX_LIST_BYTES: usize = 64 * 1024 * 1024;
pub const DEFAULT_MAX_CALL_TIMEOUT: Duration = Duration::from_secs(600);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
pub const DEFAULT_MAX_PENDING: usize = 256;
pub const DEFAULT_MAX_RESTARTS: usize = 5;
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(120);
pub const DEFAULT_RESTART_BACKOFF: Duration = Duration::from_secs(1);
pub const DEFAULT_RESTART_BACKOFF_MAX: Duration = Duration::from_secs(60);
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);
/// How often an upstream's catalog is listed again and checked against its pin.
pub const DEFAULT_SCHEMA_CHECK_INTERVAL: Duration = Duration::from_secs(600);
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The pin file's name beside the config, unless `[daemon] pins` names another.
pub const DEFAULT_PINS_FILE: &str = "plexus.lock";
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
pub const DEFAULT_FIRST_LIST_WAIT: Duration = Duration::from_secs(10);
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// Upstreams starting at once: enough that fast servers come up together, few
/// enough that a cold `npx` / `uvx` herd does not thrash a small machine.
pub const DEFAULT_START_CONCURRENCY: usize = 16;
/// Most worker threads `worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;
pub const DEFAULT_MAX_SESSIONS_PER_PRINCIPAL: usize = 200;

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub daemon: DaemonSettings,
    /// Enabled and disabled upstreams, by name.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// Named subsets of the catalog, served at `/mcp/<name>`.
    pub views: BTreeMap<String, ViewConfig>,
    /// `[cluster]`: this node and its peers; None: one node alone.
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: plexus nodes behind one balancer. A reload changes the peers; a
/// node cannot change its name or keys under the ids it sealed ([`ClusterChange`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's name, sealed into the ids of the sessions it holds.
    pub node: String,
    /// Peers by name: `http://host:port`, their MCP listener (this node may be listed).
    pub peers: BTreeMap<String, String>,
    /// `host:port` whose A records are the peers (a Kubernetes headless Service);
    /// a peer found so is named by its address.
    pub dns: Option<String>,
    /// The key ring: the current secret first, then `previous_secrets` (still
    /// accepted, never used to seal).
    pub secrets: Vec<String>,
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ClusterConfig")
            .field("node", &self.node)
            .field("peers", &self.peers)
            .field("dns", &self.dns)
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// One view: what it shows, and the tokens (or access tokens' claims) whose
/// principals see only it.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewConfig {
    pub view: registry::View,
    pub tokens: Vec<String>,
    pub claims: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DaemonSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub name_budget: usize,
    /// Entries per page of `tools/list` and the other lists.
    pub page_size: usize,
    /// How the root catalog offers its tools: all listed, or searched for.
    pub expose: registry::search::Expose,
    pub state_dir: PathBuf,
    /// How long in-flight calls may finish after a shutdown signal.
    pub drain_timeout: Duration,
    /// HTTP sessions silent this long (and with no event stream open) are ended.
    pub session_idle_timeout: Duration,
    /// The pin file: each upstream's fingerprints and the definitions they were taken from.
    pub pins: PathBuf,
    /// Named bearer tokens; none means an open loopback listener (principal `local`).
    pub auth_tokens: AuthTokens,
    /// `Host` values accepted besides loopback names (`name` for any port, `name:port`).
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides loopback origins (`https://app.example`).
    pub allowed_origins: Vec<String>,
    /// Open connections on the MCP listener (the admin listener takes at most
    /// `descriptors::ADMIN_CONNECTIONS`); None: what the descriptor limit allows.
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in.
    pub body_read_timeout: Duration,
    /// Open HTTP sessions, in total and per principal.
    pub max_sessions: usize,
    pub max_sessions_per_principal: usize,
    /// Where the audit trail goes (one JSON line per call); None: no trail.
    pub audit_log: Option<PathBuf>,
    /// How long a session's first list waits for starting upstreams that have no
    /// cached listing, so clients that never list again still see their tools.
    pub first_list_wait: Duration,
    /// How many upstreams may be starting at once (spawned, not yet listed).
    pub start_concurrency: usize,
    /// The runtime's worker threads; None: one per core (or `TOKIO_WORKER_THREADS`).
    pub worker_threads: Option<usize>,
    /// `[daemon.oauth]`: access tokens of an identity provider admitted beside `auth_tokens`.
    pub oauth: Option<FrontOAuth>,
    /// A Client ID Metadata Document the user hosts: plexus's OAuth `client_id`
    /// wherever an authorization server supports them.
    pub oauth_client_metadata_url: Option<String>,
    /// OpenTelemetry export (`[daemon.tracing]` over the `OTEL_*` variables).
    pub tracing: TracingSettings,
}

/// Where and what plexus exports over OTLP/HTTP; no traces endpoint: off.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracingSettings {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub traces_endpoint: Option<String>,
    /// The full URL the `mcp.*.operation.duration` histograms go to; None: not exported.
    pub metrics_endpoint: Option<String>,
    pub service_name: String,
    pub sampler: Sampler,
}

/// `OTEL_TRACES_SAMPLER` and its argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio(f64),
}

impl Default for Sampler {
    /// The specification's default.
    fn default() -> Sampler {
        Sampler::ParentBasedAlwaysOn
    }
}

/// The claim naming a principal unless `principal_claim` names another.
pub const DEFAULT_PRINCIPAL_CLAIM: &str = "sub";

/// The front as an OAuth resource server: whose JWT access tokens it admits, and
/// which claims bind their principals to views.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontOAuth {
    /// The authorization server's issuer identifier, as tokens' `iss` says it.
    pub issuer: String,
    /// plexus's own resource URI: tokens' `aud` must hold it.
    pub audience: String,
    /// Where the signing keys are; None: found by discovery from the issuer.
    pub jwks_uri: Option<String>,
    /// The claim whose value names a token's principal.
    pub principal_claim: String,
    /// Published as `scopes_supported` in the protected-resource metadata.
    pub scopes: Vec<String>,
    /// `[views.x] claims`, by view name: a principal whose token matches every
    /// claim of a view sees only that view (the first, by name, if several match).
    pub view_claims: Vec<(String, BTreeMap<String, String>)>,
}

/// Bearer tokens by name. Their values never appear in logs, errors or `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthTokens(pub Vec<(String, String)>);

impl fmt::Debug for AuthTokens {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(name, _)| name.as_str()).collect();
        write!(formatter, "AuthTokens({names:?})")
    }
}

impl AuthTokens {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name of the token `presented` is, compared in constant time with every
    /// token (so neither a match nor its position shows in the timing).
    pub fn principal(&self, presented: &str) -> Option<&str> {
        use subtle::ConstantTimeEq;
        let mut found = None;
        for (name, token) in &self.0 {
            if bool::from(token.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    pub launch: Launch,
    pub enabled: bool,
    /// Prepended as `{prefix}__` to tool and prompt names; "" for none.
    pub prefix: String,
    pub allow_tools: Vec<String>,
    pub deny_tools: Vec<String>,
    pub init_timeout: Duration,
    pub call_timeout: Duration,
    /// Per-tool deadlines, by the upstream's own tool name.
    pub tool_timeouts: BTreeMap<String, Duration>,
    /// How far progress notifications may extend a call's deadline.
    pub max_call_timeout: Duration,
    pub max_message_bytes: usize,
    /// The JSON of one list's entries over all its pages (`tools/list`, ...): beyond
    /// it the rest is not read (a hostile or broken upstream cannot take the memory).
    pub max_list_bytes: usize,
    pub max_in_flight: usize,
    pub max_pending: usize,
    pub share: Share,
    pub start: Start,
    /// Which protocol era plexus speaks to the upstream.
    pub protocol: Protocol,
    pub idle_timeout: Duration,
    pub restart: RestartSettings,
    /// Interval of health pings; zero disables them.
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub stop_grace: Duration,
    /// What the first sight of the upstream's catalog does.
    pub pin: PinMode,
    /// What a catalog that differs from its pin does.
    pub on_schema_change: SchemaPolicy,
    /// How often the catalog is listed again and checked against its pin; zero
    /// turns the schedule off.
    pub schema_check_interval: Duration,
    /// The `uvx`/`npx` package spec, when it names no exact version (warned about at start).
    pub unversioned_package: Option<String>,
    /// `[upstreams.<name>.oauth]`, for a `url` upstream; None: OAuth is still
    /// discovered from a 401 when no Authorization header is configured.
    pub oauth: Option<OAuthConfig>,
}

/// How plexus obtains OAuth tokens for a hosted server. The secret never
/// appears in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthConfig {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub grant: adapters::oauth::Grant,
    pub private_key_file: Option<PathBuf>,
    pub signing_algorithm: Option<String>,
}

impl fmt::Debug for OAuthConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("OAuthConfig")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .field("scopes", &self.scopes)
            .field("grant", &self.grant)
            .field("private_key_file", &self.private_key_file)
            .field("signing_algorithm", &self.signing_algorithm)
            .finish()
    }
}

/// What the first sight of an upstream's catalog does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinMode {
    /// Trust on first use: pinned as seen, and exposed.
    Tofu,
    /// Nothing is exposed until an operator approves it (`plexus pins approve`).
    Strict,
}

/// What plexus does when an upstream's catalog differs from its pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaPolicy {
    /// Changed and new entries are hidden, and calls to them refused (-33006), until approved.
    Block,
    /// Exposed as they are; the change is logged and counted.
    Warn,
    /// Exposed, not reported, and never held (not even by an unreadable pin file).
    Ignore,
}

/// How plexus reaches an upstream.
#[derive(Clone, Debug, PartialEq)]
pub enum Launch {
    /// A child process spoken to over stdin and stdout.
    Stdio(LaunchSpec),
    /// A remote server over HTTP.
    Http(HttpEndpoint),
}

/// Who uses one running instance of an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Share {
    /// One instance for every session.
    Shared,
    /// One instance per downstream session, started on first use.
    Session,
}

/// The protocol era plexus speaks to an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    /// `server/discover` first: 2026-07-28 wherever the upstream offers it, else
    /// the `initialize` handshake. One era per instance, chosen as it starts;
    /// clients of the other era are bridged.
    #[serde(rename = "auto")]
    Auto,
    /// The same as `auto` (kept for configs that name it).
    #[serde(rename = "newest")]
    Newest,
    /// The `initialize` handshake (2025-11-25 and earlier).
    #[serde(rename = "handshake")]
    Handshake,
    /// 2026-07-28 only.
    #[serde(rename = "2026-07-28")]
    Modern,
}

impl Protocol {
    pub fn for_adapter(self) -> adapters::handshake::UpstreamProtocol {
        use adapters::handshake::UpstreamProtocol;
        match self {
            Protocol::Auto | Protocol::Newest => UpstreamProtocol::Auto,
            Protocol::Handshake => UpstreamProtocol::Handshake,
            Protocol::Modern => UpstreamProtocol::Modern,
        }
    }
}

/// When an upstream is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// At daemon start.
    Eager,
    /// On the first call; stopped again after `idle_timeout`.
    Lazy,
}

/// How restarts are paced and when an upstream is given up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartSettings {
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// More exits than this within `window` put the upstream in the failed state.
    pub max_restarts: usize,
    pub window: Duration,
}

/// One problem in a configuration file, located by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is invalid:\n{}", list(.issues))]
    Invalid {
        path: PathBuf,
        issues: Vec<ConfigIssue>,
        /// Of the file as read, so a watcher need not reject the same bytes twice.
        sha256: String,
    },
}

fn list(issues: &[ConfigIssue]) -> String {
    issues
        .iter()
        .map(|issue| format!("  - {issue}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads and validates a configuration file. `environment` answers variable
/// look-ups (the process environment in production, a map in tests).
pub fn load(
    path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    read(path, environment).map(|(config, _)| config)
}

/// Like [`load`], and also the SHA-256 (hex) of the file's bytes, which names the
/// version of the file in force.
pub fn read(
    path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<(Config, String), ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let sha256 = hex_sha256(&bytes);
    let invalid = |issues| ConfigError::Invalid {
        path: path.to_path_buf(),
        issues,
        sha256: sha256.clone(),
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        invalid(vec![ConfigIssue {
            key: "(file)".into(),
            message: "not valid UTF-8".into(),
        }])
    })?;
    // Relative paths in the file are relative to the file, wherever plexus runs from.
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
    let config = parse(&text, &base, environment).map_err(invalid)?;
    Ok((config, sha256))
}

pub fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
