//! Restart pacing: exponential backoff with jitter and a cap, and a budget of
//! exits per window after which an upstream is given up on.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RestartSettings;

/// What to do after an instance exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartDecision {
    After(Duration),
    GiveUp,
}

/// Exponential backoff with jitter and a cap, and a budget of exits per window.
#[derive(Debug)]
pub struct RestartPolicy {
    settings: RestartSettings,
    next_delay: Duration,
    recent_exits: VecDeque<Instant>,
}

impl RestartPolicy {
    /// A run that lasted this long resets the delay.
    pub const HEALTHY_RUN: Duration = Duration::from_secs(60);

    pub fn new(settings: RestartSettings) -> RestartPolicy {
        RestartPolicy {
            settings,
            next_delay: settings.backoff,
            recent_exits: VecDeque::new(),
        }
    }

    /// Records an exit at `now` after a run of `ran_for`; `jitter` in 0..=0.25.
    pub fn on_exit(&mut self, now: Instant, ran_for: Duration, jitter: f64) -> RestartDecision {
        if ran_for >= Self::HEALTHY_RUN {
            self.next_delay = self.settings.backoff;
        }
        self.recent_exits.push_back(now);
        while self
            .recent_exits
            .front()
            .is_some_and(|exit| now.duration_since(*exit) > self.settings.window)
        {
            self.recent_exits.pop_front();
        }
        if self.recent_exits.len() > self.settings.max_restarts {
            return RestartDecision::GiveUp;
        }
        let delay = self.next_delay;
        self.next_delay = (self.next_delay * 2).min(self.settings.backoff_max);
        RestartDecision::After(delay.mul_f64(1.0 + jitter.clamp(0.0, 0.25)))
    }

    /// New settings from a reload, used from the next exit on.
    pub fn update(&mut self, settings: RestartSettings) {
        if settings != self.settings {
            self.settings = settings;
            self.next_delay = self
                .next_delay
                .clamp(settings.backoff, settings.backoff_max);
        }
    }

    /// A fresh start (an operator's retry, or a clean idle stop).
    pub fn reset(&mut self) {
        self.next_delay = self.settings.backoff;
        self.recent_exits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RestartSettings {
        RestartSettings {
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_restarts: 5,
            window: Duration::from_secs(120),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_loop_backs_off_then_gives_up() {
        let mut policy = RestartPolicy::new(settings());
        let mut delays = Vec::new();
        // Each run dies at once; the clock moves by each delay, as the supervisor sleeps it.
        let decision = loop {
            match policy.on_exit(Instant::now(), Duration::from_millis(10), 0.0) {
                RestartDecision::After(delay) => {
                    delays.push(delay.as_secs());
                    tokio::time::advance(delay).await;
                }
                give_up => break give_up,
            }
        };
        assert_eq!(delays, vec![1, 2, 4, 8, 16]);
        assert_eq!(decision, RestartDecision::GiveUp);
        policy.reset();
        assert_eq!(
            policy.on_exit(Instant::now(), Duration::ZERO, 0.0),
            RestartDecision::After(Duration::from_secs(1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn exits_spread_beyond_the_window_never_give_up_and_long_runs_reset_the_delay() {
        let mut policy = RestartPolicy::new(settings());
        for _ in 0..20 {
            let decision = policy.on_exit(Instant::now(), Duration::from_secs(61), 0.0);
            assert_eq!(decision, RestartDecision::After(Duration::from_secs(1)));
            tokio::time::advance(Duration::from_secs(61)).await;
        }
        let mut capped = RestartPolicy::new(RestartSettings {
            max_restarts: 100,
            ..settings()
        });
        let delays: Vec<u64> = (0..9)
            .map(
                |_| match capped.on_exit(Instant::now(), Duration::ZERO, 0.0) {
                    RestartDecision::After(delay) => delay.as_secs(),
                    RestartDecision::GiveUp => 0,
                },
            )
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(
            capped.on_exit(Instant::now(), Duration::ZERO, 0.25),
            RestartDecision::After(Duration::from_secs(75))
        );
    }
}
