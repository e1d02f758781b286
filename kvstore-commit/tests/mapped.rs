//! A store of any kind, a local one too, commits through a mapping of its file
//! (`src/mapped.rs`): its share is copied into a mapping of the commit's file, not
//! written with `write` calls (three times the copy on `/dev/shm`).

use kvstore_core::NDArray;

#[test]
fn a_local_store_commits_through_a_mapping_of_its_file() {
    let job = format!("local-map-{}", std::process::id());
    // SAFETY: the one test of this binary sets the job's name before any store reads
    // it, and no other thread of the process reads the environment meanwhile.
    unsafe { std::env::set_var("KVSTORE_JOB", &job) };
    kvstore_commit::install();
    let kv = kvstore_core::KVStore::create("local").expect("a local store");
    kv.init("w", &NDArray::full(&[1 << 18], 1.5).expect("an array")).expect("init");
    kv.commit(0, b"").expect("a commit");
    let folder = kvstore_commit::job_folder(&job).expect("the job's folder");
    // The mapping is kept for the next commit (the host's copies rotate through three
    // files): the process maps the commit's file now.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("the process's mappings");
    let mapped = maps.lines().any(|l| l.contains(&*folder.to_string_lossy()) && l.contains(".commit"));
    let _ = std::fs::remove_dir_all(&folder);
    assert!(mapped, "no mapping of a commit's file under {}:\n{maps}", folder.display());
}
