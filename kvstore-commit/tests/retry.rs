//! A store whose build failed (its newest commit damaged, no older one whole) gives its
//! folder back: a program that builds the store again meets the same commits and the
//! same error, never an empty folder of the next number (a fresh start that would lose
//! the job's state, its commits going where a restart does not look).

use kvstore_core::KVStore;

#[test]
fn a_store_built_again_after_a_failed_restore_meets_the_same_commits() {
    let dir = std::env::temp_dir().join(format!("kvstore-retry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    let job = format!("retry-{}", std::process::id());
    // SAFETY: the one test of this binary sets the environment before any store reads it.
    unsafe {
        std::env::set_var(kvstore_commit::JOB_VAR, &job);
        std::env::set_var(kvstore_commit::COMMIT_DIR_VAR, &dir);
    }
    // A job that committed steps 0 to 3, then died; its copies damaged (a byte of each
    // flipped), so that no commit is whole.
    let died = std::process::Command::new(env!("CARGO_BIN_EXE_fixture_local_job"))
        .args(["6", "die", "3"])
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .expect("the job runs");
    assert_eq!(died.status.code(), Some(3), "{died:?}");
    let store = kvstore_commit::job_folder(&job).expect("the job's folder").join("local0-rank0");
    let copies: Vec<_> = std::fs::read_dir(&store)
        .expect("the store's folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "commit"))
        .collect();
    assert!(!copies.is_empty(), "no commit in {}", store.display());
    for copy in copies {
        let mut bytes = std::fs::read(&copy).expect("the copy");
        let at = bytes.len() / 2;
        bytes[at] ^= 0xff;
        std::fs::write(&copy, &bytes).expect("damaged");
    }
    // This process is the job run again: its first store is the job's store 0.
    kvstore_commit::install();
    let first = KVStore::create("local").expect_err("no whole commit");
    let again = KVStore::create("local").map(|kv| kv.restored());
    let _ = std::fs::remove_dir_all(&dir);
    let again = again.expect_err("built again: the same commits, the same error");
    assert_eq!(first.to_string(), again.to_string());
    assert!(again.to_string().contains("local0-rank0"), "{again}");
}
