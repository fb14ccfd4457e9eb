//! The device kernels as CUDA C++ sources, compiled at run time with NVRTC.
//!
//! One template per op family, instantiated by macro for every dtype under a C name
//! `<family>_<op>_<dtype>` (`unary_exp_bf16`, `cast_f64_f16`, ...). The sources need no
//! header: float16 and bfloat16 are 16-bit structs converted with PTX `cvt` (float16)
//! and bit operations (bfloat16, round to nearest even, NaN kept quiet), so NVRTC alone
//! compiles them on any machine. 16-bit types compute in float32, float64 in float64.
//! The prelude and the conversions live in `amp_tensor::cuda::sources`.

pub use amp_tensor::cuda::sources::{Module, ALL_TYPES, CAST, CAST_MODULE, PRELUDE};

/// Dtype suffixes of the floating instantiations, with their device type names.
pub const FLOAT_TYPES: [(&str, &str); 4] = [
    ("f16", "amp_half"),
    ("bf16", "amp_bf16"),
    ("f32", "float"),
    ("f64", "double"),
];

/// Binary elementwise ops of [`BINARY`].
/// The last two are backward formulas with no binary op of their own: `threshold_bwd`
/// (`a` where `b > 0`, else 0: ReLU's backward) and `gelu_bwd` (`a (Φ(b) + b φ(b))`).
pub const BINARY_OPS: [&str; 9] = [
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "pow",
    "threshold_bwd",
    "gelu_bwd",
];

/// Row reductions of [`REDUCE`].
pub const REDUCE_OPS: [&str; 4] = ["sum", "mean", "max", "min"];

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
/* threshold_backward at 0: x <= 0 gives 0 (a NaN x keeps the gradient, as PyTorch). */
struct Op_threshold_bwd { template <typename A> static __device__ A apply(A g, A x) { return (x <= A(0)) ? A(0) : g; } };
struct Op_gelu_bwd {
    template <typename A> static __device__ A apply(A g, A x) {
        A cdf = A(0.5) * (A(1) + amp_erf(x * A(0.70710678118654752440)));
        A pdf = amp_exp(A(-0.5) * x * x) * A(0.39894228040143267794);
        return g * (cdf + x * pdf);
    }
};

template <typename T, typename Op>
__device__ void binary_impl(const T* __restrict__ a, StridedArg as, const T* __restrict__ b, StridedArg bs,
                            T* __restrict__ out, i64 n) {
    AMP_GRID_STRIDE(i, n) {
        out[i] = Num<T>::store(Op::apply(Num<T>::load(a[amp_offset(as, i)]), Num<T>::load(b[amp_offset(bs, i)])));
    }
}
/* With a scalar operand passed by value (`s op a` when `rev`): no upload, no sync. */
template <typename T, typename Op>
__device__ void binary_s_impl(const T* __restrict__ a, StridedArg as, double s, T* __restrict__ out, i64 n, int rev) {
    typedef typename Num<T>::acc A;
    A sv = (A)s;
    AMP_GRID_STRIDE(i, n) {
        A x = Num<T>::load(a[amp_offset(as, i)]);
        out[i] = Num<T>::store(rev ? Op::apply(sv, x) : Op::apply(x, sv));
    }
}
#define AMP_BINARY(T, SUF, OP) \
    extern "C" __global__ void binary_##OP##_##SUF(const T* a, StridedArg as, const T* b, StridedArg bs, T* out, i64 n) { \
        binary_impl<T, Op_##OP>(a, as, b, bs, out, n); } \
    extern "C" __global__ void binary_s_##OP##_##SUF(const T* a, StridedArg as, double s, T* out, i64 n, int rev) { \
        binary_s_impl<T, Op_##OP>(a, as, s, out, n, rev); }
AMP_FOR_FLOATS(AMP_BINARY, add) AMP_FOR_FLOATS(AMP_BINARY, sub) AMP_FOR_FLOATS(AMP_BINARY, mul)
AMP_FOR_FLOATS(AMP_BINARY, div) AMP_FOR_FLOATS(AMP_BINARY, maximum) AMP_FOR_FLOATS(AMP_BINARY, minimum)
AMP_FOR_FLOATS(AMP_BINARY, pow) AMP_FOR_FLOATS(AMP_BINARY, threshold_bwd) AMP_FOR_FLOATS(AMP_BINARY, gelu_bwd)
"#;

