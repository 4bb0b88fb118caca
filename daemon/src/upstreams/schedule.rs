//! When an upstream's catalog is listed again, to be checked against its pin: after
//! its `list_changed` (debounced, so a burst of notifications costs one listing) and
//! every `schema_check_interval` (zero turns the schedule off).

use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Notifications closer than this are one change.
pub const LIST_CHANGED_DEBOUNCE: Duration = Duration::from_millis(200);
/// However long notifications keep coming, the catalog is listed this soon after the
/// first: an upstream sending them without pause would otherwise never be listed
/// again, nor checked against its pin (its schedule waits behind them).
pub const LIST_CHANGED_MAX_WAIT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The upstream said its lists changed (and then was quiet for the debounce).
    Changed,
    /// `schema_check_interval` passed since the last listing.
    Scheduled,
}

/// Waits for the next check; `last` is when the catalog was last listed.
pub async fn next_check(changed: &Notify, interval: Duration, last: Instant) -> Check {
    let scheduled = async {
        if interval.is_zero() {
            std::future::pending::<()>().await
        } else {
            tokio::time::sleep_until(last + interval).await
        }
    };
    tokio::select! {
        _ = changed.notified() => {
            let latest = Instant::now() + LIST_CHANGED_MAX_WAIT;
            loop {
                tokio::select! {
                    _ = changed.notified() => continue,
                    _ = tokio::time::sleep(LIST_CHANGED_DEBOUNCE) => break,
                    _ = tokio::time::sleep_until(latest) => break,
                }
            }
            Check::Changed
        }
        _ = scheduled => Check::Scheduled,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Whether the check completes within `wait` (of paused time), and how.
    async fn within(
        changed: &Notify,
        interval: Duration,
        last: Instant,
        wait: Duration,
    ) -> Option<Check> {
        tokio::time::timeout(wait, next_check(changed, interval, last))
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_schedule_fires_every_interval_and_zero_turns_it_off() {
        let changed = Notify::new();
        let minute = Duration::from_secs(60);
        let start = Instant::now();
        assert_eq!(
            within(
                &changed,
                10 * minute,
                start,
                10 * minute - Duration::from_secs(1)
            )
            .await,
            None
        );
        assert_eq!(
            within(&changed, 10 * minute, start, 2 * minute).await,
            Some(Check::Scheduled)
        );
        let day = 24 * 60 * minute;
        assert_eq!(
            within(&changed, Duration::ZERO, Instant::now(), day).await,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_list_changed_is_one_check_after_it_ends() {
        let changed = Arc::new(Notify::new());
        let sender = changed.clone();
        let burst = tokio::spawn(async move {
            for _ in 0..5 {
                sender.notify_one();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let started = Instant::now();
        let check = within(&changed, Duration::ZERO, started, Duration::from_secs(5)).await;
        assert_eq!(check, Some(Check::Changed));
        // The last notification came at 400 ms; the check waited 200 ms of quiet after it.
        assert_eq!(started.elapsed(), Duration::from_millis(600));
        burst.await.ok();
        // Nothing else is waiting: the burst was one check.
        assert_eq!(
            within(
                &changed,
                Duration::ZERO,
                Instant::now(),
                Duration::from_secs(5)
            )
            .await,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn notifications_without_pause_still_get_a_check_soon() {
        let changed = Arc::new(Notify::new());
        let sender = changed.clone();
        let storm = tokio::spawn(async move {
            for _ in 0..400 {
                sender.notify_one();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let started = Instant::now();
        let check = within(&changed, Duration::ZERO, started, Duration::from_secs(5)).await;
        assert_eq!(check, Some(Check::Changed));
        assert_eq!(started.elapsed(), LIST_CHANGED_MAX_WAIT);
        // And again while it lasts.
        let again = Instant::now();
        let check = within(&changed, Duration::ZERO, again, Duration::from_secs(5)).await;
        assert_eq!(check, Some(Check::Changed));
        assert!(again.elapsed() <= LIST_CHANGED_MAX_WAIT + Duration::from_millis(50));
        storm.abort();
    }
}
