//! Scale figures: a daemon's start time and memory with many upstreams, the
//! memory an open HTTP session costs it, and what a catalog of thousands of tools
//! costs (ready time, memory, a page, every page, a rebuild).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::{fixture_upstream, Daemon, RawHttpSession};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

/// How long many upstreams may take to come up on a slow machine.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts a daemon with `upstreams` fixture upstreams and prints how long it took
/// to listen and to have every upstream ready, and its resident memory then.
pub async fn upstreams(upstreams: usize) -> anyhow::Result<()> {
    let sections: String = (0..upstreams)
        .map(|n| fixture_upstream(&format!("fx{n}"), "", &["--name", &format!("fx{n}")]))
        .collect();
    let started = Instant::now();
    let daemon = Daemon::start("", &sections)
        .await
        .context("starting plexus")?;
    let listening = started.elapsed();
    daemon
        .wait_ready(READY_TIMEOUT)
        .await
        .context("waiting for the upstreams")?;
    let ready = started.elapsed();
    let rss = rss_kib(&daemon)?;
    println!(
        "{upstreams} fixture upstreams: listening after {} ms, all ready after {} ms (±100), daemon RSS {:.1} MiB",
        listening.as_millis(),
        ready.as_millis(),
        rss as f64 / 1024.0
    );
    stop(daemon).await
}

/// Opens `sessions` HTTP sessions to an otherwise idle daemon and prints its
/// resident memory before and after, and the difference per session.
pub async fn sessions(sessions: usize) -> anyhow::Result<()> {
    let limits = format!(
        "max_sessions = {0}\nmax_sessions_per_principal = {0}",
        sessions + 10
    );
    let daemon = Daemon::start(&limits, &fixture_upstream("bench", "", &[]))
        .await
        .context("starting plexus")?;
    daemon
        .wait_ready(READY_TIMEOUT)
        .await
        .context("waiting for the upstream")?;
    // One client: its pooled connection carries every session, so what is counted
    // is sessions, not TCP connections.
    let http = reqwest::Client::new();
    // One session first, so lazily allocated state is not charged to the others.
    open_session(&http, &daemon.url).await?;
    let before = rss_kib(&daemon)?;
    for n in 0..sessions {
        open_session(&http, &daemon.url)
            .await
            .with_context(|| format!("opening session {n}"))?;
    }
    let after = rss_kib(&daemon)?;
    println!(
        "{sessions} open HTTP sessions: daemon RSS {:.1} → {:.1} MiB, {:.1} KiB per session",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / sessions.max(1) as f64
    );
    stop(daemon).await
}

/// `initialize` and `notifications/initialized`: a session the daemon keeps open.
async fn open_session(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let post = |body: Value| {
        http.post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(&body)
    };
    let response = post(json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "plexus-bench", "version": "0"}}
    }))
    .send()
    .await?;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.text().await?;
    let Some(session) = session.filter(|_| status.is_success()) else {
        bail!("initialize answered {status} without a session: {body:.500}");
    };
    let status = post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .header("mcp-session-id", session)
        .send()
        .await?
        .status();
    if !status.is_success() {
        bail!("notifications/initialized answered {status}");
    }
    Ok(())
}

/// The daemon's resident set size in KiB, from `/proc/<pid>/status`.
fn rss_kib(daemon: &Daemon) -> anyhow::Result<u64> {
    status_kib(daemon, "VmRSS:")
}

/// The anonymous part of it (the heap, not the binary's pages): steadier from start
/// to start, since which code pages are resident varies.
fn anon_kib(daemon: &Daemon) -> anyhow::Result<u64> {
    status_kib(daemon, "RssAnon:")
}