/// Row reductions: a contiguous `[rows, n]` input to `rows` outputs, accumulated in
/// float32 for 16-bit types (float64 for float64), NaN-propagating max/min; `mean`
/// divides the sum by `n` in the accumulation type.
///
/// * `reduce_<op>_<dtype>`: one block per row (enough rows to fill the device).
/// * `reduce_part_<op>_<dtype>` then `reduce_fin_<op>_<dtype>`: few long rows. Each row
///   is cut into `splits` equal chunks, one block each, whose results go to a partial
///   buffer in the accumulation type; the second kernel folds each row's partials in
///   order (`mean`'s first pass is the sum's). The cut depends only on `rows` and `n`
///   (the host's `split_count`), so a result does not depend on the device.
pub const REDUCE: &str = r#"
/* Fold x[lo..hi) of one row into the block's value: each thread takes every
   blockDim.x-th element; unrolled so that several loads are in flight. */
template <typename T, typename R>
__device__ typename Num<T>::acc fold_range(const T* __restrict__ row, i64 lo, i64 hi) {
    typedef typename Num<T>::acc A;
    A v = R::identity();
#pragma unroll 4
    for (i64 j = lo + threadIdx.x; j < hi; j += blockDim.x) v = R::op(v, Num<T>::load(row[j]));
    return block_reduce<A, R>(v);
}
template <typename T, template <typename> class R, bool MEAN>
__device__ void reduce_rows(const T* __restrict__ x, T* __restrict__ out, i64 rows, i64 n) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        A v = fold_range<T, R<A> >(x + r * n, 0, n);
        if (threadIdx.x == 0) out[r] = Num<T>::store(MEAN ? v / (A)n : v);
    }
}
template <typename T, template <typename> class R>
__device__ void reduce_part(const T* __restrict__ x, typename Num<T>::acc* __restrict__ part, i64 rows, i64 n,
                            i64 splits) {
    typedef typename Num<T>::acc A;
    i64 chunk = (n + splits - 1) / splits;
    for (i64 b = blockIdx.x; b < rows * splits; b += gridDim.x) {
        i64 r = b / splits, lo = (b - r * splits) * chunk;
        i64 hi = lo + chunk < n ? lo + chunk : n;
        A v = fold_range<T, R<A> >(x + r * n, lo, hi);
        if (threadIdx.x == 0) part[b] = v;
    }
}
template <typename T, template <typename> class R, bool MEAN>
__device__ void reduce_fin(const typename Num<T>::acc* __restrict__ part, T* __restrict__ out, i64 rows, i64 n,
                           i64 splits) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        A v = fold_range<A, R<A> >(part + r * splits, 0, splits);
        if (threadIdx.x == 0) out[r] = Num<T>::store(MEAN ? v / (A)n : v);
    }
}
/* Column reductions of a contiguous [rows, n] input (reduced dims leading, as a bias
   gradient's): part one folds chunks of `chunk` rows of 32 columns per block (32 x 8
   threads, a fixed order), part two each column's partials in chunk order. */
template <typename T, template <typename> class R>
__device__ void reduce_col_part(const T* __restrict__ x, typename Num<T>::acc* __restrict__ part, i64 rows,
                                i64 n, i64 chunk) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[8][33];
    const i64 j = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 lo = (i64)blockIdx.y * chunk;
    const i64 hi = lo + chunk < rows ? lo + chunk : rows;
    A a = R<A>::identity();
    if (j < n)
        for (i64 r = lo + threadIdx.y; r < hi; r += 8) a = R<A>::op(a, Num<T>::load(x[r * n + j]));
    sh[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        A t = sh[0][threadIdx.x];
        for (int k = 1; k < 8; ++k) t = R<A>::op(t, sh[k][threadIdx.x]);
        part[(i64)blockIdx.y * n + j] = t;
    }
}
template <typename T, template <typename> class R, bool MEAN>
__device__ void reduce_col_fin(const typename Num<T>::acc* __restrict__ part, T* __restrict__ out, i64 rows, i64 n,
                               i64 chunks) {
    typedef typename Num<T>::acc A;
    AMP_GRID_STRIDE(j, n) {
        A t = part[j];
        for (i64 c = 1; c < chunks; ++c) t = R<A>::op(t, part[c * n + j]);
        out[j] = Num<T>::store(MEAN ? t / (A)rows : t);
    }
}
#define AMP_REDUCE(T, SUF, OP, R, MEAN) \
    extern "C" __global__ void reduce_col_part_##OP##_##SUF(const T* x, Num<T>::acc* part, i64 rows, i64 n, i64 chunk) { \
        reduce_col_part<T, R>(x, part, rows, n, chunk); } \
    extern "C" __global__ void reduce_col_fin_##OP##_##SUF(const Num<T>::acc* part, T* out, i64 rows, i64 n, i64 chunks) { \
        reduce_col_fin<T, R, MEAN>(part, out, rows, n, chunks); } \
    extern "C" __global__ void reduce_##OP##_##SUF(const T* x, T* out, i64 rows, i64 n) { reduce_rows<T, R, MEAN>(x, out, rows, n); } \
    extern "C" __global__ void reduce_part_##OP##_##SUF(const T* x, Num<T>::acc* part, i64 rows, i64 n, i64 splits) { \
        reduce_part<T, R>(x, part, rows, n, splits); } \
    extern "C" __global__ void reduce_fin_##OP##_##SUF(const Num<T>::acc* part, T* out, i64 rows, i64 n, i64 splits) { \
        reduce_fin<T, R, MEAN>(part, out, rows, n, splits); }
