//! The cells of the bench and how their results are printed: per target the
//! median and [min–max] over the pairs of p50, p99 and throughput, and the
//! ratio of the medians to the baseline's.

use std::time::Duration;

use crate::load::Sample;
use crate::targets::Target;

/// How the tasks of a cell share client sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sessions {
    /// Every task on one session.
    Shared,
    /// A session per task.
    PerWorker,
}

/// One configuration every target is measured in.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub concurrency: usize,
    pub sessions: Sessions,
    pub payload: usize,
    pub calls: usize,
}

impl Cell {
    pub fn label(&self) -> String {
        let sessions = match (self.concurrency, self.sessions) {
            (1, _) => "",
            (_, Sessions::Shared) => " shared",
            (_, Sessions::PerWorker) => " per-worker",
        };
        format!(
            "c={}{sessions} · {} · {} calls",
            self.concurrency,
            bytes(self.payload),
            self.calls
        )
    }

    /// A column heading for the overview: `c16w 10KiB` is c=16 with a session per worker.
    pub fn short_label(&self) -> String {
        let sessions = match (self.concurrency, self.sessions) {
            (1, _) => "",
            (_, Sessions::Shared) => "s",
            (_, Sessions::PerWorker) => "w",
        };
        format!(
            "c{}{sessions} {}",
            self.concurrency,
            bytes(self.payload).replace(' ', "")
        )
    }
}

