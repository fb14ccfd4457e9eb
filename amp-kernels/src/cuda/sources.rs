//! The device kernels as CUDA C++ sources, compiled at run time with NVRTC.
//!
//! One template per op family, instantiated by macro for every dtype under a C name
//! `<family>_<op>_<dtype>` (`unary_exp_bf16`, `cast_f64_f16`, ...). The sources need no
//! header: float16 and bfloat16 are 16-bit structs converted with PTX `cvt` (float16)
//! and bit operations (bfloat16, round to nearest even, NaN kept quiet), so NVRTC alone
//! compiles them on any machine. 16-bit types compute in float32, float64 in float64.

/// Dtype suffixes of the floating instantiations, with their device type names.
pub const FLOAT_TYPES: [(&str, &str); 4] = [
    ("f16", "amp_half"),
    ("bf16", "amp_bf16"),
    ("f32", "float"),
    ("f64", "double"),
];

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

/// Binary elementwise ops of [`BINARY`].
pub const BINARY_OPS: [&str; 7] = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"];

/// Row reductions of [`REDUCE`].
pub const REDUCE_OPS: [&str; 4] = ["sum", "mean", "max", "min"];

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
    i64 dims[AMP_MAX_DIMS];
    i64 strides[AMP_MAX_DIMS];
};
__device__ __forceinline__ i64 amp_offset(const StridedArg& a, i64 linear) {
    i64 off = a.offset;
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

/// The CUDA unary module and its op list from the crate's one list of unary ops
/// (`unary::with_unary_ops`): an `Op_<name>` struct and the four float instantiations
/// of each op that has a kernel body, in the list's order.
macro_rules! cuda_unary {
    // The first of two literals: repeats an op's name once per kernel body it has.
    (@name $name:literal $body:literal) => {
        $name
    };
    (
        $($(#[$doc:meta])* $variant:ident = $name:literal $(, cuda $body:literal)?;)*
        @device_only: $($dev_name:ident = $dev_body:literal;)*
    ) => {
        /// Unary elementwise ops of [`UNARY`].
        pub const UNARY_OPS: &[&str] = &[$($(cuda_unary!(@name $name $body),)?)* $(stringify!($dev_name),)*];

        /// Unary elementwise family: a strided input (any view) to a contiguous output.
        pub const UNARY: &str = concat!(
            "\n",
            $($(
                "struct Op_", $name,
                " { template <typename A> static __device__ A apply(A x) { return ",
                $body, "; } };\n",
            )?)*
            $(
                "struct Op_", stringify!($dev_name),
                " { template <typename A> static __device__ A apply(A x) { return ",
                $dev_body, "; } };\n",
            )*
            r#"
template <typename T, typename Op>
__device__ void unary_impl(const T* __restrict__ x, StridedArg xs, T* __restrict__ out, i64 n) {
    AMP_GRID_STRIDE(i, n) {
        out[i] = Num<T>::store(Op::apply(Num<T>::load(x[amp_offset(xs, i)])));
    }
}
#define AMP_UNARY(T, SUF, OP) \
    extern "C" __global__ void unary_##OP##_##SUF(const T* x, StridedArg xs, T* out, i64 n) { \
        unary_impl<T, Op_##OP>(x, xs, out, n); }
"#,
            $($("AMP_FOR_FLOATS(AMP_UNARY, ", cuda_unary!(@name $name $body), ")\n",)?)*
            $("AMP_FOR_FLOATS(AMP_UNARY, ", stringify!($dev_name), ")\n",)*
        );
    };
}
crate::unary::with_unary_ops!(cuda_unary);

/// Binary elementwise family: two strided inputs (broadcast = stride 0) of one dtype
/// (the host casts to the promoted dtype first) to a contiguous output.
pub const BINARY: &str = r#"
struct Op_add { template <typename A> static __device__ A apply(A a, A b) { return a + b; } };
struct Op_sub { template <typename A> static __device__ A apply(A a, A b) { return a - b; } };
struct Op_mul { template <typename A> static __device__ A apply(A a, A b) { return a * b; } };
struct Op_div { template <typename A> static __device__ A apply(A a, A b) { return a / b; } };
struct Op_maximum { template <typename A> static __device__ A apply(A a, A b) { return RMax<A>::op(a, b); } };
struct Op_minimum { template <typename A> static __device__ A apply(A a, A b) { return RMin<A>::op(a, b); } };
struct Op_pow { template <typename A> static __device__ A apply(A a, A b) { return amp_pow(a, b); } };

template <typename T, typename Op>
__device__ void binary_impl(const T* __restrict__ a, StridedArg as, const T* __restrict__ b, StridedArg bs,
                            T* __restrict__ out, i64 n) {
    AMP_GRID_STRIDE(i, n) {
        out[i] = Num<T>::store(Op::apply(Num<T>::load(a[amp_offset(as, i)]), Num<T>::load(b[amp_offset(bs, i)])));
    }
}
#define AMP_BINARY(T, SUF, OP) \
    extern "C" __global__ void binary_##OP##_##SUF(const T* a, StridedArg as, const T* b, StridedArg bs, T* out, i64 n) { \
        binary_impl<T, Op_##OP>(a, as, b, bs, out, n); }
AMP_FOR_FLOATS(AMP_BINARY, add) AMP_FOR_FLOATS(AMP_BINARY, sub) AMP_FOR_FLOATS(AMP_BINARY, mul)
AMP_FOR_FLOATS(AMP_BINARY, div) AMP_FOR_FLOATS(AMP_BINARY, maximum) AMP_FOR_FLOATS(AMP_BINARY, minimum)
AMP_FOR_FLOATS(AMP_BINARY, pow)
"#;

/// Casts between every pair of storage types, strided input to contiguous output, with
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
__device__ void cast_impl(const S* __restrict__ x, StridedArg xs, D* __restrict__ out, i64 n) {
    AMP_GRID_STRIDE(i, n) { out[i] = cast_val<D>(x[amp_offset(xs, i)]); }
}
#define AMP_CAST(S, SS, D, DS) \
    extern "C" __global__ void cast_##SS##_##DS(const S* x, StridedArg xs, D* out, i64 n) { cast_impl<S, D>(x, xs, out, n); }
#define AMP_CAST_TO_ALL(S, SS) \
    AMP_CAST(S, SS, amp_half, f16) AMP_CAST(S, SS, amp_bf16, bf16) AMP_CAST(S, SS, float, f32) \
    AMP_CAST(S, SS, double, f64) AMP_CAST(S, SS, int, i32) AMP_CAST(S, SS, i64, i64) AMP_CAST(S, SS, unsigned char, bool)
AMP_CAST_TO_ALL(amp_half, f16) AMP_CAST_TO_ALL(amp_bf16, bf16) AMP_CAST_TO_ALL(float, f32)
AMP_CAST_TO_ALL(double, f64) AMP_CAST_TO_ALL(int, i32) AMP_CAST_TO_ALL(i64, i64) AMP_CAST_TO_ALL(unsigned char, bool)
"#;

/// Row reductions: a contiguous `[rows, n]` input to `rows` outputs, one block per row,
/// accumulated in float32 for 16-bit types (float64 for float64), NaN-propagating
/// max/min; `mean` divides the sum by `n` in the accumulation type.
pub const REDUCE: &str = r#"
template <typename T, template <typename> class R, bool MEAN>
__device__ void reduce_rows(const T* __restrict__ x, T* __restrict__ out, i64 rows, i64 n) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        A v = R<A>::identity();
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) v = R<A>::op(v, Num<T>::load(row[j]));
        v = block_reduce<A, R<A> >(v);
        if (threadIdx.x == 0) out[r] = Num<T>::store(MEAN ? v / (A)n : v);
    }
}
#define AMP_REDUCE(T, SUF, OP, R, MEAN) \
    extern "C" __global__ void reduce_##OP##_##SUF(const T* x, T* out, i64 rows, i64 n) { reduce_rows<T, R, MEAN>(x, out, rows, n); }
