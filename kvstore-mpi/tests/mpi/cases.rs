//! The `dist_sync` and `dist_async` cases of `kvstore_tests::dist_cases` and
//! `async_cases` across the processes of an MPI job: `main.rs` runs each as a job of its
//! own (`mpirun ... mpi case NAME`), every rank running the same case, then finalising.

use kvstore_tests::{async_cases, dist_cases};

fn store() -> kvstore_core::KVStore {
    kvstore_mpi::create("dist_sync").expect("dist_sync")
}

/// A folder every rank sees: rank 0's name for it reaches every rank through `init`
/// (the ranks of these tests share one machine's filesystem).
fn shared_dir(kv: &kvstore_core::KVStore, name: &str) -> std::path::PathBuf {
    let mine = std::env::temp_dir().join(format!("kvstore-mpi-{}-{name}", std::process::id()));
    let mut bytes = mine.to_str().expect("a UTF-8 temp dir").as_bytes().to_vec();
    bytes.resize(512, 0);
    kv.init(format!("{name} dir"), &kvstore_core::NDArray::from_vec(&[512], bytes).expect("path")).expect("init");
    let root = kv.pull_new(format!("{name} dir"), 0).expect("pull").to_vec::<u8>().expect("bytes");
    let end = root.iter().position(|&b| b == 0).unwrap_or(root.len());
    let dir = std::path::PathBuf::from(String::from_utf8(root[..end].to_vec()).expect("a path"));
    if kv.rank() == 0 {
        std::fs::create_dir_all(&dir).expect("create the folder");
    }
    kv.barrier().expect("barrier");
    dir
}

fn a_checkpoint_resumes_exactly() {
    let kv = store();
    let dir = shared_dir(&kv, "checkpoint");
    let bits = dist_cases::a_checkpoint_resumes_exactly(kv.rank(), &kv, &store, &dir);
    kv.barrier().expect("barrier");
    if kv.rank() == 0 {
        std::fs::remove_dir_all(&dir).expect("remove the folder");
    }
    // Every rank compares its weights with rank 0's.
    let mine = kvstore_core::NDArray::from_vec(&[bits.len()], bits.clone()).expect("bits");
    kv.init("checkpoint bits", &mine).expect("init");
    assert!(
        kv.pull_new("checkpoint bits", 0).expect("pull").to_vec::<u8>().expect("r") == bits,
        "rank {} differs",
        kv.rank()
    );
}

/// Asserts that this rank's `bits` are rank 0's (which reach every rank through `init`
/// of the key `name`).
fn assert_as_on_rank_0(kv: &kvstore_core::KVStore, name: &str, bits: Vec<u8>) {
    let mine = kvstore_core::NDArray::from_vec(&[bits.len()], bits).expect("bits");
    kv.init(name, &mine).expect("init");
    let root = kv.pull_new(name, 0).expect("pull");
    assert!(root.to_vec::<u8>().expect("r") == mine.to_vec::<u8>().expect("r"), "rank {} differs", kv.rank());
}

/// A `dist_async` store of the job (a new one per test: every rank makes them in the
/// same order, so their channels match).
fn async_store() -> kvstore_core::KVStore {
    kvstore_mpi::create("dist_async").expect("dist_async")
}

fn async_every_push_of_every_rank_is_applied_once() {
    let kv = async_store();
    assert_eq!(kv.kind(), "dist_async");
    let bits = async_cases::every_push_is_applied_once(kv.rank(), &kv);
    assert_as_on_rank_0(&store(), "async bits", bits);
}

fn async_one_ranks_pushes_apply_in_its_order() {
    let kv = async_store();
    async_cases::one_workers_pushes_apply_in_order(kv.rank(), &kv);
}

fn async_an_optimizer_runs_on_the_owners() {
    let kv = async_store();
    async_cases::an_optimizer_runs_on_the_owners(kv.rank(), &kv);
}

fn async_random_schedules_lose_no_push() {
    let kv = async_store();
    for seed in 0..3 {
        async_cases::random_schedules_lose_no_push(kv.rank(), &kv, seed);
    }
}

