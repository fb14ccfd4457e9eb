//! 16-bit products on the CPU's own vector instructions, packed straight from 16-bit
//! storage.
//!
//! # The kernel ladder
//!
//! A 16-bit product runs on the fastest [`Kernel16`] the CPU has for its dtype, chosen
//! once per process from CPUID (and, for AMX, Linux's permission):
//!
//! 0. **AMX** ([`Kernel16::Amx`], bfloat16 only, CPUs with AMX-TILE/AMX-BF16 on Linux):
//!    `tdpbf16ps` multiplies a 16×32 bfloat16 tile of `A` by a 32×16 tile of `B` (VNNI
//!    pairs) into a 16×16 float32 tile, 8192 multiply-adds per instruction. A 32×32
//!    output block is four accumulator tiles, fed by two `A` and two `B` tiles per 32
//!    inner indices. The tile data permission (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//!    XFEATURE_XTILEDATA)`) is requested once per process; where it is refused the rung
//!    is absent. Products with fewer than [`AMX_MIN_ROWS`] rows run on the next rung
//!    (a tile would be mostly padding).
//! 1. **AVX-512 BF16** ([`Kernel16::Avx512Bf16`], bfloat16 only): `vdpbf16ps` multiplies
//!    pairs of bfloat16 values exactly and adds them into float32 lanes, 32
//!    multiply-adds per instruction, twice the float32 FMA's count.
//! 2. **AVX-512 FMA** ([`Kernel16::Avx512Fma`], float16 and bfloat16, CPUs with AVX-512
//!    F/BW/VL): each value is widened to float32 (exactly: `vcvtph2ps` for float16, a
//!    shift for bfloat16) as it is packed, and the tiles are float32 FMAs. Unlike the
//!    widened rung, no float32 copy of an operand or of the output is ever written to
//!    memory: the pack buffers are the only copies, and the output tile is rounded to
//!    16 bits straight from the registers.
//! 3. **AVX2 FMA** ([`Kernel16::Avx2Fma`], float16 and bfloat16, CPUs with AVX2, FMA
//!    and F16C): the same float32 words as the AVX-512 FMA rung, packed with 256-bit
//!    instructions, in tiles of [`AVX2_MR`] rows: a 6×16 block of sums is 12 of the 16
//!    `ymm` registers, with two for `B` and one for the broadcast `A` value, and a
//!    tile's 32 columns are two such blocks one after the other. A packed `B` of over
//!    [`AVX2_BLOCK_KN`] words is multiplied in column blocks of whole strips, each by
//!    every row block before the next. On CPUs without AVX-512 this rung also runs
//!    large float32 products ([`AVX2_F32_WORK`]): their words are copied where 16-bit
//!    ones are widened, and the sums stored as they are.
//! 4. **Widened** ([`Kernel16::Widened`], every CPU, both dtypes): the operands are
//!    widened to float32 block by block and multiplied by the float32 kernel.
//!
//! On the first four rungs both operands are packed from their 16-bit storage with any
//! strides (a transposed operand is read in place); the float32 sums of a whole output
//! tile stay in registers for the full inner dimension and are rounded once, with
//! `alpha` and `beta · input` applied on the way out.
//!
//! # Exactness
//!
//! A 16-bit × 16-bit product is exact in float32 and every sum is rounded to float32, so
//! a result differs from the widened path (and from PyTorch's) only by the order of the
//! sums, except that `vdpbf16ps` treats subnormal inputs as zero and flushes subnormal
//! sums to zero (so does `tdpbf16ps`), as PyTorch's oneDNN kernels on the same
//! instructions do. Rounding to the output is PyTorch's: nearest even, NaN as `0x7FC0`
//! for bfloat16, `vcvtps2ph` (the same bits as `half`'s conversion) for float16.
//!
//! # Layout
//!
//! The output is cut into tiles of [`MR`] rows by [`NR`] columns. `A` is packed in
//! panels of `MR` rows, `B` in strips of `NR` columns, both as 32-bit words: word `p`
//! of a line holds inner index `p` as float32 ([`Kernel16::Avx512Fma`],
//! [`Kernel16::Avx2Fma`], whose panels have [`AVX2_MR`] rows and whose strips are two
//! halves of 16 columns, one after the other), or inner
//! indices `(2p, 2p+1)` as a bfloat16 pair ([`Kernel16::Avx512Bf16`], "VNNI pairs"; an
//! odd inner size is padded with a zero half). Short panels and strips are padded with
//! zero lines; padded lanes of a tile are never stored. Summed products (`addbmm`) are
//! packed as one long inner dimension, each batch entry padded to whole words on its
//! own.
//!
//! The AMX rung packs `B` in the same strips of VNNI pairs and `A` in panels of 32
//! rows, then stores every 16 pairs of inner indices of either as two row-major
//! 16×16-word tiles, 1 KiB of consecutive memory each (`tileloadd` reads them with a
//! 64-byte stride): rows 0–15 then 16–31 of a panel, columns 0–15 then 16–31 of a
//! strip. A row-major `A` is already rows of pairs and is copied into its tiles 64 bytes
//! at a time. Both are padded with zero pairs to whole tiles of 16 pairs. A task
//! configures its thread's tiles once (`ldtilecfg`, [`x86::Tiles`]) and releases them
//! when it ends.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;

use amp_tensor::half::{bf16, f16};
use amp_tensor::pool::try_collect;
use amp_tensor::{ensure, DType, Result};

use super::{SendPtr, Side};
use crate::compute::FirstError;

/// Rows of an output tile (one `A` panel).
pub const MR: usize = 8;
/// Columns of an output tile (one `B` strip): two 16-lane registers.
pub const NR: usize = 32;
/// `A` panels a worker packs and keeps in its cache at a time.
const PANELS: usize = 4;
/// The most strip copies (the strips a task multiplies × the row blocks) for which the
/// tasks of a parallel product pack their own copy of each strip (see [`single`]).
const PRIVATE_COPIES: usize = 64;
/// Rows of an AVX2 output tile: 6×16 float32 sums fill 12 `ymm` registers.
pub const AVX2_MR: usize = 6;
/// Columns of an AVX2 block of sums (two 8-lane registers): an AVX2 strip of [`NR`]
/// columns is packed as two halves of this many, one after the other.
const AVX2_NR: usize = 16;
/// Rows of an AMX output block (one AMX `A` panel: two tiles of 16 rows).
const AMX_MR: usize = 32;
/// Pairs of inner indices per AMX tile (a tile row is 64 bytes).
const AMX_KP: usize = 16;
/// The most words of packed `B` (`k·n`, 4 bytes each) the AVX2 tiles multiply by every
/// row block before going on to the next column block (of whole strips). Their sums
/// stay in registers for the whole inner dimension, so every row block of four panels
/// streams all the strips of a column block; past a few MiB the strips no longer stay
/// in the cache from one row block to the next. Measured on a Zen 3 EPYC (512 KiB L2,
/// 32 MiB L3), in one process, GFLOP/s with column blocks of 512K / 1M words / none,
/// then faer's float32 kernel: float32 2048³ 172/178/156/158, 1024×2048×2048
/// 166/162/149/158; bfloat16 2048³ 171/179/142 (widened 154), 2048×2048×1024
/// 172/180/177/155.
pub const AVX2_BLOCK_KN: usize = 1 << 20;
/// The fewest multiply-adds a float32 product needs to run on the AVX2 tiles when no
/// kernel is forced, with every side at least [`AVX2_F32_SIDE`]; smaller and thinner
/// ones run on faer's kernel. The tiles win where faer cuts a long inner dimension
/// into blocks (it stores and reloads its sums between them); below that both sum in
/// the same order (the same bits) and faer is as fast or faster. Measured on a Zen 3
/// EPYC, GFLOP/s tiles/faer in one process: 640³ 178/167, 1024³ 173/159, 2048³
/// 178/158, 1024×512×1024 141/134; 512³ 148/144 and 133/141, 512×1024×512 122/122,
/// 256³ 125/131, 2048×64×2048 100/109, 1024×1024×64 137/150, `Aᵀ` 128×2048×128
/// 97/114.
pub const AVX2_F32_WORK: usize = 1 << 28;
/// The shortest side (`m`, `n` or `k`) of a float32 product on the AVX2 tiles when no
/// kernel is forced (see [`AVX2_F32_WORK`]).
pub const AVX2_F32_SIDE: usize = 512;
/// The fewest output rows a product needs to run on AMX when no kernel is forced.
pub const AMX_MIN_ROWS: usize = 16;

/// A kernel a 16-bit matrix product can run on (see the module docs for the ladder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel16 {
    /// `tdpbf16ps` on AMX tiles (bfloat16 products; CPUs with AMX-BF16 whose OS grants
    /// the tile data permission).
    Amx,
    /// `vdpbf16ps` on packed bfloat16 pairs (bfloat16 products; CPUs with AVX-512 BF16).
    Avx512Bf16,
    /// float32 FMA tiles on operands widened while packed (both dtypes; CPUs with
    /// AVX-512 F/BW/VL).
    Avx512Fma,
    /// float32 FMA tiles of 6 rows on operands widened while packed (both
    /// dtypes; CPUs with AVX2, FMA and F16C).
    Avx2Fma,
    /// Operands widened to float32 for the float32 kernel (every CPU, both dtypes).
    Widened,
}

impl Kernel16 {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel16; 5] = [
        Kernel16::Amx,
        Kernel16::Avx512Bf16,
        Kernel16::Avx512Fma,
        Kernel16::Avx2Fma,
        Kernel16::Widened,
    ];

    /// A short name (`amx_bf16`, `avx512_bf16`, `avx512_fma`, `avx2_fma`, `widened`), as the
    /// benchmark reports it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel16::Amx => "amx_bf16",
            Kernel16::Avx512Bf16 => "avx512_bf16",
            Kernel16::Avx512Fma => "avx512_fma",
            Kernel16::Avx2Fma => "avx2_fma",
            Kernel16::Widened => "widened",
        }
    }

    /// Whether this kernel can run products of `dtype` on this CPU. float32 products
    /// run on the AVX2 tiles (their words copied instead of widened) or, as
    /// [`Kernel16::Widened`], on the float32 kernel itself.
    pub fn supports(self, dtype: DType) -> bool {
        let half = matches!(dtype, DType::BF16 | DType::F16);
        let float = half || dtype == DType::F32;
        match self {
            Kernel16::Amx => dtype == DType::BF16 && has_amx(),
            Kernel16::Avx512Bf16 => dtype == DType::BF16 && has_avx512_bf16(),
            Kernel16::Avx512Fma => half && has_avx512(),
            Kernel16::Avx2Fma => float && has_avx2_fma(),
            Kernel16::Widened => float,
        }
    }

    /// The fastest kernel this CPU has for `dtype` products (`None` for dtypes other
    /// than the 16-bit floats and float32). float32 products take the AVX2 tiles only
    /// on CPUs without AVX-512, whose own float32 kernel (faer's) is faster there.
    pub fn best(dtype: DType) -> Option<Kernel16> {
        let faster_elsewhere =
            |k: Kernel16| k == Kernel16::Avx2Fma && dtype == DType::F32 && has_avx512();
        Kernel16::ALL
            .into_iter()
            .find(|&k| k.supports(dtype) && !faster_elsewhere(k))
    }
}

