//! The matmul family: `mm`, `bmm`, `matmul`, `mv`, `dot`, `outer` and the fused
//! `addmm`, `addbmm`, `baddbmm`, `addmv`, `addr`, with PyTorch's shape rules and
//! messages.
//!
//! float32 and float64 go straight to a matrix-multiply kernel with the operands'
//! strides (a transposed or sliced operand is not copied, except a column-major left
//! operand of a product of at least [`LHS_COPY_WORK`] multiply-adds, which faer reads
//! at half speed): `faer`'s for products of at least [`FAER_WORK`] multiply-adds (its
//! x86 kernels use AVX-512 where the CPU has it, chosen at run time), and for smaller
//! ones whose output is at least [`FAER_MIN_SIDE`] on both sides or whose `B` is
//! column-major (`on_faer`); the `gemm` crate's for the rest (thin outputs, where it
//! is faster).
//! A large single product is cut into blocks of output columns (or rows), each
//! multiplied sequentially on one rayon thread (`Blocks`).
//! On CPUs with AVX2 but no AVX-512, large float32 products run on the 16-bit
//! ladder's AVX2 tiles instead (see below).
//!
//! 16-bit products run on the fastest [`Kernel16`] of the CPU (the kernel ladder, see
//! `native16.rs`): bfloat16 on AMX tiles (`tdpbf16ps`) where the CPU has AMX-BF16 and
//! Linux grants the tile state, else on `vdpbf16ps` where it has AVX-512 BF16, float16 (and
//! bfloat16 without it) on float32 FMA tiles where it has AVX-512, else on 6-row AVX2 FMA
//! tiles where it has AVX2, FMA and F16C — on all, operands are packed straight from their 16-bit storage and strides, the float32 sums stay in
//! registers and are rounded once, with `alpha` and `beta * input` applied on the way
//! out. Elsewhere, and for products too thin for a tile, the operands are widened to
//! float32 (vectorised; for a cut product block by block, on the block's thread),
//! multiplied by the float32 kernel, and rounded once at the end; so is the
//! `beta * input` term of the fused ops.
//! [`with_kernel16`] forces a kernel for tests and benchmarks. Integer tensors use a
//! simple wrapping kernel (not a hot path).
//!
//! Every operation reduces to one plan: `batch` products of an `m×k` by a `k×n`
//! strided matrix, each matrix found at a per-batch storage offset (so broadcast batch
//! dimensions cost nothing), optionally summed over the batch (`addbmm`) and added to
//! `beta * input`.
//!
//! # Which path a size takes (the cost model, calibrated by `cargo xtask bench --sweep`)
//! - Up to `SMALL_WORK` (16³) multiply-adds, and up to `DIRECT_WORK` (32×64×32) when
//!   `B`'s rows are contiguous, the direct kernel (`small.rs`: eight vector
//!   accumulators of up to eight output rows, no packing, no allocation): `gemm`
//!   allocates and zeroes 4 KiB per call, more than such a product costs. 16-bit
//!   products run on it reading their operands in place (`direct16`).
//! - Products under `PARALLEL_WORK` (96³) and batches under `BATCH_PARALLEL_WORK`
//!   (256K multiply-adds in all) stay on the calling thread: below that a wake-up costs
//!   more than the second core gives.
//! - A larger single product is cut into 2 or 2×threads blocks of output columns (or
//!   rows), one `parallel::for_each` task each running faer sequentially — faster here
//!   than faer's own barrier-synchronised split, which is never used; a batch of small
//!   products, or of at least two products per thread whatever their size, is one
//!   parallel loop over the batch (a `[32, 1024, 64]` attention `bmm` ran 9% faster
//!   in float32, 10% in bfloat16 than with each product cut over the threads).
//! - The 16-bit packing kernels start at 16³ (`native16::chosen`): a 8×32 tile with the
//!   A panel packed in 8 rows and B in 32-column strips straight from their strides
//!   (16×16 register transposes for row-major A and column-major B), strips packed
//!   lazily by the first task that needs them, tasks taken from a shared counter. On
//!   AMX the block is 32×32 (four accumulator tiles), and products with fewer than 16
//!   rows stay on the `vdpbf16ps` tile. On AVX2 the tile is 6×32; plain products up
//!   to 32×64×32 multiply-adds stay on the direct kernel there (`direct16_work`:
//!   widening for it is faster at those sizes), and a packed `B` of over
//!   `AVX2_BLOCK_KN` words (4 MiB) is multiplied in column blocks of that size, each by
//!   every row block before the next. A batch of 16-bit products that runs one whole
//!   product per task skips the AVX2 tiles (each product widened by blocks of rows for
//!   faer's kernel, `per_product16`: 25–45% faster on attention-shaped `bmm` at T =
//!   192..1024 on a Zen 3 EPYC).
//! - On CPUs with AVX2 but no AVX-512, float32 products of at least `AVX2_F32_WORK`
//!   (2²⁸) multiply-adds with every side at least 512 run on the AVX2 tiles too, their
//!   words copied instead of widened and the sums stored unrounded: faer cuts such a
//!   long inner dimension into blocks and stores and reloads its sums between them
//!   (1024³: 173 against 159 GFLOP/s, 2048³: 178 against 158 on a Zen 3 EPYC).

use amp_tensor::half::{bf16, f16};
use std::cell::RefCell;
use std::mem::MaybeUninit;

use amp_tensor::{
    broadcast_shapes, cast_into, cast_into_uninit, cast_slice, gather_cast, promote_types, DType,
    Element, Error, Layout, Result, Tensor, PARALLEL_THRESHOLD,
};
use gemm::Parallelism;

use crate::compute::{ensure_same_device, FirstError, Real};
use amp_tensor::parallel::SendPtr;
use amp_tensor::pool::{try_collect, try_vec_with_capacity, try_zeroed};

mod native16;
mod small;
pub use native16::{kernel16, with_kernel16, Kernel16};
use small::small_product;

/// Products (and batches of products) with fewer multiply-adds than this run on the
/// calling thread. The cost model behind it, calibrated by `cargo xtask bench --sweep`
/// on 2-core AVX-512 machines: a worker woken by [`amp_tensor::parallel::for_each`]
/// joins 5–20 µs after the caller starts, and one core multiplies float32 at about
/// 100 GFLOP/s, so a split pays only from about 96³ multiply-adds (17 µs on one core);
/// at 64³ it made `mm` 2–3× slower than the single-threaded product.
const PARALLEL_WORK: usize = 96 * 96 * 96;

/// Batches of small products with fewer multiply-adds in all than this run on the
/// calling thread; larger ones are one parallel loop over the batch (whole products per
/// task, no packing shared between threads, so a split pays earlier than for one product).
const BATCH_PARALLEL_WORK: usize = 256 * 1024;

/// Products with at least this many multiply-adds use `faer`'s kernel; smaller ones
/// (down to 16³; smaller ones a direct loop) use it too when `on_faer` says so, else
/// `gemm`'s.
pub const FAER_WORK: usize = 64 * 64 * 64;

/// Below [`FAER_WORK`], products whose output has at least this many rows and columns
/// use `faer`'s kernel. Measured on one AVX-512 core (hot operands, GFLOP/s faer/gemm):
/// 32×64×32 108/74, 32×32×32 87/66, 24×24×24 50/50, 16×64×16 52/65.
pub const FAER_MIN_SIDE: usize = 32;

/// Whether a float32/float64 product of an `m×k` by a `k×n` matrix runs on `faer`'s
/// kernel (else `gemm`'s, or the direct kernel, see [`direct`]): from [`FAER_WORK`]
/// multiply-adds on, and below it when both output sides reach [`FAER_MIN_SIDE`] or
/// `B` is column-major (`A·Bᵀ`, a linear layer's forward), which `gemm` reads at
/// 0.4–0.8× of faer's speed at every size measured (16³: 13 against 32 GFLOP/s,
/// 16×64×16: 35 against 45).
fn on_faer(m: usize, n: usize, k: usize, b: &Side) -> bool {
    let work = m * n * k;
    work >= FAER_WORK || (!direct(m, n, k, b) && (m.min(n) >= FAER_MIN_SIDE || b.column_major()))
}

/// Products with at most this many multiply-adds use the direct kernel
/// (`small_product`) whatever their layout: `gemm` allocates and zeroes a 4 KiB buffer
/// per call, which costs more than the whole product at these sizes.
pub const SMALL_WORK: usize = 16 * 16 * 16;

/// Products with at most this many multiply-adds whose `B` has contiguous rows use the
/// direct kernel too, where the CPU has its vector form (`small::vector_kernel`): it
/// packs nothing, and below this size packing costs more than it saves. Measured on
/// one AVX-512 core, float32, µs per product, direct against `gemm`/faer: 16×64×16
/// 0.48/1.25, 24³ 0.65/1.47, 32³ 0.83/1.67, 32×64×32 1.36/2.22, 8×64×64 1.28/1.38,
/// 64×64×8 2.18/1.95. A `B` with strided rows is copied first, which at these sizes
/// costs more than `gemm`'s packing (8×64×64: 4.9 against 1.3 µs).
pub const DIRECT_WORK: usize = 32 * 64 * 32;

/// Whether a float32/float64 product runs on the direct kernel ([`SMALL_WORK`],
/// [`DIRECT_WORK`]).
fn direct(m: usize, n: usize, k: usize, b: &Side) -> bool {
    let work = m * n * k;
    work <= SMALL_WORK || (work <= DIRECT_WORK && b.cs == 1 && small::vector_kernel())
}

/// In a batched product, matrices with at least this many multiply-adds are each
/// multiplied by all threads; smaller ones are spread over the threads by batch.
const BIG_WORK: usize = 192 * 192 * 192;

/// Whether a batch of products runs whole products per task even when each is at
/// least [`BIG_WORK`]: with two or more per thread the tasks share nothing and each
/// keeps its own operands in its core's cache, instead of every product being cut over
/// all threads (whose tasks share each other's packing).
fn whole_entries(batch: usize) -> bool {
    batch >= 2 * rayon::current_num_threads()
}

/// Per-batch storage offsets (a single matrix needs no allocation).
#[derive(Debug, Clone)]
enum Offsets {
    One(usize),
    Many(Vec<usize>),
}

impl std::ops::Deref for Offsets {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Offsets::One(o) => std::slice::from_ref(o),
            Offsets::Many(v) => v,
        }
    }
}

/// Where each matrix of one operand sits in its buffer.
#[derive(Debug, Clone)]
struct Side {
    /// Storage offset of matrix `i` of the batch.
    offsets: Offsets,
    /// Row stride (elements).
    rs: usize,
    /// Column stride (elements).
    cs: usize,
}

impl Side {
    /// Whether the matrix's columns are its contiguous runs (a transposed row-major
    /// matrix: unit row stride, and a column stride other than 1).
    fn column_major(&self) -> bool {
        self.rs == 1 && self.cs != 1
    }

    /// One row-major matrix of `cols` columns at offset 0 (a packed copy).
    fn row_major(cols: usize) -> Side {
        Side {
            offsets: Offsets::One(0),
            rs: cols,
            cs: 1,
        }
    }

    /// A single 2-D matrix view.
    fn matrix(t: &Tensor) -> Side {
        Side {
            offsets: Offsets::One(t.layout().offset()),
            rs: t.strides()[0],
            cs: t.strides()[1],
        }
    }

