//! Tool search measured in process on the registry's own code, shared by
//! `plexus-search-bench` and `plexus-bench`'s search section. Quality: recall@1,
//! @5, @10 and MRR on query files (bfcl-eval's, from `scripts/search-bench-data`),
//! and on hand-written tasks over the catalogs of real MCP servers, with the
//! acceptance measures step coverage@5 and task recall@10. Speed and size on
//! generated catalogs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use registry::{Catalog, CatalogOptions, Kind, UpstreamListing, UpstreamPart};
use serde_json::{json, Value};

fn listing(upstream: &str, tools: Vec<Value>, instructions: Option<String>) -> UpstreamListing {
    let mut listing = UpstreamListing::empty(
        Arc::from(upstream),
        upstream.to_string(),
        Default::default(),
    );
    listing.tools = tools;
    listing.instructions = instructions;
    listing
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Each query's hits: for each wanted tool (a set of alternatives, any of which
/// does), its best rank in the found list, if any.
fn ranks(found: &[String], wanted: &[Vec<String>]) -> Vec<Option<usize>> {
    wanted
        .iter()
        .map(|any| found.iter().position(|name| any.contains(name)))
        .collect()
}

fn found_names(catalog: &Catalog, query: &str, limit: usize) -> Vec<String> {
    catalog
        .search_tools(query, limit, None)
        .unwrap_or_default()
        .into_iter()
        .map(|found| format!("{}/{}", found.upstream, found.tool))
        .collect()
}

/// Recall@1, @5, @10 (each wanted tool counts alike) and MRR (of the first wanted
/// tool found), summed over queries; `finish` averages.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recall {
    pub queries: usize,
    pub at: [f64; 3],
    pub mrr: f64,
}

impl Recall {
    fn add(&mut self, ranks: &[Option<usize>]) {
        self.queries += 1;
        for (slot, k) in [1usize, 5, 10].into_iter().enumerate() {
            let hits = ranks.iter().filter(|rank| rank.is_some_and(|r| r < k));
            self.at[slot] += hits.count() as f64 / ranks.len().max(1) as f64;
        }
        if let Some(first) = ranks.iter().flatten().min() {
            self.mrr += 1.0 / (first + 1) as f64;
        }
    }

    fn finish(mut self) -> Recall {
        let n = self.queries.max(1) as f64;
        self.at = self.at.map(|sum| sum / n);
        self.mrr /= n;
        self
    }
}

impl std::fmt::Display for Recall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recall@1 {:.3}, recall@5 {:.3}, recall@10 {:.3}, MRR {:.3}",
            self.at[0], self.at[1], self.at[2], self.mrr
        )
    }
}

/// A query file's figures: `{"tools": [{"upstream", "tool"}], "queries": [{"query",
/// "expected": ["upstream/tool"]}]}`.
pub fn query_file(path: &Path) -> anyhow::Result<String> {
    let data = read_json(path)?;
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
        .map(|(upstream, tools)| listing(&upstream, tools, None))
        .collect();
    let (catalog, _) = Catalog::build(&listings, &CatalogOptions::default());
    let queries = data["queries"].as_array().context("queries")?;
    let mut recall = Recall::default();
    for query in queries {
        let text = query["query"].as_str().unwrap_or_default();
        let wanted: Vec<Vec<String>> = query["expected"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|name| vec![name.to_string()])
            .collect();
        recall.add(&ranks(&found_names(&catalog, text, 10), &wanted));
    }
    Ok(format!(
        "quality {}: {} tools, {} queries: {}",
        data["source"]
            .as_str()
            .map_or_else(|| path.display().to_string(), str::to_string),
        catalog.len(Kind::Tools),
        queries.len(),
        recall.finish()
    ))
}

/// The figures of hand-written tasks over real servers' catalogs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskFigures {
    pub tools: usize,
    pub servers: usize,
    pub tasks: usize,
    /// One search per step: recall and MRR of the step's tool; recall@5 is the
    /// step coverage@5.
    pub steps: Recall,
    /// One search with the whole task's text: the share of its steps' tools in the
    /// top 10, averaged over tasks.
    pub task_recall_10: f64,
    /// Steps whose tools no listed server has (a server that did not start).
    pub unlisted: usize,
}

