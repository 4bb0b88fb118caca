//! The names of calls' and prompts' spans (`tools/call echo`) and the tool's or
//! prompt's name in their attributes, kept for the process's life and shared by
//! every span that names them. A span's name is `'static` or a copy of its own:
//! copying it and the tool's name for each of a call's two spans, and freeing
//! them as they are exported, was a twentieth of what tracing adds to a call.
//!
//! At most [`MAX_NAMES`] names per method are kept, each of at most
//! [`MAX_NAME_BYTES`] (a client may call names that do not exist, as long as a
//! message may be, and a catalog may change): beyond, each span copies its own.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use foldhash::fast::RandomState;
use opentelemetry::StringValue;

const MAX_NAMES: usize = 4096;
pub(super) const MAX_NAME_BYTES: usize = 128;

/// Span names by the tool's or prompt's name: `&NAME[method.len() + 1..]` is the key.
type Names = RwLock<HashMap<&'static str, &'static str, RandomState>>;

static CALLS: std::sync::LazyLock<Names> = std::sync::LazyLock::new(Names::default);
static PROMPTS: std::sync::LazyLock<Names> = std::sync::LazyLock::new(Names::default);

/// `method name`, the span's name, and `name` as an attribute value, for a
/// `tools/call` or a `prompts/get` (any other method is named afresh each time).
pub(super) fn named(method: &'static str, name: &str) -> (Cow<'static, str>, StringValue) {
    let names: &Names = match method {
        "tools/call" => &CALLS,
        "prompts/get" => &PROMPTS,
        _ => return copied(method, name),
    };
    if name.len() > MAX_NAME_BYTES {
        return copied(method, name);
    }
    let known = names
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .copied();
    if let Some(spaced) = known {
        return shared(method, spaced);
    }
    let mut names = names.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(spaced) = names.get(name) {
        return shared(method, spaced);
    }
    if names.len() >= MAX_NAMES {
        return copied(method, name);
    }
    let spaced: &'static str = Box::leak(spaced_name(method, name).into_boxed_str());
    names.insert(&spaced[method.len() + 1..], spaced);
    shared(method, spaced)
}

fn shared(method: &str, spaced: &'static str) -> (Cow<'static, str>, StringValue) {
    (
        Cow::Borrowed(spaced),
        StringValue::from(&spaced[method.len() + 1..]),
    )
}

fn copied(method: &str, name: &str) -> (Cow<'static, str>, StringValue) {
    (
        Cow::Owned(spaced_name(method, name)),
        StringValue::from(name.to_string()),
    )
}

/// `method` and a name after a space.
fn spaced_name(method: &str, name: &str) -> String {
    let mut text = String::with_capacity(method.len() + 1 + name.len());
    text.push_str(method);
    text.push(' ');
    text.push_str(name);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_kept_once_and_shared_up_to_the_cap() {
        let (span, tool) = named("tools/call", "echo");
        assert_eq!((span.as_ref(), tool.as_str()), ("tools/call echo", "echo"));
        let (again, _) = named("tools/call", "echo");
        assert!(
            matches!((&span, &again), (Cow::Borrowed(a), Cow::Borrowed(b)) if std::ptr::eq(*a, *b))
        );
        // The same name under another method is another span name.
        let (prompt, name) = named("prompts/get", "echo");
        assert_eq!(
            (prompt.as_ref(), name.as_str()),
            ("prompts/get echo", "echo")
        );
        // A method with no table copies.
        assert!(matches!(named("resources/read", "x").0, Cow::Owned(_)));
        // A long name is never kept.
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let (span, tool) = named("tools/call", &long);
        assert!(matches!(span, Cow::Owned(_)));
        assert_eq!(tool.as_str(), long);
        for index in 0..MAX_NAMES {
            named("tools/call", &format!("t{index}"));
        }
        let (late, tool) = named("tools/call", "one too many");
        assert!(matches!(late, Cow::Owned(_)));
        assert_eq!(
            (late.as_ref(), tool.as_str()),
            ("tools/call one too many", "one too many")
        );
        assert!(matches!(named("tools/call", "echo").0, Cow::Borrowed(_)));
    }
}
