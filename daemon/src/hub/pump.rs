//! The pump: what supervisors report (states, listings, upstream notifications and
//! requests, restarts), and what the upstream set's hooks say as it changes, handed
//! to the catalog host, the pins, the metrics and the fan-out.

use std::sync::{Arc, Weak};

use adapters::handshake::ServerHello;
use registry::fingerprint::ListingSnapshot;
use registry::{ToolFilter, UpstreamListing};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::Hub;
use crate::pins::Policy;
use crate::upstreams::{empty_listing, SetHooks, SupervisorEvent, Upstream, UpstreamState};

impl Hub {
    fn on_state_change(&self, name: &str, state: UpstreamState) {
        let up = i64::from(state == UpstreamState::Ready);
        self.metrics.upstream_up.with_label_values(&[name]).set(up);
        for label in UpstreamState::LABELS {
            self.metrics
                .upstream_state
                .with_label_values(&[name, label])
                .set(i64::from(label == state.label()));
        }
        self.report_status();
    }

    /// One supervisor event, in the order supervisors sent them. A listing's
    /// acknowledgement is returned, to be sent once the catalog that shows it is out.
    fn handle(self: &Arc<Self>, event: SupervisorEvent) -> Option<oneshot::Sender<()>> {
        match event {
            SupervisorEvent::State {
                upstream,
                generation,
                state,
            } => {
                if self.upstreams.is_current(&upstream, generation) {
                    self.on_state_change(&upstream, state);
                }
            }
            SupervisorEvent::Listing {
                generation,
                listing,
                security,
                capabilities,
                hello,
                installed,
            } => {
                // A removed or replaced upstream's late listing is neither kept nor shown.
                if self.catalog.accepts(&listing.upstream, generation) {
                    let name = listing.upstream.clone();
                    let policy = self.policy(&name);
                    self.catalog.save(&listing, &capabilities);
                    self.catalog.install(generation, *listing, |listing| {
                        judged(listing, Some(&hello), |snapshot| {
                            self.pins
                                .observe_hashed(&name, snapshot, policy, Some(*security))
                        })
                    });
                    self.share_pinned_texts(&name);
                }
                return Some(installed);
            }
            SupervisorEvent::Notification {
                upstream,
                session,
                message,
            } => self.fanout.route_notification(&upstream, session, &message),
            SupervisorEvent::Request {
                upstream,
                instance,
                connection,
                message,
                origin,
            } => {
                let id = message.get("id").cloned().unwrap_or(Value::Null);
                if let Some(reply) = self.fanout.route_upstream_request(
                    &upstream,
                    &instance,
                    &connection,
                    message,
                    origin,
                ) {
                    self.tasks.spawn(async move {
                        if connection.respond(id, reply).await.is_err() {
                            tracing::debug!(upstream = %connection.upstream(), "upstream closed before plexus answered it");
                        }
                    });
                }
            }
            SupervisorEvent::Restarted {
                upstream,
                generation,
            } => {
                if self.upstreams.is_current(&upstream, generation) {
                    self.metrics
                        .upstream_restarts
                        .with_label_values(&[&upstream])
                        .inc();
                }
            }
        }
        None
    }
}

/// `listing`'s entries and instructions lent to `judge` as a snapshot (the entries
/// moved there and back, never copied: a large listing's tree of values is several
/// times its text), with what the server said of itself if it was listed afresh (a
/// listing kept from an earlier run has no name or version).
pub(super) fn judged<T>(
    listing: &mut UpstreamListing,
    hello: Option<&ServerHello>,
    judge: impl FnOnce(&ListingSnapshot) -> T,
) -> T {
    let text = |key: &str| {
        hello
            .and_then(|hello| hello.server_info.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let snapshot = ListingSnapshot {
        server_name: text("name"),
        server_version: text("version"),
        instructions: match hello {
            Some(hello) => hello.instructions.clone(),
            None => listing.instructions.clone(),
        },
        tools: std::mem::take(&mut listing.tools),
        prompts: std::mem::take(&mut listing.prompts),
        resources: std::mem::take(&mut listing.resources),
        resource_templates: std::mem::take(&mut listing.resource_templates),
    };
    let judgement = judge(&snapshot);
    listing.tools = snapshot.tools;
    listing.prompts = snapshot.prompts;
    listing.resources = snapshot.resources;
    listing.resource_templates = snapshot.resource_templates;
    judgement
}

/// Most events handled as one batch.
const MOST_IN_A_BATCH: usize = 256;

/// Hands supervisor events to the hub until shutdown. Events that queued up while
/// the last were handled go as one batch under one catalog hold: many upstreams
/// listing at once (a start, a reload) cost a few assemblies of the catalog rather
/// than one per upstream, each over everything listed before it.
pub(super) async fn pump(hub: Weak<Hub>, mut events: mpsc::Receiver<SupervisorEvent>) {
    let Some(stopping) = hub.upgrade().map(|hub| hub.shutdown.clone()) else {
        return;
    };
    let mut acknowledgements = Vec::new();
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = stopping.cancelled() => None,
        };
        let (Some(event), Some(hub)) = (event, hub.upgrade()) else {
            return;
        };
        hub.catalog.hold();
        acknowledgements.extend(hub.handle(event));
        for _ in 1..MOST_IN_A_BATCH {
            let Ok(event) = events.try_recv() else {
                break;
            };
            acknowledgements.extend(hub.handle(event));
        }
        hub.catalog.release();
        for installed in acknowledgements.drain(..) {
            let _ = installed.send(());
        }
    }
}

impl SetHooks for Hub {
    fn entered(&self, upstream: &Arc<Upstream>) -> bool {
        let name = upstream.name();
        self.on_state_change(name, upstream.shared.state());
        if self.catalog.lists(name) {
            return true;
        }
        let config = upstream.config();
        if let Some(package) = &config.unversioned_package {
            tracing::warn!(upstream = %name, package = %package, "the package names no exact version: whatever the registry serves next will run (pin it, e.g. `{package}@1.2.3`; the version running is recorded in the pin file)");
        }
        if !config.enabled {
            return false;
        }
        match self.catalog.load(empty_listing(&config)) {
            Some((listing, capabilities)) => {
                upstream.remember_capabilities(capabilities);
                // Kept from an earlier run: held as the pins say until it is listed afresh.
                let policy = Policy::of(&config);
                self.catalog
                    .install(upstream.generation(), listing, |listing| {
                        judged(listing, None, |snapshot| {
                            self.pins.evaluate(name, snapshot, policy)
                        })
                    });
                // An upstream that starts late (on demand, or after failing) would
                // otherwise keep its pins' copy of these texts until it lists.
                self.share_pinned_texts(name);
                true
            }
            None => false,
        }
    }

    fn updated(&self, upstream: &Arc<Upstream>) {
        let config = upstream.config();
        self.catalog.rename(
            upstream.name(),
            &config.prefix,
            ToolFilter::new(config.allow_tools.clone(), config.deny_tools.clone()),
        );
        self.requarantine(upstream.name());
    }

    fn batch(&self, open: bool) {
        if open {
            self.catalog.hold();
        } else {
            self.catalog.release();
        }
    }

    fn removed(&self, name: &str, generation: u64) {
        self.catalog.remove(name, generation);
        self.metrics.forget_upstream(name);
        self.fanout.forget_upstream(name);
        self.task_routes.forget_upstream(name);
        self.pins.forget(name);
    }
}
