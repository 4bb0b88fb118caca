//! Tasks (2025-11-25): task ids are namespaced per upstream as `{upstream}:{id}`,
//! recorded with the session and principal they were handed to (and the
//! 2026-07-28 listens that asked for their status), and rewritten in every result
//! and notification that carries one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use adapters::Reply;
use dashmap::DashMap;
use serde_json::Value;

/// Where a task's id appears in results and notifications.
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";

/// The exposed form of an upstream's task id.
pub fn expose_task_id(upstream: &str, task_id: &str) -> String {
    format!("{upstream}:{task_id}")
}

/// Rewrites every task id in a result or notification params: `taskId` of the object
/// itself, of `task`, of each of `tasks`, and of `_meta` related-task.
pub fn rewrite_task_ids(value: &mut Value, rewrite: &dyn Fn(&str) -> Option<String>) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    let fix = |holder: Option<&mut Value>| {
        if let Some(Value::String(id)) = holder.and_then(|h| h.get_mut("taskId")) {
            if let Some(new) = rewrite(id) {
                *id = new;
            }
        }
    };
    if let Some(Value::String(id)) = object.get_mut("taskId") {
        if let Some(new) = rewrite(id) {
            *id = new;
        }
    }
    fix(object.get_mut("task"));
    fix(object
        .get_mut("_meta")
        .and_then(|meta| meta.get_mut(RELATED_TASK_META)));
    if let Some(Value::Array(tasks)) = object.get_mut("tasks") {
        for task in tasks {
            fix(Some(task));
        }
    }
}

/// Task ids handed to clients, to their upstream and creating session. Bounded:
/// past [`MAX_TASK_ROUTES`] the oldest tenth is dropped (their ids still route by
/// their upstream prefix; only status notifications lose their session), and
/// routes are purged with their session and with their upstream.
#[derive(Default)]
pub struct TaskRoutes {
    routes: DashMap<String, TaskRoute>,
    /// Each session's exposed ids, so a session's end (each 2026-07-28 request's
    /// scope ends one) forgets its routes without walking everyone's.
    by_session: DashMap<u64, Vec<String>>,
    next: AtomicU64,
    /// The 2026-07-28 listens (their scopes) that asked for a task's status, by
    /// exposed id, and each listen's ids, dropped with it.
    listens: DashMap<String, Vec<u64>>,
    listening: DashMap<u64, Vec<String>>,
}

/// Who a task's id was handed to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskOwner {
    /// The session told of the task's status: a connected client's. A 2026-07-28
    /// request's scope ends with its answer, so its tasks outlive it and have
    /// none; their status goes to the listens that name them.
    pub session: Option<u64>,
    /// Whose task it is: only a listen of this principal hears of it.
    pub principal: Option<Arc<str>>,
}

/// Where an exposed task id leads.
pub struct TaskRoute {
    pub upstream: String,
    pub original: String,
    pub session: Option<u64>,
    pub principal: Option<Arc<str>>,
    /// Insertion order, for pruning the oldest.
    order: u64,
}

pub const MAX_TASK_ROUTES: usize = 10_000;

impl TaskRoutes {
    /// Records the tasks a result created (for `owner`) and exposes their ids.
    pub fn expose(&self, upstream: &str, owner: TaskOwner, reply: Reply) -> Reply {
        let TaskOwner { session, principal } = owner;
        let Reply::Result(mut result) = reply else {
            return reply;
        };
        let recorded = std::cell::Cell::new(false);
        rewrite_task_ids(&mut result, &|id| {
            let exposed = expose_task_id(upstream, id);
            let mut inserted = false;
            self.routes.entry(exposed.clone()).or_insert_with(|| {
                inserted = true;
                TaskRoute {
                    upstream: upstream.to_string(),
                    original: id.to_string(),
                    session,
                    principal: principal.clone(),
                    order: self.next.fetch_add(1, Ordering::Relaxed),
                }
            });
            if let (true, Some(session)) = (inserted, session) {
                self.by_session
                    .entry(session)
                    .or_default()
                    .push(exposed.clone());
            }
            recorded.set(recorded.get() || inserted);
            Some(exposed)
        });
        // Counting locks every shard: only when the result added a route.
        if recorded.get() && self.routes.len() > MAX_TASK_ROUTES {
            self.prune();
        }
        Reply::Result(result)
    }

    fn prune(&self) {
        let mut orders: Vec<u64> = self.routes.iter().map(|route| route.order).collect();
        orders.sort_unstable();
        let cut = orders[orders.len() / 10];
        self.routes.retain(|_, route| route.order > cut);
        self.reindex();
    }

    /// Drops from the session index the ids whose routes are gone.
    fn reindex(&self) {
        let kept: std::collections::HashSet<String> = self
            .routes
            .iter()
            .map(|route| route.key().clone())
            .collect();
        self.by_session.retain(|_, ids| {
            ids.retain(|id| kept.contains(id));
            !ids.is_empty()
        });
    }

    /// The upstream and original id behind an exposed task id; `known` says which
    /// upstream names exist (a task listed before plexus restarted routes by its prefix).
    pub fn route(&self, exposed: &str, known: impl Fn(&str) -> bool) -> Option<(String, String)> {
        if let Some(route) = self.routes.get(exposed) {
            return Some((route.upstream.clone(), route.original.clone()));
        }
        let (upstream, original) = exposed.split_once(':')?;
        known(upstream).then(|| (upstream.to_string(), original.to_string()))
    }

