//! The JVM under `mpirun`: the Clojure examples of `clojure/examples/` run as MPI jobs
//! against the MPI jar, `target/kvstore-mpi.jar` (`make jar FEATURES=mpi`, which
//! `scripts/test-mpi.sh` builds first; `KVSTORE_MPI_JAR` names another), with Debian's
//! Clojure. Each test checks what the job's ranks printed, its exit status and how long
//! it took:
//!  - `dist_train.clj` trains to the same weights on every rank, to the last bit, with
//!    the final loss near the noise floor and the weights near the true ones; alone (a
//!    job of one worker) too;
//!  - stopped after epoch 5 and restarted from its checkpoint, it ends with the bits of
//!    a job that never stopped, and one process resumes the two ranks' checkpoint;
//!  - a JVM rank that throws ends the job within seconds (`dying_rank.clj`);
//!  - `dist_async` with a Clojure updater takes every push of every rank (`async_sum.clj`);
//!  - a call refused on one rank only (a disposed array) fails on both, whose next calls
//!    stay matched, and a row-sparse table on its owners takes every rank's rows
//!    (`refused_rank.clj`).
//!
//! Run by `scripts/test-mpi.sh` under cargo-nextest, one job at a time (the `mpi-jobs`
//! test group of `.config/nextest.toml`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[path = "support/jobs.rs"]
mod jobs;

use jobs::Job;

/// The longest a training job may take (a JVM starts and loads Clojure on every rank).
const LIMIT: Duration = Duration::from_secs(300);

/// The workspace's folder.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace's folder")
}

/// `java … clojure.main clojure/examples/EXAMPLE.clj ARGS` with the MPI jar and
/// Debian's Clojure on the class path, as arguments (after `mpirun`'s, or alone).
fn clojure(example: &str, args: &[&str]) -> Vec<String> {
    let jar = std::env::var_os("KVSTORE_MPI_JAR").map_or_else(|| root().join("target/kvstore-mpi.jar"), PathBuf::from);
    assert!(
        jar.exists(),
        "{} not found: build it with `make jar FEATURES=mpi` (scripts/test-mpi.sh does)",
        jar.display()
    );
    let share = Path::new("/usr/share/java");
    let mut path = vec![jar];
    path.extend(["clojure.jar", "spec.alpha.jar", "core.specs.alpha.jar"].map(|j| share.join(j)));
    let path = std::env::join_paths(path).expect("a class path");
    let script = root().join("clojure/examples").join(example);
    // An empty java.library.path: the library is the jar's bundled copy, not one that a
    // library path of the test's (cargo's target folders) would find first. Its name
    // holds "cp" on purpose, so that every run checks the order below.
    let empty = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jvm-empty-cp");
    std::fs::create_dir_all(&empty).expect("an empty folder");
    let text = |p: std::ffi::OsString| p.into_string().expect("a path in UTF-8");
    // `-cp` first: mpirun rewrites a java command's class path, and takes the first
    // argument that holds the letters "cp" for its option (a folder named
    // /tmp/tmp.fcpH9… in the library path was taken for it, and the job failed).
    let mut all: Vec<String> = vec!["java".into(), "-cp".into(), text(path)];
    all.push("-Dclojure.main.report=stderr".into());
    all.push(format!("-Djava.library.path={}", text(empty.into_os_string())));
    all.extend(["clojure.main".into(), text(script.into_os_string())]);
    all.extend(args.iter().map(ToString::to_string));
    all
}

/// A job of `np` ranks running `example`; with `outputs`, each rank's output also goes
/// to a file of its own under that folder (`--output-filename`).
fn mpirun(np: usize, example: &str, args: &[&str], outputs: Option<&Path>, limit: Duration) -> Job {
    let mut cmd = jobs::mpirun(np, &[]);
    if let Some(dir) = outputs {
        let _ = std::fs::remove_dir_all(dir);
        cmd.arg("--output-filename").arg(dir);
    }
    cmd.args(clojure(example, args));
    jobs::run(cmd, limit)
}

