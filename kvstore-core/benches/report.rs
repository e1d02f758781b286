//! `make bench`'s report: times the machine's limits (plain loops over the same bytes)
//! and the store in one run, prints a table of medians and ratios, and writes
//! `target/bench/results.json` (DESIGN §9). Ratios are limit time / store time, so 1.0
//! means the store runs at the speed of the plain loop.

use std::hint::black_box;

use kvstore_core::{Context, DType, KVStore, NDArray};
use rayon::prelude::*;

// The bench helpers shared with the MPI and GPU benches; this report only times.
#[allow(dead_code)]
mod common;

const BIG: usize = 4 << 20; // 4 Mi f32 = 16 MiB per array
const D: usize = 4; // devices
const SMALL_KEYS: usize = 1000;
/// Times as many runs for rows whose calls take a fraction of a millisecond: on a
/// shared 2-core machine, one in a few such runs is doubled by a scheduling hiccup,
/// and 21 runs left their medians 30 % apart from one bench run to the next.
const CHEAP_RUNS: usize = 10;
const SMALL: usize = 1 << 10; // 1 Ki f32

/// Median of `runs` timings of `f` in seconds, after `warm` untimed calls.
fn median(warm: usize, runs: usize, f: impl FnMut()) -> f64 {
    common::median(warm, runs, || {}, f)
}

struct Row {
    name: String,
    median_s: f64,
    limit_s: Option<f64>,
    target: String,
    per: f64,
}

impl Row {
    fn new(name: &str, median_s: f64, limit_s: Option<f64>, target: &str) -> Self {
        Row { name: name.to_string(), median_s, limit_s, target: target.to_string(), per: 1.0 }
    }
}

