//! The MPI rows of `make bench`, run with `mpirun -np 2`: a `dist_sync` push of 4 MB and
//! 64 MB against a bare MPI allreduce of the same bytes, and 1000 small keys in one list
//! push against 1000 separate bare allreduces, unfused, and through MPI's messages instead
//! of the ranks' shared memory, all timed in the same run, and the cost of
//! desync detection on the 4 MB push and the list push (see [`alternate`]). Rank 0 writes
//! the medians as JSON (the bench binary with `OUT.json`) for the report. `KVSTORE_BENCH_LABEL`
//! names the run in the rows (default "mpi 2 ranks"; `make bench` runs it again over
//! TCP, where one allreduce costs what it costs across machines, not over shared memory).
//!
//! With `KVSTORE_BENCH_OVERLAP=1` (the TCP run) it also times `dist_async` against
//! `dist_sync` ([`async_rows`]: a 4 MB push and pull, and a loop with a straggler), and
//! a simulated training step
//! on ResNet-50's 161 parameter tensors: the rows `overlap: compute alone`,
//! `overlap: communication alone`, `overlap: blocking step`,
//! `overlap: non-blocking step` and `overlap: non-blocking step, pushes then one list
//! pull`, with the accelerator's clock simulated; `overlap: communication alone,
//! non-blocking calls`; and `overlap: compute alone, sleeps one after another` and
//! `overlap: non-blocking step, sleeps one after another`, where every late wake-up of
//! the host adds to the compute. It prints the exposed communication of both (see
//! [`overlap`]). With `KVSTORE_BENCH_OVERLAP=only` it times that step alone (about 15 s
//! over TCP with `KVSTORE_BENCH_RUNS=11`), for comparing builds run after run.
//!
//! With `KVSTORE_JOB` set it also times a commit after a step ([`commit_rows`]), and a
//! `dist_async` store's ([`async_commit_rows`]); with
//! `KVSTORE_BENCH_COMMIT=only` as well, those rows alone.
//!
//! With `KVSTORE_BENCH_CLUSTER=1` (`bench/cluster.sh`, on 2 hosts of 2 ranks made by
//! `scripts/cluster.sh`) it times only the 64 MB push, host by host, against MPI moving
//! the same bytes with no sums ([`cluster_rows`]).

use std::hint::black_box;

use std::time::{Duration, Instant};

use kvstore_core::{KVStore, NDArray};
use kvstore_tests::bench::{median_of, seconds};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

fn median(world: &SimpleCommunicator, runs: usize, f: impl FnMut()) -> f64 {
    kvstore_tests::bench::median(3, runs, || world.barrier(), f)
}

/// The medians of `a` and `b` timed in turn, each after a barrier of the ranks.
fn in_turn(world: &SimpleCommunicator, runs: usize, a: impl FnMut(), b: impl FnMut()) -> (f64, f64) {
    kvstore_tests::bench::medians_in_turn_after(3, runs, || world.barrier(), a, b)
}

/// `dist_async` against `dist_sync` (2 ranks): a push then a pull of 4 MB f32 against
/// a `dist_sync` pushpull of the same bytes; and a training loop whose rank 1 computes
/// (sleeps) twice as long a step as rank 0: rank 0's time per step with each kind.
/// The last rows of the run: from here on each rank's `dist_async` serving thread makes
/// MPI calls, so the ranks meet at the `dist_async` store's barrier (a bare MPI call of
/// the bench's own would break MPI_THREAD_SERIALIZED), and before each blocking
/// `dist_sync` call every rank's `dist_async` calls are done.
fn async_rows(
    kv: &KVStore,
    runs: usize,
    run: &str,
    rows: &mut Vec<(String, f64, Option<f64>)>,
) -> kvstore_core::Result<()> {
    let akv = kvstore_mpi::create("dist_async")?;
    let median =
        |runs: usize, f: &mut dyn FnMut()| kvstore_tests::bench::median(3, runs, || akv.barrier().expect("barrier"), f);
    let n = 1usize << 20;
    let g = NDArray::ones(&[n])?;
    let out = NDArray::zeros(&[n])?;
    kv.init("sync-4mb", &NDArray::zeros(&[n])?)?;
    akv.init("async-4mb", &NDArray::zeros(&[n])?)?;
    let sync = median(runs, &mut || kv.pushpull("sync-4mb", &g, &out, 0).expect("pushpull"));
    let asynchronous = median(runs, &mut || {
        akv.push("async-4mb", &g, 0).expect("push");
        akv.pull("async-4mb", &out, 0).expect("pull");
    });
    // Every rank's dist_async calls answered before the blocking dist_sync calls below
    // (a rank inside one would keep its serving thread from answering: docs/dist-async.md).
    akv.barrier()?;
    rows.push((format!("{run}: dist_sync pushpull of 4 MB f32"), sync, None));
    rows.push((format!("{run}: dist_async push then pull of 4 MB f32"), asynchronous, Some(sync)));
    // The straggler: 20 steps of compute (rank 0: 20 ms, rank 1: 40 ms), then a push of
    // a 1 MB gradient and a pull of the weights; rank 0's time per step.
    let (steps, m) = (20usize, 1usize << 18);
    let compute = Duration::from_millis(if kv.rank() == 1 { 40 } else { 20 });
    let grad = NDArray::full(&[m], 0.001)?;
    let weights = NDArray::zeros(&[m])?;
    let step_time = |store: &KVStore, key: &str, pushpull: bool| -> f64 {
        let times: Vec<f64> = (0..runs.min(5))
            .map(|_| {
                akv.barrier().expect("barrier");
                let start = Instant::now();
                for _ in 0..steps {
                    std::thread::sleep(compute);
                    if pushpull {
                        store.pushpull(key, &grad, &weights, 0).expect("pushpull");
                    } else {
                        store.push(key, &grad, 0).expect("push");
                        store.pull(key, &weights, 0).expect("pull");
                    }
                }
                let t = start.elapsed().as_secs_f64() / steps as f64;
                // The ranks meet before the next run (not timed).
                store.barrier().expect("barrier");
                t
            })
            .collect();
        median_of(times)
    };
    kv.init("sync-straggler", &NDArray::zeros(&[m])?)?;
    akv.init("async-straggler", &NDArray::zeros(&[m])?)?;
    let sync_step = step_time(kv, "sync-straggler", true);
    let async_step = step_time(&akv, "async-straggler", false);
    rows.push((
        format!("{run}: straggler loop, rank 0's step with dist_sync (rank 1 computes 2 x as long)"),
        sync_step,
        None,
    ));
    rows.push((format!("{run}: straggler loop, rank 0's step with dist_async"), async_step, Some(sync_step)));
    if kv.rank() == 0 {
        println!(
            "dist_async: 4 MB push+pull {:.3} ms vs dist_sync pushpull {:.3} ms ({:.2} x); straggler: rank 0's step \
             {:.2} ms vs {:.2} ms with dist_sync ({:.2} x the steps per second)",
            asynchronous * 1e3,
            sync * 1e3,
            asynchronous / sync,
            async_step * 1e3,
            sync_step * 1e3,
            sync_step / async_step
        );
    }
    Ok(())
}

