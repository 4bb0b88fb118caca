//! Raw sections checked into [`Config`]: one function per section, every problem
//! collected with its key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use adapters::remote::{check_header, check_url};
use adapters::{parse_naked_uri, HttpEndpoint, HttpTransportKind, Launcher};

use super::raw::{RawDaemon, RawTransport, RawUpstream, RawView};
use super::*;
use registry::ToolFilter;

/// Parses and validates configuration text; relative paths resolve against `base`.
pub fn parse(
    text: &str,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, Vec<ConfigIssue>> {
    let mut issues = Vec::new();
    let issue = |key: &str, message: String| ConfigIssue {
        key: key.to_string(),
        message,
    };
    let mut document: toml::Table = toml::from_str(text).map_err(|error| {
        let line = error
            .span()
            .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
        let at = line
            .map(|line| format!(" at line {line}"))
            .unwrap_or_default();
        let reason = error.message().replace('\n', " ");
        vec![issue("(file)", format!("not valid TOML{at}: {reason}"))]
    })?;

    // Sections are deserialized one by one so that one bad upstream does not hide another's errors.
    let raw_daemon = match document.remove("daemon") {
        None => RawDaemon::default(),
        Some(value) => value.try_into::<RawDaemon>().unwrap_or_else(|error| {
            issues.push(issue("daemon", error.message().to_string()));
            RawDaemon::default()
        }),
    };
    let raw_upstreams = match document.remove("upstreams") {
        None => toml::Table::new(),
        Some(toml::Value::Table(table)) => table,
        Some(_) => {
            issues.push(issue("upstreams", "must be a table of upstreams".into()));
            toml::Table::new()
        }
    };
    let raw_views = match document.remove("views") {
        None => toml::Table::new(),
        Some(toml::Value::Table(table)) => table,
        Some(_) => {
            issues.push(issue("views", "must be a table of views".into()));
            toml::Table::new()
        }
    };
    for key in document.keys() {
        issues.push(issue(
            key,
            "unknown section (expected `daemon`, `upstreams` or `views`)".into(),
        ));
    }

    let daemon = validate_daemon(raw_daemon, base, environment, &mut issues);
    let mut upstreams = BTreeMap::new();
    for (name, value) in raw_upstreams {
        let key = format!("upstreams.{name}");
        if !valid_upstream_name(&name) {
            issues.push(issue(
                &key,
                "upstream names use only lowercase letters, digits and `-`".into(),
            ));
        }
        let raw = match value.try_into::<RawUpstream>() {
            Ok(raw) => raw,
            Err(error) => {
                issues.push(issue(&key, error.message().to_string()));
                continue;
            }
        };
        if let Some(upstream) = validate_upstream(&name, raw, base, environment, &mut issues) {
            upstreams.insert(name, upstream);
        }
    }
    let views = validate_views(raw_views, &upstreams, &daemon, &mut issues);
    if issues.is_empty() {
        Ok(Config {
            daemon,
            upstreams,
            views,
        })
    } else {
        Err(issues)
    }
}

/// `[views.<name>]`: names like upstreams', upstreams that exist, tokens that exist
/// and are bound to one view at most.
fn validate_views(
    raw_views: toml::Table,
    upstreams: &BTreeMap<String, UpstreamConfig>,
    daemon: &DaemonSettings,
    issues: &mut Vec<ConfigIssue>,
) -> BTreeMap<String, ViewConfig> {
    let mut views = BTreeMap::new();
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in raw_views {
        let key = format!("views.{name}");
        if !valid_upstream_name(&name) {
            issues.push(ConfigIssue {
                key: key.clone(),
                message: "view names use only lowercase letters, digits and `-`".into(),
            });
        }
        let raw = match value.try_into::<RawView>() {
            Ok(raw) => raw,
            Err(error) => {
                issues.push(ConfigIssue {
                    key,
                    message: error.message().to_string(),
                });
                continue;
            }
        };
        for upstream in raw.upstreams.iter().flatten() {
            if !upstreams.contains_key(upstream) {
                issues.push(ConfigIssue {
                    key: format!("{key}.upstreams"),
                    message: format!("there is no upstream `{upstream}`"),
                });
            }
        }
        for token in &raw.tokens {
            if !daemon.auth_tokens.0.iter().any(|(known, _)| known == token) {
                issues.push(ConfigIssue {
                    key: format!("{key}.tokens"),
                    message: format!("there is no token `{token}` in [daemon] auth_tokens"),
                });
            }
            if let Some(other) = bound.insert(token.clone(), name.clone()) {
                issues.push(ConfigIssue {
                    key: format!("{key}.tokens"),
                    message: format!("token `{token}` is already bound to view `{other}`"),
                });
            }
        }
        let restricts_resources = !raw.resources.is_empty() || !raw.deny_resources.is_empty();
        let view = registry::View {
            upstreams: raw.upstreams.map(|names| names.into_iter().collect()),
            tools: ToolFilter::new(raw.tools, raw.deny_tools),
            prompts: ToolFilter::new(raw.prompts, raw.deny_prompts),
            resources: ToolFilter::new(raw.resources, raw.deny_resources),
            restricts_resources,
        };
        views.insert(
            name,
            ViewConfig {
                view,
                tokens: raw.tokens,
            },
        );
    }
    views
}

fn valid_upstream_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn validate_daemon(
    raw: RawDaemon,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> DaemonSettings {
    let mut address = |key: &str, value: Option<String>, default: &str| -> SocketAddr {
        let text = value.unwrap_or_else(|| default.to_string());
        text.parse().unwrap_or_else(|_| {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: format!("`{text}` is not an address like `127.0.0.1:7464`"),
            });
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    };
    let listen = address("listen", raw.listen, DEFAULT_LISTEN);
    let admin_listen = address("admin_listen", raw.admin_listen, DEFAULT_ADMIN_LISTEN);
    let name_budget = raw.name_budget.unwrap_or(DEFAULT_NAME_BUDGET);
    if !(16..=1024).contains(&name_budget) {
        issues.push(ConfigIssue {
            key: "daemon.name_budget".into(),
            message: format!("{name_budget} is out of range (16 to 1024)"),
        });
    }
    let page_size = raw.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=10_000).contains(&page_size) {
        issues.push(ConfigIssue {
            key: "daemon.page_size".into(),
            message: format!("{page_size} is out of range (1 to 10000)"),
        });
    }
    let mut duration = |key: &str, value: Option<String>, default: Duration, zero: Zero| {
        value.map_or(default, |text| {
            duration_where(&text, zero).unwrap_or_else(|message| {
                issues.push(ConfigIssue {
                    key: format!("daemon.{key}"),
                    message,
                });
                default
            })
        })
    };
    let drain_timeout = duration(
        "drain_timeout",
        raw.drain_timeout,
        DEFAULT_DRAIN_TIMEOUT,
        Zero::Allowed,
    );
    let session_idle_timeout = duration(
        "session_idle_timeout",
        raw.session_idle_timeout,
        DEFAULT_SESSION_IDLE_TIMEOUT,
        Zero::Refused,
    );
    let state_dir = match raw.state_dir {
        Some(dir) => base.join(dir),
        None => default_state_dir(environment),
    };
    let header_read_timeout = duration(
        "header_read_timeout",
        raw.header_read_timeout,
        DEFAULT_HEADER_READ_TIMEOUT,
        Zero::Refused,
    );
    let body_read_timeout = duration(
        "body_read_timeout",
        raw.body_read_timeout,
        DEFAULT_BODY_READ_TIMEOUT,
        Zero::Refused,
    );
    let first_list_wait = duration(
        "first_list_wait",
        raw.first_list_wait,
        DEFAULT_FIRST_LIST_WAIT,
        Zero::Allowed,
    );
    let pins = base.join(raw.pins.unwrap_or_else(|| PathBuf::from(DEFAULT_PINS_FILE)));
    let mut tokens = Vec::new();
    for (name, value) in raw.auth_tokens {
        let key = format!("daemon.auth_tokens.{name}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            issues.push(ConfigIssue {
                key,
                message: "token names use only letters, digits, `-`, `_` and `.`".into(),
            });
            continue;
        }
        match secret_value(&value, base, environment) {
            Ok(token) if token.len() >= 16 => tokens.push((name, token)),
            // The value itself is never repeated.
            Ok(_) => issues.push(ConfigIssue {
                key,
                message: "a token must be at least 16 characters long".into(),
            }),
            Err(message) => issues.push(ConfigIssue { key, message }),
        }
    }
    let auth_tokens = AuthTokens(tokens);
    for (key, address) in [("listen", listen), ("admin_listen", admin_listen)] {
        if !address.ip().is_loopback() && auth_tokens.is_empty() {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: format!(
                    "{address} is reachable beyond this machine, and without [daemon] auth_tokens \
                     anyone who reaches it could use every tool; add auth_tokens (and \
                     allowed_hosts), or listen on 127.0.0.1"
                ),
            });
        }
    }
    for (key, values) in [
        ("allowed_hosts", &raw.allowed_hosts),
        ("allowed_origins", &raw.allowed_origins),
    ] {
        if values.iter().any(|value| value.trim().is_empty()) {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: "entries must not be empty".into(),
            });
        }
    }
    // Entries are compared exactly: a pattern or a URL in the wrong list would
    // never match, and every request it was meant for would be refused.
    // (Empty entries are reported above, once.)
    let given = |entry: &&String| !entry.trim().is_empty();
    for host in raw
        .allowed_hosts
        .iter()
        .filter(given)
        .filter(|host| !is_host_entry(host))
    {
        issues.push(ConfigIssue {
            key: "daemon.allowed_hosts".into(),
            message: format!(
                "`{host}` is not a host name or `name:port` (no scheme, path or wildcard)"
            ),
        });
    }
    for origin in raw
        .allowed_origins
        .iter()
        .filter(given)
        .filter(|origin| !is_origin_entry(origin))
    {
        let message = if origin.trim().eq_ignore_ascii_case("null") {
            // Sent by sandboxed frames and local files: any web page can send it.
            "`null` is the origin any web page can give itself (a sandboxed frame): allowing it would let every page reach plexus".to_string()
        } else {
            format!("`{origin}` is not an origin like `https://ide.example.com` (a scheme and a host, no path or wildcard)")
        };
        issues.push(ConfigIssue {
            key: "daemon.allowed_origins".into(),
            message,
        });
    }
    let mut at_least_one = |key: &str, value: Option<usize>, default: usize| {
        let value = value.unwrap_or(default);
        if value == 0 {
            issues.push(ConfigIssue {
                key: format!("daemon.{key}"),
                message: "must be at least 1".into(),
            });
        }
        value
    };
    // Unset, it is derived from the descriptor limit at start (`descriptors.rs`).
    let max_connections = raw
        .max_connections
        .map(|value| at_least_one("max_connections", Some(value), DEFAULT_MAX_CONNECTIONS));
    let max_sessions = at_least_one("max_sessions", raw.max_sessions, DEFAULT_MAX_SESSIONS);
    let max_sessions_per_principal = at_least_one(
        "max_sessions_per_principal",
        raw.max_sessions_per_principal,
        DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
    );
    let start_concurrency = at_least_one(
        "start_concurrency",
        raw.start_concurrency,
        DEFAULT_START_CONCURRENCY,
    );
    let worker_threads = raw.worker_threads;
    if let Some(threads) =
        worker_threads.filter(|threads| !(1..=MAX_WORKER_THREADS).contains(threads))
    {
        issues.push(ConfigIssue {
            key: "daemon.worker_threads".into(),
            message: format!("{threads} is out of range (1 to {MAX_WORKER_THREADS})"),
        });
    }
    DaemonSettings {
        start_concurrency,
        worker_threads,
        auth_tokens,
        allowed_hosts: raw
            .allowed_hosts
            .into_iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect(),
        allowed_origins: raw
            .allowed_origins
            .into_iter()
            .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
            .collect(),
        max_connections,
        header_read_timeout,
        body_read_timeout,
        max_sessions,
        max_sessions_per_principal,
        audit_log: raw.audit_log.map(|path| base.join(path)),
        first_list_wait,
        pins,
        listen,
        admin_listen,
        name_budget,
        page_size,
        state_dir,
        drain_timeout,
        session_idle_timeout,
    }
}

