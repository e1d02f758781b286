//! Small helpers of many tests: a temporary folder ([`TempDir`]) and arrays made,
//! pulled and checked in one call.

use kvstore_core::{Context, DType, KVStore, Key, NDArray};

/// A folder of one test in the system's temp dir, removed (with what the test left in
/// it) when dropped, so that no run leaves files behind.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A fresh, empty folder for the test `name` of this process.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kvstore-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// The folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.0
    }

    /// The path of `file` in the folder.
    pub fn path(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `value` everywhere, f32, shape `shape`, on `ctx`.
pub fn full(shape: &[usize], value: f64, ctx: Context) -> NDArray {
    NDArray::full_with(shape, value, DType::F32, ctx).expect("allocate")
}

/// Pulls `key` into a fresh f32 array of `shape` and returns its elements.
pub fn pulled(kv: &KVStore, key: impl Into<Key>, shape: &[usize]) -> Vec<f64> {
    let out = NDArray::zeros(shape).expect("allocate");
    kv.pull(key.into(), &out, 0).expect("pull");
    out.to_f64_vec().expect("read")
}

/// Asserts every element of `a` is `v`.
pub fn assert_all(a: &NDArray, v: f64) {
    let got = a.to_f64_vec().expect("read");
    assert!(got.iter().all(|&x| x == v), "expected all {v}, got {got:?}");
}

/// The launcher `kvstore-run` (kvstore-commit's), built for the profile of the running
/// executable (a test's or a bench's, in `target/PROFILE/deps`) and its path beside it:
/// a test of another crate cannot name it through `CARGO_BIN_EXE_*`. Built once per
/// process (a build that has nothing to do takes a moment); panics with cargo's words
/// when it cannot be built.
pub fn launcher() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("this executable's path");
            let dir = exe.parent().and_then(std::path::Path::parent).expect("target/PROFILE");
            let release = dir.file_name().is_some_and(|n| n == "release");
            let mut cargo = std::process::Command::new(env!("CARGO"));
            cargo.args(["build", "--quiet", "-p", "kvstore-commit", "--bin", "kvstore-run"]);
            if release {
                cargo.arg("--release");
            }
            let built = cargo.output().expect("cargo runs");
            assert!(built.status.success(), "cargo build of kvstore-run: {}", String::from_utf8_lossy(&built.stderr));
            dir.join("kvstore-run")
        })
        .clone()
}

/// A value of `shape` and `dtype` of values in [-1, 1], different for each seed (the
/// differential tests' gradients).
pub fn pseudo(shape: &[usize], dtype: DType, seed: u64) -> NDArray {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) % 2001) as f64 / 1000.0 - 1.0
        })
        .collect();
    NDArray::from_vec(shape, data).and_then(|a| a.as_type(dtype)).expect("an array")
}

/// The bits of `a`'s elements: an f64's, or each element's as an f32.
pub fn bits(a: &NDArray) -> Vec<u64> {
    match a.dtype() {
        DType::F64 => a.to_vec::<f64>().expect("read").iter().map(|x| x.to_bits()).collect(),
        _ => a
            .as_type(DType::F32)
            .and_then(|a| a.to_vec::<f32>())
            .expect("read")
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
    }
}