    /// The session that created a task, for its status notifications.
    pub fn owner(&self, exposed: &str) -> Option<u64> {
        self.routes.get(exposed).and_then(|route| route.session)
    }

    /// The principal a task was handed to, while its route is kept.
    pub fn principal(&self, exposed: &str) -> Option<Arc<str>> {
        self.routes
            .get(exposed)
            .and_then(|route| route.principal.clone())
    }

    /// A listen (the scope `session`) hears of the task `exposed` from now on.
    pub fn listen(&self, exposed: &str, session: u64) {
        self.listens
            .entry(exposed.to_string())
            .or_default()
            .push(session);
        self.listening
            .entry(session)
            .or_default()
            .push(exposed.to_string());
    }

    /// The listens that asked for this task's status.
    pub fn listeners(&self, exposed: &str) -> Vec<u64> {
        self.listens
            .get(exposed)
            .map(|sessions| sessions.clone())
            .unwrap_or_default()
    }

    pub fn forget_session(&self, session: u64) {
        if let Some((_, ids)) = self.listening.remove(&session) {
            for id in ids {
                self.listens.remove_if_mut(&id, |_, sessions| {
                    sessions.retain(|s| *s != session);
                    sessions.is_empty()
                });
            }
        }
        let Some((_, ids)) = self.by_session.remove(&session) else {
            return;
        };
        for id in ids {
            self.routes
                .remove_if(&id, |_, route| route.session == Some(session));
        }
    }

    pub fn forget_upstream(&self, name: &str) {
        self.routes.retain(|_, route| route.upstream != name);
        self.reindex();
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

    #[test]
    fn routes_are_bounded_and_purged() {
        let routes = TaskRoutes::default();
        for n in 0..=MAX_TASK_ROUTES {
            let reply = Reply::Result(json!({"task": {"taskId": format!("t{n}")}}));
            let owner = TaskOwner {
                session: Some(n as u64 % 2),
                principal: None,
            };
            routes.expose("up", owner, reply);
        }
        assert!(routes.len() <= MAX_TASK_ROUTES, "{}", routes.len());
        assert!(routes.owner("up:t0").is_none(), "the oldest went first");
        assert_eq!(routes.owner(&format!("up:t{MAX_TASK_ROUTES}")), Some(0));
        // Unrecorded ids still route by their upstream prefix.
        assert_eq!(
            routes.route("up:t0", |name| name == "up"),
            Some(("up".into(), "t0".into()))
        );
        // Pruning left each session's index with only the routes that remain.
        let indexed: usize = routes.by_session.iter().map(|ids| ids.len()).sum();
        assert_eq!(indexed, routes.len());
        routes.forget_session(0);
        assert!(routes.owner(&format!("up:t{MAX_TASK_ROUTES}")).is_none());
        // The other session's routes stay.
        let last_odd = MAX_TASK_ROUTES - 1 + MAX_TASK_ROUTES % 2;
        assert_eq!(routes.owner(&format!("up:t{last_odd}")), Some(1));
        assert!(routes.by_session.get(&0).is_none());
        routes.forget_upstream("up");
        assert_eq!(routes.len(), 0);
        assert_eq!(routes.by_session.len(), 0);
    }

    /// A 2026-07-28 request's task outlives its scope, kept for its principal;
    /// a listen's interest in it ends with the listen.
    #[test]
    fn scope_tasks_keep_their_principal_and_listens_end_with_theirs() {
        let routes = TaskRoutes::default();
        let owner = TaskOwner {
            session: None,
            principal: Some(Arc::from("alice")),
        };
        let reply = Reply::Result(json!({"taskId": "t"}));
        routes.expose("up", owner, reply);
        routes.forget_session(1);
        assert_eq!(routes.principal("up:t").as_deref(), Some("alice"));
        assert_eq!(routes.owner("up:t"), None);
        routes.listen("up:t", 7);
        routes.listen("up:t", 8);
        assert_eq!(routes.listeners("up:t"), vec![7, 8]);
        routes.forget_session(7);
        assert_eq!(routes.listeners("up:t"), vec![8]);
        routes.forget_session(8);
        assert!(routes.listens.is_empty() && routes.listening.is_empty());
    }

    #[test]
    fn task_ids_are_rewritten_wherever_they_appear() {
        let mut value = json!({
            "taskId": "a",
            "task": {"taskId": "b", "status": "working"},
            "tasks": [{"taskId": "c"}, {"taskId": "d"}],
            "_meta": {RELATED_TASK_META: {"taskId": "e"}},
            "content": [{"type": "text", "text": "taskId stays"}],
        });
        rewrite_task_ids(&mut value, &|id| Some(expose_task_id("up", id)));
        assert_eq!(
            value,
            json!({
                "taskId": "up:a",
                "task": {"taskId": "up:b", "status": "working"},
                "tasks": [{"taskId": "up:c"}, {"taskId": "up:d"}],
                "_meta": {RELATED_TASK_META: {"taskId": "up:e"}},
                "content": [{"type": "text", "text": "taskId stays"}],
            })
        );
    }
}