#define AMP_REDUCE_SUM(T, SUF, _) AMP_REDUCE(T, SUF, sum, RSum, false)
#define AMP_REDUCE_MEAN(T, SUF, _) AMP_REDUCE(T, SUF, mean, RSum, true)
#define AMP_REDUCE_MAX(T, SUF, _) AMP_REDUCE(T, SUF, max, RMax, false)
#define AMP_REDUCE_MIN(T, SUF, _) AMP_REDUCE(T, SUF, min, RMin, false)
AMP_FOR_FLOATS(AMP_REDUCE_SUM, 0) AMP_FOR_FLOATS(AMP_REDUCE_MEAN, 0)
AMP_FOR_FLOATS(AMP_REDUCE_MAX, 0) AMP_FOR_FLOATS(AMP_REDUCE_MIN, 0)
"#;

/// Softmax and log-softmax over the rows of a contiguous `[rows, n]` input (the host
/// moves the softmax dimension last), max-subtracted, accumulated in float32 for
/// 16-bit types.
pub const SOFTMAX: &str = r#"
template <typename T, bool LOG>
__device__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, i64 rows, i64 n) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        T* orow = out + r * n;
        A m = RMax<A>::identity();
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = RMax<A>::op(m, Num<T>::load(row[j]));
        m = block_reduce<A, RMax<A> >(m);
        A s = A(0);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += amp_exp(Num<T>::load(row[j]) - m);
        s = block_reduce<A, RSum<A> >(s);
        if (LOG) {
            A ls = amp_log(s);
            for (i64 j = threadIdx.x; j < n; j += blockDim.x) orow[j] = Num<T>::store(Num<T>::load(row[j]) - m - ls);
        } else {
            for (i64 j = threadIdx.x; j < n; j += blockDim.x) orow[j] = Num<T>::store(amp_exp(Num<T>::load(row[j]) - m) / s);
        }
    }
}
#define AMP_SOFTMAX(T, SUF, _) \
    extern "C" __global__ void softmax_fwd_##SUF(const T* x, T* out, i64 rows, i64 n) { softmax_rows<T, false>(x, out, rows, n); } \
    extern "C" __global__ void log_softmax_fwd_##SUF(const T* x, T* out, i64 rows, i64 n) { softmax_rows<T, true>(x, out, rows, n); }