/// `$STATE_DIRECTORY` under systemd, else `$XDG_STATE_HOME/plexus`, else `~/.local/state/plexus`.
pub fn default_state_dir(environment: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = environment("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may pass several, separated by colons; the first is ours.
        let first = dir.split(':').next().unwrap_or(&dir).to_string();
        return PathBuf::from(first);
    }
    if let Some(dir) = environment("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("plexus");
    }
    let home = environment("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/state/plexus")
}

fn validate_upstream(
    name: &str,
    raw: RawUpstream,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<UpstreamConfig> {
    let key = |field: &str| format!("upstreams.{name}.{field}");
    let forms: Vec<(&str, &String)> = [
        ("command", &raw.command),
        ("uvx", &raw.uvx),
        ("npx", &raw.npx),
        ("python", &raw.python),
        ("node", &raw.node),
        ("uri", &raw.uri),
        ("url", &raw.url),
    ]
    .into_iter()
    .filter_map(|(form, value)| value.as_ref().map(|value| (form, value)))
    .collect();
    let before = issues.len();
    let launch = match forms.as_slice() {
        [] => {
            issues.push(ConfigIssue {
                key: format!("upstreams.{name}"),
                message: "give exactly one of command, uvx, npx, python, node, uri or url".into(),
            });
            None
        }
        [("url", value)] => {
            url_of(value, &key, environment, issues).map(|(url, basic)| LaunchForm::Url(url, basic))
        }
        [(form, value)] => launcher_of(form, value, &key, issues).map(LaunchForm::Stdio),
        several => {
            let names: Vec<_> = several.iter().map(|(form, _)| *form).collect();
            issues.push(ConfigIssue {
                key: format!("upstreams.{name}"),
                message: format!("give exactly one launch form, not {}", names.join(" and ")),
            });
            None
        }
    };
    let mut duration = |field: &str, value: Option<String>, default: Duration, zero: Zero| {
        value.map_or(Some(default), |text| match duration_where(&text, zero) {
            Ok(duration) => Some(duration),
            Err(message) => {
                issues.push(ConfigIssue {
                    key: key(field),
                    message,
                });
                None
            }
        })
    };
    let init_timeout = duration(
        "init_timeout",
        raw.init_timeout,
        DEFAULT_INIT_TIMEOUT,
        Zero::Refused,
    );
    let call_timeout = duration(
        "call_timeout",
        raw.call_timeout,
        DEFAULT_CALL_TIMEOUT,
        Zero::Refused,
    );
    // Unset, the cap is never below the call's own deadline.
    let explicit_max_call_timeout = raw.max_call_timeout.is_some();
    let max_call_timeout = duration(
        "max_call_timeout",
        raw.max_call_timeout,
        DEFAULT_MAX_CALL_TIMEOUT.max(call_timeout.unwrap_or_default()),
        Zero::Refused,
    );
    let idle_timeout = duration(
        "idle_timeout",
        raw.idle_timeout,
        DEFAULT_IDLE_TIMEOUT,
        Zero::Allowed,
    );
    let restart_window = duration(
        "restart_window",
        raw.restart_window,
        DEFAULT_RESTART_WINDOW,
        Zero::Allowed,
    );
    let restart_backoff = duration(
        "restart_backoff",
        raw.restart_backoff,
        DEFAULT_RESTART_BACKOFF,
        Zero::Allowed,
    );
    let restart_backoff_max = duration(
        "restart_backoff_max",
        raw.restart_backoff_max,
        DEFAULT_RESTART_BACKOFF_MAX,
        Zero::Allowed,
    );
    let health_interval = duration(
        "health_interval",
        raw.health_interval,
        DEFAULT_HEALTH_INTERVAL,
        Zero::Allowed,
    );
    let health_timeout = duration(
        "health_timeout",
        raw.health_timeout,
        DEFAULT_HEALTH_TIMEOUT,
        Zero::Refused,
    );
    let stop_grace = duration(
        "stop_grace",
        raw.stop_grace,
        DEFAULT_STOP_GRACE,
        Zero::Allowed,
    );
    let schema_check_interval = duration(
        "schema_check_interval",
        raw.schema_check_interval,
        DEFAULT_SCHEMA_CHECK_INTERVAL,
        Zero::Allowed,
    );
    let mut tool_timeouts = BTreeMap::new();
    for (tool, text) in raw.tool_timeouts {
        if let Some(timeout) = duration(
            &format!("tool_timeouts.{tool}"),
            Some(text),
            Duration::ZERO,
            Zero::Refused,
        ) {
            tool_timeouts.insert(tool, timeout);
        }
    }
    if let (Some(call), Some(max), true) =
        (call_timeout, max_call_timeout, explicit_max_call_timeout)
    {
        if max < call {
            issues.push(ConfigIssue {
                key: key("max_call_timeout"),
                message: "must not be shorter than call_timeout".into(),
            });
        }
    }
    let mut count = |field: &str, value: Option<usize>, default: usize| {
        let value = value.unwrap_or(default);
        if value == 0 {
            issues.push(ConfigIssue {
                key: key(field),
                message: "must be at least 1".into(),
            });
        }
        value
    };
    let max_in_flight = count("max_in_flight", raw.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
    let max_restarts = count("max_restarts", raw.max_restarts, DEFAULT_MAX_RESTARTS);
    let max_message_bytes = count(
        "max_message_bytes",
        raw.max_message_bytes,
        DEFAULT_MAX_MESSAGE_BYTES,
    );
    let max_list_bytes = count("max_list_bytes", raw.max_list_bytes, DEFAULT_MAX_LIST_BYTES);
    for (field, patterns) in [
        ("allow_tools", &raw.allow_tools),
        ("deny_tools", &raw.deny_tools),
    ] {
        if patterns.iter().any(String::is_empty) {
            issues.push(ConfigIssue {
                key: key(field),
                message: "patterns must not be empty".into(),
            });
        }
    }
    let remote = raw.url.is_some();
    // The operating system takes none of these: the spawn would fail with a
    // reason that names neither the key nor the value.
    let nul = |text: &str| text.contains('\0');
    let unlaunchable = [
        ("args", raw.args.iter().any(|arg| nul(arg))),
        (
            "cwd",
            raw.cwd
                .as_ref()
                .is_some_and(|cwd| nul(&cwd.to_string_lossy())),
        ),
    ];
    for (field, bad) in unlaunchable {
        if bad {
            issues.push(ConfigIssue {
                key: key(field),
                message: "must not contain a NUL character".into(),
            });
        }
    }
    let mut env = BTreeMap::new();
    for (variable, value) in raw.env {
        if variable.is_empty() || variable.contains('=') || nul(&variable) || nul(&value) {
            issues.push(ConfigIssue {
                key: key(&format!("env.{variable}")),
                message: "a variable's name must not be empty or hold `=`, and neither it nor its value a NUL character".into(),
            });
            continue;
        }
        match secret_value(&value, base, environment) {
            Ok(value) => {
                env.insert(variable, value);
            }
            Err(message) => issues.push(ConfigIssue {
                key: key(&format!("env.{variable}")),
                message,
            }),
        }
    }
    let mut headers = Vec::new();
    for (header, value) in raw.headers {
        let field = key(&format!("headers.{header}"));
        let checked =
            secret_value(&value, base, environment).and_then(|value| {
                match check_header(&header, &value) {
                    Ok(_) => Ok(value),
                    Err(error) => Err(error.to_string()),
                }
            });
        match checked {
            Ok(value) => headers.push((header, value)),
            Err(message) => issues.push(ConfigIssue {
                key: field,
                message,
            }),
        }
    }
    if let Some(LaunchForm::Url(_, Some(_))) = &launch {
        if headers
            .iter()
            .any(|(header, _)| header.eq_ignore_ascii_case("authorization"))
        {
            issues.push(ConfigIssue {
                key: key("url"),
                message: "has a user and password and `headers` has an Authorization: give one"
                    .into(),
            });
        }
    }
    // Keys that only mean something for one kind of upstream are errors on the other.
    let misplaced: &[(&str, bool)] = if remote {
        &[
            ("args", !raw.args.is_empty()),
            ("env", !env.is_empty()),
            ("cwd", raw.cwd.is_some()),
        ]
    } else {
        &[
            ("headers", !headers.is_empty()),
            ("transport", raw.transport.is_some()),
        ]
    };
    for (field, present) in misplaced {
        if *present {
            let applies = if remote {
                "applies to stdio launch forms, not to `url`"
            } else {
                "applies to `url` upstreams only"
            };
            issues.push(ConfigIssue {
                key: key(field),
                message: applies.into(),
            });
        }
    }
    let prefix = raw.prefix.unwrap_or_else(|| name.to_string());
    if prefix.contains("__") {
        issues.push(ConfigIssue {
            key: key("prefix"),
            message: "must not contain `__`, the separator plexus puts after it".into(),
        });
    }
    if issues.len() > before {
        return None;
    }
    let mut unversioned_package = None;
    let launch = match launch? {
        LaunchForm::Stdio((launcher, mut args)) => {
            unversioned_package = launcher.unversioned_package().map(str::to_string);
            args.extend(raw.args);
            let cwd = Some(
                raw.cwd
                    .map_or_else(|| base.to_path_buf(), |dir| base.join(dir)),
            );
            Launch::Stdio(launcher.to_spec(&args, env, cwd))
        }
        LaunchForm::Url(url, basic) => Launch::Http(HttpEndpoint {
            url,
            headers: match basic {
                Some(basic) => {
                    let mut headers = headers;
                    headers.push(("Authorization".to_string(), basic));
                    headers
                }
                None => headers,
            },
            transport: match raw.transport.unwrap_or(RawTransport::Auto) {
                RawTransport::StreamableHttp => HttpTransportKind::StreamableHttp,
                RawTransport::Sse => HttpTransportKind::Sse,
                RawTransport::Auto => HttpTransportKind::Auto,
            },
        }),
    };
    Some(UpstreamConfig {
        name: name.to_string(),
        launch,
        enabled: raw.enabled.unwrap_or(true),
        prefix,
        allow_tools: raw.allow_tools,
        deny_tools: raw.deny_tools,
        init_timeout: init_timeout?,
        call_timeout: call_timeout?,
        tool_timeouts,
        max_call_timeout: max_call_timeout?,
        max_message_bytes,
        max_list_bytes,
        max_in_flight,
        max_pending: raw.max_pending.unwrap_or(DEFAULT_MAX_PENDING),
        share: raw.share.unwrap_or(Share::Shared),
        start: raw.start.unwrap_or(Start::Eager),
        protocol: raw.protocol.unwrap_or(Protocol::Auto),
        idle_timeout: idle_timeout?,
        restart: RestartSettings {
            backoff: restart_backoff?,
            backoff_max: restart_backoff_max?,
            max_restarts,
            window: restart_window?,
        },
        health_interval: health_interval?,
        health_timeout: health_timeout?,
        stop_grace: stop_grace?,
        pin: raw.pin.unwrap_or(PinMode::Tofu),
        on_schema_change: raw.on_schema_change.unwrap_or(SchemaPolicy::Block),
        schema_check_interval: schema_check_interval?,
        unversioned_package,
    })
}

/// What the one launch form of an upstream says.
enum LaunchForm {
    Stdio((Launcher, Vec<String>)),
    /// The URL without credentials, and the Basic authorization they make.
    Url(String, Option<String>),
}

/// A remote upstream's URL, checked. A password in it (`https://user:pw@host/…`) is
/// taken out, so the URL can be logged, and becomes Basic authentication, as
/// clients do with such URLs; the second value is that header's value.
fn url_of(
    value: &str,
    key: &dyn Fn(&str) -> String,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<(String, Option<String>)> {
    let (url, userinfo) = split_userinfo(value.trim());
    let basic = match userinfo {
        None => None,
        Some(userinfo) => {
            // `${VAR}` in the user or password (only there) comes from the environment.
            let userinfo = match expand_variables(userinfo, environment) {
                Ok(userinfo) => userinfo,
                Err(message) => {
                    issues.push(ConfigIssue {
                        key: key("url"),
                        message,
                    });
                    return None;
                }
            };
            let decoded = adapters::percent_decode(&userinfo);
            match decoded {
                Ok(credentials) => {
                    use base64::Engine as _;
                    let encoded =
                        base64::engine::general_purpose::STANDARD.encode(credentials.as_bytes());
                    Some(format!("Basic {encoded}"))
                }
                Err(_) => {
                    issues.push(ConfigIssue {
                        key: key("url"),
                        message: format!(
                            "the user and password in `{url}` are not valid percent-encoding"
                        ),
                    });
                    return None;
                }
            }
        }
    };
    match check_url(&url) {
        Ok(_) => Some((url, basic)),
        Err(error) => {
            issues.push(ConfigIssue {
                key: key("url"),
                message: error.to_string(),
            });
            None
        }
    }
}

/// `scheme://user:pw@host/…` → (`scheme://host/…`, `user:pw`); other URLs unchanged.
fn split_userinfo(url: &str) -> (String, Option<&str>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => (
            format!("{scheme}://{host}{}", &rest[authority_end..]),
            Some(userinfo),
        ),
        None => (url.to_string(), None),
    }
}

/// A secret: `${file:/path}` (the file's content, trimmed; relative to the config),
/// or text in which each `${NAME}` is expanded. Errors never contain the value.
fn secret_value(
    text: &str,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    if let Some(path) = text
        .strip_prefix("${file:")
        .and_then(|rest| rest.strip_suffix('}'))
    {
        let path = base.join(path);
        return std::fs::read_to_string(&path)
            .map(|content| content.trim().to_string())
            .map_err(|error| format!("cannot read {}: {error}", path.display()));
    }
    expand_variables(text, environment)
}

/// Replaces each `${NAME}` with the variable's value (`$${` is a literal `${`).
/// The error names the variable, never a value.
fn expand_variables(
    text: &str,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut expanded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            expanded.push_str(&rest[..start]);
            expanded.push('{');
            rest = &rest[start + 2..];
            continue;
        }
        expanded.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "`${` without a closing `}`".to_string())?;
        let variable = &after[..end];
        let valid = variable
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && variable
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("`${{{variable}}}` is not a variable name"));
        }
        let value = environment(variable)
            .ok_or_else(|| format!("environment variable `{variable}` is not set"))?;
        expanded.push_str(&value);
        rest = &after[end + 1..];
    }
    expanded.push_str(rest);
    Ok(expanded)
}

