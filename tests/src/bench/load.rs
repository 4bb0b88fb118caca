//! The load: echo `tools/call`s from concurrent tasks over some client sessions,
//! every reply checked byte for byte, and the latencies summarised.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::Peer;
use rmcp::RoleClient;
use tokio::task::JoinSet;

/// A call this slow means something is stuck; fail rather than hang the bench.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The `text` argument of the echo calls, `size` bytes of it.
pub struct Payload {
    size: usize,
    /// Plain ASCII that JSON needs no escape for, so every target moves the same bytes.
    filler: String,
}

impl Payload {
    pub fn new(size: usize) -> Payload {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let filler = ALPHABET.iter().cycle().take(size).map(|&b| char::from(b));
        Payload {
            size,
            filler: filler.collect(),
        }
    }

    /// The text of call `n`: its number, then filler up to the size, so a reply
    /// handed to the wrong call fails the check as surely as a corrupt one.
    fn text(&self, n: usize) -> String {
        let mut text = format!("{n}:");
        let rest = self.size.saturating_sub(text.len());
        text.push_str(&self.filler[..rest]);
        text
    }
}

/// One measured run's summary.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub p50: Duration,
    pub p99: Duration,
    /// Calls per second over the run's wall time.
    pub throughput: f64,
    /// CPU time per call of the whole machine (every process, both cores).
    pub cpu_total: Duration,
    /// CPU time per call of this process, the load generator (the clients).
    pub cpu_client: Duration,
}

/// CPU time used so far by the whole machine and by this process, read from
/// `/proc` (Linux); zero where it cannot be read, so the figures show as 0.
#[derive(Clone, Copy)]
struct CpuClock {
    machine: Duration,
    this_process: Duration,
}

impl CpuClock {
    fn now() -> CpuClock {
        CpuClock {
            machine: machine_busy().unwrap_or_default(),
            this_process: process_cpu().unwrap_or_default(),
        }
    }
}

/// The kernel's clock tick for `/proc` times; 100 Hz on every Linux this runs on.
const TICK: Duration = Duration::from_millis(10);

/// Busy time of all cores: `/proc/stat`'s first line, less idle and iowait.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(index, _)| *index != 3 && *index != 4)
        .map(|(_, ticks)| ticks)
        .sum();
    Some(TICK * u32::try_from(busy).ok()?)
}

/// This process's user and system time: fields 14 and 15 of `/proc/self/stat`,
/// counted after the command name's closing parenthesis.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u32 = fields.get(11)?.parse().ok()?;
    let stime: u32 = fields.get(12)?.parse().ok()?;
    Some(TICK * (utime + stime))
}

/// Makes `calls` echo calls of `tool` from `concurrency` tasks, task `i` on
/// session `i % peers.len()`, and summarises their latencies.
pub async fn measure(
    peers: &[Peer<RoleClient>],
    tool: &'static str,
    concurrency: usize,
    calls: usize,
    payload: &Arc<Payload>,
) -> anyhow::Result<Sample> {
    let cpu_before = CpuClock::now();
    let started = Instant::now();
    let mut latencies = run(peers, tool, concurrency, calls, payload).await?;
    let elapsed = started.elapsed();
    let cpu_after = CpuClock::now();
    latencies.sort_unstable();
    let per_call = |before: Duration, after: Duration| {
        after.saturating_sub(before) / u32::try_from(calls).unwrap_or(u32::MAX)
    };
    Ok(Sample {
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        throughput: calls as f64 / elapsed.as_secs_f64(),
        cpu_total: per_call(cpu_before.machine, cpu_after.machine),
        cpu_client: per_call(cpu_before.this_process, cpu_after.this_process),
    })
}

/// Like [`measure`], returning every call's latency.
pub async fn run(
    peers: &[Peer<RoleClient>],
    tool: &'static str,
    concurrency: usize,
    calls: usize,
    payload: &Arc<Payload>,
) -> anyhow::Result<Vec<Duration>> {
    if peers.is_empty() {
        bail!("no session to call {tool} on");
    }
    // Tasks take call numbers from one counter instead of fixed shares, so a
    // task that falls behind does not leave the others idle at the end.
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for task in 0..concurrency {
        let peer = peers[task % peers.len()].clone();
        let next = Arc::clone(&next);
        let payload = Arc::clone(payload);
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(calls / concurrency + 1);
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= calls {
                    break;
                }
                latencies.push(echo(&peer, tool, payload.text(n)).await?);
            }
            anyhow::Ok(latencies)
        });
    }
    let mut all = Vec::with_capacity(calls);
    while let Some(joined) = tasks.join_next().await {
        // Returning early drops the JoinSet, which aborts the other tasks.
        all.extend(joined.context("bench task panicked")??);
    }
    if all.len() != calls {
        bail!("made {} calls, expected {calls}", all.len());
    }
    Ok(all)
}

/// One `tools/call` of the echo tool; only the call itself is timed. The reply
/// is checked so a fast wrong answer cannot pass for a fast right one.
async fn echo(
    peer: &Peer<RoleClient>,
    tool: &'static str,
    text: String,
) -> anyhow::Result<Duration> {
    let mut arguments = JsonObject::new();
    arguments.insert("text".into(), text.clone().into());
    let params = CallToolRequestParams::new(tool).with_arguments(arguments);
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params))
        .await
        .with_context(|| format!("{tool} took longer than {CALL_TIMEOUT:?}"))?
        .with_context(|| format!("calling {tool}"))?;
    let latency = started.elapsed();
    if result.is_error == Some(true) {
        bail!("{tool} returned an error result: {:.500?}", result.content);
    }
    let echoed = result
        .content
        .first()
        .and_then(|block| block.as_text())
        .map(|t| t.text.as_str());
    match echoed {
        Some(echoed) if echoed == text => Ok(latency),
        Some(echoed) => bail!(
            "{tool} echoed a different text: {}",
            difference(&text, echoed)
        ),
        None => bail!("{tool} answered without text: {:.500?}", result.content),
    }
}

/// Where two texts part, briefly: a 1 MiB payload is not worth printing.
fn difference(sent: &str, echoed: &str) -> String {
    let at = sent
        .bytes()
        .zip(echoed.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(sent.len().min(echoed.len()));
    let near = |text: &str| -> String { text.chars().skip(at).take(40).collect() };
    format!(
        "sent {} bytes, got {}; first difference at byte {at}: sent {:?}, got {:?}",
        sent.len(),
        echoed.len(),
        near(sent),
        near(echoed)
    )
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_texts_have_the_size_and_differ_per_call() {
        let payload = Payload::new(100);
        assert_eq!(payload.text(7).len(), 100);
        assert_ne!(payload.text(7), payload.text(8));
        assert_eq!(Payload::new(1 << 20).text(123_456).len(), 1 << 20);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&samples, 0.50), Duration::from_micros(50));
        assert_eq!(percentile(&samples, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO);
    }
}
