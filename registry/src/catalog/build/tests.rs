//! Unit tests of catalog building: names, collisions, schema fix-up, filters, faithfulness.

use super::*;
use crate::catalog::test_support::{build_default, listing, tool};
use crate::catalog::Route;
use crate::filter::ToolFilter;
use serde_json::json;
use serde_json::Value;

fn route(upstream: &str, original: &str) -> Route {
    Route {
        upstream: Arc::from(upstream),
        original: original.to_string(),
    }
}

fn exposed_names(catalog: &Catalog, kind: Kind) -> Vec<String> {
    catalog
        .entries(kind)
        .iter()
        .filter_map(|entry| entry["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn tools_and_prompts_are_prefixed_sanitised_and_routed() {
    let mut time = listing("time", "time");
    time.tools = vec![tool("get_current_time"), tool("a.b c")];
    time.prompts = vec![json!({"name": "greet me"})];
    let mut bare = listing("bare", "");
    bare.tools = vec![tool("echo")];
    let (catalog, warnings) = build_default(&[time, bare]);
    assert_eq!(warnings, Vec::new());
    assert_eq!(
        exposed_names(&catalog, Kind::Tools),
        ["time__get_current_time", "time__a_b_c", "echo"]
    );
    assert_eq!(exposed_names(&catalog, Kind::Prompts), ["time__greet_me"]);
    assert_eq!(
        catalog.route_tool("time__a_b_c"),
        Some(route("time", "a.b c"))
    );
    assert_eq!(catalog.route_tool("echo"), Some(route("bare", "echo")));
    assert_eq!(
        catalog.route_prompt("time__greet_me"),
        Some(route("time", "greet me"))
    );
    assert_eq!(catalog.route_tool("a.b c"), None);
    assert_eq!(catalog.len(Kind::Tools), 3);
}

#[test]
fn name_budget_applies_to_the_whole_exposed_name() {
    let mut long = listing("long", "long");
    long.tools = vec![tool(&"n".repeat(40))];
    let options = CatalogOptions {
        name_budget: 20,
        page_size: 100,
        ..CatalogOptions::default()
    };
    let (catalog, _) = Catalog::build(&[long], &options);
    let name = &exposed_names(&catalog, Kind::Tools)[0];
    assert_eq!(name.len(), 20);
    assert_eq!(
        catalog.route_tool(name),
        Some(route("long", &"n".repeat(40)))
    );
}

#[test]
fn collision_across_upstreams_keeps_the_first() {
    let mut alpha = listing("alpha", "");
    alpha.tools =
        vec![json!({"name": "search", "inputSchema": {"type": "object"}, "description": "alpha"})];
    let mut beta = listing("beta", "");
    beta.tools =
        vec![json!({"name": "search", "inputSchema": {"type": "object"}, "description": "beta"})];
    let (catalog, warnings) = build_default(&[alpha, beta]);
    assert_eq!(
        warnings,
        [CatalogWarning::Collision {
            kind: Kind::Tools,
            exposed: "search".to_string(),
            kept: route("alpha", "search"),
            rejected: route("beta", "search"),
        }]
    );
    assert_eq!(catalog.len(Kind::Tools), 1);
    assert_eq!(
        catalog.entries(Kind::Tools).to_vec()[0]["description"],
        "alpha"
    );
    assert_eq!(catalog.route_tool("search"), Some(route("alpha", "search")));
}

#[test]
fn sanitisation_collision_within_one_upstream() {
    let mut server = listing("srv", "srv");
    server.prompts = vec![json!({"name": "a.b"}), json!({"name": "a b"})];
    let (catalog, warnings) = build_default(&[server]);
    assert_eq!(
        warnings,
        [CatalogWarning::Collision {
            kind: Kind::Prompts,
            exposed: "srv__a_b".to_string(),
            kept: route("srv", "a.b"),
            rejected: route("srv", "a b"),
        }]
    );
    assert_eq!(catalog.route_prompt("srv__a_b"), Some(route("srv", "a.b")));
}

#[test]
fn schema_patch_adds_only_the_object_type() {
    let upstream_text = r#"{"name":"ask","inputSchema":{"properties":{"count":{"type":"integer","default":5}},"required":["count"]},"annotations":{"readOnlyHint":true}}"#;
    let mut server = listing("neuro-san", "ns");
    server.tools = vec![
        serde_json::from_str(upstream_text).unwrap(),
        json!({"name": "bare"}),
    ];
    let (catalog, warnings) = build_default(&[server]);
    assert_eq!(
        warnings,
        [
            CatalogWarning::SchemaPatched {
                upstream: Arc::from("neuro-san"),
                tool: "ask".to_string()
            },
            CatalogWarning::SchemaPatched {
                upstream: Arc::from("neuro-san"),
                tool: "bare".to_string()
            },
        ]
    );
    let exposed: Vec<String> = catalog
        .entries(Kind::Tools)
        .iter()
        .map(|entry| entry.to_string())
        .collect();
    assert_eq!(
        exposed,
        [
            r#"{"name":"ns__ask","inputSchema":{"properties":{"count":{"type":"integer","default":5}},"required":["count"],"type":"object"},"annotations":{"readOnlyHint":true}}"#,
            r#"{"name":"ns__bare","inputSchema":{"type":"object"}}"#,
        ]
    );
}

#[test]
fn invalid_entries_are_left_out_with_a_warning() {
    let mut server = listing("srv", "srv");
    server.tools = vec![
        json!({"name": "bad_schema", "inputSchema": "object"}),
        json!({"description": "no name"}),
        tool("good"),
    ];
    server.resources = vec![json!({"name": "uri-less"})];
    let (catalog, warnings) = build_default(&[server]);
    assert_eq!(exposed_names(&catalog, Kind::Tools), ["srv__good"]);
    assert_eq!(catalog.len(Kind::Resources), 0);
    let invalid = |kind, entry: &str, reason: &str| CatalogWarning::InvalidEntry {
        kind,
        upstream: Arc::from("srv"),
        entry: entry.to_string(),
        reason: reason.to_string(),
    };
    assert_eq!(
        warnings,
        [
            invalid(
                Kind::Tools,
                "bad_schema",
                "its inputSchema is a string, not a JSON object"
            ),
            invalid(Kind::Tools, "#1", "it has no `name`"),
            invalid(Kind::Resources, "uri-less", "it has no `uri`"),
        ]
    );
}

#[test]
fn unknown_keys_survive_byte_for_byte() {
    let upstream_texts = [
        r#"{"x-vendor":{"b":1,"a":[1.5,2]},"name":"run","title":"Run","inputSchema":{"type":"object","properties":{"n":{"type":"integer","default":5}},"additionalProperties":false},"outputSchema":{"type":"object"},"execution":{"taskSupport":"optional"},"_meta":{"io.example/x":{"z":null,"y":0}},"icons":[{"src":"data:,"}]}"#,
        r#"{"name":"plain","inputSchema":{"type":"object"},"annotations":{"destructiveHint":false,"idempotentHint":true}}"#,
    ];
    let mut server = listing("vendor", "v");
    server.tools = upstream_texts
        .iter()
        .map(|text| serde_json::from_str(text).unwrap())
        .collect();
    let (catalog, warnings) = build_default(&[server]);
    assert_eq!(warnings, Vec::new());
    for (text, exposed) in upstream_texts
        .iter()
        .zip(catalog.entries(Kind::Tools).iter())
    {
        let mut unrenamed = exposed.clone();
        let original_name = catalog
            .route_tool(exposed["name"].as_str().unwrap())
            .unwrap()
            .original
            .clone();
        unrenamed["name"] = Value::String(original_name);
        assert_eq!(serde_json::to_string(&unrenamed).unwrap(), *text);
    }
}

#[test]
fn tool_filter_hides_tools_without_warnings() {
    let mut server = listing("gh", "gh");
    server.tool_filter = ToolFilter::new(vec!["*_issue".to_string()], vec!["delete_*".to_string()]);
    server.tools = vec![
        tool("create_issue"),
        tool("delete_issue"),
        tool("merge_pr"),
        json!({"name": "close_issue", "inputSchema": 1}),
    ];
    let (catalog, warnings) = build_default(&[server]);
    assert_eq!(exposed_names(&catalog, Kind::Tools), ["gh__create_issue"]);
    assert_eq!(
        warnings.len(),
        1,
        "only the permitted tool with a bad schema warns: {warnings:?}"
    );
    assert!(catalog.route_tool("gh__delete_issue").is_none());
}

#[test]
fn clashing_uri_namespaces_leave_the_later_upstreams_uris_out() {
    let mut first = listing("first", "Docs");
    first.resources = vec![json!({"uri": "a://1"})];
    let mut second = listing("second", "docs");
    second.tools = vec![tool("t")];
    second.resources = vec![json!({"uri": "b://2"})];
    let (catalog, warnings) = build_default(&[first, second]);
    assert_eq!(
        warnings,
        [CatalogWarning::InvalidEntry {
            kind: Kind::Resources,
            upstream: Arc::from("second"),
            entry: "b://2".to_string(),
            reason: "its prefix `docs` gives the URI namespace `docs`, which upstream `first` already uses".to_string(),
        }]
    );
    assert_eq!(catalog.route_tool("docs__t"), Some(route("second", "t")));
    assert_eq!(
        catalog.route_resource("docs+b://2"),
        Some(route("first", "b://2"))
    );
    assert_eq!(catalog.expose_uri("second", "b://2"), "b://2");
}

#[test]
fn colliding_resource_uris_keep_the_first() {
    let mut first = listing("first", "");
    first.resources = vec![json!({"uri": "mem://x", "name": "first"})];
    let mut second = listing("second", "");
    second.resources = vec![json!({"uri": "mem://x", "name": "second"})];
    let (catalog, warnings) = build_default(&[first, second]);
    assert_eq!(
        catalog.route_resource("mem://x"),
        Some(route("first", "mem://x"))
    );
    assert!(matches!(
        &warnings[..],
        [CatalogWarning::Collision {
            kind: Kind::Resources,
            ..
        }]
    ));
}

/// One upstream's listing, as a `tools/list` and friends would bring it, read
/// from one JSON object (`tools`, `prompts`, `resources`, `resourceTemplates`,
/// `instructions`); None when it is no such object.
fn listing_from(bytes: &[u8]) -> Option<crate::catalog::UpstreamListing> {
    let Ok(Value::Object(mut read)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    let mut take = |key: &str| match read.remove(key) {
        Some(Value::Array(entries)) => entries,
        _ => Vec::new(),
    };
    let mut hostile = listing("hostile", "h");
    hostile.tools = take("tools");
    hostile.prompts = take("prompts");
    hostile.resources = take("resources");
    hostile.resource_templates = take("resourceTemplates");
    hostile.instructions = read
        .get("instructions")
        .and_then(Value::as_str)
        .map(str::to_string);
    Some(hostile)
}

#[test]
fn a_hostile_listing_builds_a_catalog_whose_every_entry_routes_back() {
    let seed = json!({
        "tools": [
            {"name": "get_current_time", "title": "Time", "description": "Now, in a zone.",
             "inputSchema": {"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
             "annotations": {"readOnlyHint": true}, "execution": {"taskSupport": "optional"}},
            {"name": "a.b c", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
        ],
        "prompts": [{"name": "greet me", "arguments": [{"name": "who", "required": true}]}],
        "resources": [{"uri": "file:///tmp/a%20b.txt", "name": "a", "mimeType": "text/plain"}],
        "resourceTemplates": [{"uriTemplate": "db://{table}/{id}", "name": "row"}],
        "instructions": "Use get_current_time for the time.",
    })
    .to_string();
    let mut plain = listing("plain", "p");
    plain.tools = vec![tool("echo")];
    let mut cases = mutations::cases(&[seed.as_bytes()], 1_000, 0xCA7A);
    cases.extend(mutations::value_mutants(
        &serde_json::from_str(&seed).unwrap(),
        1_200,
        0xCA7B,
    ));
    let mut built = 0;
    mutations::check("a hostile listing", &cases, 512, |bytes| {
        let Some(hostile) = listing_from(bytes) else {
            return;
        };
        built += 1;
        let _ = hostile.security_digests();
        let (catalog, _warnings) = build_default(&[plain.clone(), hostile]);
        // The well-behaved upstream keeps its tool whatever its neighbour lists.
        assert_eq!(catalog.route_tool("p__echo"), Some(route("plain", "echo")));
        for kind in Kind::ALL {
            let mut cursor = None;
            let mut seen = 0;
            loop {
                let page = catalog.page(kind, cursor.as_deref()).unwrap();
                for entry in page.items.iter() {
                    seen += 1;
                    serde_json::to_vec(&entry).unwrap();
                    let routed = match kind {
                        Kind::Tools => entry["name"].as_str().and_then(|n| catalog.route_tool(n)),
                        Kind::Prompts => {
                            entry["name"].as_str().and_then(|n| catalog.route_prompt(n))
                        }
                        Kind::Resources => entry["uri"]
                            .as_str()
                            .and_then(|u| catalog.route_resource(u)),
                        Kind::ResourceTemplates => entry["uriTemplate"]
                            .as_str()
                            .and_then(|u| catalog.route_template(u)),
                    };
                    assert!(routed.is_some(), "{kind:?} {entry} routes nowhere");
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(seen, catalog.len(kind));
        }
        let _ = catalog.search_tools("time zone now", 5, None);
    });
    // Enough of them were listings, not refused as JSON.
    println!("{built} catalogs built");
    assert!(built > 1_000, "{built}");
}

#[test]
fn hostile_search_queries_find_tools_or_nothing_and_never_panic() {
    let mut time = listing("time", "time");
    time.tools = vec![
        tool("get_current_time"),
        tool("convertTimeZone"),
        tool("listHTTPStatus2"),
    ];
    time.instructions = Some("Time and zones: İstanbul, ΣΊΣΥΦΟΣ, ﬁle".into());
    let (catalog, _) = build_default(&[time]);
    let seeds: [&[u8]; 3] = [
        b"current time in a zone",
        "İSTANBUL ΣΊΣΥΦΟΣ ﬁle straße".as_bytes(),
        b"getHTTPStatus2 list_files",
    ];
    let cases = mutations::cases(&seeds, 3_000, 0x5EA2);
    mutations::check("search_tools", &cases, 64, |bytes| {
        let query = String::from_utf8_lossy(bytes);
        // What a caller must check first: a longer query is refused before this.
        if crate::search::check(&query, Some(5)).is_err() {
            return;
        }
        for found in catalog.search_tools(&query, 5, None).unwrap() {
            assert!(catalog.route_tool(&found.name).is_some());
            assert!(found.score.is_finite());
        }
    });
}
