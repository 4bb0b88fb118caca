//! The reversible URI namespace rule for resources and resource templates.
//!
//! # The rule
//!
//! An upstream exposed under a non-empty `prefix` gets a URI namespace `ns` derived from
//! that prefix: the prefix is lowercased, every character outside `[a-z0-9.-]` becomes
//! `-`, and if the result does not start with an ASCII letter it is preceded by `u`.
//! A resource URI or resource template `original` of that upstream is exposed as
//! `{ns}+{original}`. So prefix `fixture` exposes `fixture://text` as
//! `fixture+fixture://text`, the template `fixture://items/{id}` as
//! `fixture+fixture://items/{id}`, and prefix `2b` uses the namespace `u2b`.
//! An upstream with prefix `""` exposes its URIs unchanged.
//!
//! Why this shape: `ns` uses only characters allowed in a URI scheme and never `+`, so
//! `{ns}+scheme:` is again a valid URI scheme and the first `+` always ends the namespace;
//! and prepending literal text to an RFC 6570 template keeps it a valid template whose
//! expansions all carry the same namespace. The rule is therefore reversible without
//! knowing the upstream's URIs in advance.
//!
//! # Routing a read
//!
//! `Catalog::route_resource(uri)` resolves, in order, using only tables built with the
//! catalog snapshot (it never guesses from anything else):
//!
//! 1. **Listed.** `uri` is the exposed URI of a listed resource: that resource's upstream
//!    and original URI.
//! 2. **Namespace.** The text before the first `+` is the namespace of a prefixed upstream:
//!    that upstream, with the original URI being the rest after `{ns}+`. This is how URIs
//!    expanded from a namespaced template are routed.
//! 3. **Unprefixed template.** Among the templates of upstreams with prefix `""`, the one
//!    whose literal head (the text before its first `{`) is the longest non-empty prefix of
//!    `uri`: that template's upstream, with `uri` unchanged. If equally long heads from
//!    different upstreams match, the read is ambiguous and this step does not decide.
//! 4. **Echoed original.** `uri` is the original (un-namespaced) URI of a resource listed by
//!    exactly one upstream: that upstream. Clients sometimes echo back URIs they found in
//!    content, which upstreams write without plexus's namespace.
//!
//! Otherwise the URI is unknown. Two prefixes that derive the same namespace (say `A` and
//! `a`) cannot both be reversible: the first upstream keeps the namespace and the later
//! one's resources and templates are left out with a warning. A known limit: an unprefixed
//! upstream's own URI whose scheme happens to be `{ns}+…` of a prefixed upstream, and which
//! is not listed, is routed by step 2 to the prefixed upstream.

/// Separates the namespace from the original URI in an exposed URI.
pub const NAMESPACE_SEPARATOR: char = '+';

/// The URI namespace for `prefix`, or `None` for the empty prefix (URIs exposed unchanged).
pub fn uri_namespace(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return None;
    }
    let mut namespace: String = prefix
        .chars()
        .map(|character| {
            let lower = character.to_ascii_lowercase();
            if lower.is_ascii_lowercase() || lower.is_ascii_digit() || lower == '.' || lower == '-'
            {
                lower
            } else {
                '-'
            }
        })
        .collect();
    if !namespace.starts_with(|first: char| first.is_ascii_alphabetic()) {
        namespace.insert(0, 'u');
    }
    Some(namespace)
}

/// Exposes `original` (a URI or URI template) under the namespace `namespace`.
pub fn expose(namespace: Option<&str>, original: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}{NAMESPACE_SEPARATOR}{original}"),
        None => original.to_string(),
    }
}

/// Splits an exposed URI into its would-be namespace and the rest, at the first `+`.
pub fn split_namespace(exposed: &str) -> Option<(&str, &str)> {
    exposed.split_once(NAMESPACE_SEPARATOR)
}

/// The literal text of a URI template before its first expression (`{`).
pub fn template_literal_head(template: &str) -> &str {
    match template.find('{') {
        Some(position) => &template[..position],
        None => template,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_derivation() {
        let cases = [
            ("", None),
            ("fixture", Some("fixture")),
            ("Fixture", Some("fixture")),
            ("my_server", Some("my-server")),
            ("a.b-c", Some("a.b-c")),
            ("2b", Some("u2b")),
            ("-x", Some("u-x")),
            (".x", Some("u.x")),
            ("é", Some("u-")),
            ("a+b", Some("a-b")),
        ];
        for (prefix, expected) in cases {
            assert_eq!(
                uri_namespace(prefix).as_deref(),
                expected,
                "prefix {prefix:?}"
            );
        }
    }

    #[test]
    fn exposure_prepends_the_namespace_and_keeps_templates_intact() {
        let cases = [
            (Some("fixture"), "fixture://text", "fixture+fixture://text"),
            (
                Some("fixture"),
                "fixture://items/{id}",
                "fixture+fixture://items/{id}",
            ),
            (Some("u2b"), "file:///tmp/a.txt", "u2b+file:///tmp/a.txt"),
            (Some("x"), "{+path}", "x+{+path}"),
            (None, "fixture://text", "fixture://text"),
        ];
        for (namespace, original, expected) in cases {
            assert_eq!(expose(namespace, original), expected);
        }
    }

    #[test]
    fn exposed_uri_splits_back_into_namespace_and_original() {
        let namespace = uri_namespace("My_Prefix");
        let original = "git+ssh://host/repo{?ref}";
        let exposed = expose(namespace.as_deref(), original);
        assert_eq!(
            split_namespace(&exposed),
            Some(("my-prefix", original)),
            "the first + ends the namespace even when the original contains +"
        );
    }

    #[test]
    fn literal_head_stops_at_the_first_expression() {
        assert_eq!(
            template_literal_head("file:///logs/{day}/{n}"),
            "file:///logs/"
        );
        assert_eq!(template_literal_head("{+path}"), "");
        assert_eq!(template_literal_head("plain://x"), "plain://x");
    }
}
