//! The MPI rows of `make bench`, run with `mpirun -np 2`: a `dist_sync` push of 4 MB and
//! 64 MB against a bare MPI allreduce of the same bytes, and 1000 small keys in one list
//! push against 1000 separate bare allreduces, all timed in the same run. Rank 0 writes
//! the medians as JSON (the bench binary with `OUT.json`) for the report. `KVSTORE_BENCH_LABEL`
//! names the run in the rows (default "mpi 2 ranks"; `make bench` runs it again over
//! TCP, where one allreduce costs what it costs across machines, not over shared memory).

use std::hint::black_box;

use kvstore_core::{KVStore, NDArray};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

fn median(world: &SimpleCommunicator, runs: usize, f: impl FnMut()) -> f64 {
    kvstore_tests::bench::median(3, runs, || world.barrier(), f)
}

fn main() -> kvstore_core::Result<()> {
    let out =
        std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or_else(|| "target/bench/mpi.json".to_string());
    let runs: usize = std::env::var("KVSTORE_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(21);
    let kv: KVStore = kvstore_mpi::create("dist_sync")?;
    let world = SimpleCommunicator::world();
    let run = std::env::var("KVSTORE_BENCH_LABEL").unwrap_or_else(|_| format!("mpi {} ranks", kv.num_workers()));
    let mut rows = Vec::new();
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
    // The same push unfused: buckets of one key's 4 KiB make it 1000 allreduces.
    let group = kvstore_mpi::group()?;
    let bucket = group.bucket_bytes();
    group.set_bucket_bytes(4096);
    let unfused = median(&world, runs, || kv.push(&keys, &small, 0).expect("push"));
    group.set_bucket_bytes(bucket);
    rows.push((format!("{run}: 1000 separate bare allreduces of 1 Ki f32"), bare, None));
    rows.push((format!("{run}: dist_sync list push of 1000 keys x 1 Ki f32"), store, Some(bare)));
    rows.push((format!("{run}: the same push unfused (4 KiB buckets)"), unfused, None));
    rows.push((format!("{run}: the same push fused ({} KiB buckets)", bucket >> 10), store, Some(unfused)));
    if kv.rank() == 0 {
        kvstore_tests::bench::write_rows(&out, &rows)?;
    }
    kvstore_mpi::finalize()
}
