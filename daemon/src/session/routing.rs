//! Names and URIs to routes: a tool or prompt name, a resource URI looked up in
//! the session's view of the catalog, waiting for an upstream still on its first
//! start that may own it; and the error for one that routes nowhere.

use std::sync::Arc;

use registry::{Catalog, Kind};

use super::Session;
use crate::jsonrpc::RelayError;
use crate::upstreams::UpstreamState;

impl Session {
    /// Routes `key` (a tool or prompt name, a resource URI) with `route` in
    /// `catalog` (the request's snapshot of the session's view), and returns the
    /// catalog routed in with the route, if any. A key that
    /// routes nowhere yet and may `belong` (by its prefix) to an upstream this session
    /// may see that is still on its first start (nothing listed, not even from its
    /// cache) waits for that upstream's first listing as a first list does (up to
    /// `first_list_wait`), and is routed in the catalog it makes: a client that just
    /// launched plexus does not see its first call fail.
    pub(super) async fn route_waiting(
        &self,
        catalog: Arc<Catalog>,
        key: &str,
        belongs: impl Fn(&str) -> bool,
        route: impl Fn(&Catalog, &str) -> Option<registry::Route>,
    ) -> (Arc<Catalog>, Option<registry::Route>) {
        if let Some(found) = route(&catalog, key) {
            return (catalog, Some(found));
        }
        let upstreams = self.hub.upstreams();
        let starting: Vec<&str> = upstreams
            .values()
            .filter(|upstream| {
                belongs(&upstream.config().prefix)
                    && catalog.shows_upstream(upstream.name())
                    && self.hub.awaits_first_listing(upstream)
            })
            .map(|upstream| upstream.name())
            .collect();
        if starting.is_empty() {
            // A listing installed since the request took its snapshot is why no
            // upstream awaits one any more: route on the snapshot that has it.
            let current = self.catalog();
            if Arc::ptr_eq(&current, &catalog) {
                return (catalog, None);
            }
            let found = route(&current, key);
            return (current, found);
        }
        self.hub
            .wait_for_first_listings_of(|upstream| starting.contains(&upstream))
            .await;
        let catalog = self.catalog();
        let found = route(&catalog, key);
        (catalog, found)
    }

    /// The error for a tool or prompt name that routes nowhere. A name under the
    /// prefix of an upstream this session may see that has no listing yet (its
    /// first start is still under way, backing off, or failed) is about that
    /// upstream: the caller hears its state (-33001), not that the name is unknown.
    pub(super) fn unrouted_name(
        &self,
        catalog: &registry::Catalog,
        kind: Kind,
        name: &str,
    ) -> RelayError {
        let unknown = unrouted(catalog, kind, name);
        if !matches!(
            unknown,
            RelayError::UnknownTool(_) | RelayError::UnknownPrompt(_)
        ) {
            return unknown;
        }
        for upstream in self.hub.upstreams().values() {
            let config = upstream.config();
            if registry::names::is_under_prefix(name, &config.prefix)
                && config.enabled
                && catalog.shows_upstream(upstream.name())
                && upstream.shared.state() != UpstreamState::Ready
                && !self.hub.lists(upstream.name())
            {
                return upstream.shared.unavailable();
            }
        }
        unknown
    }
}

/// Whether an upstream of this prefix may expose `name`: one under its prefix, or
/// any name for an upstream without one.
pub(super) fn under_prefix(name: &str) -> impl Fn(&str) -> bool + '_ {
    move |prefix| prefix.is_empty() || registry::names::is_under_prefix(name, prefix)
}

/// Whether an upstream of this prefix may expose `uri`: one in its URI namespace,
/// or any URI for an upstream without a prefix (its URIs are exposed unchanged).
pub(super) fn in_namespace(uri: &str) -> impl Fn(&str) -> bool + '_ {
    let namespace = registry::uris::split_namespace(uri).map(|(namespace, _)| namespace);
    move |prefix| {
        prefix.is_empty()
            || namespace.is_some_and(|namespace| {
                registry::uris::uri_namespace(prefix).as_deref() == Some(namespace)
            })
    }
}

/// The error for a name or URI that routes nowhere: held back by the pins (-33006,
/// with the change), or unknown.
pub(super) fn unrouted(catalog: &registry::Catalog, kind: Kind, key: &str) -> RelayError {
    match catalog.held(kind, key) {
        Some(held) => RelayError::quarantined(kind, key, held),
        None => match kind {
            Kind::Tools => RelayError::UnknownTool(key.to_string()),
            Kind::Prompts => RelayError::UnknownPrompt(key.to_string()),
            Kind::Resources | Kind::ResourceTemplates => {
                RelayError::UnknownResource(key.to_string())
            }
        },
    }
}
