//! Running `mpirun` jobs from a test: each job's output goes to a file (not a pipe: a
//! job that hangs must not hang its reader too), and a job that outlives its limit gets
//! SIGTERM and counts as hung. Shared by `faults.rs` and `mpi/main.rs`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What became of a job.
pub struct Job {
    /// Its exit status; `None` when it ran past its limit (and was ended).
    pub code: Option<i32>,
    pub elapsed: Duration,
    /// Every rank's output and `mpirun`'s, as one text.
    pub output: String,
}

impl Job {
    /// The job, for a failure's message.
    pub fn shown(&self) -> String {
        format!("exit {:?} after {:?}; output:\n{}", self.code, self.elapsed, self.output)
    }
}

/// `mpirun` with `np` ranks, allowed to run as root and to put more ranks than cores on
/// this machine (Open MPI refuses both unless told), with `env` set on every rank.
pub fn mpirun(np: usize, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd.args(["--oversubscribe", "--bind-to", "none"]);
    for (name, value) in env {
        cmd.env(name, value).args(["-x", name]);
    }
    cmd.args(["-np", &np.to_string()]);
    cmd
}

/// Runs `cmd` for at most `limit` (in `CARGO_TARGET_TMPDIR` unless it names a folder).
pub fn run(mut cmd: Command, limit: Duration) -> Job {
    // A file per job (tests may run in parallel, some over the same program).
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "job-{}-{}.log",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::File::create(&log).expect("a log file");
    cmd.stdout(file.try_clone().expect("the log file")).stderr(file).stdin(Stdio::null());
    // Not in the crate's folder: a rank that ends its job (a stall, a desync) writes its
    // last events in the working directory.
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(env!("CARGO_TARGET_TMPDIR"));
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("the job did not start: is Open MPI installed (scripts/setup-mpi.sh)?");
    let code = loop {
        if let Some(status) = child.try_wait().expect("waiting for the job") {
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
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let mut output = String::new();
    std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut output)).expect("reading the job's log");
    let _ = std::fs::remove_file(&log);
    Job { code, elapsed, output }
}
