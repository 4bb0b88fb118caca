//! Hostile inputs for the randomized tests of every parser that reads outside bytes.
//!
//! A test names its parser's valid inputs (the seed corpus, taken from its other
//! tests) and a closure that parses one input; [`check`] runs it over the seeds,
//! every truncation of them, the worst cases written by hand ([`hostile`]) and a few
//! thousand mutants from a fixed-seed RNG, and fails naming the input on a panic,
//! on a call that takes seconds (a wedge) and on a call that allocates beyond what
//! its input's size can explain. The same seed gives the same inputs on every run,
//! so a failure is reproduced by running the test again.

mod allocations;
mod values;

use std::panic::{catch_unwind, AssertUnwindSafe};
// The wall clock: a wedge is measured in real time, never on a paused clock.
#[allow(clippy::disallowed_types)]
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use allocations::{peak_growth, Counting};
pub use values::value_mutants;

/// How deep the hand-written nesting goes: far past any recursion limit, so a
/// recursive reader without one overflows its stack on it.
pub const DEEP: usize = 100_000;

/// One call taking this long is a wedge, not a slow machine: the largest input is a
/// few MiB and a linear parser reads it in milliseconds, even unoptimised.
const WEDGE: Duration = Duration::from_secs(5);

/// The worst cases, whatever the format: deep nesting, huge numbers, lone
/// surrogates, invalid UTF-8, NULs, line-end variants, giant repetitions.
pub fn hostile() -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = [
        &b""[..],
        b"\0",
        b"\0\0\0\0",
        b"\r",
        b"\n",
        b"\r\n",
        b"\n\r",
        b"\r\r\n\n",
        b"\xff",
        b"\xfe\xff",
        b"\xc3\x28",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
        b"\"\\ud800\"",
        b"\"\\udc00\\ud800\"",
        b"\"\\ud800\\u0041\"",
        b"{\"a\":\"\\ud800\"}",
        b"\"\\u\"",
        b"\"\\",
        b"1e999999999",
        b"-1e-999999999",
        b"18446744073709551616",
        b"-9223372036854775809",
        b"-9223372036854775808",
        b"340282366920938463463374607431768211456",
        b"0x7fffffffffffffff",
        b"NaN",
        b"-Infinity",
        b"{\"\":\"\"}",
        b"{\"a\":1,\"a\":2}",
        b"%",
        b"%00",
        b"%ff%fe",
        b"=",
        b";;;",
        b",,,,",
        b"....",
        b"Bearer ",
        b"data:",
        b"data: \r\n\r\n",
        b"id:\0\n\n",
        b"[]",
        b"{}",
        b"null",
    ]
    .iter()
    .map(|case| case.to_vec())
    .collect();
    for (open, close) in [("[", "]"), ("{\"a\":", "}"), ("{", ""), ("[{\"a\":", "}]")] {
        cases.push(open.repeat(DEEP).into_bytes());
        cases.push(format!("{}1{}", open.repeat(DEEP), close.repeat(DEEP)).into_bytes());
        cases.push(format!("{{\"params\":{}}}", open.repeat(DEEP)).into_bytes());
    }
    cases.push(format!("1{}", "0".repeat(DEEP)).into_bytes());
    cases.push(format!("0.{}1e-{}", "0".repeat(DEEP), "9".repeat(40)).into_bytes());
    cases.push(format!("\"{}\"", "\\".repeat(DEEP)).into_bytes());
    cases.push(format!("\"{}\"", "\\ud800".repeat(DEEP / 6)).into_bytes());
    cases.push(format!("\"{}", "\\u00".repeat(DEEP / 4)).into_bytes());
    cases.push(vec![b'a'; 1 << 20]);
    cases.push(vec![b' '; 1 << 20]);
    cases.push(vec![0; 1 << 16]);
    cases.push(vec![b'\n'; 1 << 16]);
    cases.push(b"\r\n".repeat(1 << 15));
    cases.push(b"data: x\n".repeat(1 << 14));
    cases.push(b"a=b;".repeat(1 << 14));
    cases.push(b"%".repeat(1 << 16));
    cases.push(b"\xff".repeat(1 << 16));
    cases
}