    /// A 1-D tensor seen as a `1×len` row.
    fn row(t: &Tensor) -> Side {
        Side {
            offsets: Offsets::One(t.layout().offset()),
            rs: 0,
            cs: t.strides()[0],
        }
    }

    /// A 1-D tensor seen as a `len×1` column.
    fn column(t: &Tensor) -> Side {
        Side {
            offsets: Offsets::One(t.layout().offset()),
            rs: t.strides()[0],
            cs: 0,
        }
    }

    /// The matrices of a layout `[batch..., rows, cols]` (batch dims in row-major
    /// order; zero strides for broadcast dims are fine). [`Error::OutOfMemory`] when the
    /// batch's offsets cannot be allocated.
    fn batched(l: &Layout) -> Result<Side> {
        let r = l.rank();
        let batch = Layout::new(
            l.dims()[..r - 2].to_vec(),
            l.strides()[..r - 2].to_vec(),
            l.offset(),
        );
        Ok(Side {
            offsets: Offsets::Many(try_collect(batch.elem_count(), batch.offsets())?),
            rs: l.strides()[r - 2],
            cs: l.strides()[r - 1],
        })
    }

    /// The first matrix moved `delta` elements further into the buffer (a block of it).
    fn shifted(&self, delta: usize) -> Side {
        self.shifted_to(self.offsets[0] + delta)
    }

    /// The same matrices, transposed.
    fn transposed(&self) -> Side {
        Side {
            offsets: self.offsets.clone(),
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// A single matrix at `offset` with this side's strides.
    fn shifted_to(&self, offset: usize) -> Side {
        Side {
            offsets: Offsets::One(offset),
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// One past the largest buffer index a `rows×cols` matrix of this side touches
    /// (0 when it touches none), and the smallest one.
    fn span(&self, rows: usize, cols: usize) -> (usize, usize) {
        if rows == 0 || cols == 0 || self.offsets.is_empty() {
            return (0, 0);
        }
        let extent = (rows - 1) * self.rs + (cols - 1) * self.cs;
        let lo = *self.offsets.iter().min().expect("non-empty");
        let hi = *self.offsets.iter().max().expect("non-empty") + extent + 1;
        (lo, hi)
    }
}

/// One product to compute: `out[i] = beta * input[i] + alpha * (a[i] @ b[i])` for each
/// batch entry `i` (or `out = beta * input + alpha * Σ_i a[i] @ b[i]` when `reduce`).
#[derive(Clone)]
struct Plan<'a> {
    op: &'static str,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    a: &'a Tensor,
    sa: Side,
    b: &'a Tensor,
    sb: Side,
    /// The input of the fused ops, with a layout broadcast to the (unreduced) output.
    input: Option<(&'a Tensor, Layout)>,
    beta: f64,
    alpha: f64,
    reduce: bool,
    /// Float32 operands read as if first cast to this 16-bit dtype, the product's, on
    /// this path ([`round_path`]; `mm_as`, `bmm_as`, see [`rounded`]).
    round: Option<(DType, HalfPath)>,
    out_dims: Vec<usize>,
}

/// An error with PyTorch's text word for word (the text names the op where PyTorch's does).
fn err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::refused(op, msg)
}

/// The dtype check of `mm`/`bmm`/`mv` (each with PyTorch's text for it).
fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    ensure_same_device(op, &[a, b])?;
    let (da, db) = (a.dtype(), b.dtype());
    if da == db {
        return Ok(());
    }
    Err(err(
        op,
        match op {
            "bmm" | "baddbmm" => format!(
                "expected scalar type {} but found {}",
                da.scalar_type_name(),
                db.scalar_type_name()
            ),
            "mv" | "addmv" => format!(
                "addmv input tensors must have the same dtype, but got {}, {}, and {}",
                db.scalar_type_name(),
                da.scalar_type_name(),
                db.scalar_type_name()
            ),
            "addmm" => format!(
                "mat1 and mat2 must have the same dtype, but got {} and {}",
                da.scalar_type_name(),
                db.scalar_type_name()
            ),
            _ => format!(
                "expected m1 and m2 to have the same dtype, but got: {} != {}",
                da.cpp_type_name(),
                db.cpp_type_name()
            ),
        },
    ))
}

/// The fused ops' input has the product's device and dtype (`self and mat2 ...`).
fn input_dtype(op: &'static str, input: &Tensor, like: &Tensor) -> Result<()> {
    ensure_same_device(op, &[input, like])?;
    if input.dtype() == like.dtype() {
        return Ok(());
    }
    Err(err(
        op,
        format!(
            "self and mat2 must have the same dtype, but got {} and {}",
            input.dtype().scalar_type_name(),
            like.dtype().scalar_type_name()
        ),
    ))
}

/// The fused ops' input: same device and dtype as the product, broadcastable to `dims`.
fn input_layout(op: &'static str, input: &Tensor, like: &Tensor, dims: &[usize]) -> Result<Layout> {
    input_dtype(op, input, like)?;
    input.layout().broadcast_as(dims).map_err(|e| match e {
        Error::InvalidArgument { op: "expand", msg } => err(
            op,
            format!(
                "expand({}{{{:?}}}, size={dims:?}): {msg}",
                input.dtype().tensor_type_name(),
                input.dims()
            ),
        ),
        e => e,
    })
}

fn check_rank(
    op: &'static str,
    t: &Tensor,
    rank: usize,
    msg: impl FnOnce() -> String,
) -> Result<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(err(op, msg()))
    }
}

// ----- public API -----------------------------------------------------------------------

/// Matrix product of two 2-D tensors (`torch.mm`): `(n×m) @ (m×p) → (n×p)`.
///
/// Both operands must have the same floating or integer dtype; the result has it too.
/// float16/bfloat16 accumulate in float32 and are rounded once.
///
/// # Errors
/// Wrong ranks (`self must be a matrix`), operands of different dtypes or devices,
/// mismatched inner sizes (`mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)`),
/// or a bool dtype.
pub fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    mm_plan("mm", a, b, None, 0.0, 1.0).and_then(run)
}

/// `beta * input + alpha * (m1 @ m2)` (`torch.addmm`); `input` broadcasts to the
/// product's shape. With `beta == 0` the input is ignored (NaN and inf included).
///
/// # Errors
/// As [`mm`], plus an input of another dtype or not broadcastable to the product, and
/// non-integral `beta`/`alpha` for integer tensors.
pub fn addmm(input: &Tensor, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    mm_plan("addmm", m1, m2, Some(input), beta, alpha).and_then(run)
}

fn mm_plan<'a>(
    op: &'static str,
    a: &'a Tensor,
    b: &'a Tensor,
    input: Option<&'a Tensor>,
    beta: f64,
    alpha: f64,
) -> Result<Plan<'a>> {
    check_rank(op, a, 2, || {
        format!("{op}: self must be a matrix, got {}-D tensor", a.rank())
    })?;
    check_rank(op, b, 2, || {
        format!("{op}: mat2 must be a matrix, got {}-D tensor", b.rank())
    })?;
    if let Some(i) = input {
        // addmm checks its input against mat2 first.
        input_dtype(op, i, b)?;
    }
    same_dtype(op, a, b)?;
    let (da, db) = (a.dims(), b.dims());
    if da[1] != db[0] {
        return Err(err(
            op,
            format!(
                "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                da[0], da[1], db[0], db[1]
            ),
        ));
    }
    let out_dims = vec![da[0], db[1]];
    let input = match input {
        Some(i) => Some((i, input_layout(op, i, b, &out_dims)?)),
        None => None,
    };
    Ok(Plan {
        op,
        dtype: a.dtype(),
        m: da[0],
        n: db[1],
        k: da[1],
        a,
        sa: Side::matrix(a),
        b,
        sb: Side::matrix(b),
        input,
        beta,
        alpha,
        reduce: false,
        round: None,
        out_dims,
    })
}

/// `mm(a.to_dtype(dtype), b.to_dtype(dtype))`, bit for bit, without the cast tensors
/// where the kernel can round float32 operands as it reads them (the direct kernel, the
/// AVX-512 packing kernels): autocast's `mm` when nothing needs a gradient. Operands that
/// are not float32 on the CPU, or a `dtype` that is not bfloat16 or float16, are cast
/// first.
///
/// # Errors
/// As [`mm`] on the cast operands.
pub fn mm_as(a: &Tensor, b: &Tensor, dtype: DType) -> Result<Tensor> {
    product_as(a, b, dtype, mm, |a, b| mm_plan("mm", a, b, None, 0.0, 1.0))
}

/// `bmm(a.to_dtype(dtype), b.to_dtype(dtype))`, bit for bit, as [`mm_as`].
///
/// # Errors
/// As [`bmm`] on the cast operands.
pub fn bmm_as(a: &Tensor, b: &Tensor, dtype: DType) -> Result<Tensor> {
    product_as(a, b, dtype, bmm, |a, b| {
        bmm_plan("bmm", a, b, None, 0.0, 1.0, false)
    })
}

/// `op(a.to_dtype(dtype), b.to_dtype(dtype))` (`plan` is `op`'s plan): read as `dtype`
/// by the kernel where [`round_path`] finds one that can, else cast first.
fn product_as<'a>(
    a: &'a Tensor,
    b: &'a Tensor,
    dtype: DType,
    op: fn(&Tensor, &Tensor) -> Result<Tensor>,
    plan: impl FnOnce(&'a Tensor, &'a Tensor) -> Result<Plan<'a>>,
) -> Result<Tensor> {
    let f32_cpu = |t: &Tensor| t.dtype() == DType::F32 && t.device().is_cpu();
    if f32_cpu(a) && f32_cpu(b) {
        let mut p = plan(a, b)?;
        let path = match dtype {
            DType::BF16 => round_path::<bf16>(&p),
            DType::F16 => round_path::<f16>(&p),
            _ => None,
        };
        if let Some(path) = path {
            p.round = Some((dtype, path));
            return run(p);
        }
    }
    op(&a.to_dtype(dtype)?, &b.to_dtype(dtype)?)
}

/// The path [`half()`] takes for the plan's operands cast to `T` (contiguous, as
/// `Tensor::to_dtype` makes them: a row-major `B`), when that path can read the
/// float32 operands in place instead, rounding each value to `T` as it reads it: the
/// direct kernel (whose `B` with strided rows is copied into a stack buffer of
/// `small::PACK` values), or the AVX-512 packing kernels. `None` elsewhere (the AMX
/// and AVX2 tiles, the widened paths): the operands are then cast first.
fn round_path<T: native16::Packed>(p: &Plan<'_>) -> Option<HalfPath> {
    match half_path::<T>(p, &Side::row_major(p.n)) {
        HalfPath::Direct if p.sb.cs == 1 || p.k * p.n <= small::PACK => Some(HalfPath::Direct),
        HalfPath::Packed(kernel) if native16::rounds_f32(kernel) => Some(HalfPath::Packed(kernel)),
        _ => None,
    }
}

