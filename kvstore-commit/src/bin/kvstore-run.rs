//! `kvstore-run`: runs a job under `mpirun`, and when a rank of it died (killed by a
//! signal: SIGKILL, a crash, the out-of-memory killer) or was stuck (stopped, or hung in
//! a store's call: the store's watchdog ended the job after `KVSTORE_TIMEOUT`, exit
//! status 86), runs it again, until it ends well or its restarts are spent. The job's
//! stores restore its last commit (`KVStore::commit`): the restart loses at most the
//! steps since then.
//!
//! ```text
//! kvstore-run [--max-restarts N] [--min-np M] [--job NAME] [mpirun's options] -np N PROGRAM ARGS...
//! ```
//!
//! When a whole host is lost (`mpirun` says it lost communication with the daemon of
//! node H) and `--min-np` is given, the job runs again without H: H leaves the host
//! list (`-H`/`--host`, or a copy of `--hostfile` without it, in a folder of the
//! launcher's own, 0700, removed when it ends) and the number of ranks
//! becomes at most the slots left, never below `--min-np` (the launcher stops there).
//! Without `--min-np` it runs again on the same hosts.
//!
//! Every run of the job gets the job's name in `KVSTORE_JOB` (the launcher's own when
//! it has one, else `--job`, else a new one) and its run's number in
//! `KVSTORE_RUN_ATTEMPT` (0 first). A job that fails by itself (its program exited with
//! an error, on every rank or on some, no rank killed or stuck) is not run again: the
//! launcher says so and exits with the job's status. When the job ends well, its
//! commits are removed; when it fails for good, they are kept, and the launcher says how
//! to resume it by hand when its host holds one (the newest's step), or that it holds
//! none.
//!
//! What failed is read from `mpirun`'s own reports only, never from the ranks' output,
//! which may say anything: `mpirun` runs with `--tag-output`, so that every line a rank
//! writes starts with its tag (`[1,0]<stdout>:`), and the launcher passes the ranks'
//! lines on without the tags (as they are when the user asked for a format of
//! `mpirun`'s own: `--tag-output`, `--timestamp-output`, `--xml`).
//!
//! SIGINT, SIGTERM and SIGHUP sent to the launcher go on to `mpirun`, which ends the
//! job; the launcher then does not run it again. Processes of a run left behind by an
//! `mpirun` that was itself killed (their parent gone, they become the launcher's: it is
//! their subreaper) are killed before the next run starts. Unless told otherwise, `mpirun`
//! kills the other ranks of a run at once when one died (Open MPI's
//! `odls_base_sigkill_timeout` 0, not 1 s after asking them to end), and its daemons do
//! not share their hardware topology through memory (`rtc_hwloc_vmhole` none: Debian's
//! Open MPI 4.1 crashes there now and then on other hosts). After a run that
//! did not end well, the shared-memory segments its ranks left on the launcher's host
//! (Open MPI's `vader_segment.*`, made during the run and mapped by no process) are
//! removed.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The exit status of a job that the store's stall watchdog ended (kvstore-mpi's
/// `group.rs`, `WATCHDOG_EXIT`: `MPI_Abort` with it, or a rank's exit in `MPI_Finalize`).
const WATCHDOG_EXIT: i32 = 86;

const USAGE: &str =
    "usage: kvstore-run [--max-restarts N] [--min-np M] [--job NAME] [mpirun's options] -np N PROGRAM ARGS...";

/// What the launcher read of its command line.
struct Options {
    max_restarts: u32,
    /// The fewest ranks to run the job on without a lost host (`None`: never fewer).
    min_np: Option<u32>,
    job: String,
    /// Everything else: `mpirun`'s options, the program and its arguments.
    mpirun: Vec<String>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut max_restarts = 3;
    let mut min_np = None;
    let mut job = std::env::var("KVSTORE_JOB").ok().filter(|j| !j.is_empty());
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).ok_or_else(|| format!("{} needs a value\n{USAGE}", args[i]));
        match args[i].as_str() {
            "--max-restarts" => {
                let v = value()?;
                max_restarts = v.parse().map_err(|_| format!("--max-restarts {v}: not a count"))?;
                i += 2;
            }
            "--min-np" => {
                let v = value()?;
                min_np = Some(v.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("--min-np {v}: not a count"))?);
                i += 2;
            }
            "--job" => {
                job = Some(value()?.clone());
                i += 2;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ => break,
        }
    }
    let mpirun = args[i..].to_vec();
    if mpirun.is_empty() {
        return Err(format!("no program to run\n{USAGE}"));
    }
    let job = job.unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        format!("run-{now}-{}", std::process::id())
    });
    // The stores' rule: the name is a folder's, which the launcher removes when the job
    // ends well.
    kvstore_commit::job_folder(&job).map_err(|e| e.to_string())?;
    Ok(Options { max_restarts, min_np, job, mpirun })
}

/// How a run of the job ended, as `mpirun` said it.
#[derive(Default)]
struct Ended {
    /// What died and how, for messages: (`rank R`, `signal S`) from `mpirun`'s report,
    /// (`mpirun`, `signal S`), or (`host H`, `lost`).
    killed: Option<(String, String)>,
    /// The node whose daemon `mpirun` lost (the host died, or its network).
    lost_host: Option<String>,
    /// The rank(s) that the store's watchdog named as stuck, when it ended the job.
    stuck: Option<String>,
    /// When the launcher read that report.
    seen: Option<Instant>,
    /// `mpirun` refused the command line: why, and the flag that lifts it.
    refused: Option<(&'static str, &'static str)>,
    /// For a run after a restart: when the death that caused it was read, and when the
    /// run started (to say how long the restart took once rank 0 says it restored).
    restart: Option<(Instant, Instant)>,
}

/// Reads rank 0's line `kvstore: restored the commit of step S (N MB) in T ms`: (S, T).
fn restored(line: &str) -> Option<(u64, f64)> {
    let rest = line.strip_prefix("kvstore: restored the commit of step ")?;
    let step = rest.split(' ').next()?.parse().ok()?;
    let ms = rest.rsplit_once(" in ")?.1.strip_suffix(" ms")?.parse().ok()?;
    Some((step, ms))
}

