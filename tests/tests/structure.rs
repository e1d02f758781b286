//! The rooms of the code, checked by reading its sources: what ARCHITECTURE.md says a
//! file or crate does not do ("Negative invariants"), each a scan of the shipped
//! sources with its allow-list.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Every `.rs` file under `dir`, relative to the root, with its text.
fn sources(dir: &str) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    walk(&root.join(dir), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("a source file");
            (f.strip_prefix(&root).expect("under the root").display().to_string(), text)
        })
        .collect()
}

/// The shipped crates' source folders.
const CRATES: [&str; 6] =
    ["kvstore/src", "kvstore-core/src", "kvstore-cuda/src", "kvstore-jni/src", "kvstore-mpi/src", "kvstore-py/src"];

/// The one file of each crate that reads the environment (its settings), and the
/// programs and layers that read their own.
const READS_THE_ENVIRONMENT: [&str; 6] = [
    "kvstore-core/src/settings.rs",
    // The job's commits (`KVSTORE_JOB`, `KVSTORE_COMMIT_DIR`, the launcher's rank), until
    // they leave the core as a layer of their own.
    "kvstore-core/src/kvstore/commit.rs",
    "kvstore-cuda/src/lib.rs",
    "kvstore-jni/src/error.rs",
    "kvstore-mpi/src/settings.rs",
    // The launcher, a program of its own.
    "kvstore-mpi/src/bin/kvstore-run.rs",
];

#[test]
fn the_environment_is_read_only_in_each_crates_settings() {
    let mut readers = BTreeSet::new();
    for dir in CRATES {
        for (file, text) in sources(dir) {
            if text.contains("env::var(") || text.contains("env::var_os(") {
                readers.insert(file);
            }
        }
    }
    let allowed: BTreeSet<String> = READS_THE_ENVIRONMENT.iter().map(|s| s.to_string()).collect();
    let extra: Vec<_> = readers.difference(&allowed).collect();
    assert!(extra.is_empty(), "read the environment outside the crates' settings: {extra:?}");
    // The list holds no file that no longer reads it.
    let stale: Vec<_> = allowed.difference(&readers).collect();
    assert!(stale.is_empty(), "listed as reading the environment, and do not: {stale:?}");
}

/// The names in string literals of `text` that look like our variables.
fn variables(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices('"') {
        let rest = &text[i + 1..];
        let name: String =
            rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
        if (name.starts_with("KVSTORE_") || name.starts_with("MXNET_")) && rest[name.len()..].starts_with('"') {
            found.insert(name);
        }
    }
    found
}

#[test]
fn every_variable_read_is_in_the_configuration_table_once() {
    let docs = std::fs::read_to_string(root().join("docs/configuration.md")).expect("docs/configuration.md");
    let rows: Vec<String> =
        docs.lines().filter_map(|l| l.strip_prefix("| `")?.split_once('`').map(|(name, _)| name.to_string())).collect();
    let listed: BTreeSet<String> = rows.iter().cloned().collect();
    assert_eq!(listed.len(), rows.len(), "a variable listed twice: {rows:?}");
    let mut read = BTreeSet::new();
    for file in READS_THE_ENVIRONMENT {
        read.extend(variables(&std::fs::read_to_string(root().join(file)).expect("a source file")));
    }
    let missing: Vec<_> = read.difference(&listed).collect();
    assert!(missing.is_empty(), "read by shipped code, missing from docs/configuration.md: {missing:?}");
    let stale: Vec<_> = listed.difference(&read).collect();
    assert!(stale.is_empty(), "in docs/configuration.md, read by no shipped code: {stale:?}");
}

#[test]
fn the_mpi_groups_state_knows_no_sum_and_no_sum_reaches_back_into_it() {
    let files = sources("kvstore-mpi/src");
    let text = |name: &str| &files.iter().find(|(f, _)| f.ends_with(name)).expect(name).1;
    // group.rs: the group's state; the sums are its `impl` blocks in files of their own.
    for sum in ["crate::tree", "crate::scatter", "crate::fused", "crate::big", "crate::hosts", "crate::shm"] {
        assert!(!text("src/group.rs").contains(sum), "group.rs uses {sum}");
    }
    // The sums host by host and through shared memory take the group's pieces from where
    // they live, never from group.rs.
    for file in ["src/hosts.rs", "src/shm.rs", "src/tree.rs", "src/scatter.rs"] {
        assert!(!text(file).contains("crate::group"), "{file} imports from group.rs");
    }
}

#[test]
fn the_ranks_agree_through_one_module_per_crate() {
    // Core: every exchange of records the ranks decide on is read through `Said`
    // (`kvstore/agree.rs`); the commits' own protocol (`kvstore/commit.rs`) until they
    // leave the core as a layer.
    for (file, text) in sources("kvstore-core/src/kvstore") {
        if file.ends_with("kvstore/agree.rs") || file.ends_with("kvstore/commit.rs") {
            continue;
        }
        for line in text.lines().filter(|l| l.contains("exchange(") && !l.trim_start().starts_with("//")) {
            assert!(
                line.contains("Said::exchange(") || line.contains("Said::of") || line.contains("fn exchange("),
                "{file}: an exchange not read through kvstore/agree.rs: {line}"
            );
        }
    }
    // kvstore-mpi: the reductions that make every rank take one path are in agree.rs.
    for (file, text) in sources("kvstore-mpi/src") {
        if !file.ends_with("src/agree.rs") {
            assert!(!text.contains("all_reduce_into("), "{file}: an agreement outside kvstore-mpi/src/agree.rs");
        }
    }
}

#[test]
fn no_transport_maps_files() {
    // The process's file mapper (core's `files::MapFiles`) maps a commit's file; the
    // transports of worker groups (`Collective`, `Remote`) only move data.
    for file in ["kvstore-core/src/collective.rs", "kvstore-core/src/remote.rs"] {
        let text = std::fs::read_to_string(root().join(file)).expect("a source file");
        assert!(!text.contains("fn map_file"), "{file}: a transport that maps files");
    }
}
