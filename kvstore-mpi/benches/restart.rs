//! The restart rows of `make bench`: how long a `dist_sync` job stands still when a rank
//! dies. A job of a 100 MB store with Adam (315 MB with its state), committing every
//! step, runs under `kvstore-run` on 2 and on 3 ranks; once it committed step 3, its last
//! rank is killed (SIGKILL). The rows are the medians of `KVSTORE_BENCH_RUNS` such kills
//! (at most 5, 3 by default) of the time from the kill to the first step completed after
//! the restart, and its parts, each read from the job's output as it comes:
//! - detection: from the kill to `mpirun`'s report of it;
//! - ending: from that report to the launcher's restart (mpirun ends the other ranks);
//! - relaunch: from the restart to the restore's start (mpirun starts the ranks, MPI
//!   starts, the store is made);
//! - restore: what rank 0 says it took (reading the commit, checking it, loading it);
//! - first step: from the restore's end to the first step's commit.
//!
//! Rank 0 writes nothing: this program is not run under mpirun; it runs the launcher. It
//! writes the rows as JSON to its first argument (default `target/bench/restart.json`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvstore_tests::bench::median_of;

/// What a run of the job said, and when this program read it.
type Said = mpsc::Receiver<(Instant, String)>;

/// The next line for which `pick` says something, within `limit` of now.
fn wait_for<T>(said: &Said, limit: Duration, what: &str, mut pick: impl FnMut(&str) -> Option<T>) -> (Instant, T) {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match said.recv_timeout(left) {
            Ok((at, line)) => {
                if let Some(t) = pick(&line) {
                    return (at, t);
                }
            }
            Err(_) => panic!("restart bench: no {what} within {limit:?}"),
        }
    }
}

/// How to read one part of a restart.
type Part = fn(&Parts) -> f64;

/// The seconds of each part of one restart (see the module's docs), and the whole.
struct Parts {
    detection: f64,
    ending: f64,
    relaunch: f64,
    restore: f64,
    first_step: f64,
    whole: f64,
}

/// Runs the job on `np` ranks under the launcher, kills its last rank after step 3, and
/// times the restart.
fn restart(np: usize, run: usize) -> Parts {
    let job = format!("bench-restart-{}-{np}-{run}", std::process::id());
    let pids = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&pids).expect("a folder for the ranks' pids");
    let mut launcher = Command::new(kvstore_tests::launcher())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("KVSTORE_TEST_PIDS", &pids)
        .env("KVSTORE_TEST_FLOATS", "25000000")
        .args(["--max-restarts", "1", "--job", &job, "-x", "KVSTORE_TEST_PIDS", "-x", "KVSTORE_TEST_FLOATS"])
        .args(["--oversubscribe", "--bind-to", "none", "-np", &np.to_string()])
        .args([env!("CARGO_BIN_EXE_fixture_commit_job"), "6"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("kvstore-run starts");
    let (tx, said) = mpsc::channel();
    for out in [
        launcher.stdout.take().map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        launcher.stderr.take().map(|e| Box::new(e) as _),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
    }
    let minute = Duration::from_secs(60);
    wait_for(&said, minute, "step 3", |l| (l == "step 3").then_some(()));
    let victim = np - 1;
    let pid = std::fs::read_to_string(pids.join(format!("rank-{victim}.pid"))).expect("the last rank's pid");
    let killed = Instant::now();
    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    let (noticed, ()) = wait_for(&said, minute, "report of the kill", |l| {
        l.starts_with("mpirun noticed that process rank").then_some(())
    });
    let (restarted, ()) = wait_for(&said, minute, "restart", |l| {
        (l.starts_with("kvstore-run: rank ") && l.contains("died")).then_some(())
    });
    let (restored, (step, took)) = wait_for(&said, minute, "restore", |l| {
        let rest = l.strip_prefix("kvstore: restored the commit of step ")?;
        let step: u64 = rest.split(' ').next()?.parse().ok()?;
        let ms = rest.rsplit_once(" in ")?.1.strip_suffix(" ms")?;
        Some((step, ms.parse::<f64>().ok()?))
    });
    let next = format!("step {}", step + 1);
    let (stepped, ()) = wait_for(&said, minute, "first step after the restart", |l| (l == next).then_some(()));
    let status = launcher.wait().expect("the launcher");
    assert!(status.success(), "the job ended well after its restart");
    let _ = std::fs::remove_dir_all(&pids);
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let restore = took / 1e3;
    Parts {
        detection: secs(killed, noticed),
        ending: secs(noticed, restarted),
        relaunch: (secs(restarted, restored) - restore).max(0.0),
        restore,
        first_step: secs(restored, stepped),
        whole: secs(killed, stepped),
    }
}

fn main() -> kvstore_core::Result<()> {
    let out = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "target/bench/restart.json".to_string());
    let runs: usize = std::env::var("KVSTORE_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).clamp(1, 5);
    let mut rows = Vec::new();
    for np in [2, 3] {
        let parts: Vec<Parts> = (0..runs).map(|run| restart(np, run)).collect();
        let median = |f: fn(&Parts) -> f64| median_of(parts.iter().map(f).collect());
        let label = format!("restart {np} ranks");
        let whole = median(|p| p.whole);
        rows.push((
            format!("{label}: from a rank's kill to the first step after the restart (100 MB, Adam)"),
            whole,
            None,
        ));
        let each: [(&str, Part); 5] = [
            ("detection (the kill to mpirun's report)", |p| p.detection),
            ("ending (the report to the restart)", |p| p.ending),
            ("relaunch (the restart to the restore's start)", |p| p.relaunch),
            ("restore (read, check and load the commit)", |p| p.restore),
            ("first step (the restore's end to the step's commit)", |p| p.first_step),
        ];
        let mut said = Vec::new();
        for (name, f) in each {
            let m = median(f);
            said.push(format!("{} {:.2} s", name.split(' ').next().unwrap_or(name), m));
            rows.push((format!("{label}: {name}"), m, None));
        }
        println!("{label}: from the kill to the first step {whole:.2} s (target <= 5 s): {}", said.join(", "));
    }
    kvstore_tests::bench::write_rows(&out, &rows)
}