/// Reads Open MPI's report of a lost host, `  Remote daemon: [[1,0],1] on node h2`:
/// the node's name.
fn lost_host(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("Remote daemon:")?;
    let node = rest.rsplit_once(" on node ")?.1.trim();
    (!node.is_empty()).then(|| node.to_string())
}

/// `mpirun`'s arguments to run the job again without host `host`: the host leaves the
/// host list (`-H`/`--host`/`-host`, or a copy of the `--hostfile`/`--machinefile`
/// without its lines, which `copy` writes, giving its path) and `-np` becomes at most
/// the slots left (1 for a host given without a count). Refused when `host` is not in
/// the list, or when fewer than `min_np` ranks would be left.
fn without_host(
    args: &[String],
    host: &str,
    min_np: u32,
    copy: impl FnOnce(&str) -> Result<PathBuf, String>,
) -> Result<Vec<String>, String> {
    let mut args = args.to_vec();
    // The host file's place in `args` and the text of its copy, written once accepted.
    let mut hostfile = None;
    let value_of =
        |args: &[String], names: &[&str]| args.iter().position(|a| names.contains(&a.as_str())).map(|i| i + 1);
    let slots = |entry: &str| entry.split_once(':').and_then(|(_, n)| n.parse::<u32>().ok()).unwrap_or(1);
    let left: u32 = if let Some(at) = value_of(&args, &["-H", "--host", "-host"]).filter(|&at| at < args.len()) {
        let entries: Vec<&str> = args[at].split(',').filter(|e| !e.is_empty()).collect();
        let kept: Vec<&str> = entries.iter().copied().filter(|e| e.split(':').next() != Some(host)).collect();
        if kept.len() == entries.len() {
            return Err(format!("host {host} is not in the job's host list {}", args[at]));
        }
        let left = kept.iter().map(|e| slots(e)).sum();
        args[at] = kept.join(",");
        left
    } else if let Some(at) =
        value_of(&args, &["--hostfile", "-hostfile", "--machinefile", "-machinefile"]).filter(|&at| at < args.len())
    {
        let text = std::fs::read_to_string(&args[at]).map_err(|e| format!("the host file {}: {e}", args[at]))?;
        let lines: Vec<&str> = text.lines().collect();
        let name = |l: &str| l.split('#').next().unwrap_or("").split_whitespace().next().map(str::to_string);
        let kept: Vec<&str> = lines.iter().copied().filter(|l| name(l).as_deref() != Some(host)).collect();
        if kept.len() == lines.len() {
            return Err(format!("host {host} is not in the job's host file {}", args[at]));
        }
        let left = kept
            .iter()
            .filter(|l| name(l).is_some())
            .map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("slots=").and_then(|n| n.parse::<u32>().ok()))
                    .unwrap_or(1)
            })
            .sum();
        hostfile = Some((at, kept.join("\n") + "\n"));
        left
    } else {
        return Err("the job names no hosts (-H or --hostfile) to leave one out of".to_string());
    };
    let np = match value_of(&args, &["-np", "-n", "--np", "-c"]).filter(|&at| at < args.len()) {
        Some(at) => {
            let np: u32 = args[at].parse().map_err(|_| format!("-np {}: not a count", args[at]))?;
            let np = np.min(left);
            args[at] = np.to_string();
            np
        }
        None => left,
    };
    if np < min_np {
        return Err(format!("{np} rank(s) would be left without host {host}, fewer than --min-np {min_np}"));
    }
    if let Some((at, text)) = hostfile {
        args[at] = copy(&text)?.to_string_lossy().into_owned();
    }
    Ok(args)
}

/// A folder of the launcher's own for the copies of a host file it writes: made new by
/// mkdtemp(3) in the temporary folder (`TMPDIR`, else `/tmp`), mode 0700; its files made
/// new, 0600, never through a link; removed with them when the launcher ends.
struct Private(PathBuf);

