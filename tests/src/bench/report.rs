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
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Spread {
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

    fn show(&self, decimals: usize) -> String {
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
}

impl Summary {
    fn of(samples: &[Sample]) -> Summary {
        let metric = |f: fn(&Sample) -> f64| Spread::of(samples.iter().map(f).collect());
        Summary {
            p50: metric(|s| micros(s.p50)),
            p99: metric(|s| micros(s.p99)),
            throughput: metric(|s| s.throughput),
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Prints one cell's table; `results` holds each target's samples, one per pair.
pub fn print_cell(cell: &Cell, pairs: usize, results: &[(Target, Vec<Sample>)]) {
    let summaries: Vec<(Target, Summary)> = results
        .iter()
        .map(|(target, samples)| (*target, Summary::of(samples)))
        .collect();
    let baseline = summaries
        .iter()
        .find(|(target, _)| *target == Target::BASELINE)
        .map(|(_, summary)| summary);

    println!();
    println!(
        "{} · {pairs} pair{} · median [min–max]; ×: median / {}'s",
        cell.label(),
        if pairs == 1 { "" } else { "s" },
        Target::BASELINE.label()
    );
    println!(
        "{:<15} {:>26} {:>26} {:>24} {:>6} {:>6} {:>6}",
        "target", "p50 µs", "p99 µs", "calls/s", "×p50", "×p99", "×tput"
    );
    for (target, s) in &summaries {
        let ratio = |metric: fn(&Summary) -> Spread| match baseline {
            Some(base) => format!("{:.2}", metric(s).median / metric(base).median),
            None => "-".to_string(),
        };
        println!(
            "{:<15} {:>26} {:>26} {:>24} {:>6} {:>6} {:>6}",
            target.label(),
            s.p50.show(1),
            s.p99.show(1),
            s.throughput.show(0),
            ratio(|s| s.p50),
            ratio(|s| s.p99),
            ratio(|s| s.throughput),
        );
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
    fn spreads_take_the_middle() {
        let spread = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((spread.median, spread.min, spread.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(vec![1.0, 2.0, 4.0, 3.0]).median, 2.5);
    }
}
