//! The sections checked together through [`parse`]: each error with its key,
//! every error at once, and what a valid file becomes.

use adapters::HttpTransportKind;

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
    let issues = issues_of("[daemon]\nlisten = \"0.0.0.0:7464\"\nadmin_listen = \"[::]:7465\"\n");
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
        include_str!("../../../../config.toml"),
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
        issues[0].starts_with("upstreams.local.env.TOKEN: cannot read /nonexistent/plexus-token"),
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
fn a_bad_daemon_oauth_is_explained_key_by_key() {
    let issues = issues_of(
        r#"
        [daemon.oauth]
        issuer = "idp.example"
        jwks_uri = "http://idp.example/keys"
        principal_claim = ""
        [views.ops]
        claims = { groups = "" }
        "#,
    );
    assert_issues(
        &issues,
        &[
            "daemon.oauth.issuer: `idp.example` is not an absolute URL",
            "daemon.oauth.audience: is required",
            "daemon.oauth.jwks_uri: `http://idp.example/keys` must be https (plain http only on loopback)",
            "daemon.oauth.principal_claim: must name a claim",
            "views.ops.claims: claim names and values must not be empty",
        ],
    );
    assert_issues(
        &issues_of("[daemon.oauth]\nissuer = \"https://idp.example\"\naudience = \"https://plexus.example/mcp\"\ncolour = 1\n"),
        &["daemon.oauth: unknown field `colour`"],
    );
    assert_issues(
        &issues_of("[views.ops]\nclaims = { groups = \"sre\" }\n"),
        &["views.ops.claims: claims come from access tokens: configure [daemon.oauth] first"],
    );
}

#[test]
fn daemon_oauth_guards_a_front_beyond_loopback_and_binds_views_to_claims() {
    let config = parse(
        r#"
        [daemon]
        listen = "0.0.0.0:7464"
        [daemon.oauth]
        issuer = "https://idp.example/realms/one"
        audience = "https://plexus.example/mcp"
        [views.ops]
        claims = { groups = "sre" }
        "#,
        Path::new("/etc/plexus"),
        &no_environment,
    )
    .unwrap();
    let oauth = config.daemon.oauth.unwrap();
    assert_eq!(oauth.principal_claim, "sub");
    assert_eq!(oauth.jwks_uri, None);
    assert_eq!(
        oauth.view_claims,
        [(
            "ops".to_string(),
            BTreeMap::from([("groups".to_string(), "sre".to_string())])
        )]
    );
}

#[test]
fn a_cluster_needs_a_node_a_long_secret_and_http_peers() {
    let environment = |name: &str| match name {
        "SECRET" => Some("0123456789abcdef0123456789abcdef".to_string()),
        "NODE" => Some("n1".to_string()),
        _ => None,
    };
    let config = parse(
        "[cluster]\nnode = \"${NODE}\"\nsecret = \"${SECRET}\"\npeers = { n1 = \"http://127.0.0.1:1\", n2 = \"http://127.0.0.1:2/\" }\ndns = \"plexus.svc:7464\"\n",
        Path::new("/"),
        &environment,
    )
    .unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.node, "n1");
    assert_eq!(cluster.peers["n2"], "http://127.0.0.1:2");
    assert_eq!(cluster.dns.as_deref(), Some("plexus.svc:7464"));
    assert!(!format!("{cluster:?}").contains("0123456789"));
    let issues = parse(
        "[cluster]\nsecret = \"short\"\npeers = { n2 = \"https://x/mcp\" }\ndns = \"nope\"\n",
        Path::new("/"),
        &environment,
    )
    .unwrap_err();
    let keys: Vec<&str> = issues.iter().map(|issue| issue.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "cluster.node",
            "cluster.peers.n2",
            "cluster.dns",
            "cluster.secret"
        ]
    );
    assert!(issues.iter().all(|issue| !issue.message.contains("short")));
}

#[test]
fn a_hostile_config_file_is_read_or_refused_and_never_panics() {
    let example = include_str!("../../../../config.toml");
    let seeds: [&[u8]; 3] = [
        example.as_bytes(),
        br#"
        [daemon]
        listen = "127.0.0.1:7464"
        auth_tokens = { ci = "a-token-long-enough-0000" }
        drain_timeout = "30s"
        [upstreams.alpha]
        command = "fixture"
        args = ["--x", "${HOME}"]
        env = { KEY = "${file:/dev/null}" }
        [upstreams.web]
        url = "https://mcp.example.com/mcp"
        headers = { "X-Key" = "v" }
        [views.one]
        upstreams = ["alpha"]
        "#,
        b"[cluster]\nnode = \"n1\"\nsecrets = [\"0123456789abcdef0123456789abcdef\"]\npeers = { n2 = \"127.0.0.1:9\" }\n",
    ];
    let cases = mutations::cases(&seeds, 2_500, 0xC0F1);
    mutations::check("config::parse", &cases, 512, |bytes| {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return;
        };
        match parse(text, Path::new("/etc/plexus"), &no_environment) {
            Ok(_) => {}
            // Every issue names its key or its line.
            Err(issues) => assert!(!issues.is_empty()),
        }
    });
}
