//! How many upstreams may be starting at once (spawned or connected, and not yet
//! initialized and listed): a cold `npx` or `uvx` herd would otherwise thrash
//! the machine it shares with the daemon. The limit follows reloads.

use std::sync::{Mutex, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};

/// The start slots shared by every supervisor.
pub struct StartSlots {
    slots: Semaphore,
    limit: Mutex<Limit>,
}

struct Limit {
    size: usize,
    /// Slots still to be retired after a shrink: each returned slot pays one.
    owed: usize,
}

/// One start in progress; the slot is free again when dropped.
pub struct StartSlot<'a> {
    permit: Option<SemaphorePermit<'a>>,
    slots: &'a StartSlots,
}

impl StartSlots {
    pub fn new(size: usize) -> StartSlots {
        StartSlots {
            slots: Semaphore::new(size),
            limit: Mutex::new(Limit { size, owed: 0 }),
        }
    }

    /// Waits for a free slot.
    pub async fn acquire(&self) -> StartSlot<'_> {
        StartSlot {
            // The semaphore is never closed, so this only fails if it were.
            permit: self.slots.acquire().await.ok(),
            slots: self,
        }
    }

    /// Makes the limit `size`: more slots at once, or fewer as starts finish.
    pub fn resize(&self, size: usize) {
        let mut limit = self.limit.lock().unwrap_or_else(PoisonError::into_inner);
        if size > limit.size {
            let more = size - limit.size;
            // Slots owed from an earlier shrink are forgiven first.
            let forgiven = more.min(limit.owed);
            limit.owed -= forgiven;
            self.slots.add_permits(more - forgiven);
        } else {
            let fewer = limit.size - size;
            let retired = self.slots.forget_permits(fewer);
            limit.owed += fewer - retired;
        }
        limit.size = size;
    }

    #[cfg(test)]
    fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

impl Drop for StartSlot<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut limit = self
            .slots
            .limit
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if limit.owed > 0 {
            limit.owed -= 1;
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_limit_grows_at_once_and_shrinks_as_starts_finish() {
        let slots = StartSlots::new(2);
        let first = slots.acquire().await;
        let second = slots.acquire().await;
        assert_eq!(slots.available(), 0);
        slots.resize(3);
        assert_eq!(slots.available(), 1);
        let third = slots.acquire().await;
        // Shrinking while all three are taken: two returns are retired.
        slots.resize(1);
        drop(first);
        drop(second);
        assert_eq!(slots.available(), 0);
        drop(third);
        assert_eq!(slots.available(), 1);
        // Growing again adds what is new.
        slots.resize(4);
        assert_eq!(slots.available(), 4);
    }

    #[tokio::test]
    async fn growing_before_owed_slots_return_forgives_them_first() {
        let slots = StartSlots::new(2);
        let first = slots.acquire().await;
        let second = slots.acquire().await;
        slots.resize(0);
        // Back to 1 while both are out: one owed slot is forgiven, none added.
        slots.resize(1);
        assert_eq!(slots.available(), 0);
        drop(first);
        assert_eq!(slots.available(), 0, "one return still retires a slot");
        drop(second);
        assert_eq!(slots.available(), 1);
    }
}