#define AMP_REDUCE_SUM(T, SUF, _) AMP_REDUCE(T, SUF, sum, RSum, false)
#define AMP_REDUCE_MEAN(T, SUF, _) AMP_REDUCE(T, SUF, mean, RSum, true)
#define AMP_REDUCE_MAX(T, SUF, _) AMP_REDUCE(T, SUF, max, RMax, false)
#define AMP_REDUCE_MIN(T, SUF, _) AMP_REDUCE(T, SUF, min, RMin, false)
AMP_FOR_FLOATS(AMP_REDUCE_SUM, 0) AMP_FOR_FLOATS(AMP_REDUCE_MEAN, 0)
AMP_FOR_FLOATS(AMP_REDUCE_MAX, 0) AMP_FOR_FLOATS(AMP_REDUCE_MIN, 0)
"#;

/// Softmax and log-softmax over the rows of a contiguous `[rows, n]` input (the host
/// moves the softmax dimension last), max-subtracted, accumulated in float32 for
/// 16-bit types, and their backwards from the output, one block per row; the input
/// optionally scaled and causally masked first (attention's probabilities, one launch
/// for what the math path does in three).
pub const SOFTMAX: &str = r#"
// Row r holds scale * x; with `causal` (the rows of each [causal, n] matrix) its
// entries past column r % causal are masked: probability 0 (log-softmax -inf).
template <typename T, bool LOG>
__device__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, i64 rows, i64 n, double scale_d,
                             i64 causal) {
    typedef typename Num<T>::acc A;
    const A scale = (A)scale_d;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        T* orow = out + r * n;
        const i64 len = causal > 0 && r % causal + 1 < n ? r % causal + 1 : n;
        A m = RMax<A>::identity();
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) m = RMax<A>::op(m, Num<T>::load(row[j]) * scale);
        m = block_reduce<A, RMax<A> >(m);
        A s = A(0);
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += amp_exp(Num<T>::load(row[j]) * scale - m);
        s = block_reduce<A, RSum<A> >(s);
        if (LOG) {
            A ls = amp_log(s);
            for (i64 j = threadIdx.x; j < n; j += blockDim.x)
                orow[j] = Num<T>::store(j < len ? Num<T>::load(row[j]) * scale - m - ls : amp_neg_inf(A(0)));
        } else {
            for (i64 j = threadIdx.x; j < n; j += blockDim.x)
                orow[j] = Num<T>::store(j < len ? amp_exp(Num<T>::load(row[j]) * scale - m) / s : A(0));
        }
    }
}
// The backward from the forward's output y: softmax scale y (g - sum g y), log-softmax
// scale (g - exp(y) sum g); the row sum and every product in the accumulation type,
// one rounding per output.
template <typename T, bool LOG>
__device__ void softmax_bwd_rows(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ out, i64 rows,
                                 i64 n, double scale_d) {
    typedef typename Num<T>::acc A;
    const A scale = (A)scale_d;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* gr = g + r * n;
        const T* yr = y + r * n;
        T* orow = out + r * n;
        A s = A(0);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x)
            s += LOG ? Num<T>::load(gr[j]) : Num<T>::load(gr[j]) * Num<T>::load(yr[j]);
        s = block_reduce<A, RSum<A> >(s);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
            A gj = Num<T>::load(gr[j]), yj = Num<T>::load(yr[j]);
            A d = LOG ? gj - amp_exp(yj) * s : yj * (gj - s);
            orow[j] = Num<T>::store(scale == A(1) ? d : d * scale);
        }
    }
}
#define AMP_SOFTMAX(T, SUF, _) \
    extern "C" __global__ void softmax_fwd_##SUF(const T* x, T* out, i64 rows, i64 n, double scale, i64 causal) { \
        softmax_rows<T, false>(x, out, rows, n, scale, causal); } \
    extern "C" __global__ void log_softmax_fwd_##SUF(const T* x, T* out, i64 rows, i64 n, double scale, i64 causal) { \
        softmax_rows<T, true>(x, out, rows, n, scale, causal); } \
    extern "C" __global__ void softmax_bwd_##SUF(const T* g, const T* y, T* out, i64 rows, i64 n, double scale) { \
        softmax_bwd_rows<T, false>(g, y, out, rows, n, scale); } \
    extern "C" __global__ void log_softmax_bwd_##SUF(const T* g, const T* y, T* out, i64 rows, i64 n, double scale) { \
        softmax_bwd_rows<T, true>(g, y, out, rows, n, scale); }
