//! `plexus generate`: shell completions and man pages from the clap types, so what
//! a package ships always matches the binary it ships (`packaging/deb/build`).

use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{Cli, Generated};

/// Writes what `what` names: a completion script on stdout, or the man pages into
/// a directory (exit 1, with the reason on stderr, when it cannot be written).
pub fn run(what: Generated) -> ExitCode {
    let mut command = Cli::command();
    match what {
        Generated::Completions { shell } => {
            clap_complete::generate(shell, &mut command, "plexus", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Generated::Man { out_dir } => {
            let written = std::fs::create_dir_all(&out_dir)
                .and_then(|()| clap_mangen::generate_to(command, &out_dir));
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("cannot write man pages into {}: {error}", out_dir.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}
