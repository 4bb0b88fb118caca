//! `[daemon.tracing]` and the standard `OTEL_*` variables into [`TracingSettings`]:
//! a key in the file wins over its variable; nothing set anywhere: off.

use crate::config::raw::RawTracing;
use crate::config::{ConfigIssue, Sampler, TracingSettings};

const DEFAULT_SERVICE_NAME: &str = "plexus";

pub(super) fn validate_tracing(
    table: Option<toml::Table>,
    environment: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> TracingSettings {
    let raw = match table.map(toml::Table::try_into::<RawTracing>) {
        None => RawTracing::default(),
        Some(Ok(raw)) => raw,
        Some(Err(error)) => {
            issues.push(ConfigIssue {
                key: "daemon.tracing".into(),
                message: error.message().to_string(),
            });
            return TracingSettings::default();
        }
    };
    let variable = |name: &str| environment(name).filter(|value| !value.trim().is_empty());
    if variable("OTEL_SDK_DISABLED").is_some_and(|value| value.trim() == "true") {
        return TracingSettings::default();
    }
    let protocol = raw
        .protocol
        .clone()
        .map(|value| ("daemon.tracing.protocol", value))
        .or_else(|| {
            variable("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .map(|value| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", value))
        })
        .or_else(|| {
            variable("OTEL_EXPORTER_OTLP_PROTOCOL")
                .map(|value| ("OTEL_EXPORTER_OTLP_PROTOCOL", value))
        });
    if let Some((key, value)) = protocol.filter(|(_, value)| value.trim() != "http/protobuf") {
        issues.push(ConfigIssue {
            key: key.into(),
            message: format!("`{value}` is not supported: plexus exports `http/protobuf`"),
        });
    }
    // A signal's own endpoint is used as it is; the common one gets the signal's path.
    let base = raw
        .endpoint
        .clone()
        .or_else(|| variable("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let signal = |own: Option<String>, own_variable: &str, path: &str| {
        own.or_else(|| variable(own_variable)).or_else(|| {
            base.as_deref()
                .map(|base| format!("{}/{path}", base.trim_end_matches('/')))
        })
    };
    let exporter_off = |name: &str| variable(name).is_some_and(|value| value.trim() == "none");
    let traces_endpoint = signal(
        raw.traces_endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "v1/traces",
    )
    .filter(|_| !exporter_off("OTEL_TRACES_EXPORTER"));
    let metrics_endpoint = signal(
        raw.metrics_endpoint,
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "v1/metrics",
    )
    .filter(|_| {
        raw.metrics
            .unwrap_or(!exporter_off("OTEL_METRICS_EXPORTER"))
    });
    for (key, endpoint) in [
        ("daemon.tracing.traces_endpoint", &traces_endpoint),
        ("daemon.tracing.metrics_endpoint", &metrics_endpoint),
    ] {
        if let Some(url) = endpoint.as_deref().filter(|url| !is_http_url(url)) {
            issues.push(ConfigIssue {
                key: key.into(),
                message: format!("`{url}` is not an http:// or https:// URL"),
            });
        }
    }
    // Bodies go out uncompressed, which every collector takes; a compression asked
    // for is refused by name rather than left unapplied.
    for (endpoint, own) in [
        (&traces_endpoint, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"),
        (&metrics_endpoint, "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"),
    ] {
        let compression = variable(own)
            .map(|value| (own, value))
            .or_else(|| {
                variable("OTEL_EXPORTER_OTLP_COMPRESSION")
                    .map(|value| ("OTEL_EXPORTER_OTLP_COMPRESSION", value))
            })
            .filter(|(_, value)| value.trim() != "none");
        if let (Some(_), Some((key, value))) = (endpoint, compression) {
            if !issues.iter().any(|issue| issue.key == key) {
                issues.push(ConfigIssue {
                    key: key.into(),
                    message: format!(
                        "`{value}` is not supported: plexus exports uncompressed (unset it, or `none`)"
                    ),
                });
            }
        }
    }
    let service_name = raw
        .service_name
        .or_else(|| variable("OTEL_SERVICE_NAME"))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    let (sampler_key, sampler_name) = match raw.sampler {
        Some(name) => ("daemon.tracing.sampler", Some(name)),
        None => ("OTEL_TRACES_SAMPLER", variable("OTEL_TRACES_SAMPLER")),
    };
    let (arg_key, arg) = match raw.sampler_arg {
        Some(arg) => ("daemon.tracing.sampler_arg", Some(Ok(arg))),
        None => (
            "OTEL_TRACES_SAMPLER_ARG",
            variable("OTEL_TRACES_SAMPLER_ARG").map(|text| text.trim().parse::<f64>()),
        ),
    };
    let ratio = match arg {
        None => 1.0,
        Some(Ok(ratio)) if (0.0..=1.0).contains(&ratio) => ratio,
        Some(_) => {
            issues.push(ConfigIssue {
                key: arg_key.into(),
                message: "must be a number from 0 to 1".into(),
            });
            1.0
        }
    };
    let sampler = match sampler_name.as_deref().map(str::trim) {
        None | Some("parentbased_always_on") => Sampler::ParentBasedAlwaysOn,
        Some("always_on") => Sampler::AlwaysOn,
        Some("always_off") => Sampler::AlwaysOff,
        Some("traceidratio") => Sampler::TraceIdRatio(ratio),
        Some("parentbased_always_off") => Sampler::ParentBasedAlwaysOff,
        Some("parentbased_traceidratio") => Sampler::ParentBasedTraceIdRatio(ratio),
        Some(other) => {
            issues.push(ConfigIssue {
                key: sampler_key.into(),
                message: format!(
                    "`{other}` is not one of always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            });
            Sampler::default()
        }
    };
    TracingSettings {
        traces_endpoint,
        metrics_endpoint,
        service_name,
        sampler,
    }
}

fn is_http_url(url: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        url.strip_prefix(scheme)
            .is_some_and(|rest| !rest.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(table: &str, variables: &[(&str, &str)]) -> (TracingSettings, Vec<ConfigIssue>) {
        let table: Option<toml::Table> = (!table.is_empty())
            .then(|| toml::from_str(table).unwrap_or_else(|error| panic!("{error}")));
        let environment = |name: &str| {
            variables
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        let mut issues = Vec::new();
        let settings = validate_tracing(table, &environment, &mut issues);
        (settings, issues)
    }

    #[test]
    fn nothing_set_is_off() {
        let (settings, issues) = resolve("", &[("OTEL_SERVICE_NAME", "x")]);
        assert!(issues.is_empty());
        assert_eq!(settings.traces_endpoint, None);
        assert_eq!(settings.metrics_endpoint, None);
    }

    #[test]
    fn the_variables_configure_it_and_keys_win_over_them() {
        let variables = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "gateway"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ];
        let (settings, issues) = resolve("", &variables);
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            settings.traces_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(settings.metrics_endpoint, None);
        assert_eq!(settings.service_name, "gateway");
        assert_eq!(settings.sampler, Sampler::ParentBasedTraceIdRatio(0.25));

        let (keyed, issues) = resolve(
            "endpoint = \"http://collector:4318\"\nservice_name = \"edge\"\nsampler = \"always_on\"\nmetrics = true",
            &variables,
        );
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            keyed.traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            keyed.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(keyed.service_name, "edge");
        assert_eq!(keyed.sampler, Sampler::AlwaysOn);
    }

    #[test]
    fn a_compression_is_refused_by_name_while_its_signal_is_exported() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let (_, issues) = resolve("", &[endpoint, ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]);
        let keys: Vec<&str> = issues.iter().map(|issue| issue.key.as_str()).collect();
        assert_eq!(keys, ["OTEL_EXPORTER_OTLP_COMPRESSION"], "{issues:?}");
        let (_, issues) = resolve(
            "",
            &[
                endpoint,
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
                ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd"),
            ],
        );
        let keys: Vec<&str> = issues.iter().map(|issue| issue.key.as_str()).collect();
        assert_eq!(
            keys,
            ["OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"],
            "{issues:?}"
        );
        // Nothing exported: nothing to compress, and nothing refused.
        let (_, issues) = resolve("", &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]);
        assert!(issues.is_empty(), "{issues:?}");
    }

    #[test]
    fn grpc_an_unknown_sampler_and_a_bad_ratio_are_refused_by_name() {
        let (_, issues) = resolve(
            "endpoint = \"http://c:4318\"\nsampler = \"sometimes\"\nsampler_arg = 2.0",
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
        );
        let keys: Vec<&str> = issues.iter().map(|issue| issue.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "daemon.tracing.sampler_arg",
                "daemon.tracing.sampler"
            ]
        );
    }
}
