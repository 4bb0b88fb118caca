//! Giving freed memory back to the system once the catalog settles.
//!
//! Reading and judging listings allocates many short-lived values: a page of 1,000
//! tools parses into several times its JSON, and several upstreams list at once.
//! glibc keeps what those values freed in its per-thread arenas, so a daemon that
//! listed a large catalog once would stay at that peak for good (63 MiB beyond an
//! idle daemon for 2.8 MB of definitions, against 17 MiB once trimmed).

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the catalog must stay unchanged before memory is released: upstreams
/// that start together list within moments of each other (the pump takes what
/// arrived together as one change), and a second held a start's peak (twice the
/// settled size at 10 upstreams x 1,000 tools) for longer than the start took.
pub const SETTLE: Duration = Duration::from_millis(300);

/// Releases free memory (`release`) once `changes` (any of them) have been quiet
/// for [`SETTLE`] after each burst of changes, and after the start (what was read
/// before the call, such as the pin file, is a burst too), until `stop` or until
/// a sender of `changes` is gone.
pub async fn release_after_changes<F>(
    mut changes: Vec<watch::Receiver<u64>>,
    stop: CancellationToken,
    release: F,
) where
    F: Fn() + Clone + Send + 'static,
{
    if let Some(first) = changes.first_mut() {
        first.mark_changed();
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = any_changed(&mut changes) => if !changed { return },
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => break,
                changed = any_changed(&mut changes) => if !changed { return },
            }
        }
        // Trimming walks and locks every arena: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(release.clone()).await;
    }
}

/// Whether one of `changes` changed (false: its sender is gone, or there are none).
async fn any_changed(changes: &mut [watch::Receiver<u64>]) -> bool {
    if changes.is_empty() {
        return std::future::pending().await;
    }
    let waits = changes.iter_mut().map(|change| Box::pin(change.changed()));
    futures::future::select_all(waits).await.0.is_ok()
}

/// Returns the free pages of every glibc arena to the system, and from then on keeps
/// a large message's buffers in the heap (see [`fix_thresholds_for_reading`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn release_free_memory() {
    // What the call costs in real time: it is CPU work, no tokio clock runs it.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    // SAFETY: malloc_trim only reads and changes the allocator's own state, under
    // its arena locks; it has no precondition on the caller.
    let released = unsafe { libc::malloc_trim(0) } != 0;
    set_thresholds(SETTLED_OWN_PAGES_FROM);
    tracing::debug!(released, took = ?started.elapsed(), "returned free memory to the system");
}

/// Other allocators keep no comparable reserve, or have no such call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}

/// While the catalog is read, blocks this large get pages of their own, given back
/// when freed (glibc's initial threshold, held fixed).
const READING_OWN_PAGES_FROM: usize = 128 * 1024;
/// Once it has settled, a large message's buffers stay in the heap to be reused,
/// and so does twice that much free memory at its top: pages of their own for
/// each would cost a fault per page per message. A 1 MiB call's answer is often
/// twice that (an echo's text is in `content` and `structuredContent`), read into a
/// buffer that doubles as it grows: 4 MiB, which a 4 MiB threshold put on pages of
/// its own (about 550 faults per call in a stdio daemon).
const SETTLED_OWN_PAGES_FROM: usize = 8 << 20;

/// Keeps the large blocks of reading a catalog (a listing's line, the pin file, the
/// kept listings) on pages of their own. glibc otherwise raises its threshold to the
/// largest block freed so far, and the later ones land in the heap between the
/// catalog's long-lived allocations, where freeing them leaves holes no trim can
/// return: a restart on 10 × 1,000 pinned tools held 0.5–2 MiB more, varying from
/// start to start. Called once, before the runtime's threads allocate;
/// [`release_free_memory`] sets the thresholds for a settled catalog.
pub fn fix_thresholds_for_reading() {
    set_thresholds(READING_OWN_PAGES_FROM);
}