fn launcher_of(
    form: &str,
    value: &str,
    key: &dyn Fn(&str) -> String,
    issues: &mut Vec<ConfigIssue>,
) -> Option<(Launcher, Vec<String>)> {
    if value.trim().is_empty() {
        issues.push(ConfigIssue {
            key: key(form),
            message: "must not be empty".into(),
        });
        return None;
    }
    if value.contains('\0') {
        issues.push(ConfigIssue {
            key: key(form),
            message: "must not contain a NUL character".into(),
        });
        return None;
    }
    let value = value.to_string();
    let launcher = match form {
        "command" => Launcher::Command { program: value },
        "uvx" => Launcher::Uvx {
            package: value,
            command: None,
        },
        "npx" => Launcher::Npx { package: value },
        "python" => Launcher::Python { script: value },
        "node" => Launcher::Node { script: value },
        "uri" => {
            return parse_naked_uri(&value)
                .map_err(|error| {
                    issues.push(ConfigIssue {
                        key: key(form),
                        message: error.to_string(),
                    })
                })
                .ok()
        }
        _ => {
            issues.push(ConfigIssue {
                key: key(form),
                message: "is not a launch form".into(),
            });
            return None;
        }
    };
    Some((launcher, Vec::new()))
}

/// An `allowed_hosts` entry: a name (or address) with an optional port, as a
/// `Host` header carries it.
fn is_host_entry(entry: &str) -> bool {
    let entry = entry.trim();
    !entry.is_empty() && !entry.contains(['/', '*', '@', ' ', '?', '#'])
}

