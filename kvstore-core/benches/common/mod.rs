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
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64()
            })
            .collect(),
    )
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
