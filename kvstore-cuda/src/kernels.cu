// Kernels of kvstore-cuda, compiled at run time by NVRTC with --fmad=false (no fused
// multiply-add contraction), IEEE division and square root, no flush to zero: every
// operation rounds as the host's does, so results are the host's bits. One exception:
// a NaN result is a NaN on both, but the GPU's is the canonical NaN while the host keeps
// the sign and payload of the NaN it came from.

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

// ---- Reduction ----
// out[i] = ins[0][i] + ins[1][i] + ... + ins[k-1][i], added left to right as on the
// host: f16/bf16 accumulate in f32 and round once (to nearest even), integers wrap
// (they are summed as unsigned, where overflow is defined, then narrowed).
//
// Up to KV_INLINE input pointers come by value in the parameters (no upload); more come
// in a device table. Each thread moves 16 bytes per input per step (one vector load;
// every buffer is a whole allocation, aligned for any type), then the tail element by
// element. For k <= KV_INLINE the count is a template argument: the pointers stay in
// registers (a run-time index into the parameters would copy them to local memory) and
// all k loads are in flight before the first add, which is what reaches the copy's
// bandwidth.

#define KV_INLINE 8
struct KvPtrs {
    const void* p[KV_INLINE];
};

// Each dtype's storage type T, accumulator A, and the conversions between them.
#define KV_OP(NAME, TT, AA, LOAD, STORE)                                  \
    struct NAME {                                                          \
        typedef TT T;                                                      \
        typedef AA A;                                                      \
        static __device__ __forceinline__ A load(T x) { return LOAD(x); }  \
        static __device__ __forceinline__ T store(A a) { return STORE(a); } \
    };
#define KV_ID(x) (x)
KV_OP(KvF32, float, float, KV_ID, KV_ID)
KV_OP(KvF64, double, double, KV_ID, KV_ID)
KV_OP(KvF16, u16, float, h2f, f2h)
KV_OP(KvBF16, u16, float, b2f, f2b)
KV_OP(KvI32, int, u32, (u32), (int))
KV_OP(KvI64, long long, u64, (u64), (long long))
KV_OP(KvI8, signed char, u32, (u32), (signed char))
KV_OP(KvU8, unsigned char, u32, (u32), (unsigned char))

// The 16-byte vectors, with their elements.
template <typename Op>
union KvVec {
    uint4 raw;
    typename Op::T e[16 / sizeof(typename Op::T)];
};

// k = K inputs, K known when compiling.
template <typename Op, int K>
__device__ __forceinline__ void kv_reduce_fixed(typename Op::T* out, const KvPtrs& inl, u64 n) {
    typedef typename Op::T T;
    typedef typename Op::A A;
    const int V = 16 / (int)sizeof(T);
    const T* p[K];
#pragma unroll
    for (int j = 0; j < K; ++j) p[j] = (const T*)inl.p[j];
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 nv = n / V;
    for (u64 v = first; v < nv; v += stride) {
        KvVec<Op> x[K];
#pragma unroll
        for (int j = 0; j < K; ++j) x[j].raw = ((const uint4*)p[j])[v];
        KvVec<Op> o;
#pragma unroll
        for (int q = 0; q < V; ++q) {
            A acc = Op::load(x[0].e[q]);
#pragma unroll
            for (int j = 1; j < K; ++j) acc = acc + Op::load(x[j].e[q]);
            o.e[q] = Op::store(acc);
        }
        ((uint4*)out)[v] = o.raw;
    }
    for (u64 i = nv * V + first; i < n; i += stride) {
        A acc = Op::load(p[0][i]);
#pragma unroll
        for (int j = 1; j < K; ++j) acc = acc + Op::load(p[j][i]);
        out[i] = Op::store(acc);
    }
}

