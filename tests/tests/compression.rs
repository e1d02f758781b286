//! Gradient compression (MXNet's `2bit`) against MXNet 1.9.1: every case of
//! `tests/golden/mxnet_compression.json` (recorded by
//! `tests/golden/generate_compression.py`) replayed on a `device` store, every pulled
//! value compared bit for bit; MXNet's parameter errors; what a failed push leaves.

use kvstore_core::{Context, DType, ErrorKind, KVStore, Key, Keys, NDArray, Optimizer};
use serde_json::Value;

const GOLDEN: &str = include_str!("../golden/mxnet_compression.json");

fn golden() -> Value {
    serde_json::from_str(GOLDEN).expect("golden JSON")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().expect("list").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

fn shape(v: &Value) -> Vec<usize> {
    v.as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect()
}

fn params(threshold: f64) -> Vec<(String, String)> {
    vec![("type".into(), "2bit".into()), ("threshold".into(), format!("{threshold}"))]
}

/// Replays one case; returns every step's pulled values, by key in the case's order.
fn replay(case: &Value) -> Vec<Vec<Vec<f32>>> {
    let kv = KVStore::create("device").expect("create");
    let threshold = case["threshold"].as_f64().expect("threshold");
    let p = params(threshold);
    let p: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let after_init = case["after_init"].as_bool().expect("after_init");
    if !after_init {
        kv.set_gradient_compression(&p).expect("set_gradient_compression");
    }
    let keys = case["keys"].as_array().expect("keys");
    let names: Vec<String> = keys.iter().map(|k| k["key"].as_str().expect("key").to_string()).collect();
    let shapes: Vec<Vec<usize>> = keys.iter().map(|k| shape(&k["shape"])).collect();
    for (k, s) in keys.iter().zip(&shapes) {
        let init = NDArray::from_vec(s, f32s(&k["init"])).expect("init value");
        kv.init(k["key"].as_str().expect("key"), &init).expect("init");
    }
    if after_init {
        kv.set_gradient_compression(&p).expect("set_gradient_compression");
    }
    if let Some(opt) = case["optimizer"].as_object() {
        let mut b = Optimizer::builder(opt["name"].as_str().expect("name"));
        for (k, v) in opt["params"].as_object().expect("params") {
            b = b.param(k, v.as_f64().expect("param"));
        }
        kv.set_optimizer(b.build().expect("optimizer")).expect("set_optimizer");
    }
    let mut pulled = Vec::new();
    for step in case["steps"].as_array().expect("steps") {
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for push in step["push"].as_array().expect("push") {
            let key = push["key"].as_str().expect("key");
            let i = names.iter().position(|n| n == key).expect("a known key");
            for v in push["values"].as_array().expect("values") {
                let ctx = Context::cpu(v["ctx"].as_u64().expect("ctx") as u32);
                ks.push(Key::from(key));
                vs.push(NDArray::from_slice_in(&shapes[i], &f32s(&v["data"]), ctx).expect("value"));
            }
        }
        kv.push(Keys::Many(ks), &vs[..], 0).expect("push");
        pulled.push(
            names.iter().map(|k| kv.pull_new(k.as_str(), 0).expect("pull").to_vec::<f32>().expect("f32")).collect(),
        );
    }
    pulled
}

#[test]
fn every_compression_case_recorded_from_mxnet_replays_bit_for_bit() {
    let golden = golden();
    assert_eq!(golden["mxnet_version"], "1.9.1");
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 8, "only {} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let keys: Vec<&str> = case["keys"].as_array().unwrap().iter().map(|k| k["key"].as_str().unwrap()).collect();
        for (s, (step, got)) in case["steps"].as_array().unwrap().iter().zip(replay(case)).enumerate() {
            for (k, got) in keys.iter().zip(got) {
                let want = f32s(&step["pull"][*k]);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&got), bits(&want), "{name}, step {s}, key {k}: {got:?} against MXNet's {want:?}");
            }
        }
    }
}

