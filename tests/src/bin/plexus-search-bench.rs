//! plexus-search-bench: tool search measured in process on the registry's own code.
//! Quality (`--quality FILE`, e.g. from `scripts/search-bench-data`): recall@1, @5,
//! @10 and MRR of each query's expected tools. Speed and size on generated catalogs:
//! search p50/p99 at 10,000 and 100,000 tools, index bytes per tool, and the rebuild
//! after one upstream's `list_changed` at 10,000 tools. Build it with `--release`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use registry::{Catalog, CatalogOptions, Kind, UpstreamListing, UpstreamPart};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(name = "plexus-search-bench")]
struct Cli {
    /// Benchmark files: `{"tools": [{"upstream", "tool"}], "queries": [{"query", "expected": ["upstream/tool"]}]}`.
    #[arg(long, value_name = "FILE")]
    quality: Vec<PathBuf>,
    /// Leave out the speed and size figures.
    #[arg(long)]
    no_speed: bool,
    /// Queries timed per catalog size.
    #[arg(long, default_value_t = 2000)]
    queries: usize,
}

fn listing(upstream: &str, tools: Vec<Value>) -> UpstreamListing {
    UpstreamListing {
        upstream: Arc::from(upstream),
        prefix: upstream.to_string(),
        tool_filter: Default::default(),
        tools,
        prompts: Vec::new(),
        resources: Vec::new(),
        resource_templates: Vec::new(),
        instructions: None,
        quarantine: Default::default(),
        cache: [None; 4],
    }
}

fn quality(path: &PathBuf) -> anyhow::Result<()> {
    let data: Value = serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    let mut by_upstream: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for entry in data["tools"].as_array().context("tools")? {
        let upstream = entry["upstream"].as_str().context("upstream")?;
        by_upstream
            .entry(upstream.to_string())
            .or_default()
            .push(entry["tool"].clone());
    }
    let listings: Vec<UpstreamListing> = by_upstream
        .into_iter()
        .map(|(upstream, tools)| listing(&upstream, tools))
        .collect();
    let (catalog, _) = Catalog::build(&listings, &CatalogOptions::default());
    let queries = data["queries"].as_array().context("queries")?;
    let (mut recall, mut reciprocal) = ([0f64; 3], 0f64);
    for query in queries {
        let text = query["query"].as_str().unwrap_or_default();
        let expected: Vec<&str> = query["expected"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let found: Vec<String> = catalog
            .search_tools(text, 10, None)
            .unwrap_or_default()
            .into_iter()
            .map(|found| format!("{}/{}", found.upstream, found.tool))
            .collect();
        for (slot, k) in [1usize, 5, 10].into_iter().enumerate() {
            let hits = expected
                .iter()
                .filter(|name| found.iter().take(k).any(|f| f == *name))
                .count();
            recall[slot] += hits as f64 / expected.len().max(1) as f64;
        }
        if let Some(rank) = found.iter().position(|f| expected.contains(&f.as_str())) {
            reciprocal += 1.0 / (rank + 1) as f64;
        }
    }
    let n = queries.len().max(1) as f64;
    println!(
        "quality {}: {} tools, {} queries: recall@1 {:.3}, recall@5 {:.3}, recall@10 {:.3}, MRR {:.3}",
        data["source"].as_str().unwrap_or(&path.display().to_string()),
        catalog.len(Kind::Tools),
        queries.len(),
        recall[0] / n,
        recall[1] / n,
        recall[2] / n,
        reciprocal / n
    );
    Ok(())
}

/// A small deterministic generator: the same catalog every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn pick<'a>(&mut self, words: &'a [String]) -> &'a str {
        &words[(self.next() as usize) % words.len()]
    }
}

/// About 4,000 distinct words, as a large real catalog has.
fn vocabulary() -> Vec<String> {
    let onsets = [
        "b", "c", "d", "f", "g", "l", "m", "n", "p", "r", "s", "t", "v", "st", "tr", "pl",
    ];
    let vowels = ["a", "e", "i", "o", "u"];
    let codas = ["", "n", "r", "s", "t", "l", "nd", "ck", "m", "x"];
    let mut words = Vec::new();
    for onset in onsets {
        for vowel in vowels {
            for coda in codas {
                for second in ["", "er", "ing", "ion", "ate"] {
                    words.push(format!("{onset}{vowel}{coda}{second}"));
                }
            }
        }
    }
    words
}

