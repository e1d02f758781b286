//! The suite's runs (see the crate docs): each starts the job under `mpirun`, sends a
//! fault to a random rank at a random moment, waits for the job, checks its checkpoints
//! and resumes it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use super::{checkpoints, step_of, verify};

const STEPS: u64 = 32;
const EVERY: u64 = 4;
const STEP_MS: u64 = 20;
/// The longest a job may take: more is a hang.
const BOUND: Duration = Duration::from_secs(60);
/// The watchdog's timeout for a stopped rank (`KVSTORE_TIMEOUT`).
const TIMEOUT_S: &str = "5";

#[path = "../support/random.rs"]
mod random;
use random::Random;

/// What the suite counted over its runs, for the summary.
#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
    kills: u64,
    stops: u64,
    late: u64,
    hangs: u64,
    at_call: u64,
    in_data: u64,
    at_finalize: u64,
    checkpoints: usize,
    resumes: u64,
    /// Each run, and why it failed (`None`: it passed): the suite's JUnit XML report.
    cases: Vec<(String, Option<String>)>,
}

/// Runs the suite; whether every run passed.
pub fn run() -> bool {
    let runs: u64 = std::env::var("KVSTORE_CHAOS_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    let seed = std::env::var("KVSTORE_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        (now.as_secs() + u64::from(std::process::id())) % 32768
    });
    let mut random = Random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-logs/chaos");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).expect("the suite's folder");
    let exe = std::env::current_exe().expect("this program's path");
    println!("chaos: {runs} runs of a 4-rank job ({STEPS} steps, a checkpoint every {EVERY}), seed {seed}");
    let mut counts = Counts::default();
    for i in 1..=runs {
        one_run(&exe, &logs.join(format!("run-{i}")), i, &mut random, &mut counts);
    }
    let c = &counts;
    println!(
        "chaos summary: runs {runs}, kills {}, stops {}, faults after the job had finished {}, hangs {}, watchdog \
         endings {} ({} at a call's comparison, {} inside a collective, {} in finalize), checkpoints loaded {}, \
         resumes {} of {runs} (seed {seed})",
        c.kills,
        c.stops,
        c.late,
        c.hangs,
        c.at_call + c.in_data + c.at_finalize,
        c.at_call,
        c.in_data,
        c.at_finalize,
        c.checkpoints,
        c.resumes
    );
    println!("chaos: {} passed, {} failed", c.passed, c.failed);
    let reports = std::env::var_os("KVSTORE_REPORTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-reports/chaos"));
    let written =
        std::fs::create_dir_all(&reports).and_then(|()| std::fs::write(reports.join("chaos.xml"), junit_xml(&c.cases)));
    if let Err(e) = written {
        println!("chaos: the report in {} was not written: {e}", reports.display());
        return false;
    }
    c.failed == 0
}

/// The runs as JUnit XML: a test case each, with a failure saying why where it failed.
fn junit_xml(cases: &[(String, Option<String>)]) -> String {
    let escape = |s: &str| {
        s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
    };
    let mut xml = format!("<testsuite name=\"chaos\" tests=\"{}\">\n", cases.len());
    for (name, failure) in cases {
        let body = failure.as_ref().map(|why| format!("<failure message=\"{}\"/>", escape(why))).unwrap_or_default();
        xml += &format!("  <testcase classname=\"chaos\" name=\"{}\">{body}</testcase>\n", escape(name));
    }
    xml + "</testsuite>\n"
}

