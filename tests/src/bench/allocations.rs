//! Counting what a daemon served in this process allocates: the bench's own
//! threads (`main`, and the clients' runtime, named `bench…`) are told apart from
//! the daemon's by name, and only the daemon's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting the daemon's allocations (and reallocations).
pub struct Counting;

static DAEMON_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Whose thread this is: 0 not known yet, 1 the daemon's, 2 the bench's, 3 being
/// found out (an allocation while the name is read is not counted).
const UNKNOWN: u8 = 0;
const DAEMON: u8 = 1;
const FINDING: u8 = 3;

thread_local! {
    static SIDE: Cell<u8> = const { Cell::new(UNKNOWN) };
}

/// Allocations made so far on the daemon's threads.
pub fn daemon_allocations() -> u64 {
    DAEMON_ALLOCATIONS.load(Ordering::Relaxed)
}

fn count() {
    // Fails only while the thread's locals are torn down: not counted then.
    let _ = SIDE.try_with(|side| match side.get() {
        DAEMON => {
            DAEMON_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        UNKNOWN => {
            side.set(FINDING);
            let bench = std::thread::current()
                .name()
                .is_some_and(|name| name == "main" || name.starts_with("bench"));
            side.set(if bench { 2 } else { DAEMON });
            if !bench {
                DAEMON_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => {}
    });
}

// SAFETY: every call is passed to the system allocator unchanged; counting only
// touches an atomic and a thread-local cell.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