AMP_FOR_FLOATS(AMP_SOFTMAX, 0)
"#;

/// Layer norm forward over the last `n` elements of each row of a contiguous
/// `[rows, n]` input: two-pass mean and biased variance in the accumulation type,
/// optional weight and bias (null pointers when absent), and the per-row mean and
/// `rstd = 1/sqrt(var + eps)` written in the accumulation type (float32 for 16-bit).
/// Its backward from those statistics: the input gradient, one block per row
/// (`layer_norm_bwd`), and the weight's and bias's gradients as column sums over chunks
/// of rows (`layer_norm_bwd_part`), then over the chunks in order (`layer_norm_bwd_fin`):
/// three launches, each sum in an order fixed by the shape alone.
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
/* The input gradient, one block per row: with xhat = (x - mean) rstd and dxhat = g w
   (g without a weight; the weight in the accumulation type), gi = (dxhat - mean(dxhat)
   - xhat mean(dxhat xhat)) rstd in the accumulation type, rounded once. */
template <typename T>
__device__ void layer_norm_bwd_rows(const T* __restrict__ g, const T* __restrict__ x,
                                    const typename Num<T>::acc* __restrict__ w,
                                    const typename Num<T>::acc* __restrict__ mean,
                                    const typename Num<T>::acc* __restrict__ rstd, T* __restrict__ gi,
                                    i64 rows, i64 n) {
    typedef typename Num<T>::acc A;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* grow = g + r * n;
        const T* xrow = x + r * n;
        T* orow = gi + r * n;
        const A mu = mean[r], rs = rstd[r];
        A s1 = A(0), s2 = A(0);
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
            A d = Num<T>::load(grow[j]);
            if (w) d *= w[j];
            s1 += d;
            s2 += d * ((Num<T>::load(xrow[j]) - mu) * rs);
        }
        const A m1 = block_reduce<A, RSum<A> >(s1) / (A)n;
        const A m2 = block_reduce<A, RSum<A> >(s2) / (A)n;
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
            A d = Num<T>::load(grow[j]);
            if (w) d *= w[j];
            const A xh = (Num<T>::load(xrow[j]) - mu) * rs;
            orow[j] = Num<T>::store((d - m1 - xh * m2) * rs);
        }
    }
}
/* The weight's and bias's gradients, part one: over the rows [c chunk, (c + 1) chunk) of
   chunk c = blockIdx.y, the column sums of g xhat and of g for the 32 columns of the
   block (blockDim (32, 8): each of the 8 thread rows takes every 8th row, then thread
   row 0 adds the 8 in order), into partials [chunks, n] of the accumulation type. */
