//! The multi-rank suite: every case of `cases.rs` as an MPI job of its own, on 2 ranks
//! and on 4, and on 2 ranks again with 256-byte buckets and without shared memory (so
//! that every case also runs with keys split over many buckets, and with fused sums
//! through MPI's messages instead of the machine's shared memory), and on 3 ranks with
//! the optimizer state on owners (keys split from 1000 elements); on 4 ranks MPI's
//! allreduce is told to use its ring, which sums each part of a buffer in another order:
//! a key must still get the same bits alone and fused with others. Then the settings
//! that are not numbers, each refused with a clear error, and ranks started with shared
//! memory on and off, which must agree on MPI's messages.
//!
//! A test without the harness (libtest-mimic's instead), so that it can run itself:
//!
//! ```text
//! mpi case NAME       under mpirun: runs case NAME on this rank, then finalises MPI
//! mpi setting NAME    alone: runs case NAME (a setting's), without finalising
//! mpi [ARGS]          the tests, one per job: `cargo test` and cargo-nextest run them
//! ```
//!
//! A test passes when its job exits with 0 within its limit (a failed assertion on any
//! rank fails the job), so `scripts/test-mpi.sh` reports it through nextest's JUnit XML.

use std::process::{Command, ExitCode};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

mod cases;
#[path = "../support/jobs.rs"]
mod jobs;

/// The longest a case's job may take (the slowest take seconds on 4 ranks).
const LIMIT: Duration = Duration::from_secs(120);

/// A way the cases run: its name, its ranks, the settings of every rank, and mpirun's
/// extra arguments.
type Run = (&'static str, usize, &'static [(&'static str, &'static str)], &'static [&'static str]);

const RUNS: &[Run] = &[
    ("np2", 2, &[], &[]),
    ("np4", 4, &[], &["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]),
    ("np2-bucket256", 2, &[("KVSTORE_MPI_BUCKET_BYTES", "256"), ("KVSTORE_MPI_SHARED_MEMORY", "0")], &[]),
    ("np3-owners", 3, &[("KVSTORE_LAYOUT", "owners"), ("MXNET_KVSTORE_BIGARRAY_BOUND", "1000")], &[]),
];

/// Hosts made of blocks of ranks (`KVSTORE_MPI_HOST_RANKS`), where big sums go host by
/// host or, where the placement would change the bits, flat: a run's name, ranks,
/// ranks per host, whether it goes host by host, its bucket size and its chunk size
/// (`KVSTORE_MPI_HOST_CHUNK_BYTES`: the case's 4 MiB key in 2 chunks by default; in one,
/// where each rank's part of its segment crosses in pieces of 1 MiB and one element;
/// in 65 chunks of 64 KiB, in 5 groups, where a big sum goes in groups of 4 MiB). Run by the case
/// `big_sums_go_host_by_host_with_the_same_bits` only.
const HOST_RUNS: &[(&str, usize, &str, &str, &str, &str)] = &[
    ("hosts-2x2", 4, "2", "1", "", ""),
    ("hosts-3x2", 6, "2", "1", "", ""),
    ("hosts-2x4", 8, "4", "1", "", ""),
    ("hosts-2x2-bucket64", 4, "2", "1", "64", ""),
    ("hosts-2x2-one-chunk", 4, "2", "1", "", "67108864"),
    ("hosts-2x2-chunks64k", 4, "2", "1", "", "65536"),
    ("hosts-1x2-chunks64k", 2, "2", "0", "", "65536"),
    ("hosts-2x1", 2, "1", "0", "", ""),
    ("hosts-1x4", 4, "4", "0", "", ""),
    ("hosts-2+1", 3, "2", "0", "", ""),
    ("hosts-3+3", 6, "3", "0", "", ""),
];

/// The case of a table no rank may hold (each rank's memory limited), run on 4 ranks
/// only, once with each layout.
const LIMITED: &str = "a_table_no_rank_can_hold_trains_on_its_owners";

/// Settings that are not numbers (or not 0 or 1): the case of each, run alone, checks
/// that making a store fails with an error naming the variable.
const BAD_SETTINGS: &[(&str, &str, &str)] = &[
    ("KVSTORE_MPI_BUCKET_BYTES", "lots", "bucket_bytes_come_from_the_environment"),
    ("KVSTORE_TIMEOUT", "soon", "timeout_comes_from_the_environment"),
    ("KVSTORE_MPI_SHARED_MEMORY", "maybe", "shared_memory_comes_from_the_environment"),
    ("KVSTORE_MPI_HOST_RANKS", "0", "host_ranks_come_from_the_environment"),
    ("KVSTORE_MPI_HOST_CHUNK_BYTES", "lots", "host_chunk_bytes_come_from_the_environment"),
    ("KVSTORE_MPI_HOST_CHUNK_BYTES", "4096", "host_chunk_bytes_come_from_the_environment"),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("case"), Some(name)) => run_case(name, true),
        (Some("setting"), Some(name)) => run_case(name, false),
        _ => {
            let mut args = Arguments::from_args();
            // One job at a time: a job's ranks take the machine's cores.
            args.test_threads = Some(1);
            libtest_mimic::run(&args, trials()).exit_code()
        }
    }
}

