//! The relay (`Hub::forward`) against fake upstreams, on a paused clock: a call
//! answered, a deadline met by an upstream that never answers, a deadline that
//! progress extends up to its cap, an upstream that exits mid-call, and the
//! per-upstream limit on calls.

#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{CallContext, Hub};
use crate::jsonrpc::RelayError;
use crate::testing::{self, FakeUpstream, PROGRESS_EVERY, SLOW_CALL};

/// A call of session `session`, its related messages going to `related`.
fn call(session: u64, related: &mpsc::Sender<Value>) -> CallContext<'_> {
    CallContext {
        session,
        owner: session,
        tool: None,
        related,
        headers: &[],
        result_unread: false,
        arguments: None,
    }
}

async fn call_tool(
    hub: &std::sync::Arc<Hub>,
    tool: &str,
    arguments: Value,
) -> Result<adapters::Reply, RelayError> {
    let (related, _events) = mpsc::channel(16);
    let session = hub.open_session();
    let params = json!({"name": tool, "arguments": arguments});
    hub.forward("alpha", "tools/call", Some(params), call(session, &related))
        .await
}

#[tokio::test(start_paused = true)]
async fn a_call_is_forwarded_under_plexus_id_and_its_answer_returned() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, "")).await;

    let reply = call_tool(&hub, "echo", json!({"n": 1})).await.unwrap();
    let result = reply.into_result().unwrap();
    assert_eq!(result["content"][0]["text"], r#"{"n":1}"#);
    let calls = fake.received_of("tools/call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["params"],
        json!({"name": "echo", "arguments": {"n": 1}})
    );
    // The upstream sees plexus's own ids, numbers it assigned, never the client's.
    assert!(calls[0]["id"].is_u64(), "{}", calls[0]);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_never_answers_meets_the_call_timeout_and_is_told_to_cancel() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let upstream = testing::upstream("alpha", &fake, "call_timeout = \"30s\"");
    let hub = testing::hub(dir.path(), &upstream).await;

    let started = Instant::now();
    let outcome = call_tool(&hub, "hang", json!({})).await;
    let waited = started.elapsed();
    println!("a call to an upstream that never answers ended after {waited:?} (paused clock)");
    match outcome {
        Err(RelayError::Timeout { upstream, after }) => {
            assert_eq!(upstream, "alpha");
            assert!(
                after >= Duration::from_secs(30) && after < Duration::from_millis(30_010),
                "{after:?}"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(waited < Duration::from_millis(30_010), "{waited:?}");
    // The abandoned request is cancelled upstream, under the id it was sent with.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let sent = fake.received_of("tools/call");
    let cancels = fake.received_of("notifications/cancelled");
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["params"]["requestId"], sent[0]["id"]);
    hub.shutdown().await;
}

/// A `progress` call of `steps` steps with the client's progress token; its
/// outcome, how long it took, and the progress the caller was sent.
async fn call_with_progress(
    hub: &std::sync::Arc<Hub>,
    steps: u64,
) -> (Result<adapters::Reply, RelayError>, Duration, Vec<Value>) {
    let (related, mut events) = mpsc::channel(16);
    let session = hub.open_session();
    let params = json!({
        "name": "progress",
        "arguments": {"steps": steps},
        "_meta": {"progressToken": "client-token"},
    });
    let started = Instant::now();
    let outcome = hub
        .forward("alpha", "tools/call", Some(params), call(session, &related))
        .await;
    let took = started.elapsed();
    let mut progress = Vec::new();
    while let Ok(message) = events.try_recv() {
        progress.push(message);
    }
    (outcome, took, progress)
}

#[tokio::test(start_paused = true)]
async fn progress_extends_a_calls_deadline_up_to_max_call_timeout() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let limits = "call_timeout = \"30s\"\nmax_call_timeout = \"70s\"";
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, limits)).await;

    // Progress at 20 s and 40 s, the answer at 60 s: past call_timeout, within the cap.
    let (outcome, took, progress) = call_with_progress(&hub, 2).await;
    println!("a call with progress every {PROGRESS_EVERY:?} answered after {took:?}");
    assert!(outcome.unwrap().into_result().is_ok());
    assert_eq!(took, PROGRESS_EVERY * 3);
    // The caller sees its own token; the upstream was given plexus's.
    assert_eq!(progress.len(), 2, "{progress:?}");
    for (step, message) in progress.iter().enumerate() {
        assert_eq!(message["method"], "notifications/progress");
        assert_eq!(message["params"]["progressToken"], "client-token");
        assert_eq!(message["params"]["progress"], step as u64 + 1);
    }
    let sent = fake.received_of("tools/call");
    let token = &sent[0]["params"]["_meta"]["progressToken"];
    assert!(!token.is_null() && token != "client-token", "{token}");

    // Progress at 20, 40 and 60 s still ends at the cap, 70 s.
    let (outcome, took, _) = call_with_progress(&hub, 4).await;
    println!("a call with progress past max_call_timeout ended after {took:?}");
    match outcome {
        Err(RelayError::Timeout { upstream, after }) => {
            assert_eq!(upstream, "alpha");
            assert_eq!(after, Duration::from_secs(70));
        }
        other => panic!("expected a timeout at the cap, got {other:?}"),
    }
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_exits_mid_call_fails_the_call_naming_the_upstream() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, "")).await;

    let error = call_tool(&hub, "crash", json!({})).await.unwrap_err();
    assert!(
        matches!(&error, RelayError::FailedMidCall { upstream, .. } if upstream == "alpha"),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "upstream `alpha` failed during the call: the upstream exited or its connection closed"
    );
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn calls_past_max_in_flight_wait_their_turn_and_past_max_pending_are_refused() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let upstream = testing::upstream("alpha", &fake, "max_in_flight = 2\nmax_pending = 3");
    let hub = testing::hub(dir.path(), &upstream).await;

    let started = Instant::now();
    let calls: Vec<_> = (0..5)
        .map(|n| {
            let hub = hub.clone();
            tokio::spawn(async move { call_tool(&hub, "slow", json!({"n": n})).await })
        })
        .collect();
    let limiter = hub.upstream_named("alpha").unwrap().limiter();
    testing::until("three calls wait", || limiter.pending() == 3).await;
    assert_eq!(limiter.in_flight(), 2);
    // The line is full: one more is refused at once, naming the limits.
    let refused = call_tool(&hub, "slow", json!({})).await.unwrap_err();
    assert!(
        matches!(
            refused,
            RelayError::Overloaded {
                ref upstream,
                in_flight: 2,
                pending: 3
            } if upstream == "alpha"
        ),
        "{refused:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);

    for call in calls {
        call.await.unwrap().unwrap();
    }
    let took = started.elapsed();
    println!("5 calls of {SLOW_CALL:?} two at a time took {took:?} (paused clock)");
    assert_eq!(fake.most_slow_at_once(), 2);
    // Three rounds: two, two, one.
    assert!(
        took >= SLOW_CALL * 3 && took < SLOW_CALL * 3 + Duration::from_millis(10),
        "{took:?}"
    );
    assert_eq!(fake.received_of("tools/call").len(), 5);
    hub.shutdown().await;
}