AMP_FOR_FLOATS(AMP_SOFTMAX, 0)
"#;

/// Layer norm forward over the last `n` elements of each row of a contiguous
/// `[rows, n]` input: two-pass mean and biased variance in the accumulation type,
/// optional weight and bias (null pointers when absent), and the per-row mean and
/// `rstd = 1/sqrt(var + eps)` written in the accumulation type (float32 for 16-bit).
pub const LAYER_NORM: &str = r#"
template <typename T>
__device__ void layer_norm_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, double eps,
                                T* __restrict__ out, typename Num<T>::acc* mean_out, typename Num<T>::acc* rstd_out,
                                i64 rows, i64 n) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        T* orow = out + r * n;
        A s = A(0);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += Num<T>::load(row[j]);
        A mean = block_reduce<A, RSum<A> >(s) / (A)n;
        A q = A(0);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) { A d = Num<T>::load(row[j]) - mean; q += d * d; }
        A var = block_reduce<A, RSum<A> >(q) / (A)n;
        A rstd = A(1) / amp_sqrt(var + (A)eps);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
            A y = (Num<T>::load(row[j]) - mean) * rstd;
            if (w) y *= Num<T>::load(w[j]);
            if (b) y += Num<T>::load(b[j]);
            orow[j] = Num<T>::store(y);
        }
        if (threadIdx.x == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    }
}
#define AMP_LAYER_NORM(T, SUF, _) \
    extern "C" __global__ void layer_norm_fwd_##SUF(const T* x, const T* w, const T* b, double eps, T* out, \
        Num<T>::acc* mean, Num<T>::acc* rstd, i64 rows, i64 n) { layer_norm_rows<T>(x, w, b, eps, out, mean, rstd, rows, n); }
AMP_FOR_FLOATS(AMP_LAYER_NORM, 0)
"#;

/// The two AMP kernels, exactly as `_amp_foreach_non_finite_check_and_unscale_` and
/// `_amp_update_scale_` (PyTorch's `AmpKernels.cu`):
///
/// * `amp_non_finite_check_and_unscale`: one launch over a device table of chunks
///   `(pointer, length, dtype)` of many gradients of mixed dtypes (0 float16,
///   1 bfloat16, 2 float32, 3 float64); each block walks chunks, each thread elements.
///   A non-finite element sets `*found_inf = 1.0f` (never cleared). With
///   `*inv_scale == 1.0f` nothing is written; otherwise 16-bit values are multiplied in
///   float32 and rounded back, float32 in float32, float64 by the float32 inverse
///   promoted to double. `inv_scale` is read on the device: no host sync.
/// * `amp_update_scale`: one thread; backoff on found_inf, growth after
///   `growth_interval` clean steps unless the grown scale is not finite, the products
///   taken in double and rounded to float.
pub const AMP: &str = r#"
struct AmpChunk { u64 ptr; i64 len; i64 dtype; i64 pad; };

// 16 bytes of T, loaded and stored as one vector.
template <typename T> union AmpVec16 { uint4 raw; T e[16 / sizeof(T)]; };

