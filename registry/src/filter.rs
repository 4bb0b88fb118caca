//! Per-upstream allow/deny filtering of tools by their original names, with `*`/`?` globs.

/// Which of an upstream's tools are exposed: all when `allow` is empty, else those matching
/// an allow glob; a deny glob always wins. Globs match whole names: `*` any run of
/// characters (also none), `?` exactly one character, everything else itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolFilter {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl ToolFilter {
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> ToolFilter {
        ToolFilter { allow, deny }
    }

    /// Whether it lets every name through (no allow and no deny globs).
    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether the tool the upstream calls `original_tool_name` is exposed.
    pub fn permits(&self, original_tool_name: &str) -> bool {
        let allowed = self.allow.is_empty()
            || self
                .allow
                .iter()
                .any(|pattern| glob_matches(pattern, original_tool_name));
        allowed
            && !self
                .deny
                .iter()
                .any(|pattern| glob_matches(pattern, original_tool_name))
    }
}

/// Whole-string glob match with `*` and `?`, in linear space: on a mismatch after a `*`,
/// the star is retried one character further instead of recursing.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut pattern_index, mut text_index) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while text_index < text.len() {
        match pattern.get(pattern_index) {
            Some('*') => {
                last_star = Some((pattern_index, text_index));
                pattern_index += 1;
            }
            Some(&expected) if expected == '?' || expected == text[text_index] => {
                pattern_index += 1;
                text_index += 1;
            }
            _ => match last_star {
                Some((star_pattern_index, star_text_index)) => {
                    pattern_index = star_pattern_index + 1;
                    text_index = star_text_index + 1;
                    last_star = Some((star_pattern_index, star_text_index + 1));
                }
                None => return false,
            },
        }
    }
    pattern[pattern_index..].iter().all(|&rest| rest == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matching() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("read_*", "read_file", true),
            ("read_*", "write_file", false),
            ("*_file", "read_file", true),
            ("r?ad", "read", true),
            ("r?ad", "rad", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*a", "banana", true),
            ("ü?", "üx", true),
            ("", "", true),
            ("", "x", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                glob_matches(pattern, text),
                expected,
                "{pattern:?} ~ {text:?}"
            );
        }
    }

    #[test]
    fn empty_filter_permits_everything() {
        let filter = ToolFilter::default();
        assert!(filter.permits("anything"));
        assert!(filter.permits(""));
    }

    #[test]
    fn allow_and_deny_globs() {
        let filter = ToolFilter::new(
            vec!["read_*".to_string(), "list?".to_string()],
            vec!["read_secret*".to_string()],
        );
        let cases = [
            ("read_file", true),
            ("lists", true),
            ("list", false),
            ("write_file", false),
            ("read_secret_key", false),
        ];
        for (tool, expected) in cases {
            assert_eq!(filter.permits(tool), expected, "tool {tool:?}");
        }
    }

    #[test]
    fn deny_alone_removes_only_what_it_matches() {
        let filter = ToolFilter::new(Vec::new(), vec!["delete_*".to_string()]);
        assert!(filter.permits("create_issue"));
        assert!(!filter.permits("delete_repo"));
    }
}
