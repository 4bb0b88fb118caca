//! The end-to-end tests: one test binary (linked once) with a module per area, each
//! against real daemon and fixture processes; `cargo test -p plexus-tests --test e2e relay::`
//! runs one area.

mod architecture;
mod audit;
mod balancer;
mod bench_smoke;
mod catalog;
mod cli;
mod cluster;
mod conformance;
mod connect;
mod console;
mod explore;
mod faults;
mod fixture_modern;
mod foreign;
mod front;
mod hostile;
mod instances;
mod kubernetes;
mod modern;
mod one_state;
mod packaging;
mod pins;
mod protocol;
mod python_client;
mod relay;
mod reload;
mod remote;
mod restart;
mod roundtrip;
mod search;
mod search_sessions;
mod sso;
mod startup;
mod status;
mod systemd;
mod task_bridge;
mod task_listen;
mod telemetry;
mod ts_client;
mod upstream_login;
mod upstream_tokens;
mod views;