/// Runs case `name` on this rank (a panic fails the job), then finalises MPI.
fn run_case(name: &str, finalize: bool) -> ExitCode {
    let Some((_, case)) = cases::CASES.iter().find(|(n, _)| *n == name) else {
        eprintln!("mpi: no case {name}");
        return ExitCode::FAILURE;
    };
    case();
    // (The finalize case finalises on its own.)
    // (Nor does a case whose ranks' settings differ: MPI ended with the store refused.)
    let refused =
        name == "settings_that_differ_between_ranks_are_refused" && std::env::var_os("KVSTORE_TEST_DIFFERS").is_some();
    if finalize && name != "finalize_runs_the_calls_still_queued" && !refused {
        kvstore_mpi::finalize().expect("finalize");
    }
    ExitCode::SUCCESS
}

fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    for &(run, np, env, extra) in RUNS {
        for &(name, _) in cases::CASES.iter().filter(|(name, _)| *name != LIMITED) {
            trials.push(Trial::test(format!("{run}::{name}"), move || {
                let mut cmd = jobs::mpirun(np, env);
                cmd.args(extra).arg(this_program()).args(["case", name]);
                passed(jobs::run(cmd, LIMIT))
            }));
        }
    }
    for &(run, np, k, by_hosts, bucket, chunk) in HOST_RUNS {
        trials.push(Trial::test(format!("{run}::big_sums_go_host_by_host_with_the_same_bits"), move || {
            let env = [
                ("KVSTORE_MPI_HOST_RANKS", k),
                ("KVSTORE_TEST_HOST_BY_HOST", by_hosts),
                ("KVSTORE_MPI_BUCKET_BYTES", bucket),
                ("KVSTORE_MPI_HOST_CHUNK_BYTES", chunk),
            ];
            let mut cmd = jobs::mpirun(np, &env);
            cmd.arg(this_program()).args(["case", "big_sums_go_host_by_host_with_the_same_bits"]);
            passed(jobs::run(cmd, LIMIT))
        }));
    }
    // A table bigger than any rank may hold, 4 ranks with their memory limited: trained
    // on its owners, refused replicated.
    for layout in ["owners", "replicated"] {
        trials.push(Trial::test(format!("memory-limited-np4-{layout}::{LIMITED}"), move || {
            let mut cmd = jobs::mpirun(4, &[("KVSTORE_LAYOUT", layout)]);
            cmd.arg(this_program()).args(["case", LIMITED]);
            passed(jobs::run(cmd, LIMIT))
        }));
    }
    for &(var, value, case) in BAD_SETTINGS {
        trials.push(Trial::test(format!("settings::{var}_{value}_is_refused"), move || {
            let mut cmd = Command::new(this_program());
            cmd.env(var, value).args(["setting", case]);
            passed(jobs::run(cmd, LIMIT))
        }));
    }
    // mpirun's MPMD form: ranks started with one setting and ranks with another, which
    // must agree. Blocks of ranks as hosts on half the ranks: every rank makes the same
    // split of the world, and they sum flat. Shared memory on one rank and off on the
    // other: the first fused sum agrees on MPI's messages for both, instead of one rank
    // waiting at a barrier the other never reaches.
    for (name, np, (var, first, second), case) in [
        (
            "host_ranks_on_some_ranks_only_sum_flat",
            2,
            ("KVSTORE_MPI_HOST_RANKS", "2", ""),
            "big_sums_go_host_by_host_with_the_same_bits",
        ),
        (
            "ranks_with_shared_memory_on_and_off_agree",
            1,
            ("KVSTORE_MPI_SHARED_MEMORY", "1", "0"),
            "a_key_sums_alike_alone_and_fused",
        ),
    ] {
        trials.push(Trial::test(format!("settings::{name}"), move || {
            let mut cmd = jobs::mpirun(np, &[(var, first)]);
            let np = np.to_string();
            cmd.arg(this_program()).args(["case", case, ":", "-x", &format!("{var}={second}"), "-np", &np]);
            cmd.arg(this_program()).args(["case", case]);
            passed(jobs::run(cmd, LIMIT))
        }));
    }
    // Settings that shape the ranks' messages, set on one rank only: refused on every
    // rank, instead of messages that do not match.
    for var in ["KVSTORE_MPI_HOST_CHUNK_BYTES", "KVSTORE_MPI_BUCKET_BYTES"] {
        trials.push(Trial::test(format!("settings::{var}_on_one_rank_only_is_refused"), move || {
            let mut cmd = jobs::mpirun(1, &[(var, "65536"), ("KVSTORE_TEST_DIFFERS", var)]);
            let case = "settings_that_differ_between_ranks_are_refused";
            cmd.arg(this_program()).args(["case", case, ":", "-x", &format!("{var}="), "-np", "1"]);
            cmd.args(["-x", &format!("KVSTORE_TEST_DIFFERS={var}")]).arg(this_program()).args(["case", case]);
            passed(jobs::run(cmd, LIMIT))
        }));
    }
    trials
}

fn this_program() -> std::path::PathBuf {
    std::env::current_exe().expect("this test's program")
}

/// A job that exited with 0 passed; otherwise its output says why not.
fn passed(job: jobs::Job) -> Result<(), Failed> {
    match job.code {
        Some(0) => Ok(()),
        None => Err(format!("the job ran past {LIMIT:?} (it hung): {}", job.shown()).into()),
        Some(_) => Err(job.shown().into()),
    }
}
