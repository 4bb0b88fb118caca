//! The explore commands (`explore`, `schema`, `hash`, `call`): a configured
//! upstream or any naked URI (`mcp+uvx://…`, `mcp+npx://…`, `mcp+python://…`,
//! `mcp+node://…`, `http(s)://…`) is started, initialized and listed without a
//! daemon, and stopped when the command ends. Output is JSON for scripts and models.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use adapters::handshake;
use adapters::oauth::{Challenge, Interaction, OAuthClient, Prompt, TokenStore};
use adapters::stdio::ConnectionStats;
use adapters::{ConnectionError, Reply, UpstreamConnection};
use registry::fingerprint::{self, ListingSnapshot};
use registry::Kind;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::cli::{self, ExploreOptions};
use crate::config::{self, DaemonSettings, Launch, UpstreamConfig};
use crate::upstreams::{client_identity, fetch_listing, open_connection, DISCOVER_PROBE_TIMEOUT};

#[derive(Debug, thiserror::Error)]
pub enum ExploreError {
    #[error("{0}")]
    Target(String),
    #[error("upstream `{upstream}` could not be started: {reason}")]
    Start { upstream: String, reason: String },
    #[error("upstream `{upstream}` failed: {reason}")]
    Upstream { upstream: String, reason: String },
    #[error("upstream `{upstream}` has no tool `{tool}`")]
    UnknownTool { upstream: String, tool: String },
}

/// The seed's call form, a naked URI whose query names the tool:
/// `mcp+uvx://pkg/cmd?command=run&tool=search&gene=BRAF`. What precedes `tool=` in
/// the query stays with the launch; what follows it are the tool's arguments.
/// Returns the target without them, the tool, and the arguments as written.
pub fn split_tool_query(target: &str) -> Result<Option<ToolQuery>, ExploreError> {
    let Some((base, query)) = target.split_once('?') else {
        return Ok(None);
    };
    let pairs: Vec<&str> = query.split('&').filter(|pair| !pair.is_empty()).collect();
    let Some(at) = pairs.iter().position(|pair| pair.starts_with("tool=")) else {
        return Ok(None);
    };
    let decode = |text: &str| {
        adapters::percent_decode(text)
            .map_err(|reason| ExploreError::Target(format!("`{target}`: {reason}")))
    };
    let tool = decode(&pairs[at]["tool=".len()..])?;
    if tool.is_empty() {
        return Err(ExploreError::Target(format!(
            "`{target}` names an empty tool"
        )));
    }
    let mut arguments = Vec::new();
    for pair in &pairs[at + 1..] {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        arguments.push((decode(key)?, decode(value)?));
    }
    let launch = pairs[..at].join("&");
    let target = if launch.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{launch}")
    };
    Ok(Some(ToolQuery {
        target,
        tool,
        arguments,
    }))
}

/// A naked URI's query that names a tool: what `plexus call` needs without a TOOL.
pub struct ToolQuery {
    /// The URI with only its launch arguments.
    pub target: String,
    pub tool: String,
    /// `key=value` pairs after `tool=`, decoded, untyped.
    pub arguments: Vec<(String, String)>,
}

/// A started and initialized upstream with its listing.
pub struct Explored {
    name: String,
    connection: UpstreamConnection,
    hello: handshake::ServerHello,
    snapshot: ListingSnapshot,
    /// Reads what the upstream says on its own; ends with the connection, or is
    /// aborted with this.
    _ignoring: JoinSet<()>,
    /// The OAuth client of a target that needs a login: a refused call is
    /// answered with a new token (a step-up) and sent again.
    oauth: tokio::sync::Mutex<Option<OAuthClient>>,
}

/// Where an explore command keeps OAuth tokens, and the CIMD URL it offers: the
/// config file's `[daemon]` when there is one, else the defaults.
struct OAuthPlace {
    state_dir: PathBuf,
    client_metadata_url: Option<String>,
}

impl OAuthPlace {
    fn of(settings: &DaemonSettings) -> OAuthPlace {
        OAuthPlace {
            state_dir: settings.state_dir.clone(),
            client_metadata_url: settings.oauth_client_metadata_url.clone(),
        }
    }
}