/// A plan whose float32 operands are read as if first cast to `T` (`p.round`), on
/// `path`, the one [`round_path`] found: the bits of [`half()`] on the cast operands
/// (the same kernel, the same words, the same sums), with no cast tensor and no pass
/// over the operands of its own. Measured on a Zen 4 EPYC (AVX-512 BF16), 2 threads, medians
/// of 15 rounds, µs, float32 / casts then the bfloat16 product / this: `mm` 8³
/// 0.20 / 0.42 / 0.25, 16³ 0.25 / 0.53 / 0.35, 96³ 9.6 / 10.8 / 8.1, 128³
/// 19.9 / 21.8 / 14.1, 256³ 151 / 101 / 86; `bmm` `[32, n, 64] × [32, 64, n]` n = 8
/// 5.9 / 8.3 / 6.7, 64 85 / 67 / 62, 256 1300 / 767 / 743.
fn rounded<T: native16::Packed + small::Half16>(p: &Plan<'_>, path: HalfPath) -> Result<Tensor> {
    match path {
        HalfPath::Direct => with_operands::<f32, _>(p, |a, b| {
            let (a, b) = (small::Rounded::slice(a), small::Rounded::slice(b));
            direct16_from::<T, small::Rounded<T>>(p, a, b)
        })?,
        HalfPath::Packed(kernel) => packed16_from::<T, f32>(p, kernel),
        _ => unreachable!("`round_path` gives only the direct and packing paths"),
    }
}

/// Batched matrix product of two 3-D tensors (`torch.bmm`):
/// `(B×n×m) @ (B×m×p) → (B×n×p)`.
///
/// # Errors
/// Operands that are not 3-D, of different dtypes or devices, or whose batch or inner
/// sizes differ (PyTorch's `Expected size for first two dimensions of batch2 tensor
/// ...`).
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    bmm_plan("bmm", a, b, None, 0.0, 1.0, false).and_then(run)
}

/// `beta * input + alpha * bmm(batch1, batch2)` (`torch.baddbmm`); `input` broadcasts
/// to `B×n×p`. With `beta == 0` the input is ignored.
///
/// # Errors
/// As [`bmm`], plus an input of another dtype or not broadcastable to the product.
pub fn baddbmm(
    input: &Tensor,
    batch1: &Tensor,
    batch2: &Tensor,
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    bmm_plan("baddbmm", batch1, batch2, Some(input), beta, alpha, false).and_then(run)
}

/// `beta * input + alpha * Σ_i batch1[i] @ batch2[i]` (`torch.addbmm`); `input`
/// broadcasts to `n×p`. The sum over the batch accumulates in the compute type
/// (float32 for 16-bit floats) and is rounded once.
///
/// # Errors
/// As [`bmm`], plus an input of another dtype or not broadcastable to `n×p`.
pub fn addbmm(
    input: &Tensor,
    batch1: &Tensor,
    batch2: &Tensor,
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    bmm_plan("addbmm", batch1, batch2, Some(input), beta, alpha, true).and_then(run)
}

fn bmm_plan<'a>(
    op: &'static str,
    a: &'a Tensor,
    b: &'a Tensor,
    input: Option<&'a Tensor>,
    beta: f64,
    alpha: f64,
    reduce: bool,
) -> Result<Plan<'a>> {
    check_rank(op, a, 3, || "batch1 must be a 3D tensor".into())?;
    check_rank(op, b, 3, || "batch2 must be a 3D tensor".into())?;
    if a.dtype() == DType::Bool {
        return Err(Error::UnsupportedDType {
            op,
            dtype: DType::Bool,
        });
    }
    same_dtype(op, a, b)?;
    let (da, db) = (a.dims(), b.dims());
    if da[0] != db[0] || da[2] != db[1] {
        return Err(err(
            op,
            format!(
                "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
                da[0], da[2], db[0], db[1]
            ),
        ));
    }
    let out_dims = if reduce {
        vec![da[1], db[2]]
    } else {
        vec![da[0], da[1], db[2]]
    };
    let input = match input {
        Some(i) => Some((i, input_layout(op, i, b, &out_dims)?)),
        None => None,
    };
    Ok(Plan {
        op,
        dtype: a.dtype(),
        m: da[1],
        n: db[2],
        k: da[2],
        a,
        sa: Side::batched(a.layout())?,
        b,
        sb: Side::batched(b.layout())?,
        input,
        beta,
        alpha,
        reduce,
        round: None,
        out_dims,
    })
}

/// Matrix-vector product (`torch.mv`): `(n×m) @ (m) → (n)`.
///
/// # Errors
/// Wrong ranks (`vector + matrix @ vector expected, ...`), dtype or device mismatch, or
/// a length mismatch (`size mismatch, got input (2), mat (2x3), vec (4)`).
pub fn mv(mat: &Tensor, vec: &Tensor) -> Result<Tensor> {
    mv_plan("mv", mat, vec, None, 0.0, 1.0).and_then(run)
}

/// `beta * input + alpha * (mat @ vec)` (`torch.addmv`); `input` broadcasts to `n`.
///
/// # Errors
/// As [`mv`], plus an input of another dtype or not broadcastable to `n`.
pub fn addmv(input: &Tensor, mat: &Tensor, vec: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    mv_plan("addmv", mat, vec, Some(input), beta, alpha).and_then(run)
}

fn mv_plan<'a>(
    op: &'static str,
    mat: &'a Tensor,
    vec: &'a Tensor,
    input: Option<&'a Tensor>,
    beta: f64,
    alpha: f64,
) -> Result<Plan<'a>> {
    let in_rank = input.map_or(1, |i| i.rank());
    if mat.rank() != 2 || vec.rank() != 1 || in_rank > 1 {
        return Err(err(
            op,
            format!(
                "vector + matrix @ vector expected, got {}, {}, {}",
                in_rank,
                mat.rank(),
                vec.rank()
            ),
        ));
    }
    same_dtype(op, mat, vec)?;
    let (dm, n) = (mat.dims(), vec.dims()[0]);
    if dm[1] != n {
        let got_in = input.map_or(dm[0], |i| i.elem_count());
        return Err(err(
            op,
            format!(
                "size mismatch, got input ({got_in}), mat ({}x{}), vec ({n})",
                dm[0], dm[1]
            ),
        ));
    }
    let out_dims = vec![dm[0]];
    let input = match input {
        Some(i) => Some((i, input_layout(op, i, mat, &out_dims)?)),
        None => None,
    };
    Ok(Plan {
        op,
        dtype: mat.dtype(),
        m: dm[0],
        n: 1,
        k: n,
        a: mat,
        sa: Side::matrix(mat),
        b: vec,
        sb: Side::column(vec),
        input,
        beta,
        alpha,
        reduce: false,
        round: None,
        out_dims,
    })
}

/// Inner product of two 1-D tensors of the same length and dtype (`torch.dot`); a
/// 0-dim result.
///
/// # Errors
/// Operands that are not 1-D, of different dtypes or devices, or of different lengths.
pub fn dot(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "dot";
    if a.rank() != 1 || b.rank() != 1 {
        return Err(err(
            OP,
            format!(
                "1D tensors expected, but got {}D and {}D tensors",
                a.rank(),
                b.rank()
            ),
        ));
    }
    ensure_same_device(OP, &[a, b])?;
    if a.dtype() != b.dtype() {
        return Err(err(
            OP,
            format!(
                "dot : expected both vectors to have same dtype, but found {} and {}",
                a.dtype(),
                b.dtype()
            ),
        ));
    }
    let (na, nb) = (a.elem_count(), b.elem_count());
    if na != nb {
        return Err(err(
            OP,
            format!(
                "inconsistent tensor size, expected tensor [{na}] and src [{nb}] to have the same number of elements, but got {na} and {nb} elements respectively"
            ),
        ));
    }
    run(Plan {
        op: OP,
        dtype: a.dtype(),
        m: 1,
        n: 1,
        k: na,
        a,
        sa: Side::row(a),
        b,
        sb: Side::column(b),
        input: None,
        beta: 0.0,
        alpha: 1.0,
        reduce: false,
        round: None,
        out_dims: vec![],
    })
}

/// Outer product of two 1-D tensors (`torch.outer`): `(n) ⊗ (m) → (n×m)`. As in
/// PyTorch (where it is `a[:, None] * b`), mixed dtypes promote.
///
/// # Errors
/// Operands that are not 1-D or on different devices.
pub fn outer(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "outer";
    check_rank(OP, a, 1, || {
        format!("outer: Expected 1-D argument self, but got {}-D", a.rank())
    })?;
    check_rank(OP, b, 1, || {
        format!("outer: Expected 1-D argument vec2, but got {}-D", b.rank())
    })?;
    ensure_same_device(OP, &[a, b])?;
    let dtype = promote_types(a.dtype(), b.dtype());
    let (a, b) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
    run(outer_plan(OP, &a, &b, None, 0.0, 1.0)?)
}

/// `beta * input + alpha * outer(vec1, vec2)` (`torch.addr`); `input` broadcasts to
/// `n×m`.
///
/// # Errors
/// Vectors that are not 1-D or of different dtypes, an input of another dtype or not
/// broadcastable to `n×m`.
pub fn addr(input: &Tensor, vec1: &Tensor, vec2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    const OP: &str = "addr";
    check_rank(OP, vec1, 1, || {
        format!(
            "addr: Expected 1-D argument vec1, but got {}-D",
            vec1.rank()
        )
    })?;
    check_rank(OP, vec2, 1, || {
        format!(
            "addr: Expected 1-D argument vec2, but got {}-D",
            vec2.rank()
        )
    })?;
    same_dtype(OP, vec1, vec2)?;
    run(outer_plan(OP, vec1, vec2, Some(input), beta, alpha)?)
}

fn outer_plan<'a>(
    op: &'static str,
    a: &'a Tensor,
    b: &'a Tensor,
    input: Option<&'a Tensor>,
    beta: f64,
    alpha: f64,
) -> Result<Plan<'a>> {
    let out_dims = vec![a.elem_count(), b.elem_count()];
    let input = match input {
        Some(i) => Some((i, input_layout(op, i, b, &out_dims)?)),
        None => None,
    };
    Ok(Plan {
        op,
        dtype: a.dtype(),
        m: out_dims[0],
        n: out_dims[1],
        k: 1,
        a,
        sa: Side::column(a),
        b,
        sb: Side::row(b),
        input,
        beta,
        alpha,
        reduce: false,
        round: None,
        out_dims,
    })
}