/// AVX-512 F/BW/VL (the packing and the FMA tiles).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX2, FMA and F16C (the 256-bit packing and FMA tiles, float16 widening).
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-512 BF16 on top of [`has_avx512`].
fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AMX-TILE and AMX-BF16 (on top of [`has_avx512_bf16`], which the packing uses), with
/// the tile data permission granted to this process: asked for once, on first use.
fn has_amx() -> bool {
    static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMX.get_or_init(|| has_avx512_bf16() && x86::amx_permitted())
}

thread_local! {
    /// The kernel [`with_kernel16`] forces on this thread, if any.
    static FORCED: Cell<Option<Kernel16>> = const { Cell::new(None) };
}

/// The kernel a product of `dtype` started on this thread runs on: the forced one
/// (see [`with_kernel16`]) when it supports `dtype`, else the fastest available.
pub fn kernel16(dtype: DType) -> Option<Kernel16> {
    FORCED
        .get()
        .filter(|k| k.supports(dtype))
        .or_else(|| Kernel16::best(dtype))
}

/// Run `f` with the 16-bit products it starts on this thread forced onto `kernel` (a
/// test and benchmark API: every kernel gives the same result up to the order of
/// float32 sums). Products of a dtype `kernel` does not handle keep their own choice.
///
/// # Errors
/// When this CPU cannot run `kernel` at all (the test then counts it as skipped).
pub fn with_kernel16<R>(kernel: Kernel16, f: impl FnOnce() -> R) -> Result<R> {
    ensure!(
        kernel.supports(DType::BF16) || kernel.supports(DType::F16),
        invalid(
            "with_kernel16",
            "this CPU cannot run the {} kernel",
            kernel.name()
        )
    );
    struct Restore(Option<Kernel16>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.set(self.0);
        }
    }
    let _restore = Restore(FORCED.replace(Some(kernel)));
    Ok(f())
}

/// The packing kernel a `dtype` (`m×k @ k×n`) product runs on, or `None` for the
/// widened path (the float32 kernel itself for float32): the forced kernel when a test
/// forces one, else the fastest the CPU has when the product is wide enough that a
/// tile's padding does not dominate (thinner products are memory-bound either way; the
/// widened path handles them), and for float32 large enough on every side
/// ([`AVX2_F32_WORK`]). `per_entry`: the product is one of a batch the caller can run
/// one whole product per task, widened (`per_product16`); on the AVX2 tiles it then
/// does (`None`).
pub(super) fn chosen(
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    per_entry: bool,
) -> Option<Kernel16> {
    let mut kernel = kernel16(dtype)?;
    let forced = FORCED.get().is_some_and(|f| f.supports(dtype));
    // A batch of 16-bit products run one whole product per task skips the AVX2 tiles:
    // each product widened by blocks of rows and multiplied by faer's float32 kernel on
    // one thread is faster. Attention-shaped `bmm` (`[32, T, 64] × [32, 64, T]`) on a
    // Zen 3 EPYC, GFLOP/s widened against the tiles (alternated in one session): T =
    // 192 108–110 against 77–88, 256 98–103 against 67–89, 384 97–101 against 69–73,
    // 512 101–115 against 77–93, 1024 96–109 against 80–94; 2048 88–98 both, T <= 128
    // within the noise. Single products keep the tiles: widened, the main job's
    // bfloat16 step took 10% longer.
    if kernel == Kernel16::Avx2Fma && !forced && per_entry {
        return None;
    }
    if kernel == Kernel16::Amx && !forced && m < AMX_MIN_ROWS {
        kernel = Kernel16::Avx512Bf16;
    }
    let fits = if dtype == DType::F32 {
        m * n * k >= AVX2_F32_WORK && m.min(n).min(k) >= AVX2_F32_SIDE
    } else {
        m * n * k >= super::SMALL_WORK && n >= NR / 2 && m >= MR / 2
    };
    (kernel != Kernel16::Widened && (forced || fits)).then_some(kernel)
}

/// A storage type the packing kernels read: `bf16` and `f16` on every rung, `f32` on
/// the AVX2 tiles (see [`Kernel16::supports`]).
pub(super) trait Packed: amp_tensor::Element {
    /// The raw bits of one value.
    type Bits: Copy + Into<u32> + Sync + x86::Word;
    /// The raw bits of a slice.
    fn bits(x: &[Self]) -> &[Self::Bits];
}

impl Packed for bf16 {
    type Bits = u16;
    fn bits(x: &[Self]) -> &[u16] {
        use amp_tensor::half::slice::HalfFloatSliceExt;
        x.reinterpret_cast()
    }
}

impl Packed for f16 {
    type Bits = u16;
    fn bits(x: &[Self]) -> &[u16] {
        use amp_tensor::half::slice::HalfFloatSliceExt;
        x.reinterpret_cast()
    }
}

impl Packed for f32 {
    type Bits = u32;
    fn bits(x: &[Self]) -> &[u32] {
        // SAFETY: `f32` and `u32` have the same size and alignment, and every bit
        // pattern is a valid `u32`.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
    }
}

// ----- the product ----------------------------------------------------------------------

/// One 16-bit product job: `out[i] = beta · input[i] + alpha · A_i @ B_i` for each
/// batch entry (or one output summed over the batch when `reduce`).
pub(super) struct Job<'a, T> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: &'a [T],
    pub sa: &'a Side,
    pub b: &'a [T],
    pub sb: &'a Side,
    pub reduce: bool,
    /// The input term, row-major like the output, when `beta != 0`.
    pub input: Option<&'a [f32]>,
    pub beta: f32,
    pub alpha: f32,
}

/// Multiply into `out` (row-major, `batch·m·n` or `m·n` elements, all written) on
/// `kernel` (one of the packing kernels, as [`chosen`] returns).
///
/// [`amp_tensor::Error::OutOfMemory`] when the pack buffers cannot be allocated (`out`
/// is then not written in full).
///
/// # Panics
/// If an operand's matrices do not lie inside its buffer, or the CPU cannot run
/// `kernel` on `T`.
pub(super) fn product<T: Packed, S: Packed>(
    kernel: Kernel16,
    job: &Job<'_, S>,
    out: &mut [MaybeUninit<T>],
) -> Result<()> {
    assert!(
        kernel.supports(T::DTYPE) && kernel != Kernel16::Widened,
        "the {} kernel cannot run {} products on this CPU",
        kernel.name(),
        T::DTYPE
    );
    assert!(
        S::DTYPE == T::DTYPE || (S::DTYPE == DType::F32 && rounds_f32(kernel)),
        "the {} kernel cannot pack {} operands for a {} product",
        kernel.name(),
        S::DTYPE,
        T::DTYPE
    );
    match (kernel, T::DTYPE) {
        (Kernel16::Amx, _) => batched::<T, S, { x86::AMX }>(job, out),
        (Kernel16::Avx512Bf16, _) => batched::<T, S, { x86::RAW }>(job, out),
        (Kernel16::Avx2Fma, DType::F32) => batched::<T, S, { x86::AVX2_F32 }>(job, out),
        (Kernel16::Avx2Fma, DType::F16) => batched::<T, S, { x86::AVX2_F16 }>(job, out),
        (Kernel16::Avx2Fma, _) => batched::<T, S, { x86::AVX2_BF16 }>(job, out),
        (_, DType::F16) => batched::<T, S, { x86::FROM_F16 }>(job, out),
        (_, _) => batched::<T, S, { x86::FROM_BF16 }>(job, out),
    }
}

/// Whether `kernel` packs float32 operands of a 16-bit product by rounding each value
/// to the product's type as it packs it ([`product`] with `S = f32`): the AVX-512
/// rungs that pack from 16-bit storage, [`Kernel16::Avx512Bf16`] and
/// [`Kernel16::Avx512Fma`]. The words are those of the operands cast first, so are the
/// bits.
pub(super) fn rounds_f32(kernel: Kernel16) -> bool {
    matches!(kernel, Kernel16::Avx512Bf16 | Kernel16::Avx512Fma)
}

/// [`product`] with packed words of kind `LOAD` ([`x86::RAW`]: bfloat16 pairs for
/// `vdpbf16ps`; else one value widened to float32 for the FMA tiles): the batch entries
/// one after another (each split over the threads), or spread over the threads when
/// each is small.
fn batched<T: Packed, S: Packed, const LOAD: u8>(
    job: &Job<'_, S>,
    out: &mut [MaybeUninit<T>],
) -> Result<()> {
    let (m, n, k) = (job.m, job.n, job.k);
    super::check_bounds(job.a, job.sa, m, k);
    super::check_bounds(job.b, job.sb, k, n);
    let batch = job.sa.offsets.len();
    let mn = m * n;
    let segments = |i: usize| (job.sa.offsets[i], job.sb.offsets[i]);
    if job.reduce {
        let segs: Vec<_> = try_collect(batch, (0..batch).map(segments))?;
        return single::<T, S, LOAD>(job, &segs, out, job.input, true);
    }
    let threads = rayon::current_num_threads();
    // Split products share packed strips between cores (a [32, 512, 64] bmm lost 15%
    // when its tasks waited for strips that others packed), hence `whole_entries`.
    if batch == 1
        || (m * n * k >= super::BIG_WORK && !super::whole_entries(batch))
        || m * n * k * batch < super::BATCH_PARALLEL_WORK
        || threads == 1
    {
        for (i, o) in out.chunks_mut(mn).enumerate().take(batch) {
            let input = job.input.map(|v| &v[i * mn..(i + 1) * mn]);
            single::<T, S, LOAD>(job, &[segments(i)], o, input, true)?;
        }
    } else {
        let failed = FirstError::new();
        amp_tensor::parallel::for_each_chunk_mut(&mut out[..batch * mn], mn, &|i, o| {
            let input = job.input.map(|v| &v[i * mn..(i + 1) * mn]);
            failed.record(single::<T, S, LOAD>(job, &[segments(i)], o, input, false));
        });
        failed.into_result()?;
    }
    Ok(())
}

