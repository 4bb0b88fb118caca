//! How an error is shown to clients and in logs: with every cause it keeps.

/// The whole cause of an error, outermost first: `outer: cause: its cause`.
/// Errors keep their sources rather than their text (hyper's own text is terse),
/// so whatever shows one to a person renders it through here.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_rendered_outermost_first() {
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");
    }
}