fn generated_tool(rng: &mut Lcg, words: &[String], number: usize) -> Value {
    let name = format!("{}_{}_{number}", rng.pick(words), rng.pick(words));
    let length = 12 + (rng.next() % 14) as usize;
    let description: Vec<&str> = (0..length).map(|_| rng.pick(words)).collect();
    let mut properties = serde_json::Map::new();
    for _ in 0..(2 + rng.next() % 3) {
        let about: Vec<&str> = (0..6).map(|_| rng.pick(words)).collect();
        properties.insert(
            rng.pick(words).to_string(),
            json!({"type": "string", "description": about.join(" ")}),
        );
    }
    json!({"name": name, "description": description.join(" ") + ".",
           "inputSchema": {"type": "object", "properties": properties}})
}

fn generated(tools: usize, per_upstream: usize, seed: u64) -> Vec<UpstreamListing> {
    let words = vocabulary();
    let mut rng = Lcg(seed);
    (0..tools.div_ceil(per_upstream))
        .map(|upstream| {
            let count = per_upstream.min(tools - upstream * per_upstream);
            let tools = (0..count)
                .map(|index| generated_tool(&mut rng, &words, upstream * per_upstream + index))
                .collect();
            listing(&format!("up{upstream}"), tools)
        })
        .collect()
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let at = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len());
    sorted[at - 1]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn speed(tools: usize, queries: usize) {
    let per_upstream = 200;
    let listings = generated(tools, per_upstream, 7);
    let parts: Vec<Arc<UpstreamPart>> = listings
        .iter()
        .map(|listing| Arc::new(UpstreamPart::build(listing, 64).0))
        .collect();
    let options = CatalogOptions::default();
    let (catalog, _) = Catalog::assemble(parts.clone(), &options);
    let started = Instant::now();
    let index = catalog.search_index();
    let cold = started.elapsed();
    let bytes: usize = index.heap_bytes()
        + index
            .part_indexes()
            .map(|part| part.heap_bytes())
            .sum::<usize>();
    // Queries: a few words of a random tool's description, as a task says them.
    let words = vocabulary();
    let mut rng = Lcg(99);
    let mut times = Vec::with_capacity(queries);
    for _ in 0..queries {
        let length = 2 + (rng.next() % 6) as usize;
        let query: Vec<&str> = (0..length).map(|_| rng.pick(&words)).collect();
        let query = query.join(" ");
        let started = Instant::now();
        let found = catalog.search_tools(&query, 10, None).unwrap_or_default();
        times.push(started.elapsed());
        std::hint::black_box(found);
    }
    times.sort_unstable();
    println!(
        "speed {tools} tools: search p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms over {queries} queries; \
         index {} bytes per tool; cold index build {:.1} ms",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(percentile(&times, 1.0)),
        bytes / tools.max(1),
        ms(cold),
    );
    if tools == 10_000 {
        // One upstream lists again (one tool changed): its part is built anew, the
        // snapshot assembled, and the index put together with only that part analysed.
        let mut changed = listings[0].clone();
        changed.tools[0] = generated_tool(&mut Lcg(5), &words, 0);
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let mut parts = parts.clone();
            parts[0] = Arc::new(UpstreamPart::build(&changed, 64).0);
            let (catalog, _) = Catalog::assemble(parts, &options);
            std::hint::black_box(catalog.search_index());
            times.push(started.elapsed());
        }
        times.sort_unstable();
        println!(
            "rebuild at {tools} tools after one upstream's list_changed ({per_upstream} tools): \
             p50 {:.1} ms, max {:.1} ms (part, snapshot and index)",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 1.0)),
        );
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    for path in &cli.quality {
        quality(path)?;
    }
    if !cli.no_speed {
        for tools in [10_000, 100_000] {
            speed(tools, cli.queries);
        }
    }
    Ok(())
}