fn async_a_checkpoint_resumes_in_dist_async_and_dist_sync_stores() {
    let kv = async_store();
    let dir = shared_dir(&store(), "async-ckpt");
    let path = dir.join("async.ckpt");
    let (saved, after) = async_cases::train_and_checkpoint(kv.rank(), &kv, &path);
    let resumed = async_store();
    resumed.load_checkpoint(&path).expect("load_checkpoint");
    assert_eq!(async_cases::checkpoint_bits(&resumed), saved);
    assert_eq!(async_cases::next_push(resumed.rank(), &resumed), after);
    let synced = store();
    synced.load_checkpoint(&path).expect("load_checkpoint");
    assert_eq!(async_cases::checkpoint_bits(&synced), saved);
    assert_as_on_rank_0(&store(), "async checkpoint bits", after);
    synced.barrier().expect("barrier");
    if kv.rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `dist_sync` and `dist_async` stores of one job, their calls interleaved step by
/// step: a `dist_sync` pushpull, then `dist_async` pushes (blocking and not) and pulls
/// of a small key and of one split over every owner, made while two non-blocking
/// `dist_sync` pushes are pending: a big one, running in the background under them, and
/// a small one, held back for fusion until it is waited for (so that wait is a
/// `dist_sync` call: every rank's `dist_async` calls end with that store's barrier
/// first, docs/dist-async.md). Every value is right on every rank, nothing waits for
/// ever, and finalising ends both.
fn async_and_sync_stores_interleave_in_one_job() {
    use kvstore_core::{Key, NDArray, Result};
    const BIG: usize = 1 << 20;
    let sync = store();
    let a = async_store();
    let (rank, n) = (sync.rank(), sync.num_workers());
    let sizes = [4, async_cases::BIG];
    let keys = ["mix a", "mix big"];
    let zeros: Vec<NDArray> = sizes.iter().map(|&s| NDArray::zeros(&[s]).expect("zeros")).collect();
    a.init(&keys[..], &zeros[..]).expect("init dist_async");
    a.set_updater(|_: &Key, _: usize, merged: &NDArray, stored: &NDArray| -> Result<()> { stored.add_assign(merged) })
        .expect("set_updater");
    let sync_keys = ["mix s", "mix t", "mix u"];
    let sync_zeros = [4, BIG, 4].map(|s| NDArray::zeros(&[s]).expect("zeros"));
    sync.init(&sync_keys[..], &sync_zeros[..]).expect("init dist_sync");
    let ranks_sum = |plus: usize| (0..n).map(|r| (r + 1 + plus) as f32).sum::<f32>();
    for step in 0..4usize {
        let out = NDArray::zeros(&[4]).expect("out");
        sync.pushpull("mix s", &NDArray::full(&[4], (rank + 1 + step) as f64).expect("v"), &out, 0).expect("pushpull");
        assert_eq!(out.to_vec::<f32>().expect("f32"), vec![ranks_sum(step); 4], "rank {rank}, step {step}: dist_sync");
        let running = sync.push_async("mix t", &NDArray::full(&[BIG], (rank + 1) as f64).expect("v"), 0);
        let held = sync.push_async("mix u", &NDArray::full(&[4], (rank + 1) as f64).expect("v"), 0);
        let one = NDArray::full(&[4], (rank + 1) as f64).expect("v");
        let big = NDArray::full(&[sizes[1]], (rank + 1) as f64).expect("v");
        a.push(keys[0], &one, 0).expect("dist_async push");
        a.push_async(keys[1], &big, 0).wait().expect("dist_async push_async");
        let _ = a.pull_new(keys[1], 0).expect("dist_async pull before the barrier");
        running.wait().expect("the running dist_sync push");
        a.barrier().expect("dist_async barrier");
        held.wait().expect("the held dist_sync push");
        let want = (step + 1) as f32 * ranks_sum(0);
        for (key, size) in keys.iter().zip(sizes) {
            let got = a.pull_new(*key, 0).expect("dist_async pull").to_vec::<f32>().expect("f32");
            assert!(
                got.len() == size && got.iter().all(|&x| x == want),
                "rank {rank}, step {step}, {key}: {:?}, want {want}",
                &got[..4]
            );
        }
        for (key, size) in [("mix t", BIG), ("mix u", 4)] {
            let got = sync.pull_new(key, 0).expect("pull").to_vec::<f32>().expect("f32");
            assert!(got.len() == size && got.iter().all(|&x| x == ranks_sum(0)), "rank {rank}, step {step}, {key}");
        }
        // Every rank's dist_async calls done before the next dist_sync call.
        a.barrier().expect("dist_async barrier");
    }
}

fn async_a_rank_that_makes_its_store_late_is_waited_for() {
    use kvstore_core::backend::Collective;
    // Rank 0 makes its store and inits at once, the others a moment later: rank 0's
    // init reaches owners that do not serve the store yet, and waits for them.
    let rank = kvstore_mpi::group().expect("group").rank();
    // Every rank's serving thread runs already (a store made before).
    async_store().barrier().expect("barrier");
    if rank != 0 {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let kv = async_store();
    let keys: Vec<String> = (0..8).map(|i| format!("late{i}")).collect();
    let ones: Vec<kvstore_core::NDArray> =
        keys.iter().map(|_| kvstore_core::NDArray::ones(&[3])).collect::<Result<_, _>>().expect("ones");
    kv.init(keys.as_slice(), ones.as_slice()).expect("init");
    kv.barrier().expect("barrier");
    for k in &keys {
        assert_eq!(kv.pull_new(k.as_str(), 0).expect("pull").to_vec::<f32>().expect("f32"), vec![1.0; 3]);
    }
    kv.barrier().expect("barrier");
}

fn async_errors_reach_the_caller_only() {
    let kv = async_store();
    async_cases::errors_reach_the_caller_only(kv.rank(), &kv);
}

fn a_key_sums_alike_alone_and_fused() {
    let kv = store();
    let bits = dist_cases::a_key_sums_alike_alone_and_fused(kv.rank(), &kv);
    assert_as_on_rank_0(&kv, "alike bits", bits);
}

fn a_big_key_sums_alike_as_small_fused_keys() {
    let kv = store();
    let bits = dist_cases::a_big_key_sums_alike_as_small_fused_keys(kv.rank(), &kv);
    assert_as_on_rank_0(&kv, "big key's bits", bits);
}

/// The big key's case where `KVSTORE_MPI_HOST_RANKS` makes hosts of the ranks (the
/// trials of `main.rs` that set it): big sums must go host by host exactly where
/// `KVSTORE_TEST_HOST_BY_HOST=1` says the placement allows it, with the fused keys'
/// bits, and a big integer key must get its exact sum.
fn big_sums_go_host_by_host_with_the_same_bits() {
    use kvstore_core::NDArray;
    let kv = store();
    let bits = dist_cases::a_big_key_sums_alike_as_small_fused_keys(kv.rank(), &kv);
    // (Unset: the suite's runs on this one machine, which sum flat.)
    let expected = std::env::var("KVSTORE_TEST_HOST_BY_HOST").is_ok_and(|v| v == "1");
    let group = kvstore_mpi::group().expect("group");
    assert_eq!(group.used_hosts(), expected, "rank {}: summed host by host", kv.rank());
    // 4 MiB and a little: in one chunk (`main.rs`'s run with chunks of 64 MiB), on 2
    // ranks a host each rank's segment ends in a piece of one element (pieces of 1 MiB),
    // whose part for the first of 2 hosts is empty; on 4 ranks a host, every other
    // rank's does. In 2 chunks (the default) or 65, the chunks' segments are uneven.
    const N: usize = 4 * (1 << 17) + 2;
    let w = kv.num_workers() as i64;
    kv.init(
        "hosts-i64",
        &NDArray::zeros_with(&[N], kvstore_core::DType::I64, kvstore_core::Context::cpu(0)).expect("z"),
    )
    .expect("init");
    let mine: Vec<i64> = (0..N as i64).map(|i| i * (kv.rank() as i64 + 1)).collect();
    kv.push("hosts-i64", &NDArray::from_vec(&[N], mine).expect("value"), 0).expect("push");
    let sum = kv.pull_new("hosts-i64", 0).expect("pull").to_vec::<i64>().expect("i64");
    let wrong = (0..N).filter(|&i| sum[i] != i as i64 * w * (w + 1) / 2).count();
    assert_eq!(wrong, 0, "rank {}: {wrong} elements of the i64 key are not the sum", kv.rank());
    assert_eq!(group.used_hosts(), expected, "rank {}: the i64 key summed host by host", kv.rank());
    host_steps_are_on_the_timeline(&kv, N, expected);
    assert_as_on_rank_0(&kv, "host-by-host bits", bits);
    if std::env::var("KVSTORE_MPI_HOST_CHUNK_BYTES").is_ok_and(|c| c == "65536") {
        big_sums_keep_a_groups_buffers(&kv);
    }
}

/// With chunks of 64 KiB (a big sum's groups of 4 MiB, 64 chunks): a big key summed in
/// place (a rank's two values of it summed into its merge buffer, which then goes
/// across the ranks) and one summed from the pushed array get the same bits (each rank
/// pushes the same sum both ways, and a key that rank 0 sums in place and the others
/// not gets them too), and no buffer the sums keep from one call to the next ever held
/// more than a group of a 16 MiB key (the copy for the sum in place held the whole key,
/// the flat sum's receive buffer half of it).
fn big_sums_keep_a_groups_buffers(kv: &kvstore_core::KVStore) {
    use kvstore_core::NDArray;
    const N: usize = (4 << 20) + 3;
    let rank = kv.rank();
    let half: Vec<f32> = (0..N).map(|i| ((i * 7 + rank * 3) % 11) as f32 * 0.25 - 1.0).collect();
    let whole: Vec<f32> = half.iter().map(|x| x + x).collect();
    let zeros = NDArray::zeros(&[N]).expect("zeros");
    kv.init(&["in-place", "from-array"][..], &[zeros.clone(), zeros][..]).expect("init");
    let halves = [NDArray::from_vec(&[N], half.clone()).expect("half"), NDArray::from_vec(&[N], half).expect("half")];
    kv.push("in-place", &halves[..], 0).expect("push in place");
    kv.push("from-array", &NDArray::from_vec(&[N], whole.clone()).expect("whole"), 0).expect("push");
    let (a, b) = (kv.pull_new("in-place", 0).expect("pull"), kv.pull_new("from-array", 0).expect("pull"));
    let (a, b) = (a.to_vec::<f32>().expect("f32"), b.to_vec::<f32>().expect("f32"));
    let differ = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(differ, 0, "rank {rank}: {differ} elements summed in place got other bits");
    // Rank 0 sums in place, the others from the pushed array: every rank makes the
    // same calls (the same groups), and the key gets the same bits.
    kv.init("mixed", &NDArray::zeros(&[N]).expect("zeros")).expect("init");
    match rank {
        0 => kv.push("mixed", &halves[..], 0).expect("push in place"),
        _ => kv.push("mixed", &NDArray::from_vec(&[N], whole).expect("whole"), 0).expect("push"),
    }
    let mixed = kv.pull_new("mixed", 0).expect("pull").to_vec::<f32>().expect("f32");
    let differ = mixed.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(differ, 0, "rank {rank}: {differ} elements of a key summed in place on rank 0 only got other bits");
    let largest = kvstore_mpi::group().expect("group").largest_scratch_bytes();
    assert!(largest <= 4 << 20, "rank {rank}: a buffer of big sums held {largest} bytes, more than a group's 4 MiB");
    assert!(largest > 0, "rank {rank}: the big sums used no buffer");
}

/// A push of the `n`-element `hosts-i64` key with the timeline on: where it sums host by
/// host, each of its three steps is an event of this rank's trace, with the bytes this
/// rank sent in it; otherwise there are none.
fn host_steps_are_on_the_timeline(kv: &kvstore_core::KVStore, n: usize, by_hosts: bool) {
    let dir = shared_dir(kv, "hosts-timeline");
    let trace = dir.join("trace.json");
    kv.start_timeline(&trace).expect("start the timeline");
    let ones = kvstore_core::NDArray::from_vec(&[n], vec![1i64; n]).expect("value");
    kv.push("hosts-i64", &ones, 0).expect("push");
    kv.stop_timeline().expect("stop the timeline");
    let own = dir.join(format!("trace.rank{}.json", kv.rank()));
    let text = std::fs::read_to_string(&own).unwrap_or_else(|e| panic!("{own:?}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).expect("a trace");
    let events = value.get("traceEvents").unwrap_or(&value).as_array().expect("events").clone();
    let steps: Vec<(String, Vec<u64>)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "wire" && e["name"] != "bucket")
        .map(|e| {
            let args = ["bytes", "host_bytes", "chunks"].iter().filter_map(|a| e["args"][a].as_u64()).collect();
            (e["name"].as_str().expect("a name").to_string(), args)
        })
        .collect();
    let expected: Vec<(String, Vec<u64>)> = if by_hosts {
        // Chunks of at most the setting's bytes (4 MiB by default), in groups of at most
        // 16, each group's steps three events.
        let chunk_bytes: usize = std::env::var(kvstore_mpi::HOST_CHUNK_BYTES_VAR)
            .ok()
            .filter(|v| !v.is_empty())
            .map_or(4 << 20, |v| v.parse().expect("chunk bytes"));
        let k: usize = std::env::var(kvstore_mpi::HOST_RANKS_VAR).expect("ranks per host").parse().expect("a number");
        let (w, r) = (kv.num_workers(), kv.rank());
        let m = w / k;
        let part = |len: usize, parts: usize, i: usize| len * (i + 1) / parts - len * i / parts;
        let chunks = (n * 8).div_ceil(chunk_bytes);
        let groups = chunks.div_ceil(16);
        let mut expected = Vec::new();
        for g in 0..groups {
            let (len, chunks) = (part(n, groups, g), part(chunks, groups, g));
            let chunk = |c: usize| part(len, chunks, c);
            let mine = |c: usize| part(chunk(c), k, r % k);
            let own = |c: usize| part(mine(c), m, r / k);
            let across: usize = (0..chunks).map(|c| mine(c) - own(c) + own(c) * (m - 1)).sum();
            let within: usize = (1..chunks).map(|c| chunk(c) - mine(c)).sum();
            let gather: usize = (0..chunks).map(|c| mine(c) * (k - 1)).sum();
            expected.push(("host sum".to_string(), vec![8 * (chunk(0) - mine(0)) as u64]));
            expected.push(("across hosts".to_string(), vec![8 * across as u64, 8 * within as u64, chunks as u64]));
            expected.push(("host gather".to_string(), vec![8 * gather as u64]));
        }
        expected
    } else {
        Vec::new()
    };
    assert_eq!(steps, expected, "rank {}: the steps of the sum host by host on the timeline", kv.rank());
    kv.barrier().expect("barrier");
    if kv.rank() == 0 {
        std::fs::remove_dir_all(&dir).expect("remove the folder");
    }
}

fn row_sparse_pushes_sum_every_workers_rows() {
    let kv = store();
    let bits = dist_cases::row_sparse_pushes_sum_every_workers_rows(kv.rank(), &kv);
    assert_as_on_rank_0(&kv, "row-sparse bits", bits);
}

fn compressed_pushes_sum_every_workers_quantised_values() {
    let kv = store();
    let bits = dist_cases::compressed_pushes_sum_every_workers_quantised_values(kv.rank(), &kv);
    assert_as_on_rank_0(&kv, "compressed bits", bits);
}

fn half_compressed_pushes_round_each_workers_sum_once() {
    for kind in ["fp16", "bf16"] {
        let kv = store();
        let bits = dist_cases::half_compressed_pushes_round_each_workers_sum_once(kv.rank(), &kv, kind);
        assert_as_on_rank_0(&kv, &format!("{kind} bits"), bits);
    }
}

fn half_compressed_sums_beyond_the_range_become_inf() {
    for kind in ["fp16", "bf16"] {
        let kv = store();
        let bits = dist_cases::half_compressed_sums_beyond_the_range_become_inf(kv.rank(), &kv, kind);
        assert_as_on_rank_0(&store(), &format!("{kind} range bits"), bits);
    }
}

fn an_updater_failing_on_one_worker_fails_the_push_everywhere() {
    for compression in [false, true] {
        // Replicated: the updater runs on every worker (with owners, on the key's owner
        // alone: tests/tests/owners.rs).
        let group: std::sync::Arc<dyn kvstore_core::backend::Collective> = kvstore_mpi::group().expect("group");
        let kv = kvstore_core::KVStore::builder("dist_sync")
            .collective(group)
            .layout(kvstore_core::Layout::Replicated)
            .build()
            .expect("a store");
        let bits = dist_cases::an_updater_failing_on_one_worker_fails_the_push_everywhere(kv.rank(), &kv, compression);
        assert_as_on_rank_0(&kv, &format!("bits after a failed update (2-bit: {compression})"), bits);
    }
}

fn a_call_refused_before_its_step_fails_on_every_worker() {
    let kv = store();
    dist_cases::a_call_refused_before_its_step_fails_on_every_worker(kv.rank(), &kv);
}

fn a_pull_refuses_bad_outs_before_writing_any() {
    let kv = store();
    dist_cases::a_pull_refuses_bad_outs_before_writing_any(kv.rank(), &kv);
}

fn workers_with_other_optimizers_fail_their_pushes() {
    let kv = store();
    let bits = dist_cases::workers_with_other_optimizers_fail_their_pushes(kv.rank(), &kv);
    assert_as_on_rank_0(&kv, "bits after the same optimizer", bits);
}

fn case_23_init_push_and_test_optimizer() {
    let kv = store();
    dist_cases::case_23_init_push_and_test_optimizer(kv.rank(), &kv);
}

fn workers_whose_calls_differ_all_fail() {
    let kv = store();
    dist_cases::workers_whose_calls_differ_all_fail(kv.rank(), &kv);
}

fn a_call_a_binding_refuses_fails_on_every_worker() {
    let kv = store();
    dist_cases::a_call_a_binding_refuses_fails_on_every_worker(kv.rank(), &kv);
}

fn each_round_every_worker_pushes_rank_plus_one() {
    let kv = store();
    dist_cases::each_round_every_worker_pushes_rank_plus_one(kv.rank(), &kv);
}

fn bf16_sums_across_workers_round_once() {
    let kv = store();
    dist_cases::bf16_sums_across_workers_round_once(kv.rank(), &kv);
}

fn every_dtype_sums_local_then_across_workers() {
    let kv = store();
    dist_cases::every_dtype_sums_local_then_across_workers(kv.rank(), &kv);
}

fn replicas_are_bit_identical_after_optimizer_steps() {
    let kv = store();
    let bits = dist_cases::an_optimizer_runs_identically_on_every_worker(kv.rank(), &kv);
    // Rank 0's bits reach every rank through init; each rank compares them with its own.
    let mine =
        kvstore_core::NDArray::from_vec(&[bits.len()], bits.iter().map(|&b| i64::from(b)).collect()).expect("bits");
    kv.init("bits", &mine).expect("init");
    let root =
        kvstore_core::NDArray::zeros_with(&[bits.len()], kvstore_core::DType::I64, kvstore_core::Context::cpu(0))
            .expect("root");
    kv.pull("bits", &root, 0).expect("pull");
    assert_eq!(
        root.to_vec::<i64>().expect("r"),
        mine.to_vec::<i64>().expect("r"),
        "rank {} differs from rank 0",
        kv.rank()
    );
}

/// `dist_sync` owners over MPI (its reduce-scatter): the bits of the replicated layout,
/// on every rank alike.
fn owners_train_as_the_replicated_layout() {
    let kv = store();
    let bits = dist_cases::owners_train_as_the_replicated_layout(kv.rank(), &store_of_layout);
    assert_as_on_rank_0(&kv, "owners bits", bits.iter().flat_map(|b| b.to_le_bytes()).collect());
}

/// A `dist_sync` store of the job with `layout`, splitting keys from 1000 elements.
fn store_of_layout(layout: kvstore_core::Layout) -> kvstore_core::KVStore {
    let group: std::sync::Arc<dyn kvstore_core::backend::Collective> = kvstore_mpi::group().expect("group");
    kvstore_core::KVStore::builder("dist_sync")
        .collective(group)
        .layout(layout)
        .bigarray_bound(1000)
        .build()
        .expect("a store")
}

/// Row-sparse tables whose rows live on their owners, over MPI's alltoallv: the bits
/// of the replicated layout and of a `local` store, the same on every rank.
fn tables_on_owners_train_as_the_replicated_layout() {
    let kv = store();
    let bits =
        dist_cases::tables_on_owners_train_as_the_replicated_layout(kv.rank(), kv.num_workers(), &store_of_layout);
    assert_as_on_rank_0(&kv, "tables bits", bits.iter().flat_map(|b| b.to_le_bytes()).collect());
}

/// The rows of the memory-limited table, 64 f32 each: 512 MiB in all.
const LIMITED_ROWS: usize = 1 << 21;
/// The memory each rank of the memory-limited job may use (`RLIMIT_DATA`, which counts
/// its heap and private mappings): under the table's 512 MiB, over a quarter of it
/// with its momentum (256 MiB) and the process itself.
const LIMITED_BYTES: u64 = 448 << 20;

/// A table no rank may hold: every rank's memory is limited (`setrlimit`, before MPI
/// starts) below the table's size, and with `KVSTORE_LAYOUT=owners` each rank holds a
/// quarter of it and of its state: 5 steps of SGD with momentum, every rank pushing and
/// pulling rows of its own, end with the bits of a `local` store holding only the rows
/// touched (a lazy update touches rows alone); a dense pull of the table is refused,
/// saying to pull rows. With `KVSTORE_LAYOUT=replicated` the table cannot be made:
/// every rank fails `init_row_sparse` with an error, and none hangs.
fn a_table_no_rank_can_hold_trains_on_its_owners() {
    use kvstore_core::{DType, ErrorKind, NDArray, Optimizer, RowSparse};
    let limit = libc::rlimit { rlim_cur: LIMITED_BYTES, rlim_max: LIMITED_BYTES };
    // SAFETY: setrlimit reads the struct it is given.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) }, 0, "setrlimit");
    let kv = store();
    let (rank, n) = (kv.rank(), kv.num_workers());
    let shape = [LIMITED_ROWS, 64];
    let sgd = || Optimizer::builder("sgd").param("learning_rate", 0.1).param("momentum", 0.9).build().expect("sgd");
    let init = kv.init_row_sparse("table", &RowSparse::zeros(&shape, DType::F32).expect("no rows"));
    if std::env::var("KVSTORE_LAYOUT").as_deref() == Ok("replicated") {
        let e = init.expect_err("a whole table on every rank");
        assert_eq!(e.kind(), ErrorKind::ResourceExhausted, "rank {rank}: {e}");
        return;
    }
    init.expect("init on the owners");
    kv.set_optimizer(sgd()).expect("set_optimizer");
    // Each rank's rows of each step, and every rank's: spread over the table.
    let rows = |step: usize, r: usize| -> Vec<i64> {
        let mut ids: Vec<i64> =
            (0..500).map(|i| ((i * 2_654_435_761 + step * 97 + r * 7919) % LIMITED_ROWS) as i64).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let grad = |step: usize, r: usize, ids: &[i64], shape: &[usize]| {
        let data: Vec<f32> =
            (0..ids.len() * 64).map(|i| ((i * 31 + step * 7 + r * 13) % 201) as f32 / 100.0 - 1.0).collect();
        let data = NDArray::from_vec(&[ids.len(), 64], data).expect("rows");
        RowSparse::new(data, ids.to_vec(), shape).expect("a gradient")
    };
    // The local store: the rows any rank touches, in order, as a small table.
    let mut touched: Vec<i64> = (0..5).flat_map(|s| (0..n).flat_map(move |r| rows(s, r))).collect();
    touched.sort_unstable();
    touched.dedup();
    let small = [touched.len(), 64];
    let at =
        |ids: &[i64]| -> Vec<i64> { ids.iter().map(|i| touched.binary_search(i).expect("touched") as i64).collect() };
    let local = kvstore_core::KVStore::create("local").expect("local");
    local.init_row_sparse("table", &RowSparse::zeros(&small, DType::F32).expect("no rows")).expect("init");
    local.set_optimizer(sgd()).expect("set_optimizer");
    for step in 0..5 {
        kv.push_row_sparse("table", &[grad(step, rank, &rows(step, rank), &shape)], 0).expect("push");
        let all: Vec<RowSparse> = (0..n).map(|r| grad(step, r, &at(&rows(step, r)), &small)).collect();
        local.push_row_sparse("table", &all, 0).expect("push local");
        let want = rows(step, (rank + 1) % n);
        let got = kv.row_sparse_pull("table", &want, 0).expect("row_sparse_pull");
        let expected = local.row_sparse_pull("table", &at(&want), 0).expect("local pull");
        assert_eq!(got.indices(), want.as_slice(), "rank {rank}");
        let bits = |a: &NDArray| a.to_vec::<f32>().expect("read").iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(got.data()) == bits(expected.data()), "rank {rank}: step {step}'s rows differ");
    }
    let held = kv.stats().held;
    assert!(held.values + held.state <= 2 * 512 * (1 << 20) / n as u64 + (1 << 20), "rank {rank} holds {held:?}");
    let dense = kv.pull_new("table", 0).map(|_| ()).expect_err("a dense pull of the table");
    assert_eq!(dense.kind(), ErrorKind::ResourceExhausted, "rank {rank}: {dense}");
}

/// MPI's alltoallv (`Collective::all_to_all`): each rank's bytes reach their rank alone,
/// of every length (none included), whole in one round and in rounds of 7 bytes.
fn all_to_all_moves_each_ranks_bytes_to_its_rank() {
    use kvstore_core::backend::Collective;
    let group = kvstore_mpi::group().expect("group");
    let (me, n) = (group.rank(), group.size());
    let message = |from: usize, to: usize| -> Vec<u8> {
        let len = [0, 1, 7, 8, 100, 5000][(from * 3 + to) % 6];
        (0..len).map(|i| (i * 31 + from * 7 + to * 13) as u8).collect()
    };
    let sends: Vec<Vec<u8>> = (0..n).map(|to| message(me, to)).collect();
    let want: Vec<Vec<u8>> = (0..n).map(|from| message(from, me)).collect();
    assert_eq!(group.all_to_all("a test", &sends).expect("all_to_all"), want, "rank {me}");
    assert_eq!(group.all_to_all_in_rounds("a test", &sends, 7).expect("in rounds"), want, "rank {me}, in rounds");
    let wrong = group.all_to_all("a test", &sends[1..]).expect_err("one send short");
    assert!(wrong.to_string().contains("sends for"), "{wrong}");
}

/// The owners' reduce-scatter and all-gather over MPI (`parts.rs`), on arrays that
/// travel straight from their memory (64 KiB or more: split, whole on one rank, in
/// several pieces of 1 MiB) and packed (small ones, and f16/bf16), of every wire type:
/// each rank's range gets the allreduce's bits, an in-place pair and a source given
/// twice too; the all-gather gives every rank every owner's elements, an array given
/// twice too; parts that overlap are refused on every rank.
fn owners_sums_and_gathers_move_each_range_to_its_rank() {
    use kvstore_core::backend::{Collective, with_bytes};
    use kvstore_core::{DType, NDArray};
    let group = kvstore_mpi::group().expect("group");
    let (me, n) = (group.rank(), group.size());
    let bytes = |a: &NDArray| with_bytes(a, <[u8]>::to_vec).expect("bytes");
    // (elements, dtype, the whole owner, or split)
    let specs: [(usize, DType, Option<usize>); 10] = [
        (600_000, DType::F32, None),
        (70_000, DType::F32, Some(0)),
        (16_385, DType::F32, None),
        (1_000, DType::F32, None),
        (500, DType::F32, Some(n - 1)),
        (40_000, DType::F16, None),
        (40_000, DType::BF16, Some(1 % n)),
        (20_000, DType::F64, None),
        (30_000, DType::I32, Some(n / 2)),
        (300_000, DType::U8, None),
    ];
    let ranges = |len: usize, owner: Option<usize>| -> Vec<std::ops::Range<usize>> {
        (0..n)
            .map(|r| match owner {
                Some(o) if o == r => 0..len,
                Some(_) => len..len,
                None => len * r / n..len * (r + 1) / n,
            })
            .collect()
    };
    let value = |k: usize, r: usize, i: usize, dtype: DType| match dtype {
        DType::I32 | DType::U8 => ((i * 7 + k * 13 + r * 31) % 50) as f64,
        _ => ((i * 7 + k * 13 + r * 31) % 1000) as f64 * 0.013 - 3.1,
    };
    let array = |dtype: DType, len: usize, f: &dyn Fn(usize) -> f64| {
        NDArray::from_vec(&[len], (0..len).map(f).collect::<Vec<f64>>()).and_then(|a| a.as_type(dtype)).expect("array")
    };
    let sources: Vec<NDArray> =
        specs.iter().enumerate().map(|(k, &(len, d, _))| array(d, len, &|i| value(k, me, i, d))).collect();
    let parts: Vec<Vec<std::ops::Range<usize>>> = specs.iter().map(|&(len, _, o)| ranges(len, o)).collect();
    // The allreduce's sums, whole.
    let copies: Vec<NDArray> = sources.iter().map(|s| s.deep_copy().expect("copy")).collect();
    let sums: Vec<NDArray> =
        sources.iter().map(|s| NDArray::zeros_with(s.shape(), s.dtype(), s.context()).expect("zeros")).collect();
    let pairs: Vec<(&NDArray, &NDArray)> = copies.iter().zip(&sums).collect();
    group.allreduce_sum(&pairs).expect("allreduce");
    // Key 1 is summed in place on its owner (rank 0); key 0's source is given again,
    // as key 10's.
    let dests: Vec<NDArray> = specs
        .iter()
        .zip(&parts)
        .enumerate()
        .map(|(k, (&(_, d, _), p))| match k == 1 && me == 0 {
            true => sources[1].clone(),
            false => NDArray::zeros_with(&[p[me].len()], d, sources[k].context()).expect("zeros"),
        })
        .chain([NDArray::zeros(&[parts[0][me].len()]).expect("zeros")])
        .collect();
    let mut pairs: Vec<(&NDArray, &NDArray)> = sources.iter().zip(&dests).collect();
    pairs.push((&sources[0], &dests[10]));
    let mut all_parts = parts.clone();
    all_parts.push(parts[0].clone());
    group.reduce_scatter_sum(&pairs, &all_parts).expect("reduce-scatter");
    for (k, (_, dst)) in pairs.iter().enumerate() {
        let whole = bytes(&sums[k % 10]);
        let each = dst.dtype().size();
        let r = &all_parts[k][me];
        assert!(bytes(dst) == whole[r.start * each..r.end * each], "key {k}: rank {me}'s range is not the allreduce's");
    }
    // The all-gather: each rank writes its ranges only; every rank ends with every
    // owner's elements. Key 0's array is given twice.
    let owner_of = |p: &[std::ops::Range<usize>], i: usize| (0..n).find(|&r| p[r].contains(&i)).expect("an owner");
    let values: Vec<NDArray> = specs
        .iter()
        .zip(&parts)
        .enumerate()
        .map(|(k, (&(len, d, _), p))| array(d, len, &|i| if p[me].contains(&i) { value(k, me, i, d) } else { 99.0 }))
        .collect();
    let mut arrays: Vec<&NDArray> = values.iter().collect();
    arrays.push(&values[0]);
    group.all_gather_parts("the test's all-gather", &arrays, &all_parts).expect("all-gather");
    for (k, (&(len, d, _), p)) in specs.iter().zip(&parts).enumerate() {
        let expected = array(d, len, &|i| value(k, owner_of(p, i), i, d));
        assert!(bytes(&values[k]) == bytes(&expected), "key {k}: rank {me} did not get every owner's elements");
    }
    // Parts that overlap: refused, on every rank, before anything moves.
    let big = NDArray::zeros(&[100_000]).expect("zeros");
    let overlapping: Vec<std::ops::Range<usize>> = (0..n).map(|r| 0..(100_000 * (r + 1) / n).max(1)).collect();
    let refused = group.all_gather_parts("overlapping parts", &[&big], &[overlapping]);
    assert!(refused.is_err() || n == 1, "rank {me}: overlapping parts were gathered");
}

/// The same array given twice to the owners' all-gather, with complementary parts (rank
/// 0 owns its first half the first time, rank 1 its second half the second): every rank
/// ends with both halves, as the trait's default gives them (found by the red team: the
/// second copy's write-back undid the first's).
fn owners_gathers_keep_every_range_of_an_array_given_twice() {
    use kvstore_core::NDArray;
    use kvstore_core::backend::{Collective, gather_parts_through_bytes};
    let group = kvstore_mpi::group().expect("group");
    let (me, n) = (group.rank(), group.size());
    let (len, half) = (65_536, 32_768);
    let first: Vec<std::ops::Range<usize>> = (0..n).map(|r| if r == 0 { 0..half } else { half..half }).collect();
    let second: Vec<std::ops::Range<usize>> = (0..n).map(|r| if r == 1 { half..len } else { len..len }).collect();
    let make = || {
        let owned = |i: usize| (i < half && me == 0) || (i >= half && me == 1);
        NDArray::from_vec(&[len], (0..len).map(|i| if owned(i) { i as f32 } else { -1.0 }).collect()).expect("array")
    };
    let (by_default, by_mpi) = (make(), make());
    let parts = [first, second];
    gather_parts_through_bytes(&*group, "default", &[&by_default, &by_default], &parts).expect("default");
    group.all_gather_parts("mpi", &[&by_mpi, &by_mpi], &parts).expect("mpi");
    let expected: Vec<f32> = (0..len).map(|i| i as f32).collect();
    assert_eq!(by_default.to_vec::<f32>().expect("r"), expected, "rank {me}: the default");
    assert_eq!(by_mpi.to_vec::<f32>().expect("r"), expected, "rank {me}: MPI's");
}

/// A reduce-scatter and an all-gather of 1500 arrays of 64 KiB (each straight from its
/// memory) on a thread of 512 KiB of stack: the arrays' locks are held in a vector
/// (found by the red team: held by recursion, a few KiB of stack each, they overflowed
/// a thread's stack past a few hundred arrays).
fn owners_sums_of_many_big_arrays_need_no_more_stack() {
    use kvstore_core::NDArray;
    use kvstore_core::backend::Collective;
    let group = kvstore_mpi::group().expect("group");
    let (me, n) = (group.rank(), group.size());
    let (count, len) = (1500, 16_384);
    let sources: Vec<NDArray> = (0..count).map(|_| NDArray::ones(&[len]).expect("ones")).collect();
    let parts: Vec<Vec<std::ops::Range<usize>>> =
        (0..count).map(|_| (0..n).map(|r| len * r / n..len * (r + 1) / n).collect()).collect();
    let dests: Vec<NDArray> = (0..count).map(|_| NDArray::zeros(&[parts[0][me].len()]).expect("zeros")).collect();
    std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(move || {
            let pairs: Vec<(&NDArray, &NDArray)> = sources.iter().zip(&dests).collect();
            group.reduce_scatter_sum(&pairs, &parts).expect("reduce-scatter");
            let arrays: Vec<&NDArray> = sources.iter().collect();
            group.all_gather_parts("many arrays", &arrays, &parts).expect("all-gather");
            let summed = dests.iter().all(|d| d.to_vec::<f32>().expect("r").iter().all(|&x| x == n as f32));
            assert!(summed, "rank {me}: the sums of {count} arrays");
        })
        .expect("a thread")
        .join()
        .expect("the sums on a small stack");
}

fn nonblocking_training_matches_blocking() {
    let kv = store();
    let bits = dist_cases::nonblocking_training_matches_blocking(kv.rank(), &kv);
    // Every rank compares its weights with rank 0's (which init gives every rank).
    let mine =
        kvstore_core::NDArray::from_vec(&[bits.len()], bits.iter().map(|&b| i32::from(b)).collect()).expect("bits");
    kv.init("nonblocking bits", &mine).expect("init");
    let root = kv.pull_new("nonblocking bits", 0).expect("pull");
    assert_eq!(root.to_vec::<i32>().expect("r"), mine.to_vec::<i32>().expect("r"), "rank {} differs", kv.rank());
}

fn small_buckets_split_keys_and_give_the_same_sums() {
    let group = kvstore_mpi::group().expect("group");
    let bucket = group.bucket_bytes();
    group.set_bucket_bytes(256);
    let kv = store();
    dist_cases::every_dtype_sums_local_then_across_workers(kv.rank(), &kv);
    group.set_bucket_bytes(bucket);
}

/// Fused sums through the machine's shared memory and through MPI's own messages give
/// the same bits: every dtype, values whose sums round differently in another order
/// (magnitudes 1e-6 to 1e6, both signs), keys fused with others and split over many
/// buckets (256 bytes: both slots of the window, over several calls), on 2 and 4 ranks.
fn shared_memory_and_mpi_messages_give_the_same_bits() {
    use kvstore_core::{DType, NDArray};
    let group = kvstore_mpi::group().expect("group");
    let (bucket, shm) = (group.bucket_bytes(), group.shared_memory());
    // A job's first fused sum opens the shared window, or, in a job started with shared
    // memory off, leaves it closed for good: that sum first, as the job's other calls
    // would make it.
    let first = store();
    first.init("shm first", &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    first.push("shm first", &NDArray::ones(&[4]).expect("ones"), 0).expect("push");
    let run = |on: bool, bytes: usize| {
        group.set_shared_memory(on);
        group.set_bucket_bytes(bytes);
        let kv = store();
        let rank = kv.rank();
        let mut bits = Vec::new();
        for (d, dtype) in DType::ALL.iter().enumerate() {
            let keys: Vec<String> = (0..5).map(|k| format!("shm-{dtype}-{k}")).collect();
            let sizes = [1usize, 7, 100, 33, 250];
            let value = |n: usize, salt: usize| -> NDArray {
                let v: Vec<f64> = (0..n)
                    .map(|i| {
                        let mantissa = ((i * 31 + rank * 17 + salt + d) % 13) as f64 + 0.1;
                        let sign = if (i + rank + salt).is_multiple_of(3) { -1.0 } else { 1.0 };
                        sign * mantissa * 10f64.powi(((i + 2 * rank) % 5) as i32 * 3 - 6)
                    })
                    .collect();
                NDArray::from_vec(&[n], v).expect("value").as_type(*dtype).expect("as_type")
            };
            let zeros: Vec<NDArray> =
                sizes.iter().map(|&n| NDArray::zeros_with(&[n], *dtype, Default::default()).expect("z")).collect();
            kv.init(&keys, &zeros).expect("init");
            for round in 0..3 {
                let values: Vec<NDArray> = sizes.iter().enumerate().map(|(k, &n)| value(n, 7 * round + k)).collect();
                kv.push(&keys, &values, 0).expect("push");
                for k in &keys {
                    let out = kv.pull_new(k.as_str(), 0).expect("pull");
                    bits.push(kvstore_tests::device_checks::bits(&out));
                }
            }
        }
        // (Shared memory is decided at the job's first fused sum: off for good if the job
        // started with it off, as the jobs with KVSTORE_MPI_SHARED_MEMORY=0 do.)
        assert_eq!(group.used_shared_memory(), on && shm && kv.num_workers() > 1, "rank {rank}: shared memory {on}");
        bits
    };
    for bytes in [256, 4 << 20] {
        let through_shm = run(true, bytes);
        assert!(through_shm == run(false, bytes), "{bytes}-byte buckets: other bits through shared memory");
    }
    group.set_bucket_bytes(bucket);
    group.set_shared_memory(shm);
}

/// Run alone with a bad `KVSTORE_MPI_HOST_RANKS` (`main.rs`'s settings), making a store
/// fails with an error naming the variable; without it, making one succeeds.
fn host_ranks_come_from_the_environment() {
    refused_when_set(kvstore_mpi::HOST_RANKS_VAR);
}

/// Without `var`, making a store succeeds; with it (a bad value), it fails with an
/// error naming `var`.
fn refused_when_set(var: &str) {
    if std::env::var_os(var).is_none() {
        store();
        return;
    }
    let e = kvstore_mpi::create("dist_sync").expect_err("a bad setting");
    assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains(var), "{e}");
}

/// Run alone with a `KVSTORE_MPI_HOST_CHUNK_BYTES` that is not a number, or below its
/// least (`main.rs`'s settings): making a store fails with an error naming the variable;
/// without it, making one succeeds.
fn host_chunk_bytes_come_from_the_environment() {
    refused_when_set(kvstore_mpi::HOST_CHUNK_BYTES_VAR);
}

/// Run alone with `KVSTORE_MPI_SHARED_MEMORY` neither 0 nor 1 too (`main.rs`), and in
/// jobs with it 0.
fn shared_memory_comes_from_the_environment() {
    // (Open MPI's transport list decides when the variable is unset; the suite sets none.)
    let btl = std::env::var_os("OMPI_MCA_btl").is_some();
    match std::env::var(kvstore_mpi::SHARED_MEMORY_VAR).ok().map(|v| v.trim().to_string()) {
        None if btl => {}
        Some(v) if v.is_empty() && btl => {}
        None => assert!(kvstore_mpi::group().expect("group").shared_memory()),
        Some(v) if v.is_empty() || v == "1" => assert!(kvstore_mpi::group().expect("group").shared_memory()),
        Some(v) if v == "0" => assert!(!kvstore_mpi::group().expect("group").shared_memory()),
        Some(_) => {
            let e = kvstore_mpi::create("dist_sync").expect_err("a bad setting");
            assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(kvstore_mpi::SHARED_MEMORY_VAR), "{e}");
        }
    }
}

/// Run in jobs with `KVSTORE_MPI_BUCKET_BYTES=256`, and alone with a value that is not
/// a number (`main.rs`).
fn bucket_bytes_come_from_the_environment() {
    match std::env::var(kvstore_mpi::BUCKET_BYTES_VAR).ok().filter(|v| !v.trim().is_empty()) {
        None => assert_eq!(kvstore_mpi::group().expect("group").bucket_bytes(), 4 << 20),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) => assert_eq!(kvstore_mpi::group().expect("group").bucket_bytes(), n.max(64)),
            Err(_) => {
                let e = kvstore_mpi::create("dist_sync").expect_err("a bad bucket size");
                assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument);
                assert!(e.to_string().contains(kvstore_mpi::BUCKET_BYTES_VAR), "{e}");
            }
        },
    }
}