fn one_run(exe: &Path, dir: &Path, i: u64, random: &mut Random, counts: &mut Counts) {
    std::fs::create_dir_all(dir).expect("the run's folder");
    let victim = random.below(4);
    let stop = random.below(2) == 1;
    let at = Duration::from_millis(500 + random.below(4500));
    std::fs::write(dir.join("started"), "").expect("the run's start mark");
    let dir_arg = dir.to_str().expect("a folder named in UTF-8");
    let (steps, every, step_ms) = (STEPS.to_string(), EVERY.to_string(), STEP_MS.to_string());
    let start = Instant::now();
    let job = mpirun(exe, 4, &["train", dir_arg, &steps, &every, &step_ms], &dir.join("job.log"));
    std::thread::sleep(at);
    let signal = if stop { libc::SIGSTOP } else { libc::SIGKILL };
    let mut what = format!("SIG{} to rank {victim} at {} ms", if stop { "STOP" } else { "KILL" }, at.as_millis());
    let pid: Option<i32> =
        std::fs::read_to_string(dir.join(format!("rank-{victim}.pid"))).ok().and_then(|p| p.parse().ok());
    // A rank that has finalised MPI is done with the store: a fault then is "after".
    // SAFETY: kill takes a process id and a signal number; nothing else.
    let sent = pid.is_some_and(|pid| {
        !dir.join(format!("rank-{victim}.done")).exists() && unsafe { libc::kill(pid, signal) } == 0
    });
    match (sent, stop) {
        (true, true) => counts.stops += 1,
        (true, false) => counts.kills += 1,
        (false, _) => {
            what.push_str(&format!(": came after rank {victim} had finished with MPI"));
            counts.late += 1;
        }
    }
    let code = wait(job);
    let took = start.elapsed();
    reap(exe, dir);
    let mut problems = Vec::new();
    // (A rank killed by SIGKILL makes mpirun exit 137 too: only the time tells a hang.)
    if code.is_none() || took >= BOUND {
        counts.hangs += 1;
        problems.push(format!("the job did not end within {} s", BOUND.as_secs()));
    }
    // What ended a job with a stopped rank: the watchdog, at a call's comparison, inside
    // a collective that moves data, or in finalize.
    let log = read(&dir.join("job.log"));
    if log.contains("never arrived") {
        counts.at_call += 1;
    } else if log.contains("has not moved") {
        counts.in_data += 1;
    } else if log.contains("MPI_Finalize has not returned") {
        counts.at_finalize += 1;
    } else if stop && sent && code != Some(0) {
        problems.push("the job with a stopped rank ended without the watchdog".to_string());
    }
    let (loaded, bad) = verify(dir);
    counts.checkpoints += loaded;
    if let Some(bad) = bad {
        problems.push(format!("a checkpoint does not load: {bad}"));
    }
    // Resume from the latest checkpoint, on 4 or 2 ranks.
    let saved = checkpoints(dir);
    let latest = saved.last();
    let np = if random.below(2) == 0 { 4 } else { 2 };
    let from = latest.map_or(0, |p| step_of(p));
    let to = from + 8;
    for r in 0..4 {
        let _ = std::fs::remove_file(dir.join(format!("rank-{r}.pid")));
        let _ = std::fs::remove_file(dir.join(format!("rank-{r}.done")));
    }
    let (to_arg, mut args) = (to.to_string(), vec!["train", dir_arg]);
    args.extend([to_arg.as_str(), every.as_str(), "0"]);
    let latest_arg = latest.map(|p| p.to_string_lossy().into_owned());
    args.extend(latest_arg.as_deref());
    let resumed = wait(mpirun(exe, np, &args, &dir.join("resume.log")));
    reap(exe, dir);
    let log = read(&dir.join("resume.log"));
    let prefix = format!(": step {to} weights ");
    let weights: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("rank ") && l.contains(&prefix))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    let agreed = weights.windows(2).all(|w| w[0] == w[1]);
    if resumed == Some(0) && weights.len() == np && agreed {
        counts.resumes += 1;
    } else {
        problems.push(format!("the resumed job (np {np}, from step {from}) failed: exit {resumed:?}"));
    }
    let line = format!(
        "run {i}: {what}; the job ended in {} ms (exit {code:?}); resumed on {np} ranks from step {from} to {to}",
        took.as_millis()
    );
    let why = (!problems.is_empty()).then(|| problems.join("; "));
    counts.cases.push((line.clone(), why));
    if problems.is_empty() {
        println!("{line}: ok");
        counts.passed += 1;
        let _ = std::fs::remove_dir_all(dir);
    } else {
        println!("{line}: FAILED: {} (files: {})", problems.join("; "), dir.display());
        for name in ["job.log", "resume.log"] {
            let log = read(&dir.join(name));
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            println!("== {name} (last lines)\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        counts.failed += 1;
    }
}

/// Starts `exe args` under `mpirun` on `np` ranks, its output into `log`.
fn mpirun(exe: &Path, np: usize, args: &[&str], log: &Path) -> (Child, Instant) {
    let file = std::fs::File::create(log).expect("a log file");
    let child = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("KVSTORE_TIMEOUT", TIMEOUT_S)
        .args(["--oversubscribe", "--bind-to", "none", "-x", "KVSTORE_TIMEOUT", "-np", &np.to_string()])
        .arg(exe)
        .args(args)
        // Beside its log: a rank that ends the job writes its last events there.
        .current_dir(log.parent().expect("the log's folder"))
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("the log file"))
        .stderr(file)
        .spawn()
        .expect("mpirun did not start: is Open MPI installed (scripts/setup-mpi.sh)?");
    (child, Instant::now())
}

