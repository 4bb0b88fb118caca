//! Scale figures: a daemon's start time and memory with many upstreams, the
//! memory an open HTTP session costs it, and what a catalog of thousands of tools
//! costs (ready time, memory, a page, every page, a rebuild).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plexus_tests::{fixture_upstream, Daemon, RawHttpSession};

use crate::report::Spread;
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
    let daemon = Daemon::builder()
        .upstreams(&sections)
        .start()
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
    let daemon = Daemon::builder()
        .daemon(&limits)
        .upstreams(fixture_upstream("bench", "", &[]))
        .start()
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
    /// Rounds of a walk of every page and a serialisation of the same tools.
    pub walk_rounds: usize,
    /// Rounds of [`PAGES`] pages of the large catalog and of a small one.
    pub page_rounds: usize,
    /// Whether memory is left to settle before it is read ([`settled_memory`]); a
    /// smoke run reads it at once, its figures being no measure anyway.
    pub settle: bool,
}

impl CatalogScale {
    /// 10 × 1,000 tools, or 2 × 50 for a smoke run.
    pub fn of(quick: bool) -> CatalogScale {
        if quick {
            CatalogScale {
                upstreams: 2,
                tools: 50,
                samples: 1,
                walk_rounds: 2,
                page_rounds: 1,
                settle: false,
            }
        } else {
            CatalogScale {
                upstreams: 10,
                tools: 1000,
                samples: 3,
                walk_rounds: 9,
                page_rounds: 7,
                settle: true,
            }
        }
    }
}