template <typename T>
__device__ void layer_norm_bwd_part(const T* __restrict__ g, const T* __restrict__ x,
                                    const typename Num<T>::acc* __restrict__ mean,
                                    const typename Num<T>::acc* __restrict__ rstd,
                                    typename Num<T>::acc* __restrict__ pw, typename Num<T>::acc* __restrict__ pb,
                                    i64 rows, i64 n, i64 chunk) {
    typedef typename Num<T>::acc A;
    __shared__ A sw[8][33];
    __shared__ A sb[8][33];
    const i64 j = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 lo = (i64)blockIdx.y * chunk;
    const i64 hi = lo + chunk < rows ? lo + chunk : rows;
    A aw = A(0), ab = A(0);
    if (j < n) {
        for (i64 r = lo + threadIdx.y; r < hi; r += 8) {
            const A gv = Num<T>::load(g[r * n + j]);
            aw += gv * ((Num<T>::load(x[r * n + j]) - mean[r]) * rstd[r]);
            ab += gv;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        A tw = A(0), tb = A(0);
        for (int k = 0; k < 8; ++k) { tw += sw[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
        pw[(i64)blockIdx.y * n + j] = tw;
        pb[(i64)blockIdx.y * n + j] = tb;
    }
}
/* Part two: each column's partials added in chunk order. */
template <typename A>
__device__ void layer_norm_bwd_fin(const A* __restrict__ pw, const A* __restrict__ pb, A* __restrict__ gw,
                                   A* __restrict__ gb, i64 chunks, i64 n) {
    AMP_GRID_STRIDE(j, n) {
        A tw = A(0), tb = A(0);
        for (i64 c = 0; c < chunks; ++c) { tw += pw[c * n + j]; tb += pb[c * n + j]; }
        gw[j] = tw;
        gb[j] = tb;
    }
}
#define AMP_LAYER_NORM(T, SUF, _) \
    extern "C" __global__ void layer_norm_fwd_##SUF(const T* x, const T* w, const T* b, double eps, T* out, \
        Num<T>::acc* mean, Num<T>::acc* rstd, i64 rows, i64 n) { layer_norm_rows<T>(x, w, b, eps, out, mean, rstd, rows, n); } \
    extern "C" __global__ void layer_norm_bwd_##SUF(const T* g, const T* x, const Num<T>::acc* w, \
        const Num<T>::acc* mean, const Num<T>::acc* rstd, T* gi, i64 rows, i64 n) { \
        layer_norm_bwd_rows<T>(g, x, w, mean, rstd, gi, rows, n); } \
    extern "C" __global__ void layer_norm_bwd_part_##SUF(const T* g, const T* x, const Num<T>::acc* mean, \
        const Num<T>::acc* rstd, Num<T>::acc* pw, Num<T>::acc* pb, i64 rows, i64 n, i64 chunk) { \
        layer_norm_bwd_part<T>(g, x, mean, rstd, pw, pb, rows, n, chunk); }
AMP_FOR_FLOATS(AMP_LAYER_NORM, 0)
extern "C" __global__ void layer_norm_bwd_fin_f32(const float* pw, const float* pb, float* gw, float* gb, i64 chunks,
    i64 n) { layer_norm_bwd_fin<float>(pw, pb, gw, gb, chunks, n); }
extern "C" __global__ void layer_norm_bwd_fin_f64(const double* pw, const double* pb, double* gw, double* gb,
    i64 chunks, i64 n) { layer_norm_bwd_fin<double>(pw, pb, gw, gb, chunks, n); }
"#;

/// The fused optimizer updates: one pass over a parameter (any float storage type),
/// its gradient (the parameter's type) and its state buffers (the compute type: float32,
/// or float64 for float64 parameters), with exactly the operations of the host update
/// in its order. Products and sums are rounded one by one (`__fmul_rn`, `__fadd_rn`:
/// no contraction into FMAs), division and square root are IEEE, so a float32 or
/// float64 parameter gets the host's bits. Flags: 1 maximize, 2 weight decay,
/// 4 decoupled (AdamW) / nesterov (SGD), 8 first step (SGD: the buffer starts as the
/// step's direction), 16 momentum (SGD).
///
/// * `sgd_step`: PyTorch's SGD with momentum, dampening, Nesterov, weight decay.
/// * `adam_multi`: Adam / AdamW over a device table of chunks of many parameters of
///   mixed dtypes in one launch (PyTorch's `fused=True`), each chunk pointing at its
///   parameter's hyper-parameter row: `step_size` is `lr / bc1`, `bc2_sqrt` is
///   `sqrt(bc2)` (each parameter's own step count); amsgrad where `vmax` is not null;
///   every gradient is divided by `*grad_scale` on the device when `grad_scale` is not
///   null (the scaling-aware step: no host read of the scale).
pub const OPTIM: &str = r#"
__device__ __forceinline__ float rmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rmul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float radd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double radd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float rmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double rmax(double a, double b) { return fmax(a, b); }