template <typename T>
__device__ bool unscale_chunk(T* __restrict__ p, i64 len, float inv) {
    typedef typename Num<T>::acc A;
    bool bad = false;
    const bool write = inv != 1.0f;
    i64 head = 0;
    if ((((u64)p) & 15) == 0) {
        // 16-byte loads and stores: four times the bytes in flight per thread.
        const int V = 16 / sizeof(T);
        const i64 nv = len / V;
        uint4* __restrict__ pv = (uint4*)p;
        for (i64 j = threadIdx.x; j < nv; j += blockDim.x) {
            AmpVec16<T> r;
            r.raw = pv[j];
#pragma unroll
            for (int q = 0; q < V; ++q) {
                A v = Num<T>::load(r.e[q]);
                bad |= !amp_isfinite(v);
                r.e[q] = Num<T>::store(v * (A)inv);
            }
            if (write) pv[j] = r.raw;
        }
        head = nv * V;
    }
    for (i64 i = head + threadIdx.x; i < len; i += blockDim.x) {
        A v = Num<T>::load(p[i]);
        bad |= !amp_isfinite(v);
        if (write) p[i] = Num<T>::store(v * (A)inv);
    }
    return bad;
}

extern "C" __global__ void amp_non_finite_check_and_unscale(const AmpChunk* __restrict__ chunks, i64 nchunks,
                                                            float* found_inf, const float* inv_scale) {
    const float inv = *inv_scale;
    bool bad = false;
    for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) {
        AmpChunk ch = chunks[c];
        switch (ch.dtype) {
            case 0: bad |= unscale_chunk<amp_half>((amp_half*)ch.ptr, ch.len, inv); break;
            case 1: bad |= unscale_chunk<amp_bf16>((amp_bf16*)ch.ptr, ch.len, inv); break;
            case 2: bad |= unscale_chunk<float>((float*)ch.ptr, ch.len, inv); break;
            default: bad |= unscale_chunk<double>((double*)ch.ptr, ch.len, inv); break;
        }
    }
    if (bad) *found_inf = 1.0f;
}

extern "C" __global__ void amp_update_scale(float* scale, int* growth_tracker, const float* found_inf,
                                            double growth_factor, double backoff_factor, i64 growth_interval) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (*found_inf != 0.0f) {
        *scale = (float)((double)*scale * backoff_factor);
        *growth_tracker = 0;
    } else {
        int t = (int)((unsigned)*growth_tracker + 1u);
        if ((i64)t == growth_interval) {
            float s = (float)((double)*scale * growth_factor);
            if (amp_isfinite(s)) *scale = s;
            *growth_tracker = 0;
        } else {
            *growth_tracker = t;
        }
    }
}
"#;

/// A compilation unit: the prelude followed by one family's source.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// The module's name (also the NVRTC program name).
    pub name: &'static str,
    /// The family source (without the prelude).
    pub body: &'static str,
}

/// Every module, in a fixed order.
pub const MODULES: [Module; 7] = [
    Module {
        name: "unary",
        body: UNARY,
    },
    Module {
        name: "binary",
        body: BINARY,
    },
    Module {
        name: "cast",
        body: CAST,
    },
    Module {
        name: "reduce",
        body: REDUCE,
    },
    Module {
        name: "softmax",
        body: SOFTMAX,
    },
    Module {
        name: "layer_norm",
        body: LAYER_NORM,
    },
    Module {
        name: "amp",
        body: AMP,
    },
];

impl Module {
    /// The full source handed to NVRTC.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }

    /// The C names of every kernel the module defines.
    pub fn kernel_names(&self) -> Vec<String> {
        let floats = || FLOAT_TYPES.iter().map(|(s, _)| *s);
        match self.name {
            "unary" => UNARY_OPS
                .iter()
                .flat_map(|op| floats().map(move |d| format!("unary_{op}_{d}")))
                .collect(),
            "binary" => BINARY_OPS
                .iter()
                .flat_map(|op| floats().map(move |d| format!("binary_{op}_{d}")))
                .collect(),
            "cast" => ALL_TYPES
                .iter()
                .flat_map(|(s, _)| ALL_TYPES.iter().map(move |(d, _)| format!("cast_{s}_{d}")))
                .collect(),
            "reduce" => REDUCE_OPS
                .iter()
                .flat_map(|op| floats().map(move |d| format!("reduce_{op}_{d}")))
                .collect(),
            "softmax" => floats()
                .flat_map(|d| [format!("softmax_fwd_{d}"), format!("log_softmax_fwd_{d}")])
                .collect(),
            "layer_norm" => floats().map(|d| format!("layer_norm_fwd_{d}")).collect(),
            _ => vec![
                "amp_non_finite_check_and_unscale".into(),
                "amp_update_scale".into(),
            ],
        }
    }
}