impl Private {
    fn new() -> Result<Private, String> {
        use std::os::unix::ffi::OsStringExt;
        let mut template = std::env::temp_dir().join("kvstore-run-XXXXXX").into_os_string().into_vec();
        template.push(0);
        // SAFETY: `template` is a NUL-terminated path that ends in six X's, which
        // mkdtemp(3) replaces in place; it outlives the call.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(format!("a folder of its own in {}: {e}", std::env::temp_dir().display()));
        }
        template.pop();
        Ok(Private(std::ffi::OsString::from_vec(template).into()))
    }

    /// Writes `text` to the new file `name` of the folder: its path.
    fn write(&self, name: &str, text: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.0.join(name);
        let mut file = std::fs::OpenOptions::new();
        file.write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
        let written = file.open(&path).and_then(|mut f| f.write_all(text.as_bytes()));
        written.map(|()| path.clone()).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The length of Open MPI's tag of a rank's output (`--tag-output`) that `line` starts
/// with: `[J,R]<stdout>:`, `<stderr>` or `<stddiag>`.
fn tag_len(line: &[u8]) -> Option<usize> {
    spaced_tag_len(line, SPACED_TAGS.load(Ordering::Relaxed))
}

/// [`tag_len`], where `spaced` says whether `mpirun` writes a space after each tag.
fn spaced_tag_len(line: &[u8], spaced: bool) -> Option<usize> {
    let digits = |at: usize| line.get(at..).map_or(0, |s| s.iter().take_while(|b| b.is_ascii_digit()).count());
    let job = digits(1);
    let rank = digits(job + 2);
    let fits = line.first() == Some(&b'[') && job > 0 && line.get(job + 1) == Some(&b',') && rank > 0;
    let after = job + rank + 2;
    let stream = [&b"]<stdout>:"[..], b"]<stderr>:", b"]<stddiag>:"]
        .into_iter()
        .find(|s| line.get(after..).is_some_and(|l| l.starts_with(s)))?;
    let end = after + stream.len();
    // Open MPI 5 puts a space after the tag, on every line.
    let spaced = spaced && line.get(end) == Some(&b' ');
    fits.then_some(end + usize::from(spaced))
}

/// Whether `mpirun` is Open MPI 5 or later (PRRTE's `prterun`), which writes a space
/// after each rank's tag (`[1,0]<stdout>: text`); set once, before the first run.
static SPACED_TAGS: AtomicBool = AtomicBool::new(false);

/// Whether the `mpirun` on `PATH` is Open MPI 5's: PRRTE's `prterun` is beside it (or is
/// what it links to). Read from the files, without running `mpirun`: a site's wrapper
/// need not answer `--version`.
fn prrte_mpirun() -> bool {
    let Some(path) = std::env::var_os("PATH") else { return false };
    std::env::split_paths(&path).map(|d| d.join("mpirun")).find(|p| p.is_file()).is_some_and(|p| {
        p.with_file_name("prterun").is_file()
            || std::fs::canonicalize(&p).is_ok_and(|r| r.file_name().is_some_and(|n| n == "prterun"))
    })
}

/// Whether `line` of `mpirun`'s output is a rank's, not `mpirun`'s own report: under
/// `--tag-output` every line of a rank starts with its tag, after the time under
/// `--timestamp-output` (`ctime`'s 24 characters); under `--xml` a rank's lines are
/// elements with its rank (`<stdout rank="0">`), `mpirun`'s without (`<stderr>`) or, in
/// Open MPI 5, diagnostics (`<stddiag rank="0">`, which a rank's program cannot write:
/// Open MPI's own messages), and a rank's text has its `<` escaped. (A rank's line that did not end, a `printf` without
/// a newline, holds the next `mpirun` line that follows it: `mpirun`'s reports start
/// with a line of dashes, so the line of the report itself is never the one held.)
fn of_a_rank(line: &[u8]) -> bool {
    tag_len(line).is_some()
        || line.get(24..).is_some_and(|l| tag_len(l).is_some())
        || [&b"<stdout rank="[..], b"<stderr rank="].iter().any(|x| line.starts_with(x))
}

/// `mpirun`'s own report `line` as text: under `--xml`, out of its element
/// (`<stderr>TEXT&#010;</stderr>`).
fn report(line: &str) -> &str {
    let inner = ["stderr", "stdout"]
        .iter()
        .find_map(|e| line.strip_prefix(&format!("<{e}>") as &str)?.strip_suffix(&format!("</{e}>") as &str))
        .or_else(|| {
            // Open MPI 5: `<stddiag rank="0">TEXT&#010;\0</stddiag>` (a NUL byte, the C
            // string's end, before the closing tag).
            let (_, rest) = line.strip_prefix("<stddiag rank=\"")?.split_once("\">")?;
            Some(rest.strip_suffix("</stddiag>")?.trim_end_matches(['\0', ' ']))
        });
    inner.map_or(line, |t| t.strip_suffix("&#010;").unwrap_or(t))
}

/// The ranks' lines, whole again: `mpirun` tags every write of a rank that does not
/// start a line (`[1,0]<stdout>:`), so the line it prints may hold the end of one
/// rank's line after the start of another's (rank 0 wrote `a`, rank 1 `b\n`, rank 0
/// `\n`: `[1,0]<stdout>:a[1,1]<stdout>:b` and `[1,0]<stdout>:`). Each tag's text is held
/// until the newline that ends it, so every rank's line comes out whole, untagged, as
/// the rank wrote it.
#[derive(Default)]
struct Lines(Vec<(Vec<u8>, Vec<u8>)>);

impl Lines {
    /// Takes a line of `mpirun`'s that starts with a rank's tag: holds each tag's text,
    /// and gives back the line that the last tag's text (the one the newline ends) makes
    /// whole.
    fn take(&mut self, line: &[u8]) -> Vec<u8> {
        let mut at = 0;
        let mut open: Option<usize> = None;
        while let Some(&b) = line.get(at) {
            match (b == b'[').then(|| tag_len(&line[at..])).flatten() {
                Some(n) => {
                    let tag = &line[at..at + n];
                    open = Some(self.0.iter().position(|(t, _)| t == tag).unwrap_or_else(|| {
                        self.0.push((tag.to_vec(), Vec::new()));
                        self.0.len() - 1
                    }));
                    at += n;
                }
                None => {
                    let i = *open.get_or_insert_with(|| {
                        self.0.push((Vec::new(), Vec::new()));
                        self.0.len() - 1
                    });
                    self.0[i].1.push(b);
                    at += 1;
                }
            }
        }
        open.map(|i| self.0.remove(i).1).unwrap_or_default()
    }

    /// The lines whose newline never came (a rank that ended in the middle of one), in
    /// the order they began.
    fn rest(self) -> impl Iterator<Item = Vec<u8>> {
        self.0.into_iter().map(|(_, text)| text).filter(|t| !t.is_empty())
    }
}

/// Reads the store's watchdog's line on a rank (kvstore-mpi's `group.rs`, `remote.rs`),
/// `kvstore-mpi: rank 0: push #2 has waited 3 s for rank 1, which never arrived at it
/// ... (KVSTORE_TIMEOUT=3)` or `kvstore-mpi: rank 0 waited 3 s for ranks 1, 2 to answer
/// a dist_async request (KVSTORE_TIMEOUT) ...`: the ranks it named (`rank 1`,
/// `ranks 1, 2`). Only says whom the launcher's message names: what ended the job is
/// `mpirun`'s exit status.
fn stuck(line: &str) -> Option<String> {
    let said = &line[line.find("kvstore-mpi: rank ")?..];
    let (_, after) = said.split_once(" for rank").filter(|_| said.contains("KVSTORE_TIMEOUT"))?;
    let mut list = after.strip_prefix('s').unwrap_or(after).strip_prefix(' ')?;
    let mut ranks = Vec::new();
    loop {
        let n = list.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            break;
        }
        ranks.push(&list[..n]);
        match list[n..].strip_prefix(", ") {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => list = rest,
            _ => break,
        }
    }
    (!ranks.is_empty()).then(|| format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, ranks.join(", ")))
}

