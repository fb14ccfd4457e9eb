//! The CUDA C++ every device module starts with ([`PRELUDE`]: 16-bit types, strided
//! indexing, block reductions) and the one kernel family this crate launches itself,
//! [`CAST`] (conversions, copies and fills between strided views). The kernel crate's
//! families are further [`Module`]s on the same prelude. Plain text: available with or
//! without the `cuda` feature, so every build can compile them with NVRTC in tests.

/// Dtype suffixes of every storage type, with their device type names.
pub const ALL_TYPES: [(&str, &str); 7] = [
    ("f16", "amp_half"),
    ("bf16", "amp_bf16"),
    ("f32", "float"),
    ("f64", "double"),
    ("i32", "int"),
    ("i64", "i64"),
    ("bool", "unsigned char"),
];

/// Shared definitions: 16-bit types and conversions, accumulation types, math
/// overloads, strided indexing, block reductions.
pub const PRELUDE: &str = r#"
typedef long long i64;
typedef unsigned long long u64;
#define AMP_MAX_DIMS 8

struct amp_half { unsigned short x; };
struct amp_bf16 { unsigned short x; };

__device__ __forceinline__ float h2f(amp_half h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x)); return f;
}
__device__ __forceinline__ amp_half f2h(float f) {
    amp_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h;
}
__device__ __forceinline__ float b2f(amp_bf16 b) {
    return __uint_as_float(((unsigned)b.x) << 16);
}
__device__ __forceinline__ amp_bf16 f2b(float f) {
    unsigned u = __float_as_uint(f);
    amp_bf16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) { b.x = (unsigned short)((u >> 16) | 0x0040u); return b; }
    u += 0x7fffu + ((u >> 16) & 1u);
    b.x = (unsigned short)(u >> 16);
    return b;
}