/// PyTorch's `torch.matmul` (`a @ b`) for every rank combination:
///
/// - 1-D · 1-D: [`dot`] (a 0-dim result);
/// - 2-D · 2-D: [`mm`]; 2-D · 1-D: [`mv`]; 1-D · 2-D: the vector is taken as a `1×n`
///   matrix and the added dimension removed;
/// - otherwise a batched product: a 1-D operand gets a dimension prepended (first
///   operand) or appended (second), removed from the result; the batch dimensions
///   (all but the last two) broadcast against each other.
///
/// An N-D first operand (N ≥ 3) with a 1-D/2-D second one whose batch dimensions can be
/// merged without copying is folded into a single `mm`/`mv`, as PyTorch does.
///
/// # Errors
/// A 0-dim operand, dtype or device mismatch, mismatched inner sizes, or batch
/// dimensions that do not broadcast; the messages are those of the op the case reduces
/// to, as in PyTorch.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "matmul";
    let (ra, rb) = (a.rank(), b.rank());
    if ra == 0 || rb == 0 {
        return Err(err(
            OP,
            format!(
                "both arguments to matmul need to be at least 1D, but they are {ra}D and {rb}D"
            ),
        ));
    }
    match (ra, rb) {
        (1, 1) => return dot(a, b),
        (2, 1) => return mv(a, b),
        (1, 2) => return mm(&a.unsqueeze(0usize)?, b)?.squeeze(0usize),
        (2, 2) => return mm(a, b),
        _ => {}
    }
    let k = a.dims()[ra - 1];
    if ra >= 3 && rb <= 2 && k > 0 && a.layout().view_strides(&[a.elem_count() / k, k]).is_some() {
        let folded = a.view([-1i64, k as i64])?;
        let mut out_dims = a.dims()[..ra - 1].to_vec();
        let r = if rb == 1 {
            mv(&folded, b)?
        } else {
            out_dims.push(b.dims()[1]);
            mm(&folded, b)?
        };
        return r.reshape(out_dims);
    }
    same_dtype(OP, a, b)?;
    // Matrices: a as [.., n, k] (1-D: [1, k]), b as [.., k2, p] (1-D: [k2, 1]).
    let a2 = if ra == 1 {
        a.unsqueeze(0usize)?
    } else {
        a.clone()
    };
    let b2 = if rb == 1 {
        b.unsqueeze(1usize)?
    } else {
        b.clone()
    };
    let (da, db) = (a2.dims(), b2.dims());
    let (n, ka) = (da[da.len() - 2], da[da.len() - 1]);
    let (kb, p) = (db[db.len() - 2], db[db.len() - 1]);
    let batch = broadcast_shapes(OP, &da[..da.len() - 2], &db[..db.len() - 2])?;
    if ka != kb {
        let count: usize = batch.iter().product();
        return Err(err(
            OP,
            format!(
                "Expected size for first two dimensions of batch2 tensor to be: [{count}, {ka}] but got: [{count}, {kb}]."
            ),
        ));
    }
    let la = a2
        .layout()
        .broadcast_as(&[batch.as_slice(), &[n, ka]].concat())?;
    let lb = b2
        .layout()
        .broadcast_as(&[batch.as_slice(), &[kb, p]].concat())?;
    let mut out_dims = batch.clone();
    if ra > 1 {
        out_dims.push(n);
    }
    if rb > 1 {
        out_dims.push(p);
    }
    run(Plan {
        op: OP,
        dtype: a.dtype(),
        m: n,
        n: p,
        k: ka,
        a,
        sa: Side::batched(&la)?,
        b,
        sb: Side::batched(&lb)?,
        input: None,
        beta: 0.0,
        alpha: 1.0,
        reduce: false,
        round: None,
        out_dims,
    })
}

// ----- execution ------------------------------------------------------------------------

fn run(p: Plan<'_>) -> Result<Tensor> {
    crate::compute::on_device!(p.op, [p.a, p.b], run_device(&p));
    match p.round {
        Some((DType::BF16, path)) => return rounded::<bf16>(&p, path),
        Some((DType::F16, path)) => return rounded::<f16>(&p, path),
        _ => {}
    }
    match p.dtype {
        DType::F32 => match native16::chosen(DType::F32, p.m, p.n, p.k, false) {
            Some(kernel) => packed16::<f32>(&p, kernel),
            None => native::<f32>(&p),
        },
        DType::F64 => native::<f64>(&p),
        DType::F16 => half::<f16>(&p),
        DType::BF16 => half::<bf16>(&p),
        DType::I32 => integer::<i32>(&p),
        DType::I64 => integer::<i64>(&p),
        DType::Bool if p.op == "outer" => integer::<bool>(&p),
        dtype => Err(Error::UnsupportedDType {
            op: "addmm_impl_cpu_",
            dtype,
        }),
    }
}

/// A plan on a CUDA device: one strided-batched cuBLAS product (float32 accumulation)
/// reading each operand in place when its matrices allow it (row-major or transposed,
/// batch in arithmetic progression; else a gathered contiguous copy). The input of a
/// fused op is copied into the output for cuBLAS to add (`beta * input + alpha *
/// product` in the compute type, rounded once); the reducing ops sum the batch first
/// and blend after.
#[cfg(feature = "cuda")]
fn run_device(p: &Plan<'_>) -> Result<Tensor> {
    use crate::cuda::route;
    let dev = p.a.device();
    let batch = p.sa.offsets.len().max(p.sb.offsets.len());
    let offsets = |s: &Side| -> Vec<usize> {
        if s.offsets.len() == batch {
            s.offsets.to_vec()
        } else {
            vec![s.offsets[0]; batch]
        }
    };
    let a = route::product_operand(p.a, &offsets(&p.sa), (p.m, p.k), (p.sa.rs, p.sa.cs))?;
    let b = route::product_operand(p.b, &offsets(&p.sb), (p.k, p.n), (p.sb.rs, p.sb.cs))?;
    let input = match &p.input {
        Some((t, layout)) if t.device().is_cpu() && t.rank() == 0 => {
            // A 0-dim host input (PyTorch lets it meet device tensors as a scalar).
            let moved = t.to_device(dev)?;
            let l = Layout::new(layout.dims().to_vec(), vec![0; layout.rank()], 0);
            Some((moved, l))
        }
        Some((t, layout)) => Some(((*t).clone(), layout.clone())),
        None => None,
    };
    if let Some((t, _)) = &input {
        crate::compute::ensure_same_device(p.op, &[p.a, t])?;
    }
    let input = input.as_ref().map(|(t, l)| (t, l));
    let dims = (batch, p.m, p.k, p.n);
    let operands = ((&a.0, a.1), (&b.0, b.1));
    if !p.reduce {
        let out = route::product(operands.0, operands.1, dims, input, p.alpha, p.beta)?;
        return out.reshape(p.out_dims.clone());
    }
    let prod = route::product(operands.0, operands.1, dims, None, 1.0, 0.0)?;
    let wide = prod.to_dtype(route::compute_dtype(p.dtype))?;
    let prod = route::reduce("sum", &wide, &[true, false, false], false)?.to_dtype(p.dtype)?;
    route::blend(&prod.reshape(p.out_dims.clone())?, input, p.beta, p.alpha)
}

/// The input of a fused op, gathered (in row-major output order) and converted to
/// `C`, or `None` when `beta == 0` makes it irrelevant; [`Error::OutOfMemory`] when it
/// cannot be allocated.
fn gathered_input<T: Element, C: Element>(p: &Plan<'_>) -> Result<Option<Vec<C>>> {
    let Some((t, layout)) = p.input.as_ref().filter(|_| p.beta != 0.0) else {
        return Ok(None);
    };
    let st = t.storage();
    gather_cast::<T, C>(T::slice(st.cpu()?).expect("dtype matches storage"), layout).map(Some)
}

/// Number of output elements of a plan (saturating: a count that does not fit fails
/// the output's allocation instead of wrapping).
fn out_len(p: &Plan<'_>) -> usize {
    let batch = if p.reduce { 1 } else { p.sa.offsets.len() };
    batch.saturating_mul(p.m).saturating_mul(p.n)
}

/// f32 / f64: `gemm` reads the operands in place and writes a fresh output.
fn native<C: GemmFloat>(p: &Plan<'_>) -> Result<Tensor> {
    let len = out_len(p);
    let init = gathered_input::<C, C>(p)?;
    let read = init.is_some();
    let mut out = match init {
        Some(v) => v,
        None => try_vec_with_capacity(len)?,
    };
    with_operands::<C, _>(p, |a, b| {
        let beta = C::from_f64c(p.beta);
        let alpha = C::from_f64c(p.alpha);
        gemm_into(
            p,
            a,
            &p.sa,
            b,
            &p.sb,
            &mut out.spare_or_init()[..len],
            read,
            beta,
            alpha,
        );
    })?;
    // SAFETY: `gemm_into` initialised all `len` elements.
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, &p.out_dims)
}

/// f16 / bf16: on the direct kernel when small enough ([`DIRECT16_WORK`]; reading
/// the 16-bit operands in place, [`direct16`], where the CPU has F16C), else on a
/// packing kernel when [`native16::chosen`] picks one, else widened: a batch of
/// products one per task ([`per_product16`]) when it is spread over the threads by
/// entry, a single product or a batch sum whole ([`widened`]).
fn half<T: native16::Packed + small::Half16>(p: &Plan<'_>) -> Result<Tensor> {
    match half_path::<T>(p, &p.sb) {
        HalfPath::Direct => direct16::<T>(p),
        HalfPath::PerProduct => per_product16::<T>(p),
        HalfPath::Packed(kernel) => packed16::<T>(p, kernel),
        HalfPath::Widened => widened::<T>(p),
    }
}

/// The paths of a 16-bit product ([`half()`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HalfPath {
    /// The direct kernel ([`direct16`]).
    Direct,
    /// One product per task, widened per block of rows ([`per_product16`]).
    PerProduct,
    /// A packing kernel ([`packed16`]).
    Packed(Kernel16),
    /// Widened whole ([`widened`]).
    Widened,
}

/// The path [`half()`] takes for plan `p` of `T` operands whose `B` has side `sb`.
fn half_path<T: native16::Packed>(p: &Plan<'_>, sb: &Side) -> HalfPath {
    let (m, n, k) = (p.m, p.n, p.k);
    let input = p.input.is_some() && p.beta != 0.0;
    let fits = [m * k, k * n, m * n].iter().all(|&l| l <= DIRECT16_LEN);
    let direct16_size = m * n * k <= direct16_work(T::DTYPE) && direct(m, n, k, sb);
    let whole = !p.reduce && m > 0 && n > 0 && k > 0;
    let plain = whole && !input;
    if whole && direct16_size && k <= small::PACK && small::vector_kernel16() {
        return HalfPath::Direct;
    }
    if plain && fits && direct16_size && small::vector_kernel() {
        return HalfPath::PerProduct;
    }
    let per_entry = plain && by_entry(p.sa.offsets.len(), m * n * k);
    match native16::chosen(T::DTYPE, m, n, k, per_entry) {
        Some(kernel) => HalfPath::Packed(kernel),
        None if per_entry => HalfPath::PerProduct,
        None => HalfPath::Widened,
    }
}

/// Whether a batch of `batch` products of `work` multiply-adds each is spread over
/// the threads one whole product per task (as `gemm_into` splits float32 batches).
fn by_entry(batch: usize, work: usize) -> bool {
    batch > 1 && (work < BIG_WORK || whole_entries(batch))
}

/// The most multiply-adds a 16-bit product of `dtype` runs on the direct kernel with:
/// [`DIRECT16_WORK`] where the CPU multiplies it faster than float32 (AMX, AVX-512
/// BF16), else as many as a float32 product ([`DIRECT_WORK`]). On float32 FMA tiles the
/// packing costs more than widening at these sizes: on a Zen 3 EPYC (AVX2 tiles),
/// bfloat16 `mm` of 32³ took 1.33 µs widened for the direct kernel against 1.72 on the
/// tiles, and `bmm` of `[32, 32, 64] × [32, 64, 32]` 35 µs against 39; on a Zen 4 EPYC
/// (AVX-512 FMA tiles, float16), that `bmm` ran at 183–185 GFLOP/s on the direct kernel
/// against 130–150 packed, and `mm` of 32³ at 64–75 against 57–59 (two runs each).
fn direct16_work(dtype: DType) -> usize {
    match native16::kernel16(dtype) {
        Some(Kernel16::Avx512Fma | Kernel16::Avx2Fma | Kernel16::Widened) => DIRECT_WORK,
        _ => DIRECT16_WORK,
    }
}

