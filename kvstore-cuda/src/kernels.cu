// Reduction kernels of kvstore-cuda, compiled at run time by NVRTC (with --fmad=false).
// out[i] = ins[0][i] + ins[1][i] + ... + ins[k-1][i], added left to right as on the
// host: f16/bf16 accumulate in f32 and round once (to nearest even), integers wrap
// (they are summed as unsigned, where overflow is defined, then narrowed).

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
// Round to nearest even, NaN kept quiet: the host's bf16::from_f32, bit for bit.
__device__ __forceinline__ u16 f2b(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

#define KV_REDUCE(NAME, T, ACC, LOAD, STORE)                                              \
    extern "C" __global__ void NAME(T* out, const T* const* ins, int k, u64 n) {          \
        u64 stride = (u64)gridDim.x * blockDim.x;                                         \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {    \
            ACC acc = LOAD(ins[0][i]);                                                    \
            for (int j = 1; j < k; ++j) acc = acc + LOAD(ins[j][i]);                      \
            out[i] = STORE(acc);                                                          \
        }                                                                                 \
    }

#define KV_ID(x) (x)
#define KV_U32(x) ((u32)(x))
#define KV_U64(x) ((u64)(x))

KV_REDUCE(kv_reduce_f32, float, float, KV_ID, KV_ID)
KV_REDUCE(kv_reduce_f64, double, double, KV_ID, KV_ID)
KV_REDUCE(kv_reduce_f16, u16, float, h2f, f2h)
KV_REDUCE(kv_reduce_bf16, u16, float, b2f, f2b)
KV_REDUCE(kv_reduce_i32, int, u32, KV_U32, (int))
KV_REDUCE(kv_reduce_i64, long long, u64, KV_U64, (long long))
KV_REDUCE(kv_reduce_i8, signed char, u32, KV_U32, (signed char))
KV_REDUCE(kv_reduce_u8, unsigned char, u32, KV_U32, (unsigned char))