/// `100 B`, `10 KiB`, `1 MiB`.
pub fn bytes(size: usize) -> String {
    match size {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Median and range of one metric over the pairs.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let median = match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        Spread {
            median,
            min: values.first().copied().unwrap_or(f64::NAN),
            max: values.last().copied().unwrap_or(f64::NAN),
        }
    }

    pub fn show(&self, decimals: usize) -> String {
        format!(
            "{:.d$} [{:.d$}–{:.d$}]",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }
}

/// A target's results in one cell, summarised.
struct Summary {
    p50: Spread,
    p99: Spread,
    throughput: Spread,
    /// CPU µs per call outside the load generator: the servers, plexus included.
    cpu_served: Spread,
    /// CPU µs per call of the load generator.
    cpu_client: Spread,
}

impl Summary {
    fn of(samples: &[Sample]) -> Summary {
        let metric = |f: fn(&Sample) -> f64| Spread::of(samples.iter().map(f).collect());
        Summary {
            p50: metric(|s| micros(s.p50)),
            p99: metric(|s| micros(s.p99)),
            throughput: metric(|s| s.throughput),
            cpu_served: metric(|s| micros(s.cpu_total.saturating_sub(s.cpu_client))),
            cpu_client: metric(|s| micros(s.cpu_client)),
        }
    }
}

/// One of a summary's metrics.
type Metric = fn(&Summary) -> Spread;

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One cell's results: per target (in round order) its summary over the pairs.
pub struct CellResult {
    cell: Cell,
    pairs: usize,
    rows: Vec<(Target, Summary)>,
    /// Per target its throughput in each round, in round order (for paired ratios).
    throughputs: Vec<(Target, Vec<f64>)>,
}

impl CellResult {
    /// `samples` holds each target's samples, one per pair.
    pub fn new(cell: Cell, pairs: usize, samples: &[(Target, Vec<Sample>)]) -> CellResult {
        let rows = samples
            .iter()
            .map(|(target, samples)| (*target, Summary::of(samples)))
            .collect();
        let throughputs = samples
            .iter()
            .map(|(target, samples)| (*target, samples.iter().map(|s| s.throughput).collect()))
            .collect();
        CellResult {
            cell,
            pairs,
            rows,
            throughputs,
        }
    }

    /// The median over rounds of `target`'s throughput over `base`'s in the same
    /// round: the two ran one after the other, so a load that came and went on a
    /// shared machine weighs on both.
    fn paired_throughput(&self, target: Target, base: Target) -> Option<f64> {
        let find = |wanted: Target| {
            self.throughputs
                .iter()
                .find(|(target, _)| *target == wanted)
                .map(|(_, values)| values)
        };
        let (values, bases) = (find(target)?, find(base)?);
        let ratios: Vec<f64> = values.iter().zip(bases).map(|(v, b)| v / b).collect();
        (!ratios.is_empty()).then(|| Spread::of(ratios).median)
    }

    /// `metric`'s median for `target` over the baseline's, as text.
    fn ratio(&self, target: Target, metric: Metric) -> String {
        self.ratio_to(target, Target::BASELINE, metric)
    }

    /// `metric`'s median for `target` over `base`'s, as text.
    fn ratio_to(&self, target: Target, base: Target, metric: Metric) -> String {
        let find = |wanted: Target| {
            self.rows
                .iter()
                .find(|(target, _)| *target == wanted)
                .map(|(_, summary)| metric(summary).median)
        };
        match (find(target), find(base)) {
            (Some(value), Some(base)) => format!("{:.2}", value / base),
            _ => "-".to_string(),
        }
    }

    pub fn print(&self) {
        println!();
        println!(
            "{} · {} pair{} · median [min–max]; cpu: µs per call of every process but the clients', client: theirs; ×: median / {}'s",
            self.cell.label(),
            self.pairs,
            if self.pairs == 1 { "" } else { "s" },
            Target::BASELINE.label()
        );
        let mut table = vec![[
            "target",
            "p50 µs",
            "p99 µs",
            "calls/s",
            "cpu µs",
            "client µs",
            "×p50",
            "×p99",
            "×tput",
        ]
        .map(String::from)
        .to_vec()];
        for (target, s) in &self.rows {
            table.push(vec![
                target.label().to_string(),
                s.p50.show(0),
                s.p99.show(0),
                s.throughput.show(0),
                s.cpu_served.show(0),
                s.cpu_client.show(0),
                self.ratio(*target, |s| s.p50),
                self.ratio(*target, |s| s.p99),
                self.ratio(*target, |s| s.throughput),
            ]);
        }
        print_table(&table);
    }
}

/// The ratios of every cell side by side: one table for p50, one for throughput.
pub fn print_overview(results: &[CellResult]) {
    let Some(first) = results.first() else {
        return;
    };
    let metrics: [(&str, Metric); 2] =
        [("p50 latency", |s| s.p50), ("throughput", |s| s.throughput)];
    for (name, metric) in metrics {
        println!();
        println!("{name} / {}'s, every cell", Target::BASELINE.label());
        let mut header = vec!["target".to_string()];
        header.extend(results.iter().map(|r| r.cell.short_label()));
        let mut table = vec![header];
        for (target, _) in &first.rows {
            let mut row = vec![target.label().to_string()];
            row.extend(results.iter().map(|r| r.ratio(*target, metric)));
            table.push(row);
        }
        print_table(&table);
    }
}

/// plexus's own cost, cell by cell: each plexus target over the same kind of
/// client calling the server directly (the 2026-07-28 client over direct-http-2026,
/// the stdio ones over direct-stdio), so what an era or a transport costs by
/// itself is not counted against plexus.
pub fn print_overheads(results: &[CellResult]) {
    let Some(first) = results.first() else {
        return;
    };
    let pairs: Vec<(Target, Target)> = first
        .rows
        .iter()
        .filter_map(|(target, _)| Some((*target, target.direct_counterpart()?)))
        .filter(|(_, direct)| first.rows.iter().any(|(t, _)| t == direct))
        .collect();
    if pairs.is_empty() {
        return;
    }
    let metrics: [(&str, Metric); 2] =
        [("p50 latency", |s| s.p50), ("throughput", |s| s.throughput)];
    for (name, metric) in metrics {
        println!();
        println!("{name} / the same client's direct target's, every cell");
        let mut header = vec!["target / direct".to_string()];
        header.extend(results.iter().map(|r| r.cell.short_label()));
        let mut table = vec![header];
        for (target, direct) in &pairs {
            let mut row = vec![format!("{} / {}", target.label(), direct.label())];
            row.extend(results.iter().map(|r| r.ratio_to(*target, *direct, metric)));
            table.push(row);
        }
        print_table(&table);
    }
}

/// What OpenTelemetry costs: plexus-http-traced (every request sampled, exported
/// over OTLP/HTTP) over plexus-http (tracing off), per cell. Printed when both were measured.
pub fn print_tracing_cost(results: &[CellResult]) {
    let measured =
        |result: &CellResult, wanted: Target| result.rows.iter().any(|(t, _)| *t == wanted);
    if !results.first().is_some_and(|first| {
        measured(first, Target::PlexusTraced) && measured(first, Target::PlexusHttp)
    }) {
        return;
    }
    println!();
    println!(
        "tracing on (100 % sampled, OTLP/HTTP) / off: plexus-http-traced / plexus-http, every cell"
    );
    let mut header = vec![String::new()];
    header.extend(results.iter().map(|r| r.cell.short_label()));
    let mut table = vec![header];
    let metrics: [(&str, Metric); 3] = [
        ("throughput", |s| s.throughput),
        ("p50 latency", |s| s.p50),
        ("cpu per call", |s| s.cpu_served),
    ];
    for (name, metric) in metrics {
        let mut row = vec![name.to_string()];
        row.extend(
            results
                .iter()
                .map(|r| r.ratio_to(Target::PlexusTraced, Target::PlexusHttp, metric)),
        );
        table.push(row);
    }
    let mut row = vec!["throughput, paired".to_string()];
    row.extend(results.iter().map(|r| {
        r.paired_throughput(Target::PlexusTraced, Target::PlexusHttp)
            .map_or_else(|| "-".to_string(), |ratio| format!("{ratio:.2}"))
    }));
    table.push(row);
    print_table(&table);
    // The budget: tracing on, every request sampled, costs at most 5 % of throughput at C=16.
    let costs: Vec<String> = results
        .iter()
        .filter(|r| r.cell.concurrency == 16)
        .filter_map(|r| {
            let ratio = r.paired_throughput(Target::PlexusTraced, Target::PlexusHttp)?;
            Some(format!(
                "{:.1} % ({})",
                (1.0 - ratio) * 100.0,
                r.cell.short_label()
            ))
        })
        .collect();
    if !costs.is_empty() {
        println!(
            "tracing's throughput cost at c=16 (median of per-round ratios; the budget is 5 %): {}",
            costs.join(", ")
        );
    }
}

/// What plexus adds to a call beyond the two legs it chains: plexus-http is an
/// HTTP exchange with the client plus a stdio round trip to the server, so
/// direct-http's p50 plus direct-stdio's is what a relay that cost nothing itself
/// would take. Printed when the three were measured, for one call at a time
/// (with more, the legs overlap and their sum means nothing).
pub fn print_hop_floor(results: &[CellResult]) {
    let Some(rows) = hop_floor(results) else {
        return;
    };
    println!();
    println!(
        "p50 of plexus-http against its two legs, one call at a time: floor = (direct-http + direct-stdio) / direct-http; plexus's own = plexus-http − direct-http − direct-stdio"
    );
    print_table(&rows);
}

/// [`print_hop_floor`]'s table, or `None` when a leg or plexus-http is missing.
fn hop_floor(results: &[CellResult]) -> Option<Vec<Vec<String>>> {
    let median_p50 = |result: &CellResult, wanted: Target| {
        result
            .rows
            .iter()
            .find(|(target, _)| *target == wanted)
            .map(|(_, summary)| summary.p50.median)
    };
    let mut rows = vec![
        vec![String::new()],
        vec!["floor ×direct-http".to_string()],
        vec!["plexus-http ×direct-http".to_string()],
        vec!["plexus's own µs".to_string()],
    ];
    for result in results.iter().filter(|r| r.cell.concurrency == 1) {
        let plexus = median_p50(result, Target::PlexusHttp)?;
        let http = median_p50(result, Target::DirectHttp)?;
        let stdio = median_p50(result, Target::DirectStdio)?;
        let cells = [
            result.cell.short_label(),
            format!("{:.2}", (http + stdio) / http),
            format!("{:.2}", plexus / http),
            format!("{:.0}", plexus - http - stdio),
        ];
        for (row, cell) in rows.iter_mut().zip(cells) {
            row.push(cell);
        }
    }
    (rows[0].len() > 1).then_some(rows)
}

/// Prints rows as columns as wide as their widest cell: the first left-aligned,
/// the rest right-aligned.
fn print_table(rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if c == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        println!("{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(10 << 10), "10 KiB");
        assert_eq!(bytes(1 << 20), "1 MiB");
    }

    #[test]
    fn the_hop_floor_is_the_sum_of_the_two_legs_one_call_at_a_time() {
        let cell = |concurrency| Cell {
            concurrency,
            sessions: Sessions::Shared,
            payload: 100,
            calls: 10,
        };
        let sample = |p50_us| Sample {
            p50: Duration::from_micros(p50_us),
            p99: Duration::from_micros(p50_us * 2),
            throughput: 1.0,
            cpu_total: Duration::ZERO,
            cpu_client: Duration::ZERO,
        };
        let measured = |concurrency, targets: &[(Target, u64)]| {
            let samples: Vec<(Target, Vec<Sample>)> = targets
                .iter()
                .map(|&(target, p50)| (target, vec![sample(p50)]))
                .collect();
            CellResult::new(cell(concurrency), 1, &samples)
        };
        let all = [
            (Target::DirectHttp, 300),
            (Target::PlexusHttp, 450),
            (Target::DirectStdio, 100),
        ];
        let rows = hop_floor(&[measured(1, &all), measured(16, &all)]).unwrap_or_default();
        assert_eq!(rows.len(), 4, "{rows:?}");
        assert_eq!(rows[0], ["", "c1 100B"]);
        assert_eq!(rows[1][1], "1.33");
        assert_eq!(rows[2][1], "1.50");
        assert_eq!(rows[3][1], "50");
        // Without direct-stdio there is no floor to show.
        let two = [(Target::DirectHttp, 300), (Target::PlexusHttp, 450)];
        assert!(hop_floor(&[measured(1, &two)]).is_none());
        assert!(hop_floor(&[measured(16, &all)]).is_none());
    }

    #[test]
    fn spreads_take_the_middle() {
        let spread = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((spread.median, spread.min, spread.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(vec![1.0, 2.0, 4.0, 3.0]).median, 2.5);
    }
}