// Any k > KV_INLINE, the pointers read from the device table.
template <typename Op>
__device__ __forceinline__ void kv_reduce_table(typename Op::T* out, const void* const* table, int k, u64 n) {
    typedef typename Op::T T;
    typedef typename Op::A A;
    const int V = 16 / (int)sizeof(T);
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 nv = n / V;
    for (u64 v = first; v < nv; v += stride) {
        A acc[16 / sizeof(T)];
        KvVec<Op> x;
        x.raw = ((const uint4*)table[0])[v];
#pragma unroll
        for (int q = 0; q < V; ++q) acc[q] = Op::load(x.e[q]);
        for (int j = 1; j < k; ++j) {
            x.raw = ((const uint4*)table[j])[v];
#pragma unroll
            for (int q = 0; q < V; ++q) acc[q] = acc[q] + Op::load(x.e[q]);
        }
        KvVec<Op> o;
#pragma unroll
        for (int q = 0; q < V; ++q) o.e[q] = Op::store(acc[q]);
        ((uint4*)out)[v] = o.raw;
    }
    for (u64 i = nv * V + first; i < n; i += stride) {
        A acc = Op::load(((const T*)table[0])[i]);
        for (int j = 1; j < k; ++j) acc = acc + Op::load(((const T*)table[j])[i]);
        out[i] = Op::store(acc);
    }
}

template <typename Op>
__device__ __forceinline__ void kv_reduce(typename Op::T* out, const KvPtrs& inl, const void* const* table, int k,
                                          u64 n) {
    switch (k) {
        case 1: kv_reduce_fixed<Op, 1>(out, inl, n); break;
        case 2: kv_reduce_fixed<Op, 2>(out, inl, n); break;
        case 3: kv_reduce_fixed<Op, 3>(out, inl, n); break;
        case 4: kv_reduce_fixed<Op, 4>(out, inl, n); break;
        case 5: kv_reduce_fixed<Op, 5>(out, inl, n); break;
        case 6: kv_reduce_fixed<Op, 6>(out, inl, n); break;
        case 7: kv_reduce_fixed<Op, 7>(out, inl, n); break;
        case 8: kv_reduce_fixed<Op, 8>(out, inl, n); break;
        default: kv_reduce_table<Op>(out, table, k, n); break;
    }
}

#define KV_REDUCE(NAME, OP)                                                                        \
    extern "C" __global__ void NAME(OP::T* out, KvPtrs inl, const void* const* table, int k, u64 n) { \
        kv_reduce<OP>(out, inl, table, k, n);                                                       \
    }

KV_REDUCE(kv_reduce_f32, KvF32)
KV_REDUCE(kv_reduce_f64, KvF64)
KV_REDUCE(kv_reduce_f16, KvF16)
KV_REDUCE(kv_reduce_bf16, KvBF16)
KV_REDUCE(kv_reduce_i32, KvI32)
KV_REDUCE(kv_reduce_i64, KvI64)
KV_REDUCE(kv_reduce_i8, KvI8)
KV_REDUCE(kv_reduce_u8, KvU8)

// ---- Fused optimizer steps ----
// One kernel per weight dtype runs any rule (`rule`, kvstore_core::FusedRule's order:
// 0 SGD, 1 SGD with momentum, 2 NAG, 3 NAG with momentum, 4 Adam, 5 AdaGrad, 6 RMSProp,
// 7 centered RMSProp) element by element, exactly as FusedRule documents it and as the
// host rules compute it, operation for operation. The scalars come already rounded to
// the compute type R (float; double for f64 weights).

template <typename R>
struct KvCoefs {
    R c[6];
    R clip;   // the gradient clip bound, when flags & 1
    R clipw;  // the weight clip bound (RMSProp), when flags & 2
    int flags;
};

__device__ __forceinline__ float kv_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double kv_sqrt(double x) { return sqrt(x); }

template <typename R>
__device__ __forceinline__ R kv_clip(R x, R b, bool on) {
    if (!on) return x;
    if (x > b) return b;
    if (x < -b) return -b;
    return x;
}

