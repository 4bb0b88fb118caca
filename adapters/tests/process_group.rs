//! Real children through `UpstreamConnection`: the whole process group is stopped
//! and reaped, a child ignoring SIGTERM is killed after the grace period, and
//! stdout noise, oversized lines and stderr floods are survived.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use plexus_adapters::{ConnectionError, LaunchSpec, Reply, StdioOptions, UpstreamConnection};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

fn shell(script: &str) -> LaunchSpec {
    LaunchSpec {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::new(),
        cwd: None,
    }
}

fn options(grace_ms: u64) -> StdioOptions {
    StdioOptions {
        max_message_bytes: 1024,
        stop_grace: Duration::from_millis(grace_ms),
        stderr_ring_lines: 10,
        ..StdioOptions::default()
    }
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// A tiny line server: answers every request line with `{"id":<n>,"result":{"echo":<n>}}`.
const ECHO_SERVER: &str = r#"while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
  [ -n "$id" ] && printf '{"jsonrpc":"2.0","id":%s,"result":{"echo":%s}}\n' "$id" "$id"
done"#;

#[tokio::test]
async fn stopping_reaches_grandchildren() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let pid_file = dir.path().join("grandchild.pid");
    let script = format!(
        "sleep 300 & echo $! > {}; {ECHO_SERVER}",
        pid_file.display()
    );
    let (events, _events) = mpsc::channel(8);
    let connection = UpstreamConnection::spawn_stdio(
        Arc::from("group"),
        &shell(&script),
        &options(2000),
        events,
    )?;
    let reply = connection.request("ping", None).await?;
    assert_eq!(reply, Reply::Result(json!({"echo": 1})));
    let grandchild: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
    assert!(alive(grandchild));

    connection.shutdown().await;
    // The sleeping grandchild was in the group: it is gone too (reaped by init).
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(grandchild) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !alive(grandchild),
        "grandchild {grandchild} survived the stop"
    );
    assert!(matches!(
        connection.request("ping", None).await,
        Err(ConnectionError::NotSent)
    ));
    Ok(())
}