/// Tools every fixture lists without `--extra-tools`.
const FIXTURE_TOOLS: usize = 6;
/// Pages timed in each round of [`CatalogScale::page_rounds`]; their median counts.
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
async fn settled_memory(daemon: &Daemon, settle: bool) -> anyhow::Result<(u64, u64)> {
    if !settle {
        return Ok((rss_kib(daemon)?, anon_kib(daemon)?));
    }
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
    let sections = extra_upstreams(scale.upstreams, scale.tools, Some(drift.path()), "");
    let (mut idle, mut fresh, mut readies) = (Vec::new(), Vec::new(), Vec::new());
    let (mut idle_anon, mut fresh_anon, mut restarted_anon) = (Vec::new(), Vec::new(), Vec::new());
    let mut loaded = None;
    for _ in 0..scale.samples.max(1) {
        let daemon = Daemon::builder()
            .upstreams(extra_upstreams(scale.upstreams, 0, None, ""))
            .start()
            .await
            .context("starting the idle daemon")?;
        wait_ready_closely(&daemon).await?;
        let (rss, anon) = settled_memory(&daemon, scale.settle).await?;
        idle.push(rss);
        idle_anon.push(anon);
        stop(daemon).await?;

        let daemon = restart_timed(loaded.take(), "", &sections, &mut readies).await?;
        let (rss, anon) = settled_memory(&daemon, scale.settle).await?;
        fresh.push(rss);
        fresh_anon.push(anon);
        loaded = Some(daemon);
    }
    let mut daemon = loaded.context("no daemon was started")?;
    let ready = median(&mut readies);
    let (idle_rss, rss) = (median_kib(&mut idle), median_kib(&mut fresh));

    // The same again on the state it left: pins and listings read from disk.
    let (mut restarted, mut lazy, mut lazy_anon) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..scale.samples.max(1) {
        daemon = restart_on_state(daemon, &sections).await?;
        let (rss, anon) = settled_memory(&daemon, scale.settle).await?;
        restarted.push(rss);
        restarted_anon.push(anon);
    }
    let rss_restarted = median_kib(&mut restarted);

    // The same once more with every upstream lazy: each serves its cached listing
    // until a call starts it, so nothing but the disk's listings and pins is read.
    let lazy_sections = extra_upstreams(
        scale.upstreams,
        scale.tools,
        Some(drift.path()),
        "start = \"lazy\"",
    );
    for _ in 0..scale.samples.max(1) {
        daemon = restart_on_state(daemon, &lazy_sections).await?;
        let (rss, anon) = settled_memory(&daemon, scale.settle).await?;
        lazy.push(rss);
        lazy_anon.push(anon);
    }
    let daemon = restart_on_state(daemon, &sections).await?;

    let mut lister = Lister::open(&daemon.url).await?;
    let pid = daemon.pid().context("plexus has no pid")?;
    quiet(pid).await?;
    // A first walk warms the session up and gives the tools to serialise.
    let (_, bodies) = lister.walk().await?;
    let tools = check_walk(&bodies, expected, scale)?;
    lister.check_call(scale).await?;
    let json_bytes: usize = tools
        .iter()
        .map(|tool| serde_json::to_vec(tool).map(|bytes| bytes.len()))
        .sum::<Result<_, _>>()?;
    // Walks and serialisations take turns, so drift lands on both; each round's
    // ratio counts.
    let (mut walks, mut walk_cpus, mut serialisations) = (Vec::new(), Vec::new(), Vec::new());
    let (mut wall_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    let (mut ping_cpus, mut beyond_ratios) = (Vec::new(), Vec::new());
    for _ in 0..scale.walk_rounds {
        let cpu_before = DaemonCpu::read(pid)?;
        let (took, walked) = lister.walk().await?;
        let cpu = cpu_before.since(pid)?;
        ensure!(
            walked.len() == bodies.len(),
            "a walk of {} pages",
            walked.len()
        );
        // As many requests that carry nothing (pings, on the same session and
        // connection): what the walk's requests cost whatever their pages hold.
        let cpu_before = DaemonCpu::read(pid)?;
        for _ in 0..walked.len() {
            lister.ping().await?;
        }
        let ping_cpu = cpu_before.since(pid)?;
        let started = Instant::now();
        let bytes = serde_json::to_vec(&tools)?;
        let serialised = started.elapsed();
        ensure!(
            bytes.len() >= json_bytes,
            "serialised fewer bytes than listed"
        );
        wall_ratios.push(took.as_secs_f64() / serialised.as_secs_f64());
        cpu_ratios.push(cpu.as_secs_f64() / serialised.as_secs_f64());
        beyond_ratios.push((cpu.as_secs_f64() - ping_cpu.as_secs_f64()) / serialised.as_secs_f64());
        ping_cpus.push(ms(ping_cpu));
        walks.push(ms(took));
        walk_cpus.push(ms(cpu));
        serialisations.push(ms(serialised));
    }

    let rebuild = rebuild_after_list_changed(&daemon, drift.path()).await?;
    stop(daemon).await?;

    // Twice the upstreams, for linearity; pages of 10, so a page holds what a
    // 10-tool catalog's whole list does.
    // As many fresh starts as at the first size, so both ready times are medians.
    let twice = extra_upstreams(scale.upstreams * 2, scale.tools, None, "");
    let mut readies_twice = Vec::new();
    let mut last = None;
    for _ in 0..scale.samples.max(1) {
        last =
            Some(restart_timed(last.take(), "page_size = 10", &twice, &mut readies_twice).await?);
    }
    let daemon = last.context("no daemon was started")?;
    let ready_twice = median(&mut readies_twice);
    let total_twice = 2 * expected;
    let middle = registry::cursor::encode(total_twice / 2);
    let mut big = Lister::open(&daemon.url).await?;
    let big_pid = daemon.pid().context("plexus has no pid")?;

    let small = fixture_upstream("small", "", &["--extra-tools", "4"]);
    let small_daemon = Daemon::builder()
        .daemon("page_size = 10")
        .upstreams(&small)
        .start()
        .await
        .context("starting plexus with 10 tools")?;
    wait_ready_closely(&small_daemon).await?;
    let mut small_lister = Lister::open(&small_daemon.url).await?;
    let small_pid = small_daemon.pid().context("plexus has no pid")?;
    // Both daemons up at once, their pages timed in turns: drift lands on both.
    quiet(big_pid).await?;
    quiet(small_pid).await?;
    let (mut page_ratios, mut page_cpu_ratios) = (Vec::new(), Vec::new());
    let (mut pages_big, mut pages_small) = (Vec::new(), Vec::new());
    let (mut cpus_big, mut cpus_small) = (Vec::new(), Vec::new());
    for _ in 0..scale.page_rounds {
        let (big_wall, big_cpu) = big.time_page(Some(&middle), true, big_pid).await?;
        let (small_wall, small_cpu) = small_lister.time_page(None, false, small_pid).await?;
        page_ratios.push(big_wall.as_secs_f64() / small_wall.as_secs_f64());
        page_cpu_ratios.push(big_cpu.as_secs_f64() / small_cpu.as_secs_f64());
        pages_big.push(big_wall.as_secs_f64() * 1e6);
        pages_small.push(small_wall.as_secs_f64() * 1e6);
        cpus_big.push(big_cpu.as_secs_f64() * 1e6);
        cpus_small.push(small_cpu.as_secs_f64() * 1e6);
    }
    stop(small_daemon).await?;
    stop(daemon).await?;

    let kib = |k: u64| k as f64 / 1024.0;
    let extra_kib = rss.saturating_sub(idle_rss);
    println!(
        "catalog of {} upstreams × {} tools ({expected} tools, {:.2} MB of definitions):",
        scale.upstreams,
        scale.tools,
        json_bytes as f64 / 1e6
    );
    println!(
        "  ready after {:.0} ms; {} upstreams ({total_twice} tools): {:.0} ms ({:.2}× for 2× the tools; medians of {} fresh starts each)",
        ms(ready),
        scale.upstreams * 2,
        ms(ready_twice),
        ms(ready_twice) / ms(ready),
        scale.samples.max(1),
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
    let rss_lazy = median_kib(&mut lazy);
    println!(
        "  restarted with every upstream lazy, serving its cached listing ({samples} times, median [min–max]): daemon RSS {:.1} MiB, {:.1} MiB more, {:.2}× [{:.2}–{:.2}] the definitions' JSON",
        kib(rss_lazy),
        kib(rss_lazy.saturating_sub(idle_rss)),
        times_json(rss_lazy),
        times_json(lazy[0]),
        times_json(lazy[lazy.len() - 1]),
    );
    let idle_anon = median_kib(&mut idle_anon);
    let anon_times_json =
        |anon: u64| (anon.saturating_sub(idle_anon) * 1024) as f64 / json_bytes as f64;
    println!(
        "  anonymous memory (RssAnon, medians), beyond an idle daemon's {:.1} MiB: {:.2}× the definitions' JSON fresh, {:.2}× restarted, {:.2}× restarted lazy",
        kib(idle_anon),
        anon_times_json(median_kib(&mut fresh_anon)),
        anon_times_json(median_kib(&mut restarted_anon)),
        anon_times_json(median_kib(&mut lazy_anon)),
    );
    let rounds = scale.page_rounds;
    println!(
        "  one tools/list page of 10 from the middle of {total_twice} tools: {} µs, {} µs of the daemon's CPU; of a 10-tool catalog: {} µs, {} µs of CPU; {}× wall, {}× CPU ({rounds} rounds of {PAGES} pages, taken in turns: median [min–max] of the rounds' medians and ratios)",
        Spread::of(pages_big).show(0),
        Spread::of(cpus_big).show(0),
        Spread::of(pages_small).show(0),
        Spread::of(cpus_small).show(0),
        Spread::of(page_ratios).show(2),
        Spread::of(page_cpu_ratios).show(2),
    );
    let rounds = scale.walk_rounds;
    println!(
        "  every page ({} pages of up to 100): {} ms, {} ms of the daemon's CPU; serde_json serialising the same tools: {} ms; {}× wall, {}× CPU ({rounds} rounds, walk and serialisation in turns: median [min–max])",
        bodies.len(),
        Spread::of(walks).show(1),
        Spread::of(walk_cpus).show(1),
        Spread::of(serialisations).show(1),
        Spread::of(wall_ratios).show(2),
        Spread::of(cpu_ratios).show(2),
    );
    println!(
        "    as many pings on the same session: {} ms of the daemon's CPU; the walk beyond them: {}× the serialisation",
        Spread::of(ping_cpus).show(1),
        Spread::of(beyond_ratios).show(2),
    );
    println!(
        "  rebuild after one upstream's list_changed: {:.2} ms (mean of {} rebuilds)",
        rebuild.0 * 1e3,
        rebuild.1
    );
    Ok(())
}

/// Stops `daemon` keeping its state, and starts another on that state with
/// `sections` for upstreams, once it is ready.
async fn restart_on_state(daemon: Daemon, sections: &str) -> anyhow::Result<Daemon> {
    let (status, dir) = daemon.stop_keeping_state().await?;
    ensure!(status.success(), "plexus exited with {status}");
    let daemon = Daemon::builder()
        .dir(dir)
        .upstreams(sections)
        .start()
        .await
        .context("restarting plexus on its state")?;
    wait_ready_closely(&daemon).await?;
    Ok(daemon)
}

/// Stops `previous` (if any), then starts a daemon on `sections` and adds how long it
/// took to have every upstream ready to `readies`.
async fn restart_timed(
    previous: Option<Daemon>,
    daemon_extra: &str,
    sections: &str,
    readies: &mut Vec<Duration>,
) -> anyhow::Result<Daemon> {
    if let Some(daemon) = previous {
        stop(daemon).await?;
    }
    let started = Instant::now();
    let daemon = Daemon::builder()
        .daemon(daemon_extra)
        .upstreams(sections)
        .start()
        .await
        .context("starting plexus")?;
    wait_ready_closely(&daemon).await?;
    readies.push(started.elapsed());
    Ok(daemon)
}

/// `count` fixture upstreams `fx0`… with `tools` extra tools each; the first one
/// drifts as `drift` says, if given; `extra` is added to each one's section.
fn extra_upstreams(count: usize, tools: usize, drift: Option<&Path>, extra: &str) -> String {
    let tools = tools.to_string();
    (0..count)
        .map(|n| {
            let name = format!("fx{n}");
            let mut args = vec!["--name", &name, "--extra-tools", &tools];
            let drift = drift.map(|path| path.display().to_string());
            if let (0, Some(path)) = (n, &drift) {
                args.extend(["--drift-file", path]);
            }
            fixture_upstream(&name, extra, &args)
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

    /// One page at `cursor` (of 10 tools, with a next page or not as `more` says),
    /// [`PAGES`] times: the median time of one, and the CPU the daemon `pid` spent
    /// per page.
    async fn time_page(
        &mut self,
        cursor: Option<&str>,
        more: bool,
        pid: u32,
    ) -> anyhow::Result<(Duration, Duration)> {
        // A tenth first, uncounted: it warms the connection and the session up.
        for _ in 0..PAGES / 10 {
            self.checked_page(cursor, more).await?;
        }
        let mut times = Vec::with_capacity(PAGES);
        let cpu_before = DaemonCpu::read(pid)?;
        for _ in 0..PAGES {
            let started = Instant::now();
            self.checked_page(cursor, more).await?;
            times.push(started.elapsed());
        }
        let cpu = cpu_before.since(pid)?;
        Ok((median(&mut times), cpu / PAGES as u32))
    }

    async fn checked_page(&mut self, cursor: Option<&str>, more: bool) -> anyhow::Result<()> {
        let (_, page) = self.page(cursor).await?;
        ensure!(
            page.tools.len() == 10 && page.next_cursor.is_some() == more,
            "a page of {} tools, next cursor {:?}",
            page.tools.len(),
            page.next_cursor
        );
        Ok(())
    }

    /// One extra tool called through the daemon echoes its arguments.
    /// A `ping`, its empty result checked.
    async fn ping(&mut self) -> anyhow::Result<()> {
        let body = self.post("ping", json!({})).await?;
        let answer: Value = serde_json::from_slice(&body)?;
        ensure!(
            answer.get("result") == Some(&json!({})),
            "ping answered {answer}"
        );
        Ok(())
    }

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

/// CPU time a process's live threads have used so far, each thread's, from
/// `/proc/<pid>/task/*/schedstat` (nanoseconds; `/proc/<pid>/stat` counts in 10 ms
/// ticks, too coarse here).
struct DaemonCpu(HashMap<u64, u64>);

impl DaemonCpu {
    fn read(pid: u32) -> anyhow::Result<DaemonCpu> {
        let mut threads = HashMap::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .with_context(|| format!("listing the threads of {pid}"))?;
        for task in tasks {
            let task = task?;
            let Some(tid) = task.file_name().to_str().and_then(|tid| tid.parse().ok()) else {
                continue;
            };
            // A thread that ended since the listing has nothing more to add.
            let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            let nanoseconds = text
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
            threads.insert(
                tid,
                nanoseconds.with_context(|| format!("an unreadable schedstat: {text}"))?,
            );
        }
        Ok(DaemonCpu(threads))
    }

    /// The CPU used since `self` was read: thread by thread, so a thread that ended
    /// in between (a blocking-pool thread retiring) takes nothing off, and one that
    /// started counts whole.
    fn since(&self, pid: u32) -> anyhow::Result<Duration> {
        let now = DaemonCpu::read(pid)?;
        let used = now
            .0
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(self.0.get(tid).copied().unwrap_or(0)))
            .sum();
        Ok(Duration::from_nanos(used))
    }
}

/// Waits until the daemon `pid` has spent under a millisecond of CPU in a quarter
/// of a second (a daemon just ready still writes its pins and listings and then
/// returns memory), for at most ten seconds: what is timed next is its own work.
async fn quiet(pid: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = DaemonCpu::read(pid)?;
        tokio::time::sleep(Duration::from_millis(250)).await;
        if before.since(pid)? < Duration::from_millis(1) || Instant::now() > deadline {
            return Ok(());
        }
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}