/// The rows written by `make bench` before this report (the Java and Clojure benches,
/// the MPI benches on shared memory and over TCP, the GPU benches when a GPU is
/// there, the Python bench: kvstore from numpy and MXNet 1.9.1's store, the PyTorch
/// benches: DDP, ZeRO and gloo's reduce-scatter against kvstore.torch, and the cluster
/// bench across network namespaces, where they can be made), as
/// (name, median seconds, the limit the row was measured against in the same run, if
/// its bench wrote one, and the target text, if its bench wrote one: the PyTorch
/// training bench's rows carry their accuracy and exposed communication there); empty
/// when they were not run.
fn outside_rows(dir: &std::path::Path) -> Vec<(String, f64, Option<f64>, Option<String>)> {
    [
        "jvm-java.json",
        "jvm-clojure.json",
        "mpi.json",
        "mpi-tcp.json",
        "mpi-owners-2.json",
        "mpi-owners-4.json",
        "restart.json",
        "gpu.json",
        "torch.json",
        "python.json",
        "torch-dp.json",
        "torch-owners.json",
        "torch-embedding.json",
        "torch-scatter.json",
        "cluster.json",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
    .filter_map(|text| serde_json::from_str::<Vec<serde_json::Value>>(&text).ok())
    .flatten()
    .filter_map(|r| {
        let target = r["target"].as_str().map(str::to_string);
        Some((r["name"].as_str()?.to_string(), r["median_s"].as_f64()?, r["limit_s"].as_f64(), target))
    })
    .collect()
}

fn filled(n: usize, v: f32) -> Vec<f32> {
    (0..n).map(|i| v + (i % 7) as f32).collect()
}

fn limit_reduce(ins: &[Vec<f32>], out: &mut [f32]) {
    let [a, b, c, d] = ins else { return };
    reduce4(a, b, c, d, out);
}

fn reduce4(a: &[f32], b: &[f32], c: &[f32], d: &[f32], out: &mut [f32]) {
    for ((((o, a), b), c), d) in out.iter_mut().zip(a).zip(b).zip(c).zip(d) {
        *o = a + b + c + d;
    }
}

/// The limits use every core, as the store does: the same loops over chunks of this
/// many elements, on rayon's pool (one thread per core).
const LIMIT_CHUNK: usize = 64 << 10;

fn limit_reduce_all_cores(ins: &[Vec<f32>], out: &mut [f32]) {
    let [a, b, c, d] = ins else { return };
    out.par_chunks_mut(LIMIT_CHUNK).enumerate().for_each(|(j, o)| {
        let r = j * LIMIT_CHUNK..j * LIMIT_CHUNK + o.len();
        reduce4(&a[r.clone()], &b[r.clone()], &c[r.clone()], &d[r], o);
    });
}

fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("unknown");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    serde_json::json!({
        "cpu": model.trim(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "mem_gib": mem_kb / (1 << 20),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// An embedding of 1,000,000 x 64 f32 (256 MB): `row_sparse_pull` of 1 % of its rows
/// against a dense pull of the key, and a row-sparse push of 1 % of the rows with lazy
/// SGD against the dense push and update, each pair timed in turn.
fn row_sparse_rows(rows: &mut Vec<Row>, runs: usize) -> kvstore_core::Result<()> {
    use kvstore_core::RowSparse;
    const EMB_ROWS: usize = 1_000_000;
    const DIM: usize = 64;
    const PICK: usize = EMB_ROWS / 100;
    // 1 % of the rows, spread over the table, in a shuffled order (a batch's ids).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut ids: Vec<i64> = (0..PICK).map(|i| (i * 100) as i64 + (next() % 100) as i64).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    let runs = runs.min(11);
    let shape = [EMB_ROWS, DIM];
    let table = NDArray::from_vec(&shape, (0..EMB_ROWS * DIM).map(|i| (i % 7) as f32).collect())?;
    let kv = KVStore::create("local")?;
    kv.init_row_sparse("emb", &RowSparse::from_dense(&table)?)?;
    let out = NDArray::zeros(&shape)?;
    let (dense_pull_s, rsp_pull_s) = common::medians_in_turn(
        1,
        runs,
        || kv.pull("emb", &out, 0).expect("pull"),
        || {
            black_box(kv.row_sparse_pull("emb", black_box(&ids), 0).expect("row_sparse_pull"));
        },
    );
    // The limit: the same rows, in the same order, copied by a plain loop on every core
    // into a buffer made once, from the dense pull's copy of the table, each run right
    // after a dense pull as the store's call is (the rows are then as cold).
    let mut gathered = vec![0f32; PICK * DIM];
    let (_, limit_gather_s) = common::medians_in_turn(
        1,
        runs,
        || kv.pull("emb", &out, 0).expect("pull"),
        || {
            out.with_data(|t: &[f32]| {
                gathered.par_chunks_mut(DIM * 1024).zip(sorted.par_chunks(1024)).for_each(|(g, ids)| {
                    for (o, &r) in g.chunks_exact_mut(DIM).zip(ids) {
                        o.copy_from_slice(&t[r as usize * DIM..(r as usize + 1) * DIM]);
                    }
                })
            })
            .expect("read");
            black_box(&gathered);
        },
    );
    rows.push(Row::new("store: dense pull of a 1 M x 64 f32 embedding", dense_pull_s, None, ""));
    rows.push(Row::new(
        "limit: all cores, plain-loop gather of the same 1 % of the rows (after a dense pull)",
        limit_gather_s,
        Some(dense_pull_s),
        "reported: the most any row_sparse_pull gains here",
    ));
    rows.push(Row::new(
        "store: row_sparse_pull of 1 % of its rows (vs the dense pull)",
        rsp_pull_s,
        Some(dense_pull_s),
        ">= 50",
    ));
    rows.push(Row::new(
        "store: row_sparse_pull of 1 % of its rows (vs the plain-loop gather)",
        rsp_pull_s,
        Some(limit_gather_s),
        ">= 0.7 (the call also sorts its ids)",
    ));
    let sgd = || kvstore_core::Optimizer::builder("sgd").param("learning_rate", 0.01).build();
    kv.set_optimizer(sgd()?)?;
    let dense_grad = NDArray::full(&shape, 0.001)?;
    let rows_grad = RowSparse::new(NDArray::full(&[PICK, DIM], 0.001)?, sorted, &shape)?;
    let (dense_push_s, rsp_push_s) = common::medians_in_turn(
        1,
        runs,
        || kv.push("emb", &dense_grad, 0).expect("push"),
        || kv.push_row_sparse("emb", std::slice::from_ref(&rows_grad), 0).expect("push_row_sparse"),
    );
    rows.push(Row::new("store: dense push + SGD update of the embedding", dense_push_s, None, ""));
    rows.push(Row::new(
        "store: row-sparse push of 1 % of the rows, lazy SGD (vs dense)",
        rsp_push_s,
        Some(dense_push_s),
        ">= 20",
    ));
    Ok(())
}

fn main() -> kvstore_core::Result<()> {
    // `cargo bench` passes `--bench`; a filter argument that is not ours means another
    // bench target was selected, so do nothing.
    if std::env::args().skip(1).any(|a| !a.starts_with("--") && a != "report") {
        return Ok(());
    }
    let runs = std::env::var("KVSTORE_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(21);
    let mut rows = Vec::new();

    // ---- one big key: the store against plain loops over the same bytes on every core,
    // timed in turn ----
    let ins: Vec<Vec<f32>> = (0..D).map(|k| filled(BIG, k as f32)).collect();
    let mut out = vec![0f32; BIG];
    let kv = KVStore::create("local")?;
    let vals: Vec<NDArray> =
        (0..D).map(|k| NDArray::from_slice_in(&[BIG], &ins[k], Context::cpu(k as u32))).collect::<Result<_, _>>()?;
    kv.init("big", &vals[0])?;
    let (limit_reduce_s, push_s) = common::medians_in_turn(
        3,
        runs,
        || limit_reduce_all_cores(black_box(&ins), black_box(&mut out)),
        || kv.push("big", &vals, 0).expect("push"),
    );
    rows.push(Row::new("limit: all cores, plain-loop reduce 4 x 4 Mi f32", limit_reduce_s, None, ""));
    let src = filled(BIG, 1.0);
    let mut outs: Vec<Vec<f32>> = (0..D).map(|_| vec![0f32; BIG]).collect();
    let pulls: Vec<NDArray> =
        (0..D).map(|k| NDArray::zeros_with(&[BIG], DType::F32, Context::cpu(k as u32))).collect::<Result<_, _>>()?;
    let (limit_copy_s, pull_s) = common::medians_in_turn(
        3,
        runs,
        || {
            for o in outs.iter_mut() {
                o.par_chunks_mut(LIMIT_CHUNK)
                    .zip(black_box(&src).par_chunks(LIMIT_CHUNK))
                    .for_each(|(o, s)| o.copy_from_slice(s));
            }
        },
        || kv.pull("big", &pulls, 0).expect("pull"),
    );
    rows.push(Row::new("limit: all cores, copy 4 Mi f32 into 4 arrays", limit_copy_s, None, ""));
    rows.push(Row::new("store: push 4 x 4 Mi f32", push_s, Some(limit_reduce_s), ">= 0.9"));
    rows.push(Row::new("store: pull 4 Mi f32 into 4 outs", pull_s, Some(limit_copy_s), ">= 0.9"));

    // ---- many small keys ----
    let keys: Vec<String> = (0..SMALL_KEYS).map(|i| format!("k{i}")).collect();
    let small_vals: Vec<Vec<NDArray>> = (0..SMALL_KEYS)
        .map(|_| (0..D).map(|k| NDArray::full_with(&[SMALL], k as f64, DType::F32, Context::cpu(k as u32))).collect())
        .collect::<Result<_, _>>()?;
    let small_outs: Vec<NDArray> = (0..SMALL_KEYS).map(|_| NDArray::zeros(&[SMALL])).collect::<Result<_, _>>()?;
    kv.init(&keys, &small_outs)?;
    // The limit for the same bytes: plain loops, the keys spread over every core; timed
    // in turn with the store's calls, as the big rows are.
    let plain_in: Vec<Vec<Vec<f32>>> =
        (0..SMALL_KEYS).map(|_| (0..D).map(|k| filled(SMALL, k as f32)).collect()).collect();
    let mut plain_store: Vec<Vec<f32>> = (0..SMALL_KEYS).map(|_| vec![0f32; SMALL]).collect();
    let mut plain_out: Vec<Vec<f32>> = (0..SMALL_KEYS).map(|_| vec![0f32; SMALL]).collect();
    let (small_limit_s, small_s) = common::medians_in_turn(
        3,
        runs,
        || {
            plain_in.par_iter().zip(plain_store.par_iter_mut()).zip(plain_out.par_iter_mut()).for_each(
                |((i, s), o)| {
                    limit_reduce(black_box(i), s);
                    o.copy_from_slice(black_box(s));
                },
            );
        },
        || {
            kv.push(&keys, &small_vals, 0).expect("list push");
            kv.pull(&keys, &small_outs, 0).expect("list pull");
        },
    );
    let per_key = SMALL_KEYS as f64;
    rows.push(Row {
        per: per_key,
        ..Row::new(
            "limit: all cores, plain loops, 1000 keys x 1 Ki f32 x 4 (per key)",
            small_limit_s / per_key,
            None,
            "",
        )
    });
    rows.push(Row {
        per: per_key,
        ..Row::new(
            "store: 1000 keys x 1 Ki f32 x 4, list push + list pull (per key)",
            small_s / per_key,
            Some(small_limit_s / per_key),
            ">= 0.5 (at most 2 x the limit)",
        )
    });

    // The same calls on arrays of 16 f32, whose sums and copies cost next to nothing: what
    // the row above costs per key apart from moving its data (lookups, locks, checks).
    let fixed_s = {
        const TINY: usize = 16;
        let kv = KVStore::create("local")?;
        let vals: Vec<Vec<NDArray>> = (0..SMALL_KEYS)
            .map(|_| {
                (0..D).map(|k| NDArray::full_with(&[TINY], k as f64, DType::F32, Context::cpu(k as u32))).collect()
            })
            .collect::<Result<_, _>>()?;
        let outs: Vec<NDArray> = (0..SMALL_KEYS).map(|_| NDArray::zeros(&[TINY])).collect::<Result<_, _>>()?;
        kv.init(&keys, &outs)?;
        let step = || {
            kv.push(&keys, &vals, 0).expect("list push");
            kv.pull(&keys, &outs, 0).expect("list pull");
        };
        // A run takes about 0.3 ms, a scheduling hiccup as long: ten times the runs.
        let fixed_s = median(3, CHEAP_RUNS * runs, step);
        // The same steps with the timeline written (to a file of its own), and without,
        // in turn: ten steps a run.
        let path = std::env::temp_dir().join(format!("kvstore-bench-timeline-{}.json", std::process::id()));
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            for (timeline, times) in [(true, &mut on), (false, &mut off)] {
                if timeline {
                    kv.start_timeline(&path)?;
                }
                let t = std::time::Instant::now();
                (0..10).for_each(|_| step());
                times.push(t.elapsed().as_secs_f64() / 10.0);
                if timeline {
                    kv.stop_timeline()?;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
        let mid = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        (fixed_s, mid(on), mid(off))
    };
    let (fixed_s, timeline_on_s, timeline_off_s) = fixed_s;
    rows.push(Row {
        per: per_key,
        ..Row::new(
            "store: 1000 keys x 16 f32 x 4, list push + list pull (per key: the cost apart from the data)",
            fixed_s / per_key,
            None,
            "",
        )
    });

    rows.push(Row {
        per: per_key,
        ..Row::new(
            "store: the same with the timeline written (vs off, in turn)",
            timeline_on_s / per_key,
            Some(timeline_off_s / per_key),
            ">= 0.91 (within 10 % of off)",
        )
    });

    // ---- many distinct keys in one call: the cost per key does not grow with their number ----
    let list_push_per_key = |n: usize, runs: usize| -> kvstore_core::Result<f64> {
        let kv = KVStore::create("local")?;
        let keys: Vec<String> = (0..n).map(|i| format!("key-{i}")).collect();
        let vals: Vec<NDArray> = (0..n).map(|i| NDArray::full(&[16], i as f64)).collect::<Result<_, _>>()?;
        kv.init(&keys, &vals)?;
        Ok(median(1, runs, || kv.push(&keys, &vals, 0).expect("list push")) / n as f64)
    };
    let few_s = list_push_per_key(1000, CHEAP_RUNS * runs)?;
    let many_s = list_push_per_key(100_000, runs.min(7))?;
    rows.push(Row {
        per: 1000.0,
        ..Row::new("store: list push of 1000 distinct keys x 16 f32 (per key)", few_s, None, "")
    });
    rows.push(Row {
        per: 100_000.0,
        ..Row::new(
            "store: list push of 100000 distinct keys x 16 f32 (per key)",
            many_s,
            Some(few_s),
            ">= 0.5 (linear)",
        )
    });

    // ---- optimizers through push: the update against a plain loop moving the same bytes ----
    let g = NDArray::from_slice_in(&[BIG], &ins[1], Context::cpu(0))?;
    let (mut w_plain, mut m_plain, mut v_plain) = (ins[0].clone(), vec![0f32; BIG], vec![0f32; BIG]);
    // SGD with momentum reads w, g, m and writes w, m.
    let limit_sgd_s = median(3, runs, || {
        for ((w, &g), m) in w_plain.iter_mut().zip(black_box(&ins[1])).zip(m_plain.iter_mut()) {
            *m = 0.9 * *m - 0.01 * g;
            *w += *m;
        }
    });
    rows.push(Row::new("limit: plain loop over w, g, m (SGD-momentum bytes)", limit_sgd_s, None, ""));
    // Adam reads w, g, m, v and writes w, m, v.
    let limit_adam_s = median(3, runs, || {
        for (((w, &g), m), v) in
            w_plain.iter_mut().zip(black_box(&ins[1])).zip(m_plain.iter_mut()).zip(v_plain.iter_mut())
        {
            *m = 0.9 * *m + 0.1 * g;
            *v = 0.999 * *v + 0.001 * g * g;
            *w -= 0.001 * *m / (*v + 1e-8);
        }
    });
    rows.push(Row::new("limit: plain loop over w, g, m, v (Adam bytes)", limit_adam_s, None, ""));
    for (name, opt, limit) in [
        ("store: SGD-momentum update of 4 Mi f32 through push", "sgd", limit_sgd_s),
        ("store: Adam update of 4 Mi f32 through push", "adam", limit_adam_s),
    ] {
        let builder = kvstore_core::Optimizer::builder(opt).param("learning_rate", 0.001);
        let builder = if opt == "sgd" { builder.param("momentum", 0.9) } else { builder };
        match builder.build() {
            Ok(optimizer) => {
                let okv = KVStore::create("local")?;
                okv.init("w", &vals[0])?;
                okv.set_optimizer(optimizer)?;
                let s = median(3, runs, || okv.push("w", &g, 0).expect("push"));
                rows.push(Row::new(name, s, Some(limit), ">= 0.7"));
            }
            Err(e) => println!("skipped {name}: {e}"),
        }
    }

    row_sparse_rows(&mut rows, runs)?;

    // ---- the Rust side of the JVM rows: the same calls the Java and Clojure benches make ----
    let one = NDArray::ones(&[SMALL])?;
    let one_out = NDArray::zeros(&[SMALL])?;
    kv.init("s", &one)?;
    let reps = 20_000;
    let rust_small_s = median(1, runs, || {
        for _ in 0..reps {
            kv.push("s", &one, 0).expect("push");
            kv.pull("s", &one_out, 0).expect("pull");
        }
    }) / reps as f64;
    rows.push(Row::new("rust: push+pull 1 Ki f32", rust_small_s, None, ""));

    // ---- the engine's cost: a non-blocking push's submit against a blocking push ----
    // Per call, over batches of 1000 calls on 1000 keys (then a wait_all, not timed for
    // the submits): what the caller's thread pays to hand a gradient over.
    let engine_keys: Vec<String> = (0..1000).map(|i| format!("e{i}")).collect();
    let engine_vals: Vec<NDArray> = engine_keys.iter().map(|_| NDArray::zeros(&[SMALL])).collect::<Result<_, _>>()?;
    kv.init(engine_keys.as_slice(), engine_vals.as_slice())?;
    let blocking_push_s = median(1, runs, || {
        for k in &engine_keys {
            kv.push(k.as_str(), &one, 0).expect("push");
        }
    }) / engine_keys.len() as f64;
    rows.push(Row::new("store: blocking push of 1 Ki f32 (per call)", blocking_push_s, None, ""));
    let mut submits = Vec::new();
    for _ in 0..runs {
        let t0 = std::time::Instant::now();
        let pending: Vec<kvstore_core::Pending> =
            engine_keys.iter().map(|k| kv.push_async(k.as_str(), &one, 0)).collect();
        submits.push(t0.elapsed().as_secs_f64() / engine_keys.len() as f64);
        pending.into_iter().for_each(|p| p.wait().expect("push_async"));
    }
    submits.sort_by(f64::total_cmp);
    let submit_s = submits[submits.len() / 2];
    let more_us = (submit_s - blocking_push_s) * 1e6;
    rows.push(Row::new(
        "store: push_async submit of 1 Ki f32 (per call)",
        submit_s,
        Some(blocking_push_s),
        &format!("<= blocking + 1 us (here {more_us:+.2} us)"),
    ));
    // What a hand-over between two threads costs on this machine now: a submit shares
    // cache lines with the engine thread that runs the calls, and on some placements
    // of this machine's cores each transfer costs several times more (a slow mode of
    // the submit row that the blocking row does not have).
    // Two threads that spin on one core would pass the line once per time slice.
    if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
        let round_trip_s = common::median_of((0..runs).map(|_| core_round_trip()).collect());
        rows.push(Row::new("machine: core-to-core round trip (two threads, one atomic)", round_trip_s, None, ""));
    } else {
        println!("skipped machine: core-to-core round trip (one core)");
    }
    let rust_in_s = median(3, runs, || {
        black_box(NDArray::from_slice_in(&[BIG], &ins[1], Context::cpu(0)).expect("array"));
    });
    rows.push(Row::new("rust: &[f32; 4 Mi] into a new NDArray", rust_in_s, None, ""));
    let rust_out_s = median(3, runs, || {
        black_box(vals[1].to_vec::<f32>().expect("to_vec"));
    });
    rows.push(Row::new("rust: NDArray of 4 Mi f32 to Vec<f32>", rust_out_s, None, ""));
    let mut existing = vec![0f32; BIG];
    let rust_into_s = median(3, runs, || {
        pulls[2].with_data_mut(|d: &mut [f32]| d.copy_from_slice(black_box(&ins[1]))).expect("copy in");
    });
    rows.push(Row::new("rust: &[f32; 4 Mi] into an existing NDArray", rust_into_s, None, ""));
    let rust_outof_s = median(3, runs, || {
        vals[1].with_data(|s: &[f32]| existing.copy_from_slice(s)).expect("copy out");
        black_box(&existing);
    });
    rows.push(Row::new("rust: NDArray of 4 Mi f32 into an existing Vec<f32>", rust_outof_s, None, ""));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(std::path::Path::new("."));
    let dir = root.join("target/bench");
    // A JVM bench's blocking push, for its non-blocking submit row after it.
    let mut jvm_blocking_push_s = None;
    for (name, median_s, limit_s, target) in outside_rows(&dir) {
        let row = match name.as_str() {
            n if target.is_some() => Row::new(n, median_s, limit_s, target.as_deref().unwrap_or_default()),
            n if n.ends_with("blocking push of 1 Ki f32 (per call)") => {
                jvm_blocking_push_s = Some(median_s);
                Row::new(n, median_s, None, "")
            }
            n if n.contains("submit of 1 Ki f32") => {
                let more =
                    jvm_blocking_push_s.map_or(String::new(), |b| format!(" (here {:+.2} us)", (median_s - b) * 1e6));
                Row::new(n, median_s, jvm_blocking_push_s, &format!("<= blocking + 1 us{more}"))
            }
            // Python (bench/python.py): kvstore against MXNet 1.9.1's store in one
            // process (limit: MXNet's time), then against the Rust rows. The 1000-key row's
            // target is on each store in its own loop; call by call in turn, each runs
            // right after the other evicted its memory from the caches: reported.
            n if n.contains(" vs MXNet ") => {
                let target = match n {
                    n if n.contains("1000 keys") && n.contains("in turn") => "reported (caches shared in turn)",
                    n if n.contains("1000 keys") => ">= 20",
                    n if n.contains(" push 4 x ") => ">= 3",
                    n if n.contains("gluon Trainer step") => ">= 1 (at most MXNet's time)",
                    _ => "> 1: faster than MXNet",
                };
                Row::new(n, median_s, limit_s, target)
            }
            n if n.starts_with("python:") && n.ends_with("push+pull 1 Ki f32") => {
                let more_us = (median_s - rust_small_s) * 1e6;
                Row::new(n, median_s, Some(rust_small_s), &format!("<= +1 us (here {more_us:+.2} us)"))
            }
            // Against the same call made from Rust in the same process, in turn: the
            // target. Against the report's Rust rows (another process, another moment,
            // timed in turn with plain loops that evict the caches): reported.
            n if n.starts_with("python:") && n.contains("against the same call from Rust") => {
                Row::new(n, median_s, limit_s, ">= 0.9")
            }
            n if n.starts_with("python:") && n.ends_with("push 4 x 4 Mi f32") => {
                Row::new(n, median_s, Some(push_s), "vs the Rust row, reported")
            }
            n if n.starts_with("python:") && n.ends_with("pull 4 Mi f32 into 4 outs") => {
                Row::new(n, median_s, Some(pull_s), "vs the Rust row, reported")
            }
            n if n.starts_with("python:") && n.contains("1000 keys x 1 Ki f32 x 4") => {
                Row::new(n, median_s, Some(small_s / per_key), "vs the Rust row, reported")
            }
            n if n.ends_with("push+pull 1 Ki f32") => {
                let more_us = (median_s - rust_small_s) * 1e6;
                Row::new(n, median_s, Some(rust_small_s), &format!("<= +2 us (here {more_us:+.2} us)"))
            }
            n if n.ends_with("push 4 x 4 Mi f32") => Row::new(n, median_s, Some(push_s), "~1 (no copy)"),
            n if n.ends_with("pull 4 Mi f32 into 4 outs") => Row::new(n, median_s, Some(pull_s), "~1 (no copy)"),
            n if n.ends_with("into an existing NDArray") => Row::new(n, median_s, Some(rust_into_s), "~1 (one copy)"),
            n if n.ends_with("into an existing float[]") => Row::new(n, median_s, Some(rust_outof_s), "~1 (one copy)"),
            n if n.ends_with("into a new NDArray") => {
                Row::new(n, median_s, Some(rust_in_s), "one copy + a fresh native allocation")
            }
            n if n.ends_with("to float[]") => Row::new(n, median_s, Some(rust_out_s), "one copy + JVM zeroing"),
            n if n.contains("calls not compared") => Row::new(n, median_s, None, ""),
            n if n.contains("push 4 MB f32, calls compared") => {
                Row::new(n, median_s, limit_s, ">= 0.97 (desync detection costs at most 3 %)")
            }
            n if n.contains("calls compared") => Row::new(n, median_s, limit_s, "desync detection's cost, reported"),
            n if n.starts_with("restart ") && n.contains("to the first step after the restart") => {
                Row::new(n, median_s, limit_s, "<= 5 s")
            }
            n if n.starts_with("mpi ") && n.contains("the same step and a commit") => {
                Row::new(n, median_s, limit_s, ">= 0.95 (a commit costs at most 5 % of the step)")
            }
            n if n.starts_with("mpi ") && n.contains("CRC-32 pass over a rank's share") => Row::new(
                n,
                median_s,
                limit_s,
                "reported: the floor of a checksummed commit, against the 5 % target (>= 0.95)",
            ),
            n if n.starts_with("mpi ") && n.contains("of its update written to a second copy") => Row::new(
                n,
                median_s,
                limit_s,
                "reported: the floor of a commit that copied nothing, against the 5 % target (>= 0.95)",
            ),
            n if n.starts_with("mpi ") && n.contains("written to a second copy with its CRC-32, vs in place") => {
                Row::new(n, median_s, limit_s, "reported: what writing an update to other memory costs")
            }
            n if n.starts_with("mpi ") && n.contains("a commit (the step and a commit") => {
                Row::new(n, median_s, limit_s, "~1 (one memory copy of its bytes)")
            }
            n if n.starts_with("mpi ") && n.contains("dist_async: a step and a commit") => {
                Row::new(n, median_s, limit_s, "reported: a dist_async commit's cost (its gather and write)")
            }
            n if n.starts_with("mpi ") && n.contains("dist_async push then pull") => {
                Row::new(n, median_s, limit_s, ">= 0.67 (at most 1.5 x dist_sync's pushpull)")
            }
            n if n.starts_with("mpi ") && n.contains("rank 0's step with dist_async") => {
                Row::new(n, median_s, limit_s, ">= 1.8 (rank 0's steps per second vs dist_sync)")
            }
            n if n.starts_with("mpi ") && n.contains("state on owners, vs replicated") => {
                Row::new(n, median_s, limit_s, ">= 1.0 (each rank updates its 1/n)")
            }
            n if n.starts_with("mpi 4 ") && n.contains("table with Adam, 1 % of its rows") => {
                Row::new(n, median_s, limit_s, ">= 2 (each row updated on its owner only)")
            }
            n if n.starts_with("mpi ") && n.contains("table with Adam, 1 % of its rows") => {
                Row::new(n, median_s, limit_s, "reported (the target is 4 ranks')")
            }
            n if n.starts_with("mpi ") && n.contains("reduce-scatter of 64 MB") => Row::new(
                n,
                median_s,
                limit_s,
                "reported: a reduce-scatter moves half an allreduce's bytes (> 1: faster)",
            ),
            n if n.contains("vs MPI moving its bytes") => Row::new(
                n,
                median_s,
                limit_s,
                "reported: how near the push is to its bytes' time on the transport (the most any allreduce gains)",
            ),
            n if n.starts_with("mpi ") && n.contains("vs one memcpy of it") && n.contains("over tcp") => {
                Row::new(n, median_s, limit_s, "reported: over TCP the bytes cross the loopback")
            }
            n if n.starts_with("mpi ") && n.contains("vs one memcpy of it") => {
                Row::new(n, median_s, limit_s, "<= 2.5 x one memcpy (ratio >= 0.4)")
            }
            n if n.starts_with("mpi ") && n.contains("the memory a 2-bit push") => {
                Row::new(n, median_s, limit_s, "reported: the most 2-bit compression gains here")
            }
            n if n.starts_with("mpi ") && n.contains("2-bit compressed, vs that limit") => {
                Row::new(n, median_s, limit_s, "reported: how near the push is to its memory's limit")
            }
            n if n.starts_with("mpi ") && n.contains("2-bit compressed") => {
                Row::new(n, median_s, limit_s, "vs the uncompressed push: >= 4 over tcp")
            }
            n if n.starts_with("mpi ") && n.contains("dist_sync push") => {
                Row::new(n, median_s, limit_s, "<= 1.25x the bare allreduce (ratio >= 0.8)")
            }
            // (The bare allreduce the fused push is timed in turn with: a limit.)
            n if n.starts_with("mpi ") && n.contains("timed in turn with the list push") => {
                Row::new(n, median_s, None, "")
            }
            n if n.starts_with("mpi ") && n.contains("list push") => {
                Row::new(n, median_s, limit_s, "vs 1000 separate allreduces (> 1: cheaper)")
            }
            n if n.starts_with("mpi ") && n.contains("push fused (") => {
                Row::new(n, median_s, limit_s, "fusion: > 1 is faster than unfused")
            }
            n if n.starts_with("mpi ") && n.contains("against MPI's messages") => {
                Row::new(n, median_s, limit_s, "shared memory: > 1 is faster (1 where it is off: tcp)")
            }
            // Over shared memory the fused push is to be as fast as the allreduce of its
            // bytes; over TCP, at most 1.5 times as slow.
            n if n.starts_with("mpi 2 ranks: ") && n.contains("against one bare allreduce") => {
                Row::new(n, median_s, limit_s, ">= 1 (fused: as fast as one allreduce of its bytes)")
            }
            n if n.starts_with("mpi ") && n.contains("against one bare allreduce") => {
                Row::new(n, median_s, limit_s, ">= 0.67 (fused: <= 1.5x one allreduce of its bytes)")
            }
            n if n.contains("4-input reduce of 64 Mi") => {
                Row::new(n, median_s, limit_s, ">= 0.85 of the copy bandwidth")
            }
            n if n.contains("device store push 4 x") => Row::new(n, median_s, limit_s, "~1 (the bare reduction)"),
            n if n.contains("fused adam step") => Row::new(n, median_s, limit_s, "vs the copy bandwidth (7 arrays)"),
            n if n.contains("push+pull of 1000 keys") => Row::new(n, median_s, limit_s, "vs host arrays, local store"),
            n if n.contains("vs torch") => Row::new(n, median_s, limit_s, "> 1: faster than PyTorch"),
            n => Row::new(n, median_s, None, ""),
        };
        rows.push(row);
    }

    // ---- print and save ----
    println!("\n{:<66} {:>12} {:>12} {:>7}  target", "row", "median", "limit", "ratio");
    let fmt = |s: f64| if s < 1e-3 { format!("{:.2} us", s * 1e6) } else { format!("{:.3} ms", s * 1e3) };
    let mut json_rows = Vec::new();
    for r in &rows {
        let ratio = r.limit_s.map(|l| l / r.median_s);
        println!(
            "{:<66} {:>12} {:>12} {:>7}  {}",
            r.name,
            fmt(r.median_s),
            r.limit_s.map(fmt).unwrap_or_default(),
            ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
            r.target
        );
        json_rows.push(serde_json::json!({
            "name": r.name,
            "median_s": r.median_s,
            "limit_s": r.limit_s,
            "ratio": ratio,
            "target": r.target,
            "per": r.per,
        }));
    }
    let gbs = |bytes: f64, s: f64| bytes / s / 1e9;
    println!(
        "\npush moves {:.1} GB/s, pull {:.1} GB/s; threads: {}; runs per row: {runs} (median)",
        gbs((BIG * 4 * (D + 1)) as f64, push_s),
        gbs((BIG * 4 * (D + 1)) as f64, pull_s),
        rayon::current_num_threads()
    );
    let doc = serde_json::json!({ "machine": machine(), "runs": runs, "rows": json_rows });
    std::fs::create_dir_all(&dir)
        .map_err(|e| kvstore_core::Error::Io { context: "create target/bench".into(), source: e })?;
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .map_err(|e| kvstore_core::Error::Io { context: format!("write {}", path.display()), source: e })?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Two threads pass a counter back and forth through one atomic (on a cache line of
/// its own); returns the mean time of one pass there and back, in seconds.
fn core_round_trip() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[repr(align(128))]
    struct Line(AtomicU64);
    const TRIPS: u64 = 200_000;
    let line = Line(AtomicU64::new(0));
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..TRIPS {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        for i in 0..TRIPS {
            line.0.store(2 * i + 1, Ordering::Release);
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
        }
    });
    t0.elapsed().as_secs_f64() / TRIPS as f64
}