/// The longest operand or output of a 16-bit product on the direct kernel (elements).
const DIRECT16_LEN: usize = 4096;

/// 16-bit products with at most this many multiply-adds (and taken by `direct`) run
/// on the direct kernel (`per_product16`) where the CPU multiplies them faster than
/// float32 (AMX, AVX-512 BF16; see `direct16_work`); larger ones on the packing
/// kernels, faster from there (AMX: `bmm` of `[32, 32, 64] × [32, 64, 32]` in bfloat16
/// took 21 µs on AMX tiles, 30–38 µs on the direct kernel).
pub const DIRECT16_WORK: usize = 16 * 64 * 16;

/// The float32 sums [`per_product16`] keeps of a product at a time (elements): blocks
/// of rows small enough that the sums are rounded into the output from the core's
/// cache.
const SUMS16_LEN: usize = 64 * 1024;

/// f16 / bf16 products of at most [`DIRECT_WORK`] multiply-adds taken by `direct`,
/// without a batch sum, on the direct kernel reading the 16-bit operands in place and
/// rounding each sum as it stores it (`small::direct16`): no widened copy, no scratch
/// buffer. An input term (`addmm`, `baddbmm`; a linear layer's bias) is gathered into
/// the output first and read back by the tiles, `beta · input + alpha · sum` in float32
/// as the packing kernels compute it. Before, those products went to the packing
/// kernels whatever their size: a bfloat16 linear layer's forward and backward of
/// `[16, 16]` took 5.0 µs against float32's 3.7 on a Zen 4 EPYC. A batch of at least [`BATCH_PARALLEL_WORK`]
/// multiply-adds is one parallel loop over its products. The bits are those of the
/// widened path ([`per_product16`]: the same float32 sums, in the same order).
///
/// Measured on a Zen 3 EPYC (AVX2, no AVX-512), float32 time over 16-bit time, widened
/// (`per_product16`, one run) → here (three runs), bfloat16 / float16: `mm` 8³
/// 0.71 / 0.71 → 0.79–0.93 / 0.81–0.90; `bmm` `[32, 8, 64] × [32, 64, 8]` 0.69 / 0.72
/// → 0.72–0.83 / 0.74–0.83, `[32, 32, 64] × [32, 64, 32]` 0.87 / 0.88 → 0.83–0.92 /
/// 0.90–0.99. What is left is the widening itself: each value of `A` once (into a
/// stack buffer), each row of `B` as it is loaded, two instructions per 8 bfloat16
/// values against the float32 kernel's none.
fn direct16<T: Element + small::Half16>(p: &Plan<'_>) -> Result<Tensor> {
    with_operands::<T, _>(p, |a, b| direct16_from::<T, T>(p, a, b))?
}

/// [`direct16`] on the operand slices `a` and `b`, stored as `I` (`T` itself, or float32
/// read as `T`: [`small::Rounded`]).
fn direct16_from<T: Element, I: Direct16In<T>>(p: &Plan<'_>, a: &[I], b: &[I]) -> Result<Tensor> {
    let (m, n, k) = (p.m, p.n, p.k);
    let batch = p.sa.offsets.len();
    let len = out_len(p);
    // The input term (`beta != 0`) is gathered into the output, where the tiles read it
    // back (exactly: it has the output's dtype) and add `beta` times it to each sum.
    let init = gathered_input::<T, T>(p)?;
    let read_dst = init.is_some();
    let mut out: Vec<T> = match init {
        Some(v) => v,
        None => try_vec_with_capacity(len)?,
    };
    let dst = SendPtr(out.spare_or_init().as_mut_ptr().cast::<T>());
    check_bounds(a, &p.sa, m, k);
    check_bounds(b, &p.sb, k, n);
    let one = |i: usize| {
        let product = Product {
            m,
            n,
            k,
            a: (a, &p.sa, i),
            b: (b, &p.sb, i),
            d: dst.at(i * m * n),
            dst_factor: p.beta as f32,
            read_dst,
            alpha: p.alpha as f32,
        };
        // SAFETY: the operands' matrices lie inside `a` and `b` (checked above); `d` is
        // product `i`'s `m×n` block of the output's capacity, written only by this
        // call, and read only when `read_dst` (then initialised with the input above).
        let done = unsafe { I::direct(product) };
        // `direct` takes a `B` with strided rows only up to `SMALL_WORK` multiply-adds
        // (and `rounds` only up to `small::PACK` values), so `k·n ≤ small::PACK`; the
        // CPU has the kernel (checked by the caller).
        assert!(done, "the direct 16-bit kernel declined a product it takes");
    };
    if m * n * k * batch < BATCH_PARALLEL_WORK {
        (0..batch).for_each(one);
    } else {
        amp_tensor::parallel::for_each(batch, &one);
    }
    // SAFETY: every product wrote its `m×n` block: `batch·m·n = len` elements.
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, &p.out_dims)
}

/// The operand storage of the direct 16-bit kernel for a `T` product: `T` itself, or
/// float32 rounded to `T` as it is read ([`small::Rounded`]).
trait Direct16In<T>: Copy + Sync {
    /// [`small::direct16`] or [`small::direct16_rounded`].
    ///
    /// # Safety
    /// As for [`small::direct16`].
    unsafe fn direct(pr: Product<'_, f32, T, Self>) -> bool;
}

impl<T: small::Half16> Direct16In<T> for T {
    unsafe fn direct(pr: Product<'_, f32, T, T>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { small::direct16(pr) }
    }
}

impl<T: small::Half16> Direct16In<T> for small::Rounded<T> {
    unsafe fn direct(pr: Product<'_, f32, T, Self>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { small::direct16_rounded(pr) }
    }
}

/// f16 / bf16 products without an input term or a batch sum, one per task: per
/// product, `B` widened into a pooled float32 buffer, then per block of rows
/// ([`SUMS16_LEN`] sums) `A`'s rows widened beside it, multiplied on the calling
/// thread (the direct kernel where `direct` takes the block, else faer's) and the sums
/// rounded once into the output — the arithmetic of [`widened`], with no batch-sized
/// float32 copies. A batch of at least `BATCH_PARALLEL_WORK` multiply-adds is one
/// parallel loop over its products.
///
/// Small products (up to [`DIRECT16_WORK`], on the direct kernel): before it, `bmm` of
/// `[32, 8, 64] × [32, 64, 8]` took 1.8× as long in bfloat16 (widened whole) as in
/// float32, and `[32, 16, 64] × [32, 64, 16]` 1.9× (on AMX tiles). Batches on the
/// widened path (CPUs without AVX-512): `bmm` of `[32, 2048, 64] × [32, 64, 2048]` in
/// bfloat16 ran at 30 GFLOP/s widened whole (a 512 MiB float32 output written and read
/// back) against 127 in float32, on an AVX2-only EPYC.
fn per_product16<T: Element>(p: &Plan<'_>) -> Result<Tensor> {
    let (m, n, k) = (p.m, p.n, p.k);
    let batch = p.sa.offsets.len();
    let len = out_len(p);
    let mut out: Vec<T> = try_vec_with_capacity(len)?;
    let (sta, stb) = (p.a.storage(), p.b.storage());
    let a = T::slice(sta.cpu()?).expect("dtype matches storage");
    let b = T::slice(stb.cpu()?).expect("dtype matches storage");
    let dst = SendPtr(out.spare_capacity_mut().as_mut_ptr());
    let (sa, sb) = (Side::row_major(k), Side::row_major(n));
    let alpha = p.alpha as f32;
    let rows = (SUMS16_LEN / n.max(1))
        .clamp(MIN_BLOCK, m.max(MIN_BLOCK))
        .min(m);
    // Product `i` with `buf` (at least `k·n + rows·(k + n)` long) as its scratch.
    let one = |i: usize, buf: &mut [f32]| {
        let (wb, rest) = buf.split_at_mut(k * n);
        let (wa, acc) = rest.split_at_mut(rows * k);
        gather_matrix(b, &p.sb.shifted_to(p.sb.offsets[i]), k, n, wb);
        for r0 in (0..m).step_by(rows) {
            let h = rows.min(m - r0);
            let at = p.sa.offsets[i] + r0 * p.sa.rs;
            gather_matrix(a, &p.sa.shifted_to(at), h, k, &mut wa[..h * k]);
            let product = Product {
                m: h,
                n,
                k,
                a: (wa, &sa, 0),
                b: (wb, &sb, 0),
                d: acc.as_mut_ptr(),
                dst_factor: 0.0,
                read_dst: false,
                alpha,
            };
            // SAFETY: `wa` and `wb` hold the row-major matrices `sa` and `sb` describe,
            // and `acc` an `h×n` block (the splits above).
            unsafe {
                if direct(h, n, k, &sb) {
                    small_product(product)
                } else {
                    faer_product(product, Parallelism::None)
                }
            };
            // SAFETY: rows `r0..r0 + h` of product `i` are written by this call only,
            // inside the capacity.
            let d = unsafe { std::slice::from_raw_parts_mut(dst.at((i * m + r0) * n), h * n) };
            cast_into_uninit(&acc[..h * n], d);
        }
    };
    let need = k * n + rows * (k + n);
    if m * n * k * batch < BATCH_PARALLEL_WORK {
        let mut buf = scratch(need)?;
        (0..batch).for_each(|i| one(i, &mut buf));
        recycle(buf);
    } else {
        let failed = FirstError::new();
        amp_tensor::parallel::for_each(batch, &|i| {
            failed.record(scratch(need).map(|mut buf| {
                one(i, &mut buf);
                recycle(buf);
            }))
        });
        failed.into_result()?;
    }
    // SAFETY: every product wrote its `m×n` block: `batch·m·n = len` elements.
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, &p.out_dims)
}

/// f16 / bf16 on a packing kernel: operands packed straight from their storage,
/// float32 sums, one rounding (see [`Kernel16`]).
fn packed16<T: native16::Packed>(p: &Plan<'_>, kernel: Kernel16) -> Result<Tensor> {
    packed16_from::<T, T>(p, kernel)
}

/// [`packed16`] on operands stored as `S`: `T` itself, or float32 that the kernel
/// rounds to `T` as it packs it ([`native16::rounds_f32`]).
fn packed16_from<T: native16::Packed, S: native16::Packed>(
    p: &Plan<'_>,
    kernel: Kernel16,
) -> Result<Tensor> {
    let len = out_len(p);
    let input = gathered_input::<T, f32>(p)?;
    let mut out: Vec<T> = try_vec_with_capacity(len)?;
    with_operands::<S, _>(p, |a, b| {
        let job = native16::Job {
            m: p.m,
            n: p.n,
            k: p.k,
            a,
            sa: &p.sa,
            b,
            sb: &p.sb,
            reduce: p.reduce,
            input: input.as_deref(),
            beta: p.beta as f32,
            alpha: p.alpha as f32,
        };
        native16::product(kernel, &job, &mut out.spare_capacity_mut()[..len])
    })??;
    // SAFETY: `product` wrote all `len` elements.
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, &p.out_dims)
}

/// `f` on the storage slices of a plan's two operands (borrowed once when they share
/// their storage).
fn with_operands<T: Element, R>(p: &Plan<'_>, f: impl FnOnce(&[T], &[T]) -> R) -> Result<R> {
    let ga = p.a.storage();
    let gb = (!p.a.same_storage(p.b)).then(|| p.b.storage());
    let a = T::slice(ga.cpu()?).expect("dtype matches storage");
    let b = match &gb {
        Some(g) => T::slice(g.cpu()?).expect("dtype matches storage"),
        None => a,
    };
    Ok(f(a, b))
}