/// Runs `work` on a thread of its own and returns what it returns (its panic, if
/// it panics), in place if no thread can be started. glibc gives that thread an
/// arena of its own: the many small values `work` makes and drops (a large listing
/// parsed into `Value`s) are then freed there whole, instead of leaving holes in
/// the caller's arena between the long-lived values it makes next (metrics, tasks,
/// catalog parts), holes no trim can return. A restart on 10 × 1,000 cached tools
/// held about 0.45 MiB less with its listings parsed apart.
pub fn apart<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let mut work = Some(work);
    let done = std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("plexus-read".into())
            .spawn_scoped(scope, || work.take().map(|work| work()));
        thread.ok().map(|thread| thread.join())
    });
    match (done, work) {
        (Some(Ok(Some(value))), _) => value,
        (Some(Err(panic)), _) => std::panic::resume_unwind(panic),
        // No thread: `work` is still here.
        (_, Some(work)) => work(),
        // The thread took `work`, so it returned its value or panicked.
        _ => unreachable!("work ran but returned nothing"),
    }
}

/// Sets the thresholds of a settled catalog from the start, for a process that
/// reads none (`plexus connect`): glibc's own move with each large block freed,
/// and trim its heap's top after each, about 700 page faults per 1 MiB call.
pub fn fix_thresholds_for_messages() {
    set_thresholds(SETTLED_OWN_PAGES_FROM);
}

/// Large blocks from `own_pages_from` up are mapped on their own; free memory at the
/// heap's top beyond twice that is given back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_thresholds(own_pages_from: usize) {
    let int = |bytes: usize| libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets the allocator's own parameters, under its lock; it
    // has no precondition on the caller.
    let set = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, int(own_pages_from)) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, int(2 * own_pages_from)) == 1
    };
    if !set {
        tracing::debug!(own_pages_from, "the allocator kept its thresholds");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds(_own_pages_from: usize) {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_releases_once_after_it_settles() {
        let (changes, watched) = watch::channel(0);
        let stop = CancellationToken::new();
        let released = Arc::new(AtomicUsize::new(0));
        let count = released.clone();
        let (writes, written) = watch::channel(0);
        let task = tokio::spawn(release_after_changes(
            vec![watched, written],
            stop.clone(),
            move || {
                count.fetch_add(1, Ordering::SeqCst);
            },
        ));
        for n in 1..=5 {
            changes.send_replace(n);
            tokio::time::sleep(SETTLE / 2).await;
        }
        assert_eq!(released.load(Ordering::SeqCst), 0, "released mid-burst");
        tokio::time::sleep(SETTLE).await;
        // The start counts as a change: one release for it and the burst after it.
        assert_eq!(settled(&released, 1).await, 1);
        changes.send_replace(6);
        tokio::time::sleep(SETTLE * 2).await;
        assert_eq!(settled(&released, 2).await, 2);
        // A change on another watch (a write finished) releases too.
        writes.send_replace(1);
        tokio::time::sleep(SETTLE * 2).await;
        assert_eq!(settled(&released, 3).await, 3);
        stop.cancel();
        assert!(task.await.is_ok(), "the release task panicked");
    }

    /// The count once it reaches `at_least` (or after a second): `spawn_blocking`
    /// runs on a real thread, so it is waited for without the paused clock.
    async fn settled(released: &AtomicUsize, at_least: usize) -> usize {
        for _ in 0..1000 {
            if released.load(Ordering::SeqCst) >= at_least {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(1));
        }
        released.load(Ordering::SeqCst)
    }

    #[test]
    fn releasing_free_memory_leaves_live_memory_alone() {
        let kept: Vec<Vec<u8>> = (0..64).map(|n| vec![n as u8; 64 * 1024]).collect();
        drop((0..64).map(|_| vec![0u8; 64 * 1024]).collect::<Vec<_>>());
        release_free_memory();
        for (n, block) in kept.iter().enumerate() {
            assert!(block.iter().all(|byte| *byte == n as u8));
        }
    }

    #[test]
    fn work_apart_runs_on_a_thread_of_its_own_and_returns_its_value() {
        let caller = std::thread::current().id();
        let borrowed = String::from("kept listing");
        let (value, thread) = apart(|| (borrowed.len(), std::thread::current().id()));
        assert_eq!(value, borrowed.len());
        assert_ne!(thread, caller);
    }

    #[test]
    fn a_panic_apart_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| apart(|| -> u8 { panic!("parse failed") }));
        match caught {
            Err(payload) => assert_eq!(payload.downcast_ref::<&str>(), Some(&"parse failed")),
            Ok(value) => panic!("the panic was lost: {value}"),
        }
    }
}