impl std::fmt::Display for TaskFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tools of {} servers, {} tasks, {} steps: step coverage@5 {:.3}, task recall@10 {:.3}; \
             per step {}",
            self.tools,
            self.servers,
            self.tasks,
            self.steps.queries,
            self.steps.at[1],
            self.task_recall_10,
            self.steps
        )?;
        if self.unlisted > 0 {
            write!(f, "; {} steps need a server not listed", self.unlisted)?;
        }
        Ok(())
    }
}

/// Measures `tasks` (see `tests/search-bench/mcp-tasks.json`) over `catalog`
/// (`{"servers": [{"upstream", "instructions"?, "tools"}]}`, from
/// `tests/python/list_server_tools.py`).
pub fn tasks(catalog: &Path, tasks: &Path) -> anyhow::Result<TaskFigures> {
    let servers = read_json(catalog)?;
    let listings: Vec<UpstreamListing> = servers["servers"]
        .as_array()
        .context("servers")?
        .iter()
        .map(|server| {
            let upstream = server["upstream"].as_str().context("upstream")?;
            let tools = server["tools"].as_array().context("tools")?.clone();
            let instructions = server["instructions"].as_str().map(str::to_string);
            Ok(listing(upstream, tools, instructions))
        })
        .collect::<anyhow::Result<_>>()?;
    let (catalog, _) = Catalog::build(&listings, &CatalogOptions::default());
    let data = read_json(tasks)?;
    let tasks = data["tasks"].as_array().context("tasks")?;
    let mut steps = Recall::default();
    let mut task_recall = 0f64;
    let mut unlisted = 0;
    // Each query that misses, to see why (not for tuning to this set alone).
    let show_misses = std::env::var_os("PLEXUS_SEARCH_BENCH_MISSES").is_some();
    for task in tasks {
        let mut wanted = Vec::new();
        for step in task["steps"].as_array().context("steps")? {
            let any: Vec<String> = step["tools"]
                .as_array()
                .context("tools")?
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            if !any
                .iter()
                .any(|name| catalog.tool(&exposed(name)).is_some())
            {
                unlisted += 1;
            }
            let query = step["query"].as_str().context("query")?;
            let found = found_names(&catalog, query, 10);
            let rank = ranks(&found, std::slice::from_ref(&any));
            if show_misses && rank[0].is_none_or(|rank| rank >= 5) {
                eprintln!(
                    "step miss: {query:?} wants {any:?}, found {:?}",
                    &found[..found.len().min(5)]
                );
            }
            steps.add(&rank);
            if !wanted.contains(&any) {
                wanted.push(any);
            }
        }
        let text = task["task"].as_str().context("task")?;
        let found = ranks(&found_names(&catalog, text, 10), &wanted);
        task_recall += found.iter().flatten().count() as f64 / wanted.len().max(1) as f64;
    }
    Ok(TaskFigures {
        tools: catalog.len(Kind::Tools),
        servers: listings.len(),
        tasks: tasks.len(),
        steps: steps.finish(),
        task_recall_10: task_recall / tasks.len().max(1) as f64,
        unlisted,
    })
}

/// `upstream/tool` as the catalog names it: the upstream's prefix, `__`, the tool.
fn exposed(name: &str) -> String {
    name.replacen('/', "__", 1)
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
            listing(&format!("up{upstream}"), tools, None)
        })
        .collect()
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len());
    sorted[at - 1]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Search speed, index size and (at `rebuild`) the rebuild after one upstream's
/// `list_changed`, on a generated catalog of `tools`; one line each.
pub fn speed(tools: usize, queries: usize, rebuild: bool) -> Vec<String> {
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
    // Queries: a few words of the catalog's vocabulary, as a task says them.
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
    let mut lines = vec![format!(
        "speed {tools} tools: search p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms over {queries} queries; \
         index {} bytes per tool; cold index build {:.1} ms",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(percentile(&times, 1.0)),
        bytes / tools.max(1),
        ms(cold),
    )];
    if rebuild && !listings.is_empty() {
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
        lines.push(format!(
            "rebuild at {tools} tools after one upstream's list_changed ({per_upstream} tools): \
             p50 {:.1} ms, max {:.1} ms (part, snapshot and index)",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 1.0)),
        ));
    }
    lines
}