/// The first `capacity` slots of a vector as possibly uninitialised memory (the
/// initialised prefix included), for kernels that write every slot.
trait SpareOrInit<C> {
    fn spare_or_init(&mut self) -> &mut [MaybeUninit<C>];
}

impl<C> SpareOrInit<C> for Vec<C> {
    fn spare_or_init(&mut self) -> &mut [MaybeUninit<C>] {
        let cap = self.capacity();
        // SAFETY: the allocation holds `cap` slots; viewing initialised elements as
        // `MaybeUninit` is always sound, and callers only write valid values.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr() as *mut MaybeUninit<C>, cap) }
    }
}

/// f16 / bf16: widen the operands (and input) to f32, multiply in f32, round once.
/// The f32 buffers come from a per-thread pool, so repeated products do not pay
/// for fresh (page-faulting) memory each call.
fn widened<T: Element>(p: &Plan<'_>) -> Result<Tensor> {
    if let Some(split) = single_split(p) {
        return widened_blocks::<T>(p, split);
    }
    let len = out_len(p);
    let (wa, sa) = widen::<T>(p.a, &p.sa, p.m, p.k)?;
    let (wb, sb) = widen::<T>(p.b, &p.sb, p.k, p.n)?;
    let mut out32 = scratch(len)?;
    let read = match p.input.as_ref().filter(|_| p.beta != 0.0) {
        Some((t, layout)) => {
            let st = t.storage();
            let src = T::slice(st.cpu()?).expect("dtype matches storage");
            gather_into(src, layout, &mut out32[..len]);
            true
        }
        None => false,
    };
    gemm_into(
        p,
        &wa,
        &sa,
        &wb,
        &sb,
        out32.spare_or_init(),
        read,
        p.beta as f32,
        p.alpha as f32,
    );
    let out = cast_slice::<f32, T>(&out32[..len])?;
    recycle(wa);
    recycle(wb);
    recycle(out32);
    Tensor::from_vec(out, &p.out_dims)
}

/// The block split of a single parallel product (`None` for batches, reductions,
/// products small enough for one thread, and outputs too narrow to cut).
fn single_split(p: &Plan<'_>) -> Option<Blocks> {
    let work = p.m * p.n * p.k;
    let single = p.sa.offsets.len() == 1 && !p.reduce;
    let parallel = !matches!(parallelism(work), Parallelism::None);
    (single && parallel && work >= FAER_WORK)
        .then(|| blocks(p.m, p.n, false))
        .flatten()
}

/// f16 / bf16, one large product: the operand every block reads in full is widened
/// once; then each block, on its own thread, widens its slice of the other operand
/// (and of the input term), multiplies in f32 into a block-sized buffer, and rounds
/// that into the output. The f32 copies a block works on are its own and fit in its
/// core's cache, instead of whole-matrix copies written and read back through memory.
fn widened_blocks<T: Element>(p: &Plan<'_>, split: Blocks) -> Result<Tensor> {
    let (m, n, k) = (p.m, p.n, p.k);
    let (shared, shared_side) = if split.cols {
        widen::<T>(p.a, &p.sa, m, k)?
    } else {
        widen::<T>(p.b, &p.sb, k, n)?
    };
    let input = p
        .input
        .as_ref()
        .filter(|_| p.beta != 0.0)
        .map(|(t, layout)| (*t, matrix_side(layout, m, n)));
    let mut out: Vec<T> = try_vec_with_capacity(m * n)?;
    let dst = SendPtr(out.spare_capacity_mut().as_mut_ptr());
    let starts: Vec<usize> = (0..split.len).step_by(split.size).collect();
    let failed = FirstError::new();
    let run_block = |block: usize| -> Result<()> {
        let start = starts[block];
        let w = split.size.min(split.len - start);
        let ((rows, cols), (r0, c0)) = if split.cols {
            ((m, w), (0, start))
        } else {
            ((w, n), (start, 0))
        };
        let (own, own_side) = if split.cols {
            widen::<T>(p.b, &p.sb.shifted(start * p.sb.cs), k, w)?
        } else {
            widen::<T>(p.a, &p.sa.shifted(start * p.sa.rs), w, k)?
        };
        let mut acc = scratch(rows * cols)?;
        let read = match &input {
            Some((t, side)) => {
                let st = t.storage();
                let src = T::slice(st.cpu()?).expect("dtype matches storage");
                let side = side.shifted(r0 * side.rs + c0 * side.cs);
                gather_matrix(src, &side, rows, cols, &mut acc[..rows * cols]);
                true
            }
            None => false,
        };
        let ((a, sa), (b, sb)) = if split.cols {
            ((&shared, &shared_side), (&own, &own_side))
        } else {
            ((&own, &own_side), (&shared, &shared_side))
        };
        check_bounds(a, sa, rows, k);
        check_bounds(b, sb, k, cols);
        // SAFETY: both operands' matrices lie in their buffers (checked above); `acc`
        // holds `rows*cols` initialised elements.
        unsafe {
            faer_product(
                Product {
                    m: rows,
                    n: cols,
                    k,
                    a: (a, sa, 0),
                    b: (b, sb, 0),
                    d: acc.as_mut_ptr(),
                    dst_factor: p.beta as f32,
                    read_dst: read,
                    alpha: p.alpha as f32,
                },
                Parallelism::None,
            )
        };
        for (r, row) in acc[..rows * cols].chunks(cols).enumerate() {
            // SAFETY: blocks cover disjoint rectangles of the `m×n` output, and each
            // writes only its own (`rows×cols` at `(r0, c0)`), inside the capacity.
            let d = unsafe { std::slice::from_raw_parts_mut(dst.at((r0 + r) * n + c0), cols) };
            cast_into_uninit(row, d);
        }
        recycle(own);
        recycle(acc);
        Ok(())
    };
    amp_tensor::parallel::for_each(starts.len(), &|b| failed.record(run_block(b)));
    recycle(shared);
    // A block that could not allocate its buffers wrote nothing: no output then.
    failed.into_result()?;
    // SAFETY: the blocks wrote every element of the `m×n` output.
    unsafe { out.set_len(m * n) };
    Tensor::from_vec(out, &p.out_dims)
}

/// The input term's layout (broadcast to the output `[m, n]`, `[m]`, `[n]` or `[]`)
/// as a matrix side.
fn matrix_side(layout: &Layout, m: usize, n: usize) -> Side {
    let st = layout.strides();
    let (rs, cs) = match st.len() {
        0 => (0, 0),
        1 if n == 1 && m != 1 => (st[0], 0),
        1 => (0, st[0]),
        _ => (st[st.len() - 2], st[st.len() - 1]),
    };
    Side {
        offsets: Offsets::One(layout.offset()),
        rs,
        cs,
    }
}

/// Widen the `rows×cols` matrix of `side` (its first) into row-major `dst`.
fn gather_matrix<T: Element>(src: &[T], side: &Side, rows: usize, cols: usize, dst: &mut [f32]) {
    let off = side.offsets[0];
    if side.cs == 1 && side.rs == cols {
        // Contiguous: one vectorised cast (short rows cast one by one cost a call each).
        return cast_into(&src[off..off + rows * cols], &mut dst[..rows * cols]);
    }
    for (i, row) in dst.chunks_mut(cols.max(1)).take(rows).enumerate() {
        let start = off + i * side.rs;
        match side.cs {
            1 => cast_into(&src[start..start + cols], row),
            0 => row.fill(src[start].to_f32()),
            cs => {
                for (j, d) in row.iter_mut().enumerate() {
                    *d = src[start + j * cs].to_f32();
                }
            }
        }
    }
}

/// A per-thread pool of reusable buffers (`take_buffer` / `give_buffer`).
type BufferPool<T> = std::thread::LocalKey<RefCell<Vec<Vec<T>>>>;

/// A buffer of at least `len` (stale but initialised) elements from `pool` when one is
/// there; callers use its first `len`. The smallest buffer that holds `len` is taken (so
/// the large ones stay for large requests and nothing regrows), else the largest, grown
/// here; a pooled buffer keeps its full length, so reuse never re-fills it. Buffers are
/// taken out of the pool, not borrowed, so a re-entrant call (rayon tasks run while this
/// thread waits) gets its own. [`Error::OutOfMemory`] when it cannot be grown.
fn take_buffer<T: Copy + Default>(pool: &'static BufferPool<T>, len: usize) -> Result<Vec<T>> {
    let mut v = pool
        .with(|s| {
            let mut s = s.borrow_mut();
            let best = (0..s.len())
                .filter(|&i| s[i].len() >= len)
                .min_by_key(|&i| s[i].len())
                .or_else(|| (0..s.len()).max_by_key(|&i| s[i].len()))?;
            Some(s.swap_remove(best))
        })
        .unwrap_or_default();
    if v.len() < len {
        amp_tensor::pool::try_resize(&mut v, len, T::default())?;
    }
    Ok(v)
}

/// Give a buffer back to `pool`, which keeps at most `count` buffers of at most `max`
/// elements each.
fn give_buffer<T>(pool: &'static BufferPool<T>, v: Vec<T>, count: usize, max: usize) {
    if v.is_empty() || v.len() > max {
        return;
    }
    pool.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < count {
            s.push(v);
        }
    });
}

/// Buffers larger than this (in f32 elements) are not kept in the per-thread pool.
const SCRATCH_MAX: usize = 8 << 20;