/* Storage type -> compute type, load and store. */
template <typename T> struct Num;
template <> struct Num<amp_half> {
    typedef float acc;
    static __device__ __forceinline__ float load(amp_half v) { return h2f(v); }
    static __device__ __forceinline__ amp_half store(float v) { return f2h(v); }
};
template <> struct Num<amp_bf16> {
    typedef float acc;
    static __device__ __forceinline__ float load(amp_bf16 v) { return b2f(v); }
    static __device__ __forceinline__ amp_bf16 store(float v) { return f2b(v); }
};
template <> struct Num<float> {
    typedef float acc;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct Num<double> {
    typedef double acc;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};

__device__ __forceinline__ float amp_exp(float x) { return expf(x); }
__device__ __forceinline__ double amp_exp(double x) { return exp(x); }
__device__ __forceinline__ float amp_log(float x) { return logf(x); }
__device__ __forceinline__ double amp_log(double x) { return log(x); }
__device__ __forceinline__ float amp_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double amp_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float amp_sin(float x) { return sinf(x); }
__device__ __forceinline__ double amp_sin(double x) { return sin(x); }
__device__ __forceinline__ float amp_cos(float x) { return cosf(x); }
__device__ __forceinline__ double amp_cos(double x) { return cos(x); }
__device__ __forceinline__ float amp_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double amp_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float amp_erf(float x) { return erff(x); }
__device__ __forceinline__ double amp_erf(double x) { return erf(x); }
__device__ __forceinline__ float amp_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double amp_abs(double x) { return fabs(x); }
#define AMP_MATH1(NAME, FF, DF) \
    __device__ __forceinline__ float amp_##NAME(float x) { return FF(x); } \
    __device__ __forceinline__ double amp_##NAME(double x) { return DF(x); }
AMP_MATH1(expm1, expm1f, expm1) AMP_MATH1(log1p, log1pf, log1p) AMP_MATH1(log2, log2f, log2)
AMP_MATH1(log10, log10f, log10) AMP_MATH1(tan, tanf, tan) AMP_MATH1(asin, asinf, asin)
AMP_MATH1(acos, acosf, acos) AMP_MATH1(atan, atanf, atan) AMP_MATH1(sinh, sinhf, sinh)
AMP_MATH1(cosh, coshf, cosh) AMP_MATH1(floor, floorf, floor) AMP_MATH1(ceil, ceilf, ceil)
AMP_MATH1(rint, rintf, rint)
__device__ __forceinline__ float amp_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double amp_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ bool amp_isfinite(float x) { return fabsf(x) <= 3.402823466e+38f; }
__device__ __forceinline__ bool amp_isfinite(double x) { return fabs(x) <= 1.7976931348623157e+308; }
__device__ __forceinline__ float amp_neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double amp_neg_inf(double) { return __longlong_as_double(0xfff0000000000000ll); }
__device__ __forceinline__ float amp_pos_inf(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double amp_pos_inf(double) { return __longlong_as_double(0x7ff0000000000000ll); }

/* A strided view: element i (row-major over dims) lives at offset + sum(idx * stride). */
struct StridedArg {
    i64 ndim;
    i64 offset;
    i64 narrow;
    i64 dims[AMP_MAX_DIMS];
    i64 strides[AMP_MAX_DIMS];
};
/* The buffer offset of the view's element `linear` (row-major order). The host merges
   the dims as far as it can (`StridedArg::of`): a contiguous view is one dim and needs
   no division; a view of under 2^32 elements (`narrow`) divides in 32 bits. */
__device__ __forceinline__ i64 amp_offset(const StridedArg& a, i64 linear) {
    if (a.ndim == 1) return a.offset + linear * a.strides[0];
    i64 off = a.offset;
    if (a.narrow) {
        unsigned l = (unsigned)linear;
        for (int d = (int)a.ndim - 1; d >= 0; --d) {
            unsigned sz = (unsigned)a.dims[d];
            off += (i64)(l % sz) * a.strides[d];
            l /= sz;
        }
        return off;
    }
    for (int d = (int)a.ndim - 1; d >= 0; --d) {
        i64 sz = a.dims[d];
        i64 idx = linear % sz;
        linear /= sz;
        off += idx * a.strides[d];
    }
    return off;
}
#define AMP_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

/* NaN-propagating max/min and sum, as reducers. */
template <typename A> struct RSum {
    static __device__ __forceinline__ A identity() { return A(0); }
    static __device__ __forceinline__ A op(A a, A b) { return a + b; }
};
template <typename A> struct RMax {
    static __device__ __forceinline__ A identity() { return amp_neg_inf(A(0)); }
    static __device__ __forceinline__ A op(A a, A b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
};
template <typename A> struct RMin {
    static __device__ __forceinline__ A identity() { return amp_pos_inf(A(0)); }
    static __device__ __forceinline__ A op(A a, A b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
};

/* Reduce over the block (blockDim.x a multiple of 32, at most 1024); every thread
   gets the result. */
template <typename A, typename R>
__device__ A block_reduce(A v) {
    __shared__ A buf[32];
    for (int o = 16; o > 0; o >>= 1) v = R::op(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) buf[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = (int)threadIdx.x < nw ? buf[threadIdx.x] : R::identity();
    if (w == 0) {
        for (int o = 16; o > 0; o >>= 1) v = R::op(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    v = buf[0];
    __syncthreads();
    return v;
}

#define AMP_FOR_FLOATS(M, ...) \
    M(amp_half, f16, __VA_ARGS__) M(amp_bf16, bf16, __VA_ARGS__) M(float, f32, __VA_ARGS__) M(double, f64, __VA_ARGS__)
"#;

/// Casts between every pair of storage types, strided input to strided output (a contiguous one for a conversion, the destination view for a copy or fill), with
/// the host crate's rules: round to nearest even, float64 to 16 bits through float32,
/// float to int truncates (NaN and out-of-range give the minimum), to bool is `!= 0`.
pub const CAST: &str = r#"
template <typename D> struct Conv;
template <> struct Conv<amp_half> {
    static __device__ amp_half from_float(float v) { return f2h(v); }
    static __device__ amp_half from_double(double v) { return f2h((float)v); }
    static __device__ amp_half from_int(i64 v) { return f2h((float)v); }
};
template <> struct Conv<amp_bf16> {
    static __device__ amp_bf16 from_float(float v) { return f2b(v); }
    static __device__ amp_bf16 from_double(double v) { return f2b((float)v); }
    static __device__ amp_bf16 from_int(i64 v) { return f2b((float)v); }
};
template <> struct Conv<float> {
    static __device__ float from_float(float v) { return v; }
    static __device__ float from_double(double v) { return (float)v; }
    static __device__ float from_int(i64 v) { return (float)v; }
};
template <> struct Conv<double> {
    static __device__ double from_float(float v) { return (double)v; }
    static __device__ double from_double(double v) { return v; }
    static __device__ double from_int(i64 v) { return (double)v; }
};
template <> struct Conv<int> {
    static __device__ int from_float(float v) {
        return (v != v || v < -2147483648.0f || v >= 2147483648.0f) ? (int)0x80000000 : (int)v; }
    static __device__ int from_double(double v) {
        return (v != v || v < -2147483648.0 || v >= 2147483648.0) ? (int)0x80000000 : (int)v; }
    static __device__ int from_int(i64 v) { return (int)(unsigned)(u64)v; }
};
template <> struct Conv<i64> {
    static __device__ i64 from_float(float v) {
        return (v != v || v < -9223372036854775808.0f || v >= 9223372036854775808.0f) ? (i64)0x8000000000000000ull : (i64)v; }
    static __device__ i64 from_double(double v) {
        return (v != v || v < -9223372036854775808.0 || v >= 9223372036854775808.0) ? (i64)0x8000000000000000ull : (i64)v; }
    static __device__ i64 from_int(i64 v) { return v; }
};
template <> struct Conv<unsigned char> {
    static __device__ unsigned char from_float(float v) { return v != 0.0f; }
    static __device__ unsigned char from_double(double v) { return v != 0.0; }
    static __device__ unsigned char from_int(i64 v) { return v != 0; }
};
template <typename D> __device__ __forceinline__ D cast_val(amp_half v) { return Conv<D>::from_float(h2f(v)); }
template <typename D> __device__ __forceinline__ D cast_val(amp_bf16 v) { return Conv<D>::from_float(b2f(v)); }
template <typename D> __device__ __forceinline__ D cast_val(float v) { return Conv<D>::from_float(v); }
template <typename D> __device__ __forceinline__ D cast_val(double v) { return Conv<D>::from_double(v); }
template <typename D> __device__ __forceinline__ D cast_val(int v) { return Conv<D>::from_int((i64)v); }
template <typename D> __device__ __forceinline__ D cast_val(i64 v) { return Conv<D>::from_int(v); }
template <typename D> __device__ __forceinline__ D cast_val(unsigned char v) { return Conv<D>::from_int(v != 0); }

template <typename S, typename D>
__device__ void cast_impl(const S* __restrict__ x, StridedArg xs, D* __restrict__ out, StridedArg os, i64 n) {
    AMP_GRID_STRIDE(i, n) { out[amp_offset(os, i)] = cast_val<D>(x[amp_offset(xs, i)]); }
}
#define AMP_CAST(S, SS, D, DS) \
    extern "C" __global__ void cast_##SS##_##DS(const S* x, StridedArg xs, D* out, StridedArg os, i64 n) { cast_impl<S, D>(x, xs, out, os, n); }
#define AMP_CAST_TO_ALL(S, SS) \
    AMP_CAST(S, SS, amp_half, f16) AMP_CAST(S, SS, amp_bf16, bf16) AMP_CAST(S, SS, float, f32) \
    AMP_CAST(S, SS, double, f64) AMP_CAST(S, SS, int, i32) AMP_CAST(S, SS, i64, i64) AMP_CAST(S, SS, unsigned char, bool)
AMP_CAST_TO_ALL(amp_half, f16) AMP_CAST_TO_ALL(amp_bf16, bf16) AMP_CAST_TO_ALL(float, f32)
AMP_CAST_TO_ALL(double, f64) AMP_CAST_TO_ALL(int, i32) AMP_CAST_TO_ALL(i64, i64) AMP_CAST_TO_ALL(unsigned char, bool)

/* Up to AMP_COPY_PIECES strided copies of one element width in one launch (`copy_many`):
   element i of the launch belongs to the piece j with start[j] <= i < start[j + 1], and
   is its element i - start[j] in row-major order. Pieces never overlap each other's
   destinations (the host's contract). */
#define AMP_COPY_PIECES 4
struct CopyPieces {
    i64 count;
    i64 start[AMP_COPY_PIECES + 1];
    u64 src[AMP_COPY_PIECES];
    u64 dst[AMP_COPY_PIECES];
    StridedArg xs[AMP_COPY_PIECES];
    StridedArg os[AMP_COPY_PIECES];
};
template <typename T>
__device__ void copy_many_impl(const CopyPieces& p) {
    AMP_GRID_STRIDE(i, p.start[p.count]) {
        int j = 0;
        while (j + 1 < p.count && i >= p.start[j + 1]) ++j;
        const i64 e = i - p.start[j];
        ((T*)p.dst[j])[amp_offset(p.os[j], e)] = ((const T*)p.src[j])[amp_offset(p.xs[j], e)];
    }
}
#define AMP_COPY_MANY(T, W) \
    extern "C" __global__ void copy_many_##W(CopyPieces p) { copy_many_impl<T>(p); }
AMP_COPY_MANY(unsigned char, 1) AMP_COPY_MANY(unsigned short, 2) AMP_COPY_MANY(unsigned int, 4) AMP_COPY_MANY(u64, 8)
"#;

/// A compilation unit: the prelude followed by one family's source.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// The module's name (also the NVRTC program name).
    pub name: &'static str,
    /// The family source (without the prelude).
    pub body: &'static str,
    /// The C names of every kernel the module defines.
    pub kernels: fn() -> Vec<String>,
}

impl Module {
    /// The full source handed to NVRTC.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }

    /// The C names of every kernel the module defines.
    pub fn kernel_names(&self) -> Vec<String> {
        (self.kernels)()
    }
}

/// The conversion module: `cast_<from>_<to>` for every pair of storage dtypes, and
/// `copy_many_<bytes>` (several same-dtype copies in one launch) for every element width.
pub const CAST_MODULE: Module = Module {
    name: "cast",
    body: CAST,
    kernels: || {
        ALL_TYPES
            .iter()
            .flat_map(|(s, _)| ALL_TYPES.iter().map(move |(d, _)| format!("cast_{s}_{d}")))
            .chain([1, 2, 4, 8].map(|w| format!("copy_many_{w}")))
            .collect()
    },
};