template <typename P>
__device__ void sgd_impl(P* __restrict__ p, const P* __restrict__ g, typename Num<P>::acc* __restrict__ buf,
                         i64 n, double lr, double momentum, double damp, double wd, int flags) {
    typedef typename Num<P>::acc A;
    const A LR = (A)(-lr), M = (A)momentum, D = (A)damp, WD = (A)wd;
    AMP_GRID_STRIDE(i, n) {
        A pi = Num<P>::load(p[i]);
        A d = Num<P>::load(g[i]);
        if (flags & 1) d = -d;
        if (flags & 2) d = radd(d, rmul(WD, pi));
        if (flags & 16) {
            A b = (flags & 8) ? d : radd(rmul(buf[i], M), rmul(D, d));
            buf[i] = b;
            d = (flags & 4) ? radd(d, rmul(M, b)) : b;
        }
        p[i] = Num<P>::store(radd(pi, rmul(LR, d)));
    }
}

// One entry of the multi-tensor Adam table: a chunk of one parameter (its tensors'
// addresses at the chunk's first element), the chunk's length, the parameter's storage
// dtype (0 float16, 1 bfloat16, 2 float32, 3 float64) and its hyper-parameters' row.
struct AdamChunk { u64 p, g, m, v, vmax; i64 len, dtype, hyper; };
// One parameter's step constants (its own bias corrections) and flags.
struct AdamHyper { double step_size, bc2_sqrt, beta1, beta2, eps, wd, decay; i64 flags; };

template <typename P>
__device__ void adam_chunk(const AdamChunk& c, const AdamHyper& h, const float* __restrict__ grad_scale) {
    typedef typename Num<P>::acc A;
    P* __restrict__ p = (P*)c.p;
    const P* __restrict__ g = (const P*)c.g;
    A* __restrict__ m = (A*)c.m;
    A* __restrict__ v = (A*)c.v;
    A* __restrict__ vmax = (A*)c.vmax;
    const int flags = (int)h.flags;
    const A SS = (A)h.step_size, BS = (A)h.bc2_sqrt, EPS = (A)h.eps, WD = (A)h.wd, DEC = (A)h.decay;
    const A OB1 = radd(A(1), -(A)h.beta1), B2 = (A)h.beta2, OB2 = radd(A(1), -(A)h.beta2);
    const A GS = grad_scale ? (A)(*grad_scale) : A(1);
    for (i64 i = threadIdx.x; i < c.len; i += blockDim.x) {
        A gi = Num<P>::load(g[i]);
        if (grad_scale) gi = gi / GS;
        if (flags & 1) gi = -gi;
        A pi = Num<P>::load(p[i]);
        if (flags & 2) {
            if (flags & 4) pi = Num<P>::load(Num<P>::store(rmul(pi, DEC)));
            else gi = radd(gi, rmul(WD, pi));
        }
        A mi = radd(m[i], rmul(radd(gi, -m[i]), OB1));
        m[i] = mi;
        A vi = radd(rmul(v[i], B2), rmul(rmul(OB2, gi), gi));
        v[i] = vi;
        if (vmax) { vi = rmax(vmax[i], vi); vmax[i] = vi; }
        A den = radd(amp_sqrt(vi) / BS, EPS);
        p[i] = Num<P>::store(radd(pi, -(rmul(SS, mi) / den)));
    }
}

// Every chunk of the table, a block per chunk at a time, the parameters of mixed dtypes.
extern "C" __global__ void adam_multi(const AdamChunk* __restrict__ chunks, i64 nchunks,
                                      const AdamHyper* __restrict__ hypers, const float* grad_scale) {
    for (i64 c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const AdamChunk ch = chunks[c];
        const AdamHyper h = hypers[ch.hyper];
        switch (ch.dtype) {
            case 0: adam_chunk<amp_half>(ch, h, grad_scale); break;
            case 1: adam_chunk<amp_bf16>(ch, h, grad_scale); break;
            case 2: adam_chunk<float>(ch, h, grad_scale); break;
            default: adam_chunk<double>(ch, h, grad_scale); break;
        }
    }
}

