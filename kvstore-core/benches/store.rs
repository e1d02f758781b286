//! Criterion benches of the store's hot paths, next to the plain loops they are held
//! against. `make bench` runs these and then the `report` bench, which prints the
//! ratios of DESIGN §9 in one run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvstore_core::{Context, DType, KVStore, NDArray};

const BIG: usize = 4 << 20;
const D: usize = 4;

fn big_arrays(c: &mut Criterion) {
    let ins: Vec<Vec<f32>> = (0..D).map(|k| vec![k as f32; BIG]).collect();
    let mut g = c.benchmark_group("4x4Mi_f32");
    g.throughput(Throughput::Bytes((BIG * 4 * (D + 1)) as u64));
    let mut out = vec![0f32; BIG];
    g.bench_function("limit_plain_reduce", |b| {
        b.iter(|| {
            for ((((o, a), x), y), z) in out.iter_mut().zip(&ins[0]).zip(&ins[1]).zip(&ins[2]).zip(&ins[3]) {
                *o = a + x + y + z;
            }
            black_box(&out);
        })
    });
    let kv = KVStore::create("local").expect("store");
    let vals: Vec<NDArray> =
        (0..D).map(|k| NDArray::from_slice_in(&[BIG], &ins[k], Context::cpu(k as u32)).expect("alloc")).collect();
    kv.init("w", &vals[0]).expect("init");
    g.bench_function("store_push", |b| b.iter(|| kv.push("w", &vals, 0).expect("push")));
    let outs: Vec<NDArray> =
        (0..D).map(|k| NDArray::zeros_with(&[BIG], DType::F32, Context::cpu(k as u32)).expect("alloc")).collect();
    let mut plain: Vec<Vec<f32>> = (0..D).map(|_| vec![0f32; BIG]).collect();
    g.bench_function("limit_plain_copy", |b| {
        b.iter(|| {
            for o in plain.iter_mut() {
                o.copy_from_slice(black_box(&ins[0]));
            }
        })
    });
    g.bench_function("store_pull", |b| b.iter(|| kv.pull("w", &outs, 0).expect("pull")));
    g.finish();
}

fn small_keys(c: &mut Criterion) {
    let n = 1000;
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let kv = KVStore::create("local").expect("store");
    let outs: Vec<NDArray> = (0..n).map(|_| NDArray::zeros(&[1024]).expect("alloc")).collect();
    kv.init(&keys, &outs).expect("init");
    let vals: Vec<Vec<NDArray>> = (0..n)
        .map(|_| {
            (0..D).map(|k| NDArray::ones_with(&[1024], DType::F32, Context::cpu(k as u32)).expect("alloc")).collect()
        })
        .collect();
    let mut g = c.benchmark_group("1000x1Ki_f32");
    g.throughput(Throughput::Bytes((n * 1024 * 4 * (D + 2)) as u64));
    g.bench_function("store_list_push_pull", |b| {
        b.iter(|| {
            kv.push(&keys, &vals, 0).expect("push");
            kv.pull(&keys, &outs, 0).expect("pull");
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = big_arrays, small_keys
}
criterion_main!(benches);