/// One output matrix: `out = input + alpha · Σ_s A_s @ B_s` over the segments `s`
/// (storage offsets of `A` and `B`), all sums in registers, rounded once.
fn single<T: Packed, S: Packed, const LOAD: u8>(
    job: &Job<'_, S>,
    segs: &[(usize, usize)],
    out: &mut [MaybeUninit<T>],
    input: Option<&[f32]>,
    parallel: bool,
) -> Result<()> {
    let (m, n, k) = (job.m, job.n, job.k);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let amx = LOAD == x86::AMX;
    let avx2 = matches!(LOAD, x86::AVX2_BF16 | x86::AVX2_F16 | x86::AVX2_F32);
    let mr = match LOAD {
        x86::AMX => AMX_MR,
        _ if avx2 => AVX2_MR,
        _ => MR,
    };
    let kp_seg = k.div_ceil(step(LOAD));
    // Words packed per line; AMX reads whole tiles of 16 pairs, the rest zero pairs.
    let kp_used = kp_seg * segs.len();
    let kp = if amx {
        kp_used.next_multiple_of(AMX_KP)
    } else {
        kp_used
    };
    let (xa, xb) = (S::bits(job.a), S::bits(job.b));
    let strips = n.div_ceil(NR);
    let strip_len = kp * NR;
    let work = m * n * k * segs.len();
    let threads = rayon::current_num_threads();
    let parallel = parallel && work >= super::PARALLEL_WORK && threads > 1;
    // Row blocks of whole panels, at most `PANELS` each, and (in parallel) at least two
    // per thread, the panels spread evenly; a thin output is cut by strips as well.
    let panels = m.div_ceil(mr);
    let mut row_blocks = panels.div_ceil(PANELS);
    if parallel {
        row_blocks = row_blocks.max((2 * threads).min(panels));
        row_blocks = row_blocks.next_multiple_of(threads).min(panels);
    }
    // Column blocks of whole strips, each multiplied by every row block before the
    // next, so that its strips stay in the cache from one row block to the next.
    let blocks = if avx2 {
        strips.div_ceil((AVX2_BLOCK_KN / strip_len).max(1))
    } else {
        1
    };
    let mut groups = if parallel {
        (2 * threads).div_ceil(row_blocks).clamp(1, strips / blocks)
    } else {
        1
    };
    // Strips are packed once and shared by the tasks, in a phase of their own before
    // the tiles (no task waits for a strip another is packing), except when the tasks
    // of a parallel product would pack few copies in all: each then packs its own copy
    // of each of its strips, which costs less than reading strips that another core
    // wrote. Measured on a Zen 4 EPYC, 2 threads, float16 `mm` GFLOP/s against
    // float32's in one process: 96³ 0.73 with strips packed by whichever task came
    // first (as before), 0.73 packed in a phase, 0.87 own copies (12); 256³ 0.85, 0.91,
    // 0.89 (64); 512³ 0.93, 0.96, 0.88 (256). In the sweep, 192³ 0.67–0.85 shared,
    // 0.86–0.92 own copies (36). A tall product repacks its strips in every row block:
    // bfloat16 [2048, 128] @ [128, 512]ᵀ 325 GFLOP/s own copies (256), 418 shared.
    let columns =
        parallel && blocks == 1 && by_columns(LOAD, threads, m, n, strips, kp_used * mr * panels);
    if columns {
        // One task per thread, each multiplying all of `A` by its own strips.
        (row_blocks, groups) = (1, threads);
    }
    let private =
        columns || (parallel && strips.div_ceil(blocks * groups) * row_blocks <= PRIVATE_COPIES);
    let pack_strip = |s: usize, dst: &mut [u32]| {
        let j0 = s * NR;
        // An AVX2 strip is two halves of 16 columns, each inner-major on its own, so
        // that a block of sums reads whole cache lines of its half one after the
        // other (interleaved, each of its passes used half of every line it loaded).
        let (blocks, bw): (&[usize], usize) = if avx2 {
            (&[0, AVX2_NR], AVX2_NR)
        } else {
            (&[0], NR)
        };
        for (&c0, d) in blocks.iter().zip(dst.chunks_mut(kp * bw)) {
            let w = bw.min(n.saturating_sub(j0 + c0));
            if w == 0 {
                // A tile of at most 16 columns never reads its second half.
                continue;
            }
            for (seg, d) in segs.iter().zip(d.chunks_mut(kp_seg * bw)) {
                let (o, cs, rs) = (seg.1 + (j0 + c0) * job.sb.cs, job.sb.cs, job.sb.rs);
                // SAFETY: the operands lie in their buffers (checked by `product`);
                // the block reads columns `j0+c0..j0+c0+w` and inner rows `0..k` of
                // matrix `seg`. (AMX strips start as `vdpbf16ps`'s: raw pairs.)
                unsafe {
                    if amx {
                        pack::<NR, { x86::RAW }, _>(xb, o, cs, rs, k, w, d)
                    } else if avx2 {
                        pack::<AVX2_NR, LOAD, _>(xb, o, cs, rs, k, w, d)
                    } else {
                        pack::<NR, LOAD, _>(xb, o, cs, rs, k, w, d)
                    }
                };
            }
        }
        dst[kp_used * NR..].fill(0);
        if amx {
            // SAFETY: AMX implies AVX-512 F (`has_amx`); the strip holds `kp` words of
            // 32 lines, `kp` a multiple of 16.
            unsafe { x86::amx_cols(dst) };
        }
    };
    // Tasks with their own copies need no shared buffer (nor one taken from the pool).
    let mut bpack = if private {
        Vec::new()
    } else {
        take_pack(strips * strip_len + LINE_WORDS)?
    };
    let shared: &mut [u32] = if private {
        &mut []
    } else {
        lines(&mut bpack, strips * strip_len)
    };
    let dst = SendPtr(out.as_mut_ptr().cast::<T>());
    let panel_len = kp * mr;
    let task = |cb: usize, t: usize, shared: &[u32]| -> Result<()> {
        let (rb, g) = (t / groups, t % groups);
        let (p0, p1) = (rb * panels / row_blocks, (rb + 1) * panels / row_blocks);
        let own = if private { strip_len + LINE_WORDS } else { 0 };
        let mut apack = take_pack((p1 - p0) * panel_len + LINE_WORDS + own)?;
        let (panels_of, own) = apack.split_at_mut((p1 - p0) * panel_len + LINE_WORDS);
        let panels_of = lines(panels_of, (p1 - p0) * panel_len);
        let own: &mut [u32] = if private {
            lines(own, strip_len)
        } else {
            &mut []
        };
        for (pi, d) in panels_of.chunks_mut(panel_len).enumerate() {
            let r0 = (p0 + pi) * mr;
            let h = mr.min(m - r0);
            if amx && job.sa.cs == 1 && segs.len() == 1 {
                // Rows contiguous along the inner index are already rows of pairs: copied
                // into the tiles 64 bytes at a time.
                // SAFETY: rows `r0..r0+h`, inner columns `0..k` of the matrix lie in
                // `xa` (checked by `product`); the panel holds `kp` words of 32 rows;
                // AMX implies AVX-512 F/BW.
                unsafe {
                    x86::amx_copy_rows(&xa[segs[0].0 + r0 * job.sa.rs..], job.sa.rs, k, h, d)
                };
                continue;
            }
            for (seg, d) in segs.iter().zip(d.chunks_mut(kp_seg * mr)) {
                let (o, rs, cs) = (seg.0 + r0 * job.sa.rs, job.sa.rs, job.sa.cs);
                // SAFETY: as for the strips: rows `r0..r0+h`, inner columns `0..k`.
                unsafe {
                    match mr {
                        AMX_MR => pack::<AMX_MR, { x86::RAW }, _>(xa, o, rs, cs, k, h, d),
                        AVX2_MR => pack::<AVX2_MR, LOAD, _>(xa, o, rs, cs, k, h, d),
                        _ => pack::<MR, LOAD, _>(xa, o, rs, cs, k, h, d),
                    }
                };
            }
            if amx {
                d[kp_used * AMX_MR..].fill(0);
                // SAFETY: AMX implies AVX-512 F (`has_amx`); the panel holds `kp` words
                // of 32 lines, `kp` a multiple of 16.
                unsafe { x86::amx_rows(d) };
            }
        }
        // The group's strips, each row block starting at its own one, so that workers
        // read different strips at the same time. Strips split evenly over the groups
        // (`groups <= strips`, so none is empty; rounding each group up instead left the last ones past the end with many
        // threads: 16 threads, 16 strips, 7 groups of 3).
        let (c0, c1) = (cb * strips / blocks, (cb + 1) * strips / blocks);
        let (s0, s1) = (
            c0 + g * (c1 - c0) / groups,
            c0 + (g + 1) * (c1 - c0) / groups,
        );
        // SAFETY: `amx` only when this process holds the tile data permission
        // (`product` asserted `Kernel16::Amx.supports`).
        let tiles = amx.then(|| unsafe { x86::Tiles::configure() });
        let len = s1 - s0;
        let first = rb * len / row_blocks;
        for s in (0..len).map(|i| s0 + (first + i) % len) {
            let j0 = s * NR;
            let bs: &[u32] = if private {
                pack_strip(s, own);
                own
            } else {
                &shared[s * strip_len..(s + 1) * strip_len]
            };
            for pi in 0..p1 - p0 {
                let r0 = (p0 + pi) * mr;
                let tile = Tile {
                    rows: mr.min(m - r0),
                    cols: NR.min(n - j0),
                    // Tasks write disjoint tiles of the `m×n` output; this one is rows
                    // `r0..`, columns `j0..`, inside it.
                    out: dst.at(r0 * n + j0),
                    ld: n,
                    input: input.map(|v| v[r0 * n + j0..].as_ptr()),
                    beta: job.beta,
                    alpha: job.alpha,
                };
                let ap = &panels_of[pi * panel_len..(pi + 1) * panel_len];
                // SAFETY: the CPU runs this format (asserted by `product`); both packs
                // hold `kp` words of the tile's rows and columns; the tile lies in
                // `out` (and `input`, same layout).
                unsafe {
                    match LOAD {
                        x86::AMX => {
                            x86::micro_amx(tiles.as_ref().expect("AMX"), kp, ap, bs, tile.of())
                        }
                        x86::RAW => x86::micro(kp, ap, bs, tile.of()),
                        x86::FROM_F16 => x86::micro_fma::<true>(kp, ap, bs, tile.of()),
                        x86::FROM_BF16 => x86::micro_fma::<false>(kp, ap, bs, tile.of()),
                        _ => x86::micro_avx2::<T, LOAD>(kp, ap, bs, tile),
                    }
                };
            }
        }
        drop(tiles);
        give_pack(apack);
        Ok(())
    };
    let done = (0..blocks).try_for_each(|cb| {
        let (c0, c1) = (cb * strips / blocks, (cb + 1) * strips / blocks);
        if !private {
            let block = &mut shared[c0 * strip_len..c1 * strip_len];
            if parallel {
                amp_tensor::parallel::for_each_chunk_mut(block, strip_len, &|i, d| {
                    pack_strip(c0 + i, d)
                });
            } else {
                for (i, d) in block.chunks_mut(strip_len).enumerate() {
                    pack_strip(c0 + i, d);
                }
            }
        }
        let shared = &*shared;
        if parallel {
            let failed = FirstError::new();
            amp_tensor::parallel::for_each(row_blocks * groups, &|t| {
                failed.record(task(cb, t, shared))
            });
            failed.into_result()
        } else {
            (0..row_blocks * groups).try_for_each(|t| task(cb, t, shared))
        }
    });
    give_pack(bpack);
    done
}

/// The most bytes of packed `A` for which a parallel product is split by columns
/// ([`by_columns`]): every task packs all of `A` and reads it once per strip, so it
/// should stay in a core's L2 (1 MiB on the Zen 4 where it was measured).
const COLUMN_SPLIT_A: usize = 1 << 20;
/// The most threads for which [`by_columns`] splits a product by columns (each thread
/// packs `A` once: the copies grow with the threads).
const COLUMN_SPLIT_THREADS: usize = 4;