/// The job's exit status, or `None` when it ran past `BOUND` (then it is ended: SIGTERM,
/// and SIGKILL 5 s later).
fn wait((mut child, start): (Child, Instant)) -> Option<i32> {
    let mut termed = None;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            return if termed.is_some() { None } else { status.code().or(Some(128 + 9)) };
        }
        match termed {
            None if start.elapsed() > BOUND => {
                let pid = i32::try_from(child.id()).expect("a process id");
                // SAFETY: kill takes a process id and a signal number; nothing else.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                termed = Some(Instant::now());
            }
            Some(at) if at.elapsed() > Duration::from_secs(5) => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends every process of a run (found by the folder on its command line), and removes
/// what killed processes leave behind: a rank's shared-memory segment, mpirun's session
/// folder (those made since the run's `started` mark, whose process is gone).
fn reap(exe: &Path, dir: &Path) {
    let (exe, dir) = (exe.to_string_lossy(), dir.to_string_lossy());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.first().is_some_and(|a| *a == exe)
            && args.get(1).is_some_and(|a| a == "train")
            && args.get(2).is_some_and(|a| *a == dir)
        {
            // SAFETY: kill takes a process id and a signal number; nothing else.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = std::fs::metadata(Path::new(dir.as_ref()).join("started")).and_then(|m| m.modified()).ok();
    let newer = |p: &Path| {
        let modified = std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((modified, started), (Some(m), Some(s)) if m >= s)
    };
    for entry in std::fs::read_dir("/dev/shm").into_iter().flatten().flatten() {
        let path = entry.path();
        let in_use = || Command::new("fuser").arg("-s").arg(&path).status().is_ok_and(|s| s.success());
        if entry.file_name().to_string_lossy().starts_with("vader_segment.") && newer(&path) && !in_use() {
            let _ = std::fs::remove_file(&path);
        }
    }
    for session in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        if !session.file_name().to_string_lossy().starts_with("ompi.") {
            continue;
        }
        for job in std::fs::read_dir(session.path()).into_iter().flatten().flatten() {
            let name = job.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("pid.").and_then(|p| p.parse::<i32>().ok()) else { continue };
            // SAFETY: signal 0 only asks whether the process exists.
            if newer(&job.path()) && unsafe { libc::kill(pid, 0) } != 0 {
                let _ = std::fs::remove_dir_all(job.path());
            }
        }
        let _ = std::fs::remove_dir(session.path());
    }
}

fn read(path: &Path) -> String {
    let mut text = String::new();
    let _ = std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text));
    text
}