/// An `allowed_origins` entry: `scheme://host[:port]`, as an `Origin` header carries it.
fn is_origin_entry(entry: &str) -> bool {
    let entry = entry.trim().trim_end_matches('/');
    entry.split_once("://").is_some_and(|(scheme, host)| {
        !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            && is_host_entry(host)
    })
}

/// Whether a duration key takes `"0s"`. Timeouts do not: `"0s"` reads as "never" to
/// some, and here it would fail every call, start, health check, connection or
/// session at once. The interval keys take it for never; the waits, windows,
/// grace and back-off keys for none.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zero {
    Allowed,
    Refused,
}

/// The duration `text` gives, unless it is zero where `zero` refuses that.
fn duration_where(text: &str, zero: Zero) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if zero == Zero::Refused && duration.is_zero() {
        return Err("must be longer than 0s (only health_interval and schema_check_interval take \"0s\", for never)".into());
    }
    Ok(duration)
}

/// Parses durations written with a unit: `500ms`, `90s`, `10m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit (ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like `90s`"))?;
    let millis = match unit {
        "ms" => number,
        "s" => number.saturating_mul(1_000),
        "m" => number.saturating_mul(60_000),
        "h" => number.saturating_mul(3_600_000),
        _ => return Err(format!("`{text}` has an unknown unit (use ms, s, m or h)")),
    };
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod userinfo_tests {
    use super::split_userinfo;

    #[test]
    fn a_password_from_the_environment_becomes_basic_auth() {
        let config = super::parse(
            "[upstreams.notes]\nurl = \"https://ops:${NOTES_PASSWORD}@notes.example/mcp\"\n",
            std::path::Path::new("/srv"),
            &|name| (name == "NOTES_PASSWORD").then(|| "p@ss".to_string()),
        )
        .unwrap();
        let super::Launch::Http(endpoint) = &config.upstreams["notes"].launch else {
            panic!("not a url upstream")
        };
        assert_eq!(endpoint.url, "https://notes.example/mcp");
        // ops:p@ss
        assert_eq!(
            endpoint.headers,
            [(
                "Authorization".to_string(),
                "Basic b3BzOnBAc3M=".to_string()
            )]
        );
    }

    #[test]
    fn credentials_leave_the_url() {
        assert_eq!(
            split_userinfo("https://me:p%40ss@notes.example:8443/mcp?x=1"),
            (
                "https://notes.example:8443/mcp?x=1".to_string(),
                Some("me:p%40ss")
            )
        );
        assert_eq!(
            split_userinfo("https://notes.example/a@b"),
            ("https://notes.example/a@b".to_string(), None)
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn no_environment(_: &str) -> Option<String> {
        None
    }

    /// `issues` are exactly `expected`, each an issue's beginning.
    fn assert_issues(issues: &[String], expected: &[&str]) {
        for prefix in expected {
            assert!(
                issues.iter().any(|issue| issue.starts_with(prefix)),
                "missing `{prefix}` in {issues:#?}"
            );
        }
        assert_eq!(issues.len(), expected.len(), "{issues:#?}");
    }

    fn issues_of(text: &str) -> Vec<String> {
        parse(text, Path::new("/etc/plexus"), &no_environment)
            .unwrap_err()
            .into_iter()
            .map(|issue| issue.to_string())
            .collect()
    }

    #[test]
    fn views_name_upstreams_and_tokens_that_exist() {
        let issues = issues_of(
            r#"
            [daemon]
            auth_tokens = { ci = "a-token-long-enough-0000", ops = "another-token-long-enough" }
            [upstreams.alpha]
            command = "fixture"
            [views.one]
            upstreams = ["alpha", "ghost"]
            tokens = ["ci", "nobody"]
            [views.two]
            tokens = ["ci"]
            [views.Bad]
            tools = ["*"]
            [views.three]
            colour = "red"
            "#,
        );
        assert_issues(
            &issues,
            &[
                "views.one.upstreams: there is no upstream `ghost`",
                "views.one.tokens: there is no token `nobody` in [daemon] auth_tokens",
                "views.two.tokens: token `ci` is already bound to view `one`",
                "views.Bad: view names use only lowercase letters, digits and `-`",
                "views.three: unknown field `colour`",
            ],
        );
    }

    #[test]
    fn tokens_are_secrets_and_listening_beyond_loopback_needs_them() {
        let issues =
            issues_of("[daemon]\nlisten = \"0.0.0.0:7464\"\nadmin_listen = \"[::]:7465\"\n");
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with("daemon.listen: 0.0.0.0:7464 is reachable")),
            "{issues:?}"
        );
        assert!(
            issues.iter().any(|i| i.starts_with("daemon.admin_listen:")),
            "{issues:?}"
        );
        let issues = issues_of("[daemon]\nauth_tokens = { short = \"tiny-secret\" }\n");
        assert_eq!(
            issues,
            ["daemon.auth_tokens.short: a token must be at least 16 characters long"]
        );
        assert!(!issues.iter().any(|i| i.contains("tiny-secret")));
        let config = parse(
            "[daemon]\nlisten = \"0.0.0.0:1\"\nauth_tokens = { ops = \"${OPS}\" }\n",
            Path::new("/srv"),
            &|name| (name == "OPS").then(|| "from-the-environment-0".to_string()),
        )
        .unwrap();
        assert_eq!(
            config
                .daemon
                .auth_tokens
                .principal("from-the-environment-0"),
            Some("ops")
        );
        assert_eq!(
            config
                .daemon
                .auth_tokens
                .principal("from-the-environment-1"),
            None
        );
        assert!(!format!("{:?}", config.daemon.auth_tokens).contains("from-the-environment"));
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let config = parse(
            include_str!("../../../config.toml"),
            Path::new("/srv/plexus"),
            &no_environment,
        )
        .unwrap();
        assert_eq!(config.daemon.listen, DEFAULT_LISTEN.parse().unwrap());
        let launchers: Vec<&str> = config
            .upstreams
            .values()
            .filter_map(|u| match &u.launch {
                Launch::Stdio(spec) => Some(spec.program.as_str()),
                Launch::Http(_) => None,
            })
            .collect();
        assert!(
            launchers.contains(&"uvx") && launchers.contains(&"npx"),
            "{launchers:?}"
        );
    }

    #[test]
    fn what_the_system_or_the_access_checks_cannot_take_is_refused() {
        let issues = issues_of(
            r#"
            [daemon]
            allowed_hosts = ["*", "mcp.example.com", "https://mcp.example.com", "10.0.0.1:7464", "[::1]:7464", ""]
            allowed_origins = ["*", "https://ide.example.com", "ide.example.com", "https://ide.example.com/path", "http://localhost:3000/", "null"]
            [upstreams.nul]
            command = "x\u0000y"
            [upstreams.args]
            command = "x"
            args = ["a\u0000b"]
            cwd = "/tmp/\u0000"
            [upstreams.env]
            command = "x"
            env = { "A=B" = "1", "" = "2", C = "3\u0000", D = "fine" }
            "#,
        );
        let expected = [
            "daemon.allowed_hosts: entries must not be empty",
            "daemon.allowed_hosts: `*` is not a host name",
            "daemon.allowed_hosts: `https://mcp.example.com` is not a host name",
            "daemon.allowed_origins: `*` is not an origin",
            "daemon.allowed_origins: `ide.example.com` is not an origin",
            "daemon.allowed_origins: `https://ide.example.com/path` is not an origin",
            "daemon.allowed_origins: `null` is the origin any web page can give itself",
            "upstreams.nul.command: must not contain a NUL character",
            "upstreams.args.args: must not contain a NUL character",
            "upstreams.args.cwd: must not contain a NUL character",
            "upstreams.env.env.A=B: a variable's name must not be empty",
            "upstreams.env.env.: a variable's name must not be empty",
            "upstreams.env.env.C: a variable's name must not be empty",
        ];
        assert_issues(&issues, &expected);
    }

    #[test]
    fn worker_threads_is_a_count_from_one_and_absent_by_default() {
        for (threads, expected) in [("0", "0"), ("1025", "1025")] {
            let issues = issues_of(&format!("[daemon]\nworker_threads = {threads}\n"));
            let message = format!("daemon.worker_threads: {expected} is out of range (1 to 1024)");
            assert_issues(&issues, &[message.as_str()]);
        }
        let read = |text: &str| {
            parse(text, Path::new("/etc/plexus"), &no_environment)
                .map(|config| config.daemon.worker_threads)
                .map_err(|issues| issues.len())
        };
        assert_eq!(read("[daemon]\nworker_threads = 1\n"), Ok(Some(1)));
        assert_eq!(read("[daemon]\n"), Ok(None));
    }

    #[test]
    fn timeouts_that_cannot_be_zero_are_refused_and_never_takes_zero() {
        let issues = issues_of(
            r#"
            [daemon]
            header_read_timeout = "0s"
            body_read_timeout = "0ms"
            session_idle_timeout = "0s"
            drain_timeout = "0s"
            first_list_wait = "0s"
            [upstreams.zero]
            command = "x"
            init_timeout = "0s"
            call_timeout = "0s"
            max_call_timeout = "0s"
            health_timeout = "0s"
            tool_timeouts = { echo = "0s", add = "5s" }
            health_interval = "0s"
            schema_check_interval = "0s"
            idle_timeout = "0s"
            stop_grace = "0s"
            "#,
        );
        let expected = [
            "daemon.header_read_timeout: must be longer than 0s",
            "daemon.body_read_timeout: must be longer than 0s",
            "daemon.session_idle_timeout: must be longer than 0s",
            "upstreams.zero.init_timeout: must be longer than 0s",
            "upstreams.zero.call_timeout: must be longer than 0s",
            "upstreams.zero.max_call_timeout: must be longer than 0s",
            "upstreams.zero.health_timeout: must be longer than 0s",
            "upstreams.zero.tool_timeouts.echo: must be longer than 0s",
        ];
        assert_issues(&issues, &expected);
    }

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("90").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn launch_forms_become_argv() {
        let config = parse(
            r#"
            [upstreams.time]
            uvx = "mcp-server-time"
            args = ["--local-timezone=UTC"]
            [upstreams.everything]
            npx = "@modelcontextprotocol/server-everything"
            [upstreams.script]
            python = "server.py"
            cwd = "servers"
            [upstreams.naked]
            uri = "mcp+uvx://biomcp-python/biomcp?command=run"
            prefix = ""
            "#,
            Path::new("/etc/plexus"),
            &no_environment,
        )
        .unwrap();
        let spec = |name: &str| match &config.upstreams[name].launch {
            Launch::Stdio(spec) => spec.clone(),
            Launch::Http(endpoint) => panic!("{name} is remote: {endpoint:?}"),
        };
        let argv = |name: &str| {
            let spec = spec(name);
            (spec.program, spec.args)
        };
        assert_eq!(
            argv("time"),
            (
                "uvx".into(),
                vec!["mcp-server-time".into(), "--local-timezone=UTC".into()]
            )
        );
        assert_eq!(
            argv("everything"),
            (
                "npx".into(),
                vec![
                    "-y".into(),
                    "@modelcontextprotocol/server-everything".into()
                ]
            )
        );
        assert_eq!(argv("script"), ("python3".into(), vec!["server.py".into()]));
        assert_eq!(
            spec("script").cwd,
            Some(PathBuf::from("/etc/plexus/servers"))
        );
        assert_eq!(
            argv("naked"),
            (
                "uvx".into(),
                vec![
                    "--from".into(),
                    "biomcp-python".into(),
                    "biomcp".into(),
                    "run".into()
                ]
            )
        );
        assert_eq!(config.upstreams["naked"].prefix, "");
        assert_eq!(config.upstreams["time"].prefix, "time");
        assert_eq!(config.daemon.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(config.daemon.name_budget, 64);
    }

    #[test]
    fn every_error_is_reported_with_its_key() {
        let issues = issues_of(
            r#"
            [daemon]
            listen = "nowhere"
            [upstreams.Bad_Name]
            command = "x"
            [upstreams.two]
            uvx = "a"
            npx = "b"
            [upstreams.unknown-key]
            command = "x"
            colour = "blue"
            [upstreams.none]
            args = ["x"]
            [upstreams.remote]
            url = "ftp://example.invalid/mcp"
            [upstreams.slow]
            command = "x"
            init_timeout = "90"
            "#,
        );
        let expected = [
            "daemon.listen: `nowhere` is not an address",
            "upstreams.Bad_Name: upstream names use only lowercase letters",
            "upstreams.two: give exactly one launch form, not uvx and npx",
            "upstreams.unknown-key: unknown field `colour`",
            "upstreams.none: give exactly one of command",
            "upstreams.remote.url: `ftp://example.invalid/mcp` is not a URL plexus can reach",
            "upstreams.slow.init_timeout: `90` needs a unit",
        ];
        assert_issues(&issues, &expected);
    }

    #[test]
    fn env_and_headers_take_secrets_from_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "fr0m-a-file\n").unwrap();
        let config = parse(
            r#"
            [upstreams.notes]
            url = "http://127.0.0.1:9000/mcp"
            headers = { Authorization = "${file:token}" }
            [upstreams.local]
            command = "server"
            env = { TOKEN = "${file:token}" }
            "#,
            dir.path(),
            &no_environment,
        )
        .unwrap();
        let Launch::Http(notes) = &config.upstreams["notes"].launch else {
            panic!("notes is not remote");
        };
        assert_eq!(
            notes.headers,
            vec![("Authorization".to_string(), "fr0m-a-file".to_string())]
        );
        let Launch::Stdio(local) = &config.upstreams["local"].launch else {
            panic!("local is not stdio");
        };
        assert_eq!(local.env["TOKEN"], "fr0m-a-file");
        let issues = issues_of(
            r#"
            [upstreams.local]
            command = "server"
            env = { TOKEN = "${file:/nonexistent/plexus-token}" }
            "#,
        );
        assert!(
            issues[0]
                .starts_with("upstreams.local.env.TOKEN: cannot read /nonexistent/plexus-token"),
            "{issues:#?}"
        );
    }

    #[test]
    fn remote_upstreams_take_headers_with_secrets_from_the_environment() {
        let environment = |name: &str| match name {
            "NOTES_TOKEN" => Some("s3cret".to_string()),
            "REGION" => Some("eu".to_string()),
            _ => None,
        };
        let config = parse(
            r#"
            [upstreams.notes]
            url = "http://127.0.0.1:9000/mcp"
            headers = { Authorization = "Bearer ${NOTES_TOKEN}", X-Region = "${REGION}-1", X-Literal = "$${NOT_EXPANDED}" }
            [upstreams.legacy]
            url = "http://127.0.0.1:9001/sse"
            transport = "sse"
            [upstreams.local]
            command = "server"
            env = { TOKEN = "${NOTES_TOKEN}" }
            "#,
            Path::new("/etc/plexus"),
            &environment,
        )
        .unwrap();
        let Launch::Http(notes) = &config.upstreams["notes"].launch else {
            panic!("notes is not remote");
        };
        assert_eq!(notes.url, "http://127.0.0.1:9000/mcp");
        assert_eq!(notes.transport, HttpTransportKind::Auto);
        assert_eq!(
            notes.headers,
            vec![
                ("Authorization".to_string(), "Bearer s3cret".to_string()),
                ("X-Literal".to_string(), "${NOT_EXPANDED}".to_string()),
                ("X-Region".to_string(), "eu-1".to_string()),
            ]
        );
        // Header values stay out of debug output (and so out of logs).
        assert!(!format!("{notes:?}").contains("s3cret"), "{notes:?}");
        let Launch::Stdio(local) = &config.upstreams["local"].launch else {
            panic!("local is not stdio");
        };
        assert_eq!(local.env["TOKEN"], "s3cret");
        let Launch::Http(legacy) = &config.upstreams["legacy"].launch else {
            panic!("legacy is not remote");
        };
        assert_eq!(legacy.transport, HttpTransportKind::Sse);

        let issues = parse(
            r#"
            [upstreams.unset]
            url = "http://127.0.0.1:9000/mcp"
            headers = { Authorization = "Bearer ${MISSING_TOKEN}" }
            [upstreams.mixed]
            url = "http://127.0.0.1:9000/mcp"
            args = ["--x"]
            cwd = "somewhere"
            [upstreams.stdio]
            command = "server"
            transport = "sse"
            headers = { X-A = "b" }
            env = { TOKEN = "${ALSO_MISSING}" }
            [upstreams.managed]
            url = "http://127.0.0.1:9000/mcp"
            headers = { Mcp-Session-Id = "fixed" }
            [upstreams.badtransport]
            url = "http://127.0.0.1:9000/mcp"
            transport = "websocket"
            "#,
            Path::new("/etc/plexus"),
            &environment,
        )
        .unwrap_err();
        let issues: Vec<String> = issues.iter().map(ToString::to_string).collect();
        let expected = [
            "upstreams.unset.headers.Authorization: environment variable `MISSING_TOKEN` is not set",
            "upstreams.mixed.args: applies to stdio launch forms",
            "upstreams.mixed.cwd: applies to stdio launch forms",
            "upstreams.stdio.transport: applies to `url` upstreams only",
            "upstreams.stdio.headers: applies to `url` upstreams only",
            "upstreams.stdio.env.TOKEN: environment variable `ALSO_MISSING` is not set",
            "upstreams.managed.headers.Mcp-Session-Id: header `Mcp-Session-Id`: plexus sets this header itself",
            "upstreams.badtransport: unknown variant `websocket`",
        ];
        assert_issues(&issues, &expected);
    }

    #[test]
    fn variables_expand_only_when_well_formed() {
        let environment = |name: &str| (name == "A").then(|| "x".to_string());
        assert_eq!(
            expand_variables("${A}${A}-$A", &environment).unwrap(),
            "xx-$A"
        );
        assert_eq!(expand_variables("$${A}", &environment).unwrap(), "${A}");
        assert!(expand_variables("${A", &environment).is_err());
        assert!(expand_variables("${1A}", &environment).is_err());
        assert!(expand_variables("${B}", &environment)
            .unwrap_err()
            .contains("`B`"));
    }

    #[test]
    fn unknown_daemon_keys_and_sections_are_errors() {
        let issues = issues_of("[daemon]\nlisten_on = \"x\"\n[extra]\n");
        assert!(
            issues[0].starts_with("daemon: unknown field `listen_on`"),
            "{issues:?}"
        );
        assert!(
            issues[1].starts_with("extra: unknown section"),
            "{issues:?}"
        );
    }

    #[test]
    fn state_dir_follows_systemd_then_xdg_then_home() {
        let systemd =
            |key: &str| (key == "STATE_DIRECTORY").then(|| "/var/lib/plexus:/other".to_string());
        assert_eq!(
            default_state_dir(&systemd),
            PathBuf::from("/var/lib/plexus")
        );
        let xdg = |key: &str| (key == "XDG_STATE_HOME").then(|| "/home/u/.state".to_string());
        assert_eq!(
            default_state_dir(&xdg),
            PathBuf::from("/home/u/.state/plexus")
        );
        let home = |key: &str| (key == "HOME").then(|| "/home/u".to_string());
        assert_eq!(
            default_state_dir(&home),
            PathBuf::from("/home/u/.local/state/plexus")
        );
    }
}
