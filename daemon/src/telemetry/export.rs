//! The OTLP exporters' HTTP client: hyper over the remote upstreams' rustls
//! (ring) connector, so no second HTTP or TLS stack enters the build.
//!
//! The SDK exports from threads of its own (`futures::executor::block_on`), where
//! hyper has no runtime: each post runs as a task on plexus's runtime, tracked,
//! and the exporting thread awaits its handle.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

/// How long one export may take, connection included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A collector's answer is a small protobuf; anything larger is not read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub(super) struct Poster {
    client: Client<adapters::remote::HttpsConnector, Full<Bytes>>,
    runtime: Handle,
    tasks: TaskTracker,
}

impl fmt::Debug for Poster {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("Poster")
    }
}

impl Poster {
    pub(super) fn new(runtime: Handle, tasks: TaskTracker) -> Result<Poster, String> {
        let connector = adapters::remote::https_connector(EXPORT_TIMEOUT)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Poster {
            client,
            runtime,
            tasks,
        })
    }
}

impl HttpClient for Poster {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = self.client.clone();
        let post = async move {
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(parts, Full::new(body));
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self.tasks.spawn_on(
            async move {
                tokio::time::timeout(EXPORT_TIMEOUT, post)
                    .await
                    .unwrap_or_else(|_| Err("the export timed out".into()))
            },
            &self.runtime,
        );
        Box::pin(async move { task.await.map_err(HttpError::from)? })
    }
}