#[test]
fn parameters_mxnet_refuses_are_refused_and_a_local_store_has_none() {
    let golden = golden();
    for e in golden["errors"].as_array().expect("errors") {
        let kv = KVStore::create(e["store"].as_str().unwrap()).unwrap();
        let p: Vec<(&str, &str)> =
            e["params"].as_object().unwrap().iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())).collect();
        let err = kv.set_gradient_compression(&p).expect_err(e["name"].as_str().unwrap());
        let want = if e["store"] == "local" { ErrorKind::Unsupported } else { ErrorKind::InvalidArgument };
        assert_eq!(err.kind(), want, "{}: {err}", e["name"]);
        // The store still pushes uncompressed values.
        kv.init("w", &NDArray::zeros(&[2]).unwrap()).unwrap();
        kv.push("w", &NDArray::full(&[2], 0.3).unwrap(), 0).unwrap();
        assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![0.3; 2], "{}", e["name"]);
    }
}

/// A push that fails leaves the residuals as they were, as it leaves the values: the
/// next push quantises as if the failed one had never been made.
#[test]
fn a_failed_push_changes_no_residual() {
    let run = |fail_between: bool| {
        let kv = KVStore::create("device").unwrap();
        kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "1")]).unwrap();
        kv.init(&["a", "b"], &[NDArray::zeros(&[3]).unwrap(), NDArray::zeros(&[2]).unwrap()]).unwrap();
        let g = NDArray::from_vec(&[3], vec![0.5f32, 1.5, -2.5]).unwrap();
        kv.push("a", &g, 0).unwrap();
        if fail_between {
            // "b" has another shape: the whole call fails, "a" included.
            let e = kv.push(&["a", "b"], &[g.clone(), NDArray::zeros(&[5]).unwrap()], 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        }
        kv.push("a", &g, 0).unwrap();
        kv.pull_new("a", 0).unwrap().to_vec::<f32>().unwrap()
    };
    assert_eq!(run(true), run(false));
    assert_eq!(run(true), vec![1.0, 1.0, -1.0]);
}

#[test]
fn values_that_are_not_float32_are_refused_and_change_nothing() {
    let kv = KVStore::create("device").unwrap();
    kv.set_gradient_compression(&[("type", "2bit")]).unwrap();
    kv.init("h", &NDArray::zeros_with(&[4], DType::F16, Context::cpu(0)).unwrap()).unwrap();
    let e = kv.push("h", &NDArray::full_with(&[4], 1.0, DType::F16, Context::cpu(0)).unwrap(), 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("float32"), "{e}");
    assert_eq!(kv.pull_new("h", 0).unwrap().to_f64_vec().unwrap(), vec![0.0; 4]);
}

/// A list push of many small keys (which may be spread over threads without
/// compression) quantises every key's values, as one key at a time does.
#[test]
fn a_push_of_many_keys_quantises_each_as_alone() {
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let value =
        |i: usize| NDArray::from_vec(&[8], (0..8).map(|j| ((i * 7 + j) % 11) as f32 * 0.15 - 0.7).collect()).unwrap();
    let many = KVStore::create("device").unwrap();
    let alone = KVStore::create("device").unwrap();
    for kv in [&many, &alone] {
        kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "0.4")]).unwrap();
        let zeros: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros(&[8]).unwrap()).collect();
        kv.init(&keys, &zeros).unwrap();
    }
    for _ in 0..3 {
        let values: Vec<NDArray> = (0..keys.len()).map(value).collect();
        many.push(&keys, &values, 0).unwrap();
        for (k, v) in keys.iter().zip(&values) {
            alone.push(k.as_str(), v, 0).unwrap();
        }
    }
    for k in &keys {
        let (a, b) = (many.pull_new(k.as_str(), 0).unwrap(), alone.pull_new(k.as_str(), 0).unwrap());
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{k}");
        assert!(a.to_vec::<f32>().unwrap().iter().all(|x| [0.0, 0.4, -0.4].contains(x)), "{k}: quantised");
    }
}