#[tokio::test]
async fn a_child_ignoring_sigterm_is_killed_after_the_grace(
) -> Result<(), Box<dyn std::error::Error>> {
    let script = format!("trap '' TERM; {ECHO_SERVER}; trap '' TERM; sleep 300");
    let (events, _events) = mpsc::channel(8);
    let connection = UpstreamConnection::spawn_stdio(
        Arc::from("stubborn"),
        &shell(&script),
        &options(300),
        events,
    )?;
    connection.request("ping", None).await?;
    let started = Instant::now();
    let exit = connection.shutdown().await;
    assert_eq!(exit.signal, Some(9), "{exit}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn noise_oversized_lines_and_stderr_floods_are_survived(
) -> Result<(), Box<dyn std::error::Error>> {
    // 256 KiB of stderr without a newline, a banner on stdout, then the server.
    let script = format!(
        "head -c 262144 /dev/zero | tr '\\0' x >&2; echo 'Server starting on stdio...'; {ECHO_SERVER}"
    );
    let (events, _events) = mpsc::channel(8);
    let connection = UpstreamConnection::spawn_stdio(
        Arc::from("noisy"),
        &shell(&script),
        &options(1000),
        events,
    )?;
    let reply =
        tokio::time::timeout(Duration::from_secs(10), connection.request("ping", None)).await??;
    assert_eq!(reply, Reply::Result(json!({"echo": 1})));
    assert_eq!(
        connection
            .stats()
            .dropped_stdout_lines
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(connection
        .stderr_tail()
        .iter()
        .any(|line| line.contains("cut")));
    connection.shutdown().await;

    // A reply over the 1 KiB cap fails the waiting call with TooLarge and stops the child.
    let big = "x".repeat(4096);
    let script = format!(
        "read -r line; printf '{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"big\":\"{big}\"}}}}\\n'; sleep 300"
    );
    let (events, _events) = mpsc::channel(8);
    let connection =
        UpstreamConnection::spawn_stdio(Arc::from("huge"), &shell(&script), &options(300), events)?;
    let outcome =
        tokio::time::timeout(Duration::from_secs(10), connection.request("ping", None)).await?;
    assert!(
        matches!(outcome, Err(ConnectionError::TooLarge { limit: 1024 })),
        "{outcome:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), connection.wait_exit()).await?;
    Ok(())
}

#[tokio::test]
async fn server_messages_arrive_as_events_and_dropped_calls_are_cancelled_upstream(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let seen = dir.path().join("seen");
    // Announces a list change, asks for roots, then records what it is sent.
    let script = format!(
        "printf '{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}}\\n'; \
         printf '{{\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"roots/list\"}}\\n'; \
         while IFS= read -r line; do printf '%s\\n' \"$line\" >> {}; done",
        seen.display()
    );
    let (events, mut incoming) = mpsc::channel(8);
    let connection = UpstreamConnection::spawn_stdio(
        Arc::from("chatty"),
        &shell(&script),
        &options(300),
        events,
    )?;
    let first = incoming.recv().await.ok_or("no event")?;
    assert!(
        matches!(first, plexus_adapters::UpstreamEvent::Notification(ref m) if m["method"] == "notifications/tools/list_changed")
    );
    let second = incoming.recv().await.ok_or("no event")?;
    assert!(
        matches!(second, plexus_adapters::UpstreamEvent::Request { ref message, origin: None } if message["id"] == "s1")
    );
    connection
        .respond(json!("s1"), Reply::Result(json!({"roots": []})))
        .await?;

    // The server never answers: the caller gives up, and the upstream is told.
    let outcome = tokio::time::timeout(
        Duration::from_millis(200),
        connection.request("tools/call", Some(json!({"name": "slow"}))),
    )
    .await;
    assert!(outcome.is_err());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&seen).unwrap_or_default();
        if text.contains("notifications/cancelled") {
            assert!(
                text.contains(r#""id":"s1","result":{"roots":[]}"#),
                "{text}"
            );
            assert!(text.contains(r#""requestId":1"#), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cancel reached the upstream: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(connection.in_flight(), 0);
    connection.shutdown().await;
    Ok(())
}

/// What a child writes to stderr just before it exits is in the tail its exit
/// reports (it says why it exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_stderr_line_is_in_the_exits_tail() -> Result<(), Box<dyn std::error::Error>> {
    for run in 0..30 {
        let (events, _events) = mpsc::channel(8);
        let connection = UpstreamConnection::spawn_stdio(
            Arc::from("dying"),
            &shell(&format!("echo 'last words {run}' >&2; exit 3")),
            &options(500),
            events,
        )?;
        let exit = connection.wait_exit().await;
        assert_eq!(exit.code, Some(3));
        let tail = connection.stderr_tail();
        assert_eq!(tail, vec![format!("last words {run}")], "run {run}");
    }
    Ok(())
}

/// A child's stdin and stdout are pipes of 1 MiB (the kernel's default cap for
/// unprivileged processes), so a large message crosses in one round.
#[tokio::test]
async fn a_childs_pipes_hold_a_mebibyte() -> Result<(), Box<dyn std::error::Error>> {
    let max: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")?
        .trim()
        .parse()?;
    let (events, _events) = mpsc::channel(8);
    // F_GETPIPE_SZ is 1032 on Linux.
    let connection = UpstreamConnection::spawn_stdio(
        Arc::from("pipes"),
        &LaunchSpec {
            program: "python3".into(),
            args: vec![
                "-c".into(),
                "import fcntl, sys; print(fcntl.fcntl(0, 1032), fcntl.fcntl(1, 1032), file=sys.stderr)"
                    .into(),
            ],
            ..shell("")
        },
        &options(500),
        events,
    )?;
    let exit = connection.wait_exit().await;
    assert_eq!(exit.code, Some(0), "{:?}", connection.stderr_tail());
    let expected = (1 << 20).min(max);
    assert_eq!(
        connection.stderr_tail(),
        vec![format!("{expected} {expected}")]
    );
    Ok(())
}