#define AMP_OPTIM(T, SUF, _) \
    extern "C" __global__ void sgd_step_##SUF(T* p, const T* g, Num<T>::acc* buf, i64 n, double lr, \
        double momentum, double damp, double wd, int flags) { sgd_impl<T>(p, g, buf, n, lr, momentum, damp, wd, flags); }
AMP_FOR_FLOATS(AMP_OPTIM, 0)
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

/// Comparisons of [`INDEX`] (bool results).
pub const CMP_OPS: [&str; 6] = ["eq", "ne", "lt", "le", "gt", "ge"];

/// Selection, comparison and indexing: `where` and the comparisons over strided
/// operands (every storage dtype; 16-bit compared as float32), `take` (one element per
/// precomputed offset: gather), `take_rows` (whole rows by index: index_select,
/// embedding), and their accumulating inverses with atomic adds into a float32 or
/// float64 buffer, `put_add` (scatter_add) and `add_rows` (embedding backward, index
/// `skip` left out: the padding row).
pub const INDEX: &str = r#"
#define AMP_FOR_ALL(M, ...) \
    M(amp_half, f16, __VA_ARGS__) M(amp_bf16, bf16, __VA_ARGS__) M(float, f32, __VA_ARGS__) \
    M(double, f64, __VA_ARGS__) M(int, i32, __VA_ARGS__) M(i64, i64, __VA_ARGS__) M(unsigned char, bool, __VA_ARGS__)

template <typename T> struct CmpT { static __device__ __forceinline__ T v(T x) { return x; } };
template <> struct CmpT<amp_half> { static __device__ __forceinline__ float v(amp_half x) { return h2f(x); } };
template <> struct CmpT<amp_bf16> { static __device__ __forceinline__ float v(amp_bf16 x) { return b2f(x); } };
template <> struct CmpT<unsigned char> { static __device__ __forceinline__ int v(unsigned char x) { return x != 0; } };
struct Cmp_eq { template <typename A> static __device__ bool f(A a, A b) { return a == b; } };
struct Cmp_ne { template <typename A> static __device__ bool f(A a, A b) { return a != b; } };
struct Cmp_lt { template <typename A> static __device__ bool f(A a, A b) { return a < b; } };
struct Cmp_le { template <typename A> static __device__ bool f(A a, A b) { return a <= b; } };
struct Cmp_gt { template <typename A> static __device__ bool f(A a, A b) { return a > b; } };
struct Cmp_ge { template <typename A> static __device__ bool f(A a, A b) { return a >= b; } };

#define AMP_SELECT(T, SUF, _) \
    extern "C" __global__ void where_##SUF(const unsigned char* c, StridedArg cs, const T* a, StridedArg as, \
                                            const T* b, StridedArg bs, T* out, i64 n) { \
        AMP_GRID_STRIDE(p, n) { out[p] = c[amp_offset(cs, p)] ? a[amp_offset(as, p)] : b[amp_offset(bs, p)]; } } \
    extern "C" __global__ void take_##SUF(const T* x, const i64* offs, T* out, i64 n) { \
        AMP_GRID_STRIDE(p, n) { out[p] = x[offs[p]]; } } \
    extern "C" __global__ void take_rows_##SUF(const T* x, const i64* idx, T* out, i64 nidx, i64 n, i64 inner, i64 total) { \
        AMP_GRID_STRIDE(p, total) { \
            i64 i = p % inner, j = (p / inner) % nidx, o = p / (inner * nidx); \
            out[p] = x[(o * n + idx[j]) * inner + i]; } }
#define AMP_CMP(T, SUF, OP) \
    extern "C" __global__ void cmp_##OP##_##SUF(const T* a, StridedArg as, const T* b, StridedArg bs, unsigned char* out, i64 n) { \
        AMP_GRID_STRIDE(p, n) { out[p] = Cmp_##OP::f(CmpT<T>::v(a[amp_offset(as, p)]), CmpT<T>::v(b[amp_offset(bs, p)])) ? 1 : 0; } }
#define AMP_ACCUMULATE(T, SUF) \
    extern "C" __global__ void put_add_##SUF(const T* src, const i64* offs, T* out, i64 n) { \
        AMP_GRID_STRIDE(p, n) { atomicAdd(out + offs[p], src[p]); } } \
    extern "C" __global__ void add_rows_##SUF(const T* src, const i64* idx, T* out, i64 nidx, i64 n, i64 inner, i64 total, i64 skip) { \
        AMP_GRID_STRIDE(p, total) { \
            i64 i = p % inner, j = (p / inner) % nidx, o = p / (inner * nidx); \
            if (idx[j] != skip) atomicAdd(out + (o * n + idx[j]) * inner + i, src[p]); } }

