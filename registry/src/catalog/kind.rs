//! The four kinds of catalog entries and the MCP method and key names that go with each.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Tools,
    Prompts,
    Resources,
    ResourceTemplates,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Tools,
        Kind::Prompts,
        Kind::Resources,
        Kind::ResourceTemplates,
    ];

    /// The request that lists entries of this kind.
    pub fn list_method(self) -> &'static str {
        match self {
            Kind::Tools => "tools/list",
            Kind::Prompts => "prompts/list",
            Kind::Resources => "resources/list",
            Kind::ResourceTemplates => "resources/templates/list",
        }
    }

    /// The key of the entry array in a list result.
    pub fn result_key(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Prompts => "prompts",
            Kind::Resources => "resources",
            Kind::ResourceTemplates => "resourceTemplates",
        }
    }

    /// The notification announcing a change; MCP has one for resources and templates alike.
    pub fn list_changed_method(self) -> &'static str {
        match self {
            Kind::Tools => "notifications/tools/list_changed",
            Kind::Prompts => "notifications/prompts/list_changed",
            Kind::Resources | Kind::ResourceTemplates => "notifications/resources/list_changed",
        }
    }

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Tools => "tools",
            Kind::Prompts => "prompts",
            Kind::Resources => "resources",
            Kind::ResourceTemplates => "resource_templates",
        }
    }

    /// The kind whose [`Kind::label`] (or [`Kind::result_key`]) is `text`.
    pub fn from_label(text: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.label() == text || kind.result_key() == text)
    }

    /// What one entry is called in a sentence.
    pub fn entry_noun(self) -> &'static str {
        match self {
            Kind::Tools => "tool",
            Kind::Prompts => "prompt",
            Kind::Resources => "resource",
            Kind::ResourceTemplates => "resource template",
        }
    }

    /// Position in per-kind arrays; follows the order of [`Kind::ALL`].
    pub fn index(self) -> usize {
        match self {
            Kind::Tools => 0,
            Kind::Prompts => 1,
            Kind::Resources => 2,
            Kind::ResourceTemplates => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_per_kind() {
        let expected = [
            (
                Kind::Tools,
                "tools/list",
                "tools",
                "notifications/tools/list_changed",
                "tools",
            ),
            (
                Kind::Prompts,
                "prompts/list",
                "prompts",
                "notifications/prompts/list_changed",
                "prompts",
            ),
            (
                Kind::Resources,
                "resources/list",
                "resources",
                "notifications/resources/list_changed",
                "resources",
            ),
            (
                Kind::ResourceTemplates,
                "resources/templates/list",
                "resourceTemplates",
                "notifications/resources/list_changed",
                "resource_templates",
            ),
        ];
        for (kind, list, key, changed, label) in expected {
            assert_eq!(kind.list_method(), list);
            assert_eq!(kind.result_key(), key);
            assert_eq!(kind.list_changed_method(), changed);
            assert_eq!(kind.label(), label);
        }
    }

    #[test]
    fn index_follows_all() {
        for (position, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), position);
        }
    }
}
