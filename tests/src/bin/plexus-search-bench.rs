//! plexus-search-bench: tool search measured in process on the registry's own code
//! (`plexus_tests::search_bench`). Quality on query files (`--quality FILE`, e.g.
//! bfcl-eval's from `scripts/search-bench-data`) and on hand-written tasks over
//! real MCP servers' catalogs (`--catalog`, `--tasks`); speed and size at 10,000
//! and 100,000 generated tools. Build it with `--release`.

use std::path::PathBuf;

use clap::Parser;
use plexus_tests::search_bench;

#[derive(Parser, Debug)]
#[command(name = "plexus-search-bench")]
struct Cli {
    /// Query files: `{"tools": [{"upstream", "tool"}], "queries": [{"query", "expected": ["upstream/tool"]}]}`.
    #[arg(long, value_name = "FILE")]
    quality: Vec<PathBuf>,
    /// Real servers' tools, as `tests/python/list_server_tools.py` writes them
    /// (`scripts/search-bench-data`); measured with `--tasks` when present.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "target/search-bench/mcp-servers.json"
    )]
    catalog: PathBuf,
    /// Hand-written tasks over `--catalog`.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "tests/search-bench/mcp-tasks.json"
    )]
    tasks: PathBuf,
    /// Leave out the speed and size figures.
    #[arg(long)]
    no_speed: bool,
    /// Queries timed per catalog size.
    #[arg(long, default_value_t = 2000)]
    queries: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    for path in &cli.quality {
        println!("{}", search_bench::query_file(path)?);
    }
    if cli.catalog.exists() {
        println!(
            "quality mcp tasks: {}",
            search_bench::tasks(&cli.catalog, &cli.tasks)?
        );
    } else {
        println!(
            "quality mcp tasks: skipped, no {} (scripts/search-bench-data lists it)",
            cli.catalog.display()
        );
    }
    if !cli.no_speed {
        for tools in [10_000, 100_000] {
            for line in search_bench::speed(tools, cli.queries, tools == 10_000) {
                println!("{line}");
            }
        }
    }
    Ok(())
}
