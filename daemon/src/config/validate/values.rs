//! Value checks shared by the sections: names, hosts and origins, durations, and
//! secrets (`${file:…}`, `${NAME}` expansion).

use std::path::Path;
use std::time::Duration;

/// An upstream's or a view's name: lowercase letters, digits and `-`.
pub(super) fn valid_upstream_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An `allowed_hosts` entry: a name (or address) with an optional port, as a
/// `Host` header carries it.
pub(super) fn is_host_entry(entry: &str) -> bool {
    let entry = entry.trim();
    !entry.is_empty() && !entry.contains(['/', '*', '@', ' ', '?', '#'])
}

/// An `allowed_origins` entry: `scheme://host[:port]`, as an `Origin` header carries it.
pub(super) fn is_origin_entry(entry: &str) -> bool {
    let entry = entry.trim().trim_end_matches('/');
    entry.split_once("://").is_some_and(|(scheme, host)| {
        !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            && is_host_entry(host)
    })
}

/// Whether a duration key takes `"0s"`. Timeouts do not: `"0s"` reads as "never" to
/// some, and here it would fail every call, start, health check, connection or
/// session at once. The interval keys take it for never; the waits, windows,
/// grace and back-off keys for none.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Zero {
    Allowed,
    Refused,
}

/// The duration `text` gives, unless it is zero where `zero` refuses that.
pub(super) fn duration_where(text: &str, zero: Zero) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if zero == Zero::Refused && duration.is_zero() {
        return Err("must be longer than 0s (only health_interval and schema_check_interval take \"0s\", for never)".into());
    }
    Ok(duration)
}

/// Parses durations written with a unit: `500ms`, `90s`, `10m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit (ms, s, m or h)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like `90s`"))?;
    let millis = match unit {
        "ms" => number,
        "s" => number.saturating_mul(1_000),
        "m" => number.saturating_mul(60_000),
        "h" => number.saturating_mul(3_600_000),
        _ => return Err(format!("`{text}` has an unknown unit (use ms, s, m or h)")),
    };
    Ok(Duration::from_millis(millis))
}

/// A secret: `${file:/path}` (the file's content, trimmed; relative to the config),
/// or text in which each `${NAME}` is expanded. Errors never contain the value.
pub(super) fn secret_value(
    text: &str,
    base: &Path,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    if let Some(path) = text
        .strip_prefix("${file:")
        .and_then(|rest| rest.strip_suffix('}'))
    {
        let path = base.join(path);
        return std::fs::read_to_string(&path)
            .map(|content| content.trim().to_string())
            .map_err(|error| format!("cannot read {}: {error}", path.display()));
    }
    expand_variables(text, environment)
}

/// Replaces each `${NAME}` with the variable's value (`$${` is a literal `${`).
/// The error names the variable, never a value.
pub(super) fn expand_variables(
    text: &str,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut expanded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            expanded.push_str(&rest[..start]);
            expanded.push('{');
            rest = &rest[start + 2..];
            continue;
        }
        expanded.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "`${` without a closing `}`".to_string())?;
        let variable = &after[..end];
        let valid = variable
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && variable
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("`${{{variable}}}` is not a variable name"));
        }
        let value = environment(variable)
            .ok_or_else(|| format!("environment variable `{variable}` is not set"))?;
        expanded.push_str(&value);
        rest = &after[end + 1..];
    }
    expanded.push_str(rest);
    Ok(expanded)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("90").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn variables_expand_only_when_well_formed() {
        let environment = |name: &str| (name == "A").then(|| "x".to_string());
        assert_eq!(
            expand_variables("${A}${A}-$A", &environment).unwrap(),
            "xx-$A"
        );
        assert_eq!(expand_variables("$${A}", &environment).unwrap(), "${A}");
        assert!(expand_variables("${A", &environment).is_err());
        assert!(expand_variables("${1A}", &environment).is_err());
        assert!(expand_variables("${B}", &environment)
            .unwrap_err()
            .contains("`B`"));
    }

    #[test]
    fn hostile_durations_and_variables_are_read_or_refused_and_never_panic() {
        let seeds: [&[u8]; 5] = [
            b"500ms",
            b" 90s ",
            b"10m",
            b"18446744073709551615h",
            b"${A}${A}-$A $${A}",
        ];
        let cases = mutations::cases(&seeds, 3_000, 0xD0A);
        mutations::check("parse_duration, expand_variables", &cases, 16, |bytes| {
            let text = String::from_utf8_lossy(bytes);
            if let Ok(duration) = parse_duration(&text) {
                let digits = text.trim().trim_end_matches(char::is_alphabetic);
                assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{text}");
                assert!(duration.as_millis() <= u128::from(u64::MAX));
            }
            let environment = |name: &str| (name == "A").then(|| "x".to_string());
            if let Ok(expanded) = expand_variables(&text, &environment) {
                assert!(expanded.len() <= text.len(), "{text}");
            }
        });
    }
}