thread_local! {
    /// Reusable f32 buffers of this thread (at most three, each at most
    /// [`SCRATCH_MAX`] elements).
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// An f32 buffer of at least `len` elements from this thread's pool (see
/// [`take_buffer`]).
fn scratch(len: usize) -> Result<Vec<f32>> {
    take_buffer(&SCRATCH, len)
}

/// Give a buffer back to this thread's pool.
fn recycle(v: Vec<f32>) {
    give_buffer(&SCRATCH, v, 3, SCRATCH_MAX)
}

/// Widen `src` into `dst` (same length), in parallel for large buffers.
fn widen_into<T: Element>(src: &[T], dst: &mut [f32]) {
    if dst.len() >= PARALLEL_THRESHOLD {
        amp_tensor::parallel::for_each_chunk_mut(dst, 1 << 15, &|i, d| {
            cast_into(&src[i << 15..][..d.len()], d)
        });
    } else {
        cast_into(src, dst);
    }
}

/// Write the elements `layout` selects from `src`, in row-major order, into `dst`.
fn gather_into<T: Element>(src: &[T], layout: &Layout, dst: &mut [f32]) {
    if let Some(r) = layout.contiguous_range() {
        return widen_into(&src[r], dst);
    }
    let mut i = 0;
    layout.for_each_run(|start, len, stride| {
        let d = &mut dst[i..i + len];
        if stride == 1 {
            cast_into(&src[start..start + len], d);
        } else {
            for (j, v) in d.iter_mut().enumerate() {
                *v = src[start + j * stride].to_f32();
            }
        }
        i += len;
    });
}

/// The f32 copy of the part of `t`'s storage a `rows×cols` operand touches, with the
/// side re-based onto it. A dense-enough span is widened as is (strides kept, so a
/// transposed operand stays transposed and a broadcast one is widened once); a sparse
/// view is gathered into contiguous matrices (column-major ones when its columns are
/// the contiguous runs). [`Error::OutOfMemory`] when the copy cannot be allocated.
fn widen<T: Element>(
    t: &Tensor,
    side: &Side,
    rows: usize,
    cols: usize,
) -> Result<(Vec<f32>, Side)> {
    let st = t.storage();
    let src = T::slice(st.cpu()?).expect("dtype matches storage");
    let (lo, hi) = side.span(rows, cols);
    let count = side.offsets.len();
    let numel = count.saturating_mul(rows).saturating_mul(cols);
    if hi - lo <= numel.saturating_mul(2).saturating_add(4096) {
        let mut buf = scratch(hi - lo)?;
        widen_into(&src[lo..hi], &mut buf[..hi - lo]);
        let offsets = Offsets::Many(try_collect(count, side.offsets.iter().map(|&o| o - lo))?);
        return Ok((
            buf,
            Side {
                offsets,
                rs: side.rs,
                cs: side.cs,
            },
        ));
    }
    // Gathered in the orientation whose runs are contiguous in the source.
    let col_major = side.column_major();
    let mut buf = scratch(numel)?;
    let mat = rows * cols;
    amp_tensor::parallel::for_each_chunk_mut(&mut buf[..numel], mat.max(1), &|i, dst| {
        let off = side.offsets[i];
        if col_major {
            gather_matrix(src, &side.shifted_to(off).transposed(), cols, rows, dst)
        } else {
            gather_matrix(src, &side.shifted_to(off), rows, cols, dst)
        }
    });
    let offsets = Offsets::Many(try_collect(count, (0..count).map(|i| i * mat))?);
    let (rs, cs) = if col_major { (1, rows) } else { (cols, 1) };
    Ok((buf, Side { offsets, rs, cs }))
}

/// The float types `gemm` multiplies natively (the kernels' f32 / f64 compute types).
pub(crate) trait GemmFloat:
    Real + std::ops::MulAssign + faer::traits::RealField + small::SmallVector
{
}
impl<T: Real + std::ops::MulAssign + faer::traits::RealField + small::SmallVector> GemmFloat for T {}

fn parallelism(work: usize) -> Parallelism {
    if work < PARALLEL_WORK || rayon::current_num_threads() <= 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(0)
    }
}

/// Assert that every matrix of `side` lies inside `buf` (the raw-pointer calls below
/// rely on it).
fn check_bounds<C>(buf: &[C], side: &Side, rows: usize, cols: usize) {
    let (_, hi) = side.span(rows, cols);
    assert!(hi <= buf.len(), "matmul operand out of bounds");
}

/// `out = beta * out + alpha * A @ B` for every batch entry (or summed over the
/// batch), `out` being row-major `(batch or 1) × m × n`. When `read` is false the
/// output is only written (it may be uninitialised) and `beta` is ignored; when it is
/// true `out` must hold the input term.
#[allow(clippy::too_many_arguments)]
fn gemm_into<C: GemmFloat>(
    p: &Plan<'_>,
    a: &[C],
    sa: &Side,
    b: &[C],
    sb: &Side,
    out: &mut [MaybeUninit<C>],
    read: bool,
    beta: C,
    alpha: C,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    let batch = sa.offsets.len();
    debug_assert_eq!(batch, sb.offsets.len());
    let len = out_len(p);
    assert!(out.len() >= len, "matmul output too small");
    if len == 0 {
        return;
    }
    if k == 0 || batch == 0 {
        // An empty sum: only the input term remains.
        for o in &mut out[..len] {
            let v = if read {
                // SAFETY: `read` means the caller initialised the output.
                let v = unsafe { o.assume_init() };
                v * beta
            } else {
                C::zero()
            };
            o.write(v);
        }
        return;
    }
    check_bounds(a, sa, m, k);
    check_bounds(b, sb, k, n);
    let dst = SendPtr(out.as_mut_ptr() as *mut C);
    let work = m * n * k;
    let one = |i: usize, d: *mut C, dst_factor: C, read_dst: bool, par: Parallelism| {
        let product = Product {
            m,
            n,
            k,
            a: (a, sa, i),
            b: (b, sb, i),
            d,
            dst_factor,
            read_dst,
            alpha,
        };
        if direct(m, n, k, sb) {
            // SAFETY: as for `faer_product` below.
            unsafe { small_product(product) };
            return;
        }
        if on_faer(m, n, k, sb) {
            // SAFETY: as below; faer reads the block only with `Accum::Add`, after it
            // holds initialised values.
            unsafe { faer_product(product, par) };
            return;
        }
        // SAFETY: `d` points at an `m×n` row-major block of `out` (length checked
        // above); the operands' matrices lie inside `a` and `b` (checked above); gemm
        // writes every element of the block, and reads it only when `read_dst`.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                d,
                1,
                n as isize,
                read_dst,
                a.as_ptr().add(sa.offsets[i]),
                sa.cs as isize,
                sa.rs as isize,
                b.as_ptr().add(sb.offsets[i]),
                sb.cs as isize,
                sb.rs as isize,
                dst_factor,
                alpha,
                false,
                false,
                false,
                par,
            )
        }
    };
    if p.reduce {
        for i in 0..batch {
            let (factor, rd) = if i == 0 {
                (beta, read)
            } else {
                (C::one(), true)
            };
            one(i, dst.at(0), factor, rd, parallelism(work));
        }
    } else if batch == 1
        || (work >= BIG_WORK && !whole_entries(batch))
        || work * batch < BATCH_PARALLEL_WORK
    {
        for i in 0..batch {
            one(i, dst.at(i * m * n), beta, read, parallelism(work));
        }
    } else {
        amp_tensor::parallel::for_each(batch, &|i| {
            one(i, dst.at(i * m * n), beta, read, Parallelism::None)
        });
    }
}

/// One product of a plan: `d = dst_factor * d + alpha * A_i @ B_i` for the `m×k`
/// matrix `i` of `a` and the `k×n` matrix `i` of `b` (each with its [`Side`]), into the
/// row-major `m×n` block at `d`, computed in `C` from operands and output stored as `S`
/// (a 16-bit type on the direct kernel, `small::direct16`; else `C` itself).
#[derive(Clone, Copy)]
pub(crate) struct Product<'a, C, S = C, I = S> {
    m: usize,
    n: usize,
    k: usize,
    a: (&'a [I], &'a Side, usize),
    b: (&'a [I], &'a Side, usize),
    d: *mut S,
    dst_factor: C,
    read_dst: bool,
    alpha: C,
}

/// A [`Product`] on faer's kernel (`d` only written, not read, when `read_dst` is
/// false or `dst_factor` is 0, as PyTorch ignores the input when `beta` is 0).
///
/// # Safety
/// `d` points at a writable row-major `m×n` block, initialised when `read_dst`; matrix
/// `i` of each operand lies inside its buffer.
unsafe fn faer_product<C: GemmFloat>(pr: Product<'_, C>, par: Parallelism) {
    let (m, n, k, d, dst_factor, alpha) = (pr.m, pr.n, pr.k, pr.d, pr.dst_factor, pr.alpha);
    let ((a, sa, ia), (b, sb, ib)) = (pr.a, pr.b);
    let read_dst = pr.read_dst;
    use faer::{Accum, MatMut, MatRef};
    let accum = if read_dst && dst_factor != C::zero() {
        if dst_factor != C::one() {
            // SAFETY: the caller guarantees `m*n` initialised elements at `d`.
            let block = unsafe { std::slice::from_raw_parts_mut(d, m * n) };
            block.iter_mut().for_each(|v| *v *= dst_factor);
        }
        Accum::Add
    } else {
        Accum::Replace
    };
    // SAFETY: the caller guarantees the operands' matrices lie in `a` and `b` and that
    // `d` is an `m×n` row-major block.
    unsafe {
        let lhs = MatRef::from_raw_parts(
            a.as_ptr().add(sa.offsets[ia]),
            m,
            k,
            sa.rs as isize,
            sa.cs as isize,
        );
        let rhs = MatRef::from_raw_parts(
            b.as_ptr().add(sb.offsets[ib]),
            k,
            n,
            sb.rs as isize,
            sb.cs as isize,
        );
        let dst = MatMut::from_raw_parts_mut(d, m, n, n as isize, 1);
        faer_matmul(dst, accum, lhs, rhs, alpha, par);
    }
}

/// `dst = alpha * lhs @ rhs` (plus `dst` for `Accum::Add`) on faer's kernel: on the
/// calling thread for [`Parallelism::None`] and for outputs too narrow to cut into
/// blocks of [`MIN_BLOCK`] (faer's own split wakes the pool from outside it and waits,
/// slower than one thread there), else as [`Blocks`], one `parallel::for_each` task
/// each. Every thread that ran faer's kernel clears its upper registers ([`faer_seq`]).
///
/// A column-major `lhs` of a product of at least [`LHS_COPY_WORK`] multiply-adds into a
/// row-major `dst` (`mm(a.t(), b)`, a linear layer's weight gradient) is copied
/// row-major into a buffer of a thread's ([`row_major_copy`]): below
/// [`WHOLE_COPY_WORK`] the product is cut by rows and each block copies its own rows on
/// its thread, where they stay in cache; from it on, the whole operand is copied first
/// (by blocks of rows over the threads), as cutting by rows would have every block
/// pack all of `rhs`.
pub(crate) fn faer_matmul<C: GemmFloat>(
    dst: faer::MatMut<'_, C>,
    accum: faer::Accum,
    lhs: faer::MatRef<'_, C>,
    rhs: faer::MatRef<'_, C>,
    alpha: C,
    par: Parallelism,
) {
    let (m, n, k) = (dst.nrows(), dst.ncols(), lhs.ncols());
    let copy = copies_lhs(&dst, &lhs);
    let whole = copy && m * n * k >= WHOLE_COPY_WORK;
    let by_block = copy && !whole;
    let split = match par {
        Parallelism::None => None,
        _ => blocks(m, n, by_block),
    };
    let whole_copy = whole
        .then(|| row_major_copy(lhs, split.is_some()))
        .flatten();
    let lhs = whole_copy.as_ref().map_or(lhs, RowMajorCopy::view);
    let seq = |dst, lhs: faer::MatRef<'_, C>, rhs| {
        let own = by_block.then(|| row_major_copy(lhs, false)).flatten();
        faer_seq(
            dst,
            accum,
            own.as_ref().map_or(lhs, RowMajorCopy::view),
            rhs,
            alpha,
        )
    };
    match split {
        None => seq(dst, lhs, rhs),
        Some(split) => {
            let pieces: Vec<_> = split
                .pieces(dst, lhs, rhs)
                .into_iter()
                .map(|p| std::sync::Mutex::new(Some(p)))
                .collect();
            amp_tensor::parallel::for_each(pieces.len(), &|i| {
                let piece = pieces[i].lock().map(|mut p| p.take()).ok().flatten();
                let (dst, lhs, rhs) = piece.expect("each piece is taken once");
                seq(dst, lhs, rhs)
            });
        }
    }
}

/// From this many multiply-adds on, a product copies a column-major left operand whole
/// before cutting the product into blocks; below, each block copies its own rows.
/// Measured on a 2-core AVX-512 Xeon, float32, time of `mm(a.t(), b)` over `mm(a, b)`
/// in the same run: 512³ 1.08–1.11 by block against 1.11–1.19 whole; 1024³ 1.26 by
/// block against 1.12–1.15 whole.
pub const WHOLE_COPY_WORK: usize = 768 * 768 * 768;