AMP_FOR_ALL(AMP_SELECT, _)
AMP_FOR_ALL(AMP_CMP, eq) AMP_FOR_ALL(AMP_CMP, ne) AMP_FOR_ALL(AMP_CMP, lt)
AMP_FOR_ALL(AMP_CMP, le) AMP_FOR_ALL(AMP_CMP, gt) AMP_FOR_ALL(AMP_CMP, ge)
AMP_ACCUMULATE(float, f32) AMP_ACCUMULATE(double, f64)
"#;

/// The floating dtype suffixes.
fn floats() -> impl Iterator<Item = &'static str> {
    FLOAT_TYPES.iter().map(|(s, _)| *s)
}

/// `<family>_<op>_<dtype>` for every op and floating dtype.
fn per_op(family: &str, ops: &[&str]) -> Vec<String> {
    ops.iter()
        .flat_map(|op| floats().map(move |d| format!("{family}_{op}_{d}")))
        .collect()
}

/// Every module, in a fixed order: the prelude's conversions ([`CAST_MODULE`], launched
/// by `amp_tensor`) and this crate's families.
pub const MODULES: [Module; 9] = [
    Module {
        name: "unary",
        body: UNARY,
        kernels: || per_op("unary", UNARY_OPS),
    },
    Module {
        name: "binary",
        body: BINARY,
        kernels: || {
            [
                per_op("binary", &BINARY_OPS),
                per_op("binary_s", &BINARY_OPS),
            ]
            .concat()
        },
    },
    CAST_MODULE,
    Module {
        name: "reduce",
        body: REDUCE,
        kernels: || {
            [
                "reduce",
                "reduce_part",
                "reduce_fin",
                "reduce_col_part",
                "reduce_col_fin",
            ]
            .iter()
            .flat_map(|f| per_op(f, &REDUCE_OPS))
            .collect()
        },
    },
    Module {
        name: "softmax",
        body: SOFTMAX,
        kernels: || {
            floats()
                .flat_map(|d| {
                    [
                        "softmax_fwd",
                        "log_softmax_fwd",
                        "softmax_bwd",
                        "log_softmax_bwd",
                    ]
                    .map(|f| format!("{f}_{d}"))
                })
                .collect()
        },
    },
    Module {
        name: "layer_norm",
        body: LAYER_NORM,
        kernels: || {
            let mut names: Vec<String> = floats()
                .flat_map(|d| {
                    [
                        format!("layer_norm_fwd_{d}"),
                        format!("layer_norm_bwd_{d}"),
                        format!("layer_norm_bwd_part_{d}"),
                    ]
                })
                .collect();
            names.extend([
                "layer_norm_bwd_fin_f32".into(),
                "layer_norm_bwd_fin_f64".into(),
            ]);
            names
        },
    },
    Module {
        name: "index",
        body: INDEX,
        kernels: || {
            let all = || ALL_TYPES.iter().map(|(s, _)| *s);
            let mut names: Vec<String> = all()
                .flat_map(|d| {
                    [
                        format!("where_{d}"),
                        format!("take_{d}"),
                        format!("take_rows_{d}"),
                    ]
                })
                .collect();
            for op in CMP_OPS {
                names.extend(all().map(|d| format!("cmp_{op}_{d}")));
            }
            for d in ["f32", "f64"] {
                names.extend([format!("put_add_{d}"), format!("add_rows_{d}")]);
            }
            names
        },
    },
    Module {
        name: "optim",
        body: OPTIM,
        kernels: || {
            let mut names: Vec<String> = floats().map(|d| format!("sgd_step_{d}")).collect();
            names.push("adam_multi".into());
            names
        },
    },
    Module {
        name: "amp",
        body: AMP,
        kernels: || {
            vec![
                "amp_non_finite_check_and_unscale".into(),
                "amp_update_scale".into(),
            ]
        },
    },
];

/// The module named `name`.
pub fn module(name: &str) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.name == name)
}