/// `example` in one process, without `mpirun`.
fn alone(example: &str, args: &[&str]) -> Job {
    let all = clojure(example, args);
    let mut cmd = Command::new(&all[0]);
    cmd.args(&all[1..]);
    jobs::run(cmd, LIMIT)
}

/// A folder of this test's own under cargo's folder for tests' files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("jvm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What each rank printed to its standard output, in rank order, from a job's
/// `--output-filename` folder (`DIR/1/rank.N/stdout`).
fn rank_outputs(dir: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("1"))
        .map(|ranks| ranks.filter_map(Result::ok).map(|r| r.path().join("stdout")).filter(|f| f.exists()).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).expect("a rank's output")).collect()
}

/// Checks the training that `dist_train.clj` printed on each rank (`outputs`): every
/// rank printed its weights' bits, the same on all; nine parameters each, learned within
/// 0.05 of the true ones; the final loss below 0.015 (the noise floor is 0.01).
/// Returns the bits.
fn trained(outputs: &[String], job: &Job) -> String {
    let mut bits = Vec::new();
    for out in outputs {
        let lines = || out.lines().map(|l| l.split_once(": ").map_or(l, |(_, rest)| rest));
        let loss: f64 = lines()
            .rev()
            .find(|l| l.starts_with("epoch "))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no epoch's loss: {}", job.shown()));
        assert!(loss < 0.015, "final loss {loss} is not below 0.015: {}", job.shown());
        let params: Vec<(f64, f64)> = lines()
            .filter(|l| l.starts_with("w[") || l.starts_with("b "))
            .map(|l| {
                let v: Vec<f64> = l.split_whitespace().skip(1).map(|x| x.parse().expect("a number")).collect();
                (v[0], v[1])
            })
            .collect();
        assert_eq!(params.len(), 9, "parameter rows: {}", job.shown());
        for (learned, truth) in params {
            assert!((learned - truth).abs() <= 0.05, "a weight is {learned}, the true one {truth}: {}", job.shown());
        }
        let line = lines().find_map(|l| l.strip_prefix("bits ")).unwrap_or_else(|| panic!("no bits: {}", job.shown()));
        bits.push(line.to_string());
    }
    assert!(!bits.is_empty(), "no rank printed anything: {}", job.shown());
    assert!(bits.iter().all(|b| *b == bits[0]), "the ranks hold different weights: {bits:?}");
    bits.swap_remove(0)
}

