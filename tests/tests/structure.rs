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
    files(dir, &[".rs"])
}

/// The shipped crates' source folders.
const CRATES: [&str; 7] = [
    "kvstore/src",
    "kvstore-commit/src",
    "kvstore-core/src",
    "kvstore-cuda/src",
    "kvstore-jni/src",
    "kvstore-mpi/src",
    "kvstore-py/src",
];

/// The one file of each crate that reads the environment (its settings), and the
/// programs and layers that read their own.
const READS_THE_ENVIRONMENT: [&str; 6] = [
    "kvstore-commit/src/settings.rs",
    // The launcher, a program of its own.
    "kvstore-commit/src/bin/kvstore-run.rs",
    "kvstore-core/src/settings.rs",
    "kvstore-cuda/src/lib.rs",
    "kvstore-jni/src/error.rs",
    "kvstore-mpi/src/settings.rs",
];

/// The Python package's one module that reads the store's variables (which native
/// module and MPI `import kvstore` loads).
const PYTHON_READS_THE_ENVIRONMENT: [&str; 1] = ["kvstore-py/python/kvstore/_native.py"];

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
    // The Python package: a module that reads the environment for one of our variables.
    for (file, text) in files("kvstore-py/python", &[".py"]) {
        if text.contains("os.environ") && !variables(&text).is_empty() {
            readers.insert(file);
        }
    }
    let allowed: BTreeSet<String> =
        READS_THE_ENVIRONMENT.iter().chain(&PYTHON_READS_THE_ENVIRONMENT).map(|s| s.to_string()).collect();
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
    for file in READS_THE_ENVIRONMENT.iter().chain(&PYTHON_READS_THE_ENVIRONMENT) {
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
    for sum in
        ["crate::tree", "crate::scatter", "crate::fused", "crate::big", "crate::hosts", "crate::shm", "crate::parts"]
    {
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
    // (`kvstore/agree.rs`); the seam's `Peers` (`kvstore/seam.rs`) hands exchanges to
    // the commits, whose protocol (kvstore-commit) reads its records itself.
    for (file, text) in sources("kvstore-core/src/kvstore") {
        if ["kvstore/agree.rs", "kvstore/seam.rs"].iter().any(|f| file.ends_with(f)) {
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

/// The lines of `text` that are code: not comments, not its unit tests.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_core_knows_no_job_no_commits_folder_no_launcher_and_maps_no_file() {
    // Durability is a layer (kvstore-commit) over the core's seam: the core names no
    // job's variable, no folder of commits, no launcher's rank, and maps no file (no
    // transport either: `Collective` and `Remote` move data only).
    let words = ["KVSTORE_JOB", "KVSTORE_COMMIT_DIR", "/dev/shm", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"];
    let words = words.iter().chain(&["kvstore-run", "memmap", "mmap", "map_file", "MapFiles"]);
    for (file, text) in sources("kvstore-core/src") {
        let code = code(&text);
        for word in words.clone() {
            assert!(
                !code.contains(word),
                "{file} names `{word}`: the core knows no job, no commits' folder, no launcher"
            );
        }
    }
    let manifest = std::fs::read_to_string(root().join("kvstore-core/Cargo.toml")).expect("kvstore-core/Cargo.toml");
    assert!(!manifest.contains("memmap2"), "kvstore-core maps files");
}

/// Every file under `dir` whose name ends with one of `ends`, relative to the root,
/// with its text.
fn files(dir: &str, ends: &[&str]) -> Vec<(String, String)> {
    fn walk(dir: &Path, ends: &[&str], out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, ends, out);
            } else if ends.iter().any(|e| path.to_string_lossy().ends_with(e)) {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut found = Vec::new();
    walk(&root.join(dir), ends, &mut found);
    found.sort();
    found
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("a source file");
            (f.strip_prefix(&root).expect("under the root").display().to_string(), text)
        })
        .collect()
}

#[test]
fn the_bindings_take_no_dist_sync_step() {
    // A binding that cannot convert an argument makes the call all the same with the
    // refusal in its arrays' place (`Values::Refused`, `RowSparsePushes::Refused`):
    // the core takes the step. No binding refuses a call in the store itself, asks
    // whether other workers share it, or orders its calls.
    let words = [".refuse(", "nRefuse", "refuse(String", "check_step", "in_order(", "sharedWithOtherWorkers"];
    let words = words.iter().chain(&["num_workers() > 1", "numWorkers() > 1", "num-workers kv) 1"]);
    let bindings = [
        files("kvstore-py/src", &[".rs"]),
        files("kvstore-py/python/kvstore", &[".py"]),
        files("kvstore-jni/src", &[".rs"]),
        files("kvstore-jni/java/src", &[".java"]),
        files("clojure/src", &[".clj"]),
    ];
    let mut read = 0;
    for (file, text) in bindings.iter().flatten() {
        read += 1;
        for word in words.clone() {
            assert!(!text.contains(word), "{file} names `{word}`: a binding takes no dist_sync step");
        }
    }
    assert!(read > 40, "read {read} files of the bindings");
    for (file, text) in sources("kvstore-core/src") {
        assert!(!code(&text).contains("pub fn refuse("), "{file}: the core's API has no refusal of its own");
    }
}

#[test]
fn the_runners_look_nothing_up() {
    // A runner takes a plan (`Plan::new` in calls.rs, `Plan::batch` for a fused batch):
    // it finds no key itself and builds no plan. The spread runner's first round over
    // a call as given finds its keys through the plan's `Lookups`.
    let words = [".entry(", "lookup(", ".found(", ".find(", ".table", "Plan::new("];
    let runners = sources("kvstore-core/src/kvstore/run");
    assert!(runners.len() >= 4, "the runners: {:?}", runners.iter().map(|(f, _)| f).collect::<Vec<_>>());
    for (file, text) in &runners {
        let code = code(text);
        for word in words {
            assert!(!code.contains(word), "{file} names `{word}`: a runner looks nothing up");
        }
    }
}

#[test]
fn the_commits_reach_the_store_only_through_its_seam() {
    // kvstore-commit takes from the core its seam (`backend::Durable`, `Seam` and what
    // its methods hand out) and the users' types, nothing of a store's insides (which
    // the core does not export: the scan keeps the list of what it uses short).
    let seam = [
        "Durable",
        "MakeDurable",
        "Seam",
        "Peers",
        "Said",
        "Snapshot",
        "MAX_RECORD",
        "ranks",
        "word",
        "install_durability",
    ];
    for (file, text) in sources("kvstore-commit/src") {
        let code = code(&text);
        for (i, _) in code.match_indices("kvstore_core::backend::") {
            let rest = &code[i + "kvstore_core::backend::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(list) => list.split('}').next().unwrap_or("").split(',').map(str::trim).collect(),
                None => vec![rest.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or("")],
            };
            for name in names.iter().map(|n| n.split(' ').next().unwrap_or("")).filter(|n| !n.is_empty()) {
                assert!(seam.contains(&name), "{file} takes `backend::{name}` from the core, past its seam");
            }
        }
    }
}

/// The modules of `kvstore-core/src/kvstore/`, each by its path there (`run/fused`;
/// a folder's `mod.rs` is the folder's, `""` the top's), with its text outside its
/// comments and tests.
fn store_modules() -> Vec<(String, String)> {
    sources("kvstore-core/src/kvstore")
        .into_iter()
        .map(|(file, text)| {
            let path = file.trim_start_matches("kvstore-core/src/kvstore/").trim_end_matches(".rs");
            let module = path.trim_end_matches("mod").trim_end_matches('/').to_string();
            let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
            let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            (module, code.join("\n"))
        })
        .collect()
}

/// The modules of kvstore/ that `text` (module `module`'s) names: each path that starts
/// with `super::` or `crate::kvstore::` resolved to the longest module it names (a
/// brace list, `super::{a, b::C}`, read one level deep). A visibility,
/// `pub(in crate::kvstore)`, names none.
fn named_modules(module: &str, text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let text = text.replace("pub(in crate::kvstore)", "pub");
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut named = BTreeSet::new();
    let mut resolve = |base: Vec<&str>, rest: &str| {
        let mut at: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        let mut best = at.join("/");
        for seg in rest.split("::") {
            let seg = ident(seg);
            if seg.is_empty() {
                break;
            }
            at.push(seg);
            match modules.contains(&at.join("/")) {
                true => best = at.join("/"),
                false => break,
            }
        }
        named.insert(best);
    };
    let parts: Vec<&str> = if module.is_empty() { vec![] } else { module.split('/').collect() };
    // A file's `super` is its folder's parent module: `run/fused`'s is `run`.
    let folder_of = |m: &str| modules.iter().any(|x| x.starts_with(&format!("{m}/"))) || m.is_empty();
    let own_folder: Vec<&str> = match folder_of(module) {
        true => parts.clone(),
        false => parts[..parts.len().saturating_sub(1)].to_vec(),
    };
    for (i, _) in text.match_indices("crate::kvstore::") {
        let rest = &text[i + "crate::kvstore::".len()..];
        match rest.strip_prefix('{') {
            Some(list) => list.split('}').next().unwrap_or("").split(',').for_each(|s| resolve(vec![], s.trim())),
            None => resolve(vec![], rest),
        }
    }
    for (i, _) in text.match_indices("super::") {
        if i >= 2 && &text[i - 2..i] == "::" {
            continue; // (counted from the first `super`)
        }
        let mut rest = &text[i..];
        let mut base = own_folder.clone();
        // A file's `super` is its folder's module; a `mod.rs`'s is its parent's.
        if folder_of(module) {
            base.pop();
        }
        rest = &rest["super::".len()..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        match rest.strip_prefix('{') {
            Some(list) => list.split('}').next().unwrap_or("").split(',').for_each(|s| resolve(base.clone(), s.trim())),
            None => resolve(base.clone(), rest),
        }
    }
    named.remove(module);
    named.retain(|m| modules.contains(m));
    named
}

#[test]
fn the_store_has_its_data_at_the_bottom_its_api_on_top_and_no_import_circle() {
    let files = store_modules();
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let edges: Vec<(String, BTreeSet<String>)> =
        files.iter().map(|(m, text)| (m.clone(), named_modules(m, text, &modules))).collect();
    // No module imports an ancestor (a `mod.rs` above it: the API built on it).
    for (module, named) in &edges {
        let up = named.iter().find(|n| module.starts_with(&format!("{n}/")) || (n.is_empty() && !module.is_empty()));
        assert!(up.is_none(), "kvstore/{module} imports its ancestor kvstore/{}", up.map_or("", |u| u.as_str()));
    }
    // No circle: no module reaches itself.
    let next = |m: &str| edges.iter().find(|(x, _)| x == m).map(|(_, n)| n.clone()).unwrap_or_default();
    for (start, _) in &edges {
        let (mut seen, mut todo) = (BTreeSet::new(), next(start).into_iter().collect::<Vec<_>>());
        while let Some(m) = todo.pop() {
            assert!(&m != start, "kvstore/{start} reaches itself through its imports");
            if seen.insert(m.clone()) {
                todo.extend(next(&m));
            }
        }
    }
    // The data names no module that extends the store (their types reach it by a seam).
    let extends = |text: &str| text.contains("\nimpl Store {") || text.contains("\nimpl KVStore {");
    let data = &edges.iter().find(|(m, _)| m == "data").expect("kvstore/data.rs").1;
    for m in data {
        let text = &files.iter().find(|(x, _)| x == m).expect("a module").1;
        assert!(!extends(text), "kvstore/data.rs imports kvstore/{m}, which extends the store");
    }
    // The public API extends `KVStore` in mod.rs and calls.rs only.
    let api: BTreeSet<&str> =
        files.iter().filter(|(_, t)| t.contains("\nimpl KVStore {")).map(|(m, _)| m.as_str()).collect();
    assert_eq!(api, BTreeSet::from(["", "calls"]), "impl KVStore outside mod.rs and calls.rs");
}
