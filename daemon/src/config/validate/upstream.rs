//! `[upstreams.NAME]` checked into an [`UpstreamConfig`]: the one launch form
//! (stdio launchers, a naked URI, or a `url` with its transport and headers), env
//! and secrets, share and start, protocol, timeouts and limits, tool filters, pins.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use adapters::remote::{check_header, check_url, split_credentials, Credentials};
use adapters::{parse_naked_uri, HttpEndpoint, HttpTransportKind, Launcher};

use super::values::{duration_where, expand_variables, secret_value, Zero};
use crate::config::raw::{RawGrant, RawOAuth, RawTransport, RawUpstream};
use crate::config::*;

pub(super) fn validate_upstream(
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
    let is_url = matches!(launch, Launch::Http(_));
    let oauth = raw
        .oauth
        .and_then(|oauth| oauth_of(oauth, is_url, base, environment, &key, issues));
    Some(UpstreamConfig {
        oauth,
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

/// `[upstreams.<name>.oauth]`, checked: only for a `url` upstream; secrets may
/// be `${VAR}` or `${file:…}`; client credentials need a client.
fn oauth_of(
    raw: RawOAuth,
    is_url: bool,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
    key: &dyn Fn(&str) -> String,
    issues: &mut Vec<ConfigIssue>,
) -> Option<OAuthConfig> {
    let before = issues.len();
    if !is_url {
        issues.push(ConfigIssue {
            key: key("oauth"),
            message: "applies only to a `url` upstream".into(),
        });
    }
    let mut secret = |field: &str, value: Option<String>| {
        value.and_then(|value| match secret_value(&value, base, environment) {
            Ok(value) => Some(value),
            Err(message) => {
                issues.push(ConfigIssue {
                    key: key(&format!("oauth.{field}")),
                    message,
                });
                None
            }
        })
    };
    let client_id = secret("client_id", raw.client_id);
    let client_secret = secret("client_secret", raw.client_secret);
    let grant = match raw.grant.unwrap_or(RawGrant::AuthorizationCode) {
        RawGrant::AuthorizationCode => adapters::oauth::Grant::AuthorizationCode,
        RawGrant::DeviceCode => adapters::oauth::Grant::DeviceCode,
        RawGrant::ClientCredentials => adapters::oauth::Grant::ClientCredentials,
    };
    let needs_client = grant == adapters::oauth::Grant::ClientCredentials
        || client_secret.is_some()
        || raw.private_key_file.is_some();
    if needs_client && client_id.is_none() {
        issues.push(ConfigIssue {
            key: key("oauth.client_id"),
            message: "is needed with `client_secret`, `private_key_file` or `grant = \"client_credentials\"`".into(),
        });
    }
    if let Some(algorithm) = &raw.signing_algorithm {
        if !adapters::oauth::is_signing_algorithm(algorithm) {
            issues.push(ConfigIssue {
                key: key("oauth.signing_algorithm"),
                message: format!("`{algorithm}` is not a JWS algorithm (ES256, RS256, EdDSA, …)"),
            });
        }
    }
    (issues.len() == before).then(|| OAuthConfig {
        client_id,
        client_secret,
        scopes: raw.scopes,
        grant,
        private_key_file: raw.private_key_file.map(|path| base.join(path)),
        signing_algorithm: raw.signing_algorithm,
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
    let mut issue = |message: String| {
        issues.push(ConfigIssue {
            key: key("url"),
            message,
        })
    };
    let (url, credentials) = match split_credentials(value.trim()) {
        Ok(split) => split,
        Err(error) => {
            issue(error.to_string());
            return None;
        }
    };
    let basic = match credentials {
        None => None,
        // `${VAR}` in the user or password (only there) comes from the environment,
        // its value taken as it is (a secret is not written percent-encoded).
        Some(Credentials { user, password }) => {
            let expanded = expand_variables(&user, environment).and_then(|user| {
                let password = expand_variables(&password, environment)?;
                Ok(Credentials { user, password })
            });
            match expanded {
                Ok(credentials) => Some(credentials.basic_authorization()),
                Err(message) => {
                    issue(message);
                    return None;
                }
            }
        }
    };
    match check_url(&url) {
        Ok(_) => Some((url, basic)),
        Err(error) => {
            issue(error.to_string());
            None
        }
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod userinfo_tests {
    #[test]
    fn a_password_from_the_environment_becomes_basic_auth() {
        let config = crate::config::parse(
            "[upstreams.notes]\nurl = \"https://ops:${NOTES_PASSWORD}@notes.example/mcp\"\n",
            std::path::Path::new("/srv"),
            &|name| (name == "NOTES_PASSWORD").then(|| "p@ss".to_string()),
        )
        .unwrap();
        let crate::config::Launch::Http(endpoint) = &config.upstreams["notes"].launch else {
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

    /// A variable's value is taken as it is: a `%` in it is no escape.
    #[test]
    fn a_password_from_the_environment_is_not_percent_decoded() {
        let config = crate::config::parse(
            "[upstreams.notes]\nurl = \"https://ops%40corp:${NOTES_PASSWORD}@notes.example/mcp\"\n",
            std::path::Path::new("/srv"),
            &|name| (name == "NOTES_PASSWORD").then(|| "50%off%40".to_string()),
        )
        .unwrap();
        let crate::config::Launch::Http(endpoint) = &config.upstreams["notes"].launch else {
            panic!("not a url upstream")
        };
        // ops@corp:50%off%40
        assert_eq!(
            endpoint.headers,
            [(
                "Authorization".to_string(),
                "Basic b3BzQGNvcnA6NTAlb2ZmJTQw".to_string()
            )]
        );
    }
}