/// Reads a line of `mpirun`'s own output for a rank's death: Open MPI says
/// `mpirun noticed that process rank 1 with PID 123 on node h exited on signal 9
/// (Killed).` (Open MPI 5: `prterun noticed ...`, over two lines, which
/// [`Reports`] joins).
fn death(line: &str) -> Option<(String, String)> {
    if !NOTICED.iter().any(|n| line.starts_with(n)) {
        return None;
    }
    let (_, after) = line.split_once("exited on signal ")?;
    let signal: String = after.chars().take_while(|c| !c.is_whitespace()).collect();
    let rank = line
        .split_once("rank ")
        .map(|(_, r)| r.chars().take_while(char::is_ascii_digit).collect::<String>())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "?".to_string());
    Some((format!("rank {rank}"), format!("signal {signal}")))
}

/// How `mpirun` (Open MPI 4) and `prterun` (Open MPI 5's `mpirun`) begin the report of a
/// rank's death.
const NOTICED: [&str; 2] = ["mpirun noticed that process rank ", "prterun noticed that process rank "];

/// `mpirun`'s refusals of a command line, each with the one flag that lifts it, read
/// from its report (Open MPI 4 and 5 word them alike).
const REFUSALS: [(&str, &str, &str); 2] = [
    ("has detected an attempt to run as root", "--allow-run-as-root", "Open MPI refuses to run as root"),
    (
        "There are not enough slots available in the system",
        "--oversubscribe",
        "the job has more ranks than the slots Open MPI found (one per core)",
    ),
];

/// The refusal in `line` of `mpirun`'s report: (why, the flag).
fn refusal(line: &str) -> Option<(&'static str, &'static str)> {
    REFUSALS.iter().find(|(said, ..)| line.contains(said)).map(|&(_, flag, why)| (why, flag))
}

/// `mpirun`'s own report lines, whole: Open MPI 5 breaks the line of a death in two
/// (`prterun noticed that process rank 1 with PID 7 on node h exited on` and `signal 9
/// (Killed).`); the first is held and given back with the next.
#[derive(Default)]
struct Reports(Option<String>);

impl Reports {
    fn join(&mut self, line: &str) -> String {
        let whole = match self.0.take() {
            Some(start) => format!("{start} {line}"),
            None => line.to_string(),
        };
        if NOTICED.iter().any(|n| whole.starts_with(n)) && !whole.contains(" signal ") && whole.ends_with(" on") {
            self.0 = Some(whole.clone());
        }
        whole
    }
}

/// Copies `from` to `to` line by line (bytes as they come: output need not be UTF-8),
/// noting a rank's death that `mpirun` reported in `ended`; a rank's lines lose their
/// tags, whole again ([`Lines`]), unless `tagged` (the user asked for a format of
/// `mpirun`'s).
fn follow(from: impl std::io::Read, mut to: impl Write, ended: Arc<Mutex<Ended>>, tagged: bool) {
    let mut held = Lines::default();
    let mut reports = Reports::default();
    for line in BufReader::new(from).split(b'\n').map_while(Result::ok) {
        let rank = of_a_rank(&line);
        let line = if rank && !tagged { held.take(&line) } else { line };
        pass(&line, rank, &mut to, &ended, &mut reports);
    }
    for line in held.rest() {
        pass(&line, true, &mut to, &ended, &mut reports);
    }
}

/// Passes `line` on to `to` (a rank's when `rank`, else `mpirun`'s), noting in `ended`
/// what it says of the run: a death or a lost host `mpirun` reported, a rank the
/// watchdog named, a restore after a restart.
fn pass(line: &[u8], rank: bool, to: &mut impl Write, ended: &Mutex<Ended>, reports: &mut Reports) {
    let text = String::from_utf8_lossy(line);
    let mut e = ended.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !rank {
        let whole = reports.join(report(&text));
        let text = whole.as_str();
        if let Some(r) = refusal(text) {
            e.refused.get_or_insert(r);
        }
        if let Some(d) = death(text)
            && e.killed.is_none()
        {
            e.killed = Some(d);
            e.seen = Some(Instant::now());
        }
        if let Some(host) = lost_host(text)
            && e.lost_host.is_none()
        {
            e.lost_host = Some(host);
            e.seen.get_or_insert_with(Instant::now);
        }
    } else if e.stuck.is_none() {
        e.stuck = stuck(&text);
        e.seen = e.stuck.as_ref().map(|_| Instant::now()).or(e.seen);
    }
    let _ = to.write_all(line).and_then(|()| to.write_all(b"\n"));
    if let Some((step, ms)) = restored(&text)
        && let Some((seen, relaunched)) = e.restart.take()
    {
        let now = Instant::now();
        let restore = ms / 1e3;
        let _ = writeln!(
            std::io::stderr(),
            "kvstore-run: resumed from the commit of step {step} {:.2} s after the death was reported \
             (relaunch {:.2} s, restore {restore:.2} s)",
            now.saturating_duration_since(seen).as_secs_f64(),
            (now.saturating_duration_since(relaunched).as_secs_f64() - restore).max(0.0),
        );
    }
}

/// What is left of job `job` to resume when it is not run again: its commits kept on
/// this host, or none there.
fn kept(job: &str) -> String {
    match kvstore_commit::newest_commit(job) {
        Some(step) => format!(
            "its commits are kept (the newest on this host: step {step}): run it again with KVSTORE_JOB={job} to \
             resume"
        ),
        None => format!("no commit of the job is on this host (KVSTORE_JOB={job})"),
    }
}

/// The process id of the running `mpirun` (0 between runs), for [`pass_on`].
static MPIRUN: AtomicI32 = AtomicI32::new(0);
/// The signal that asked the launcher to stop (0: none).
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

/// The handler of SIGINT, SIGTERM and SIGHUP: notes the signal and sends it on to
/// `mpirun` (both async-signal-safe).
extern "C" fn pass_on(signal: libc::c_int) {
    STOPPED_BY.store(signal, Ordering::SeqCst);
    let pid = MPIRUN.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe, and `pid` is the launcher's own child.
        unsafe { libc::kill(pid, signal) };
    }
}