fn status_kib(daemon: &Daemon, field: &str) -> anyhow::Result<u64> {
    let pid = daemon.pid().context("plexus has no pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// The median of memory samples, taken at least once; sorts them, so their first
/// and last are the range.
fn median_kib(samples: &mut [u64]) -> u64 {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

async fn stop(daemon: Daemon) -> anyhow::Result<()> {
    let status = daemon.stop().await.context("stopping plexus")?;
    if !status.success() {
        bail!("plexus exited with {status}");
    }
    Ok(())
}

/// The size of the catalog figures: `upstreams` fixtures with `tools` extra tools each.
#[derive(Clone, Copy, Debug)]
pub struct CatalogScale {
    pub upstreams: usize,
    pub tools: usize,
    /// How many times each memory figure (idle, fresh, restarted) is taken; the
    /// median counts.
    pub samples: usize,
}

impl CatalogScale {
    /// 10 × 1,000 tools, or 2 × 50 for a smoke run.
    pub fn of(quick: bool) -> CatalogScale {
        if quick {
            CatalogScale {
                upstreams: 2,
                tools: 50,
                samples: 1,
            }
        } else {
            CatalogScale {
                upstreams: 10,
                tools: 1000,
                samples: 3,
            }
        }
    }
}

/// Tools every fixture lists without `--extra-tools`.
const FIXTURE_TOOLS: usize = 6;
/// How many times a walk, a serialisation or a page is measured; the median counts.
const WALKS: usize = 5;
const PAGES: usize = 200;
/// How long the memory of a daemon that just became ready is left to settle (it
/// returns free memory once its catalog has been quiet for a second).
const SETTLE: Duration = Duration::from_millis(2000);
/// After [`SETTLE`], how often memory is read again until it has stayed within
/// [`SETTLED_WITHIN_KIB`] for [`SETTLED_READINGS`] readings in a row, for at most
/// [`SETTLE_AT_MOST`]. The window (1.5 s) is longer than the daemon's own wait before
/// it releases memory (1 s of quiet), so a release still due shows as a change: a
/// fresh listing that arrives after ready (a restart serves its cached listings
/// first) delays it, and one reading could land before it.
const SETTLE_STEP: Duration = Duration::from_millis(500);
const SETTLED_WITHIN_KIB: u64 = 64;
const SETTLED_READINGS: usize = 3;
const SETTLE_AT_MOST: Duration = Duration::from_secs(12);

/// `(RSS, anonymous RSS)` in KiB once they have settled (see [`SETTLE_STEP`]).
async fn settled_memory(daemon: &Daemon) -> anyhow::Result<(u64, u64)> {
    tokio::time::sleep(SETTLE).await;
    let started = Instant::now();
    let mut last = (rss_kib(daemon)?, anon_kib(daemon)?);
    let mut steady = 0;
    while steady < SETTLED_READINGS && started.elapsed() < SETTLE_AT_MOST {
        tokio::time::sleep(SETTLE_STEP).await;
        let now = (rss_kib(daemon)?, anon_kib(daemon)?);
        steady = if now.1.abs_diff(last.1) <= SETTLED_WITHIN_KIB {
            steady + 1
        } else {
            0
        };
        last = now;
    }
    Ok(last)
}

/// A catalog of `scale.upstreams × scale.tools` tools: time to ready (and at twice
/// the upstreams, for linearity), memory beyond an idle daemon's against the JSON
/// size of the definitions, one page against a 10-tool catalog's, every page against
/// serde_json serialising the same tools, and one upstream's rebuild.
pub async fn catalog(scale: CatalogScale) -> anyhow::Result<()> {
    let expected = scale.upstreams * (FIXTURE_TOOLS + scale.tools);

    // Idle and loaded daemons alternate, so drift on a noisy machine hits both;
    // where a daemon's memory lands varies from start to start, so each figure is
    // the median of a few.
    let drift = tempfile::NamedTempFile::new().context("creating the drift file")?;
    let sections = extra_upstreams(scale.upstreams, scale.tools, Some(drift.path()));
    let (mut idle, mut fresh, mut readies) = (Vec::new(), Vec::new(), Vec::new());
    let (mut idle_anon, mut fresh_anon, mut restarted_anon) = (Vec::new(), Vec::new(), Vec::new());
    let mut loaded = None;
    for _ in 0..scale.samples.max(1) {
        let daemon = Daemon::start("", &extra_upstreams(scale.upstreams, 0, None))
            .await
            .context("starting the idle daemon")?;
        wait_ready_closely(&daemon).await?;
        let (rss, anon) = settled_memory(&daemon).await?;
        idle.push(rss);
        idle_anon.push(anon);
        stop(daemon).await?;

        if let Some(daemon) = loaded.take() {
            stop(daemon).await?;
        }
        let started = Instant::now();
        let daemon = Daemon::start("", &sections)
            .await
            .context("starting plexus")?;
        wait_ready_closely(&daemon).await?;
        readies.push(started.elapsed());
        let (rss, anon) = settled_memory(&daemon).await?;
        fresh.push(rss);
        fresh_anon.push(anon);
        loaded = Some(daemon);
    }
    let mut daemon = loaded.context("no daemon was started")?;
    let ready = median(&mut readies);
    let (idle_rss, rss) = (median_kib(&mut idle), median_kib(&mut fresh));

    // The same again on the state it left: pins and listings read from disk.
    let mut restarted = Vec::with_capacity(scale.samples);
    for _ in 0..scale.samples.max(1) {
        let (status, dir) = daemon.stop_keeping_state().await?;
        ensure!(status.success(), "plexus exited with {status}");
        daemon = Daemon::start_in(dir, "", &sections)
            .await
            .context("restarting plexus on its state")?;
        wait_ready_closely(&daemon).await?;
        let (rss, anon) = settled_memory(&daemon).await?;
        restarted.push(rss);
        restarted_anon.push(anon);
    }
    let rss_restarted = median_kib(&mut restarted);

    let mut lister = Lister::open(&daemon.url).await?;
    let pid = daemon.pid().context("plexus has no pid")?;
    let mut walks = Vec::new();
    let mut walk_cpu = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..WALKS {
        let cpu_before = cpu_time(pid)?;
        let (took, walked) = lister.walk().await?;
        walk_cpu.push(cpu_time(pid)?.saturating_sub(cpu_before));
        walks.push(took);
        bodies = walked;
    }
    let tools = check_walk(&bodies, expected, scale)?;
    lister.check_call(scale).await?;
    let json_bytes: usize = tools
        .iter()
        .map(|tool| serde_json::to_vec(tool).map(|bytes| bytes.len()))
        .sum::<Result<_, _>>()?;
    let mut serialisations = Vec::new();
    for _ in 0..WALKS {
        let started = Instant::now();
        let bytes = serde_json::to_vec(&tools)?;
        serialisations.push(started.elapsed());
        ensure!(
            bytes.len() >= json_bytes,
            "serialised fewer bytes than listed"
        );
    }
    let (walk, serialise) = (median(&mut walks), median(&mut serialisations));
    let walk_cpu = median(&mut walk_cpu);

    let rebuild = rebuild_after_list_changed(&daemon, drift.path()).await?;
    stop(daemon).await?;

    // Twice the upstreams, for linearity; pages of 10, so a page holds what a
    // 10-tool catalog's whole list does.
    let twice = extra_upstreams(scale.upstreams * 2, scale.tools, None);
    let started = Instant::now();
    let daemon = Daemon::start("page_size = 10", &twice)
        .await
        .context("starting plexus with twice the upstreams")?;
    wait_ready_closely(&daemon).await?;
    let ready_twice = started.elapsed();
    let total_twice = 2 * expected;
    let middle = registry::cursor::encode(total_twice / 2);
    let page_big = Lister::open(&daemon.url)
        .await?
        .time_page(Some(&middle), true)
        .await?;
    stop(daemon).await?;

    let small = fixture_upstream("small", "", &["--extra-tools", "4"]);
    let daemon = Daemon::start("page_size = 10", &small)
        .await
        .context("starting plexus with 10 tools")?;
    wait_ready_closely(&daemon).await?;
    let page_small = Lister::open(&daemon.url)
        .await?
        .time_page(None, false)
        .await?;
    stop(daemon).await?;

    let kib = |k: u64| k as f64 / 1024.0;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let extra_kib = rss.saturating_sub(idle_rss);
    println!(
        "catalog of {} upstreams × {} tools ({expected} tools, {:.2} MB of definitions):",
        scale.upstreams,
        scale.tools,
        json_bytes as f64 / 1e6
    );
    println!(
        "  ready after {:.0} ms (median of {}); {} upstreams ({total_twice} tools): {:.0} ms ({:.2}× for 2× the tools)",
        ms(ready),
        scale.samples.max(1),
        scale.upstreams * 2,
        ms(ready_twice),
        ms(ready_twice) / ms(ready)
    );
    let times_json = |rss: u64| (rss.saturating_sub(idle_rss) * 1024) as f64 / json_bytes as f64;
    let samples = scale.samples.max(1);
    println!(
        "  daemon RSS {:.1} MiB, idle with the same upstreams {:.1} MiB (medians of {samples} starts each): {:.1} MiB more, {:.2}× [{:.2}–{:.2}] the definitions' JSON",
        kib(rss),
        kib(idle_rss),
        kib(extra_kib),
        times_json(rss),
        times_json(fresh[0]),
        times_json(fresh[fresh.len() - 1]),
    );
    let extra_restarted = rss_restarted.saturating_sub(idle_rss);
    println!(
        "  restarted on its pins and cached listings ({samples} times, median [min–max]): daemon RSS {:.1} MiB, {:.1} MiB more, {:.2}× [{:.2}–{:.2}] the definitions' JSON",
        kib(rss_restarted),
        kib(extra_restarted),
        times_json(rss_restarted),
        times_json(restarted[0]),
        times_json(restarted[restarted.len() - 1]),
    );
    let idle_anon = median_kib(&mut idle_anon);
    let anon_times_json =
        |anon: u64| (anon.saturating_sub(idle_anon) * 1024) as f64 / json_bytes as f64;
    println!(
        "  anonymous memory (RssAnon, medians), beyond an idle daemon's {:.1} MiB: {:.2}× the definitions' JSON fresh, {:.2}× restarted",
        kib(idle_anon),
        anon_times_json(median_kib(&mut fresh_anon)),
        anon_times_json(median_kib(&mut restarted_anon)),
    );
    println!(
        "  one tools/list page of 10 from the middle of {total_twice} tools: {:.0} µs; of a 10-tool catalog: {:.0} µs ({:.2}×)",
        page_big.as_secs_f64() * 1e6,
        page_small.as_secs_f64() * 1e6,
        page_big.as_secs_f64() / page_small.as_secs_f64()
    );
    println!(
        "  every page ({} pages of up to 100): {:.1} ms, {:.1} ms of the daemon's CPU; serde_json serialising the same tools: {:.1} ms ({:.2}× wall, {:.2}× CPU)",
        bodies.len(),
        ms(walk),
        ms(walk_cpu),
        ms(serialise),
        ms(walk) / ms(serialise),
        ms(walk_cpu) / ms(serialise)
    );
    println!(
        "  rebuild after one upstream's list_changed: {:.2} ms (mean of {} rebuilds)",
        rebuild.0 * 1e3,
        rebuild.1
    );
    Ok(())
}

/// `count` fixture upstreams `fx0`… with `tools` extra tools each; the first one
/// drifts as `drift` says, if given.
fn extra_upstreams(count: usize, tools: usize, drift: Option<&Path>) -> String {
    let tools = tools.to_string();
    (0..count)
        .map(|n| {
            let name = format!("fx{n}");
            let mut args = vec!["--name", &name, "--extra-tools", &tools];
            let drift = drift.map(|path| path.display().to_string());
            if let (0, Some(path)) = (n, &drift) {
                args.extend(["--drift-file", path]);
            }
            fixture_upstream(&name, "", &args)
        })
        .collect()
}

/// Polls `/readyz` every 10 ms (the harness's 100 ms would blur a start of a second).
async fn wait_ready_closely(daemon: &Daemon) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let response = client
            .get(format!("{}/readyz", daemon.admin))
            .send()
            .await?;
        if response.status().is_success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "upstreams not ready after {READY_TIMEOUT:?}\n{}",
                daemon.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the timed walk reads of a page: how many tools, and where the next starts.
#[derive(Deserialize)]
struct PageHead {
    result: PageResult,
}

#[derive(Deserialize)]
struct PageResult {
    tools: Vec<IgnoredAny>,
    #[serde(rename = "nextCursor")]
    next_cursor: Option<String>,
}

/// `tools/list` over one HTTP session, its bodies kept as bytes so the client's own
/// parsing stays out of the timings.
struct Lister {
    http: reqwest::Client,
    url: String,
    session: String,
    next_id: u64,
}

impl Lister {
    async fn open(url: &str) -> anyhow::Result<Lister> {
        let raw = RawHttpSession::connect(url).await?;
        Ok(Lister {
            http: reqwest::Client::new(),
            url: url.to_string(),
            session: raw.session_id().context("initialize gave no session")?,
            next_id: 0,
        })
    }

    async fn post(&mut self, method: &str, params: Value) -> anyhow::Result<Vec<u8>> {
        self.next_id += 1;
        let message =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .body(serde_json::to_vec(&message)?)
            .send()
            .await?;
        let status = response.status();
        let body = response.bytes().await?.to_vec();
        ensure!(
            status.is_success(),
            "{method} answered {status}: {:.300}",
            String::from_utf8_lossy(&body)
        );
        Ok(body)
    }

    async fn page(&mut self, cursor: Option<&str>) -> anyhow::Result<(Vec<u8>, PageResult)> {
        let params = match cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        };
        let body = self.post("tools/list", params).await?;
        let head: PageHead = serde_json::from_slice(&body).with_context(|| {
            format!(
                "not a tools/list result: {:.300}",
                String::from_utf8_lossy(&body)
            )
        })?;
        Ok((body, head.result))
    }

    /// Every page, first to last: how long it took and each page's body.
    async fn walk(&mut self) -> anyhow::Result<(Duration, Vec<Vec<u8>>)> {
        let started = Instant::now();
        let mut bodies = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let (body, page) = self.page(cursor.as_deref()).await?;
            bodies.push(body);
            match page.next_cursor {
                Some(next) => {
                    ensure!(!page.tools.is_empty(), "an empty page before the last");
                    cursor = Some(next);
                }
                None => return Ok((started.elapsed(), bodies)),
            }
        }
    }

    /// The median time of one page at `cursor` (of 10 tools, with a next page or
    /// not as `more` says).
    async fn time_page(&mut self, cursor: Option<&str>, more: bool) -> anyhow::Result<Duration> {
        let mut times = Vec::with_capacity(PAGES);
        for round in 0..PAGES + PAGES / 10 {
            let started = Instant::now();
            let (_, page) = self.page(cursor).await?;
            let took = started.elapsed();
            ensure!(
                page.tools.len() == 10 && page.next_cursor.is_some() == more,
                "a page of {} tools, next cursor {:?}",
                page.tools.len(),
                page.next_cursor
            );
            // The first tenth warms the connection and the session up.
            if round >= PAGES / 10 {
                times.push(took);
            }
        }
        Ok(median(&mut times))
    }

    /// One extra tool called through the daemon echoes its arguments.
    async fn check_call(&mut self, scale: CatalogScale) -> anyhow::Result<()> {
        let name = format!("fx{}__extra_{:04}", scale.upstreams - 1, scale.tools - 1);
        let arguments = json!({"query": "plexus", "limit": 3});
        let body = self
            .post("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        let answer: Value = serde_json::from_slice(&body)?;
        let text = answer
            .pointer("/result/content/0/text")
            .and_then(Value::as_str)
            .with_context(|| format!("{name} answered {answer}"))?;
        ensure!(
            serde_json::from_str::<Value>(text)? == arguments,
            "{name} echoed {text}"
        );
        Ok(())
    }
}

/// Every tool the walk read, checked: the count expected, names unique, each
/// extra tool of every upstream there with its schema.
fn check_walk(
    bodies: &[Vec<u8>],
    expected: usize,
    scale: CatalogScale,
) -> anyhow::Result<Vec<Value>> {
    let mut tools = Vec::with_capacity(expected);
    for body in bodies {
        let mut page: Value = serde_json::from_slice(body)?;
        match page.pointer_mut("/result/tools").map(Value::take) {
            Some(Value::Array(listed)) => tools.extend(listed),
            _ => bail!("a page without tools: {page:.300}"),
        }
    }
    ensure!(
        tools.len() == expected,
        "walked {} tools, expected {expected}",
        tools.len()
    );
    let names: HashSet<&str> = tools
        .iter()
        .map(|tool| tool.get("name").and_then(Value::as_str).unwrap_or_default())
        .collect();
    ensure!(
        names.len() == expected,
        "{} distinct names among {expected} tools",
        names.len()
    );
    for upstream in 0..scale.upstreams {
        for index in [0, scale.tools / 2, scale.tools - 1] {
            let name = format!("fx{upstream}__extra_{index:04}");
            ensure!(names.contains(name.as_str()), "{name} is not listed");
        }
    }
    ensure!(
        tools
            .iter()
            .all(|tool| tool.pointer("/inputSchema/type") == Some(&json!("object"))),
        "a tool without an object inputSchema"
    );
    Ok(tools)
}

/// Makes the first upstream change one tool's description and waits for the
/// rebuilds that follow: their mean duration in seconds, and how many there were,
/// from the daemon's `plexus_catalog_rebuild_seconds`.
async fn rebuild_after_list_changed(daemon: &Daemon, drift: &Path) -> anyhow::Result<(f64, u64)> {
    let (sum_before, count_before) = rebuild_histogram(daemon).await?;
    std::fs::write(drift, "description").context("writing the drift file")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while rebuild_histogram(daemon).await?.1 == count_before {
        if Instant::now() > deadline {
            bail!("no rebuild after list_changed\n{}", daemon.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The upstream's three list_changed notifications are debounced into one re-list;
    // let anything after it land too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sum, count) = rebuild_histogram(daemon).await?;
    let rebuilds = count - count_before;
    Ok(((sum - sum_before) / rebuilds as f64, rebuilds))
}

/// `plexus_catalog_rebuild_seconds`'s sum and count, from the admin `/metrics`.
async fn rebuild_histogram(daemon: &Daemon) -> anyhow::Result<(f64, u64)> {
    let (status, text) = daemon.admin_get("/metrics").await?;
    ensure!(status == 200, "/metrics answered {status}");
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .with_context(|| format!("no {name} in /metrics"))
    };
    let sum = value("plexus_catalog_rebuild_seconds_sum")?;
    let count = value("plexus_catalog_rebuild_seconds_count")?;
    Ok((sum, count as u64))
}

/// CPU time a process has used so far, every thread's, from `/proc/<pid>/task/*/schedstat`
/// (nanoseconds; `/proc/<pid>/stat` counts in 10 ms ticks, too coarse here).
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let mut total = 0u64;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of {pid}"))?;
    for task in tasks {
        // A thread that ended since the listing has nothing more to add.
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue;
        };
        let nanoseconds = text
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok());
        total += nanoseconds.with_context(|| format!("an unreadable schedstat: {text}"))?;
    }
    Ok(Duration::from_nanos(total))
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}