/// The upstream a target names: a configured upstream of `config_path`, or a
/// naked URI or URL, checked by the same rules as the config file.
fn target_config(
    target: &str,
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<(UpstreamConfig, OAuthPlace), ExploreError> {
    if target.contains("://") {
        let key = if target.starts_with("http://") || target.starts_with("https://") {
            "url"
        } else {
            "uri"
        };
        let text = format!(
            "[upstreams.target]\n{key} = {}\n",
            toml::Value::from(target)
        );
        let base = std::env::current_dir().unwrap_or_else(|_| Path::new(".").to_path_buf());
        let mut parsed = config::parse(&text, &base, environment).map_err(|issues| {
            let reasons: Vec<String> = issues.iter().map(|issue| issue.message.clone()).collect();
            ExploreError::Target(format!("`{target}`: {}", reasons.join("; ")))
        })?;
        let place = match config::load(config_path, environment) {
            Ok(loaded) => OAuthPlace::of(&loaded.daemon),
            Err(_) => OAuthPlace::of(&parsed.daemon),
        };
        return parsed
            .upstreams
            .remove("target")
            .map(|upstream| (upstream, place))
            .ok_or_else(|| ExploreError::Target(format!("`{target}` names no upstream")));
    }
    let mut loaded = config::load(config_path, environment)
        .map_err(|error| ExploreError::Target(error.to_string()))?;
    let place = OAuthPlace::of(&loaded.daemon);
    loaded.upstreams.remove(target).map(|upstream| (upstream, place)).ok_or_else(|| {
        ExploreError::Target(format!(
            "`{target}` is neither an upstream of {} nor a URI (mcp+uvx://…, mcp+npx://…, http(s)://…)",
            config_path.display()
        ))
    })
}

/// Starts, initializes and lists the target.
pub async fn open(
    target: &str,
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Explored, ExploreError> {
    open_with(target, config_path, environment, false).await
}

/// [`open`], where `device` says a login uses the device grant wherever the
/// server offers it (`plexus login --device`).
pub async fn open_with(
    target: &str,
    config_path: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    device: bool,
) -> Result<Explored, ExploreError> {
    let (config, place) = target_config(target, config_path, environment)?;
    let name: Arc<str> = Arc::from(config.name.as_str());
    let (events, mut ignored) = mpsc::channel(256);
    // What the upstream says on its own (logs, list changes) is not part of the answer.
    let mut ignoring = JoinSet::new();
    ignoring.spawn(async move { while ignored.recv().await.is_some() {} });
    let connection = open_connection(
        &name,
        &config,
        Arc::new(ConnectionStats::default()),
        None,
        events.into(),
    )
    .await
    .map_err(|reason| ExploreError::Start {
        upstream: config.name.clone(),
        reason,
    })?;
    let failed = |reason: String| ExploreError::Upstream {
        upstream: config.name.clone(),
        reason,
    };
    let mut oauth = match oauth_client(&config, &place, environment, device) {
        Ok(oauth) => oauth,
        Err(error) => {
            connection.shutdown().await;
            return Err(failed(adapters::error_chain(&error)));
        }
    };
    if let Some(client) = oauth.as_mut() {
        if let Ok(Some(token)) = client.fresh_token().await {
            connection.set_bearer_token(Some(&token));
        }
    }
    let probe = config.init_timeout.min(DISCOVER_PROBE_TIMEOUT);
    let identity = client_identity();
    let hello = loop {
        let start =
            handshake::connect(&connection, &identity, config.protocol.for_adapter(), probe);
        let error = match tokio::time::timeout(config.init_timeout, start).await {
            Ok(Ok(hello)) => break hello,
            Ok(Err(error)) => error,
            Err(_) => {
                connection.shutdown().await;
                return Err(failed("it did not answer initialize in time".into()));
            }
        };
        login_or_fail(oauth.as_mut(), &connection, &error, "initialize")
            .await
            .map_err(failed)?;
    };
    let listing = loop {
        let error = match fetch_listing(&connection, &config, &hello).await {
            Ok(listing) => break listing,
            Err(error) => error,
        };
        login_or_fail(oauth.as_mut(), &connection, &error, "listing")
            .await
            .map_err(failed)?;
    };
    let snapshot = ListingSnapshot {
        server_name: hello
            .server_info
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string),
        server_version: hello
            .server_info
            .get("version")
            .and_then(Value::as_str)
            .map(str::to_string),
        instructions: hello.instructions.clone(),
        tools: listing.tools,
        prompts: listing.prompts,
        resources: listing.resources,
        resource_templates: listing.resource_templates,
    };
    Ok(Explored {
        name: config.name,
        connection,
        hello,
        snapshot,
        _ignoring: ignoring,
        oauth: tokio::sync::Mutex::new(oauth),
    })
}

/// The OAuth client of an HTTP target that configures no Authorization header:
/// it acts when the server refuses with a Bearer challenge.
fn oauth_client(
    config: &UpstreamConfig,
    place: &OAuthPlace,
    environment: &dyn Fn(&str) -> Option<String>,
    device: bool,
) -> Result<Option<OAuthClient>, ExploreError> {
    let Launch::Http(endpoint) = &config.launch else {
        return Ok(None);
    };
    if endpoint
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
    {
        return Ok(None);
    }
    let settings = crate::upstreams::login::settings(config, place.client_metadata_url.clone())
        .map_err(ExploreError::Target)?;
    let browser = environment("BROWSER").filter(|browser| !browser.trim().is_empty());
    // No browser to start and no display to show one: a headless machine.
    let headless = browser.is_none()
        && ["DISPLAY", "WAYLAND_DISPLAY"]
            .iter()
            .all(|name| environment(name).is_none_or(|value| value.is_empty()));
    let interaction = Interaction {
        browser,
        device: device || headless,
        prompt: Arc::new(|prompt: &Prompt<'_>| {
            let text = match prompt {
                Prompt::Url(url) => {
                    format!("plexus: to authorize access, open this URL in a browser:\n  {url}")
                }
                Prompt::DeviceCode {
                    verification_uri,
                    user_code,
                    complete,
                } => match complete {
                    Some(complete) => format!("plexus: to authorize access, open {complete} (or enter code {user_code} at {verification_uri})"),
                    None => format!("plexus: to authorize access, enter code {user_code} at {verification_uri}"),
                },
            };
            let _ = writeln!(std::io::stderr(), "{text}");
        }),
        wait: LOGIN_WAIT,
    };
    let store = TokenStore::for_server(&place.state_dir.join("oauth"), &endpoint.url);
    OAuthClient::new(&endpoint.url, settings, store, interaction)
        .map(Some)
        .map_err(|error| ExploreError::Target(adapters::error_chain(&error)))
}