/// Makes the launcher the subreaper of its descendants (a rank whose `mpirun` died
/// becomes its child, not init's) and passes the signals that stop a job on to `mpirun`.
fn take_charge() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `pass_on` is an extern "C" handler that only stores to atomics and
        // calls kill(2), both async-signal-safe. A signal the launcher was started
        // ignoring (nohup's SIGHUP) stays ignored, as it is for mpirun.
        unsafe {
            if libc::signal(signal, pass_on as *const () as libc::sighandler_t) == libc::SIG_IGN {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
    }
}

/// When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The launcher's children: (pid, whether it still runs, when it started).
/// /proc/PID/stat is "PID (COMM) STATE PPID ...", COMM may hold spaces; a zombie's
/// STATE is Z.
fn children() -> Vec<(i32, bool, u64)> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let (state, parent) = (fields.next()?, fields.next()?);
            (parent == me).then(|| (pid, state != "Z", start_ticks(&pid.to_string()).unwrap_or(0)))
        })
        .collect()
}

/// Kills (SIGKILL) and reaps the launcher's children left once `mpirun` is gone: a
/// run's processes whose `mpirun` was killed, and the ranks that `mpirun` killed but
/// did not wait for; not the children its process had before `mpirun` started
/// (`before`: a shell's other children, a `tee`), nor any started before `since`
/// ([`start_ticks`]'s ticks). Returns how many were still running.
fn kill_leftovers(since: u64, before: &[(i32, bool, u64)]) -> usize {
    let left: Vec<(i32, bool, u64)> =
        children().into_iter().filter(|c| c.2 >= since && !before.iter().any(|b| b.0 == c.0 && b.2 == c.2)).collect();
    for &(pid, ..) in &left {
        // SAFETY: kill(2) and waitpid(2) on a child of this process.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    left.iter().filter(|c| c.1).count()
}

/// Where Open MPI's ranks keep their shared-memory segments: `btl_vader_backing_directory`
/// as `mpirun`'s options or the environment set it, else `/dev/shm`.
fn segments_folder(mpirun: &[String]) -> std::path::PathBuf {
    const NAME: &str = "btl_vader_backing_directory";
    let given =
        mpirun.windows(3).find(|w| matches!(w[0].as_str(), "--mca" | "-mca") && w[1] == NAME).map(|w| w[2].clone());
    let given = given.or_else(|| std::env::var(format!("OMPI_MCA_{NAME}")).ok());
    std::path::PathBuf::from(given.unwrap_or_else(|| "/dev/shm".to_string()))
}

/// The names of Open MPI's shared-memory segments: 4.1's `vader` and 5's `sm`.
const SEGMENTS: [&str; 2] = ["vader_segment.", "sm_segment."];

/// Removes the shared-memory segments (`vader_segment.*`, `sm_segment.*`) that a run which did not end
/// well left in `folder`: this user's, made since `since`, and mapped by no process
/// (a rank killed by a signal never removes its own). Returns how many.
fn remove_segments(folder: &std::path::Path, since: SystemTime) -> usize {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::getuid() };
    let Ok(entries) = std::fs::read_dir(folder) else { return 0 };
    let left: Vec<std::path::PathBuf> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let m = e.metadata().ok()?;
            let made = UNIX_EPOCH + Duration::new(u64::try_from(m.ctime()).ok()?, u32::try_from(m.ctime_nsec()).ok()?);
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = SEGMENTS.iter().any(|s| name.starts_with(s)) && m.uid() == me;
            (ours && m.file_type().is_file() && made >= since).then(|| e.path())
        })
        .collect();
    if left.is_empty() {
        return 0;
    }
    // Every file that a process this user may look at maps.
    let mapped: std::collections::HashSet<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("maps")).ok())
        .flat_map(|maps| {
            maps.lines().filter_map(|l| l.split_once('/').map(|(_, p)| format!("/{p}"))).collect::<Vec<_>>()
        })
        .collect();
    left.iter()
        .filter(|p| !mapped.contains(&p.to_string_lossy().into_owned()) && std::fs::remove_file(p).is_ok())
        .count()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = match options(&args) {
        Ok(o) => o,
        Err(e) => {
            kvstore_core::say!("kvstore-run: {e}");
            return ExitCode::from(2);
        }
    };
    // (A closed standard error, a pipe whose reader is gone, stops no restart.)
    let say = |what: String| {
        let _ = writeln!(std::io::stderr(), "kvstore-run: {what}");
    };
    take_charge();
    let began = Instant::now();
    SPACED_TAGS.store(prrte_mpirun(), Ordering::Relaxed);
    // mpirun kills a run's other ranks at once when one died, not a second after asking
    // them to end (a rank asked to end may not), unless the user chose otherwise.
    const SIGKILL_TIMEOUT: &str = "odls_base_sigkill_timeout";
    let chosen =
        |param: &str| std::env::var_os(format!("OMPI_MCA_{param}")).is_some() || o.mpirun.iter().any(|a| a == param);
    // Open MPI's daemons on other hosts share their hardware topology through memory
    // mapped at an address picked in their address space, and now and then crash there
    // (SIGSEGV in hwloc_shmem_topology_write, seen in a job of two hosts): a failure no
    // restart would cure. Unless the user chose otherwise, they do without it.
    const TOPOLOGY_HOLE: &str = "rtc_hwloc_vmhole";
    let topology = (!chosen(TOPOLOGY_HOLE)).then_some(["--mca", TOPOLOGY_HOLE, "none"]);
    let chosen = chosen(SIGKILL_TIMEOUT);
    // Tags tell a rank's lines from mpirun's own; the user's choice of a format is kept.
    let format = |names: &[&str], param: &str| {
        o.mpirun.iter().any(|a| names.contains(&a.as_str()))
            || std::env::var(format!("OMPI_MCA_orte_{param}")).is_ok_and(|v| matches!(v.as_str(), "1" | "true"))
    };
    let tagged = format(&["--tag-output", "-tag-output"], "tag_output")
        || format(&["--timestamp-output", "-timestamp-output"], "timestamp_output")
        || format(&["--xml", "-xml"], "xml_output");
    let mut last_death: Option<Instant> = None;
    // The copies of a host file without a lost host, made when one is lost.
    let mut private: Option<Private> = None;
    for attempt in 0..=o.max_restarts {
        let started = Instant::now();
        // (ctime is stored by the second's fraction; a second earlier is safe: only
        // segments no process maps are removed.)
        let started_at = SystemTime::now() - Duration::from_secs(1);
        let mut mpirun = Command::new("mpirun");
        if !chosen {
            mpirun.env(format!("OMPI_MCA_{SIGKILL_TIMEOUT}"), "0");
            mpirun.env(format!("PRTE_MCA_{SIGKILL_TIMEOUT}"), "0");
        }
        // A stop asked for between two runs: no next run.
        if STOPPED_BY.load(Ordering::SeqCst) != 0 {
            say(format!("stopped: the job is not run again; {}", kept(&o.job)));
            return ExitCode::from((128 + STOPPED_BY.load(Ordering::SeqCst)).clamp(1, 255) as u8);
        }
        let before = children();
        let child = mpirun
            .args(["-x", "KVSTORE_JOB", "-x", "KVSTORE_RUN_ATTEMPT"])
            .args(topology.iter().flatten())
            .arg("--tag-output")
            .args(&o.mpirun)
            .env("KVSTORE_JOB", &o.job)
            .env("KVSTORE_RUN_ATTEMPT", attempt.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                say(format!("cannot run mpirun: {e}"));
                return ExitCode::from(127);
            }
        };
        MPIRUN.store(child.id() as i32, Ordering::SeqCst);
        let mpirun_started = start_ticks(&child.id().to_string()).unwrap_or(0);
        // A stop asked for before mpirun's id was known reaches it now.
        if let signal @ 1.. = STOPPED_BY.load(Ordering::SeqCst) {
            pass_on(signal);
        }
        let ended = Arc::new(Mutex::new(Ended { restart: last_death.map(|seen| (seen, started)), ..Ended::default() }));
        let out = child.stdout.take().map(|s| {
            let ended = Arc::clone(&ended);
            std::thread::spawn(move || follow(s, std::io::stdout(), ended, tagged))
        });
        let err = child.stderr.take().map(|s| {
            let ended = Arc::clone(&ended);
            std::thread::spawn(move || follow(s, std::io::stderr(), ended, tagged))
        });
        // mpirun's end is waited for without reaping it, so that its id is no one
        // else's until a signal can no longer be passed on to it.
        // SAFETY: waitid(2) on this process's own child, into a zeroed siginfo_t.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, child.id(), &mut info, libc::WEXITED | libc::WNOWAIT);
        }
        MPIRUN.store(0, Ordering::SeqCst);
        let status = child.wait();
        for t in [out, err].into_iter().flatten() {
            let _ = t.join();
        }
        let finished = Instant::now();
        let leftovers = kill_leftovers(mpirun_started, &before);
        if leftovers > 0 {
            say(format!("killed {leftovers} process(es) of the run that mpirun left behind"));
        }
        if !status.as_ref().is_ok_and(|s| s.success()) {
            let removed = remove_segments(&segments_folder(&o.mpirun), started_at);
            if removed > 0 {
                say(format!("removed {removed} shared-memory file(s) that the run's ranks left"));
            }
        }
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                say(format!("lost mpirun: {e}"));
                return ExitCode::from(1);
            }
        };
        if status.success() {
            if let Ok(dir) = kvstore_commit::job_folder(&o.job) {
                let _ = std::fs::remove_dir_all(dir);
            }
            if attempt > 0 {
                say(format!(
                    "the job ended well after {attempt} restart(s), in {:.1} s",
                    began.elapsed().as_secs_f64()
                ));
            }
            return ExitCode::SUCCESS;
        }
        if let signal @ 1.. = STOPPED_BY.load(Ordering::SeqCst) {
            say(format!("stopped by signal {signal}: the job is not run again; {}", kept(&o.job)));
            return ExitCode::from((128 + signal).clamp(1, 255) as u8);
        }
        let code = status.code().unwrap_or(1);
        let mut e = ended.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // mpirun itself killed (the out-of-memory killer, say): its ranks went with it.
        if let (None, Some(signal)) = (&e.killed, std::os::unix::process::ExitStatusExt::signal(&status)) {
            e.killed = Some(("mpirun".to_string(), format!("signal {signal}")));
            e.seen = Some(finished);
        }
        // The store's watchdog ended the job (a rank that cannot answer keeps its peers
        // waiting): the death of the rank it named. Told by mpirun's exit status, its
        // `MPI_Abort`'s code or its rank's: mpirun's report of an `MPI_Abort` (`with
        // errorcode 86.`) is now and then lost (Open MPI 4.1: `ORTE_ERROR_LOG: Data
        // unpack would read past end of buffer` in show_help.c instead).
        if e.killed.is_none() && code == WATCHDOG_EXIT {
            let who = e.stuck.clone().unwrap_or_else(|| "a rank".to_string());
            e.killed = Some((who, "stuck: the store's watchdog ended the job".to_string()));
        }
        // A host lost: a death too, whichever rank's report came first.
        if let Some(host) = &e.lost_host {
            e.killed = Some((format!("host {host}"), "lost".to_string()));
        }
        if let (None, Some((why, flag))) = (&e.killed, e.refused) {
            say(format!(
                "{why}: add {flag} to the command line, after kvstore-run's own options (kvstore-run {flag} \
                 {}); not run again",
                o.mpirun.join(" ")
            ));
            return ExitCode::from(code.clamp(1, 255) as u8);
        }
        let Some((who, how)) = e.killed.clone() else {
            say(format!(
                "the job failed by itself (mpirun's exit status {code}, no rank was killed or stuck): not run \
                 again; {}",
                kept(&o.job)
            ));
            return ExitCode::from(code.clamp(1, 255) as u8);
        };
        let ending = e.seen.map_or(Duration::ZERO, |seen| finished.saturating_duration_since(seen));
        last_death = e.seen;
        if attempt == o.max_restarts {
            say(format!("{who} died ({how}) and the {} restart(s) are spent; {}", o.max_restarts, kept(&o.job)));
            return ExitCode::from(code.clamp(1, 255) as u8);
        }
        // Without a lost host, or without --min-np, the same hosts again.
        if let (Some(host), Some(min_np)) = (e.lost_host.clone(), o.min_np) {
            let copy = |text: &str| {
                let folder = match private.take() {
                    Some(folder) => folder,
                    None => Private::new()?,
                };
                let path = folder.write(&format!("hosts-{attempt}"), text);
                private = Some(folder);
                path
            };
            match without_host(&o.mpirun, &host, min_np, copy) {
                Ok(args) => {
                    say(format!("host {host} is lost: the job runs again without it ({})", args.join(" ")));
                    o.mpirun = args;
                }
                Err(why) => {
                    say(format!("host {host} is lost and the job cannot run without it: {why}; {}", kept(&o.job)));
                    return ExitCode::from(code.clamp(1, 255) as u8);
                }
            }
        }
        say(format!(
            "{who} died ({how}) {:.1} s into run {attempt}; mpirun ended the job {:.2} s after; \
             restart {} of {} (job {})",
            e.seen.map_or(0.0, |seen| seen.saturating_duration_since(started).as_secs_f64()),
            ending.as_secs_f64(),
            attempt + 1,
            o.max_restarts,
            o.job
        ));
    }
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::{
        Lines, Private, Reports, death, lost_host, of_a_rank, options, refusal, report, restored, spaced_tag_len,
        stuck, without_host,
    };

    #[test]
    fn a_killed_rank_is_read_from_mpiruns_report() {
        let line = "mpirun noticed that process rank 1 with PID 4242 on node h exited on signal 9 (Killed).";
        assert_eq!(death(line), Some(("rank 1".to_string(), "signal 9".to_string())));
        assert_eq!(death("Primary job  terminated normally, but 1 process returned"), None);
        // A rank's own output is not mpirun's report.
        assert_eq!(death("my log: rank 7 exited on signal 15 in the last run"), None);
    }

    #[test]
    fn open_mpi_5s_report_of_a_death_over_two_lines_is_read_whole() {
        let mut r = Reports::default();
        let first = r.join("prterun noticed that process rank 1 with PID 11192 on node vm exited on");
        assert_eq!(death(&first), None);
        let whole = r.join("signal 9 (Killed).");
        assert_eq!(death(&whole), Some(("rank 1".to_string(), "signal 9".to_string())));
        // A line after a whole report is its own.
        assert_eq!(r.join("----"), "----");
        assert_eq!(
            death(&r.join("mpirun noticed that process rank 0 with PID 4 on node h exited on signal 6 (Aborted).")),
            Some(("rank 0".to_string(), "signal 6".to_string()))
        );
    }

    #[test]
    fn mpiruns_refusals_name_the_flag_that_lifts_them() {
        assert_eq!(refusal("mpirun has detected an attempt to run as root.").map(|r| r.1), Some("--allow-run-as-root"));
        assert_eq!(
            refusal("prterun has detected an attempt to run as root.").map(|r| r.1),
            Some("--allow-run-as-root")
        );
        assert_eq!(
            refusal("There are not enough slots available in the system to satisfy the 4").map(|r| r.1),
            Some("--oversubscribe")
        );
        assert_eq!(refusal("rank 0: w = 1 2 3"), None);
    }

    #[test]
    fn open_mpi_5s_space_after_a_tag_is_the_tags() {
        assert_eq!(spaced_tag_len(b"[1,0]<stdout>: two", false), Some(14));
        assert_eq!(spaced_tag_len(b"[1,0]<stdout>:   two", true), Some(15));
        assert_eq!(spaced_tag_len(b"[1,0]<stdout>:x", true), Some(14));
        assert_eq!(spaced_tag_len(b"[1,0]<stdout>:", true), Some(14));
    }

    #[test]
    fn a_ranks_lines_are_told_from_mpiruns_by_their_tags() {
        assert!(of_a_rank(b"[1,0]<stdout>:mpirun noticed that process rank 1 exited on signal 9"));
        assert!(of_a_rank(b"[12,345]<stderr>:"));
        assert!(of_a_rank(b"Sat Nov 28 15:41:25 2026[1,1]<stderr>:text"));
        assert!(of_a_rank(b"<stdout rank=\"3\">mpirun noticed</stdout>"));
        assert!(!of_a_rank(b"mpirun noticed that process rank 1 with PID 7 on node h exited on signal 9 (Killed)."));
        assert!(!of_a_rank(b"[1,0] <stdout>:"));
        assert!(!of_a_rank(b"[,0]<stdout>:"));
        assert!(!of_a_rank(b"<stderr>  Remote daemon: [[1,0],1] on node h2&#010;</stderr>"));
        assert_eq!(
            report("<stderr>  Remote daemon: [[1,0],1] on node h2&#010;</stderr>"),
            "  Remote daemon: [[1,0],1] on node h2"
        );
        assert_eq!(report("  Remote daemon: [[1,0],1] on node h2"), "  Remote daemon: [[1,0],1] on node h2");
        // Open MPI 5's report of a death under --xml, over two diagnostics.
        let xml = [
            "<stddiag rank=\"0\">prterun noticed that process rank 1 with PID 7 on node vm exited on&#010;\0</stddiag>",
            "<stddiag rank=\"0\">signal 9 (Killed).&#010;\0</stddiag>",
        ];
        assert!(xml.iter().all(|l| !of_a_rank(l.as_bytes())));
        let mut r = Reports::default();
        assert_eq!(death(&r.join(report(xml[0]))), None);
        assert_eq!(death(&r.join(report(xml[1]))), Some(("rank 1".to_string(), "signal 9".to_string())));
        // The tags go, wherever a write of a rank began, and each rank's line comes out
        // whole when its newline came, however the ranks' writes were interleaved.
        let mut held = Lines::default();
        assert_eq!(held.take(b"[1,0]<stdout>:partial from 0[1,1]<stdout>:whole from 1"), b"whole from 1");
        assert_eq!(held.take(b"[1,1]<stdout>:next from 1"), b"next from 1");
        assert_eq!(held.take(b"[1,0]<stdout>: ends[1,0]<stdout>:"), b"partial from 0 ends");
        assert_eq!(held.take(b"[1,0]<stderr>:a [b] [1,x]<stdout>: [2,3]"), b"a [b] [1,x]<stdout>: [2,3]");
        // The same rank's standard output and error are two lines; one never ended is
        // passed on at the end.
        assert_eq!(held.take(b"[1,2]<stdout>:out[1,2]<stderr>:err"), b"err");
        assert_eq!(held.take(b"[2,2]<stdout>:other job"), b"other job");
        assert_eq!(held.rest().collect::<Vec<_>>(), [b"out".to_vec()]);
    }

    #[test]
    fn the_rank_a_watchdog_named_is_read_from_its_line() {
        let line = "kvstore-mpi: rank 0: push #2 has waited 3 s for rank 1, which never arrived at it (rank 0 did); \
                    a worker that is alive but stuck (or stopped) holds up the job: aborting it (KVSTORE_TIMEOUT=3)";
        assert_eq!(stuck(line).as_deref(), Some("rank 1"));
        let line = "kvstore-mpi: rank 0 waited 3 s for ranks 2, 3 to answer a dist_async request (KVSTORE_TIMEOUT): \
                    ending the MPI job";
        assert_eq!(stuck(line).as_deref(), Some("ranks 2, 3"));
        // A stall inside a call names no rank; nor does a line of another kind.
        let line = "kvstore-mpi: rank 1: the data of push #2 has not moved after 3 s: every worker arrived at the \
                    call, so one stopped or is stuck inside it; aborting the job (KVSTORE_TIMEOUT=3)";
        assert_eq!(stuck(line), None);
        assert_eq!(stuck("kvstore-mpi: rank 0 waits for rank 1"), None);
    }

    #[test]
    fn a_lost_host_is_read_from_mpiruns_report() {
        assert_eq!(lost_host("  Remote daemon: [[4242,0],2] on node h2"), Some("h2".to_string()));
        assert_eq!(lost_host("  HNP daemon   : [[4242,0],0] on node h0"), None);
        assert_eq!(lost_host("my log: Remote host on node x"), None);
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_lost_host_leaves_the_host_list_and_its_slots_the_ranks() {
        use std::os::unix::fs::PermissionsExt;
        let private = Private::new().expect("a folder");
        let never = |_: &str| -> Result<std::path::PathBuf, String> { panic!("no host file to copy") };
        let args = strings(&["-H", "h1:2,h2:2,h3", "-np", "5", "prog", "-H"]);
        let after = without_host(&args, "h2", 1, never).expect("without h2");
        assert_eq!(after, strings(&["-H", "h1:2,h3", "-np", "3", "prog", "-H"]));
        // Not below --min-np, nor a host the job does not have.
        assert!(without_host(&args, "h2", 4, never).expect_err("below").contains("fewer than --min-np 4"));
        assert!(without_host(&args, "h9", 1, never).is_err());
        assert!(without_host(&strings(&["-np", "2", "prog"]), "h2", 1, never).is_err());
        // A host file: a copy without the host's lines, in the launcher's own folder.
        let hosts = private.write("hosts", "# the job's hosts\nh1 slots=4\nh2 slots=4 # lost\nh3\n").expect("a file");
        let args = strings(&["--hostfile", &hosts.to_string_lossy(), "-np", "9", "prog"]);
        assert!(without_host(&args, "h2", 6, never).is_err(), "nothing written below --min-np");
        let after = without_host(&args, "h2", 2, |text| private.write("hosts-0", text)).expect("without h2");
        let copy = std::path::Path::new(&after[1]);
        assert_eq!(after[3], "5");
        assert_eq!(std::fs::read_to_string(copy).expect("the copy"), "# the job's hosts\nh1 slots=4\nh3\n");
        let mode = |p: &std::path::Path| std::fs::metadata(p).expect("its mode").permissions().mode() & 0o777;
        assert_eq!((mode(copy), mode(&private.0)), (0o600, 0o700));
        // Never over a file, nor through a link.
        assert!(private.write("hosts-0", "again").is_err());
        std::os::unix::fs::symlink(&hosts, private.0.join("link")).expect("a link");
        assert!(private.write("link", "through").is_err());
        assert!(std::fs::read_to_string(&hosts).expect("the file").starts_with("# the job's hosts"));
        let folder = private.0.clone();
        drop(private);
        assert!(!folder.exists(), "removed with its files");
    }

    #[test]
    fn rank_0s_restore_is_read_from_its_line() {
        assert_eq!(restored("kvstore: restored the commit of step 12 (314.6 MB) in 560 ms"), Some((12, 560.0)));
        assert_eq!(restored("kvstore: restored nothing"), None);
    }

    #[test]
    fn the_launchers_options_come_first() {
        let args: Vec<String> = ["--max-restarts", "5", "--job", "j", "-np", "2", "prog", "--max-restarts"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = options(&args).expect("options");
        assert_eq!((o.max_restarts, o.job.as_str()), (5, "j"));
        assert_eq!(o.mpirun, ["-np", "2", "prog", "--max-restarts"]);
        assert!(options(&["--max-restarts".to_string()]).is_err());
        assert!(options(&[]).is_err());
        // A name that is not a folder's own is refused (the launcher removes the folder).
        for bad in ["x/../../victim", "", ".hidden", "a b"] {
            let args: Vec<String> = ["--job", bad, "-np", "1", "true"].iter().map(|s| s.to_string()).collect();
            assert!(options(&args).is_err(), "{bad:?}");
        }
    }
}
