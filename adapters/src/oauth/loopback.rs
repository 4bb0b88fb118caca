//! The RFC 8252 loopback redirect: a listener on 127.0.0.1 at an ephemeral port,
//! opened before the browser is, that takes the one redirect carrying `state`
//! and answers it with a short page.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

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
    /// Connections are read side by side (up to [`MAX_READING`]): one that sends
    /// nothing (another local process) holds up only itself, for at most [`HEAD_WAIT`].
    pub async fn wait(
        &self,
        state: &str,
        wait: Duration,
    ) -> Result<Vec<(String, String)>, OAuthError> {
        let accept = async {
            let mut reading = FuturesUnordered::new();
            loop {
                tokio::select! {
                    accepted = self.listener.accept(), if reading.len() < MAX_READING => {
                        if let Ok((stream, _)) = accepted {
                            reading.push(answer(stream, state));
                        }
                    }
                    Some(Some(pairs)) = reading.next(), if !reading.is_empty() => return pairs,
                }
            }
        };
        tokio::time::timeout(wait, accept)
            .await
            .map_err(|_| OAuthError::NoRedirect(wait))
    }
}

/// How many connections are read at once (each holds at most a head); more wait
/// in the listen queue.
const MAX_READING: usize = 1024;

/// How long a connection may take to send its request's head.
const HEAD_WAIT: Duration = Duration::from_secs(10);

/// Reads one request's head and answers it: the query's pairs if it is the
/// redirect carrying `state`.
async fn answer(mut stream: TcpStream, state: &str) -> Option<Vec<(String, String)>> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 2048];
    let read = tokio::time::timeout(HEAD_WAIT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD_BYTES {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    read.ok()?;
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
    let matches = path == CALLBACK_PATH && pairs.iter().any(|(k, v)| k == "state" && v == state);
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
    matches.then_some(pairs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Local connections that send nothing, or junk, do not hold up the redirect.
    #[tokio::test]
    async fn silent_and_hostile_connections_do_not_hold_up_the_redirect() {
        let loopback = Loopback::bind().await.unwrap();
        let address = loopback.listener.local_addr().unwrap();
        let seed = b"GET /callback?code=c&state=s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        // While plexus waits: connections that send nothing, and junk, then the redirect.
        let clients = async {
            let mut held = Vec::new();
            for _ in 0..20 {
                held.push(TcpStream::connect(address).await.unwrap());
            }
            for junk in mutations::cases(&[seed], 40, 0x100B).into_iter().skip(1) {
                let mut stream = TcpStream::connect(address).await.unwrap();
                // Junk that still names the state would be the redirect: not junk.
                if !junk.windows(7).any(|w| w == b"state=s") {
                    let _ = stream.write_all(&junk).await;
                }
                held.push(stream);
            }
            let started = tokio::time::Instant::now();
            let mut stream = TcpStream::connect(address).await.unwrap();
            stream.write_all(seed).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            (answer, started.elapsed(), held.len())
        };
        // Served in turn, the twenty silent ones alone would take 200 s.
        let both = async { tokio::join!(loopback.wait("s", Duration::from_secs(60)), clients) };
        let (pairs, (answer, took, held)) = tokio::time::timeout(Duration::from_secs(30), both)
            .await
            .expect("the redirect waited behind the stalled connections");
        println!("the redirect behind {held} open connections took {took:?}");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(pairs
            .unwrap()
            .contains(&("code".to_string(), "c".to_string())));
        // Well within one head's wait (10 s), which each stalled connection took before.
        assert!(took < HEAD_WAIT / 2, "{took:?}");
    }
}
