//! Exposed names for tools and prompts: `{prefix}__{name}`, sanitised and kept within a length budget.
//!
//! Clients accept only names matching `^[A-Za-z0-9_-]{1,64}$`, so every other character
//! becomes `_`, and a name over the budget keeps its head and gains a short hash of the
//! original so that two long names differing only at the end stay distinct. Routing never
//! parses these names back: the catalog keeps a table from exposed name to original.

use sha2::{Digest, Sha256};

/// The separator between an upstream's prefix and the upstream's own name.
pub const PREFIX_SEPARATOR: &str = "__";

/// The smallest budget honoured: below it the hash suffix would crowd out the name itself.
pub const MINIMUM_NAME_BUDGET: usize = 16;

/// How many hex characters of the hash an over-budget name ends with.
const HASH_SUFFIX_HEX_CHARS: usize = 8;

/// Replaces every character outside `[A-Za-z0-9_-]` with `_`, one `_` per character.
pub fn sanitize_name(name: &str) -> String {
    name.chars()
        .map(|character| {
            if character.is_ascii_alphanumeric() || character == '_' || character == '-' {
                character
            } else {
                '_'
            }
        })
        .collect()
}

/// The unsanitised `{prefix}__{name}` (or `{name}` for an empty prefix).
pub fn joined_name(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}{PREFIX_SEPARATOR}{name}")
    }
}

/// Whether `exposed` has the form of a name exposed under `prefix` (`{prefix}__…`,
/// sanitised as exposed names are); never for an empty prefix. For saying which
/// upstream an unknown name points at: routing goes by the catalog's table.
pub fn is_under_prefix(exposed: &str, prefix: &str) -> bool {
    if prefix.is_empty() {
        return false;
    }
    let head = sanitize_name(prefix);
    exposed
        .strip_prefix(head.as_str())
        .and_then(|rest| rest.strip_prefix(PREFIX_SEPARATOR))
        .is_some_and(|rest| !rest.is_empty())
}

/// The name a client sees for `name` of an upstream exposed under `prefix`.
///
/// Budgets below [`MINIMUM_NAME_BUDGET`] are raised to it. An over-budget name keeps its
/// first `budget - 9` characters, then `_`, then the first 8 lowercase hex characters of
/// SHA-256 of the unsanitised joined name, so its length is exactly the budget.
pub fn exposed_name(prefix: &str, name: &str, budget: usize) -> String {
    let budget = budget.max(MINIMUM_NAME_BUDGET);
    let joined = joined_name(prefix, name);
    let sanitized = sanitize_name(&joined);
    if sanitized.chars().count() <= budget {
        return sanitized;
    }
    let kept_head: String = sanitized
        .chars()
        .take(budget - HASH_SUFFIX_HEX_CHARS - 1)
        .collect();
    format!("{kept_head}_{}", short_hash_hex(&joined))
}

/// The first [`HASH_SUFFIX_HEX_CHARS`] lowercase hex characters of SHA-256 of `text`.
fn short_hash_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex.truncate(HASH_SUFFIX_HEX_CHARS);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_under_the_prefix_it_was_exposed_with() {
        assert!(is_under_prefix(&exposed_name("fx", "echo", 64), "fx"));
        assert!(is_under_prefix(
            &exposed_name("my.tools", "echo", 64),
            "my.tools"
        ));
        let long = exposed_name("fx", &"x".repeat(100), 64);
        assert!(is_under_prefix(&long, "fx"));
        assert!(!is_under_prefix("fx__", "fx"));
        assert!(!is_under_prefix("fxy__echo", "fx"));
        assert!(!is_under_prefix("echo", ""));
    }

    #[test]
    fn sanitize_replaces_each_disallowed_character() {
        let cases = [
            ("a.b c", "a_b_c"),
            ("plain_name-1", "plain_name-1"),
            ("über/tool", "_ber_tool"),
            ("a:b::c", "a_b__c"),
            ("", ""),
        ];
        for (input, expected) in cases {
            assert_eq!(sanitize_name(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn exposed_name_joins_prefix_and_sanitises_the_whole_name() {
        let cases = [
            ("time", "get_current_time", "time__get_current_time"),
            ("time", "a.b c", "time__a_b_c"),
            ("my.server", "run", "my_server__run"),
            ("", "a.b c", "a_b_c"),
            ("", "echo", "echo"),
        ];
        for (prefix, name, expected) in cases {
            assert_eq!(
                exposed_name(prefix, name, 64),
                expected,
                "{prefix:?} {name:?}"
            );
        }
    }

    #[test]
    fn over_budget_name_is_exactly_budget_long_and_ends_with_a_stable_hash() {
        let name = "x".repeat(100);
        let exposed = exposed_name("srv", &name, 64);
        assert_eq!(exposed.chars().count(), 64);
        let expected_hash = short_hash_hex(&format!("srv__{name}"));
        assert_eq!(expected_hash.len(), 8);
        assert!(expected_hash
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_eq!(exposed, format!("srv__{}_{expected_hash}", "x".repeat(50)));
        assert_eq!(
            exposed,
            exposed_name("srv", &name, 64),
            "stable across calls"
        );
    }

    #[test]
    fn long_names_differing_only_at_the_end_do_not_collide() {
        let first = format!("{}_alpha", "shared_head_".repeat(8));
        let second = format!("{}_omega", "shared_head_".repeat(8));
        let first_exposed = exposed_name("srv", &first, 40);
        let second_exposed = exposed_name("srv", &second, 40);
        assert_eq!(first_exposed.len(), 40);
        assert_eq!(second_exposed.len(), 40);
        assert_eq!(first_exposed[..31], second_exposed[..31]);
        assert_ne!(first_exposed, second_exposed);
    }

    #[test]
    fn hash_is_taken_over_the_unsanitised_name() {
        // These sanitise identically, so only the hash of the original tells them apart.
        let first = exposed_name("srv", &format!("{}.end", "n".repeat(80)), 32);
        let second = exposed_name("srv", &format!("{}:end", "n".repeat(80)), 32);
        assert_ne!(first, second);
    }

    #[test]
    fn tiny_budgets_are_raised_to_the_minimum() {
        let exposed = exposed_name("prefix", "some_long_tool_name", 4);
        assert_eq!(exposed.len(), MINIMUM_NAME_BUDGET);
        assert!(exposed.starts_with("prefix_"));
    }

    #[test]
    fn name_exactly_at_budget_is_unchanged() {
        let name = "y".repeat(59);
        assert_eq!(exposed_name("srv", &name, 64), format!("srv__{name}"));
    }

    #[test]
    fn hostile_names_are_exposed_within_the_budget_in_the_name_alphabet() {
        let seeds: [&[u8]; 3] = [
            b"get_current_time",
            "a.b c/\u{e9}\u{1f600}".as_bytes(),
            b"x__y",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0x4A3E);
        mutations::check("exposed_name", &cases, 64, |bytes| {
            let name = String::from_utf8_lossy(bytes);
            for budget in [0, 20, 64] {
                let exposed = exposed_name("time", &name, budget);
                assert!(exposed.chars().count() <= budget.max(MINIMUM_NAME_BUDGET));
                assert!(exposed
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
                assert!(is_under_prefix(&exposed, "time") || exposed.len() < "time__".len() + 1);
            }
        });
    }
}