/// Whether a parallel product on the `LOAD` rung, `m×n` with `strips` strips of `B` and
/// `a_words` 32-bit words of packed `A`, runs as one task per thread, each packing all
/// of `A` and its own share of the strips (one copy of `B` in all, `threads` of `A`),
/// instead of row blocks that each pack or read every strip. It does where `A` is small enough to
/// stay in the cache ([`COLUMN_SPLIT_A`]), the product is not much taller than wide,
/// the strips share out evenly (a multiple of the threads, or at least four each) and
/// there are few threads ([`COLUMN_SPLIT_THREADS`]). Measured on a Zen 4 EPYC, 2
/// threads, µs row blocks / columns, medians of 15 interleaved rounds: bfloat16
/// (`vdpbf16ps`) 128³ 14.5/12.9, 192³ 40.1/36.0, 256³ 90.6/81.6, 384³ 275/265, 512³
/// 634/619, 64×256×1024 110/90, 256×512×256 182/160; float16 (widened FMA tiles)
/// 256³ 172/158, 64×256×1024 208/161. Not taken: 96³ (3 strips) 6.3/7.8, 1024³
/// 4906/4926, 4096×256×256 1272/1309. Only the AVX-512 rungs, the ones measured.
fn by_columns(load: u8, threads: usize, m: usize, n: usize, strips: usize, a_words: usize) -> bool {
    matches!(load, x86::RAW | x86::FROM_BF16 | x86::FROM_F16)
        && (2..=COLUMN_SPLIT_THREADS).contains(&threads)
        && strips >= threads
        && (strips.is_multiple_of(threads) || strips >= 4 * threads)
        && m <= 2 * n
        && a_words * 4 <= COLUMN_SPLIT_A
}

// ----- packing --------------------------------------------------------------------------

/// One pair of bfloat16 bits in a 32-bit word: `lo` in the low half (the even inner
/// index), as `vdpbf16ps` reads it.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Inner indices per packed word of kind `LOAD` (a bfloat16 pair holds two).
const fn step(load: u8) -> usize {
    if load == x86::RAW || load == x86::AMX {
        2
    } else {
        1
    }
}

/// Pack `h ≤ W` lines of an operand panel (line `r`, inner index `q` at
/// `x[o + r·ls + q·qs]`) into `dst` (`k.div_ceil(step)·W` words): word `p` of line `r`
/// at `dst[p·W + r]` — for [`x86::RAW`] the bfloat16 pair of inner indices `2p` (low
/// half) and `2p + 1`, else inner index `p` widened to float32 from bfloat16
/// ([`x86::FROM_BF16`], [`x86::AVX2_BF16`]) or float16 ([`x86::FROM_F16`],
/// [`x86::AVX2_F16`]), or copied as float32 bits ([`x86::AVX2_F32`]). Lines `h..W` and
/// the missing half of a last pair are zero. An `A` panel's lines are its rows
/// (`ls, qs = rs, cs`), a `B` strip's its `NR` columns (`ls, qs = cs, rs`).
///
/// # Safety
/// Every index `o + r·ls + q·qs` (`r < h`, `q < k`) lies inside `x`; `S` is the 16-bit
/// bits `LOAD` reads, or `u32` for [`x86::AVX2_F32`]; the CPU has AVX-512 F/BW/VL, or
/// AVX2, FMA and F16C for the `AVX2_` kinds.
unsafe fn pack<const W: usize, const LOAD: u8, S: Copy + Into<u32> + x86::Word>(
    x: &[S],
    o: usize,
    ls: usize,
    qs: usize,
    k: usize,
    h: usize,
    dst: &mut [u32],
) {
    debug_assert!(h <= W);
    let st = step(LOAD);
    let (words, full) = (k.div_ceil(st), k / st);
    let dst = &mut dst[..words * W];
    let src = x.as_ptr();
    // float32 words of a 16-bit product: each value rounded to the product's type.
    let round = std::mem::size_of::<S>() == 4 && LOAD != x86::AVX2_F32;
    let at = |r: usize, q: usize| -> u32 {
        // SAFETY: every (r, q) read here is inside `x` (the caller's contract).
        let v: u32 = unsafe { *src.add(o + r * ls + q * qs) }.into();
        match (round, LOAD) {
            (false, _) | (_, x86::AVX2_F32) => v,
            (_, x86::FROM_F16 | x86::AVX2_F16) => f16::from_f32(f32::from_bits(v)).to_bits().into(),
            _ => amp_tensor::round_to_bf16(f32::from_bits(v))
                .to_bits()
                .into(),
        }
    };
    let word = |r: usize, p: usize| -> u32 {
        match LOAD {
            x86::RAW => pair(
                at(r, 2 * p) as u16,
                if 2 * p + 1 < k {
                    at(r, 2 * p + 1) as u16
                } else {
                    0
                },
            ),
            x86::FROM_F16 | x86::AVX2_F16 => f16::from_bits(at(r, p) as u16).to_f32().to_bits(),
            x86::AVX2_F32 => at(r, p),
            _ => at(r, p) << 16,
        }
    };
    let mut done = 0;
    if qs == 1 {
        // Lines contiguous along the inner index (a row-major `A`, a column-major `B`
        // such as `linear`'s weight): blocks of 16 words of every line are transposed in
        // registers.
        let blocks = full / 16;
        for b in 0..blocks {
            // SAFETY: lines `0..h`, inner indices of words `16b..16b+16 ≤ full` lie
            // inside `x`; `dst` holds words up to `words`.
            unsafe {
                let (line, d) = (src.add(o + 16 * st * b), &mut dst[16 * b * W..]);
                match LOAD {
                    x86::AVX2_F16 | x86::AVX2_BF16 | x86::AVX2_F32 => {
                        x86::transpose_words256::<W, LOAD, S>(line, ls, h, d)
                    }
                    _ => x86::transpose_words::<W, LOAD, S>(line, ls, h, d),
                }
            };
        }
        done = 16 * blocks;
    } else if ls == 1 {
        // Neighbouring lines contiguous (a column-major `A`, a row-major `B`): the `h`
        // lines at one inner index are one masked load.
        // SAFETY: lines `0..h` at the inner indices of words `0..full` lie inside `x`;
        // `dst` holds `full` words per line.
        unsafe {
            match LOAD {
                x86::AVX2_F16 | x86::AVX2_BF16 | x86::AVX2_F32 => {
                    x86::gather_words256::<W, LOAD, S>(src.add(o), qs, h, full, dst)
                }
                _ => x86::gather_words::<W, LOAD, S>(src.add(o), qs, h, full, dst),
            }
        };
        done = full;
    }
    // Any strides, the last words of the first case, a last odd pair: one at a time.
    for p in done..words {
        for r in 0..W {
            dst[p * W + r] = if r < h { word(r, p) } else { 0 };
        }
    }
}

// ----- pack buffers ---------------------------------------------------------------------

thread_local! {
    /// Reusable pack buffers of this thread (at most four, each at most 64 MiB).
    static PACKS: RefCell<Vec<Vec<u32>>> = const { RefCell::new(Vec::new()) };
}

/// A pack buffer of at least `len` words (contents stale; packers write what they use),
/// or [`amp_tensor::Error::OutOfMemory`].
fn take_pack(len: usize) -> Result<Vec<u32>> {
    super::take_buffer(&PACKS, len)
}

/// 32-bit words per 64-byte cache line.
const LINE_WORDS: usize = 16;

/// The first `len` words of `v` (at least `len + LINE_WORDS` long) that start on a
/// cache line: every strip (`kp·NR` words, whole lines) then starts on one too, so no
/// 8-word load of a strip straddles two lines (on a Zen 3 core the AVX2 tiles of a
/// `[16, 256, 64] @ [16, 64, 256]` bmm ran 14–19% slower from a buffer off a line).
fn lines(v: &mut [u32], len: usize) -> &mut [u32] {
    let skip = v.as_ptr().align_offset(64).min(LINE_WORDS);
    &mut v[skip..skip + len]
}

/// Give a pack buffer back to this thread's pool.
fn give_pack(v: Vec<u32>) {
    super::give_buffer(&PACKS, v, 4, 16 << 20)
}

// ----- x86 kernels ----------------------------------------------------------------------

/// Where a micro-kernel writes its `rows × cols` tile (`rows ≤ MR`, 32 on AMX, 6 on AVX2;
/// `cols ≤ NR`) of `O` values (16-bit bits, or `f32` on the AVX2 tiles):
/// `out[r·ld + c] = round(beta · input[r·ld + c] + alpha · sum)` (no input term when
/// `input` is `None`; no rounding into `f32`).
struct Tile<O = u16> {
    rows: usize,
    cols: usize,
    out: *mut O,
    ld: usize,
    input: Option<*const f32>,
    beta: f32,
    alpha: f32,
}

impl<O> Tile<O> {
    /// The same tile with its output read as `P` values (the caller's kernel knows what
    /// the output holds).
    fn of<P>(self) -> Tile<P> {
        Tile {
            rows: self.rows,
            cols: self.cols,
            out: self.out.cast(),
            ld: self.ld,
            input: self.input,
            beta: self.beta,
            alpha: self.alpha,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, AMX_KP, AMX_MR, AVX2_MR, AVX2_NR, MR, NR};
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22) and
    /// Linux grants this process the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
    /// XFEATURE_XTILEDATA)`; once granted it holds for every thread of the process).
    pub(super) fn amx_permitted() -> bool {
        // CPUID leaf 7 exists on every x86-64 CPU with AVX-512 (checked first by the
        // caller).
        let edx = __cpuid_count(7, 0).edx;
        let (tile, bf16) = (edx >> 24 & 1 == 1, edx >> 22 & 1 == 1);
        tile && bf16 && request_tile_data()
    }

