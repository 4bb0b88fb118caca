//! A session's requests being served ([`InFlight`]), by the JSON text of the
//! client's id, so a cancel (or the session's end) reaches them.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct InFlight {
    requests: Mutex<HashMap<String, CancellationToken>>,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers request `key`; `None` when one with that id is in flight already.
    /// The entry is removed when what is returned drops, however the request ends
    /// (a dropped future, a client gone, included).
    pub(super) fn register(&self, key: String) -> Option<Registered<'_>> {
        let token = CancellationToken::new();
        {
            let mut requests = self.lock();
            if requests.contains_key(&key) {
                return None;
            }
            requests.insert(key.clone(), token.clone());
        }
        Some(Registered {
            table: self,
            key,
            token,
        })
    }

    /// Cancels request `key` (the client's `notifications/cancelled`).
    pub(super) fn cancel(&self, key: &str) {
        if let Some(token) = self.lock().get(key) {
            token.cancel();
        }
    }

    /// Cancels every request (the session ends).
    pub(super) fn cancel_all(&self) {
        for (_, token) in self.lock().drain() {
            token.cancel();
        }
    }
}

/// A request in the table, until it drops.
pub(super) struct Registered<'a> {
    table: &'a InFlight,
    key: String,
    pub(super) token: CancellationToken,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.table.lock().remove(&self.key);
    }
}
