//! Supervision against fake upstreams, on a paused clock: an instance that exits
//! is started again after growing delays, one that keeps exiting is given up on
//! until an operator's retry, one that stops answering pings is restarted, an
//! operator's restart of a serving instance starts its successor before the
//! running one stops, and a lazy one runs from its first call until idle.

#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{RestartOutcome, UpstreamState};
use crate::hub::{CallContext, Hub};
use crate::testing::{self, FakeUpstream, SLOW_CALL};

const RESTARTS: &str =
    "restart_backoff = \"1s\"\nrestart_backoff_max = \"8s\"\nrestart_window = \"10m\"";

fn state(hub: &Hub) -> UpstreamState {
    let states = hub.states();
    assert_eq!(states.len(), 1, "{states:?}");
    states[0].1
}

/// Waits (on the paused clock) until the upstream's state is `label`.
async fn wait_for_state(hub: &Hub, label: &str) {
    testing::eventually(label, || state(hub).label() == label).await;
}

async fn echo(hub: &Arc<Hub>) -> bool {
    let (related, _events) = mpsc::channel(16);
    let session = hub.open_session();
    let call = CallContext {
        session,
        owner: session,
        tool: None,
        related: &related,
        headers: &[],
        result_unread: false,
        arguments: None,
    };
    let params = json!({"name": "echo", "arguments": {}});
    hub.forward("alpha", "tools/call", Some(params), call)
        .await
        .is_ok()
}

