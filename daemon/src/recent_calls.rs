//! Each upstream's relayed calls over the last 15 minutes, in memory: calls, errors
//! and latency percentiles per 15-second slot, for the console's sparklines without
//! a Prometheus to ask. Fixed-size per upstream (60 slots of a log-scale histogram),
//! kept only for upstreams in the set.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

/// The width of one slot.
pub const SLOT: Duration = Duration::from_secs(15);
/// Slots kept: 15 minutes.
pub const SLOTS: usize = 60;
/// Latency bins: bin `b` holds durations in [2^(b/4), 2^((b+1)/4)) microseconds,
/// so a percentile is known within 19%, from 1 µs to about 4.6 hours.
const BINS: usize = 96;

#[derive(Clone)]
struct Slot {
    /// The slot's number since `RecentCalls::origin`; a stale one reads as empty.
    number: u64,
    calls: u32,
    errors: u32,
    latency: [u32; BINS],
}

impl Slot {
    fn empty(number: u64) -> Slot {
        Slot {
            number,
            calls: 0,
            errors: 0,
            latency: [0; BINS],
        }
    }

    /// The upper edge of the bin holding the `quantile`th call, in milliseconds.
    fn percentile(&self, quantile: f64) -> Option<f64> {
        if self.calls == 0 {
            return None;
        }
        let rank = (f64::from(self.calls) * quantile).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (bin, count) in self.latency.iter().enumerate() {
            seen += u64::from(*count);
            if seen >= rank {
                let micros = 2f64.powf((bin as f64 + 1.0) / 4.0);
                return Some(micros.round() / 1000.0);
            }
        }
        None
    }
}

/// The rings, one per upstream.
pub struct RecentCalls {
    origin: Instant,
    rings: Mutex<HashMap<String, Vec<Slot>>>,
}

impl Default for RecentCalls {
    fn default() -> RecentCalls {
        RecentCalls {
            origin: Instant::now(),
            rings: Mutex::new(HashMap::new()),
        }
    }
}

impl RecentCalls {
    fn slot_now(&self) -> u64 {
        (self.origin.elapsed().as_millis() / SLOT.as_millis()) as u64
    }

    /// Counts one relayed call of `upstream` that took `took`.
    pub fn record(&self, upstream: &str, failed: bool, took: Duration) {
        let number = self.slot_now();
        let micros = took.as_micros().max(1) as f64;
        let bin = ((micros.log2() * 4.0).floor() as usize).min(BINS - 1);
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        if !rings.contains_key(upstream) {
            rings.insert(upstream.to_string(), vec![Slot::empty(u64::MAX); SLOTS]);
        }
        let Some(ring) = rings.get_mut(upstream) else {
            return;
        };
        let slot = &mut ring[(number % SLOTS as u64) as usize];
        if slot.number != number {
            *slot = Slot::empty(number);
        }
        slot.calls += 1;
        slot.errors += u32::from(failed);
        slot.latency[bin] += 1;
    }

    /// Forgets a removed upstream.
    pub fn forget(&self, upstream: &str) {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(upstream);
    }

    /// The last 15 minutes of `upstream`, oldest slot first: `calls`, `errors`,
    /// `p50_ms` and `p99_ms` (null where a slot had no calls), each 60 long.
    pub fn series(&self, upstream: &str) -> Value {
        let now = self.slot_now();
        let rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        let ring = rings.get(upstream);
        let (mut calls, mut errors, mut p50, mut p99) = (vec![], vec![], vec![], vec![]);
        for back in (0..SLOTS as u64).rev() {
            // Slots before the daemon started read as empty.
            let number = now.checked_sub(back);
            let slot = ring
                .zip(number)
                .map(|(ring, number)| &ring[(number % SLOTS as u64) as usize])
                .filter(|slot| Some(slot.number) == number);
            calls.push(slot.map_or(0, |slot| slot.calls));
            errors.push(slot.map_or(0, |slot| slot.errors));
            p50.push(slot.and_then(|slot| slot.percentile(0.5)));
            p99.push(slot.and_then(|slot| slot.percentile(0.99)));
        }
        json!({
            "slot_s": SLOT.as_secs(),
            "calls": calls,
            "errors": errors,
            "p50_ms": p50,
            "p99_ms": p99,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slots_roll_over_and_percentiles_follow_the_calls() {
        let recent = RecentCalls::default();
        for millis in 1..=100 {
            recent.record("alpha", millis > 98, Duration::from_millis(millis));
        }
        let series = recent.series("alpha");
        assert_eq!(series["calls"][SLOTS - 1], 100);
        assert_eq!(series["errors"][SLOTS - 1], 2);
        let p50 = series["p50_ms"][SLOTS - 1].as_f64().unwrap();
        let p99 = series["p99_ms"][SLOTS - 1].as_f64().unwrap();
        assert!((50.0..=50.0 * 1.19 + 1.0).contains(&p50), "{p50}");
        assert!((99.0..=99.0 * 1.19 + 1.0).contains(&p99), "{p99}");
        assert!(series["p50_ms"][0].is_null());

        // A slot later the calls move one step back; 15 minutes later they are gone.
        tokio::time::advance(SLOT).await;
        recent.record("alpha", false, Duration::from_millis(1));
        let series = recent.series("alpha");
        assert_eq!(series["calls"][SLOTS - 2], 100);
        assert_eq!(series["calls"][SLOTS - 1], 1);
        tokio::time::advance(SLOT * SLOTS as u32).await;
        let series = recent.series("alpha");
        assert!(series["calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|calls| calls == 0));
        recent.forget("alpha");
        assert!(recent.rings.lock().unwrap().is_empty());
    }
}