/// The median seconds of the memory a 2-bit push of `n` f32 must move on each rank, as
/// plain copies (one thread: a rank per core): the gradient and the residual read, the
/// residual and the value written (two copies of `n` f32), with every worker's codes
/// (`n / 16` words each) gathered in between. Any 2-bit push takes at least this long.
fn two_bit_limit(world: &SimpleCommunicator, runs: usize, n: usize) -> f64 {
    let grad = vec![1.0f32; n];
    let mut residual = vec![0.0f32; n];
    let mut value = vec![0.0f32; n];
    let codes = vec![0u32; n / 16];
    let mut all = vec![0u32; n / 16 * world.size() as usize];
    median(world, runs, || {
        residual.copy_from_slice(black_box(&grad));
        world.all_gather_into(&codes[..], &mut all[..]);
        value.copy_from_slice(black_box(&residual));
        black_box((&value, &all));
    })
}

/// The 64 MB push on 2 hosts of 2 ranks, which goes host by host, against its limit on
/// the transport: MPI moving the bytes each rank of it sends, every message posted at
/// once and no sums: 64 MB each way with the other rank of its host (its half of the
/// array for the host's sum, then its segment of the sums) and 32 MB each way with the
/// rank in its place on the other host (its segment's pieces, then the sums of its own
/// piece). A push whose steps overlapped perfectly would still move these bytes over
/// these paths; here they share one machine's cores, as the push's do.
fn cluster_rows(
    kv: &KVStore,
    world: &SimpleCommunicator,
    runs: usize,
    run: &str,
    out: &str,
) -> kvstore_core::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    if size != 4 {
        return Err(kvstore_core::Error::invalid_argument("the cluster rows run on 2 hosts of 2 ranks"));
    }
    let n = 16usize << 20;
    kv.init("cluster", &NDArray::zeros(&[n])?)?;
    let g = NDArray::ones(&[n])?;
    let send = vec![1.0f32; n];
    let (mut within, mut across) = (vec![0.0f32; n], vec![0.0f32; n / 2]);
    let (host_peer, other_host) = (world.process_at_rank(rank ^ 1), world.process_at_rank((rank + 2) % 4));
    let (push, moved) = in_turn(
        world,
        runs,
        || kv.push("cluster", &g, 0).expect("push"),
        || {
            mpi::request::scope(|scope| {
                let requests = [
                    host_peer.immediate_send(scope, &send[..]),
                    other_host.immediate_send(scope, &send[..n / 2]),
                    host_peer.immediate_receive_into(scope, &mut within[..]),
                    other_host.immediate_receive_into(scope, &mut across[..]),
                ];
                for r in requests {
                    r.wait();
                }
            });
            black_box((&within, &across));
        },
    );
    assert!(kvstore_mpi::group()?.used_hosts(), "the push went host by host");
    let rows = [
        (
            format!(
                "{run}: limit: MPI moves the push's bytes at once, no sums (64 MB each way in a host, 32 MB across)"
            ),
            moved,
            None,
        ),
        (format!("{run}: dist_sync push of 64 MB f32, vs MPI moving its bytes"), push, Some(moved)),
    ];
    if rank == 0 {
        kvstore_tests::bench::write_rows(out, &rows)?;
    }
    kvstore_mpi::finalize()
}