/// Bytes a mutation likes to insert: each ends or opens something in some format.
const TOKENS: &[&[u8]] = &[
    b"\0",
    b"\"",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udfff",
    b"\\u0000",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"=",
    b";",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b" ",
    b".",
    b"%",
    b"%00",
    b"%ff",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"1e999999",
    b"-0",
    b"18446744073709551616",
    b"-9223372036854775808",
    b"99999999999999999999999999999",
    b"NaN",
    b"null",
    b"true",
    b"[[[[[[[[",
    b"{\"a\":{\"a\":",
    b"data: ",
    b"event: ",
    b"id: ",
    b"\t",
    b"==",
    b"/",
    b"../",
    b"+",
    b"__",
];

/// Numbers at the edges of the types a reader may put them in.
const NUMBERS: &[&[u8]] = &[
    b"0",
    b"-0",
    b"-1",
    b"4294967296",
    b"9007199254740992",
    b"-9007199254740993",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"1e999",
    b"-1e999",
    b"1e-999",
    b"0.1",
    b"1.0",
];

/// A fixed-seed mutator over a seed corpus.
pub struct Mutator {
    rng: StdRng,
    seeds: Vec<Vec<u8>>,
}

impl Mutator {
    pub fn new(seed: u64, seeds: &[&[u8]]) -> Mutator {
        Mutator {
            rng: StdRng::seed_from_u64(seed),
            seeds: seeds.iter().map(|seed| seed.to_vec()).collect(),
        }
    }

    /// One mutant: a seed changed by one to four mutations.
    pub fn next_mutant(&mut self) -> Vec<u8> {
        let mut bytes = match self.seeds.len() {
            0 => Vec::new(),
            n => self.seeds[self.rng.random_range(0..n)].clone(),
        };
        for _ in 0..self.rng.random_range(1..=4) {
            self.mutate(&mut bytes);
        }
        bytes
    }

    fn at(&mut self, bytes: &[u8]) -> usize {
        self.rng.random_range(0..=bytes.len())
    }

    fn span(&mut self, bytes: &[u8]) -> (usize, usize) {
        let start = self.at(bytes);
        let end = start + self.rng.random_range(0..=(bytes.len() - start).min(64));
        (start, end)
    }

    fn mutate(&mut self, bytes: &mut Vec<u8>) {
        match self.rng.random_range(0..11) {
            // A flipped bit.
            0 if !bytes.is_empty() => {
                let at = self.rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << self.rng.random_range(0..8);
            }
            // A byte replaced by one that means something somewhere.
            1 if !bytes.is_empty() => {
                let at = self.rng.random_range(0..bytes.len());
                let token = TOKENS[self.rng.random_range(0..TOKENS.len())];
                bytes[at] = token[0];
            }
            // Truncated.
            2 => {
                let at = self.at(bytes);
                bytes.truncate(at);
            }
            // A span deleted.
            3 => {
                let (start, end) = self.span(bytes);
                bytes.drain(start..end);
            }
            // A span duplicated, sometimes many times over.
            4 => {
                let (start, end) = self.span(bytes);
                let times = if self.rng.random_bool(0.1) { 1_000 } else { 1 };
                let copy = bytes[start..end].repeat(times);
                bytes.splice(end..end, copy);
            }
            // A token inserted, or written over what was there.
            5 | 6 => {
                let token = TOKENS[self.rng.random_range(0..TOKENS.len())];
                let at = self.at(bytes);
                if self.rng.random_bool(0.5) {
                    bytes.splice(at..at, token.iter().copied());
                } else {
                    let end = (at + token.len()).min(bytes.len());
                    bytes.splice(at..end, token.iter().copied());
                }
            }
            // Spliced with another seed.
            7 if !self.seeds.is_empty() => {
                let other = self.seeds[self.rng.random_range(0..self.seeds.len())].clone();
                let from = self.rng.random_range(0..=other.len());
                let at = self.at(bytes);
                bytes.truncate(at);
                bytes.extend_from_slice(&other[from..]);
            }
            // Nesting opened, now and then far too deep.
            8 => {
                let open: &[u8] = if self.rng.random_bool(0.5) {
                    b"["
                } else {
                    b"{\"a\":"
                };
                let depth = if self.rng.random_bool(0.05) {
                    DEEP
                } else {
                    self.rng.random_range(1..300)
                };
                let at = self.at(bytes);
                bytes.splice(at..at, open.repeat(depth));
            }
            // A number written as one at the edge of a type.
            9 => {
                let from = self.at(bytes);
                let Some(found) = bytes[from..].iter().position(u8::is_ascii_digit) else {
                    return;
                };
                let mut start = from + found;
                if start > 0 && bytes[start - 1] == b'-' {
                    start -= 1;
                }
                let length = bytes[start..]
                    .iter()
                    .skip(1)
                    .take_while(|b| {
                        b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+')
                    })
                    .count()
                    + 1;
                let number = NUMBERS[self.rng.random_range(0..NUMBERS.len())];
                bytes.splice(start..start + length, number.iter().copied());
            }
            // A run of digits: a huge number or a giant length.
            _ => {
                let at = self.at(bytes);
                let digits = self.rng.random_range(1..60);
                let run: Vec<u8> = (0..digits)
                    .map(|_| b'0' + self.rng.random_range(0..10u8))
                    .collect();
                bytes.splice(at..at, run);
            }
        }
    }
}