/// How long a person has to finish a login started by an explore command.
const LOGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The Bearer challenge of a refusal: a 401, or a 403 `insufficient_scope`.
fn challenge_of(error: &ConnectionError) -> Option<Challenge> {
    let ConnectionError::HttpStatus {
        status,
        challenge: Some(challenge),
        ..
    } = error
    else {
        return None;
    };
    let challenge = Challenge::parse(challenge)?;
    (*status == 401 || (*status == 403 && challenge.is_insufficient_scope())).then_some(challenge)
}

/// After a step refused with `error`: `Ok(())` when a login was just made and the
/// step runs again; else the connection is shut down and why the step failed returned.
async fn login_or_fail(
    oauth: Option<&mut OAuthClient>,
    connection: &UpstreamConnection,
    error: &handshake::HandshakeError,
    step: &str,
) -> Result<(), String> {
    let reason = match authorize(oauth, connection, handshake_challenge(error)).await {
        Ok(true) => return Ok(()),
        Ok(false) => format!("{step} failed: {}", adapters::error_chain(error)),
        Err(reason) => reason,
    };
    connection.shutdown().await;
    Err(reason)
}

fn handshake_challenge(error: &handshake::HandshakeError) -> Option<Challenge> {
    match error {
        handshake::HandshakeError::Connection(error) => challenge_of(error),
        _ => None,
    }
}