fn main() -> kvstore_core::Result<()> {
    let out =
        std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or_else(|| "target/bench/mpi.json".to_string());
    let runs: usize = std::env::var("KVSTORE_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(21);
    let kv: KVStore = kvstore_mpi::create("dist_sync")?;
    let world = SimpleCommunicator::world();
    let run = std::env::var("KVSTORE_BENCH_LABEL").unwrap_or_else(|_| format!("mpi {} ranks", kv.num_workers()));
    if std::env::var_os("KVSTORE_BENCH_CLUSTER").is_some() {
        return cluster_rows(&kv, &world, runs, &run, &out);
    }
    let mut rows = Vec::new();
    if std::env::var("KVSTORE_BENCH_OWNERS").as_deref() == Ok("only") {
        owners_rows(&world, runs, &run, &mut rows)?;
        if kv.rank() == 0 {
            kvstore_tests::bench::write_rows(&out, &rows)?;
        }
        return kvstore_mpi::finalize();
    }
    let only_commit = std::env::var("KVSTORE_BENCH_COMMIT").as_deref() == Ok("only");
    if std::env::var("KVSTORE_BENCH_OVERLAP").as_deref() != Ok("only") && !only_commit {
        for (label, n) in [("4 MB", 1usize << 20), ("64 MB", 16 << 20)] {
            let send = vec![1.0f32; n];
            let mut recv = vec![0.0f32; n];
            let bare = median(&world, runs, || {
                world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                black_box(&recv);
            });
            let key = format!("w{n}");
            kv.init(key.as_str(), &NDArray::zeros(&[n])?)?;
            let g = NDArray::ones(&[n])?;
            let store = median(&world, runs, || kv.push(key.as_str(), &g, 0).expect("push"));
            rows.push((format!("{run}: bare allreduce {label} f32"), bare, None));
            rows.push((format!("{run}: dist_sync push {label} f32"), store, Some(bare)));
            if n == 16 << 20 {
                // The push against one single-thread copy of its bytes in memory, each
                // rank its own copy at once, the two timed in turn.
                let mut to = vec![0.0f32; n];
                let (push, memcpy) = in_turn(
                    &world,
                    runs,
                    || kv.push(key.as_str(), &g, 0).expect("push"),
                    || {
                        to.copy_from_slice(black_box(&send[..]));
                        black_box(&mut to);
                    },
                );
                drop(to);
                rows.push((format!("{run}: limit: one single-thread memcpy of {label}"), memcpy, None));
                rows.push((format!("{run}: dist_sync push {label} f32, vs one memcpy of it"), push, Some(memcpy)));
                if world.size() == 2 {
                    // The push against MPI moving its bytes alone: on 2 ranks each sends
                    // the other 2(n - 1)/n of the array, all of it, and receives as
                    // much; here in one message each way, with no sums. No 2-rank
                    // allreduce over this transport sends fewer bytes.
                    let peer = world.process_at_rank(1 - world.rank());
                    let mut theirs = vec![0.0f32; n];
                    let (push, moved) = in_turn(
                        &world,
                        runs,
                        || kv.push(key.as_str(), &g, 0).expect("push"),
                        || {
                            mpi::point_to_point::send_receive_into(&send[..], &peer, &mut theirs[..], &peer);
                            black_box(&mut theirs);
                        },
                    );
                    rows.push((
                        format!("{run}: limit: MPI sends and receives {label} each way between the 2 ranks, no sums"),
                        moved,
                        None,
                    ));
                    rows.push((
                        format!("{run}: dist_sync push {label} f32, vs MPI moving its bytes"),
                        push,
                        Some(moved),
                    ));
                }
                // 2-bit compression: each worker sends 2 bits per element (a sixteenth of
                // the bytes), quantising and adding the codes up on the host.
                let compressed: KVStore = kvstore_mpi::create("dist_sync")?;
                compressed.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.5")])?;
                compressed.init(key.as_str(), &NDArray::zeros(&[n])?)?;
                let t = median(&world, runs, || compressed.push(key.as_str(), &g, 0).expect("push"));
                let codes = n / 16 * 4;
                // Its limit: the memory it must move, as plain copies, and the codes'
                // exchange, timed as the push is.
                let limit = two_bit_limit(&world, runs, n);
                rows.push((
                    format!("{run}: limit: the memory a 2-bit push of {label} f32 moves, as plain copies, and its codes' gather"),
                    limit,
                    Some(store),
                ));
                rows.push((
                    format!(
                        "{run}: dist_sync push {label} f32, 2-bit compressed ({} MiB of codes a worker)",
                        codes >> 20
                    ),
                    t,
                    Some(store),
                ));
                rows.push((
                    format!("{run}: dist_sync push {label} f32, 2-bit compressed, vs that limit"),
                    t,
                    Some(limit),
                ));
            }
            if n == 1 << 20 {
                // Desync detection's cost: the same push by stores whose workers do not
                // compare their calls, timed alternately with stores whose workers do.
                let init = |s: &KVStore| s.init(key.as_str(), &NDArray::zeros(&[n])?);
                let (checked, unchecked) = stores(init)?;
                let cost = alternate(&world, &checked, &unchecked, |s| s.push(key.as_str(), &g, 0));
                cost_rows(&mut rows, &format!("{run}: dist_sync push {label} f32"), cost);
            }
        }
        let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        let small: Vec<NDArray> = (0..1000).map(|_| NDArray::ones(&[1024])).collect::<Result<_, _>>()?;
        kv.init(&keys, &small)?;
        let send = vec![1.0f32; 1024];
        let mut recv = vec![0.0f32; 1024];
        let bare = median(&world, runs, || {
            for _ in 0..1000 {
                world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            }
        });
        let store = median(&world, runs, || kv.push(&keys, &small, 0).expect("push"));
        let init = |s: &KVStore| s.init(&keys, &small);
        let (checked, unchecked) = stores(init)?;
        let cost = alternate(&world, &checked, &unchecked, |s| s.push(&keys, &small, 0));
        // The same push unfused: buckets of one key's 4 KiB make it 1000 allreduces.
        let group = kvstore_mpi::group()?;
        let bucket = group.bucket_bytes();
        group.set_bucket_bytes(4096);
        let unfused = median(&world, runs, || kv.push(&keys, &small, 0).expect("push"));
        group.set_bucket_bytes(bucket);
        // The same push with fused buckets through MPI's messages instead of the ranks'
        // shared memory (the same where that is off: over TCP).
        let shm = group.shared_memory();
        group.set_shared_memory(false);
        let messages = median(&world, runs, || kv.push(&keys, &small, 0).expect("push"));
        group.set_shared_memory(shm);
        rows.push((format!("{run}: 1000 separate bare allreduces of 1 Ki f32"), bare, None));
        rows.push((format!("{run}: dist_sync list push of 1000 keys x 1 Ki f32"), store, Some(bare)));
        rows.push((format!("{run}: the same push unfused (4 KiB buckets)"), unfused, None));
        rows.push((format!("{run}: the same push fused ({} KiB buckets)", bucket >> 10), store, Some(unfused)));
        rows.push((format!("{run}: the same push fused, through MPI's messages"), messages, None));
        rows.push((format!("{run}: the same push fused, shared memory against MPI's messages"), store, Some(messages)));
        // Fusion's limit: one bare allreduce of the push's 4 MB in one buffer, timed in
        // turn with the push. (Timed alone, run after run, its buffers stay in the
        // caches, where a training step's gradients never are: it read 0.86 ms there,
        // 1.7 to 2.2 ms timed in turn with the push.)
        let send = vec![1.0f32; 1 << 20];
        let mut recv = vec![0.0f32; 1 << 20];
        let (fused, bare_4mb) = in_turn(
            &world,
            runs,
            || kv.push(&keys, &small, 0).expect("push"),
            || {
                world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                black_box(&recv);
            },
        );
        rows.push((format!("{run}: bare allreduce of 4 MB f32, timed in turn with the list push"), bare_4mb, None));
        rows.push((format!("{run}: the same push, against one bare allreduce of its 4 MB"), fused, Some(bare_4mb)));
        cost_rows(&mut rows, &format!("{run}: the list push of 1000 keys"), cost);
    }
    if std::env::var_os("KVSTORE_BENCH_OVERLAP").is_some() && !only_commit {
        overlap(&kv, &world, runs, &mut rows)?;
        if std::env::var("KVSTORE_BENCH_OVERLAP").as_deref() != Ok("only") {
            async_rows(&kv, runs, &run, &mut rows)?;
        }
    }
    if std::env::var_os("KVSTORE_JOB").is_some() && std::env::var("KVSTORE_BENCH_OVERLAP").as_deref() != Ok("only") {
        commit_rows(runs, &run, &mut rows)?;
        // (Last: from here on the dist_async store's serving thread makes MPI calls.)
        async_commit_rows(runs, &run, &mut rows)?;
    }
    if kv.rank() == 0 {
        kvstore_tests::bench::write_rows(&out, &rows)?;
    }
    kvstore_mpi::finalize()
}

/// `dist_sync` owners against the replicated layout (`KVSTORE_BENCH_OWNERS=only`), each
/// pair timed in turn: a training step, a pushpull of every key with Adam, over 100 MB
/// f32 (4 keys of 16 MiB, split across the ranks, and 144 of 256 KiB, each owned whole
/// by one rank); and the sums of 64 MB f32 reaching their owners (a reduce-scatter, each
/// rank its 1/n) against MPI's allreduce of them. Rank 0 prints the bytes each layout
/// holds per rank (`stats().held`).
fn owners_rows(
    world: &SimpleCommunicator,
    runs: usize,
    run: &str,
    rows: &mut Vec<(String, f64, Option<f64>)>,
) -> kvstore_core::Result<()> {
    use kvstore_core::backend::Collective;
    use kvstore_core::{Layout, Optimizer};
    let group = kvstore_mpi::group()?;
    let make = |layout| {
        let group: std::sync::Arc<dyn Collective> = group.clone();
        KVStore::builder("dist_sync").collective(group).layout(layout).build()
    };
    let make: &dyn Fn(Layout) -> kvstore_core::Result<KVStore> = &make;
    let sizes: Vec<usize> = [4 << 20; 4].into_iter().chain([1 << 16; 144]).collect();
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("owned{i}")).collect();
    let grads: Vec<NDArray> = sizes.iter().map(|&n| NDArray::full(&[n], 0.001)).collect::<Result<_, _>>()?;
    let stores = [make(Layout::Owners)?, make(Layout::Replicated)?];
    let mut outs = Vec::new();
    // What each store adds to the process's resident memory (its values, state,
    // buffers and the sums' scratch), and the process's peak.
    let mut grew = Vec::new();
    for kv in &stores {
        let before = resident_kb("VmRSS");
        let zeros: Vec<NDArray> = sizes.iter().map(|&n| NDArray::zeros(&[n])).collect::<Result<_, _>>()?;
        kv.init(&names, &zeros)?;
        kv.set_optimizer(Optimizer::builder("adam").param("learning_rate", 0.001).build()?)?;
        // A first step makes the state.
        kv.pushpull(&names, &grads, &zeros, 0)?;
        outs.push(zeros);
        grew.push(resident_kb("VmRSS").saturating_sub(before));
    }
    let (owned, replicated) = in_turn(
        world,
        runs,
        || stores[0].pushpull(&names, &grads, &outs[0], 0).expect("pushpull"),
        || stores[1].pushpull(&names, &grads, &outs[1], 0).expect("pushpull"),
    );
    rows.push((
        format!("{run}: dist_sync step of 100 MB with Adam, state on owners, vs replicated"),
        owned,
        Some(replicated),
    ));
    if world.rank() == 0 {
        let mb = |b: u64| b as f64 / 1e6;
        for ((kv, name), grew) in stores.iter().zip(["owners", "replicated"]).zip(&grew) {
            let h = kv.stats().held;
            println!(
                "{run}: {name}: rank 0 holds {:.1} MB of values, {:.1} MB of state, {:.1} MB of buffers ({:.1} MB); \
                 its resident memory grew {:.1} MB",
                mb(h.values),
                mb(h.state),
                mb(h.buffers),
                mb(h.values + h.state + h.buffers),
                mb(grew * 1024)
            );
        }
        println!("{run}: rank 0's peak resident memory, both stores made: {:.1} MB", mb(resident_kb("VmHWM") * 1024));
    }
    drop(stores);
    drop(outs);
    let n = 16usize << 20;
    let size = world.size() as usize;
    let src = NDArray::ones(&[n])?;
    let parts: Vec<std::ops::Range<usize>> = (0..size).map(|r| n * r / size..n * (r + 1) / size).collect();
    let dst = NDArray::zeros(&[parts[world.rank() as usize].len()])?;
    let send = vec![1.0f32; n];
    let mut recv = vec![0.0f32; n];
    let (scattered, allreduced) = in_turn(
        world,
        runs,
        || group.reduce_scatter_sum(&[(&src, &dst)], std::slice::from_ref(&parts)).expect("reduce-scatter"),
        || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            black_box(&recv);
        },
    );
    rows.push((
        format!("{run}: reduce-scatter of 64 MB f32 to its owners, vs MPI's allreduce of it"),
        scattered,
        Some(allreduced),
    ));
    table_rows(world, runs, run, rows, make)
}