/// Run by `main.rs` with a setting that shapes the ranks' messages set on some ranks
/// only (`KVSTORE_TEST_DIFFERS` names it): making a store fails on every rank with an
/// error naming it, where the ranks would otherwise post messages that do not match (a
/// job that crashed, or hung); in the other runs, where the settings agree, it works.
fn settings_that_differ_between_ranks_are_refused() {
    match std::env::var("KVSTORE_TEST_DIFFERS") {
        Ok(var) => {
            let e = kvstore_mpi::create("dist_sync").expect_err("settings that differ between the ranks");
            assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument, "{e}");
            let shown = e.to_string();
            assert!(shown.contains(&var) && shown.contains("differs between the ranks"), "{shown}");
        }
        Err(_) => drop(kvstore_mpi::create("dist_sync").expect("a store")),
    }
}

/// Run alone with `KVSTORE_TIMEOUT` not a number too (`main.rs`); the jobs run with it
/// unset (the default).
fn timeout_comes_from_the_environment() {
    match std::env::var(kvstore_mpi::TIMEOUT_VAR).ok().filter(|v| !v.trim().is_empty()) {
        None => assert_eq!(kvstore_mpi::group().expect("group").timeout(), std::time::Duration::from_secs(600)),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) => assert_eq!(kvstore_mpi::group().expect("group").timeout().as_secs_f64(), s),
            Err(_) => {
                let e = kvstore_mpi::create("dist_sync").expect_err("a bad timeout");
                assert_eq!(e.kind(), kvstore_core::ErrorKind::InvalidArgument);
                assert!(e.to_string().contains(kvstore_mpi::TIMEOUT_VAR), "{e}");
            }
        },
    }
}

