//! MPI jobs in which a worker dies, is stuck or stops: each must end within seconds
//! (MPI's fail-stop, or the watchdog's `KVSTORE_TIMEOUT`), never hang, and say what
//! happened. Every test runs `mpirun` over one of the fixture programs
//! (`tests/fixtures/`, this crate's binaries with the `mpi` feature) and checks its
//! exit status, how long it took and what its ranks printed.
//!
//! Run by `scripts/test-mpi.sh` (`cargo test -p kvstore-mpi --features mpi --test
//! faults -- --test-threads=1`: the jobs oversubscribe the machine's cores).

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The exit status of a job that the watchdog ended (`KVSTORE_TIMEOUT`).
const WATCHDOG: i32 = 86;

/// What became of an `mpirun` job.
struct Job {
    /// Its exit status; `None` when it ran past its limit (and was ended).
    code: Option<i32>,
    elapsed: Duration,
    /// Every rank's output and `mpirun`'s, as one text.
    output: String,
}

impl Job {
    /// Checks that the job ended with `code`, within 30 s, having printed `said` and
    /// not `not_said`; the failure shows the job's output.
    fn ended(&self, code: impl Fn(i32) -> bool, said: &str, not_said: &str) {
        let Job { code: got, elapsed, output } = self;
        let shown = || format!("exit {got:?} after {elapsed:?}; output:\n{output}");
        assert!(got.is_some_and(code), "the job ended otherwise (None: it hung): {}", shown());
        assert!(*elapsed < Duration::from_secs(30), "the job took too long: {}", shown());
        assert!(output.contains(said), "the job did not say \"{said}\": {}", shown());
        assert!(!output.contains(not_said), "the job said \"{not_said}\": {}", shown());
    }
}

/// Runs `exe args` on `np` ranks, with `env` set on every rank, for at most `limit`.
fn mpirun(np: usize, exe: &str, args: &[&str], env: &[(&str, &str)]) -> Job {
    let limit = Duration::from_secs(100);
    let mut cmd = Command::new("mpirun");
    // Open MPI refuses root unless told, and needs --oversubscribe for more ranks than cores.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd.args(["--oversubscribe", "--bind-to", "none"]);
    for (name, value) in env {
        cmd.env(name, value).args(["-x", name]);
    }
    cmd.args(["-np", &np.to_string(), exe]).args(args);
    // Into a file, not a pipe: a job that hangs must not hang its reader too. A file per
    // job (tests run in parallel unless told otherwise, some over the same fixture).
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "faults-{}-{}.log",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::File::create(&log).expect("a log file");
    cmd.stdout(file.try_clone().expect("the log file")).stderr(file).stdin(Stdio::null());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("mpirun did not start: is Open MPI installed (scripts/setup-mpi.sh)?");
    let code = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break status.code();
        }
        if start.elapsed() > limit {
            // SIGTERM: mpirun ends its ranks too (a SIGKILL would leave them behind).
            let pid = i32::try_from(child.id()).expect("a process id");
            // SAFETY: kill takes a process id and a signal number; nothing else.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let mut output = String::new();
    std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut output)).expect("reading the job's log");
    let _ = std::fs::remove_file(&log);
    Job { code, elapsed, output }
}

#[test]
fn a_worker_stuck_before_a_push_ends_the_job_naming_it() {
    let env = [("KVSTORE_STALL_AT", "push"), ("KVSTORE_TIMEOUT", "3")];
    let job = mpirun(3, env!("CARGO_BIN_EXE_fixture_stall"), &[], &env);
    job.ended(|c| c == WATCHDOG, "push #2 has waited 3 s for rank 2, which never arrived", "returned although");
}

#[test]
fn a_worker_stuck_before_finalize_ends_the_job_naming_it() {
    let env = [("KVSTORE_STALL_AT", "finalize"), ("KVSTORE_TIMEOUT", "3")];
    let job = mpirun(3, env!("CARGO_BIN_EXE_fixture_stall"), &[], &env);
    job.ended(|c| c == WATCHDOG, "finalize has waited 3 s for rank 2, which never arrived", "returned although");
}

#[test]
fn a_dist_async_rank_that_stopped_ends_the_job_naming_it() {
    let job = mpirun(3, env!("CARGO_BIN_EXE_fixture_async_stall"), &[], &[("KVSTORE_TIMEOUT", "3")]);
    job.ended(|c| c == WATCHDOG, "waited 3 s for rank 2 to answer a dist_async request", "returned although");
}

/// A rank inside a blocking `dist_sync` call answers no `dist_async` request
/// (documented): the job ends after the timeout, and the messages say why.
#[test]
fn a_dist_async_request_to_a_rank_inside_dist_sync_ends_the_job_saying_why() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_async_stall"), &["dist_sync"], &[("KVSTORE_TIMEOUT", "3")]);
    let said = "a rank inside a blocking dist_sync call answers no dist_async request";
    job.ended(|c| c == WATCHDOG, said, "went on although");
}

/// A `dist_async` rank that finalizes right after its last call goes on answering the
/// pulls of a rank that is still working, until that one finalizes too.
#[test]
fn a_dist_async_rank_that_finished_early_keeps_answering() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_async_early_finish"), &[], &[]);
    job.ended(|c| c == 0, "every one saw its push", "panicked");
}

/// A worker that dies while the other waits in a blocking push: the job ends, failed.
#[test]
fn a_worker_that_died_during_a_blocking_push_ends_the_job() {
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_early_exit"), &[], &[]);
    job.ended(|c| c != 0, "rank 1: exiting without pushing", "push returned");
}

/// A worker that dies while the other has non-blocking pushes queued: the job ends,
/// failed.
#[test]
fn a_worker_that_died_during_non_blocking_pushes_ends_the_job() {
    let env = [("KVSTORE_EARLY_EXIT_NONBLOCKING", "1")];
    let job = mpirun(2, env!("CARGO_BIN_EXE_fixture_early_exit"), &[], &env);
    job.ended(|c| c != 0, "rank 1: exiting without pushing", "push returned");
}