/// Every case a parser is checked on: the seeds, each seed cut at every length (at
/// 4,096 of them for a long one), [`hostile`], and `mutants` mutants of the seeds.
pub fn cases(seeds: &[&[u8]], mutants: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = seeds.iter().map(|seed| seed.to_vec()).collect();
    for seed in seeds {
        let step = seed.len().div_ceil(4_096).max(1);
        cases.extend((0..seed.len()).step_by(step).map(|at| seed[..at].to_vec()));
    }
    cases.extend(hostile());
    let mut mutator = Mutator::new(seed, seeds);
    cases.extend((0..mutants).map(|_| mutator.next_mutant()));
    cases
}

/// What [`check`] measured, for the test to print.
#[derive(Debug)]
pub struct Report {
    pub cases: usize,
    pub slowest: Duration,
    pub most_allocated: usize,
}

/// The head of an input, escaped, for a failure's message.
pub fn describe(input: &[u8]) -> String {
    let head = &input[..input.len().min(160)];
    format!(
        "{} bytes: b\"{}\"{}",
        input.len(),
        head.escape_ascii(),
        if head.len() < input.len() { "…" } else { "" }
    )
}

/// Runs `parse` on every case: fails naming the input if it panics, takes
/// [`WEDGE`], or allocates more than `bytes_per_input_byte` × its length + 1 MiB at
/// its peak (what a parser building a value from the input may need; a length read
/// from the input and believed is far more). `parse` asserts what its result must
/// be (an error, or a value that re-serialises sensibly).
#[allow(clippy::disallowed_types)]
pub fn check(
    name: &str,
    cases: &[Vec<u8>],
    bytes_per_input_byte: usize,
    mut parse: impl FnMut(&[u8]),
) -> Report {
    let mut report = Report {
        cases: cases.len(),
        slowest: Duration::ZERO,
        most_allocated: 0,
    };
    for case in cases {
        let started = Instant::now();
        let (outcome, allocated) = peak_growth(|| catch_unwind(AssertUnwindSafe(|| parse(case))));
        let took = started.elapsed();
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_default();
            panic!("{name} panicked on {}: {message}", describe(case));
        }
        assert!(took < WEDGE, "{name} took {took:?} on {}", describe(case));
        let allowed = bytes_per_input_byte * case.len() + (1 << 20);
        assert!(
            allocated <= allowed,
            "{name} allocated {allocated} bytes (allowed {allowed}) on {}",
            describe(case)
        );
        report.slowest = report.slowest.max(took);
        report.most_allocated = report.most_allocated.max(allocated);
    }
    println!(
        "{name}: {} cases, slowest {:?}, most allocated at once {} KiB",
        report.cases,
        report.slowest,
        report.most_allocated / 1024
    );
    report
}
