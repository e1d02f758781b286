//! Commits (`KVStore::commit`, `KVStore::restored`, `src/folder.rs`): a job that dies
//! after a commit resumes from it, with the same bits as a job that never died; a
//! damaged commit or a folder others may use is refused; a store without a job name
//! cannot commit. The job is `fixture_local_job`, run as a process per run (a restart
//! is a new process), each test with a commits' folder of its own (no `/dev/shm`, no
//! `mpirun`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvstore_core::{ErrorKind, KVStore, NDArray};

/// A commits' folder of the test's own (`KVSTORE_COMMIT_DIR`).
fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvstore-commits-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    dir
}

/// Runs the job `job` with its commits in `dir`.
fn run(dir: &Path, job: &str, args: &[&str]) -> Output {
    run_as(dir, job, None, args)
}

/// [`run`] as rank `rank` of a launcher (`OMPI_COMM_WORLD_RANK`), if given.
fn run_as(dir: &Path, job: &str, rank: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fixture_local_job"));
    cmd.args(args).env("KVSTORE_JOB", job).env("KVSTORE_COMMIT_DIR", dir).env_remove("OMPI_COMM_WORLD_RANK");
    if let Some(rank) = rank {
        cmd.env("OMPI_COMM_WORLD_RANK", rank);
    }
    cmd.output().expect("the job runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn line<'a>(out: &'a str, prefix: &str) -> Option<&'a str> {
    out.lines().find(|l| l.starts_with(prefix))
}

#[test]
fn a_job_that_died_resumes_from_its_last_commit_with_the_same_bits() {
    let dir = folder("resume");
    let whole = run(&dir, "never-died", &["6"]);
    assert!(whole.status.success(), "{whole:?}");
    let died = run(&dir, "died", &["6", "die", "2"]);
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let resumed = run(&dir, "died", &["6"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let out = stdout(&resumed);
    assert_eq!(line(&out, "restored"), Some("restored 2 loader at 2"), "{out}");
    // The optimizer's momentum came back too: the same bits as the run that never died.
    assert_eq!(line(&out, "w = "), line(&stdout(&whole), "w = "));
    // The two newest commits are kept, no more.
    let store = dir.join(format!("kvstore-{}-died", owner(&dir))).join("local0-rank0");
    let done: Vec<String> = names(&store).into_iter().filter(|n| n.ends_with(".done")).collect();
    assert_eq!(done.len(), 2, "{done:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// [`run`] with `FIXTURE_OPTIMIZER` set to `mode`.
fn run_setting(dir: &Path, job: &str, mode: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fixture_local_job"));
    cmd.args(args).env("KVSTORE_JOB", job).env("KVSTORE_COMMIT_DIR", dir).env("FIXTURE_OPTIMIZER", mode);
    cmd.env_remove("OMPI_COMM_WORLD_RANK").output().expect("the job runs")
}

#[test]
fn a_resumed_program_that_sets_its_optimizer_again_keeps_the_restored_state() {
    let dir = folder("again");
    let whole = run_setting(&dir, "never-died", "again", &["6"]);
    assert!(whole.status.success(), "{whole:?}");
    let died = run_setting(&dir, "died", "again", &["6", "die", "3"]);
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let resumed = run_setting(&dir, "died", "again", &["6"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let out = stdout(&resumed);
    assert_eq!(line(&out, "restored"), Some("restored 3 loader at 3"), "{out}");
    // Adam's moments, its update counts and the schedule's progress came back and
    // stayed: the same bits as the run that never died.
    assert_eq!(line(&out, "w = "), line(&stdout(&whole), "w = "), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_program_that_sets_another_optimizer_is_refused_and_keeps_the_restored_one() {
    let dir = folder("other");
    let whole = run_setting(&dir, "never-died", "again", &["6"]);
    let died = run_setting(&dir, "died", "other", &["6", "die", "3"]);
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let resumed = run_setting(&dir, "died", "other", &["6"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let out = stdout(&resumed);
    let refused = line(&out, "refused: ").unwrap_or_else(|| panic!("not refused: {out}"));
    for says in ["of step 3", "learning_rate: 0.1 in the commit, 0.2 here", "start the job afresh", "another name"] {
        assert!(refused.contains(says), "{refused}");
    }
    // Refused, the store kept the restored optimizer and its state.
    assert_eq!(line(&out, "w = "), line(&stdout(&whole), "w = "), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A resumed program that pushes with the restored optimizer (it sets none at its
/// start) has taken it on: a later set_optimizer is its own change, accepted.
#[test]
fn a_resumed_program_may_change_its_optimizer_after_pushing_with_the_restored_one() {
    let dir = folder("later");
    let died = run_setting(&dir, "died", "later", &["6", "die", "2"]);
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let resumed = run_setting(&dir, "died", "later", &["6"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let out = stdout(&resumed);
    assert!(out.lines().any(|l| l == "accepted another optimizer"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_written_over_an_older_ones_file_restores_the_same_bits() {
    let dir = folder("spare");
    let whole = run(&dir, "never-died", &["6"]);
    // Steps 0 to 4 committed: steps 3 and 4 were written over the files of steps 0 and 1.
    let died = run(&dir, "died", &["6", "die", "4"]);
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let store = dir.join(format!("kvstore-{}-died", owner(&dir))).join("local0-rank0");
    let mut files = names(&store);
    files.sort();
    assert_eq!(
        files,
        [
            ".spare-rank-000000",
            "step-00000000000000000003-rank-000000-of-000001.commit",
            "step-00000000000000000003.done",
            "step-00000000000000000004-rank-000000-of-000001.commit",
            "step-00000000000000000004.done",
        ],
        "the two newest commits and one spare file"
    );
    let resumed = run(&dir, "died", &["6"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let out = stdout(&resumed);
    assert_eq!(line(&out, "restored"), Some("restored 4 loader at 4"), "{out}");
    assert_eq!(line(&out, "w = "), line(&stdout(&whole), "w = "));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_write_that_never_finished_is_removed_by_the_next_commit() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = folder("stale");
    assert_eq!(run(&dir, "job", &["4", "die", "1"]).status.code(), Some(3));
    let store = dir.join(format!("kvstore-{}-job", owner(&dir))).join("local0-rank0");
    // What a process killed while writing step 1 leaves.
    let stale = store.join(".step-00000000000000000001-rank-000000-of-000001.commit.4242");
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&stale).expect("a stale file");
    let resumed = run(&dir, "job", &["4"]);
    assert!(resumed.status.success(), "{resumed:?}");
    assert!(!stale.exists(), "the stale write is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_commit_of_a_step_not_after_the_newest_is_refused() {
    let dir = folder("steps");
    let out = run(&dir, "job", &["3", "recommit"]);
    assert!(out.status.success(), "{out:?}");
    let said = stdout(&out);
    assert!(said.contains("refused: commit of step 0: the job's newest commit is of step 2"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ranks_own_stores_keep_their_own_commits() {
    // Two ranks of a launcher, each with a store of its own (no worker group), in one job.
    let dir = folder("ranks");
    let whole: Vec<String> =
        ["0", "1"].iter().map(|r| stdout(&run_as(&dir, &format!("whole-{r}"), Some(r), &["4"]))).collect();
    for r in ["0", "1"] {
        assert_eq!(run_as(&dir, "job", Some(r), &["4", "die", "1"]).status.code(), Some(3));
    }
    for (i, r) in ["0", "1"].iter().enumerate() {
        let resumed = stdout(&run_as(&dir, "job", Some(r), &["4"]));
        assert_eq!(line(&resumed, "restored"), Some("restored 1 loader at 1"), "{resumed}");
        assert_eq!(line(&resumed, "w = "), line(&whole[i], "w = "), "rank {r} resumed its own store");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_job_never_restores_these_commits() {
    let dir = folder("other");
    assert_eq!(run(&dir, "first", &["3", "die", "1"]).status.code(), Some(3));
    let other = run(&dir, "second", &["3"]);
    assert!(other.status.success() && line(&stdout(&other), "restored").is_none(), "{other:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_commit_is_refused_not_loaded() {
    let dir = folder("damaged");
    assert_eq!(run(&dir, "job", &["4", "die", "1"]).status.code(), Some(3));
    let store = dir.join(format!("kvstore-{}-job", owner(&dir))).join("local0-rank0");
    let damage = |step: u64| {
        let path = store.join(format!("step-{step:020}-rank-000000-of-000001.commit"));
        let mut bytes = std::fs::read(&path).expect("the commit");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).expect("written");
    };
    // The newest commit damaged: the one before it is restored, and why is said.
    damage(1);
    let older = run(&dir, "job", &["1"]);
    assert!(older.status.success(), "{older:?}");
    assert_eq!(line(&stdout(&older), "restored"), Some("restored 0 loader at 0"), "{older:?}");
    let err = String::from_utf8_lossy(&older.stderr);
    assert!(err.contains("checksum") && err.contains("step 1") && err.contains("step 0 instead"), "{err}");
    // Every commit damaged: refused, nothing loaded.
    damage(0);
    let refused = run(&dir, "job", &["4"]);
    assert!(!refused.status.success(), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("checksum") && err.contains("no older commit is whole"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_folder_others_may_use_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = folder("open");
    let jobs = dir.join(format!("kvstore-{}-job", owner(&dir)));
    std::fs::create_dir_all(&jobs).expect("a folder");
    std::fs::set_permissions(&jobs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let refused = run(&dir, "job", &["2"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("others may use the folder"), "{refused:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store with no keys has nothing for its rank to copy: it commits and restores all
/// the same.
/// A store with no keys, and one whose last tensor in the file is empty (the fixture's
/// `empty` and `zero`), commit and restore.
#[test]
fn a_store_with_no_keys_or_an_empty_last_tensor_commits_and_restores() {
    for mode in ["empty", "zero"] {
        let dir = folder(mode);
        let first = run(&dir, mode, &["1", mode]);
        assert!(first.status.success() && stdout(&first).contains(&format!("committed {mode}")), "{first:?}");
        let again = run(&dir, mode, &["1", mode]);
        let out = stdout(&again);
        assert!(again.status.success() && out.contains(&format!("restored {mode} 0")), "{again:?}");
        if mode == "zero" {
            assert_eq!(line(&out, "a = "), Some("a = [1.0, 2.0, 3.0, 4.0]"), "{out}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_store_without_a_job_name_cannot_commit() {
    // (This process has no KVSTORE_JOB.)
    kvstore_commit::install();
    let kv = KVStore::create("local").expect("a store");
    kv.init("w", &NDArray::zeros(&[2]).expect("zeros")).expect("init");
    let e = kv.commit(0, b"").expect_err("no job name");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("KVSTORE_JOB"), "{e}");
    assert_eq!(kv.restored(), None);
}

/// The user that owns `dir` (this process's).
fn owner(dir: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).expect("the folder").uid()
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("the folder")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect()
}
