//! Names and URIs to routes ([`Router`]): a tool or prompt name, a resource URI
//! looked up in the request's snapshot of the session's view of the catalog,
//! waiting for an upstream still on its first start that may own it; and the
//! error for one that routes nowhere.

use std::sync::Arc;

use registry::{Catalog, Kind, Route};

use crate::hub::Hub;
use crate::jsonrpc::RelayError;
use crate::telemetry::{self, Wait};
use crate::upstreams::UpstreamState;

/// Routes one request: it holds the snapshot the request is routed in, audited in,
/// and has the URIs in its result exposed from.
pub(super) struct Router<'a> {
    hub: &'a Hub,
    view: Option<&'a str>,
    catalog: Arc<Catalog>,
}

impl<'a> Router<'a> {
    /// A router on the current snapshot of `view` (None: the whole catalog).
    pub(super) fn new(hub: &'a Hub, view: Option<&'a str>) -> Router<'a> {
        Router {
            hub,
            view,
            catalog: hub.catalog_for(view),
        }
    }

    /// The snapshot routed in: the request's own, or the newer one a route waited for.
    pub(super) fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// A tool's route: listed, or the unprefixed upstream's for a name it does not list.
    pub(super) async fn tool(&mut self, name: &str) -> Result<Route, RelayError> {
        let route = self
            .waiting(name, under_prefix(name), |catalog, name| {
                catalog.route_tool(name).or_else(|| {
                    catalog
                        .route_unlisted_tool(name)
                        .filter(|_| catalog.held(Kind::Tools, name).is_none())
                })
            })
            .await;
        route.ok_or_else(|| self.unrouted_name(Kind::Tools, name))
    }

    pub(super) async fn prompt(&mut self, name: &str) -> Result<Route, RelayError> {
        let route = self
            .waiting(name, under_prefix(name), Catalog::route_prompt)
            .await;
        route.ok_or_else(|| self.unrouted_name(Kind::Prompts, name))
    }

    pub(super) async fn resource(&mut self, uri: &str) -> Result<Route, RelayError> {
        let route = self
            .waiting(uri, in_namespace(uri), Catalog::route_resource)
            .await;
        route.ok_or_else(|| unrouted(&self.catalog, Kind::Resources, uri))
    }

    /// Routes `key` (a tool or prompt name, a resource URI) with `route` in the
    /// request's snapshot. A key that routes nowhere yet and may `belong` (by its
    /// prefix) to an upstream this session may see that is still on its first
    /// start (nothing listed, not even from its cache) waits for that upstream's
    /// first listing as a first list does (up to `first_list_wait`), and is routed
    /// in the snapshot it makes, which the router keeps from then on: a client that
    /// just launched plexus does not see its first call fail.
    async fn waiting(
        &mut self,
        key: &str,
        belongs: impl Fn(&str) -> bool,
        route: impl Fn(&Catalog, &str) -> Option<Route>,
    ) -> Option<Route> {
        if let Some(found) = route(&self.catalog, key) {
            return Some(found);
        }
        let upstreams = self.hub.upstreams();
        let starting: Vec<&str> = upstreams
            .values()
            .filter(|upstream| {
                belongs(&upstream.config().prefix)
                    && self.catalog.shows_upstream(upstream.name())
                    && self.hub.awaits_first_listing(upstream)
            })
            .map(|upstream| upstream.name())
            .collect();
        if starting.is_empty() {
            // A listing installed since the request took its snapshot is why no
            // upstream awaits one any more: route on the snapshot that has it.
            let current = self.hub.catalog_for(self.view);
            if Arc::ptr_eq(&current, &self.catalog) {
                return None;
            }
            self.catalog = current;
            return route(&self.catalog, key);
        }
        let listed = self
            .hub
            .wait_for_first_listings_of(|upstream| starting.contains(&upstream));
        let named = (starting.len() == 1).then(|| starting[0]);
        telemetry::waited(Wait::UpstreamStart, named, listed).await;
        self.catalog = self.hub.catalog_for(self.view);
        route(&self.catalog, key)
    }

    /// The error for a tool or prompt name that routes nowhere. A name under the
    /// prefix of an upstream this session may see that has no listing yet (its
    /// first start is still under way, backing off, or failed) is about that
    /// upstream: the caller hears its state (-33001), not that the name is unknown.
    fn unrouted_name(&self, kind: Kind, name: &str) -> RelayError {
        let unknown = unrouted(&self.catalog, kind, name);
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
                && self.catalog.shows_upstream(upstream.name())
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
fn under_prefix(name: &str) -> impl Fn(&str) -> bool + '_ {
    move |prefix| prefix.is_empty() || registry::names::is_under_prefix(name, prefix)
}

/// Whether an upstream of this prefix may expose `uri`: one in its URI namespace,
/// or any URI for an upstream without a prefix (its URIs are exposed unchanged).
fn in_namespace(uri: &str) -> impl Fn(&str) -> bool + '_ {
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
