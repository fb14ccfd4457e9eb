//! The direct kernel for products of at most [`SMALL_WORK`](super::SMALL_WORK)
//! multiply-adds (an attention head's `8×64×8` score block, a tiny layer): no packing,
//! no allocation, the sums of up to eight output rows kept in vector registers.
//!
//! On x86-64 with AVX2 and FMA (and with AVX-512 where the CPU has it), float32 and
//! float64 products run on a register tile of `R` rows × one vector of columns
//! ([`x86`]): each step of the inner dim loads one vector of `B`'s row, broadcasts one
//! element of each of `R` rows of `A` and issues `R` independent fused multiply-adds —
//! eight chains, enough to keep both FMA units busy. The last columns are a masked
//! vector, and a `B` whose rows are not contiguous (`A·Bᵀ`, attention's `q·kᵀ`) is first
//! copied row-major into a buffer on the stack. Elsewhere a portable loop does the same
//! arithmetic one element at a time.
//!
//! bfloat16 and float16 products take the same tiles on AVX2 + FMA + F16C, and on
//! AVX-512 when more than 8 columns wide ([`direct16`]): the tile loop is generic over
//! the storage type as well as the register type, so `A` (widened once into a stack
//! buffer), `B` (widened as each row is loaded) and the output (rounded as stored) keep
//! their 16-bit storage.
//!
//! Every output element is `alpha * sum` (plus `dst_factor * input`, multiplied and
//! added as two roundings), its sum taken in the order of the inner dim with one
//! rounding per multiply-add (fused where the CPU has FMA): the same arithmetic on
//! every path, so the vector and portable kernels give the same bits.

use super::{GemmFloat, Product};

/// `pr` on the direct kernel. The input term is read only when `read_dst` and
/// `dst_factor` is not 0, as in [`faer_product`](super::faer_product).
///
/// # Safety
/// As for [`faer_product`](super::faer_product).
pub(super) unsafe fn small_product<C: GemmFloat>(pr: Product<'_, C>) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract.
        if unsafe { C::vector_product(pr) } {
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma<C: GemmFloat>(pr: Product<'_, C>) {
            // SAFETY: the caller's contract.
            unsafe { small_body(pr, true) }
        }
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
        {
            // SAFETY: the CPU has FMA and AVX2 (checked just above); the caller's contract.
            return unsafe { fma(pr) };
        }
    }
    // SAFETY: the caller's contract.
    unsafe { small_body(pr, false) }
}

/// `pr`, a float16 or bfloat16 product, on the vector form of the direct kernel: each
/// value widened to float32 as it is loaded, float32 sums (in the order of the inner
/// dim, fused multiply-adds, as for float32), each output rounded once as it is stored
/// — the bits [`small_product`] gives for the widened operands, rounded after — with
/// no widened copy of an operand or of the output. Returns false (nothing done) where
/// the CPU has no AVX2, FMA and F16C, or `B`'s rows are not contiguous and it holds more
/// than [`PACK`] values; the caller then widens.
///
/// # Safety
/// As for [`small_product`].
pub(super) unsafe fn direct16<S: Half16>(pr: Product<'_, f32, S>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract.
        unsafe { S::vector_product16(pr) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = pr;
        false
    }
}

/// [`direct16`] for float32 operands read as if first cast to `S` ([`Rounded`]): each
/// value rounded to `S` as it is widened (`A` into its stack buffer, `B` as its rows
/// are loaded), so the sums, and the bits, are [`direct16`]'s for the cast operands,
/// with no cast tensor. Returns false (nothing done) where [`direct16`] would.
///
/// # Safety
/// As for [`small_product`].
pub(super) unsafe fn direct16_rounded<S: Half16>(pr: Product<'_, f32, S, Rounded<S>>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract.
        unsafe { S::vector_product16_rounded(pr) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = pr;
        false
    }
}

/// A float32 operand value read as if first cast to the 16-bit type `T`: rounded to
/// `T` as `Tensor::to_dtype` rounds (nearest even; bfloat16 NaN as `0x7FC0`), then
/// widened back, exactly. A slice of `f32` is viewed as a slice of these
/// ([`Rounded::slice`]).
#[repr(transparent)]
pub(crate) struct Rounded<T>(f32, std::marker::PhantomData<T>);

// (Not derived: the derive would ask `T: Copy`.)
impl<T> Clone for Rounded<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Rounded<T> {}

impl<T> Rounded<T> {
    /// `x` viewed as values to be rounded to `T`.
    pub(crate) fn slice(x: &[f32]) -> &[Rounded<T>] {
        // SAFETY: `Rounded<T>` is `repr(transparent)` over `f32` (its other field is
        // zero-sized), so the two slices have the same layout.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
    }
}

/// A value the 16-bit direct kernel widens to float32 one at a time (a strided `A`).
pub(crate) trait Widen16: Copy {
    /// The value as float32 (exact for the 16-bit types, rounded first for
    /// [`Rounded`]).
    fn widen(self) -> f32;
}

impl Widen16 for amp_tensor::half::bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl Widen16 for amp_tensor::half::f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl Widen16 for Rounded<amp_tensor::half::bf16> {
    fn widen(self) -> f32 {
        amp_tensor::round_to_bf16(self.0).to_f32()
    }
}

