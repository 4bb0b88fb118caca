//! Connections: TCP with `TCP_NODELAY` (a keep-alive call on loopback costs ~40 ms
//! without it), and TLS (rustls with ring, the system's CA certificates) for
//! `https://` when built with the `tls` feature.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;

#[cfg(feature = "tls")]
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
pub(super) type Connector = HttpConnector;

/// Whether `https://` URLs can be reached.
pub(super) const AVAILABLE: bool = cfg!(feature = "tls");
/// Why they cannot, when they cannot.
#[cfg(feature = "tls")]
pub(super) const MISSING: &str = "";
#[cfg(not(feature = "tls"))]
pub(super) const MISSING: &str = "https needs plexus built with the `tls` feature";

/// A client connector for `http://` and `https://` (the system's CA certificates, or
/// none found: then https cannot be verified and says so once).
#[cfg(feature = "tls")]
pub fn connector(connect_timeout: Duration) -> Result<Connector, String> {
    use std::sync::Arc;

    let mut http = plain_connector(connect_timeout);
    http.enforce_http(false);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(builder) => builder,
        Err(error) => {
            // http:// upstreams must keep working on a machine without CA certificates.
            tracing::warn!(%error, "no CA certificates found; https upstreams cannot be verified");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("TLS setup failed: {error}"))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    Ok(builder.https_or_http().enable_http1().wrap_connector(http))
}

#[cfg(not(feature = "tls"))]
pub(super) fn connector(connect_timeout: Duration) -> Result<Connector, String> {
    Ok(plain_connector(connect_timeout))
}

fn plain_connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http
}