/// The builder's timeout is the group's, for every store of the job on this worker.
fn the_builder_sets_the_timeout() {
    let group = kvstore_mpi::group().expect("group");
    let before = group.timeout();
    let kv = kvstore_core::KVStore::builder("dist_sync")
        .collective(group.clone())
        .timeout(std::time::Duration::from_secs(42))
        .build()
        .expect("store");
    assert_eq!(group.timeout(), std::time::Duration::from_secs(42));
    drop(kv);
    group.set_timeout(before);
}

/// A call made blocking on one rank and non-blocking on another would never match
/// in MPI (a non-blocking collective never matches a blocking one): both ranks fail
/// it at once instead, and go on.
fn a_call_made_blocking_on_one_rank_and_not_on_another_fails_on_every_rank() {
    let kv = store();
    kv.init("mixed", &kvstore_core::NDArray::zeros(&[65_536]).expect("zeros")).expect("init");
    let big = kvstore_core::NDArray::ones(&[65_536]).expect("ones");
    let mixed = if kv.rank() == 0 { kv.push_async("mixed", &big, 0).wait() } else { kv.push("mixed", &big, 0) };
    if kv.num_workers() > 1 {
        let e = mixed.expect_err("mixed forms");
        assert!(e.to_string().contains("the workers' calls differ"), "{e}");
    } else {
        mixed.expect("one worker");
    }
    kv.push("mixed", &big, 0).expect("the same form on every rank");
}