impl Widen16 for Rounded<amp_tensor::half::f16> {
    fn widen(self) -> f32 {
        amp_tensor::half::f16::from_f32(self.0).to_f32()
    }
}

/// Values the direct kernel stages a `B` with strided rows in (on the stack).
pub(super) const PACK: usize = 4096;

/// The 16-bit float types of [`direct16`].
pub(crate) trait Half16: amp_tensor::Element {
    /// [`direct16`] for this type.
    ///
    /// # Safety
    /// As for [`small_product`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn vector_product16(pr: Product<'_, f32, Self>) -> bool;

    /// [`direct16_rounded`] for this type.
    ///
    /// # Safety
    /// As for [`small_product`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn vector_product16_rounded(pr: Product<'_, f32, Self, Rounded<Self>>) -> bool;
}

macro_rules! half16 {
    ($($t:ty: $plain:ident, $rounded:ident),*) => {$(
        impl Half16 for $t {
            #[cfg(target_arch = "x86_64")]
            unsafe fn vector_product16(pr: Product<'_, f32, Self>) -> bool {
                // SAFETY: the caller's contract.
                unsafe { x86::$plain(pr) }
            }
            #[cfg(target_arch = "x86_64")]
            unsafe fn vector_product16_rounded(
                pr: Product<'_, f32, Self, Rounded<Self>>,
            ) -> bool {
                // SAFETY: the caller's contract.
                unsafe { x86::$rounded(pr) }
            }
        }
    )*};
}
half16!(
    amp_tensor::half::bf16: direct_bf16, direct_bf16_rounded,
    amp_tensor::half::f16: direct_f16, direct_f16_rounded
);

/// Whether the CPU has the vector form of [`direct16`] (AVX2, FMA and F16C).
pub(super) fn vector_kernel16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        vector_kernel() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has the vector form of the direct kernel (AVX2 and FMA).
pub(super) fn vector_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The float types with a vector form of the direct kernel.
pub(crate) trait SmallVector: Sized {
    /// Runs `pr` on the vector kernel of the CPU and returns true, or returns false
    /// (and touches nothing) where the CPU or the operands' layout has none.
    ///
    /// # Safety
    /// As for [`small_product`].
    unsafe fn vector_product(pr: Product<'_, Self>) -> bool;
}

#[cfg(not(target_arch = "x86_64"))]
impl<T> SmallVector for T {
    unsafe fn vector_product(_: Product<'_, Self>) -> bool {
        false
    }
}

/// The portable loops (every CPU, and operands the vector kernel does not take); `fused` picks `mul_add` (only where the CPU has FMA: it
/// is a library call otherwise).
#[inline(always)]
unsafe fn small_body<C: GemmFloat>(pr: Product<'_, C>, fused: bool) {
    let Product {
        m,
        n,
        k,
        a: (a, sa, ia),
        b: (b, sb, ib),
        d,
        dst_factor,
        read_dst,
        alpha,
    } = pr;
    // Eight output columns at a time, their sums in registers (a fixed-size block);
    // the remaining columns (and every column of a B with strided rows) one by one.
    const V: usize = 8;
    let (a0, b0) = (sa.offsets[ia], sb.offsets[ib]);
    let add_input = read_dst && dst_factor != C::zero();
    let store = |i: usize, j: usize, s: C| {
        // SAFETY: element (i, j) of the caller's `m×n` block, read only when the
        // caller initialised it (`read_dst`).
        unsafe {
            let o = d.add(i * n + j);
            let v = alpha * s;
            o.write(if add_input {
                dst_factor * o.read() + v
            } else {
                v
            });
        }
    };
    // Rows in blocks of `R`: `R` independent chains of multiply-adds per column block,
    // so that the loop is not bound by the latency of one chain (each output's sum is
    // still taken in the order of the inner dim, as with one row at a time).
    const R: usize = 4;
    let mut i = 0;
    while i < m {
        let rows = if m - i >= R { R } else { 1 };
        let mut j = 0;
        if sb.cs == 1 {
            while j + V <= n {
                let bcol = b0 + j;
                if rows == R {
                    let arows = std::array::from_fn(|r| a0 + (i + r) * sa.rs);
                    let acc = tile::<C, R, V>(a, arows, sa.cs, b, bcol, sb.rs, k, fused);
                    for (r, row) in acc.iter().enumerate() {
                        for (l, &s) in row.iter().enumerate() {
                            store(i + r, j + l, s);
                        }
                    }
                } else {
                    let acc = tile::<C, 1, V>(a, [a0 + i * sa.rs], sa.cs, b, bcol, sb.rs, k, fused);
                    for (l, &s) in acc[0].iter().enumerate() {
                        store(i, j + l, s);
                    }
                }
                j += V;
            }
        }
        for r in i..i + rows {
            let arow = a0 + r * sa.rs;
            for j in j..n {
                let mut s = C::zero();
                for p in 0..k {
                    s = madd(a[arow + p * sa.cs], b[b0 + p * sb.rs + j * sb.cs], s, fused);
                }
                store(r, j, s);
            }
        }
        i += rows;
    }
}

/// The sums of `R` rows of `A` (starting at `arows`, inner stride `acs`) times `V`
/// contiguous columns of `B` (starting at `bcol`, row stride `brs`), over `k`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<C: GemmFloat, const R: usize, const V: usize>(
    a: &[C],
    arows: [usize; R],
    acs: usize,
    b: &[C],
    bcol: usize,
    brs: usize,
    k: usize,
    fused: bool,
) -> [[C; V]; R] {
    let mut acc = [[C::zero(); V]; R];
    for p in 0..k {
        let bs: &[C; V] = b[bcol + p * brs..][..V].try_into().expect("V");
        for (row, &a0) in acc.iter_mut().zip(&arows) {
            let av = a[a0 + p * acs];
            for (s, &bv) in row.iter_mut().zip(bs) {
                *s = madd(av, bv, *s, fused);
            }
        }
    }
    acc
}

