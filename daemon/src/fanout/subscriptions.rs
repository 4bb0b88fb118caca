//! Resource subscriptions, reference counted per upstream and URI: which change
//! asks the upstream to subscribe or unsubscribe (the hub sends it).

use std::sync::PoisonError;

use registry::Route;
use serde_json::{json, Value};

use super::Fanout;
use crate::jsonrpc::RelayError;

/// The request a change to a session's subscriptions sends upstream.
pub struct SubscriptionRequest {
    pub method: &'static str,
    pub params: Value,
    /// A subscribe the reference count took: undone if the upstream does not take it.
    counted: bool,
}

impl Fanout {
    /// Counts a session's subscription to a resource, and says what it asks of the
    /// upstream: the first subscribes there and the last unsubscribes; a per-session
    /// upstream's belong to that session's own instance; a 2026-07-28 upstream is
    /// told by its listen stream here. The request itself is the caller's to send
    /// (the one relay path), and a failed subscribe its to undo
    /// ([`Fanout::subscription_failed`]).
    pub fn subscription(
        &self,
        session: u64,
        route: &Route,
        subscribe: bool,
    ) -> Result<Option<SubscriptionRequest>, RelayError> {
        let upstream = self.upstream_named(&route.upstream)?;
        let request = |counted: bool| {
            Some(SubscriptionRequest {
                method: if subscribe {
                    "resources/subscribe"
                } else {
                    "resources/unsubscribe"
                },
                params: json!({"uri": route.original}),
                counted: counted && subscribe,
            })
        };
        if upstream.config().share == crate::config::Share::Session {
            // Nothing to unsubscribe from an instance that no longer runs.
            return match upstream.existing_instance(session) {
                Some(_) => Ok(request(false)),
                None if subscribe => Err(RelayError::Unavailable {
                    upstream: route.upstream.to_string(),
                    state: "idle".into(),
                    retry_after_ms: Some(1000),
                }),
                None => Ok(None),
            };
        }
        let key = (route.upstream.to_string(), route.original.clone());
        let send = {
            let mut counts = self
                .subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let count = counts.entry(key.clone()).or_insert(0);
            if subscribe {
                *count += 1;
                *count == 1
            } else {
                *count = count.saturating_sub(1);
                let last = *count == 0;
                if last {
                    counts.remove(&key);
                }
                last
            }
        };
        if !send {
            return Ok(None);
        }
        if upstream.speaks_per_request() {
            // 2026-07-28 has no resources/subscribe: the upstream's listen stream names the URIs.
            let uris = self
                .subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .keys()
                .filter(|(name, _)| **name == *route.upstream)
                .map(|(_, uri)| uri.clone())
                .collect();
            upstream.listen_uris.send_replace(uris);
            return Ok(None);
        }
        Ok(request(true))
    }

    /// The upstream did not take a subscribe [`Fanout::subscription`] asked for:
    /// not subscribed after all, so the next subscriber tries again.
    pub fn subscription_failed(&self, route: &Route, request: &SubscriptionRequest) {
        if request.counted {
            self.subscriptions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(route.upstream.to_string(), route.original.clone()));
        }
    }
}
