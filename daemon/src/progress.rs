//! Progress tokens: a client's token never reaches a shared upstream. Each relayed
//! call that asked for progress gets plexus's own token (`plexus-<n>`); the
//! upstream's progress under it goes back to the call's stream under the client's
//! token, and marks the call alive (which extends its deadline). Only the upstream
//! the call went to is heard under its token (and of a per-session upstream, only
//! the instance of the call's session): the tokens are plexus's, and guessable, and
//! another upstream or instance that named one would speak into a call it does not
//! serve.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, Notify};

use crate::jsonrpc;

#[derive(Default)]
pub struct ProgressRoutes {
    routes: DashMap<String, ProgressRoute>,
    next: AtomicU64,
    /// Progress dropped for naming another upstream's call.
    misrouted: AtomicU64,
}

struct ProgressRoute {
    /// The upstream the call went to: the only one heard under its token.
    upstream: Arc<str>,
    /// The session owning the instance the call went to (per-session upstreams).
    owner: Option<u64>,
    sink: mpsc::Sender<Value>,
    client_token: Value,
    activity: Arc<Notify>,
}

/// A registered token; dropping it (the call ended, however) forgets the route.
pub struct ProgressGuard<'a> {
    routes: &'a ProgressRoutes,
    token: String,
    pub activity: Arc<Notify>,
}

impl Drop for ProgressGuard<'_> {
    fn drop(&mut self) {
        self.routes.routes.remove(&self.token);
    }
}

impl ProgressRoutes {
    /// Swaps the client's token in `params` for a fresh one of plexus's, routed to
    /// `sink` for progress that `upstream`'s instance owned by `owner` sends.
    pub fn register(
        &self,
        params: &mut Option<Value>,
        sink: &mpsc::Sender<Value>,
        upstream: &Arc<str>,
        owner: Option<u64>,
    ) -> Option<ProgressGuard<'_>> {
        let meta = params.as_mut()?.get_mut("_meta")?.as_object_mut()?;
        let client_token = meta.remove("progressToken")?;
        let token = format!("plexus-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        meta.insert("progressToken".into(), Value::String(token.clone()));
        let activity = Arc::new(Notify::new());
        self.routes.insert(
            token.clone(),
            ProgressRoute {
                upstream: upstream.clone(),
                owner,
                sink: sink.clone(),
                client_token,
                activity: activity.clone(),
            },
        );
        Some(ProgressGuard {
            routes: self,
            token,
            activity,
        })
    }

    /// Sends the progress notification that `upstream`'s instance owned by `owner`
    /// sent to the call it is about, under that client's own token.
    pub fn route(&self, message: &Value, upstream: &str, owner: Option<u64>) {
        let Some(params) = message.get("params").and_then(Value::as_object) else {
            return;
        };
        let Some(token) = params.get("progressToken").and_then(Value::as_str) else {
            return;
        };
        let Some(route) = self.routes.get(token) else {
            tracing::debug!(token, "progress for a call that is no longer in flight");
            return;
        };
        if *route.upstream != *upstream || route.owner != owner {
            // An upstream cannot flood the log.
            if let Some(misrouted) = adapters::rpc::count_rarely(&self.misrouted) {
                tracing::warn!(
                    upstream,
                    token,
                    misrouted,
                    "an upstream sent progress under the token of a call to another upstream, or to another session's instance; dropped"
                );
            }
            return;
        }
        let mut params: Map<String, Value> = params.clone();
        params.insert("progressToken".into(), route.client_token.clone());
        route.activity.notify_one();
        let notification =
            jsonrpc::notification("notifications/progress", Some(Value::Object(params)));
        if route.sink.try_send(notification).is_err() {
            tracing::debug!("session's outbound queue is full; progress dropped");
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.routes.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn progress_goes_back_under_the_clients_token_until_the_call_ends() {
        let routes = ProgressRoutes::default();
        let (sink, mut received) = mpsc::channel(4);
        let mut params = Some(json!({"name": "x", "_meta": {"progressToken": 7}}));
        let upstream: Arc<str> = Arc::from("alpha");
        let guard = routes.register(&mut params, &sink, &upstream, Some(1));
        let token = params
            .as_ref()
            .and_then(|p| p["_meta"]["progressToken"].as_str());
        assert_eq!(token, Some("plexus-1"));
        // Another upstream naming the token is not heard.
        routes.route(
            &json!({"params": {"progressToken": "plexus-1", "progress": 9, "message": "enter your password"}}),
            "beta",
            Some(1),
        );
        assert!(
            received.try_recv().is_err(),
            "another upstream's progress got through"
        );
        // Nor is another session's instance of the same upstream, nor its shared one.
        for owner in [Some(2), None] {
            routes.route(
                &json!({"params": {"progressToken": "plexus-1", "progress": 9}}),
                "alpha",
                owner,
            );
            assert!(
                received.try_recv().is_err(),
                "another instance's progress got through ({owner:?})"
            );
        }
        routes.route(
            &json!({"params": {"progressToken": "plexus-1", "progress": 1}}),
            "alpha",
            Some(1),
        );
        let sent = received.try_recv().ok();
        assert_eq!(
            sent.as_ref().map(|m| &m["params"]["progressToken"]),
            Some(&json!(7))
        );
        drop(guard);
        assert_eq!(routes.len(), 0, "the route goes with the call");
        routes.route(
            &json!({"params": {"progressToken": "plexus-1", "progress": 2}}),
            "alpha",
            Some(1),
        );
        assert!(received.try_recv().is_err());
    }
}