/// `a * b + c`, with one rounding when `fused`.
#[inline(always)]
fn madd<C: GemmFloat>(a: C, b: C, c: C, fused: bool) -> C {
    if fused {
        a.mul_add(b, c)
    } else {
        c + a * b
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The vector kernel: one register type per float type and instruction set
    //! ([`Lanes`]), one tile loop generic over it and over the storage type
    //! ([`Stored`]: the register's own type, or a 16-bit type widened to it).
    use super::{GemmFloat, Product, Rounded, SmallVector, Widen16, PACK};
    use crate::half16::lanes::narrow_bf16_16;
    use amp_tensor::half::{bf16, f16};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Rows of `A` per register tile: eight independent multiply-add chains, enough
    /// for two FMA units with four cycles of latency.
    const ROWS: usize = 8;

    /// One vector register of float type `E` on one instruction set.
    ///
    /// # Safety
    /// Every method needs the CPU features its implementation names; the pointer
    /// methods read or write exactly `len` elements.
    trait Lanes: Copy {
        type E: GemmFloat;
        /// Elements per register.
        const N: usize;
        unsafe fn zero() -> Self;
        unsafe fn splat(x: Self::E) -> Self;
        /// The `len` (1..=N) elements at `p`, the other lanes 0; nothing past them is read.
        unsafe fn load(p: *const Self::E, len: usize) -> Self;
        /// Writes the first `len` lanes to `p`.
        unsafe fn store(self, p: *mut Self::E, len: usize);
        /// `self * b + c` with one rounding.
        unsafe fn fma(self, b: Self, c: Self) -> Self;
        unsafe fn mul(self, b: Self) -> Self;
        unsafe fn add(self, b: Self) -> Self;
    }

    /// Implements [`Lanes`] for a register wrapper: type, element, lanes, features, and
    /// the intrinsics (`zero`, `splat`, `loadu`, `storeu`, masked load and store as
    /// closures of a length, `fma`, `mul`, `add`).
    macro_rules! lanes {
        ($name:ident($reg:ty), $e:ty, $n:literal, $feat:literal,
         $zero:ident, $splat:ident, $loadu:ident, $storeu:ident,
         |$lp:ident, $ll:ident| $mload:expr, |$sp:ident, $sv:ident, $sl:ident| $mstore:expr,
         $fma:ident, $mul:ident, $add:ident) => {
            #[derive(Clone, Copy)]
            struct $name($reg);
            impl Lanes for $name {
                type E = $e;
                const N: usize = $n;
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn zero() -> Self {
                    Self($zero())
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn splat(x: $e) -> Self {
                    Self($splat(x))
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn load($lp: *const $e, $ll: usize) -> Self {
                    // SAFETY: the caller's contract (`len` readable elements at `p`).
                    unsafe { Self(if $ll == $n { $loadu($lp) } else { $mload }) }
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn store(self, $sp: *mut $e, $sl: usize) {
                    let $sv = self.0;
                    // SAFETY: the caller's contract (`len` writable elements at `p`).
                    unsafe {
                        if $sl == $n {
                            $storeu($sp, $sv)
                        } else {
                            $mstore
                        }
                    }
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn fma(self, b: Self, c: Self) -> Self {
                    Self($fma(self.0, b.0, c.0))
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn mul(self, b: Self) -> Self {
                    Self($mul(self.0, b.0))
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn add(self, b: Self) -> Self {
                    Self($add(self.0, b.0))
                }
            }
        };
    }

    /// The AVX2 mask of the first `len` of eight 32-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mask32(len: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(len as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// The AVX2 mask of the first `len` of four 64-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mask64(len: usize) -> __m256i {
        _mm256_cmpgt_epi64(
            _mm256_set1_epi64x(len as i64),
            _mm256_setr_epi64x(0, 1, 2, 3),
        )
    }

    // One register type per row: type, element, lanes, features; zero, splat, load,
    // store; masked load and store of the first `len` lanes; fma, mul, add.
    #[rustfmt::skip]
    lanes!(Avx2F32(__m256), f32, 8, "avx2,fma",
        _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
        |p, len| _mm256_maskload_ps(p, mask32(len)),
        |p, v, len| _mm256_maskstore_ps(p, mask32(len), v),
        _mm256_fmadd_ps, _mm256_mul_ps, _mm256_add_ps);
    #[rustfmt::skip]
    lanes!(Avx2F64(__m256d), f64, 4, "avx2,fma",
        _mm256_setzero_pd, _mm256_set1_pd, _mm256_loadu_pd, _mm256_storeu_pd,
        |p, len| _mm256_maskload_pd(p, mask64(len)),
        |p, v, len| _mm256_maskstore_pd(p, mask64(len), v),
        _mm256_fmadd_pd, _mm256_mul_pd, _mm256_add_pd);
    #[rustfmt::skip]
    lanes!(Avx512F32(__m512), f32, 16, "avx512f",
        _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps,
        |p, len| _mm512_maskz_loadu_ps(((1u32 << len) - 1) as u16, p),
        |p, v, len| _mm512_mask_storeu_ps(p, ((1u32 << len) - 1) as u16, v),
        _mm512_fmadd_ps, _mm512_mul_ps, _mm512_add_ps);
    #[rustfmt::skip]
    lanes!(Avx512F64(__m512d), f64, 8, "avx512f",
        _mm512_setzero_pd, _mm512_set1_pd, _mm512_loadu_pd, _mm512_storeu_pd,
        |p, len| _mm512_maskz_loadu_pd(((1u32 << len) - 1) as u8, p),
        |p, v, len| _mm512_mask_storeu_pd(p, ((1u32 << len) - 1) as u8, v),
        _mm512_fmadd_pd, _mm512_mul_pd, _mm512_add_pd);

    /// How the tiles read values stored as `Self` into registers `L` and write them
    /// back: `L`'s own element type as it is, a 16-bit type widened to float32 on
    /// loading and rounded once on storing.
    ///
    /// # Safety
    /// As for [`Lanes`]: each method needs `L`'s CPU features (F16C too for the 16-bit
    /// types); the pointer methods read or write exactly `len` (1..=N) elements.
    trait Stored<L: Lanes>: Copy {
        /// The value at `p` in every lane.
        unsafe fn splat(p: *const Self) -> L;
        /// The `len` values at `p`, the other lanes 0; nothing past them is read.
        unsafe fn load(p: *const Self, len: usize) -> L;
        /// Writes the first `len` lanes of `v` to `p`.
        unsafe fn store(v: L, p: *mut Self, len: usize);
    }

    /// `L`'s element type, read and written as it is.
    macro_rules! stored_as_is {
        ($($e:ty: $($l:ty),*;)*) => {$($(
            impl Stored<$l> for $e {
                #[inline(always)]
                unsafe fn splat(p: *const $e) -> $l {
                    // SAFETY: the trait's contract.
                    unsafe { <$l>::splat(*p) }
                }
                #[inline(always)]
                unsafe fn load(p: *const $e, len: usize) -> $l {
                    // SAFETY: the trait's contract.
                    unsafe { <$l>::load(p, len) }
                }
                #[inline(always)]
                unsafe fn store(v: $l, p: *mut $e, len: usize) {
                    // SAFETY: the trait's contract.
                    unsafe { v.store(p, len) }
                }
            }
        )*)*};
    }
    stored_as_is!(f32: Avx2F32, Avx512F32; f64: Avx2F64, Avx512F64;);

    /// 16-bit values in the float32 lanes of register `$l` (`$lanes` of them, their bits
    /// an `$h`): `widen` turns the bits of `$lanes` values (`x`) into float32 lanes
    /// exactly, `narrow` rounds the lanes (`v`) back (the rounding of
    /// [`amp_tensor::cast_into`]: nearest even, NaN as `0x7FC0` for bfloat16;
    /// `vcvtps2ph` for float16, the bits of `half`'s conversion); `short_load` and
    /// `short_store` move the first `len < $lanes` values only, so nothing past `len` is
    /// read or written.
    macro_rules! stored_16 {
        ($l:ident($h:ty, $lanes:literal), $set1:ident, $loadu:ident, $storeu:ident,
         |$lp:ident, $ll:ident| $short_load:expr,
         |$sp:ident, $sb:ident, $sl:ident| $short_store:expr;
         $($e:ty: |$w:ident| $widen:expr, |$n:ident| $narrow:expr;)*) => {$(
            impl Stored<$l> for $e {
                #[inline(always)]
                unsafe fn splat(p: *const $e) -> $l {
                    // SAFETY: the trait's contract.
                    unsafe {
                        let $w = $set1((*p).to_bits() as i16);
                        $l($widen)
                    }
                }
                #[inline(always)]
                unsafe fn load(p: *const $e, len: usize) -> $l {
                    // SAFETY: the trait's contract; a short load reads `len` values.
                    unsafe {
                        let $w: $h = if len == $lanes {
                            $loadu(p.cast())
                        } else {
                            let ($lp, $ll) = (p, len);
                            $short_load
                        };
                        $l($widen)
                    }
                }
                #[inline(always)]
                unsafe fn store(v: $l, p: *mut $e, len: usize) {
                    // SAFETY: the trait's contract; a short store writes `len` values.
                    unsafe {
                        let $n = v.0;
                        let bits: $h = $narrow;
                        if len == $lanes {
                            $storeu(p.cast(), bits);
                        } else {
                            let ($sp, $sb, $sl) = (p, bits, len);
                            $short_store
                        }
                    }
                }
            }
        )*};
    }
    // Eight lanes: a short row through a stack copy (AVX2 has no 16-bit masks).
    #[rustfmt::skip]
    stored_16!(Avx2F32(__m128i, 8), _mm_set1_epi16, _mm_loadu_si128, _mm_storeu_si128,
        |p, len| {
            let mut t = [0u16; 8];
            std::ptr::copy_nonoverlapping(p.cast::<u16>(), t.as_mut_ptr(), len);
            _mm_loadu_si128(t.as_ptr().cast())
        },
        |p, bits, len| {
            let mut t = [0u16; 8];
            _mm_storeu_si128(t.as_mut_ptr().cast(), bits);
            std::ptr::copy_nonoverlapping(t.as_ptr(), p.cast::<u16>(), len);
        };
        bf16: |x| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x))),
            |v| amp_tensor::simd::bf16_bits8_avx2(v);
        f16: |x| _mm256_cvtph_ps(x), |v| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    );
    // Sixteen lanes: a short row as a masked 16-bit load or store (AVX-512 BW/VL).
    #[rustfmt::skip]
    stored_16!(Avx512F32(__m256i, 16), _mm256_set1_epi16, _mm256_loadu_si256, _mm256_storeu_si256,
        |p, len| _mm256_maskz_loadu_epi16(((1u32 << len) - 1) as u16, p.cast()),
        |p, bits, len| _mm256_mask_storeu_epi16(p.cast(), ((1u32 << len) - 1) as u16, bits);
        bf16: |x| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x))),
            |v| narrow_bf16_16(v);
        f16: |x| _mm512_cvtph_ps(x), |v| _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    );

    /// float32 values read as if first cast to a 16-bit type ([`Rounded`]): each vector
    /// loaded as float32, rounded (`$round`, the rounding of [`Stored`]'s 16-bit stores
    /// above, `v` its float32 lanes) and widened back; a store writes the rounded values.
    /// Compiled for the register's features (`$feat`), so that the rounding's
    /// intrinsics inline into them wherever they are called from (`Tile::block` loads
    /// `B` in a closure: as `#[inline(always)]` methods, the rounding's intrinsics were
    /// calls, and `bmm` of `[32, 8, 64] × [32, 64, 8]` took 180 µs instead of 5).
    macro_rules! stored_rounded {
        ($l:ident, $feat:literal; $($t:ty: |$v:ident| $round:expr;)*) => {$(
            impl Stored<$l> for Rounded<$t> {
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn splat(p: *const Self) -> $l {
                    // SAFETY: the trait's contract.
                    unsafe { $l::splat((*p).widen()) }
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn load(p: *const Self, len: usize) -> $l {
                    // SAFETY: the trait's contract (`Rounded` is an `f32`).
                    unsafe {
                        let $v = $l::load(p.cast::<f32>(), len).0;
                        $l($round)
                    }
                }
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn store(v: $l, p: *mut Self, len: usize) {
                    // SAFETY: the trait's contract (`Rounded` is an `f32`).
                    unsafe {
                        let $v = v.0;
                        $l($round).store(p.cast::<f32>(), len)
                    }
                }
            }
        )*};
    }
    #[rustfmt::skip]
    stored_rounded!(Avx2F32, "avx2,fma,f16c";
        bf16: |v| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            amp_tensor::simd::bf16_bits8_avx2(v),
        )));
        f16: |v| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
    );
    #[rustfmt::skip]
    stored_rounded!(Avx512F32, "avx512f,avx512bw,avx512vl,avx2,fma,f16c";
        bf16: |v| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            narrow_bf16_16(v),
        )));
        f16: |v| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
    );

    /// [`super::direct16`] and [`super::direct16_rounded`] for each 16-bit type.
    macro_rules! direct16_entries {
        ($($t:ty: $plain:ident, $rounded:ident;)*) => {$(
            #[doc = concat!("[`super::direct16`] for `", stringify!($t), "`.")]
            ///
            /// # Safety
            /// The contract of [`run`].
            pub(super) unsafe fn $plain(pr: Product<'_, f32, $t>) -> bool {
                // SAFETY: the caller's contract.
                unsafe { on_widest16(pr) }
            }
            #[doc = concat!("[`super::direct16_rounded`] for `", stringify!($t), "`.")]
            ///
            /// # Safety
            /// The contract of [`run`].
            pub(super) unsafe fn $rounded(pr: Product<'_, f32, $t, Rounded<$t>>) -> bool {
                // SAFETY: the caller's contract.
                unsafe { on_widest16(pr) }
            }
        )*};
    }
    direct16_entries!(
        bf16: direct_bf16, direct_bf16_rounded;
        f16: direct_f16, direct_f16_rounded;
    );

    /// A 16-bit product on [`Avx512F32`] where it is more than 8 columns wide and the
    /// CPU has AVX-512 F/BW/VL, FMA and F16C, else on [`Avx2F32`] where it has AVX2,
    /// FMA and F16C (the same sums, so the same bits); false where it has neither.
    /// Measured on a Zen 4 EPYC, bfloat16, best of 15 × 200 calls: `bmm` of
    /// `[32, 16, 64] × [32, 64, 16]` took 9.3 µs on eight lanes (two vectors per output
    /// row) and 7.9 on sixteen (float32: 6.2); `[32, 8, 64] × [32, 64, 8]` 5.7 µs on
    /// eight lanes and 7.4 on sixteen, whose masked 16-bit loads are half empty there
    /// (float32: 5.6).
    ///
    /// # Safety
    /// The contract of [`run`].
    unsafe fn on_widest16<S, I>(pr: Product<'_, f32, S, I>) -> bool
    where
        S: Stored<Avx2F32> + Stored<Avx512F32>,
        I: Stored<Avx2F32> + Stored<Avx512F32> + Widen16,
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn wide<S: Stored<Avx512F32>, I: Stored<Avx512F32> + Widen16>(
            pr: Product<'_, f32, S, I>,
        ) -> bool {
            // SAFETY: the caller's contract.
            unsafe { run16::<Avx512F32, S, I>(pr) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn narrow<S: Stored<Avx2F32>, I: Stored<Avx2F32> + Widen16>(
            pr: Product<'_, f32, S, I>,
        ) -> bool {
            // SAFETY: the caller's contract.
            unsafe { run16::<Avx2F32, S, I>(pr) }
        }
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && pr.n > 8
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        // SAFETY: each form runs only where the CPU has the features it is compiled
        // for; the caller's contract.
        unsafe {
            if avx512 {
                wide(pr)
            } else {
                avx2 && narrow(pr)
            }
        }
    }

    impl SmallVector for f32 {
        unsafe fn vector_product(pr: Product<'_, f32>) -> bool {
            // SAFETY: the caller's contract.
            unsafe { widest::<Avx512F32, Avx2F32>(pr) }
        }
    }

    impl SmallVector for f64 {
        unsafe fn vector_product(pr: Product<'_, f64>) -> bool {
            // SAFETY: the caller's contract.
            unsafe { widest::<Avx512F64, Avx2F64>(pr) }
        }
    }

    /// `pr` on `Wide` (AVX-512F registers) where the CPU has AVX-512F, else on `Narrow`
    /// (AVX2 registers) where it has AVX2 and FMA; false where it has neither.
    ///
    /// # Safety
    /// The contract of [`run`].
    unsafe fn widest<Wide: Lanes, Narrow: Lanes<E = Wide::E>>(pr: Product<'_, Wide::E>) -> bool
    where
        Wide::E: Stored<Wide> + Stored<Narrow>,
    {
        // SAFETY: each kernel runs only where the CPU has its features; the caller's
        // contract.
        unsafe {
            if is_x86_feature_detected!("avx512f") {
                on_avx512::<Wide>(pr)
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                on_avx2::<Narrow>(pr)
            } else {
                false
            }
        }
    }

    /// [`run`] compiled for AVX2 and FMA.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and `L` needs no more; the contract of [`run`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn on_avx2<L: Lanes>(pr: Product<'_, L::E>) -> bool
    where
        L::E: Stored<L>,
    {
        // SAFETY: the caller's contract.
        unsafe { run::<L, L::E>(pr) }
    }

    /// [`run`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F, and `L` needs no more; the contract of [`run`].
    #[target_feature(enable = "avx512f")]
    unsafe fn on_avx512<L: Lanes>(pr: Product<'_, L::E>) -> bool
    where
        L::E: Stored<L>,
    {
        // SAFETY: the caller's contract.
        unsafe { run::<L, L::E>(pr) }
    }

    /// `pr` on register type `L`, with `B` copied row-major first when its rows are
    /// not contiguous; false (nothing done) when such a `B` is larger than [`PACK`].
    ///
    /// # Safety
    /// The contract of [`small_product`](super::small_product); the CPU has `L`'s
    /// features.
    #[inline(always)]
    unsafe fn run<L: Lanes, S: Stored<L>>(pr: Product<'_, L::E, S>) -> bool {
        let (a, sa, ia) = pr.a;
        let mut buf = [MaybeUninit::<S>::uninit(); PACK];
        // SAFETY: the caller's contract.
        let Some((b, brs)) = (unsafe { b_rows(&pr, &mut buf) }) else {
            return false;
        };
        // SAFETY: the caller's contract; `A` is `pr`'s own; `b` holds `B`'s rows.
        unsafe {
            let a0 = a.as_ptr().add(sa.offsets[ia]);
            tiles::<L, S, S, S>(&pr, pr.m, pr.d, a0, sa.rs, sa.cs, b, brs);
        }
        true
    }

    /// `pr`'s `B` with contiguous rows, and the distance between them: in place when
    /// its rows are contiguous, else copied row-major into `buf`; `None` when such a
    /// `B` is larger than [`PACK`]. (No closure: a closure would not take its caller's
    /// target features, and the tile loop would call each intrinsic.)
    ///
    /// # Safety
    /// Matrix `ib` of `pr`'s `B` lies inside its buffer.
    #[inline(always)]
    unsafe fn b_rows<C, S, I: Copy>(
        pr: &Product<'_, C, S, I>,
        buf: &mut [MaybeUninit<I>; PACK],
    ) -> Option<(*const I, usize)> {
        let (b, sb, ib) = pr.b;
        let (k, n) = (pr.k, pr.n);
        // SAFETY: matrix `ib` of `b` lies inside it (the caller's contract).
        let b0 = unsafe { b.as_ptr().add(sb.offsets[ib]) };
        if sb.cs == 1 {
            return Some((b0, sb.rs));
        }
        if k * n > PACK {
            return None;
        }
        for j in 0..n {
            for p in 0..k {
                // SAFETY: element (p, j) of matrix `ib`, inside `b`.
                buf[p * n + j].write(unsafe { *b0.add(p * sb.rs + j * sb.cs) });
            }
        }
        // `buf` holds `B` row-major (`k×n`, all written above).
        Some((buf.as_ptr().cast(), n))
    }

    /// A 16-bit `pr` on register type `L` ([`Avx2F32`] or [`Avx512F32`]): `A` widened
    /// to float32 into a stack buffer, as
    /// many whole rows at a time as [`PACK`] values hold (a broadcast 16-bit value
    /// would cost three instructions per multiply-add), `B` widened as its rows are
    /// loaded, each output rounded as it is stored. False (nothing done) when a row of
    /// `A` is longer than `PACK`, or `B` has strided rows and more than `PACK` values.
    ///
    /// # Safety
    /// The contract of [`small_product`](super::small_product); the CPU has `L`'s
    /// features, FMA and F16C.
    #[inline(always)]
    unsafe fn run16<L: Lanes<E = f32>, S: Stored<L>, I: Stored<L> + Widen16>(
        pr: Product<'_, f32, S, I>,
    ) -> bool
    where
        f32: Stored<L>,
    {
        let (a, sa, ia) = pr.a;
        let (m, n, k) = (pr.m, pr.n, pr.k);
        if k > PACK {
            return false;
        }
        let chunk = PACK / k;
        let mut buf = [MaybeUninit::<I>::uninit(); PACK];
        // SAFETY: the caller's contract.
        let Some((b, brs)) = (unsafe { b_rows(&pr, &mut buf) }) else {
            return false;
        };
        // Not zeroed: 16 KiB of stores would cost more than a small product.
        let mut wa = [MaybeUninit::<f32>::uninit(); PACK];
        // A column-major `A` (a transposed operand: `gᵀ·x`, a linear layer's weight
        // gradient) is widened column by column and read column-major by the tiles
        // (the same multiply-adds in the same order, so the same bits); one value at
        // a time it took a float16 linear layer's backward of `[32, 32]` twice as long
        // as float32's.
        let columns = sa.cs != 1 && sa.rs == 1;
        for r0 in (0..m).step_by(chunk) {
            let h = chunk.min(m - r0);
            let at = sa.offsets[ia] + r0 * sa.rs;
            let dst = wa.as_mut_ptr().cast::<f32>();
            if columns {
                for p in 0..k {
                    let src = a[at + p * sa.cs..at + p * sa.cs + h].as_ptr();
                    // SAFETY: `h` values of column `p`; `p·h + h ≤ k·h ≤ PACK` values of
                    // `wa`.
                    unsafe { widen_run::<L, I>(src, dst.add(p * h), h) };
                }
            } else {
                for r in 0..h {
                    let row = at + r * sa.rs;
                    if sa.cs == 1 {
                        // SAFETY: `k` values of the row; `r·k + k ≤ h·k ≤ PACK` values of
                        // `wa`.
                        unsafe { widen_run::<L, I>(a[row..row + k].as_ptr(), dst.add(r * k), k) };
                    } else {
                        for (p, d) in wa[r * k..(r + 1) * k].iter_mut().enumerate() {
                            d.write(a[row + p * sa.cs].widen());
                        }
                    }
                }
            }
            let (ars, acs) = if columns { (1, h) } else { (k, 1) };
            // SAFETY: the caller's contract: rows `r0..r0 + h` of the output; `wa`
            // holds those rows of `A` (`h·k` values written above, row-major or
            // column-major as `ars`, `acs` say), `b` holds `B`'s rows.
            unsafe {
                let d = pr.d.add(r0 * n);
                tiles::<L, f32, I, S>(&pr, h, d, wa.as_ptr().cast(), ars, acs, b, brs);
            }
        }
        true
    }

    /// `len` contiguous values at `src` widened into `dst`, a vector at a time with the
    /// tiles' own loads (a function, not a closure, so that it takes its caller's target
    /// features when inlined).
    ///
    /// # Safety
    /// `src` and `dst` are valid for `len` values; the CPU has `L`'s features and F16C.
    #[inline(always)]
    unsafe fn widen_run<L: Lanes<E = f32>, S: Stored<L>>(src: *const S, dst: *mut f32, len: usize)
    where
        f32: Stored<L>,
    {
        let full = len / L::N * L::N;
        // SAFETY: values `p..p + N` (`p + N ≤ full`) of `src` and `dst`, then the last
        // `len - full` (the caller's contract).
        unsafe {
            for p in (0..full).step_by(L::N) {
                S::load(src.add(p), L::N).store(dst.add(p), L::N);
            }
            if full < len {
                S::load(src.add(full), len - full).store(dst.add(full), len - full);
            }
        }
    }

    /// Rows `0..m` of `pr`'s output at `d` (row length `pr.n`), from `A` at `a` (stored
    /// as `SA`, rows `ars` apart, inner stride `acs`) and `B`'s contiguous rows at `b`,
    /// `brs` apart: register tiles of `R` output rows × `V` vectors of columns with
    /// `R·V` = [`ROWS`] accumulators (fewer rows, more columns for short outputs), the
    /// columns left over in one-vector tiles (the last one masked).
    ///
    /// # Safety
    /// As for [`run`], with `a`, `b` and `d` pointing at `m` rows of `A`, at `B` and
    /// at `m` rows of the output.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tiles<L: Lanes, SA: Stored<L>, SB: Stored<L>, S: Stored<L>>(
        pr: &Product<'_, L::E, S, SB>,
        m: usize,
        d: *mut S,
        a: *const SA,
        ars: usize,
        acs: usize,
        b: *const SB,
        brs: usize,
    ) {
        let zero = <L::E as num_traits::Zero>::zero();
        // SAFETY: (all the pointer arithmetic below) rows `i..i + R` of `A`, the
        // columns `j..j + V·N` of `B` and of the output lie inside their matrices.
        unsafe {
            let at = Tile {
                a,
                ars,
                acs,
                b,
                brs,
                k: pr.k,
                len: L::N,
                d,
                n: pr.n,
                alpha: L::splat(pr.alpha),
                factor: L::splat(pr.dst_factor),
                input: pr.read_dst && pr.dst_factor != zero,
            };
            let mut i = 0;
            while i < m {
                i += match m - i {
                    r if r >= ROWS => at.rows_of::<ROWS, 1>(i),
                    r if r >= 4 => at.rows_of::<4, 2>(i),
                    r if r >= 2 => at.rows_of::<2, 4>(i),
                    _ => at.rows_of::<1, 8>(i),
                };
            }
        }
    }

    /// One vector of output columns: where its operands and output start (`A` stored
    /// as `SA`, `B` as `SB`, the output as `S`).
    struct Tile<L: Lanes, SA, SB, S> {
        a: *const SA,
        ars: usize,
        acs: usize,
        /// `B`'s first row at this tile's first column.
        b: *const SB,
        brs: usize,
        k: usize,
        /// Columns in this tile (1..=N).
        len: usize,
        /// The output's row 0 at this tile's first column.
        d: *mut S,
        /// The output's row length.
        n: usize,
        alpha: L,
        factor: L,
        /// Whether `factor * output` is added.
        input: bool,
    }

    // (Not derived: the derive would ask `S: Copy` of the pointers' target.)
    impl<L: Lanes, SA, SB, S> Clone for Tile<L, SA, SB, S> {
        fn clone(&self) -> Self {
            *self
        }
    }
    impl<L: Lanes, SA, SB, S> Copy for Tile<L, SA, SB, S> {}

    impl<L: Lanes, SA: Stored<L>, SB: Stored<L>, S: Stored<L>> Tile<L, SA, SB, S> {
        /// Output rows `i..i + R`, all columns: tiles of `V` vectors while they fit,
        /// then one vector at a time; returns `R`.
        ///
        /// # Safety
        /// As for [`tiles`], with rows `i..i + R` inside the output.
        #[inline(always)]
        unsafe fn rows_of<const R: usize, const V: usize>(&self, i: usize) -> usize {
            let mut j = 0;
            // SAFETY: the caller's contract; each tile's columns lie inside the output.
            unsafe {
                while self.n - j >= V * L::N {
                    self.at(j).block::<R, V>(i);
                    j += V * L::N;
                }
                while j < self.n {
                    let len = L::N.min(self.n - j);
                    Tile { len, ..self.at(j) }.block::<R, 1>(i);
                    j += len;
                }
            }
            R
        }

        /// This tile moved to column `j`.
        ///
        /// # Safety
        /// Column `j` lies inside `B` and the output.
        #[inline(always)]
        unsafe fn at(&self, j: usize) -> Self {
            // SAFETY: the caller's contract.
            unsafe {
                Tile {
                    b: self.b.add(j),
                    d: self.d.add(j),
                    ..*self
                }
            }
        }

        /// Output rows `i..i + R` of this tile's `V` vectors of columns (each `len`
        /// long, `N` apart; `len < N` only with `V = 1`).
        ///
        /// # Safety
        /// As for [`tiles`], with rows `i..i + R` and the tile's columns inside the output.
        #[inline(always)]
        unsafe fn block<const R: usize, const V: usize>(&self, i: usize) {
            // SAFETY: the caller's contract.
            unsafe {
                let a = self.a.add(i * self.ars);
                let mut acc = [[L::zero(); V]; R];
                for p in 0..self.k {
                    let brow = self.b.add(p * self.brs);
                    let bv: [L; V] =
                        std::array::from_fn(|v| SB::load(brow.add(v * L::N), self.len));
                    let ap = a.add(p * self.acs);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = SA::splat(ap.add(r * self.ars));
                        for (s, &b) in row.iter_mut().zip(&bv) {
                            *s = av.fma(b, *s);
                        }
                    }
                }
                for (r, row) in acc.into_iter().enumerate() {
                    for (v, s) in row.into_iter().enumerate() {
                        let o = self.d.add((i + r) * self.n + v * L::N);
                        let mut out = self.alpha.mul(s);
                        if self.input {
                            out = self.factor.mul(S::load(o, self.len)).add(out);
                        }
                        S::store(out, o, self.len);
                    }
                }
            }
        }
    }
}
