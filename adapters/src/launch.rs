//! How an upstream is started: launchers (`uvx`, `npx`, `python`, `node`, any
//! command), the `mcp+<launcher>://` naked-URI shorthand, and the clean child
//! environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The ways a configuration can say how to start a stdio upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `uvx [--from package] command args...`
    Uvx {
        package: String,
        command: Option<String>,
    },
    /// `npx -y package args...`
    Npx { package: String },
    /// `python3 script args...`
    Python { script: String },
    /// `node script args...`
    Node { script: String },
    /// Any program, run without a shell.
    Command { program: String },
}

impl Launcher {
    /// The package spec of a `uvx` or `npx` upstream that names no exact version
    /// (none, or `@latest`): whatever the registry serves next is what runs.
    pub fn unversioned_package(&self) -> Option<&str> {
        let (package, versioned) = match self {
            Launcher::Uvx { package, .. } => {
                // `pkg==1.2`, `pkg@1.2`; ranges and bare names float.
                let version = package
                    .split_once("==")
                    .or_else(|| package.split_once('@'))
                    .map(|(_, version)| version.trim());
                (package, version)
            }
            Launcher::Npx { package } => {
                // `@scope/name@1.2` or `name@1.2`; a leading `@` is the scope's.
                let version = package
                    .get(1..)
                    .and_then(|rest| rest.rsplit_once('@'))
                    .map(|(_, version)| version.trim());
                (package, version)
            }
            _ => return None,
        };
        match versioned {
            Some(version) if !version.is_empty() && version != "latest" => None,
            _ => Some(package),
        }
    }
}

/// A fully resolved child process description: a program and its argv, never a shell line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    pub program: String,
    pub args: Vec<String>,
    /// Variables the upstream declares; added to the clean base environment.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error("`{uri}` is not a naked MCP URI: {reason}")]
    BadUri { uri: String, reason: String },
    #[error("launcher `{launcher}` in `{uri}` is not one of uvx, npx, python, node")]
    UnknownLauncher { uri: String, launcher: String },
    #[error("`{program}` was not found on PATH; {hint}")]
    NotInstalled { program: String, hint: String },
}

impl Launcher {
    /// Turns the launcher and the configured extra arguments into a program and argv.
    pub fn to_spec(
        &self,
        extra_args: &[String],
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    ) -> LaunchSpec {
        let (program, mut args): (&str, Vec<String>) = match self {
            Launcher::Uvx {
                package,
                command: Some(command),
            } => (
                "uvx",
                vec!["--from".into(), package.clone(), command.clone()],
            ),
            Launcher::Uvx {
                package,
                command: None,
            } => ("uvx", vec![package.clone()]),
            Launcher::Npx { package } => ("npx", vec!["-y".into(), package.clone()]),
            Launcher::Python { script } => ("python3", vec![script.clone()]),
            Launcher::Node { script } => ("node", vec![script.clone()]),
            Launcher::Command { program } => (program.as_str(), Vec::new()),
        };
        args.extend(extra_args.iter().cloned());
        LaunchSpec {
            program: program.to_string(),
            args,
            env,
            cwd,
        }
    }
}

/// Parses `mcp+<launcher>://<target>[?query]`.
///
/// - `mcp+uvx://package[/command]`: `uvx package` or `uvx --from package command`;
/// - `mcp+npx://@scope/package@version`: the whole target is the package;
/// - `mcp+python://./server.py`, `mcp+node://./server.js`: the target is the script path.
///
/// The query adds arguments, in order: `arg=value` (repeatable) and `command=value`
/// (the seed's form, `?command=run`) append `value` as a positional argument;
/// any other `key=value` appends `--key=value`, and a bare `key` appends `--key`.
/// Values are percent-decoded. Returns the launcher and the extra arguments.
pub fn parse_naked_uri(uri: &str) -> Result<(Launcher, Vec<String>), LaunchError> {
    let bad = |reason: &str| LaunchError::BadUri {
        uri: uri.to_string(),
        reason: reason.to_string(),
    };
    let rest = uri
        .strip_prefix("mcp+")
        .ok_or_else(|| bad("it must start with `mcp+<launcher>://`"))?;
    let (launcher, rest) = rest
        .split_once("://")
        .ok_or_else(|| bad("it must contain `://` after the launcher"))?;
    let (target, query) = match rest.split_once('?') {
        Some((target, query)) => (target, Some(query)),
        None => (rest, None),
    };
    let target = percent_decode(target).map_err(|reason| bad(&reason))?;
    if target.is_empty() {
        return Err(bad("it names no package or script"));
    }
    let parsed = match launcher {
        "uvx" => match target.split_once('/') {
            Some((package, command)) if !package.is_empty() && !command.is_empty() => {
                Launcher::Uvx {
                    package: package.to_string(),
                    command: Some(command.trim_end_matches('/').to_string()),
                }
            }
            Some(_) => return Err(bad("uvx takes `package` or `package/command`")),
            None => Launcher::Uvx {
                package: target,
                command: None,
            },
        },
        "npx" => Launcher::Npx { package: target },
        "python" => Launcher::Python { script: target },
        "node" => Launcher::Node { script: target },
        other => {
            return Err(LaunchError::UnknownLauncher {
                uri: uri.to_string(),
                launcher: other.to_string(),
            })
        }
    };
    let mut args = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = match pair.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (pair, None),
        };
        let key = percent_decode(key).map_err(|reason| bad(&reason))?;
        let value = value
            .map(percent_decode)
            .transpose()
            .map_err(|reason| bad(&reason))?;
        match (key.as_str(), value) {
            ("arg" | "command", Some(value)) => args.push(value),
            (_, Some(value)) => args.push(format!("--{key}={value}")),
            (_, None) => args.push(format!("--{key}")),
        }
    }
    Ok((parsed, args))
}

