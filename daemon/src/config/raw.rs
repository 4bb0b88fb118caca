//! The file as serde reads it: every key optional, unknown keys refused.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{PinMode, Protocol, SchemaPolicy, Share, Start};

/// The `transport` key of a `url` upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub(super) enum RawTransport {
    #[serde(rename = "streamable-http")]
    StreamableHttp,
    #[serde(rename = "sse")]
    Sse,
    #[serde(rename = "auto")]
    Auto,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub name_budget: Option<usize>,
    pub page_size: Option<usize>,
    pub state_dir: Option<PathBuf>,
    pub drain_timeout: Option<String>,
    pub session_idle_timeout: Option<String>,
    pub pins: Option<PathBuf>,
    #[serde(default)]
    pub auth_tokens: BTreeMap<String, String>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    pub max_connections: Option<usize>,
    pub header_read_timeout: Option<String>,
    pub body_read_timeout: Option<String>,
    pub max_sessions: Option<usize>,
    pub max_sessions_per_principal: Option<usize>,
    pub audit_log: Option<PathBuf>,
    pub first_list_wait: Option<String>,
    pub start_concurrency: Option<usize>,
    pub worker_threads: Option<usize>,
    /// `[daemon.oauth]`, read on its own so that its errors name its keys.
    pub oauth: Option<toml::Table>,
    /// `[daemon.tracing]`, read on its own so that its errors name its keys.
    pub tracing: Option<toml::Table>,
    pub oauth_client_metadata_url: Option<String>,
    pub expose: Option<registry::search::Expose>,
}

/// `[cluster]`: this node, its peers and the secret they share.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub node: Option<String>,
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    pub dns: Option<String>,
    pub secret: Option<String>,
    #[serde(default)]
    pub previous_secrets: Vec<String>,
}

/// `[daemon.tracing]`: what the `OTEL_*` variables say, in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    pub endpoint: Option<String>,
    pub traces_endpoint: Option<String>,
    pub metrics_endpoint: Option<String>,
    pub protocol: Option<String>,
    pub service_name: Option<String>,
    pub sampler: Option<String>,
    pub sampler_arg: Option<f64>,
    pub metrics: Option<bool>,
}

/// `[daemon.oauth]`: the identity provider whose access tokens the front accepts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFrontOAuth {
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub jwks_uri: Option<String>,
    pub principal_claim: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub command: Option<String>,
    pub uvx: Option<String>,
    pub npx: Option<String>,
    pub python: Option<String>,
    pub node: Option<String>,
    pub uri: Option<String>,
    pub url: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub transport: Option<RawTransport>,
    pub enabled: Option<bool>,
    pub prefix: Option<String>,
    #[serde(default)]
    pub allow_tools: Vec<String>,
    #[serde(default)]
    pub deny_tools: Vec<String>,
    pub init_timeout: Option<String>,
    pub call_timeout: Option<String>,
    #[serde(default)]
    pub tool_timeouts: BTreeMap<String, String>,
    pub max_call_timeout: Option<String>,
    pub max_message_bytes: Option<usize>,
    pub max_list_bytes: Option<usize>,
    pub max_in_flight: Option<usize>,
    pub max_pending: Option<usize>,
    pub share: Option<Share>,
    pub start: Option<Start>,
    pub protocol: Option<Protocol>,
    pub idle_timeout: Option<String>,
    pub max_restarts: Option<usize>,
    pub restart_window: Option<String>,
    pub restart_backoff: Option<String>,
    pub restart_backoff_max: Option<String>,
    pub health_interval: Option<String>,
    pub health_timeout: Option<String>,
    pub stop_grace: Option<String>,
    pub pin: Option<PinMode>,
    pub on_schema_change: Option<SchemaPolicy>,
    pub schema_check_interval: Option<String>,
    pub oauth: Option<RawOAuth>,
}

/// The grant an OAuth upstream's tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawGrant {
    AuthorizationCode,
    DeviceCode,
    ClientCredentials,
}

/// `[upstreams.<name>.oauth]`: how plexus obtains tokens for a hosted server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOAuth {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub grant: Option<RawGrant>,
    pub private_key_file: Option<PathBuf>,
    pub signing_algorithm: Option<String>,
}

/// `[views.<name>]`: a subset of the catalog, by upstream and by glob on exposed names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawView {
    pub upstreams: Option<Vec<String>>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub prompts: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub deny_tools: Vec<String>,
    #[serde(default)]
    pub deny_prompts: Vec<String>,
    #[serde(default)]
    pub deny_resources: Vec<String>,
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Claims of an access token (`[daemon.oauth]`) whose principals see only this view.
    #[serde(default)]
    pub claims: BTreeMap<String, String>,
    pub expose: Option<registry::search::Expose>,
}
