//! The kernels' CUDA C compiled by NVRTC, which needs no GPU: every kernel is there and
//! the PTX has no fused multiply-add (the host's rounding depends on it). Without the
//! NVRTC library this prints `SKIP: no NVRTC` and passes, unless
//! `KVSTORE_REQUIRE_NVRTC=1` (`make test` installs NVRTC and sets it).

const KERNELS: [&str; 12] = [
    "kv_reduce_f32",
    "kv_reduce_f64",
    "kv_reduce_f16",
    "kv_reduce_bf16",
    "kv_reduce_i32",
    "kv_reduce_i64",
    "kv_reduce_i8",
    "kv_reduce_u8",
    "kv_opt_f32",
    "kv_opt_f64",
    "kv_opt_f16",
    "kv_opt_bf16",
];

#[test]
fn the_kernels_compile_without_fused_multiply_add() {
    for arch in ["compute_90", "compute_80", "compute_75"] {
        let ptx = match kvstore_cuda::compile_kernels(arch) {
            Ok(ptx) => ptx.to_src(),
            Err(e) if e.kind() == kvstore_core::ErrorKind::DeviceUnavailable => {
                assert!(
                    std::env::var("KVSTORE_REQUIRE_NVRTC").map_or(true, |v| v != "1"),
                    "KVSTORE_REQUIRE_NVRTC=1 but: {e}"
                );
                println!("SKIP: no NVRTC ({e}): the_kernels_compile_without_fused_multiply_add");
                return;
            }
            Err(e) => panic!("{arch}: {e}"),
        };
        for k in KERNELS {
            assert!(ptx.contains(&format!(".entry {k}(")), "{arch}: no kernel {k}");
        }
        if let Ok(dir) = std::env::var("KVSTORE_PTX_DUMP") {
            std::fs::write(format!("{dir}/{arch}.ptx"), &ptx).expect("dump");
        }
        assert!(!ptx.contains("fma."), "{arch}: the PTX has a fused multiply-add");
        // Floating-point adds and multiplies carry an explicit rounding (`add.rn.f32`),
        // which ptxas never contracts into a multiply-add; bare ones it may.
        for bare in ["\tadd.f32", "\tsub.f32", "\tmul.f32", "\tadd.f64", "\tsub.f64", "\tmul.f64"] {
            assert!(!ptx.contains(bare), "{arch}: {} may be contracted", bare.trim());
        }
        for op in ["add.rn.f32", "mul.rn.f32", "div.rn.f32", "sqrt.rn.f32", "div.rn.f64", "sqrt.rn.f64", "ld.global.v4"]
        {
            assert!(ptx.contains(op), "{arch}: no {op} in the PTX");
        }
    }
}