/// Decodes `%XX` escapes (and `+` as a space is not assumed: URIs, not forms;
/// package names like `a+b` keep it). A `%` without two hex digits is an error,
/// not text: it is a mistake in what was written.
pub fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let bad_escape = memchr::memchr_iter(b'%', bytes).find(|&index| {
        !bytes
            .get(index + 1..index + 3)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if let Some(index) = bad_escape {
        return Err(format!("bad percent escape at byte {index}"));
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| "percent escapes do not decode to UTF-8".to_string())
}

/// Variables every child inherits from the daemon; everything else must be declared.
/// Besides the basics, these are the ones launchers (`uvx`, `npx`) need to reach a
/// package registry through a proxy or a private certificate authority.
pub const INHERITED_VARIABLES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LANGUAGE",
    "TMPDIR",
    "TZ",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

/// Prefixes of inherited variables: locale, and package-manager settings (index
/// URLs, caches, certificates) that launchers read.
pub const INHERITED_PREFIXES: &[&str] =
    &["LC_", "UV_", "PIP_", "NPM_CONFIG_", "npm_config_", "XDG_"];

fn inherited(key: &str) -> bool {
    INHERITED_VARIABLES.contains(&key)
        || INHERITED_PREFIXES
            .iter()
            .any(|prefix| key.starts_with(prefix))
}

/// Builds a child's environment: the inherited variables from `parent`, then the
/// upstream's own declared variables, which win.
pub fn clean_environment(
    parent: impl IntoIterator<Item = (String, String)>,
    declared: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = parent
        .into_iter()
        .filter(|(key, _)| inherited(key))
        .collect();
    env.extend(declared.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Finds `program` the way the child's exec will, so a missing launcher gets a
/// clear error before anything is spawned.
pub fn resolve_program(program: &str, path_variable: Option<&str>) -> Result<PathBuf, LaunchError> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(not_installed(program))
        };
    }
    path_variable
        .unwrap_or("")
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| not_installed(program))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn not_installed(program: &str) -> LaunchError {
    let hint = match program {
        "uvx" | "uv" => "install uv (`pip install uv`, or see https://docs.astral.sh/uv/)",
        "npx" | "npm" | "node" => "install Node.js with npm (https://nodejs.org/)",
        "python3" | "python" => "install Python 3",
        _ => "check the upstream's `command` and the daemon's PATH",
    };
    LaunchError::NotInstalled {
        program: program.to_string(),
        hint: hint.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn packages_without_an_exact_version_are_named() {
        let uvx = |package: &str| Launcher::Uvx {
            package: package.into(),
            command: None,
        };
        let npx = |package: &str| Launcher::Npx {
            package: package.into(),
        };
        for floating in [
            uvx("mcp-server-time"),
            uvx("mcp-server-time@latest"),
            npx("@modelcontextprotocol/server-everything"),
            npx("server-everything@latest"),
        ] {
            assert!(floating.unversioned_package().is_some(), "{floating:?}");
        }
        for pinned in [
            uvx("mcp-server-time==2026.10.19"),
            uvx("mcp-server-time@2026.10.19"),
            npx("@modelcontextprotocol/server-everything@2026.8.31"),
            npx("left-pad@1.3.0"),
            Launcher::Python {
                script: "server.py".into(),
            },
        ] {
            assert!(pinned.unversioned_package().is_none(), "{pinned:?}");
        }
    }

    fn spec_of(uri: &str) -> (String, Vec<String>) {
        let (launcher, args) = parse_naked_uri(uri).unwrap();
        let spec = launcher.to_spec(&args, BTreeMap::new(), None);
        (spec.program, spec.args)
    }

    #[test]
    fn naked_uris_become_argv() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("mcp+uvx://mcp-server-time", "uvx", &["mcp-server-time"]),
            (
                "mcp+uvx://biomcp-python/biomcp?command=run",
                "uvx",
                &["--from", "biomcp-python", "biomcp", "run"],
            ),
            (
                "mcp+npx://@upstash/context7-mcp@latest",
                "npx",
                &["-y", "@upstash/context7-mcp@latest"],
            ),
            (
                "mcp+uvx://mcp-server-time?local-timezone=UTC",
                "uvx",
                &["mcp-server-time", "--local-timezone=UTC"],
            ),
            (
                "mcp+python://./my_server.py?verbose",
                "python3",
                &["./my_server.py", "--verbose"],
            ),
            (
                "mcp+node://./server.js?arg=a%20b&arg=c",
                "node",
                &["./server.js", "a b", "c"],
            ),
        ];
        for (uri, program, args) in cases {
            let (got_program, got_args) = spec_of(uri);
            assert_eq!(&got_program, program, "{uri}");
            assert_eq!(
                got_args,
                args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "{uri}"
            );
        }
    }

    #[test]
    fn bad_naked_uris_are_rejected_with_reasons() {
        assert!(matches!(
            parse_naked_uri("uvx://x"),
            Err(LaunchError::BadUri { .. })
        ));
        assert!(matches!(
            parse_naked_uri("mcp+uvx:x"),
            Err(LaunchError::BadUri { .. })
        ));
        assert!(matches!(
            parse_naked_uri("mcp+uvx://"),
            Err(LaunchError::BadUri { .. })
        ));
        assert!(matches!(
            parse_naked_uri("mcp+uvx://a/"),
            Err(LaunchError::BadUri { .. })
        ));
        assert!(matches!(
            parse_naked_uri("mcp+npx://a%zz"),
            Err(LaunchError::BadUri { .. })
        ));
        assert_eq!(
            parse_naked_uri("mcp+ruby://x"),
            Err(LaunchError::UnknownLauncher {
                uri: "mcp+ruby://x".into(),
                launcher: "ruby".into()
            })
        );
    }

    #[test]
    fn clean_environment_keeps_basics_and_declared_only() {
        let parent = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("LC_ALL".to_string(), "C".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "hunter2".to_string()),
            ("HOME".to_string(), "/root".to_string()),
            ("HTTPS_PROXY".to_string(), "http://proxy:3128".to_string()),
            (
                "UV_INDEX_URL".to_string(),
                "https://mirror/simple".to_string(),
            ),
        ];
        let declared = BTreeMap::from([("HOME".to_string(), "/srv".to_string())]);
        let env = clean_environment(parent, &declared);
        assert_eq!(
            env.into_iter().collect::<Vec<_>>(),
            vec![
                ("HOME".to_string(), "/srv".to_string()),
                ("HTTPS_PROXY".to_string(), "http://proxy:3128".to_string()),
                ("LC_ALL".to_string(), "C".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
                (
                    "UV_INDEX_URL".to_string(),
                    "https://mirror/simple".to_string()
                ),
            ]
        );
    }

    #[test]
    fn missing_programs_name_how_to_get_them() {
        let error = resolve_program("uvx", Some("/nonexistent")).unwrap_err();
        assert!(error.to_string().contains("pip install uv"), "{error}");
        assert!(resolve_program("sh", Some("/usr/bin:/bin")).is_ok());
    }

    #[test]
    fn hostile_naked_uris_are_parsed_or_refused_and_never_panic() {
        let seeds: [&[u8]; 4] = [
            b"mcp+uvx://mcp-server-fetch/mcp-server-fetch?arg=--x&ignore-robots-txt",
            b"mcp+npx://%40modelcontextprotocol%2Fserver-everything?command=stdio",
            b"mcp+python://./server.py?port=8080&verbose",
            b"mcp+node://./dist/index.js?arg=a%20b",
        ];
        let cases = mutations::cases(&seeds, 4_000, 0x1A5C);
        mutations::check("parse_naked_uri", &cases, 32, |input| {
            let uri = String::from_utf8_lossy(input);
            if let Ok(decoded) = percent_decode(&uri) {
                assert!(decoded.len() <= uri.len());
            }
            if let Ok((launcher, args)) = parse_naked_uri(&uri) {
                assert!(args.iter().map(String::len).sum::<usize>() <= 3 * uri.len());
                let _ = launcher.unversioned_package();
            }
        });
    }
}
