//! plexus upstream connections: how upstream MCP servers are launched (or reached
//! over HTTP), framed and spoken to. Messages stay `serde_json::Value`s: this crate routes on ids and
//! methods and never interprets the rest.

mod causes;
mod connection;
pub mod escapes;
pub mod framing;
pub mod handshake;
#[cfg(feature = "test-support")]
pub mod in_process;
pub mod json_out;
pub mod keeper;
pub mod launch;
pub mod oauth;
mod pipes;
pub mod raw_object;
pub mod remote;
mod request_line;
pub mod rpc;
pub mod skim;
mod stdin_writer;
pub mod stdio;

pub use causes::error_chain;
pub use connection::{ConnectionStats, OutgoingRequest, UpstreamConnection};
pub use launch::{parse_naked_uri, percent_decode, LaunchError, LaunchSpec, Launcher};
pub use raw_object::{RawObject, WrittenMember};
pub use remote::{HttpEndpoint, HttpError, HttpOptions, HttpTransportKind};
pub use request_line::TraceContext;
pub use rpc::{Cause, ConnectionError, Events, NotificationTap, Reply, UpstreamEvent};
pub use stdio::{ExitReport, SpawnError, StdioOptions};

/// Counts each test thread's allocations, for the parsers' randomized tests.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: mutations::Counting = mutations::Counting;
