//! A future that is polled again at once when it wakes itself while being polled.
//!
//! hyper's connection wakes its own task during a poll twice per exchange (asking
//! for the request body, and when a finished answer drops the channel it was
//! watching). tokio treats a task woken during its own poll as one that yielded: it
//! goes to the back of the queue and another worker is woken to take it, a futex
//! or eventfd write and a context switch or two per request on an idle daemon,
//! often moving the exchange to the other core. Polling again in place does what
//! the wake asked for without leaving the worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// How many times one poll may go round before the task yields as usual, so a
/// future that keeps waking itself still lets others run.
const MAX_ROUNDS: usize = 8;

/// The wrapped future is being polled.
const POLLING: u8 = 1;
/// It was woken while being polled.
const WOKEN: u8 = 2;

pin_project_lite::pin_project! {
    /// `future`, polled again in place when it wakes itself during a poll.
    pub struct Repoll<F> {
        #[pin]
        future: F,
        shared: Arc<Shared>,
        // Handed to `future`: wakes go through `shared`.
        waker: Waker,
    }
}

impl<F: Future> Repoll<F> {
    pub fn new(future: F) -> Repoll<F> {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(0),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(shared.clone());
        Repoll {
            future,
            shared,
            waker,
        }
    }
}

struct Shared {
    state: AtomicU8,
    /// The task's own waker, for wakes that come while it is not being polled.
    task: AtomicWaker,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let during_poll = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & POLLING != 0).then_some(state | WOKEN)
            })
            .is_ok();
        if !during_poll {
            self.task.wake();
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        this.shared.task.register(cx.waker());
        let mut inner = Context::from_waker(this.waker);
        for _ in 0..MAX_ROUNDS {
            this.shared.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(output) = this.future.as_mut().poll(&mut inner) {
                this.shared.state.store(0, Ordering::Release);
                return Poll::Ready(output);
            }
            let state = this.shared.state.swap(0, Ordering::AcqRel);
            // Out of budget, tokio's resources wake the task and refuse until it
            // has yielded: going round again would only be refused again.
            if state & WOKEN == 0 || !tokio::task::coop::has_budget_remaining() {
                if state & WOKEN != 0 {
                    cx.waker().wake_by_ref();
                }
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Wakes itself `rounds` times during its polls, then is ready; counts polls.
    struct SelfWaking {
        rounds: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for SelfWaking {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.rounds == 0 {
                return Poll::Ready(());
            }
            self.rounds -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts how often the task's own waker is used.
    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_self_wake_is_polled_again_in_place() {
        let polls = Arc::new(AtomicUsize::new(0));
        let mut future = Box::pin(Repoll::new(SelfWaking {
            rounds: 3,
            polls: polls.clone(),
        }));
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Ready(()));
        assert_eq!(polls.load(Ordering::Relaxed), 4);
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            0,
            "no wake reached the task"
        );
    }

    #[test]
    fn endless_self_wakes_yield_after_a_few_rounds() {
        let polls = Arc::new(AtomicUsize::new(0));
        let mut future = Box::pin(Repoll::new(SelfWaking {
            rounds: usize::MAX,
            polls: polls.clone(),
        }));
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(polls.load(Ordering::Relaxed), MAX_ROUNDS);
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "the task was woken to yield"
        );
    }

    #[tokio::test]
    async fn a_wake_between_polls_reaches_the_task() {
        let (sender, receiver) = tokio::sync::oneshot::channel::<u32>();
        let waiting = tokio::spawn(Repoll::new(receiver));
        tokio::task::yield_now().await;
        let _ = sender.send(7);
        assert_eq!(waiting.await.ok().and_then(Result::ok), Some(7));
    }
}
