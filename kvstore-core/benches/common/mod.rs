//! Helpers of the benches: timing medians, and the JSON rows that `make bench`'s report
//! reads. Written once, here, beside kvstore-core's benches (`report.rs` includes it as
//! `mod common`); the bench binaries outside criterion (kvstore-mpi's `bench_mpi`,
//! kvstore-cuda's `bench_gpu`) reach it as `kvstore_tests::bench`, which includes this
//! file.

use std::time::Instant;

/// The median of `runs` timings of `f` in seconds, after `warm` untimed calls;
/// `before` runs untimed before each timed call (an MPI barrier).
pub fn median(warm: usize, runs: usize, mut before: impl FnMut(), mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    median_of(
        (0..runs)
            .map(|_| {
                before();
                seconds(&mut f)
            })
            .collect(),
    )
}

/// How long one call of `f` takes, in seconds.
pub fn seconds(f: &mut impl FnMut()) -> f64 {
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64()
}

/// The medians of `runs` timings each of `a` and `b` in seconds, timed in turn (`a`
/// first in even runs, `b` first in odd ones) after `warm` untimed calls of each: a
/// limit and the store call measured against it see the same state of a shared
/// machine, where timed one block after the other a drift between the blocks moved
/// their ratio (the push of 4 x 4 Mi f32 read 0.77 and 1.06 of its limit in two runs).
pub fn medians_in_turn(warm: usize, runs: usize, a: impl FnMut(), b: impl FnMut()) -> (f64, f64) {
    medians_in_turn_after(warm, runs, || {}, a, b)
}

/// [`medians_in_turn`] with `before` run untimed before each timed call (an MPI
/// barrier, so that every rank starts each call together).
pub fn medians_in_turn_after(
    warm: usize,
    runs: usize,
    mut before: impl FnMut(),
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    for _ in 0..warm {
        before();
        a();
        before();
        b();
    }
    let (mut ta, mut tb) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for run in 0..runs {
        let mut time = |f: &mut dyn FnMut(), t: &mut Vec<f64>| {
            before();
            t.push(seconds(&mut || f()));
        };
        if run % 2 == 0 {
            time(&mut a, &mut ta);
            time(&mut b, &mut tb);
        } else {
            time(&mut b, &mut tb);
            time(&mut a, &mut ta);
        }
    }
    (median_of(ta), median_of(tb))
}

/// The median of `t` (the upper one of an even count).
pub fn median_of(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Writes rows `(name, median seconds, limit seconds)` as the report's JSON.
///
/// # Errors
/// The file cannot be written.
pub fn write_rows(path: &str, rows: &[(String, f64, Option<f64>)]) -> kvstore_core::Result<()> {
    let json: Vec<String> = rows
        .iter()
        .map(|(name, m, limit)| {
            let limit = limit.map_or("null".to_string(), |l| format!("{l:.9e}"));
            format!("{{\"name\": \"{name}\", \"median_s\": {m:.9e}, \"limit_s\": {limit}}}")
        })
        .collect();
    let io = |e| kvstore_core::Error::Io { context: format!("write {path}"), source: e };
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(path, format!("[\n{}\n]\n", json.join(",\n"))).map_err(io)
}
