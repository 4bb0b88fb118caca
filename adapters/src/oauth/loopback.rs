//! The RFC 8252 loopback redirect: a listener on 127.0.0.1 at an ephemeral port,
//! opened before the browser is, that takes the one redirect carrying `state`
//! and answers it with a short page.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::OAuthError;

/// The path of the redirect URI.
pub const CALLBACK_PATH: &str = "/callback";
/// The longest request head read from a browser.
const MAX_HEAD_BYTES: usize = 16 * 1024;

pub struct Loopback {
    listener: TcpListener,
    pub redirect_uri: String,
}

impl Loopback {
    pub async fn bind() -> Result<Loopback, OAuthError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(OAuthError::Loopback)?;
        let port = listener.local_addr().map_err(OAuthError::Loopback)?.port();
        Ok(Loopback {
            listener,
            redirect_uri: format!("http://127.0.0.1:{port}{CALLBACK_PATH}"),
        })
    }

    /// The query parameters of the first request to the callback path whose
    /// `state` is `state`, within `wait`. Other requests (a favicon) get 404.
    pub async fn wait(
        &self,
        state: &str,
        wait: Duration,
    ) -> Result<Vec<(String, String)>, OAuthError> {
        let accept = async {
            loop {
                let Ok((mut stream, _)) = self.listener.accept().await else {
                    continue;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 2048];
                let read = tokio::time::timeout(Duration::from_secs(10), async {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD_BYTES
                    {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                })
                .await;
                if read.is_err() {
                    continue;
                }
                let text = String::from_utf8_lossy(&head);
                let target = text
                    .lines()
                    .next()
                    .and_then(|line| line.split_whitespace().nth(1))
                    .unwrap_or("");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
                let matches =
                    path == CALLBACK_PATH && pairs.iter().any(|(k, v)| k == "state" && v == state);
                let (status, body) = if matches {
                    (
                        "200 OK",
                        "plexus received the authorization; you may close this window.",
                    )
                } else {
                    ("404 Not Found", "not the authorization plexus waits for")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
                if matches {
                    return pairs;
                }
            }
        };
        tokio::time::timeout(wait, accept)
            .await
            .map_err(|_| OAuthError::NoRedirect(wait))
    }
}