    #[cfg(target_os = "linux")]
    fn request_tile_data() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: `arch_prctl` with this request only changes which extended states the
        // process may use; it reads no memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn request_tile_data() -> bool {
        false
    }

    /// The tile configuration every AMX kernel loads (`ldtilecfg`'s 64-byte format,
    /// palette 1): tiles 0–3 the four 16×16 float32 accumulators, 4–5 two `A` tiles
    /// (16 rows of 16 bfloat16 pairs), 6–7 two `B` tiles (16 pairs of 16 columns); all
    /// 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        _reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    const CONFIG: TileConfig = {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            _reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut t = 0;
        while t < 8 {
            c.colsb[t] = 64;
            c.rows[t] = 16;
            t += 1;
        }
        c
    };

    /// The tile registers of this thread, configured with [`CONFIG`] while a `Tiles`
    /// lives (a witness the AMX kernels take) and released when it drops. Not `Send`:
    /// the configuration belongs to the thread that loaded it.
    pub(super) struct Tiles(std::marker::PhantomData<*const ()>);

    impl Tiles {
        /// Configure this thread's tiles (`ldtilecfg`).
        ///
        /// # Safety
        /// [`amx_permitted`] returned true in this process, and no other `Tiles` lives
        /// on this thread.
        pub(super) unsafe fn configure() -> Tiles {
            // SAFETY: the process may use the tile state (the caller's contract);
            // `ldtilecfg` reads the 64-byte configuration.
            unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
            Tiles(std::marker::PhantomData)
        }
    }

    impl Drop for Tiles {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by this thread (`configure`); releasing
            // them returns the tile state to its initial, unconfigured state.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }

    /// One 32×32 output block on AMX: the float32 sums of `A_panel @ B_strip` over `kp`
    /// pairs (a multiple of 16) in four accumulator tiles, stored to the stack and
    /// finished as [`micro`] finishes its registers.
    ///
    /// # Safety
    /// `a` holds an AMX panel of `kp`
    /// words per row ([`amx_rows`]' layout), `b` a strip of `kp` words per column
    /// ([`amx_cols`]' layout); the tile's rows and
    /// columns lie in the output (and the input) buffer.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    pub(super) unsafe fn micro_amx(_: &Tiles, kp: usize, a: &[u32], b: &[u32], tile: Tile) {
        assert!(kp.is_multiple_of(AMX_KP) && a.len() >= kp * AMX_MR && b.len() >= kp * NR);
        assert!(tile.rows <= AMX_MR && tile.cols <= NR);
        #[repr(C, align(64))]
        struct Sums([[f32; NR]; AMX_MR]);
        let mut sums = MaybeUninit::<Sums>::uninit();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (sa, sb) = (4 * AMX_KP, 4 * AMX_KP);
        // SAFETY: this thread's tiles are configured (the `Tiles` witness); block `q`
        // reads words `512q..512q + 512` of `a` and of `b` (two 16×16 tiles
        // each, row stride 64 bytes), inside the asserted lengths; the
        // stores write the 32×32 float32 `sums` (row stride 128 bytes).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for q in 0..kp / AMX_KP {
                let a0 = pa.add(q * AMX_KP * AMX_MR);
                let b0 = pb.add(q * AMX_KP * NR);
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0,
                    a1 = in(reg) a0.add(16 * AMX_KP),
                    b0 = in(reg) b0,
                    b1 = in(reg) b0.add(16 * AMX_KP),
                    sa = in(reg) sa,
                    sb = in(reg) sb,
                    options(nostack, readonly)
                );
            }
            let c = sums.as_mut_ptr().cast::<f32>();
            asm!(
                "tilestored [{c00} + {s}*1], tmm0",
                "tilestored [{c01} + {s}*1], tmm1",
                "tilestored [{c10} + {s}*1], tmm2",
                "tilestored [{c11} + {s}*1], tmm3",
                c00 = in(reg) c,
                c01 = in(reg) c.add(16),
                c10 = in(reg) c.add(16 * NR),
                c11 = in(reg) c.add(16 * NR + 16),
                s = in(reg) 4 * NR,
                options(nostack)
            );
        }
        let sums = sums.as_ptr().cast::<f32>();
        // SAFETY: the four tile stores wrote all 32 rows of 32 floats; the tile lies in
        // the output (the caller's contract); AVX512-BF16 comes with AMX-BF16.
        if unsafe { store_sums_ne(sums, &tile) } {
            return;
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; AMX_MR];
        for (r, acc) in acc.iter_mut().enumerate().take(tile.rows) {
            // SAFETY: the four tile stores wrote all 32 rows of 32 floats.
            unsafe {
                acc[0] = _mm512_loadu_ps(sums.add(r * NR));
                acc[1] = _mm512_loadu_ps(sums.add(r * NR + 16));
            }
        }
        // SAFETY: the tile lies in the output (the caller's contract).
        unsafe { store_tile::<false>(&acc, &tile) }
    }

    /// Rearrange a `B` strip packed as 32 lines (word `p` of column `c` at `d[32p + c]`,
    /// `kp` words per line, a multiple of 16) into AMX tiles: per 16 words
    /// `16q..16q + 16`, columns 0–15 then columns 16–31 as row-major 16×16 blocks
    /// (`d[512q + 256h + 16p + c]` holds word `16q + p` of column `16h + c`), so that
    /// each tile is 1 KiB of consecutive memory.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `d.len()` is a multiple of 512.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn amx_cols(d: &mut [u32]) {
        assert!(d.len().is_multiple_of(AMX_KP * NR));
        for block in d.chunks_exact_mut(AMX_KP * NR) {
            let p = block.as_mut_ptr();
            let mut v = [[_mm512_setzero_si512(); 2]; AMX_KP];
            for (i, v) in v.iter_mut().enumerate() {
                // SAFETY: words `32i .. 32i + 32` of the 512-word block.
                unsafe {
                    v[0] = _mm512_loadu_si512(p.add(32 * i).cast());
                    v[1] = _mm512_loadu_si512(p.add(32 * i + 16).cast());
                }
            }
            for (i, v) in v.iter().enumerate() {
                // SAFETY: words `256h + 16i .. + 16` of the block.
                unsafe {
                    _mm512_storeu_si512(p.add(16 * i).cast(), v[0]);
                    _mm512_storeu_si512(p.add(256 + 16 * i).cast(), v[1]);
                }
            }
        }
    }

    /// Pack `h ≤ 32` rows of `k` bfloat16 values (row `r` at `x[r·rs..r·rs + k]`) into
    /// an AMX panel of `d.len() / 32` words per row ([`amx_rows`]' layout), with zero
    /// pairs past `k` and zero rows from `h`: 64 bytes per load and store.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW; `S` is bfloat16 bits (16 wide); `x[r·rs + q]` is
    /// readable for `r < h`, `q < k`; `d.len()` is a multiple of 512 and holds at least
    /// `k.div_ceil(2)` words per row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn amx_copy_rows<S>(x: &[S], rs: usize, k: usize, h: usize, d: &mut [u32]) {
        assert_eq!(size_of::<S>(), 2);
        let blocks = d.len() / (AMX_KP * AMX_MR);
        assert!(d.len().is_multiple_of(AMX_KP * AMX_MR) && 2 * AMX_KP * blocks >= k && h <= AMX_MR);
        let (src, dst) = (x.as_ptr(), d.as_mut_ptr());
        for r in 0..AMX_MR {
            let row = (r / 16) * 256 + (r % 16) * 16;
            for q in 0..blocks {
                let e0 = 2 * AMX_KP * q;
                let v = if r < h && e0 < k {
                    let n = (k - e0).min(32);
                    let mask = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
                    // SAFETY: values `e0..e0 + n` of row `r < h`, `e0 + n ≤ k` (the
                    // caller's contract).
                    unsafe { _mm512_maskz_loadu_epi16(mask, src.add(r * rs + e0).cast()) }
                } else {
                    _mm512_setzero_si512()
                };
                // SAFETY: words `512q + row ..+16` lie in `d` (`q < blocks`).
                unsafe { _mm512_storeu_si512(dst.add(q * 512 + row).cast(), v) };
            }
        }
    }

    /// Rearrange an `A` panel packed as 32 lines (word `p` of line `r` at
    /// `d[32p + r]`, `kp` words per line, a multiple of 16) into AMX tiles: per 16
    /// words `16q..16q + 16`, rows 0–15 then rows 16–31 as row-major 16×16 blocks
    /// (`d[512q + 256h + 16r + p]` holds word `16q + p` of line `16h + r`).
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `d.len()` is a multiple of 512.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn amx_rows(d: &mut [u32]) {
        assert!(d.len().is_multiple_of(AMX_KP * AMX_MR));
        for block in d.chunks_exact_mut(AMX_KP * AMX_MR) {
            let p = block.as_mut_ptr();
            let mut v = [[_mm512_setzero_si512(); 16]; 2];
            let [lo, hi] = &mut v;
            for (i, (lo, hi)) in lo.iter_mut().zip(hi).enumerate() {
                // SAFETY: words `32i .. 32i + 32` of the 512-word block.
                unsafe {
                    *lo = _mm512_loadu_si512(p.add(32 * i).cast());
                    *hi = _mm512_loadu_si512(p.add(32 * i + 16).cast());
                }
            }
            for (h, v) in v.iter().enumerate() {
                // SAFETY: registers only; then words `256h + 16r ..+16` of the block.
                unsafe {
                    let t = transpose16(*v);
                    for (r, t) in t.iter().enumerate() {
                        _mm512_storeu_si512(p.add(256 * h + 16 * r).cast(), *t);
                    }
                }
            }
        }
    }

    /// One output tile: the `MR × NR` float32 sums of `A_panel @ B_strip` over `kp`
    /// pairs in `2·MR` registers (one broadcast pair of `A` against two registers of `B`
    /// per row and pair), then `alpha`, the input term and the rounding to bfloat16
    /// (PyTorch's: nearest even, NaN as `0x7FC0`), stored with masks at the edges.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/BF16; `a` holds `kp·MR` words, `b` `kp·NR`; the tile's
    /// rows and columns lie in the output (and the input) buffer.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn micro(kp: usize, a: &[u32], b: &[u32], tile: Tile) {
        assert!(a.len() >= kp * MR && b.len() >= kp * NR);
        assert!(tile.rows <= MR && tile.cols <= NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        for p in 0..kp {
            // SAFETY: `p·NR + 32 ≤ kp·NR` and `p·MR + MR ≤ kp·MR` words (asserted).
            unsafe {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR).cast()));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(pb.add(p * NR + 16).cast()));
                let ar = pa.add(p * MR);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ar.add(r) as i32));
                    acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                }
            }
        }
        // SAFETY: the tile lies in the output (the caller's contract).
        unsafe { store_tile::<false>(&acc, &tile) }
    }

    /// One output tile on FMAs: the `MR × NR` float32 sums of `A_panel @ B_strip` over
    /// `kp` inner indices (one float32 per word) in `2·MR` registers, then as [`micro`],
    /// rounded to float16 when `F16`, else to bfloat16.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and FMA; `a` holds `kp·MR` words, `b` `kp·NR`; the
    /// tile's rows and columns lie in the output (and the input) buffer.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub(super) unsafe fn micro_fma<const F16: bool>(kp: usize, a: &[u32], b: &[u32], tile: Tile) {
        assert!(a.len() >= kp * MR && b.len() >= kp * NR);
        assert!(tile.rows <= MR && tile.cols <= NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (pa, pb) = (a.as_ptr().cast::<f32>(), b.as_ptr().cast::<f32>());
        for p in 0..kp {
            // SAFETY: `p·NR + 32 ≤ kp·NR` and `p·MR + MR ≤ kp·MR` words (asserted).
            unsafe {
                let b0 = _mm512_loadu_ps(pb.add(p * NR));
                let b1 = _mm512_loadu_ps(pb.add(p * NR + 16));
                let ar = pa.add(p * MR);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ar.add(r));
                    acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                }
            }
        }
        // SAFETY: the tile lies in the output (the caller's contract).
        unsafe { store_tile::<F16>(&acc, &tile) }
    }

    /// [`store_tile`] for bfloat16 from float32 sums in memory (row `r` at
    /// `sums[32r..32r + 32]`), each row rounded by one `vcvtne2ps2bf16`, which rounds
    /// to nearest even like the integer rounding but flushes subnormal inputs and keeps
    /// NaN payloads: a NaN or subnormal value is gathered into a mask (one `vfpclassps`
    /// per vector) and, when one was met, `false` is returned after the tile was
    /// written, for the caller to write it again with [`store_tile`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ and AVX512-BF16 (the caller is compiled with them);
    /// `sums` holds `tile.rows` rows of 32 floats; the tile lies in the output (and the
    /// input) buffer.
    #[inline(always)]
    unsafe fn store_sums_ne(sums: *const f32, tile: &Tile) -> bool {
        // SAFETY: register-only intrinsics, loads of the sums' rows, and masked loads and
        // stores of the tile's own rows and columns (the caller's contract).
        unsafe {
            let masks = [lanes(tile.cols), lanes(tile.cols.saturating_sub(16))];
            let store = (1u64 << tile.cols) - 1;
            let mut bad: __mmask16 = 0;
            for r in 0..tile.rows {
                let mut v = [
                    _mm512_loadu_ps(sums.add(r * NR)),
                    _mm512_loadu_ps(sums.add(r * NR + 16)),
                ];
                for (half, (v, &mask)) in v.iter_mut().zip(&masks).enumerate() {
                    *v = finish(*v, mask, r * tile.ld + 16 * half, tile);
                    // fpclass categories: 0x01 quiet NaN, 0x80 signalling NaN, 0x20
                    // subnormal.
                    bad |= _mm512_fpclass_ps_mask::<0xA1>(*v);
                }
                let bits: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(v[1], v[0]));
                _mm512_mask_storeu_epi16(
                    tile.out.add(r * tile.ld).cast(),
                    store as __mmask32,
                    bits,
                );
            }
            bad == 0
        }
    }

    /// Apply `alpha` and the input term to a tile's sums and store the rows and columns
    /// inside the tile, rounded to float16 when `F16`, else to bfloat16.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL (the caller is compiled with them); the tile lies in
    /// the output (and the input) buffer.
    #[inline(always)]
    unsafe fn store_tile<const F16: bool>(acc: &[[__m512; 2]], tile: &Tile) {
        // SAFETY: register-only intrinsics, and masked loads and stores of the tile's
        // own rows and columns (the caller's contract).
        unsafe {
            let masks = [lanes(tile.cols), lanes(tile.cols.saturating_sub(16))];
            for (r, acc) in acc.iter().enumerate().take(tile.rows) {
                for (half, (&sum, &mask)) in acc.iter().zip(&masks).enumerate() {
                    let at = r * tile.ld + 16 * half;
                    let v = finish(sum, mask, at, tile);
                    let bits = if F16 {
                        _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
                    } else {
                        crate::half16::lanes::narrow_bf16_16(v)
                    };
                    _mm256_mask_storeu_epi16(tile.out.add(at).cast(), mask, bits);
                }
            }
        }
    }

    /// `alpha · sum + beta · input[at..]` in the lanes of `mask` (`alpha · sum` without
    /// an input term): the value a tile stores at `at`, before rounding.
    ///
    /// # Safety
    /// The CPU has AVX-512 F (the caller is compiled with it); with an input term, its
    /// lanes of `mask` at `at` are readable.
    #[inline(always)]
    unsafe fn finish(sum: __m512, mask: __mmask16, at: usize, tile: &Tile) -> __m512 {
        // SAFETY: register-only intrinsics and a masked load of the input's own lanes
        // (the caller's contract).
        unsafe {
            let mut v = sum;
            if tile.alpha != 1.0 {
                v = _mm512_mul_ps(v, _mm512_set1_ps(tile.alpha));
            }
            if let Some(input) = tile.input {
                let mut i = _mm512_maskz_loadu_ps(mask, input.add(at));
                if tile.beta != 1.0 {
                    i = _mm512_mul_ps(i, _mm512_set1_ps(tile.beta));
                }
                v = _mm512_add_ps(i, v);
            }
            v
        }
    }

    /// The mask of the first `n` (at most 16) lanes.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Transpose 16 rows of 16 words: `out[c]` holds word `c` of every row.
    #[inline(always)]
    unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        // SAFETY: register-only AVX-512F intrinsics; the caller runs with AVX-512F
        // enabled (this function's contract).
        unsafe {
            let mut t = [_mm512_setzero_si512(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
            }
            // u[4i + j], 128-bit lane l: word 4l + j of rows 4i..4i+4.
            let mut u = [_mm512_setzero_si512(); 16];
            for i in 0..4 {
                u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            let mut out = [_mm512_setzero_si512(); 16];
            for j in 0..4 {
                let v0 = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
                let v1 = _mm512_shuffle_i32x4::<0xEE>(u[j], u[4 + j]);
                let w0 = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
                let w1 = _mm512_shuffle_i32x4::<0xEE>(u[8 + j], u[12 + j]);
                out[j] = _mm512_shuffle_i32x4::<0x88>(v0, w0);
                out[4 + j] = _mm512_shuffle_i32x4::<0xDD>(v0, w0);
                out[8 + j] = _mm512_shuffle_i32x4::<0x88>(v1, w1);
                out[12 + j] = _mm512_shuffle_i32x4::<0xDD>(v1, w1);
            }
            out
        }
    }

    /// The mask of lines `16c..16c + 16` that are below `h`.
    #[inline(always)]
    fn chunk_lanes(h: usize, c: usize) -> __mmask16 {
        lanes(h.saturating_sub(16 * c))
    }

    /// How [`transpose_words`] reads a line's 16 words: raw (16 bfloat16 pairs, 32
    /// values), or 16 values widened from bfloat16 or float16. [`AMX`] packs as
    /// [`RAW`] and marks the AMX tile geometry.
    pub(super) const RAW: u8 = 0;
    pub(super) const FROM_BF16: u8 = 1;
    pub(super) const FROM_F16: u8 = 2;
    pub(super) const AMX: u8 = 3;
    /// The words of [`FROM_BF16`] and [`FROM_F16`], packed with AVX2 for
    /// [`micro_avx2`]'s tiles of [`AVX2_MR`] rows.
    pub(super) const AVX2_BF16: u8 = 4;
    pub(super) const AVX2_F16: u8 = 5;
    /// float32 words copied as they are, for [`micro_avx2`]'s tiles (float32 products).
    pub(super) const AVX2_F32: u8 = 6;

    /// How the AVX-512 packers read operand values as 16-bit bits: `u16` values are
    /// those bits; `u32` values are float32 bits, rounded to bfloat16 or float16 (`F16`)
    /// as they are read (a float32 operand of a 16-bit product: the bits of the operand
    /// cast first, see [`super::rounds_f32`]).
    pub(in super::super) trait Word: Copy {
        /// The 16 values at `p`.
        ///
        /// # Safety
        /// They are readable; the CPU has AVX-512 F/BW/VL.
        unsafe fn load16<const F16: bool>(p: *const Self) -> __m256i;
        /// The values at `p` in the lanes of `k` (the others 0, not read).
        ///
        /// # Safety
        /// Those are readable; the CPU has AVX-512 F/BW/VL.
        unsafe fn maskz16<const F16: bool>(k: __mmask16, p: *const Self) -> __m256i;
        /// The 32 bfloat16 values at `p`.
        ///
        /// # Safety
        /// They are readable; the CPU has AVX-512 F/BW/VL.
        unsafe fn load32(p: *const Self) -> __m512i;
    }

    impl Word for u16 {
        #[inline(always)]
        unsafe fn load16<const F16: bool>(p: *const u16) -> __m256i {
            // SAFETY: the trait's contract.
            unsafe { _mm256_loadu_si256(p.cast()) }
        }
        #[inline(always)]
        unsafe fn maskz16<const F16: bool>(k: __mmask16, p: *const u16) -> __m256i {
            // SAFETY: the trait's contract.
            unsafe { _mm256_maskz_loadu_epi16(k, p.cast()) }
        }
        #[inline(always)]
        unsafe fn load32(p: *const u16) -> __m512i {
            // SAFETY: the trait's contract.
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
    }

    /// 16 float32 lanes rounded to float16 (`F16`: `vcvtps2ph`, the bits of `half`'s
    /// conversion) or bfloat16 (`narrow_bf16_16`, `amp_tensor::round_to_bf16`'s).
    ///
    /// # Safety
    /// The CPU has AVX-512 F (the caller is compiled with it).
    #[inline(always)]
    unsafe fn narrow16<const F16: bool>(v: __m512) -> __m256i {
        // SAFETY: register-only intrinsics (the caller's contract).
        unsafe {
            if F16 {
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
            } else {
                crate::half16::lanes::narrow_bf16_16(v)
            }
        }
    }

    impl Word for u32 {
        #[inline(always)]
        unsafe fn load16<const F16: bool>(p: *const u32) -> __m256i {
            // SAFETY: the trait's contract.
            unsafe { narrow16::<F16>(_mm512_loadu_ps(p.cast())) }
        }
        #[inline(always)]
        unsafe fn maskz16<const F16: bool>(k: __mmask16, p: *const u32) -> __m256i {
            // SAFETY: the trait's contract.
            unsafe { narrow16::<F16>(_mm512_maskz_loadu_ps(k, p.cast())) }
        }
        #[inline(always)]
        unsafe fn load32(p: *const u32) -> __m512i {
            // SAFETY: the trait's contract.
            unsafe {
                let lo = narrow16::<false>(_mm512_loadu_ps(p.cast()));
                let hi = narrow16::<false>(_mm512_loadu_ps(p.add(16).cast()));
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            }
        }
    }

    /// 16 words of `h ≤ W` contiguous lines (line `r` at `src + r·ls`, read as `LOAD`
    /// says) into `dst[p·W + r]`, `p < 16`, lines `h..W` zero: per 16 lines, one
    /// register transpose.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL; the lines are readable (32 values each for [`RAW`],
    /// 16 otherwise); `dst` holds `16·W` words.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn transpose_words<const W: usize, const LOAD: u8, E: Word>(
        src: *const E,
        ls: usize,
        h: usize,
        dst: &mut [u32],
    ) {
        assert!(dst.len() >= 16 * W && h <= W);
        for c in 0..W.div_ceil(16) {
            let mut l = [_mm512_setzero_si512(); 16];
            for (i, l) in l.iter_mut().enumerate().take(h.saturating_sub(16 * c)) {
                let line = src.wrapping_add((16 * c + i) * ls);
                // SAFETY: line `16c + i < h`, readable as `LOAD` says (the caller's
                // contract).
                *l = unsafe {
                    match LOAD {
                        RAW => E::load32(line),
                        FROM_F16 => widen::<true>(E::load16::<true>(line)),
                        _ => widen::<false>(E::load16::<false>(line)),
                    }
                };
            }
            // SAFETY: registers only.
            let t = unsafe { transpose16(l) };
            let store = lanes(W - 16 * c);
            for (p, t) in t.iter().enumerate() {
                // SAFETY: words `p·W + 16c ..` up to `p·W + W` of `dst` (asserted).
                unsafe {
                    _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(p * W + 16 * c).cast(), store, *t)
                };
            }
        }
    }

    /// 16 float16 (`F16`) or bfloat16 values widened to float32.
    ///
    /// # Safety
    /// The CPU has AVX-512 F (the caller is compiled with it).
    #[inline(always)]
    unsafe fn widen<const F16: bool>(x: __m256i) -> __m512i {
        // SAFETY: register-only AVX-512F intrinsics (the caller's contract).
        unsafe {
            if F16 {
                _mm512_castps_si512(_mm512_cvtph_ps(x))
            } else {
                _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x))
            }
        }
    }

    /// `words` words of `h ≤ W` neighbouring lines (inner index `q` of line `r` at
    /// `src + q·qs + r`) into `dst[p·W + r]`, lines `h..W` zero, per 16 lines with masked
    /// loads: for [`RAW`] word `p` is the bfloat16 pair of inner indices `2p` (low half)
    /// and `2p + 1`; otherwise inner index `p` widened from bfloat16 or float16.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL; the first `h` lines at each inner index read are
    /// readable; `dst` holds `words·W` words.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn gather_words<const W: usize, const LOAD: u8, E: Word>(
        src: *const E,
        qs: usize,
        h: usize,
        words: usize,
        dst: &mut [u32],
    ) {
        assert!(dst.len() >= words * W && h <= W);
        let step = if LOAD == RAW { 2 } else { 1 };
        // SAFETY: the caller's contract; the masked loads read lines `< h`, the masked
        // stores write words `< W` of word `p`.
        unsafe {
            for p in 0..words {
                let q0 = src.add(step * p * qs);
                for c in 0..W.div_ceil(16) {
                    let load = chunk_lanes(h, c);
                    let x = if LOAD == FROM_F16 {
                        E::maskz16::<true>(load, q0.add(16 * c))
                    } else {
                        E::maskz16::<false>(load, q0.add(16 * c))
                    };
                    let v = match LOAD {
                        RAW => {
                            let y = E::maskz16::<false>(load, q0.add(qs + 16 * c));
                            _mm512_or_si512(
                                _mm512_cvtepu16_epi32(x),
                                _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(y)),
                            )
                        }
                        FROM_F16 => widen::<true>(x),
                        _ => widen::<false>(x),
                    };
                    let d = dst.as_mut_ptr().add(p * W + 16 * c);
                    _mm512_mask_storeu_epi32(d.cast(), lanes(W - 16 * c), v);
                }
            }
        }
    }

    // ----- AVX2 ---------------------------------------------------------------------

    /// One output tile on AVX2 FMAs: the `AVX2_MR × NR` float32 sums of
    /// `A_panel @ B_strip` over `kp` inner indices (one float32 per word), as two blocks
    /// of 6×16 sums one after the other, each in 12 registers for the whole inner
    /// dimension (one broadcast `A` value against two registers of `B` per row and
    /// index), then `alpha`, the input term and the rounding as [`micro_fma`]'s (none
    /// for [`AVX2_F32`]). The strip is two halves of `kp·AVX2_NR` words, one per block.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `O` is the output `LOAD` names (16-bit bits, or
    /// `f32` for [`AVX2_F32`]); `a` holds `kp·AVX2_MR` words, `b` `kp·NR`; the tile's
    /// rows and columns lie in the output (and the input) buffer.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn micro_avx2<O, const LOAD: u8>(
        kp: usize,
        a: &[u32],
        b: &[u32],
        tile: Tile<O>,
    ) {
        assert!(a.len() >= kp * AVX2_MR && b.len() >= kp * NR);
        assert!(tile.rows <= AVX2_MR && tile.cols <= NR);
        let pa = a.as_ptr().cast::<f32>();
        for half in 0..tile.cols.div_ceil(AVX2_NR) {
            let pb = b[half * kp * AVX2_NR..].as_ptr().cast::<f32>();
            let mut acc = [[_mm256_setzero_ps(); 2]; AVX2_MR];
            for p in 0..kp {
                // SAFETY: `p·AVX2_NR + 16 ≤ kp·AVX2_NR` words of the half and
                // `p·AVX2_MR + AVX2_MR ≤ kp·AVX2_MR` of the panel (asserted).
                unsafe {
                    let bp = pb.add(p * AVX2_NR);
                    let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
                    let ar = pa.add(p * AVX2_MR);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm256_broadcast_ss(&*ar.add(r));
                        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                    }
                }
            }
            // SAFETY: the tile lies in the output, which holds what `LOAD` names (the
            // caller's contract).
            unsafe { store_block_avx2::<O, LOAD>(&acc, AVX2_NR * half, &tile) }
        }
    }

    /// Apply `alpha` and the input term to the sums of a tile's columns
    /// `col0..col0 + 16` (as [`finish`] does, in the same order) and store those inside
    /// the tile: rounded to float16 for [`AVX2_F16`], to bfloat16 for [`AVX2_BF16`]
    /// (nearest even, NaN as `0x7FC0`), as they are for [`AVX2_F32`]. A block's last
    /// columns, when the tile ends inside 8 of them, go through a copy on the stack with
    /// the same instructions. A whole block with no `alpha` and no input term (the
    /// common case) is stored row by row, 16 values at a time.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them); `O` is the output
    /// `LOAD` names; the tile lies in the output (and the input) buffer.
    #[inline(always)]
    unsafe fn store_block_avx2<O, const LOAD: u8>(
        acc: &[[__m256; 2]; AVX2_MR],
        col0: usize,
        tile: &Tile<O>,
    ) {
        // SAFETY: register-only intrinsics, stack copies, and loads and stores of the
        // tile's own rows and columns (`at + n` stays inside row `r` of the tile).
        unsafe {
            if tile.rows == AVX2_MR
                && col0 + 16 <= tile.cols
                && tile.alpha == 1.0
                && tile.input.is_none()
            {
                for (r, &[lo, hi]) in acc.iter().enumerate() {
                    let at = tile.out.add(r * tile.ld + col0);
                    if LOAD == AVX2_F32 {
                        store8::<O, LOAD>(at, lo, 8);
                        store8::<O, LOAD>(at.add(8), hi, 8);
                    } else {
                        let bits = _mm256_set_m128i(narrow::<LOAD>(hi), narrow::<LOAD>(lo));
                        _mm256_storeu_si256(at.cast(), bits);
                    }
                }
                return;
            }
            for (r, acc) in acc.iter().enumerate().take(tile.rows) {
                for (c, &sum) in acc.iter().enumerate() {
                    let col = col0 + 8 * c;
                    if col >= tile.cols {
                        break;
                    }
                    let (at, n) = (r * tile.ld + col, (tile.cols - col).min(8));
                    let mut v = sum;
                    if tile.alpha != 1.0 {
                        v = _mm256_mul_ps(v, _mm256_set1_ps(tile.alpha));
                    }
                    if let Some(input) = tile.input {
                        let mut i = if n == 8 {
                            _mm256_loadu_ps(input.add(at))
                        } else {
                            let mut t = [0f32; 8];
                            std::ptr::copy_nonoverlapping(input.add(at), t.as_mut_ptr(), n);
                            _mm256_loadu_ps(t.as_ptr())
                        };
                        if tile.beta != 1.0 {
                            i = _mm256_mul_ps(i, _mm256_set1_ps(tile.beta));
                        }
                        v = _mm256_add_ps(i, v);
                    }
                    store8::<O, LOAD>(tile.out.add(at), v, n);
                }
            }
        }
    }

    /// The first `n ≤ 8` of 8 sums stored at `dst`: as they are for [`AVX2_F32`], else
    /// rounded as [`narrow`] does.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them); `O` is the output
    /// `LOAD` names; `dst` is writable for `n` values.
    #[inline(always)]
    unsafe fn store8<O, const LOAD: u8>(dst: *mut O, v: __m256, n: usize) {
        // SAFETY: the caller's contract; a short row goes through a stack copy.
        unsafe {
            if LOAD == AVX2_F32 {
                if n == 8 {
                    _mm256_storeu_ps(dst.cast(), v);
                } else {
                    let mut t = [0f32; 8];
                    _mm256_storeu_ps(t.as_mut_ptr(), v);
                    std::ptr::copy_nonoverlapping(t.as_ptr(), dst.cast(), n);
                }
            } else {
                let bits = narrow::<LOAD>(v);
                if n == 8 {
                    _mm_storeu_si128(dst.cast(), bits);
                } else {
                    let mut t = [0u16; 8];
                    _mm_storeu_si128(t.as_mut_ptr().cast(), bits);
                    std::ptr::copy_nonoverlapping(t.as_ptr(), dst.cast(), n);
                }
            }
        }
    }

    /// [`narrow8`] for the 16-bit output `LOAD` names ([`AVX2_F16`] or [`AVX2_BF16`]).
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them).
    #[inline(always)]
    unsafe fn narrow<const LOAD: u8>(v: __m256) -> __m128i {
        // SAFETY: the caller's contract.
        unsafe {
            if LOAD == AVX2_F16 {
                narrow8::<true>(v)
            } else {
                narrow8::<false>(v)
            }
        }
    }

    /// 8 float32 lanes rounded to float16 (`F16`: `vcvtps2ph`) or bfloat16 (nearest
    /// even, NaN as `0x7FC0`), in order.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them).
    #[inline(always)]
    unsafe fn narrow8<const F16: bool>(v: __m256) -> __m128i {
        // SAFETY: register-only intrinsics (the caller's contract).
        unsafe {
            if F16 {
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)
            } else {
                amp_tensor::simd::bf16_bits8_avx2(v)
            }
        }
    }

    /// 8 float16 (`F16`) or bfloat16 values widened to float32.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them).
    #[inline(always)]
    unsafe fn widen8<const F16: bool>(x: __m128i) -> __m256i {
        // SAFETY: register-only intrinsics (the caller's contract).
        unsafe {
            if F16 {
                _mm256_castps_si256(_mm256_cvtph_ps(x))
            } else {
                _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x))
            }
        }
    }

    /// 8 values at `src`, of which the first `n` are kept and the rest zero. With
    /// `over` the 8 are read whole and masked (the caller knows them readable, as when
    /// a later inner index of the same operand lies at least 8 values on); otherwise
    /// values from `n` on are never read.
    ///
    /// # Safety
    /// `src` is readable for 8 values when `n ≥ 8`, or `over` and `n > 0`, else for
    /// `n`; the CPU has AVX2.
    #[inline(always)]
    unsafe fn load8(src: *const u16, n: usize, over: bool) -> __m128i {
        /// `KEEP[8 - n..16 - n]` keeps the first `n` of 8 words.
        const KEEP: [u16; 16] = [
            u16::MAX,
            u16::MAX,
            u16::MAX,
            u16::MAX,
            u16::MAX,
            u16::MAX,
            u16::MAX,
            u16::MAX,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        // SAFETY: the caller's contract; a short line that may not be read whole goes
        // through a zeroed stack copy.
        unsafe {
            if n >= 8 {
                _mm_loadu_si128(src.cast())
            } else if n == 0 {
                _mm_setzero_si128()
            } else if over {
                let keep = _mm_loadu_si128(KEEP.as_ptr().add(8 - n).cast());
                _mm_and_si128(_mm_loadu_si128(src.cast()), keep)
            } else {
                let mut t = [0u16; 8];
                for (i, t) in t.iter_mut().enumerate().take(n) {
                    *t = *src.add(i);
                }
                _mm_loadu_si128(t.as_ptr().cast())
            }
        }
    }

    /// The first `n ≤ 8` words of `v` stored at `dst`.
    ///
    /// # Safety
    /// `dst` is writable for `n` words; the CPU has AVX2.
    #[inline(always)]
    unsafe fn store_first(dst: *mut u32, v: __m256i, n: usize) {
        // SAFETY: the caller's contract; a short store goes through a stack copy, but for
        // the 6 words of an AVX2 panel (4 + 2).
        unsafe {
            if n >= 8 {
                _mm256_storeu_si256(dst.cast(), v);
            } else if n == AVX2_MR {
                _mm_storeu_si128(dst.cast(), _mm256_castsi256_si128(v));
                _mm_storel_epi64(dst.add(4).cast(), _mm256_extracti128_si256::<1>(v));
            } else {
                let mut t = [0u32; 8];
                _mm256_storeu_si256(t.as_mut_ptr().cast(), v);
                std::ptr::copy_nonoverlapping(t.as_ptr(), dst, n);
            }
        }
    }

    /// Transpose 8 rows of 8 words: `out[c]` holds word `c` of every row.
    ///
    /// # Safety
    /// The CPU has AVX (the caller is compiled with AVX2).
    #[inline(always)]
    unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
        // SAFETY: register-only intrinsics (the caller's contract).
        unsafe {
            let r = r.map(|v| _mm256_castsi256_ps(v));
            let mut t = [_mm256_setzero_ps(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            // u[4h + j], 128-bit lane l: word 4l + j of rows 4h..4h + 4.
            let mut u = [_mm256_setzero_ps(); 8];
            for h in 0..2 {
                let t = &t[4 * h..];
                u[4 * h] = _mm256_shuffle_ps::<0x44>(t[0], t[2]);
                u[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(t[0], t[2]);
                u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(t[1], t[3]);
                u[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(t[1], t[3]);
            }
            let mut out = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                out[j] = _mm256_castps_si256(_mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]));
                out[4 + j] = _mm256_castps_si256(_mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]));
            }
            out
        }
    }

    /// 8 values of a line at `src` as float32 words: widened from float16
    /// ([`AVX2_F16`]) or bfloat16 ([`AVX2_BF16`]), or copied ([`AVX2_F32`]).
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C (the caller is compiled with them); `S` is the storage
    /// `LOAD` names; `src` is readable for 8 values.
    #[inline(always)]
    unsafe fn line8<S, const LOAD: u8>(src: *const S) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe {
            match LOAD {
                AVX2_F32 => _mm256_loadu_si256(src.cast()),
                AVX2_F16 => widen8::<true>(_mm_loadu_si128(src.cast())),
                _ => widen8::<false>(_mm_loadu_si128(src.cast())),
            }
        }
    }

    /// [`transpose_words`] with AVX2 for the float32 words: 16 values of `h ≤ W`
    /// contiguous lines (line `r` at `src + r·ls`), read as [`line8`] does, into
    /// `dst[p·W + r]`, `p < 16`, lines `h..W` zero: per 8 lines and 8 words, one
    /// register transpose.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `S` is the storage `LOAD` names; the lines are
    /// readable for 16 values; `dst` holds `16·W` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn transpose_words256<const W: usize, const LOAD: u8, S>(
        src: *const S,
        ls: usize,
        h: usize,
        dst: &mut [u32],
    ) {
        assert!(dst.len() >= 16 * W && h <= W);
        for half in 0..2 {
            for c in 0..W.div_ceil(8) {
                let mut l = [_mm256_setzero_si256(); 8];
                for (i, l) in l.iter_mut().enumerate().take(h.saturating_sub(8 * c)) {
                    let line = src.wrapping_add((8 * c + i) * ls + 8 * half);
                    // SAFETY: line `8c + i < h`, readable for 16 values (the caller's
                    // contract).
                    *l = unsafe { line8::<S, LOAD>(line) };
                }
                // SAFETY: registers only.
                let t = unsafe { transpose8(l) };
                for (p, t) in t.iter().enumerate() {
                    // SAFETY: words `(8·half + p)·W + 8c ..` up to `(8·half + p)·W + W`
                    // of `dst` (asserted).
                    unsafe {
                        let d = dst.as_mut_ptr().add((8 * half + p) * W + 8 * c);
                        store_first(d, *t, (W - 8 * c).min(8))
                    };
                }
            }
        }
    }

    /// [`gather_words`] with AVX2 for the float32 words: inner indices `0..words` of
    /// `h ≤ W` neighbouring lines (inner index `q` of line `r` at `src + q·qs + r`),
    /// widened from float16 ([`AVX2_F16`]) or bfloat16 ([`AVX2_BF16`]), or copied
    /// ([`AVX2_F32`], with masked loads), into `dst[p·W + r]`, lines `h..W` zero, 8
    /// lines per load.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `S` is the storage `LOAD` names; the first `h` lines at
    /// each inner index read are readable; `dst` holds `words·W` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gather_words256<const W: usize, const LOAD: u8, S>(
        src: *const S,
        qs: usize,
        h: usize,
        words: usize,
        dst: &mut [u32],
    ) {
        assert!(dst.len() >= words * W && h <= W);
        // SAFETY: the caller's contract; the loads keep lines `< h`, the stores write
        // words `< W` of word `p`. A group of 16-bit lines `8c..8c + 8` with
        // `0 < h - 8c < 8` is read whole only when inner index `p + 1` is read too and
        // `qs ≥ 8`: its last value, at `p·qs + 8c + 7`, then lies before line `h - 1` of
        // inner index `p + 1` (at `(p + 1)·qs + h - 1`, as `h > 8c`), inside the
        // operand. A masked float32 load reads no masked-off lane.
        unsafe {
            for p in 0..words {
                let q0 = src.add(p * qs);
                let over = p + 1 < words && qs >= 8;
                for c in 0..W.div_ceil(8) {
                    let (at, n) = (q0.wrapping_add(8 * c), h.saturating_sub(8 * c));
                    let v = match LOAD {
                        AVX2_F32 => load8x32(at.cast(), n),
                        AVX2_F16 => widen8::<true>(load8(at.cast(), n, over)),
                        _ => widen8::<false>(load8(at.cast(), n, over)),
                    };
                    let d = dst.as_mut_ptr().add(p * W + 8 * c);
                    store_first(d, v, (W - 8 * c).min(8));
                }
            }
        }
    }

    /// 8 float32 words at `src`, of which the first `n` are kept and the rest zero
    /// (`vpmaskmovd`: values from `n` on are never read).
    ///
    /// # Safety
    /// `src` is readable for `n.min(8)` words; the CPU has AVX2.
    #[inline(always)]
    unsafe fn load8x32(src: *const i32, n: usize) -> __m256i {
        // SAFETY: the caller's contract; masked-off lanes are not accessed.
        unsafe {
            if n >= 8 {
                _mm256_loadu_si256(src.cast())
            } else if n == 0 {
                _mm256_setzero_si256()
            } else {
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
                _mm256_maskload_epi32(src, mask)
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use super::Tile;

    /// Never called: [`super::product`] asserts AVX-512 BF16 first.
    pub(super) unsafe fn micro(_: usize, _: &[u32], _: &[u32], _: Tile) {
        unreachable!("AVX-512 BF16 kernel on a non-x86 CPU")
    }

    pub(super) const RAW: u8 = 0;
    pub(super) const FROM_BF16: u8 = 1;
    pub(super) const FROM_F16: u8 = 2;
    pub(super) const AMX: u8 = 3;
    pub(super) const AVX2_BF16: u8 = 4;
    pub(super) const AVX2_F16: u8 = 5;
    pub(super) const AVX2_F32: u8 = 6;

    /// The operand values the packers read (as on x86; never read here).
    pub(in super::super) trait Word: Copy {}
    impl Word for u16 {}
    impl Word for u32 {}

    /// No AMX off x86-64.
    pub(super) fn amx_permitted() -> bool {
        false
    }

    /// No tiles off x86-64 (never built: [`amx_permitted`] is false).
    pub(super) struct Tiles;

    impl Tiles {
        /// Never called, as above.
        pub(super) unsafe fn configure() -> Tiles {
            unreachable!("AMX kernel on a non-x86 CPU")
        }
    }

    /// Never called, as above.
    pub(super) unsafe fn micro_amx(_: &Tiles, _: usize, _: &[u32], _: &[u32], _: Tile) {
        unreachable!("AMX kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn amx_copy_rows<S>(_: &[S], _: usize, _: usize, _: usize, _: &mut [u32]) {
        unreachable!("AMX kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn amx_cols(_: &mut [u32]) {
        unreachable!("AMX kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn amx_rows(_: &mut [u32]) {
        unreachable!("AMX kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn transpose_words<const W: usize, const LOAD: u8, E>(
        _: *const E,
        _: usize,
        _: usize,
        _: &mut [u32],
    ) {
        unreachable!("AVX-512 kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn gather_words<const W: usize, const LOAD: u8, E>(
        _: *const E,
        _: usize,
        _: usize,
        _: usize,
        _: &mut [u32],
    ) {
        unreachable!("AVX-512 kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn micro_fma<const F16: bool>(_: usize, _: &[u32], _: &[u32], _: Tile) {
        unreachable!("AVX-512 kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn micro_avx2<O, const LOAD: u8>(_: usize, _: &[u32], _: &[u32], _: Tile<O>) {
        unreachable!("AVX2 kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn transpose_words256<const W: usize, const LOAD: u8, S>(
        _: *const S,
        _: usize,
        _: usize,
        _: &mut [u32],
    ) {
        unreachable!("AVX2 kernel on a non-x86 CPU")
    }

    /// Never called, as above.
    pub(super) unsafe fn gather_words256<const W: usize, const LOAD: u8, S>(
        _: *const S,
        _: usize,
        _: usize,
        _: usize,
        _: &mut [u32],
    ) {
        unreachable!("AVX2 kernel on a non-x86 CPU")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes the column split was measured faster on take it on 2 threads, and the
    /// ones it lost on (or was not measured on) do not.
    #[test]
    fn products_split_by_columns_where_that_was_measured_faster() {
        let cols = |load: u8, threads: usize, (m, k, n): (usize, usize, usize)| {
            let words = k.div_ceil(step(load)) * MR * m.div_ceil(MR);
            by_columns(load, threads, m, n, n.div_ceil(NR), words)
        };
        for shape in [
            (128, 128, 128),
            (256, 256, 256),
            (512, 512, 512),
            (64, 256, 1024),
        ] {
            assert!(cols(x86::RAW, 2, shape), "bfloat16 {shape:?}");
        }
        assert!(cols(x86::FROM_F16, 2, (512, 512, 512)));
        for shape in [(96, 96, 96), (1024, 1024, 1024), (4096, 256, 256)] {
            assert!(!cols(x86::RAW, 2, shape), "bfloat16 {shape:?}");
        }
        assert!(!cols(x86::FROM_F16, 2, (768, 768, 768)));
        assert!(!cols(x86::AMX, 2, (256, 256, 256)), "AMX was not measured");
        assert!(!cols(x86::RAW, 1, (256, 256, 256)), "one thread");
        assert!(!cols(x86::RAW, 16, (256, 256, 256)), "16 copies of A");
        assert!(!cols(x86::RAW, 3, (256, 256, 256)), "8 strips on 3 threads");
    }
}
