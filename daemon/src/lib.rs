//! The `plexus` daemon: its modules, and `run`, which runs one parsed command
//! through the runner of the module that owns its family (the binary, `main.rs`,
//! only parses, starts logging and exits with the code).

mod access;
mod admin;
mod admin_client;
mod app;
mod audit;
mod catalog_host;
pub mod cli;
mod client_message;
mod cluster;
mod config;
mod connect_command;
mod console;
mod control;
mod descriptors;
mod era;
mod explore_command;
mod fanout;
mod generate_command;
mod http_front;
mod hub;
mod jsonrpc;
mod listener;
mod logging;
mod login_command;
mod memory;
mod metrics;
mod own_stdio;
mod pins;
mod pins_command;
mod progress;
mod recent_calls;
mod repoll;
mod session;
mod sso;
mod status;
mod stdio_front;
mod systemd;
mod tasks;
mod telemetry;
mod upstreams;

use std::process::ExitCode;

use admin_client::AdminCommand;
use cli::Command;
use explore_command::Exploration;

/// Runs `command` to its end: the process's exit code.
pub fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve {
            config,
            stdio,
            view,
        } => app::serve(config.path, stdio, view),
        Command::CheckConfig { config } => app::check_config(&config.path),
        Command::Explore { target, options } => {
            explore_command::run(&target, &options, Exploration::Explore)
        }
        Command::Schema {
            target,
            tool,
            options,
        } => explore_command::run(&target, &options, Exploration::Schema(tool)),
        Command::Hash { target, options } => {
            explore_command::run(&target, &options, Exploration::Hash)
        }
        Command::Call {
            target,
            tool,
            arguments,
            options,
        } => explore_command::call(&target, tool, arguments, &options),
        Command::Reload { daemon } => admin_client::run(&daemon, AdminCommand::Reload),
        Command::Status { daemon, json } => {
            admin_client::run(&daemon, AdminCommand::Status { json })
        }
        Command::Restart { upstream, daemon } => {
            admin_client::run(&daemon, AdminCommand::Restart(upstream))
        }
        Command::Pins {
            action,
            daemon,
            json,
        } => pins_command::run(action, &daemon, json),
        Command::Connect {
            url,
            config,
            token_file,
            view,
        } => connect_command::run(
            url,
            config.as_deref(),
            token_file.as_deref(),
            view.as_deref(),
        ),
        Command::Login {
            upstream,
            status,
            device,
            config,
        } => match upstream {
            Some(upstream) if !status => login_command::login(&upstream, &config.path, device),
            _ => login_command::status(&config.path),
        },
        Command::Logout { upstream, config } => login_command::logout(&upstream, &config.path),
        Command::Health { daemon } => admin_client::run(&daemon, AdminCommand::Health),
        Command::Generate { what } => generate_command::run(what),
        Command::Keeper => {
            // No logging, no runtime: it only waits for its input to end.
            adapters::keeper::run_keeper(std::io::stdin().lock());
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod testing;

/// Counts each test thread's allocations, for the parsers' randomized tests.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: mutations::Counting = mutations::Counting;