/// Rows of a table: the rows of an embedding table each rank pushes and pulls per step.
const TABLE_ROW: usize = 64;

/// Row-sparse tables on their owners against the replicated layout, timed in turn: a
/// step that pushes 1 % of the rows of a 10^6 x 64 f32 table with Adam (each rank rows
/// of its own) and `row_sparse_pull`s 1 % (the next rank's); rank 0 prints the bytes
/// it sent per step against those of the rows it pushed and pulled. On 4 ranks, the
/// bytes a rank holds of a 10^7 x 64 table with Adam on owners (replicated, every rank
/// would hold the table and its state, 7.7 GB, 31 GB for the job: more than this
/// machine has).
fn table_rows(
    world: &SimpleCommunicator,
    runs: usize,
    run: &str,
    rows: &mut Vec<(String, f64, Option<f64>)>,
    make: &dyn Fn(kvstore_core::Layout) -> kvstore_core::Result<KVStore>,
) -> kvstore_core::Result<()> {
    use kvstore_core::{DType, Layout, Optimizer, RowSparse};
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let adam = || Optimizer::builder("adam").param("learning_rate", 0.001).build();
    // Each rank's 1 % of the rows at step `s`, spread over the table, sorted.
    let ids = |n: usize, s: usize, r: usize| -> Vec<i64> {
        let mut ids: Vec<i64> =
            (0..n / 100).map(|i| ((i * 2_654_435_761 + s * 7919 + r * 104_729) % n) as i64).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let n = 1_000_000;
    let shape = [n, TABLE_ROW];
    let grads: Vec<RowSparse> = (0..4)
        .map(|s| {
            let ids = ids(n, s, rank);
            RowSparse::new(NDArray::full(&[ids.len(), TABLE_ROW], 0.001)?, ids, &shape)
        })
        .collect::<Result<_, _>>()?;
    let stores = [make(Layout::Owners)?, make(Layout::Replicated)?];
    for kv in &stores {
        kv.init_row_sparse("table", &RowSparse::zeros(&shape, DType::F32)?)?;
        kv.set_optimizer(adam()?)?;
    }
    let step = [std::cell::Cell::new(0usize), std::cell::Cell::new(0usize)];
    let one = |i: usize| {
        let s = step[i].get() % grads.len();
        stores[i].push_row_sparse("table", std::slice::from_ref(&grads[s]), 0).expect("push");
        black_box(stores[i].row_sparse_pull("table", &ids(n, s, (rank + 1) % size), 0).expect("pull"));
        step[i].set(step[i].get() + 1);
    };
    // A first step makes the state.
    one(0);
    one(1);
    let sent = stores[0].stats().wire_bytes_sent;
    one(0);
    let sent = stores[0].stats().wire_bytes_sent - sent;
    let (owned, replicated) = in_turn(world, runs, || one(0), || one(1));
    rows.push((
        format!("{run}: a step of a 10^6 x 64 f32 table with Adam, 1 % of its rows pushed and pulled, on owners, vs replicated"),
        owned,
        Some(replicated),
    ));
    if rank == 0 {
        let moved = (grads[0].indices().len() * 2 * TABLE_ROW * 4) as f64;
        println!(
            "{run}: a table step on owners: rank 0 sent {sent} bytes, {:.2} times the bytes of the rows it pushed and \
             pulled ({moved} bytes)",
            sent as f64 / moved
        );
    }
    drop(stores);
    if size == 4 {
        let n = 10_000_000;
        let shape = [n, TABLE_ROW];
        let kv = make(Layout::Owners)?;
        kv.init_row_sparse("big table", &RowSparse::zeros(&shape, DType::F32)?)?;
        kv.set_optimizer(adam()?)?;
        let ids = ids(n, 0, rank);
        kv.push_row_sparse(
            "big table",
            &[RowSparse::new(NDArray::full(&[ids.len(), TABLE_ROW], 0.001)?, ids, &shape)?],
            0,
        )?;
        let held = kv.stats().held;
        if rank == 0 {
            let whole = (n * TABLE_ROW * 4 * 3) as f64;
            let mine = (held.values + held.state) as f64;
            println!(
                "{run}: a 10^7 x 64 f32 table with Adam on owners: rank 0 holds {:.1} MB of values and {:.1} MB of \
                 state, {:.3} of the table and its state ({:.1} MB; a quarter: {:.1} MB)",
                held.values as f64 / 1e6,
                held.state as f64 / 1e6,
                mine / whole,
                whole / 1e6,
                whole / 4e6
            );
        }
    }
    Ok(())
}

/// This process's `field` of `/proc/self/status` (`VmRSS`, `VmHWM`), in KiB; 0 where
/// it cannot be read.
fn resident_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find_map(|l| l.strip_prefix(field).and_then(|l| l.strip_prefix(':')));
    line.and_then(|l| l.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// A commit (`KVStore::commit`, run with `KVSTORE_JOB` set) against the training step it
/// follows: a store of its own (a commit holds the whole store) of 100 MB f32 in 10 keys
/// with Adam (its state 200 MB more), a step of one push and one pull of every key; then
/// the same step followed by a commit.
fn commit_rows(runs: usize, run: &str, rows: &mut Vec<(String, f64, Option<f64>)>) -> kvstore_core::Result<()> {
    let kv = &kvstore_mpi::create("dist_sync")?;
    let (keys, n) = COMMITTED;
    let runs = runs.min(7);
    let barrier = || kv.barrier().expect("barrier");
    // The limit: one memory copy of the bytes a commit holds (the values and Adam's two
    // states), the host's ranks at once, each its share, from memory to memory whose
    // pages are in place (as a commit's file is: it writes over an older copy).
    let share = keys * n * 4 * 3 / kv.num_workers();
    let from: Vec<u8> = (0..share).map(|i| (i * 7) as u8).collect();
    let mut to = vec![0u8; share];
    // The least a checksummed commit does, were the state already in the commit's memory
    // (nothing copied): one CRC-32 pass over the rank's share, after the same step.
    let mut checksum = || {
        black_box(crc32fast::hash(black_box(&from)));
    };
    let (step_s, with_commit, with_checksum) = time_commits(kv, runs, Some(&mut checksum))?;
    let limit = kvstore_tests::bench::median(1, runs, barrier, || {
        to.copy_from_slice(black_box(&from));
        black_box(&mut to);
    });
    drop((from, to));
    let (in_place, out_of_place) = adam_in_and_out_of_place(share / 12, runs, barrier);
    let kept = step_s + (out_of_place - in_place);
    rows.push((format!("{run}: a step of a 100 MB store with Adam (push + pull of every key)"), step_s, None));
    rows.push((format!("{run}: the same step and a commit of the store"), with_commit, Some(step_s)));
    rows.push((format!("{run}: limit: the ranks copy the 315 MB a commit holds in memory, a share each"), limit, None));
    rows.push((
        format!("{run}: a commit (the step and a commit, less the step), vs that limit"),
        with_commit - step_s,
        Some(limit),
    ));
    rows.push((
        format!("{run}: the step and one CRC-32 pass over a rank's share (a commit that copied nothing)"),
        with_checksum,
        Some(step_s),
    ));
    rows.push((
        format!("{run}: Adam over a rank's share written to a second copy with its CRC-32, vs in place"),
        out_of_place,
        Some(in_place),
    ));
    rows.push((
        format!("{run}: the step, a share of its update written to a second copy with its CRC-32 (a commit that copied nothing)"),
        kept,
        Some(step_s),
    ));
    if kv.rank() == 0 {
        println!(
            "commit: a step {:.1} ms, with a commit {:.1} ms: the commit costs {:.0} % of the step (target <= 5 %), \
             {:.2} x one copy of its bytes in memory ({:.1} ms); a checksum pass alone would cost {:.0} %",
            step_s * 1e3,
            with_commit * 1e3,
            (with_commit - step_s) / step_s * 100.0,
            (with_commit - step_s) / limit,
            limit * 1e3,
            (with_checksum - step_s) / step_s * 100.0
        );
        println!(
            "commit: Adam over a rank's share {:.1} ms in place, {:.1} ms into a second copy with its CRC-32: a \
             commit kept by writing each rank's share of the update to other memory would cost {:.0} % of the step",
            in_place * 1e3,
            out_of_place * 1e3,
            (kept - step_s) / step_s * 100.0
        );
    }
    Ok(())
}

/// The medians of an Adam update of `n` f32 (a rank's share of the committed store) in
/// place, and written to a second copy of the value and states (pages in place) with a
/// CRC-32 of what it wrote, hashed in chunks while they are in the cache; timed in turn
/// on every rank at once. The least a checksummed commit that copied nothing costs: the
/// ranks would keep the last commit whole by having the update of each rank's share of
/// the keys write elsewhere (every rank of a `dist_sync` job updates every key; the
/// others in place), and this is what that costs over the update it replaces.
fn adam_in_and_out_of_place(n: usize, runs: usize, barrier: impl FnMut()) -> (f64, f64) {
    const B1: f32 = 0.9;
    const B2: f32 = 0.999;
    const LR: f32 = 0.001;
    const EPS: f32 = 1e-8;
    let rule = |w: f32, m: f32, v: f32, g: f32| {
        let m = B1 * m + (1.0 - B1) * g;
        let v = B2 * v + (1.0 - B2) * g * g;
        (w - LR * m / (v.sqrt() + EPS), m, v)
    };
    // 2048 f32 of each of the three arrays: 24 KiB, hashed while in the cache.
    const CHUNK: usize = 2048;
    let g = vec![0.001f32; n];
    // In place: (w, m, v). Out of place: read from (w1, m1, v1), written to (w2, m2, v2).
    let (mut w, mut m, mut v) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let (w1, m1, v1) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let (mut w2, mut m2, mut v2) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    kvstore_tests::bench::medians_in_turn_after(
        1,
        runs,
        barrier,
        || {
            for (((w, m), v), g) in w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(&g) {
                (*w, *m, *v) = rule(*w, *m, *v, *g);
            }
            black_box((&w, &m, &v));
        },
        || {
            let mut crc = crc32fast::Hasher::new();
            let chunks = w2.chunks_mut(CHUNK).zip(m2.chunks_mut(CHUNK)).zip(v2.chunks_mut(CHUNK));
            let from = w1.chunks(CHUNK).zip(m1.chunks(CHUNK)).zip(v1.chunks(CHUNK).zip(g.chunks(CHUNK)));
            for (((w2, m2), v2), ((w, m), (v, g))) in chunks.zip(from) {
                let to = w2.iter_mut().zip(m2.iter_mut()).zip(v2.iter_mut());
                for ((((w2, m2), v2), (w, m)), (v, g)) in to.zip(w.iter().zip(m)).zip(v.iter().zip(g)) {
                    (*w2, *m2, *v2) = rule(*w, *m, *v, *g);
                }
                for written in [&*w2, &*m2, &*v2] {
                    crc.update(bytemuck::cast_slice(written));
                }
            }
            black_box((crc.finalize(), &w2, &m2, &v2));
        },
    )
}

/// The store the commit rows commit: 10 keys of 2.5 Mi f32 (100 MB).
const COMMITTED: (usize, usize) = (10, 2_621_440);

/// The medians of a step of `kv` (its 100 MB in [`COMMITTED`]'s keys, initialised here,
/// with Adam: its state 200 MB more), one push and one pull of every key, of the same
/// step followed by a commit, and, given `after`, of the step followed by `after`.
fn time_commits(kv: &KVStore, runs: usize, after: Option<&mut dyn FnMut()>) -> kvstore_core::Result<(f64, f64, f64)> {
    let (keys, n) = COMMITTED;
    let names: Vec<String> = (0..keys).map(|k| format!("commit-{k}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let values: Vec<NDArray> = (0..keys).map(|_| NDArray::zeros(&[n])).collect::<kvstore_core::Result<_>>()?;
    let grads: Vec<NDArray> = (0..keys).map(|_| NDArray::full(&[n], 0.001)).collect::<kvstore_core::Result<_>>()?;
    kv.init(&names[..], &values)?;
    kv.set_optimizer(kvstore_core::Optimizer::builder("adam").build()?)?;
    let barrier = || kv.barrier().expect("barrier");
    let step = || {
        kv.push(&names[..], &grads, 0).expect("push");
        kv.pull(&names[..], &values, 0).expect("pull");
    };
    let mut at = 0u64;
    let step_s = kvstore_tests::bench::median(1, runs, barrier, step);
    // Three commits before the timed ones: the host's copies rotate through three files,
    // which the first three commits make (a job commits for as many steps as it runs).
    let with_commit = kvstore_tests::bench::median(3, runs, barrier, || {
        step();
        kv.commit(at, b"").expect("commit");
        at += 1;
    });
    let with_after = match after {
        Some(after) => kvstore_tests::bench::median(1, runs, barrier, || {
            step();
            after();
        }),
        None => f64::NAN,
    };
    Ok((step_s, with_commit, with_after))
}

/// A commit of a `dist_async` store: the store of [`commit_rows`], its big keys split
/// across the ranks' shares; a step, then the same step and a commit (each rank gathers
/// the whole store from its owners, then the host writes it).
fn async_commit_rows(runs: usize, run: &str, rows: &mut Vec<(String, f64, Option<f64>)>) -> kvstore_core::Result<()> {
    let kv = &kvstore_mpi::create("dist_async")?;
    let (step_s, with_commit, _) = time_commits(kv, runs.min(7), None)?;
    rows.push((
        format!("{run}: dist_async: a step of a 100 MB store with Adam (push + pull of every key)"),
        step_s,
        None,
    ));
    rows.push((format!("{run}: dist_async: a step and a commit of the store"), with_commit, Some(step_s)));
    if kv.rank() == 0 {
        println!(
            "dist_async commit: a step {:.1} ms, with a commit {:.1} ms: the commit costs {:.0} % of the step",
            step_s * 1e3,
            with_commit * 1e3,
            (with_commit - step_s) / step_s * 100.0
        );
    }
    kv.barrier()
}

/// How many stores of each kind [`alternate`] takes in turn.
const STORES: usize = 6;

/// `STORES` new `dist_sync` stores of the job whose workers compare their calls, and
/// `STORES` whose workers do not, each holding `init`'s keys. They are made in turns,
/// the kind that goes first alternating: made all of one kind first, the first kind ran
/// 2–8 % slower than the second even when neither compared its calls (where their
/// arrays lie in memory), which would have been taken for the cost of comparing.
fn stores(init: impl Fn(&KVStore) -> kvstore_core::Result<()>) -> kvstore_core::Result<(Vec<KVStore>, Vec<KVStore>)> {
    let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
    for i in 0..2 * STORES {
        let compare = (i % 2 == 0) == (i % 4 < 2);
        let kv = KVStore::builder("dist_sync").collective(kvstore_mpi::group()?).compare_calls(compare).build()?;
        init(&kv)?;
        if compare { checked.push(kv) } else { unchecked.push(kv) }
    }
    Ok((checked, unchecked))
}

/// How many pairs [`alternate`] times: a cost of a few per cent is well under the
/// run-to-run noise of a fraction of a millisecond on a shared machine, so these rows
/// take ten times the usual samples (a few seconds in all).
const PAIRS: usize = 201;

/// Times `call` on a checked and an unchecked store back to back, [`PAIRS`] times, in
/// the order c u, u c, c u, ... (so that neither always follows the other), taking the
/// stores of each kind in turn, and returns the medians of each and the median of the
/// pairs' ratios unchecked / checked.
///
/// On a shared machine the times of these pushes have two or three modes (which core
/// each rank's threads land on), and a median of 201 runs can sit in one mode for one
/// store and in another for the other: the ratio of the two medians moved by ±6 %
/// between runs of the same binary. Both runs of a pair share their mode, so the median
/// of the pairs' ratios is steadier. A store's own arrays (where they lie in memory)
/// matter more: with one store of each kind, new in every run, the ratio ranged over
/// 0.79–1.01 in 8 runs, so [`stores`] makes several of each kind, in turns, and they are
/// taken in turn. Checked against itself (both kinds not comparing) the ratio read
/// 0.96–1.03 in 6 runs, median 1.00: that is this row's noise.
fn alternate(
    world: &SimpleCommunicator,
    checked: &[KVStore],
    unchecked: &[KVStore],
    call: impl Fn(&KVStore) -> kvstore_core::Result<()>,
) -> (f64, f64, f64) {
    let (mut tc, mut tu) = (Vec::new(), Vec::new());
    // Each store's first pair warms it up and is not counted.
    for i in 0..PAIRS + STORES {
        let mut pair = [(&checked[i % checked.len()], &mut tc), (&unchecked[i % unchecked.len()], &mut tu)];
        if i % 2 == 1 {
            pair.reverse();
        }
        for (s, t) in pair {
            world.barrier();
            let start = std::time::Instant::now();
            call(s).expect("push");
            if i >= STORES {
                t.push(start.elapsed().as_secs_f64());
            }
        }
    }
    let ratios = tc.iter().zip(&tu).map(|(c, u)| u / c).collect();
    (median_of(tc), median_of(tu), median_of(ratios))
}

/// The rows of [`alternate`]: the unchecked push, and the checked one whose limit is
/// the unchecked push timed next to it (its median times the median paired ratio, so
/// that the row's ratio is that paired ratio).
fn cost_rows(rows: &mut Vec<(String, f64, Option<f64>)>, name: &str, (checked, unchecked, ratio): (f64, f64, f64)) {
    rows.push((format!("{name}, calls not compared"), unchecked, None));
    rows.push((format!("{name}, calls compared ({PAIRS} paired runs)"), checked, Some(checked * ratio)));
}

/// ResNet-50's 161 parameter tensors in forward order (conv weights, batch-norm gamma and
/// beta, the classifier): 25.6 M f32.
fn resnet50_shapes() -> Vec<Vec<usize>> {
    let mut shapes = vec![vec![64, 3, 7, 7], vec![64], vec![64]];
    let mut inputs = 64;
    for (blocks, width) in [(3, 64), (4, 128), (6, 256), (3, 512)] {
        for block in 0..blocks {
            for (out, inp, k) in [(width, inputs, 1), (width, width, 3), (4 * width, width, 1)] {
                shapes.extend([vec![out, inp, k, k], vec![out], vec![out]]);
            }
            if block == 0 {
                shapes.extend([vec![4 * width, inputs, 1, 1], vec![4 * width], vec![4 * width]]);
            }
            inputs = 4 * width;
        }
    }
    shapes.extend([vec![1000, 2048], vec![1000]]);
    shapes
}

/// The overlap rows (see the module docs). A step: for each tensor in backward order,
/// its simulated compute (a sleep proportional to its size, standing for accelerator
/// work that leaves the CPU free), then the pushpull of its gradient into its weights,
/// as the README's training loop does (and MXNet's Module: a push and a pull per
/// parameter, as the backward pass produces it). One more row times the step with the
/// pushes first and one list pull of every key after the last, whose copy of 100 MB
/// no compute is left to hide.
///
/// The simulated accelerator keeps its own clock ([`Sleeps::OnTheAcceleratorsClock`]):
/// tensor `i`'s gradient is ready when tensor `i - 1`'s was, plus the time the host spent
/// in the call it made for `i - 1` (a host inside a call launches no more work), plus
/// `i`'s compute; the host sleeps until then. A host thread that wakes late from one of
/// these sleeps submits late, but does not slow the accelerator, whose later gradients
/// are ready on time. This assumes a host that keeps ahead of its accelerator, as a
/// framework's thread that launches kernels asynchronously does, and has no CPU work
/// of its own in the step (data loading, say) for the communication's threads to slow
/// down. Two more rows time the same steps with each sleep of its full length after
/// the host woke ([`Sleeps::OneAfterAnother`]): there every late wake-up of the host,
/// frequent on a busy machine, adds to the compute, as if the host's thread did the
/// compute itself.
fn overlap(
    kv: &KVStore,
    world: &SimpleCommunicator,
    runs: usize,
    rows: &mut Vec<(String, f64, Option<f64>)>,
) -> kvstore_core::Result<()> {
    let shapes = resnet50_shapes();
    let sizes: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let total: usize = sizes.iter().sum();
    assert_eq!((shapes.len(), total), (161, 25_557_032), "ResNet-50's parameters");
    let keys: Vec<String> = (0..shapes.len()).map(|i| format!("resnet50.{i}")).collect();
    let zeros: Vec<NDArray> = shapes.iter().map(|s| NDArray::zeros(s)).collect::<Result<_, _>>()?;
    kv.init(keys.as_slice(), zeros.as_slice())?;
    let grads: Vec<NDArray> = shapes.iter().map(|s| NDArray::full(s, 0.5)).collect::<Result<_, _>>()?;
    let outs: Vec<NDArray> = shapes.iter().map(|s| NDArray::zeros(s)).collect::<Result<_, _>>()?;
    #[derive(Clone, Copy, PartialEq)]
    enum Calls {
        /// Compute only.
        None,
        Blocking,
        NonBlocking,
        /// Non-blocking pushes, then one list pull.
        PushesThenPull,
    }
    /// How the host waits for a tensor's simulated compute (see above).
    #[derive(Clone, Copy)]
    enum Sleeps {
        OnTheAcceleratorsClock,
        OneAfterAnother,
    }
    let step = |compute: &[Duration], calls: Calls, sleeps: Sleeps| {
        let mut pending = Vec::new();
        let mut ready = Instant::now();
        for i in (0..keys.len()).rev() {
            ready += compute[i];
            let wait = match sleeps {
                Sleeps::OnTheAcceleratorsClock => ready.saturating_duration_since(Instant::now()),
                Sleeps::OneAfterAnother => compute[i],
            };
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            let (key, grad, out) = (keys[i].as_str(), &grads[i], &outs[i]);
            let call = Instant::now();
            match calls {
                Calls::None => {}
                Calls::Blocking => kv.pushpull(key, grad, out, 0).expect("pushpull"),
                Calls::NonBlocking => pending.push(kv.pushpull_async(key, grad, out, 0)),
                Calls::PushesThenPull => pending.push(kv.push_async(key, grad, 0)),
            }
            ready += call.elapsed();
        }
        if calls == Calls::PushesThenPull {
            pending.push(kv.pull_async(keys.as_slice(), outs.as_slice(), 0));
        }
        pending.into_iter().for_each(|p| p.wait().expect("non-blocking step"));
    };
    let none = vec![Duration::ZERO; keys.len()];
    // Communication alone is timed on its own, run after run: timed in turn with the
    // other steps below it read 48-108 ms where on its own it reads about 50 ms, and
    // the larger number would flatter the exposed share.
    let communication = median(world, runs.min(9), || step(&none, Calls::Blocking, Sleeps::OneAfterAnother));
    // The measure is the blocking calls; the non-blocking ones with no compute
    // (small calls fused across calls, collectives waited for without spinning) are
    // timed too: their time is the communication the non-blocking step has to hide.
    let communication_nonblocking =
        median(world, runs.min(9), || step(&none, Calls::NonBlocking, Sleeps::OneAfterAnother));
    // Compute of 1.5 x the communication (the slower rank's), spread by size: the
    // communication is then two thirds of the compute, inside the half-to-all range.
    let mut slowest = 0.0f64;
    world.all_reduce_into(&communication, &mut slowest, SystemOperation::max());
    let compute: Vec<Duration> =
        sizes.iter().map(|&n| Duration::from_secs_f64(1.5 * slowest * n as f64 / total as f64)).collect();
    // The steps with compute in turn, run by run, so that the machine's drifts touch
    // them alike: the exposed communication is a difference of two of them.
    use Sleeps::{OnTheAcceleratorsClock as Clock, OneAfterAnother as InTurn};
    let kinds = [
        (Calls::None, Clock),
        (Calls::Blocking, Clock),
        (Calls::NonBlocking, Clock),
        (Calls::PushesThenPull, Clock),
        (Calls::None, InTurn),
        (Calls::NonBlocking, InTurn),
    ];
    let mut times: [Vec<f64>; 6] = Default::default();
    for run in 0..runs + 1 {
        for (t, &(calls, sleeps)) in times.iter_mut().zip(&kinds) {
            world.barrier();
            let s = seconds(&mut || step(&compute, calls, sleeps));
            if run > 0 {
                t.push(s);
            }
        }
    }
    let [compute_alone, blocking, nonblocking, list_pull, compute_in_turn, nonblocking_in_turn] = times.map(median_of);
    rows.push(("overlap: compute alone".into(), compute_alone, None));
    rows.push(("overlap: communication alone".into(), communication, None));
    rows.push(("overlap: communication alone, non-blocking calls".into(), communication_nonblocking, None));
    rows.push(("overlap: blocking step".into(), blocking, None));
    rows.push(("overlap: non-blocking step".into(), nonblocking, None));
    rows.push(("overlap: non-blocking step, pushes then one list pull".into(), list_pull, None));
    rows.push(("overlap: compute alone, sleeps one after another".into(), compute_in_turn, None));
    rows.push(("overlap: non-blocking step, sleeps one after another".into(), nonblocking_in_turn, None));
    if kv.rank() == 0 {
        let exposed = |step: f64, compute: f64| (step - compute) / communication;
        println!(
            "overlap: compute {:.1} ms, communication alone {:.1} ms ({:.2} of the compute; non-blocking calls: \
             {:.1} ms), blocking step {:.1} ms, non-blocking step {:.1} ms; exposed communication = (non-blocking - \
             compute) / communication = {:.3} (target <= 0.15; {:.1} ms a step; against the non-blocking calls' \
             communication {:.3}); pushes then one list pull {:.1} ms: exposed {:.3}; with the sleeps one after \
             another: compute {:.1} ms, non-blocking step {:.1} ms, exposed {:.3}",
            compute_alone * 1e3,
            communication * 1e3,
            communication / compute_alone,
            communication_nonblocking * 1e3,
            blocking * 1e3,
            nonblocking * 1e3,
            exposed(nonblocking, compute_alone),
            (nonblocking - compute_alone) * 1e3,
            (nonblocking - compute_alone) / communication_nonblocking,
            list_pull * 1e3,
            exposed(list_pull, compute_alone),
            compute_in_turn * 1e3,
            nonblocking_in_turn * 1e3,
            exposed(nonblocking_in_turn, compute_in_turn),
        );
    }
    Ok(())
}
