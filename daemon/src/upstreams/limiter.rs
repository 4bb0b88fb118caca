//! Per-upstream admission: a bounded number of calls in flight and a bounded line
//! of calls waiting for a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bounds the calls one upstream has in flight and waiting.
pub struct Limiter {
    permits: Arc<Semaphore>,
    /// The semaphore's size, to tell how many permits are out.
    max_in_flight: usize,
    waiting: AtomicUsize,
    max_pending: usize,
}

impl Limiter {
    pub fn new(max_in_flight: usize, max_pending: usize) -> Limiter {
        Limiter {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            waiting: AtomicUsize::new(0),
            max_pending,
        }
    }

    /// A slot for one call, waiting in line when all are taken; `None` when the line is full.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(permit);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_pending {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // The counter is decremented even if this future is dropped while waiting.
        let _waiting = DecrementOnDrop(&self.waiting);
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Completes when no call holds a slot (a draining upstream's calls have ended).
    pub async fn idle(&self) {
        let all = u32::try_from(self.max_in_flight).unwrap_or(u32::MAX);
        let _all = self.permits.acquire_many(all).await;
    }

    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    pub fn pending(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

struct DecrementOnDrop<'a>(&'a AtomicUsize);

impl Drop for DecrementOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn the_limiter_queues_up_to_max_pending_then_refuses() {
        let limiter = Arc::new(Limiter::new(2, 1));
        let first = limiter.acquire().await;
        let second = limiter.acquire().await;
        assert!(first.is_some() && second.is_some());
        assert_eq!(limiter.in_flight(), 2);
        let waiting = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire().await.is_some() })
        };
        while limiter.pending() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(limiter.acquire().await.is_none(), "the line is full");
        drop(first);
        assert!(waiting.await.unwrap_or(false));
        assert_eq!(limiter.pending(), 0);
    }
}