/// `dist_train.clj` on 2 ranks with `args`: each rank's output, after checking that the
/// job exited with 0.
fn train_on_two(args: &[&str], name: &str) -> (Job, Vec<String>) {
    let dir = scratch(name);
    let job = mpirun(2, "dist_train.clj", args, Some(&dir), LIMIT);
    let outputs = rank_outputs(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(job.code, Some(0), "the job failed (None: it hung): {}", job.shown());
    assert_eq!(outputs.len(), 2, "rank outputs: {}", job.shown());
    (job, outputs)
}

#[test]
fn dist_train_on_two_ranks_learns_the_same_bits_on_both() {
    let (job, outputs) = train_on_two(&[], "two");
    trained(&outputs, &job);
}

#[test]
fn dist_train_without_mpirun_is_a_job_of_one_worker() {
    let job = alone("dist_train.clj", &[]);
    assert_eq!(job.code, Some(0), "the job failed: {}", job.shown());
    assert!(job.output.contains("over 1 ranks"), "{}", job.shown());
    trained(std::slice::from_ref(&job.output), &job);
}

/// Stopped after epoch 5 (checkpoints at epochs 2 and 4) and restarted with `--resume`
/// on its checkpoint folder, the job resumes from epoch 4 and ends with the weights of
/// a job that never stopped, to the last bit.
#[test]
fn dist_train_stopped_and_resumed_ends_with_the_bits_of_a_job_that_never_stopped() {
    let (job, outputs) = train_on_two(&[], "never-stopped");
    let whole = trained(&outputs, &job);
    let ck = scratch("checkpoints");
    let ck_arg = ck.to_str().expect("a path in UTF-8");
    train_on_two(&["--checkpoint-dir", ck_arg, "--epochs", "5"], "stopped");
    assert!(ck.join("epoch-04.ckpt").exists(), "no checkpoint of epoch 4 in {}", ck.display());
    let (job, outputs) = train_on_two(&["--checkpoint-dir", ck_arg, "--resume", ck_arg], "resumed");
    let _ = std::fs::remove_dir_all(&ck);
    let said = format!("resumed from {ck_arg}/epoch-04.ckpt at epoch 4 on 2 ranks");
    assert!(outputs.iter().all(|o| o.contains(&said)), "not every rank said \"{said}\": {}", job.shown());
    assert_eq!(trained(&outputs, &job), whole, "the resumed job's bits differ from the whole job's");
}

/// The checkpoint of a 2-rank job, resumed by one process (fewer ranks): it trains on.
#[test]
fn dist_train_resumes_two_ranks_checkpoint_on_one() {
    let ck = scratch("fewer");
    let ck_arg = ck.to_str().expect("a path in UTF-8");
    train_on_two(&["--checkpoint-dir", ck_arg, "--epochs", "5"], "fewer-stopped");
    let file = format!("{ck_arg}/epoch-04.ckpt");
    let job = alone("dist_train.clj", &["--resume", &file]);
    let _ = std::fs::remove_dir_all(&ck);
    assert_eq!(job.code, Some(0), "the job failed: {}", job.shown());
    let said = format!("resumed from {file} at epoch 4 on 1 ranks");
    assert!(job.output.contains(&said), "it did not say \"{said}\": {}", job.shown());
    trained(std::slice::from_ref(&job.output), &job);
}

/// A JVM rank that throws before its push: the job ends within 30 s, failed, and the
/// other rank's push never returns.
#[test]
fn a_jvm_rank_that_throws_ends_the_job_within_seconds() {
    let job = mpirun(2, "dying_rank.clj", &[], None, Duration::from_secs(120));
    assert!(job.code.is_some_and(|c| c != 0), "the job ended otherwise (None: it hung): {}", job.shown());
    assert!(job.elapsed < Duration::from_secs(30), "the job took too long: {}", job.shown());
    assert!(job.output.contains("rank 1 fails before its push"), "{}", job.shown());
    assert!(!job.output.contains("push returned"), "a push returned: {}", job.shown());
}

/// dist_async with a Clojure updater on the owners: every push of both ranks (10 + 10
/// steps of rank + step, then 100 each) lands once: 2 × 45 + 10 + 200 = 300; the key
/// split over both ranks 20.
#[test]
fn dist_async_from_clojure_takes_every_push_of_every_rank() {
    let job = mpirun(2, "async_sum.clj", &[], None, LIMIT);
    assert_eq!(job.code, Some(0), "the job failed (None: it hung): {}", job.shown());
    let count = |end: &str| job.output.lines().filter(|l| l.ends_with(end)).count();
    assert_eq!(count(": sum 300.0"), 2, "both ranks must pull 300: {}", job.shown());
    assert_eq!(count(": big 20.0"), 2, "both ranks must pull 20: {}", job.shown());
}

/// A call that rank 1 refuses in Java (a disposed array), in each form of call, fails
/// on both ranks as that call, and the ranks' next calls stay matched: each rank prints
/// `rank R: ok` when everything held.
#[test]
fn a_call_refused_on_one_jvm_rank_fails_on_both() {
    let job = mpirun(2, "refused_rank.clj", &[], None, Duration::from_secs(120));
    assert_eq!(job.code, Some(0), "the job failed (None: it hung): {}", job.shown());
    let oks = job.output.lines().filter(|l| *l == "rank 0: ok" || *l == "rank 1: ok").count();
    assert_eq!(oks, 2, "{oks} of 2 ranks ok: {}", job.shown());
}