/// Products with at least this many multiply-adds whose left operand is column-major
/// (and output row-major) copy the operand row-major, block by block or whole (see
/// [`WHOLE_COPY_WORK`]).
/// faer's kernel reads such an operand at 0.5–0.8× of its speed (float32, one AVX-512
/// core: 80 against 110 GFLOP/s at 512³, 45 against 97 at 1024³), and the copy costs a
/// few per cent of the product from 128³ on.
pub const LHS_COPY_WORK: usize = 128 * 128 * 128;

/// Whether [`faer_matmul`] copies `lhs` row-major ([`LHS_COPY_WORK`]).
fn copies_lhs<C>(dst: &faer::MatMut<'_, C>, lhs: &faer::MatRef<'_, C>) -> bool {
    let (m, k) = (lhs.nrows(), lhs.ncols());
    lhs.row_stride() == 1
        && lhs.col_stride() >= m as isize
        && m > 1
        && k > 1
        && dst.col_stride() == 1
        && m.saturating_mul(k).saturating_mul(dst.ncols()) >= LHS_COPY_WORK
}

thread_local! {
    /// This thread's buffer for [`row_major_copy`], in 8-byte words (aligned for either
    /// float type).
    static LHS_COPIES: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
}

/// Copies larger than this (in 8-byte words) are not kept for reuse.
const LHS_COPY_MAX: usize = 4 << 20;

/// A row-major copy of an `m×k` left operand in a buffer from a thread's pool
/// ([`row_major_copy`]), given back to the pool of the thread that drops it.
struct RowMajorCopy<C> {
    /// 8-byte words, aligned for `C` (f32 or f64), the first `m·k` elements of `C`
    /// written.
    buf: Vec<u64>,
    m: usize,
    k: usize,
    _elem: std::marker::PhantomData<C>,
}

impl<C: GemmFloat> RowMajorCopy<C> {
    /// The copy as a row-major `m×k` matrix.
    fn view(&self) -> faer::MatRef<'_, C> {
        // SAFETY: `buf` holds `m·k` initialised elements of `C`, aligned (see `buf`),
        // borrowed for the view's lifetime.
        unsafe {
            faer::MatRef::from_raw_parts(
                self.buf.as_ptr().cast::<C>(),
                self.m,
                self.k,
                self.k as isize,
                1,
            )
        }
    }
}

impl<C> Drop for RowMajorCopy<C> {
    fn drop(&mut self) {
        give_buffer(&LHS_COPIES, std::mem::take(&mut self.buf), 1, LHS_COPY_MAX);
    }
}

/// The column-major `lhs` (see [`copies_lhs`]) copied row-major into a buffer from
/// this thread's pool, by blocks of 64 rows over the threads when `parallel`; `None`
/// when the buffer cannot be allocated (the product then reads `lhs` in place).
fn row_major_copy<C: GemmFloat>(
    lhs: faer::MatRef<'_, C>,
    parallel: bool,
) -> Option<RowMajorCopy<C>> {
    const ROWS: usize = 64;
    let (m, k) = (lhs.nrows(), lhs.ncols());
    let words = (m * k * size_of::<C>()).div_ceil(size_of::<u64>());
    let mut buf = take_buffer(&LHS_COPIES, words).ok()?;
    let cs = lhs.col_stride() as usize;
    // SAFETY: `lhs` is a valid view whose column `j` starts `j * cs` elements after its
    // first (row stride 1, checked by `copies_lhs`), so `(k - 1) * cs + m` elements from
    // there are readable; `buf` holds at least `m * k` elements of `C` (`words` 8-byte
    // words, aligned for `C`: f32 or f64), all initialised (zeroed words are valid
    // floats).
    let (src, copy) = unsafe {
        (
            std::slice::from_raw_parts(lhs.as_ptr(), (k - 1) * cs + m),
            std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<C>(), m * k),
        )
    };
    if parallel {
        amp_tensor::parallel::for_each_chunk_mut(copy, ROWS * k, &|i, rows| {
            amp_tensor::transpose_into(&src[i * ROWS..], cs, rows, rows.len() / k, k)
        });
    } else {
        amp_tensor::transpose_into(src, cs, copy, m, k);
    }
    Some(RowMajorCopy {
        buf,
        m,
        k,
        _elem: std::marker::PhantomData,
    })
}

/// `dst = alpha * lhs @ rhs` (plus `dst` for `Accum::Add`) on faer's sequential kernel,
/// then the upper halves of the vector registers cleared.
///
/// faer's x86 micro-kernels (hand-written, in `private-gemm-x86`) return with the upper
/// halves of the AVX registers dirty: no `vzeroupper`. Until something clears them,
/// every legacy-SSE instruction after them (all Rust code built for the baseline
/// target: copies, scalar float arithmetic, the bookkeeping between ops) waits on a
/// merge with those halves. Measured on an AVX-512 Xeon: a 32×32 float32 linear layer's
/// forward and backward took 16.3 µs with faer's kernel against 14.4 µs with `gemm`'s,
/// although faer's product alone was faster (1.12 against 1.29 µs), with `memcpy` and
/// a `Vec` clone in a transpose's bookkeeping at 15% of the time; with the registers
/// cleared, 7.0–7.3 µs.
fn faer_seq<C: GemmFloat>(
    dst: faer::MatMut<'_, C>,
    accum: faer::Accum,
    lhs: faer::MatRef<'_, C>,
    rhs: faer::MatRef<'_, C>,
    alpha: C,
) {
    faer::linalg::matmul::matmul(dst, accum, lhs, rhs, alpha, faer::Par::Seq);
    clear_upper_registers();
}

/// `vzeroupper` where the CPU has AVX (after faer's kernels, see [`faer_seq`]); nothing
/// elsewhere.
#[inline]
pub(crate) fn clear_upper_registers() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX, the one feature the instruction needs.
        unsafe { zero_upper() }
    }
}

/// `vzeroupper`.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn zero_upper() {
    std::arch::x86_64::_mm256_zeroupper()
}

/// How a parallel product is cut into independent blocks of the output, each
/// multiplied sequentially on one thread: whole columns (or rows) of the output, so
/// every block reads all of one operand and its own slice of the other.
///
/// Measured on a 2-core AVX-512 machine (faer 0.24, f32, square `mm`, GFLOP/s, the
/// same run): one column block per thread against two, 96³ 139–166 against 38–44 (and
/// 100–109 for one thread, where 96 columns made no two blocks of 64), 192³ 182–184
/// against 160, 384³ 199–206 against 195–196, 512³ 193–204 against 181–187, 1024³
/// 185–195 against 175–198; and faer's own parallel split (whose threads meet at
/// barriers inside the product) 162–192 at 1024³. From [`TWO_PER_THREAD`] on, two
/// blocks per thread even out a thread that the host delays.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    /// Cut the columns (else the rows).
    cols: bool,
    /// Columns (rows) per block; the last block may be shorter.
    size: usize,
    len: usize,
}

/// The split for an `m×n` output (by rows when `by_rows`, else along the longer side),
/// or `None` when that side is not long enough to give two threads a block of at least
/// [`MIN_BLOCK`] each (one thread then).
fn blocks(m: usize, n: usize, by_rows: bool) -> Option<Blocks> {
    let threads = rayon::current_num_threads();
    let (cols, len) = if n >= m && !by_rows {
        (true, n)
    } else {
        (false, m)
    };
    let count = if len >= TWO_PER_THREAD {
        2 * threads
    } else {
        threads
    };
    let size = len.div_ceil(count).next_multiple_of(16).max(MIN_BLOCK);
    (threads > 1 && len >= 2 * MIN_BLOCK).then_some(Blocks { cols, size, len })
}

/// Blocks are at least this long (two AVX-512 vectors of float32).
const MIN_BLOCK: usize = 32;

/// Outputs whose cut side is at least this long are cut into two blocks per thread.
const TWO_PER_THREAD: usize = 1024;

impl Blocks {
    /// The blocks' `(dst, lhs, rhs)` views.
    fn pieces<'a, C: GemmFloat>(
        self,
        mut dst: faer::MatMut<'a, C>,
        lhs: faer::MatRef<'a, C>,
        rhs: faer::MatRef<'a, C>,
    ) -> Vec<(
        faer::MatMut<'a, C>,
        faer::MatRef<'a, C>,
        faer::MatRef<'a, C>,
    )> {
        let mut out = Vec::with_capacity(self.len.div_ceil(self.size));
        let mut start = 0;
        while start < self.len {
            let w = self.size.min(self.len - start);
            if self.cols {
                let (head, tail) = dst.split_at_col_mut(w);
                out.push((head, lhs, rhs.subcols(start, w)));
                dst = tail;
            } else {
                let (head, tail) = dst.split_at_row_mut(w);
                out.push((head, lhs.subrows(start, w), rhs));
                dst = tail;
            }
            start += w;
        }
        out
    }
}

/// Integer kernel: wrapping arithmetic in i64, narrowed (wrapping) to the dtype, as
/// PyTorch's integer matmul wraps in the element type.
fn integer<T: Element>(p: &Plan<'_>) -> Result<Tensor> {
    let integral = |name: &str, v: f64| {
        if v.fract() != 0.0 || !v.is_finite() {
            Err(err(
                p.op,
                format!(
                    "For integral input tensors, argument {name} must not be a floating point number."
                ),
            ))
        } else {
            Ok(v as i64)
        }
    };
    let beta = integral("beta", p.beta)?;
    let alpha = integral("alpha", p.alpha)?;
    let init = gathered_input::<T, i64>(p)?;
    let (m, n, k) = (p.m, p.n, p.k);
    let batch = p.sa.offsets.len();
    let len = out_len(p);
    let mut out: Vec<i64> = match init {
        // In place (an `i64` vector collected from its own `into_iter`).
        Some(v) => v.into_iter().map(|x| x.wrapping_mul(beta)).collect(),
        None => try_zeroed(len)?,
    };
    with_operands::<T, _>(p, |a, b| {
        let mut acc = try_zeroed::<i64>(n)?;
        for bi in 0..batch {
            let (oa, ob) = (p.sa.offsets[bi], p.sb.offsets[bi]);
            let base = if p.reduce { 0 } else { bi * m * n };
            for i in 0..m {
                acc.iter_mut().for_each(|x| *x = 0);
                for q in 0..k {
                    let x = a[oa + i * p.sa.rs + q * p.sa.cs].to_i64();
                    let row = ob + q * p.sb.rs;
                    for (j, s) in acc.iter_mut().enumerate() {
                        *s = s.wrapping_add(x.wrapping_mul(b[row + j * p.sb.cs].to_i64()));
                    }
                }
                for (o, s) in out[base + i * n..base + (i + 1) * n].iter_mut().zip(&acc) {
                    *o = o.wrapping_add(s.wrapping_mul(alpha));
                }
            }
        }
        Ok::<(), Error>(())
    })??;
    let out: Vec<T> = if T::DTYPE == DType::I64 {
        // In place, as above (`T` is `i64`).
        out.into_iter().map(T::from_i64).collect()
    } else {
        try_collect(len, out.into_iter().map(T::from_i64))?
    };
    Tensor::from_vec(out, &p.out_dims)
}