/// Answers a refusal's challenge with a new token on the connection: Ok(true)
/// to try again, Ok(false) when there is nothing to answer (no OAuth, no
/// challenge), Err when the login failed (said without any token).
async fn authorize(
    oauth: Option<&mut OAuthClient>,
    connection: &UpstreamConnection,
    challenge: Option<Challenge>,
) -> Result<bool, String> {
    let (Some(oauth), Some(challenge)) = (oauth, challenge) else {
        return Ok(false);
    };
    let token = oauth
        .answer(&challenge)
        .await
        .map_err(|error| format!("the OAuth login failed: {}", adapters::error_chain(&error)))?;
    Ok(connection.set_bearer_token(Some(&token)))
}

impl Explored {
    /// Stops the upstream (its whole process group, for a stdio one).
    pub async fn close(self) {
        self.connection.shutdown().await;
    }

    fn server(&self) -> Value {
        json!({
            "serverInfo": self.hello.server_info,
            "protocolVersion": self.hello.protocol_version,
            "capabilities": self.hello.capabilities,
            "instructions": self.hello.instructions,
        })
    }

    /// Everything the upstream lists, with what it said of itself.
    pub fn explore(&self) -> Value {
        json!({
            "server": self.server(),
            "tools": self.snapshot.tools,
            "prompts": self.snapshot.prompts,
            "resources": self.snapshot.resources,
            "resourceTemplates": self.snapshot.resource_templates,
        })
    }

    /// One tool's definition as the upstream sent it.
    pub fn schema(&self, tool: &str) -> Result<Value, ExploreError> {
        self.snapshot
            .tools
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some(tool))
            .cloned()
            .ok_or_else(|| ExploreError::UnknownTool {
                upstream: self.name.clone(),
                tool: tool.to_string(),
            })
    }

    /// Both hashes of every entry and the catalog fingerprint: the values plexus pins.
    pub fn hash(&self) -> Value {
        let mut entries = Map::new();
        for kind in Kind::ALL {
            let hashed: Vec<Value> = self
                .snapshot
                .entries(kind)
                .iter()
                .filter_map(|entry| fingerprint::fingerprint(kind, entry))
                .map(|print| {
                    json!({
                        "identity": print.identity,
                        "compatibility": print.compatibility,
                        "security": print.security,
                    })
                })
                .collect();
            entries.insert(kind.result_key().to_string(), Value::Array(hashed));
        }
        json!({
            "server": self.hello.server_info,
            "catalogFingerprint": fingerprint::catalog_fingerprint(&self.snapshot),
            "entries": entries,
        })
    }

    /// Arguments written as text (the query form) typed by the tool's schema: a
    /// parameter declared `string` stays text, others are read as JSON when they parse.
    pub fn typed_arguments(
        &self,
        tool: &str,
        pairs: &[(String, String)],
    ) -> Result<Value, ExploreError> {
        let schema = self.schema(tool)?;
        let properties = schema.pointer("/inputSchema/properties");
        let mut arguments = Map::new();
        for (key, text) in pairs {
            let declared = properties
                .and_then(|properties| properties.get(key))
                .and_then(|property| property.get("type"))
                .and_then(Value::as_str);
            let value = match declared {
                Some("string") => Value::String(text.clone()),
                _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())),
            };
            arguments.insert(key.clone(), value);
        }
        Ok(Value::Object(arguments))
    }

    /// Calls a tool and returns the upstream's result (or its error object).
    pub async fn call(&self, tool: &str, arguments: Value) -> Result<Value, ExploreError> {
        self.schema(tool)?;
        let params = json!({"name": tool, "arguments": arguments});
        loop {
            let outcome = self
                .connection
                .request("tools/call", Some(params.clone()))
                .await
                .map(Reply::into_result);
            let error = match outcome {
                Ok(Ok(result)) => return Ok(result),
                Ok(Err(error)) => return Ok(json!({"error": error})),
                Err(error) => error,
            };
            let mut oauth = self.oauth.lock().await;
            let answered = authorize(oauth.as_mut(), &self.connection, challenge_of(&error))
                .await
                .map_err(|reason| ExploreError::Upstream {
                    upstream: self.name.clone(),
                    reason,
                })?;
            if !answered {
                return Err(ExploreError::Upstream {
                    upstream: self.name.clone(),
                    reason: adapters::error_chain(&error),
                });
            }
        }
    }
}

