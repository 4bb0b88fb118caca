//! plexus upstream connections: how upstream MCP servers are launched, framed and
//! spoken to. Messages stay `serde_json::Value`s: this crate routes on ids and
//! methods and never interprets the rest.

pub mod framing;
pub mod handshake;
pub mod launch;
pub mod rpc;
mod stdin_writer;
pub mod stdio;

pub use launch::{parse_naked_uri, LaunchError, LaunchSpec, Launcher};
pub use rpc::{ConnectionError, Reply, UpstreamEvent};
pub use stdio::{ExitReport, SpawnError, StdioOptions, UpstreamConnection};