template <typename R>
__device__ __forceinline__ void kv_step(int rule, const KvCoefs<R>& k, R& w, R g, R& s0, R& s1, R& s2) {
    const R* c = k.c;
    const bool cl = (k.flags & 1) != 0;
    const bool cw = (k.flags & 2) != 0;
    const R one = (R)1;
    switch (rule) {
        case 0: {  // SGD: c = lr, wd, rescale, mu; (lr * rescale) * g when not clipping
            const R step = cl ? c[0] * kv_clip(c[2] * g, k.clip, true) : (c[0] * c[2]) * g;
            w = w + ((c[3] * (R)0 - (c[0] * c[1]) * w) - step);
            break;
        }
        case 1: {  // SGD with momentum
            const R step = cl ? c[0] * kv_clip(c[2] * g, k.clip, true) : (c[0] * c[2]) * g;
            s0 = (c[3] * s0 - (c[0] * c[1]) * w) - step;
            w = w + s0;
            break;
        }
        case 2: {  // NAG: c = lr, wd, rescale
            if (cl) {
                w = (one - c[0] * c[1]) * w - c[0] * kv_clip(c[2] * g, k.clip, true);
            } else {
                w = (one - c[0] * c[1]) * w - (c[0] * c[2]) * g;
            }
            break;
        }
        case 3: {  // NAG with momentum: c = lr, wd, rescale, mu
            R rg = kv_clip(c[2] * g, k.clip, cl);
            s0 = c[3] * s0;
            w = (w - s0) + (c[3] + one) * (s0 - c[0] * (rg + c[1] * w));
            s0 = s0 - c[0] * (rg + c[1] * w);
            break;
        }
        case 4: {  // Adam: c = lr, wd, rescale, beta1, beta2, epsilon
            R gr = kv_clip(g * c[2] + w * c[1], k.clip, cl);
            s0 = c[3] * s0 + (one - c[3]) * gr;
            s1 = c[4] * s1 + ((one - c[4]) * gr) * gr;
            w = w - (c[0] * s0) / (kv_sqrt(s1) + c[5]);
            break;
        }
        case 5: {  // AdaGrad: c = -lr, wd, rescale, eps
            R gr = kv_clip(g * c[2], k.clip, cl);
            s0 = s0 + gr * gr;
            w = w + (gr / kv_sqrt(s0 + c[3]) + w * c[1]) * c[0];
            break;
        }
        case 6: {  // RMSProp: c = lr, wd, rescale, gamma1, epsilon
            R gr = kv_clip(c[2] * g + c[1] * w, k.clip, cl);
            s0 = (one - c[3]) * (gr * gr) + c[3] * s0;
            w = kv_clip(w - c[0] * (gr / kv_sqrt(s0 + c[4])), k.clipw, cw);
            break;
        }
        case 7: {  // centered RMSProp: c = lr, wd, rescale, gamma1, gamma2, epsilon
            R gr = kv_clip(c[2] * g + c[1] * w, k.clip, cl);
            s0 = ((one - c[3]) * gr) * gr + c[3] * s0;
            s1 = (one - c[3]) * gr + c[3] * s1;
            s2 = c[4] * s2 - (c[0] * gr) / kv_sqrt((s0 - s1 * s1) + c[5]);
            w = kv_clip(w + s2, k.clipw, cw);
            break;
        }
        default:
            break;
    }
}

// W: the weight's storage type; R: the compute type; master: the f32 master copy of
// an f16/bf16 weight, or null; s0..s2: the states in R, null when the rule has fewer.
#define KV_OPT(NAME, W, R, TOR, FROMR)                                                             \
    extern "C" __global__ void NAME(int rule, KvCoefs<R> k, W* w, const W* g, R* s0, R* s1, R* s2, \
                                    R* master, u64 n) {                                           \
        u64 stride = (u64)gridDim.x * blockDim.x;                                                  \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {             \
            R a = s0 ? s0[i] : (R)0;                                                               \
            R b = s1 ? s1[i] : (R)0;                                                               \
            R c = s2 ? s2[i] : (R)0;                                                               \
            R wi = master ? master[i] : TOR(w[i]);                                                 \
            kv_step<R>(rule, k, wi, TOR(g[i]), a, b, c);                                           \
            if (s0) s0[i] = a;                                                                     \
            if (s1) s1[i] = b;                                                                     \
            if (s2) s2[i] = c;                                                                     \
            if (master) master[i] = wi;                                                            \
            w[i] = FROMR(wi);                                                                      \
        }                                                                                          \
    }

KV_OPT(kv_opt_f32, float, float, KV_ID, KV_ID)
KV_OPT(kv_opt_f64, double, double, KV_ID, KV_ID)
KV_OPT(kv_opt_f16, u16, float, h2f, f2h)
KV_OPT(kv_opt_bf16, u16, float, b2f, f2b)