/// What an explore command asks of its target.
pub enum Exploration {
    Explore,
    Schema(String),
    Hash,
    Call(String, CallArguments),
}

pub enum CallArguments {
    Json(String),
    /// From the target's query, typed by the tool's schema.
    Query(Vec<(String, String)>),
}

/// The explore commands: JSON on stdout, or a JSON error on stderr and exit 1.
pub fn run(target: &str, options: &ExploreOptions, what: Exploration) -> ExitCode {
    let Some(runtime) = cli::runtime() else {
        return ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(async {
        let explored = open(target, &options.config.path, &cli::environment).await?;
        let answer = match what {
            Exploration::Explore => Ok(explored.explore()),
            Exploration::Schema(tool) => explored.schema(&tool),
            Exploration::Hash => Ok(explored.hash()),
            Exploration::Call(tool, CallArguments::Query(pairs)) => {
                match explored.typed_arguments(&tool, &pairs) {
                    Ok(arguments) => explored.call(&tool, arguments).await,
                    Err(error) => Err(error),
                }
            }
            Exploration::Call(tool, CallArguments::Json(arguments)) => {
                match serde_json::from_str(&arguments) {
                    Ok(arguments @ serde_json::Value::Object(_)) => {
                        explored.call(&tool, arguments).await
                    }
                    _ => Err(ExploreError::Target(format!(
                        "the arguments must be a JSON object, not `{arguments}`"
                    ))),
                }
            }
        };
        explored.close().await;
        answer
    });
    match outcome {
        Ok(answer) => {
            let text = if options.pretty {
                serde_json::to_string_pretty(&answer)
            } else {
                serde_json::to_string(&answer)
            };
            // A closed pipe (`| head`) is the reader's choice, not a failure to report.
            let _ = writeln!(std::io::stdout(), "{}", text.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(error) => {
            let report = serde_json::json!({"error": error.to_string(), "target": target});
            let _ = writeln!(std::io::stderr(), "{report}");
            ExitCode::FAILURE
        }
    }
}

/// `plexus call`: the tool named, with JSON arguments, or named by the target's
/// query with the arguments that follow it.
pub fn call(
    target: &str,
    tool: Option<String>,
    arguments: String,
    options: &ExploreOptions,
) -> ExitCode {
    if let Some(tool) = tool {
        return run(
            target,
            options,
            Exploration::Call(tool, CallArguments::Json(arguments)),
        );
    }
    match split_tool_query(target) {
        Ok(Some(query)) => run(
            &query.target,
            options,
            Exploration::Call(query.tool, CallArguments::Query(query.arguments)),
        ),
        Ok(None) => {
            let report = serde_json::json!({"error": "name the tool: `plexus call TARGET TOOL '{json}'`, or end a naked URI's query with `tool=NAME&arg=value…`", "target": target});
            let _ = writeln!(std::io::stderr(), "{report}");
            ExitCode::FAILURE
        }
        Err(error) => {
            let report = serde_json::json!({"error": error.to_string(), "target": target});
            let _ = writeln!(std::io::stderr(), "{report}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_and_its_arguments_end_the_query() {
        let ToolQuery {
            target,
            tool,
            arguments,
        } = split_tool_query(
            "mcp+uvx://biomcp-python/biomcp?command=run&tool=search&gene=BRAF&note=a%20b",
        )
        .unwrap()
        .unwrap();
        assert_eq!(target, "mcp+uvx://biomcp-python/biomcp?command=run");
        assert_eq!(tool, "search");
        assert_eq!(
            arguments,
            [
                ("gene".to_string(), "BRAF".to_string()),
                ("note".to_string(), "a b".to_string())
            ]
        );
        let query = split_tool_query("mcp+python://./s.py?tool=fetch")
            .unwrap()
            .unwrap();
        assert_eq!(
            (query.target.as_str(), query.tool.as_str()),
            ("mcp+python://./s.py", "fetch")
        );
        assert!(split_tool_query("mcp+npx://pkg?flag=1").unwrap().is_none());
        assert!(split_tool_query("mcp+npx://pkg?tool=").is_err());
    }
}