/// A batch of fused calls cut on one rank (it waited for a call the others still hold)
/// and a call refused on one rank before it was looked up (its caller refused the
/// arguments) cut every rank's steps alike: the calls go on or fail as they would
/// alone, and the next calls stay matched.
fn a_batch_cut_on_one_rank_is_cut_on_every_rank() {
    use kvstore_core::NDArray;
    let kv = store();
    let (n, last) = (kv.num_workers() as f32, kv.rank() + 1 == kv.num_workers());
    let keys = ["cut a", "cut b", "cut c"];
    for k in keys {
        kv.init(k, &NDArray::zeros(&[4]).expect("zeros")).expect("init");
    }
    let (one, two, three) = (
        NDArray::ones(&[4]).expect("ones"),
        NDArray::full(&[4], 2.0).expect("v"),
        NDArray::full(&[4], 3.0).expect("v"),
    );
    let first = kv.push_async("cut a", &one, 0);
    let (first, waited) = if kv.rank() == 0 { (None, Some(first.wait())) } else { (Some(first), None) };
    let refusal = kvstore_core::Error::invalid_argument("its caller refused the arguments");
    let second = match last && kv.num_workers() > 1 {
        true => kv.push_async("cut b", kvstore_core::Values::Refused(&refusal), 0),
        false => kv.push_async("cut b", &two, 0),
    };
    let third = kv.push_async("cut c", &three, 0);
    waited.unwrap_or_else(|| first.expect("not waited for").wait()).expect("the first push");
    let refused = second.wait();
    third.wait().expect("the third push");
    if kv.num_workers() > 1 {
        let e = refused.expect_err("refused on the last rank").to_string();
        let want = if last { "its caller refused the arguments" } else { "refused the call" };
        assert!(e.contains(want), "{e}");
    }
    kv.push("cut c", &three, 0).expect("the next push");
    kv.barrier().expect("the barrier");
    let b = if kv.num_workers() > 1 { 0.0 } else { 2.0 };
    for (k, want) in keys.iter().zip([n, b, 3.0 * n]) {
        assert_eq!(kv.pull_new(*k, 0).expect("pull").to_vec::<f32>().expect("values"), vec![want; 4], "{k}");
    }
}