#[test]
fn dist_sync_workers_sum_each_others_quantised_sums_alike() {
    for workers in [1, 2, 3] {
        let bits = kvstore_tests::run_workers(workers, |rank, kv| {
            kvstore_tests::dist_cases::compressed_pushes_sum_every_workers_quantised_values(rank, &kv)
        });
        assert!(bits.iter().all(|b| *b == bits[0]), "{workers} workers: every worker holds the same bits");
    }
}

/// Workers that differ in compression would move other data: the push fails on every
/// worker at once, saying so, instead of hanging.
#[test]
fn a_push_compressed_on_one_worker_and_not_on_another_fails_on_both() {
    let errors = kvstore_tests::run_workers(2, |rank, kv| {
        if rank == 0 {
            kv.set_gradient_compression(&[("type", "2bit")]).unwrap();
        }
        kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
        let e = kv.push("w", &NDArray::ones(&[4]).unwrap(), 0).expect_err("a desync");
        kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap().iter().for_each(|x| assert_eq!(*x, 0.0));
        e.to_string()
    });
    for e in errors {
        assert!(e.contains("compressed at threshold 0.5") && e.contains("differ"), "{e}");
    }
}

#[test]
fn dist_sync_workers_add_up_each_others_sums_rounded_to_16_bits() {
    for kind in ["fp16", "bf16"] {
        for workers in [1, 2, 3] {
            let bits = kvstore_tests::run_workers(workers, move |rank, kv| {
                kvstore_tests::dist_cases::half_compressed_pushes_round_each_workers_sum_once(rank, &kv, kind)
            });
            assert!(bits.iter().all(|b| *b == bits[0]), "{kind}, {workers} workers: the same bits on every worker");
        }
    }
    // A device store has no wire: only MXNet's 2bit.
    let e = KVStore::create("device").unwrap().set_gradient_compression(&[("type", "fp16")]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("dist_sync"), "{e}");
}

#[test]
fn half_compressed_sums_beyond_the_range_become_inf_on_every_worker() {
    for kind in ["fp16", "bf16"] {
        for workers in [1, 2, 3] {
            let bits = kvstore_tests::run_workers(workers, move |rank, kv| {
                kvstore_tests::dist_cases::half_compressed_sums_beyond_the_range_become_inf(rank, &kv, kind)
            });
            assert!(bits.iter().all(|b| *b == bits[0]), "{kind}, {workers} workers: the same bits on every worker");
        }
    }
}

/// Non-blocking pushes fused into one batch under compression: a push of a key that is
/// not float32 fails alone, as it does when made blocking; the others go on.
#[test]
fn a_fused_push_that_cannot_be_compressed_fails_alone() {
    let results = kvstore_tests::run_workers(2, |_, kv| {
        kv.set_gradient_compression(&[("type", "2bit"), ("threshold", "1")]).unwrap();
        kv.init("w", &NDArray::zeros(&[3]).unwrap()).unwrap();
        kv.init("steps", &NDArray::zeros_with(&[1], DType::I64, Context::cpu(0)).unwrap()).unwrap();
        let g = NDArray::from_vec(&[3], vec![0.5f32, 1.5, -2.5]).unwrap();
        let a = kv.push_async("w", &g, 0);
        let b = kv.push_async("steps", &NDArray::ones_with(&[1], DType::I64, Context::cpu(0)).unwrap(), 0);
        let (a, b) = (a.wait(), b.wait().map_err(|e| e.to_string()));
        (a.is_ok(), b, kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap())
    });
    for (ok, b, w) in results {
        assert!(ok, "the float32 push went on");
        assert!(b.expect_err("the int64 push").contains("float32"));
        assert_eq!(w, vec![0.0, 2.0, -2.0], "both workers' quantised 0.5, 1.5, -2.5");
    }
}