/// The gaps between consecutive starts.
fn gaps(starts: &[Instant]) -> Vec<Duration> {
    starts.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_exits_is_started_again_after_doubling_delays() {
    let fake = FakeUpstream::new();
    fake.exit_at_start(3);
    let dir = tempfile::tempdir().unwrap();
    let upstream = testing::upstream("alpha", &fake, &format!("{RESTARTS}\nmax_restarts = 5"));
    let hub = testing::hub(dir.path(), &upstream).await;

    wait_for_state(&hub, "ready").await;
    let starts = fake.starts();
    assert_eq!(starts.len(), 4, "three exits, then a run that serves");
    let gaps = gaps(&starts);
    println!("gaps between starts: {gaps:?} (backoff 1s doubling, jitter up to 25%)");
    for (gap, nominal) in gaps.iter().zip([1, 2, 4]) {
        let nominal = Duration::from_secs(nominal);
        // The delay is the backoff stretched by a jitter of at most a quarter.
        assert!(
            *gap >= nominal && *gap <= nominal.mul_f64(1.25) + Duration::from_millis(2),
            "gap {gap:?} for a backoff of {nominal:?}"
        );
    }
    assert!(echo(&hub).await);
    let history = hub.upstream_named("alpha").unwrap().shared.history();
    assert_eq!(history.restarts, 3);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_keeps_exiting_is_given_up_on_until_an_operator_retries() {
    let fake = FakeUpstream::new();
    fake.exit_at_start(usize::MAX);
    let dir = tempfile::tempdir().unwrap();
    let upstream = testing::upstream("alpha", &fake, &format!("{RESTARTS}\nmax_restarts = 2"));
    let hub = testing::hub(dir.path(), &upstream).await;

    wait_for_state(&hub, "failed").await;
    // The first start and two restarts: the third exit within the window gives up.
    assert_eq!(fake.starts().len(), 3);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        fake.starts().len(),
        3,
        "a failed upstream is not started again"
    );
    assert_eq!(state(&hub), UpstreamState::Failed);
    assert!(!echo(&hub).await, "a failed upstream answers no call");

    fake.exit_at_start(0);
    let retried = Instant::now();
    let outcome = hub.restart("alpha", Duration::from_secs(1)).await;
    assert!(
        matches!(outcome, Some(RestartOutcome::InPlace { state: "failed" })),
        "{outcome:?}"
    );
    wait_for_state(&hub, "ready").await;
    let starts = fake.starts();
    assert_eq!(starts.len(), 4);
    // A retry starts at once, with no backoff.
    assert_eq!(starts[3], retried);
    assert!(echo(&hub).await);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_operator_restart_starts_the_successor_before_the_serving_instance_stops() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, "")).await;
    wait_for_state(&hub, "ready").await;

    // A call in flight on the running instance.
    let slow = {
        let hub = hub.clone();
        tokio::spawn(async move {
            let (related, _events) = mpsc::channel(16);
            let session = hub.open_session();
            let call = CallContext {
                session,
                owner: session,
                tool: None,
                related: &related,
                headers: &[],
                result_unread: false,
                arguments: None,
            };
            let params = json!({"name": "slow", "arguments": {}});
            hub.forward("alpha", "tools/call", Some(params), call).await
        })
    };
    testing::until("the call reached the upstream", || {
        !fake.received_of("tools/call").is_empty()
    })
    .await;
    let asked = Instant::now();
    let outcome = hub.restart("alpha", Duration::from_secs(60)).await;
    assert!(
        matches!(outcome, Some(RestartOutcome::Replaced { .. })),
        "{outcome:?}"
    );
    // The successor runs and serves while its predecessor still has the call.
    assert_eq!(fake.starts().len(), 2);
    assert!(fake.ends().is_empty(), "the serving instance stopped first");
    assert!(echo(&hub).await);

    slow.await.unwrap().unwrap();
    assert_eq!(
        asked.elapsed(),
        SLOW_CALL,
        "the call in flight ran to its end"
    );
    testing::until("the predecessor stopped", || !fake.ends().is_empty()).await;
    let (starts, ends) = (fake.starts(), fake.ends());
    println!(
        "successor started {:?} after the restart was asked; predecessor stopped {:?} after",
        starts[1] - asked,
        ends[0] - asked
    );
    assert!(
        ends[0] >= asked + SLOW_CALL,
        "stopped before its call ended"
    );
    assert_eq!(state(&hub), UpstreamState::Ready);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_stops_answering_pings_is_restarted() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let health = "health_interval = \"5s\"\nhealth_timeout = \"1s\"";
    let extra = format!("{RESTARTS}\nmax_restarts = 5\n{health}");
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, &extra)).await;
    wait_for_state(&hub, "ready").await;
    assert!(echo(&hub).await);

    fake.ignore_pings(true);
    testing::eventually("a second start", || fake.starts().len() == 2).await;
    fake.ignore_pings(false);
    let starts = fake.starts();
    let gap = starts[1] - starts[0];
    println!("an upstream that stopped answering pings started again after {gap:?}");
    // The first ping 5 s after it was ready, 1 s unanswered, then a backoff of 1 s
    // (at most a quarter more).
    assert!(
        gap >= Duration::from_secs(7) && gap <= Duration::from_millis(7_260),
        "{gap:?}"
    );
    assert_eq!(fake.received_of("ping").len(), 1);
    wait_for_state(&hub, "ready").await;
    assert!(echo(&hub).await);
    hub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_lazy_upstream_starts_on_its_first_call_and_stops_after_idle_timeout() {
    let fake = FakeUpstream::new();
    let dir = tempfile::tempdir().unwrap();
    let lazy = "start = \"lazy\"\nidle_timeout = \"60s\"";
    let hub = testing::hub(dir.path(), &testing::upstream("alpha", &fake, lazy)).await;
    // With no listing on disk, it runs once to be listed, and stops when idle.
    testing::eventually("a first idle stop", || fake.ends().len() == 1).await;
    let starts = fake.starts();
    assert_eq!(starts.len(), 1);
    let first_run = fake.ends()[0] - starts[0];
    assert!(
        first_run >= Duration::from_secs(60) && first_run <= Duration::from_millis(60_002),
        "{first_run:?}"
    );
    wait_for_state(&hub, "idle").await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        fake.starts().len(),
        1,
        "an uncalled lazy upstream stays stopped"
    );

    let called = Instant::now();
    assert!(echo(&hub).await);
    assert_eq!(fake.starts(), vec![fake.starts()[0], called]);
    testing::eventually("an idle stop", || fake.ends().len() == 2).await;
    let idle_for = fake.ends()[1] - called;
    println!("a lazy upstream called once stopped {idle_for:?} later (idle_timeout 60s)");
    assert!(
        idle_for >= Duration::from_secs(60) && idle_for <= Duration::from_millis(60_002),
        "{idle_for:?}"
    );
    wait_for_state(&hub, "idle").await;

    // The next call starts it again.
    assert!(echo(&hub).await);
    assert_eq!(fake.starts().len(), 3);
    hub.shutdown().await;
}