/// Finalising runs the calls still queued or held back for fusion first: a small
/// push (held, waiting for more) and a big one, whose handles are kept, and one
/// whose handle was dropped.
fn finalize_runs_the_calls_still_queued() {
    let kv = store();
    let n = kv.num_workers() as f32;
    kv.init(
        ["fin small", "fin big", "fin dropped"].as_slice(),
        [
            kvstore_core::NDArray::zeros(&[4]).expect("zeros"),
            kvstore_core::NDArray::zeros(&[65_536]).expect("zeros"),
            kvstore_core::NDArray::zeros(&[4]).expect("zeros"),
        ]
        .as_slice(),
    )
    .expect("init");
    let big = kv.push_async("fin big", &kvstore_core::NDArray::ones(&[65_536]).expect("ones"), 0);
    let small = kv.push_async("fin small", &kvstore_core::NDArray::ones(&[4]).expect("ones"), 0);
    drop(kv.push_async("fin dropped", &kvstore_core::NDArray::ones(&[4]).expect("ones"), 0));
    kvstore_mpi::finalize().expect("finalize");
    assert!(small.is_finished() && big.is_finished(), "finalize left a call unrun");
    small.wait().expect("the small push");
    big.wait().expect("the big push");
    kv.wait_all().expect("the dropped push");
    for (key, len) in [("fin small", 4), ("fin big", 65_536), ("fin dropped", 4)] {
        assert_eq!(kv.pull_new(key, 0).expect("pull").to_vec::<f32>().expect("values"), vec![n; len], "{key}");
    }
    assert!(kv.push("fin small", &kvstore_core::NDArray::ones(&[4]).expect("ones"), 0).is_err(), "a push after");
}

/// Every case, by name.
pub(super) const CASES: &[(&str, fn())] = &[
    ("a_checkpoint_resumes_exactly", a_checkpoint_resumes_exactly),
    ("a_batch_cut_on_one_rank_is_cut_on_every_rank", a_batch_cut_on_one_rank_is_cut_on_every_rank),
    ("async_every_push_of_every_rank_is_applied_once", async_every_push_of_every_rank_is_applied_once),
    ("async_one_ranks_pushes_apply_in_its_order", async_one_ranks_pushes_apply_in_its_order),
    ("async_an_optimizer_runs_on_the_owners", async_an_optimizer_runs_on_the_owners),
    ("async_random_schedules_lose_no_push", async_random_schedules_lose_no_push),
    (
        "async_a_checkpoint_resumes_in_dist_async_and_dist_sync_stores",
        async_a_checkpoint_resumes_in_dist_async_and_dist_sync_stores,
    ),
    ("async_and_sync_stores_interleave_in_one_job", async_and_sync_stores_interleave_in_one_job),
    ("async_a_rank_that_makes_its_store_late_is_waited_for", async_a_rank_that_makes_its_store_late_is_waited_for),
    ("async_errors_reach_the_caller_only", async_errors_reach_the_caller_only),
    ("a_key_sums_alike_alone_and_fused", a_key_sums_alike_alone_and_fused),
    ("a_big_key_sums_alike_as_small_fused_keys", a_big_key_sums_alike_as_small_fused_keys),
    ("big_sums_go_host_by_host_with_the_same_bits", big_sums_go_host_by_host_with_the_same_bits),
    ("row_sparse_pushes_sum_every_workers_rows", row_sparse_pushes_sum_every_workers_rows),
    ("compressed_pushes_sum_every_workers_quantised_values", compressed_pushes_sum_every_workers_quantised_values),
    ("half_compressed_pushes_round_each_workers_sum_once", half_compressed_pushes_round_each_workers_sum_once),
    ("half_compressed_sums_beyond_the_range_become_inf", half_compressed_sums_beyond_the_range_become_inf),
    (
        "an_updater_failing_on_one_worker_fails_the_push_everywhere",
        an_updater_failing_on_one_worker_fails_the_push_everywhere,
    ),
    ("a_call_refused_before_its_step_fails_on_every_worker", a_call_refused_before_its_step_fails_on_every_worker),
    ("a_pull_refuses_bad_outs_before_writing_any", a_pull_refuses_bad_outs_before_writing_any),
    ("workers_with_other_optimizers_fail_their_pushes", workers_with_other_optimizers_fail_their_pushes),
    ("case_23_init_push_and_test_optimizer", case_23_init_push_and_test_optimizer),
    ("workers_whose_calls_differ_all_fail", workers_whose_calls_differ_all_fail),
    ("a_call_a_binding_refuses_fails_on_every_worker", a_call_a_binding_refuses_fails_on_every_worker),
    ("each_round_every_worker_pushes_rank_plus_one", each_round_every_worker_pushes_rank_plus_one),
    ("every_dtype_sums_local_then_across_workers", every_dtype_sums_local_then_across_workers),
    ("bf16_sums_across_workers_round_once", bf16_sums_across_workers_round_once),
    ("replicas_are_bit_identical_after_optimizer_steps", replicas_are_bit_identical_after_optimizer_steps),
    ("nonblocking_training_matches_blocking", nonblocking_training_matches_blocking),
    ("owners_train_as_the_replicated_layout", owners_train_as_the_replicated_layout),
    ("owners_sums_and_gathers_move_each_range_to_its_rank", owners_sums_and_gathers_move_each_range_to_its_rank),
    ("tables_on_owners_train_as_the_replicated_layout", tables_on_owners_train_as_the_replicated_layout),
    ("all_to_all_moves_each_ranks_bytes_to_its_rank", all_to_all_moves_each_ranks_bytes_to_its_rank),
    ("a_table_no_rank_can_hold_trains_on_its_owners", a_table_no_rank_can_hold_trains_on_its_owners),
    (
        "owners_gathers_keep_every_range_of_an_array_given_twice",
        owners_gathers_keep_every_range_of_an_array_given_twice,
    ),
    ("owners_sums_of_many_big_arrays_need_no_more_stack", owners_sums_of_many_big_arrays_need_no_more_stack),
    ("small_buckets_split_keys_and_give_the_same_sums", small_buckets_split_keys_and_give_the_same_sums),
    ("shared_memory_and_mpi_messages_give_the_same_bits", shared_memory_and_mpi_messages_give_the_same_bits),
    ("shared_memory_comes_from_the_environment", shared_memory_comes_from_the_environment),
    ("host_ranks_come_from_the_environment", host_ranks_come_from_the_environment),
    ("host_chunk_bytes_come_from_the_environment", host_chunk_bytes_come_from_the_environment),
    ("bucket_bytes_come_from_the_environment", bucket_bytes_come_from_the_environment),
    ("settings_that_differ_between_ranks_are_refused", settings_that_differ_between_ranks_are_refused),
    ("timeout_comes_from_the_environment", timeout_comes_from_the_environment),
    ("the_builder_sets_the_timeout", the_builder_sets_the_timeout),
    (
        "a_call_made_blocking_on_one_rank_and_not_on_another_fails_on_every_rank",
        a_call_made_blocking_on_one_rank_and_not_on_another_fails_on_every_rank,
    ),
    ("finalize_runs_the_calls_still_queued", finalize_runs_the_calls_still_queued),
];
