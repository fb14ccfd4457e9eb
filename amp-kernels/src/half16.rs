//! Elementwise loops over bfloat16 / float16 storage computed in float32 in registers:
//! a vector of 16 (AVX-512) or 8 (AVX2) elements is loaded and widened with one or two
//! instructions, the op runs on it as an array of float32 lanes (which the compiler
//! turns into the same vector instructions as the float32 kernel's), and the result is
//! rounded and stored straight into the output.
//!
//! The buffered path (widen a whole piece, compute, narrow) walked the data three times
//! and made a 128×128 bfloat16 `add` 0.6× the speed of the float32 one although it moves
//! half the bytes; block arrays on the stack were no better (1.3–1.5× the float32 time),
//! since the compiler kept them in memory. The rounding is the one of the buffer casts:
//! bfloat16 is [`amp_tensor::round_to_bf16`] (nearest even, NaN → `0x7FC0`) done with
//! integer lanes (not `vcvtneps2bf16`, which flushes subnormals), float16 the conversion
//! instruction `vcvtps2ph` (nearest even, as `half::f16::from_f32`).
//!
//! bfloat16 at AVX2 width runs 16 elements per step as two vectors, the even elements
//! and the odd ones ([`lanes::ld_bf16_8x2`]): a shift or a mask widens them and an `or`
//! puts the rounded halves back, where widening in order took a zero-extension per 8
//! elements and rounding a pack and a cross-lane permute. On an AMD EPYC (AVX2, 2
//! threads) that took a bfloat16 `add` of 1024² from 32 to 55 GB/s (float16: 59).
//!
//! Compiled twice, for AVX-512 (F, BW, DQ, VL) and for AVX2 + FMA + F16C; [`binary`]
//! and [`unary`] return `false` on other CPUs and for other storage types, and the
//! caller runs its general path. float32 storage takes the same loop at AVX2 width
//! (nothing to widen: the general path is compiled for the SSE2 baseline). On a Zen 5
//! with 2 threads that took float32 `add`/`mul` from 124 to 148–157 GB/s at 128² and
//! from 230 to 268–277 at 256² (in cache); from DRAM (2048²) it is the same speed.

use std::any::TypeId;
use std::mem::MaybeUninit;

use amp_tensor::half::{bf16, f16};
use amp_tensor::Element;

/// One operand of a fused loop: a run of elements, or one value for every position.
pub(crate) enum Operand<'a, S> {
    /// Consecutive elements (at least as many as the output has).
    Run(&'a [S]),
    /// The same (already widened) value everywhere.
    Splat(f32),
}

impl<S> Clone for Operand<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Operand<'_, S> {}

/// The SIMD width a fused loop is compiled for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Width {
    /// AVX-512 with `vcvtneps2bf16` (bfloat16 rounding in one instruction).
    Avx512Bf16,
    Avx512,
    Avx2,
}

fn width() -> Option<Width> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            if has!("avx512bf16") {
                return Some(Width::Avx512Bf16);
            }
            return Some(Width::Avx512);
        }
        if has!("avx2") && has!("fma") && has!("f16c") {
            return Some(Width::Avx2);
        }
    }
    None
}

/// Whether the CPU has the features of the float32 loops.
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx2") && has!("fma")
}

/// One element widened and rounded back (the loops' tails; `norm/rows_avx2.rs`'s too): the
/// bits of the vector forms.
pub(crate) trait Scalar: Copy {
    /// The value as float32 (exact).
    fn widen(self) -> f32;
    /// `v` rounded to this type (nearest even; a bfloat16 NaN as `0x7FC0`).
    fn narrow(v: f32) -> Self;
}
impl Scalar for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        amp_tensor::round_to_bf16(v)
    }
}
impl Scalar for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        v
    }
}
impl Scalar for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        f16::from_f32(v)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use io8::Io;

/// [`Io`]: 8-lane AVX2 loads and stores of the storage types (the AVX2 row kernels'
/// `norm/rows_avx2.rs` and `softmax/rows_avx2.rs`).
#[cfg(target_arch = "x86_64")]
mod io8 {
    use std::arch::x86_64::*;

    use amp_tensor::half::{bf16, f16};

    use super::Scalar;

    /// A storage type (bfloat16, float16 or float32) loaded and stored 8 float32 lanes at
    /// a time (one element at a time by [`Scalar`]).
    pub(crate) trait Io: Scalar + 'static {
        /// `true` for float32 itself (an output row can hold float32 intermediates).
        const F32: bool = false;
        /// 8 elements widened, in order.
        ///
        /// # Safety
        /// `p` is readable for 8 elements; the CPU has AVX2 and F16C (the caller is
        /// compiled with them).
        unsafe fn load8(p: *const Self) -> __m256;
        /// 8 lanes rounded and stored, in order.
        ///
        /// # Safety
        /// `p` is writable for 8 elements; the CPU has AVX2 and F16C (as above).
        unsafe fn store8(p: *mut Self, v: __m256);
        /// 16 lanes (`lo` then `hi`) rounded and stored, in order.
        ///
        /// # Safety
        /// `p` is writable for 16 elements; the CPU has AVX2 and F16C (as above).
        unsafe fn store16(p: *mut Self, lo: __m256, hi: __m256);
    }

    impl Io for bf16 {
        #[inline(always)]
        unsafe fn load8(p: *const bf16) -> __m256 {
            // SAFETY: the caller's contract.
            unsafe {
                let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x))
            }
        }
        #[inline(always)]
        unsafe fn store8(p: *mut bf16, v: __m256) {
            // SAFETY: the caller's contract.
            unsafe { _mm_storeu_si128(p.cast(), amp_tensor::simd::bf16_bits8_avx2(v)) }
        }
        #[inline(always)]
        unsafe fn store16(p: *mut bf16, lo: __m256, hi: __m256) {
            // SAFETY: the caller's contract.
            unsafe { _mm256_storeu_si256(p.cast(), amp_tensor::simd::bf16_bits16_avx2(lo, hi)) }
        }
    }

    impl Io for f32 {
        const F32: bool = true;
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller's contract.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store8(p: *mut f32, v: __m256) {
            // SAFETY: the caller's contract.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store16(p: *mut f32, lo: __m256, hi: __m256) {
            // SAFETY: the caller's contract.
            unsafe {
                _mm256_storeu_ps(p, lo);
                _mm256_storeu_ps(p.add(8), hi);
            }
        }
    }

    impl Io for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            // SAFETY: the caller's contract.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn store8(p: *mut f16, v: __m256) {
            // SAFETY: the caller's contract.
            unsafe {
                let bits = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(p.cast(), bits);
            }
        }
        #[inline(always)]
        unsafe fn store16(p: *mut f16, lo: __m256, hi: __m256) {
            // SAFETY: the caller's contract.
            unsafe {
                let lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo);
                let hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi);
                _mm256_storeu_si256(p.cast(), _mm256_set_m128i(hi, lo));
            }
        }
    }
}

/// Vector loads and stores of the formats, as arrays of float32 lanes. Each is
/// `unsafe`: `p` must be valid for the lanes read or written, and the caller must run in
/// a function compiled with the width's features (AVX-512F/BW, or AVX2 + F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes {
    use std::arch::x86_64::*;
    use std::mem::{transmute, MaybeUninit};

    use amp_tensor::half::{bf16, f16};

    /// bfloat16 rounding of 32-bit lanes (nearest even, NaN → `0x7FC0`), in the low 16
    /// bits of each lane, as [`amp_tensor::round_to_bf16`].
    macro_rules! round_bf16 {
        ($r:expr, $cast:ident, $srli:ident, $and:ident, $add:ident, $set1:ident) => {{
            let bits = $cast($r);
            let lsb = $and($srli::<16>(bits), $set1(1));
            $srli::<16>($add($add(bits, $set1(0x7FFF)), lsb))
        }};
    }

    #[inline(always)]
    pub(crate) unsafe fn ld_bf16_16(p: *const bf16) -> [f32; 16] {
        // SAFETY: the caller's contract (16 readable lanes, AVX-512F/BW enabled).
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            transmute(_mm512_slli_epi32::<16>(w))
        }
    }
    /// bfloat16 bits of 16 float32 lanes, one per 16-bit word: nearest even, NaN →
    /// `0x7FC0`, as [`amp_tensor::round_to_bf16`] (the one 512-bit rounding: the
    /// stores here, the packed products' tiles and the row kernels all narrow with it).
    ///
    /// # Safety
    /// The caller runs with AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn narrow_bf16_16(r: __m512) -> __m256i {
        // SAFETY: register-only intrinsics; AVX-512F is the caller's.
        unsafe {
            let t = round_bf16!(
                r,
                _mm512_castps_si512,
                _mm512_srli_epi32,
                _mm512_and_si512,
                _mm512_add_epi32,
                _mm512_set1_epi32
            );
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(r, r);
            let t = _mm512_mask_mov_epi32(t, nan, _mm512_set1_epi32(0x7FC0));
            _mm512_cvtepi32_epi16(t)
        }
    }
    #[inline(always)]
    pub(crate) unsafe fn st_bf16_16(p: *mut MaybeUninit<bf16>, r: [f32; 16]) {
        // SAFETY: the caller's contract (16 writable lanes, AVX-512F/BW enabled).
        unsafe { _mm256_storeu_si256(p.cast(), narrow_bf16_16(transmute::<[f32; 16], __m512>(r))) }
    }
    /// 32 bfloat16 values as two float32 vectors without a shuffle: the even elements
    /// (the low 16 bits of each 32-bit lane, shifted up) and the odd ones (the high
    /// bits, masked). [`st_bf16_pairs_ne`] puts them back in place. The element order
    /// inside a loop does not matter to an elementwise map, and the shuffle port is what
    /// the table-driven maps (`vpermt2ps`) already saturate.
    ///
    /// # Safety
    /// `p` is valid for 32 reads; the caller runs with AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn ld_bf16_pairs(p: *const bf16) -> (__m512, __m512) {
        // SAFETY: the caller's contract.
        unsafe {
            let v = _mm512_loadu_si512(p.cast());
            let odd = _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                _mm512_castsi512_ps(odd),
            )
        }
    }
    /// Rounds the two halves [`ld_bf16_pairs`] gave (even, odd) with `vcvtne2ps2bf16`
    /// and stores the 32 bfloat16 values in their places (one `vpermw` interleaves them).
    /// Returns the lanes holding a NaN or a subnormal, which that instruction does not
    /// round as [`narrow_bf16_16`] does (NaN payloads are kept, subnormals flushed): when
    /// the mask is not zero the caller writes those elements again with the integer
    /// rounding. Checking once per slice instead of branching per vector is what makes
    /// this store cheaper than one `vcvtneps2bf16` and a branch per 16 values.
    ///
    /// # Safety
    /// `p` is valid for 32 writes; the caller runs with AVX-512F/BW/DQ and AVX512-BF16.
    #[inline(always)]
    pub(crate) unsafe fn st_bf16_pairs_ne(
        p: *mut MaybeUninit<bf16>,
        even: __m512,
        odd: __m512,
    ) -> __mmask16 {
        // Word `w` of the output: even element `w / 2` (word `w / 2` of the packed pair,
        // whose low half is `even`) or odd element `w / 2` (word `16 + w / 2`).
        const INTERLEAVE: [i16; 32] = {
            let mut t = [0i16; 32];
            let mut w = 0;
            while w < 32 {
                t[w] = (w / 2 + 16 * (w % 2)) as i16;
                w += 1;
            }
            t
        };
        // SAFETY: the caller's contract; `INTERLEAVE` is 32 words.
        unsafe {
            // fpclass categories: 0x01 quiet NaN, 0x80 signalling NaN, 0x20 subnormal.
            let bad = _mm512_fpclass_ps_mask::<0xA1>(even) | _mm512_fpclass_ps_mask::<0xA1>(odd);
            let packed: __m512i = transmute(_mm512_cvtne2ps_pbh(odd, even));
            let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            _mm512_storeu_si512(p.cast(), _mm512_permutexvar_epi16(idx, packed));
            bad
        }
    }
    /// 32 bfloat16 values as 32 float32 lanes, the even elements then the odd ones
    /// ([`ld_bf16_pairs`]); [`st_bf16_32_ne`] puts them back in place. For elementwise
    /// loops, whose operands are all read in this order.
    ///
    /// # Safety
    /// `p` is valid for 32 reads; the caller runs with AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn ld_bf16_32(p: *const bf16) -> [f32; 32] {
        // SAFETY: the caller's contract; an array of two vectors is 32 float32 lanes
        // in order (a tuple's layout would not be guaranteed).
        unsafe {
            let (even, odd) = ld_bf16_pairs(p);
            transmute::<[__m512; 2], [f32; 32]>([even, odd])
        }
    }
    /// 32 float32 lanes in [`ld_bf16_32`]'s order rounded to bfloat16 and stored in
    /// place, by `vcvtne2ps2bf16` ([`st_bf16_pairs_ne`]) unless a lane holds a NaN or a
    /// subnormal, whose 32 values then take the integer rounding ([`narrow_bf16_16`]),
    /// so the bits are always those of [`st_bf16_16`]. One rounding instruction and one
    /// shuffle per 32 values, where `vcvtneps2bf16` took a rounding per 16 and the loads
    /// a widening shuffle per 16 (Zen 5: bfloat16 `add` of 128² in L1/L2, 1.4 →
    /// 1.0 µs in the loop).
    ///
    /// # Safety
    /// `p` is valid for 32 writes; the caller runs with AVX-512F/BW/DQ and AVX512-BF16.
    #[inline(always)]
    pub(crate) unsafe fn st_bf16_32_ne(p: *mut MaybeUninit<bf16>, r: [f32; 32]) {
        // SAFETY: the caller's contract.
        unsafe {
            let [even, odd] = transmute::<[f32; 32], [__m512; 2]>(r);
            if st_bf16_pairs_ne(p, even, odd) != 0 {
                // Word `w` is element `w / 2` of `even` or `odd` (as `ld_bf16_pairs`).
                let (e, o) = (narrow_bf16_16(even), narrow_bf16_16(odd));
                let lo = _mm512_cvtepu16_epi32(e);
                let hi = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(o));
                _mm512_storeu_si512(p.cast(), _mm512_or_si512(lo, hi));
            }
        }
    }
    #[inline(always)]
    pub(crate) unsafe fn ld_f16_16(p: *const f16) -> [f32; 16] {
        // SAFETY: the caller's contract (16 readable lanes, AVX-512F enabled).
        unsafe { transmute(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
    #[inline(always)]
    pub(crate) unsafe fn st_f16_16(p: *mut MaybeUninit<f16>, r: [f32; 16]) {
        // SAFETY: the caller's contract (16 writable lanes, AVX-512F enabled).
        unsafe {
            let h =
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(transmute::<
                    [f32; 16],
                    __m512,
                >(
                    r
                ));
            _mm256_storeu_si256(p.cast(), h);
        }
    }
    /// 16 bfloat16 values as 16 float32 lanes in two AVX2 vectors without a shuffle:
    /// lanes 0–7 hold the even elements (the low halves of the 32-bit words, shifted up),
    /// lanes 8–15 the odd ones (the high halves, masked). [`st_bf16_8x2`] puts them back
    /// in place; an elementwise map does not care about the order in between. Two
    /// instructions per 8 elements, as widening them in order takes, and no shuffle.
    #[inline(always)]
    pub(crate) unsafe fn ld_bf16_8x2(p: *const bf16) -> [f32; 16] {
        // SAFETY: the caller's contract (16 readable lanes, AVX2 enabled).
        unsafe {
            let v = _mm256_loadu_si256(p.cast());
            let even = _mm256_slli_epi32::<16>(v);
            let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000u32 as i32));
            transmute::<[__m256i; 2], [f32; 16]>([even, odd])
        }
    }
    /// Rounds the lanes [`ld_bf16_8x2`] gave (as [`narrow_bf16_16`]: nearest even, NaN
    /// → `0x7FC0`) and stores the 16 values in their places: the even elements' bits
    /// shifted down into the low halves, the odd ones' masked in the high halves, one
    /// `or`: no pack and no permute.
    #[inline(always)]
    pub(crate) unsafe fn st_bf16_8x2(p: *mut MaybeUninit<bf16>, r: [f32; 16]) {
        // SAFETY: the caller's contract (16 writable lanes, AVX2 enabled).
        unsafe {
            let [even, odd] = transmute::<[f32; 16], [__m256; 2]>(r);
            let lo = _mm256_srli_epi32::<16>(amp_tensor::simd::round_bf16_high_avx2(even));
            let hi = _mm256_and_si256(
                amp_tensor::simd::round_bf16_high_avx2(odd),
                _mm256_set1_epi32(0xFFFF_0000u32 as i32),
            );
            _mm256_storeu_si256(p.cast(), _mm256_or_si256(lo, hi));
        }
    }
    #[inline(always)]
    pub(crate) unsafe fn ld_f32_16(p: *const f32) -> [f32; 16] {
        // SAFETY: the caller's contract (16 readable lanes, AVX-512F enabled).
        unsafe { transmute(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    pub(crate) unsafe fn st_f32_16(p: *mut MaybeUninit<f32>, r: [f32; 16]) {
        // SAFETY: the caller's contract (16 writable lanes, AVX-512F enabled).
        unsafe { _mm512_storeu_ps(p.cast(), transmute::<[f32; 16], __m512>(r)) }
    }
    #[inline(always)]
    pub(crate) unsafe fn ld_f32_8(p: *const f32) -> [f32; 8] {
        // SAFETY: the caller's contract (8 readable lanes, AVX enabled).
        unsafe { transmute(_mm256_loadu_ps(p)) }
    }
    #[inline(always)]
    pub(crate) unsafe fn st_f32_8(p: *mut MaybeUninit<f32>, r: [f32; 8]) {
        // SAFETY: the caller's contract (8 writable lanes, AVX enabled).
        unsafe { _mm256_storeu_ps(p.cast(), transmute::<[f32; 8], __m256>(r)) }
    }
    #[inline(always)]
    pub(crate) unsafe fn ld_f16_8(p: *const f16) -> [f32; 8] {
        // SAFETY: the caller's contract (8 readable lanes, F16C enabled).
        unsafe { transmute(_mm256_cvtph_ps(_mm_loadu_si128(p.cast()))) }
    }
    #[inline(always)]
    pub(crate) unsafe fn st_f16_8(p: *mut MaybeUninit<f16>, r: [f32; 8]) {
        // SAFETY: the caller's contract (8 writable lanes, F16C enabled).
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(transmute::<[f32; 8], __m256>(r));
            _mm_storeu_si128(p.cast(), h);
        }
    }
}

/// How many leading elements of `dst` a fused loop of `L` lanes runs one by one so that
/// its vector stores start at a multiple of their size: 0 for short outputs. Large
/// buffers from the system allocator sit 16 bytes past a 64-byte line (glibc's chunk
/// header), so every unaligned 64-byte store would split across two lines; all the
/// operands of an op are usually placed alike, so aligning the output aligns the loads
/// too. Measured on a Zen 4 EPYC, a float32 `add` of 1M elements, one thread: 6-8%
/// faster aligned. Each element's bits are the same either way (the one-by-one form
/// is the scalar form the tails use).
#[inline(always)]
fn aligned_start<S, const L: usize>(dst: &[MaybeUninit<S>]) -> usize {
    let n = dst.len();
    if n < 16 * L {
        return 0;
    }
    dst.as_ptr()
        .align_offset(L * std::mem::size_of::<S>())
        .min(L - 1)
}

/// The body of a fused binary loop for one pair of operand kinds (`run`: a slice read
/// `L` lanes at a time; `splat`: one widened value). An output of at least `L`
/// elements is written by whole vectors only: the first one unaligned at 0 when the
/// aligned ones start later ([`aligned_start`]), the last one ending at `n` when `n`
/// is not a multiple of `L` past that start; both overlap elements another vector
/// writes, with the same bits (every element is `f` of its own inputs, which the output
/// does not alias). Shorter outputs go one by one. The one-by-one head and tail this
/// replaces took up to `2(L - 1)` scalar conversions: at `L = 32`, bfloat16 `add` of
/// 32² (1024 elements, 0.3 µs a call) spent a fifth of its time there. Expanded inside
/// the `#[target_feature]` function (no closure around the loads, which would not take
/// the function's features).
macro_rules! bin_loop {
    (@load run, $L:literal, $ld:ident, $s:ident, $i:ident) => {
        // SAFETY: `i + L <= n <= s.len()` (asserted by the caller); the features are
        // the caller's.
        unsafe { lanes::$ld($s.as_ptr().add($i)) }
    };
    (@load splat, $L:literal, $ld:ident, $v:ident, $i:ident) => {
        [$v; $L]
    };
    (@at run, $s:ident, $k:ident) => {
        $s[$k].widen()
    };
    (@at splat, $v:ident, $k:ident) => {
        $v
    };
    // `$body` with `$i` bound to the start of each `L`-element vector covering
    // `0..$n` (`$n >= L`): 0 when the aligned vectors (`aligned_start`) start later,
    // those, then `$n - L` when they leave a tail. The body is written out at each of
    // its three places (a closure called from them did not always inline, and one loop
    // choosing the next start cost the narrow loops a quarter more instructions).
    (@cover $S:ty, $L:literal, $dst:ident, $n:ident, $i:ident => $body:block) => {{
        let start = aligned_start::<$S, $L>($dst);
        if start > 0 {
            let $i = 0;
            $body
        }
        let mut at = start;
        while at + $L <= $n {
            let $i = at;
            $body
            at += $L;
        }
        if at < $n {
            let $i = $n - $L;
            $body
        }
    }};
    // Elements `i..i + L` (`i + L <= n`) of a unary loop (`$x` a slice).
    (@unary $L:literal, $ld:ident, $st:ident, $dst:ident, $f:ident, $x:ident, $i:expr) => {{
        let i = $i;
        // SAFETY: `i + L <= n <= x.len()`; the features are the caller's.
        let a = unsafe { lanes::$ld($x.as_ptr().add(i)) };
        let r: [f32; $L] = std::array::from_fn(|k| $f(a[k]));
        // SAFETY: `i + L <= n = dst.len()`; the features are the caller's.
        unsafe { lanes::$st($dst.as_mut_ptr().add(i), r) };
    }};
    // Elements `i..i + L` (`i + L <= n`).
    (@vector $L:literal, $ld:ident, $st:ident, $dst:ident, $f:ident,
     $x:ident: $xk:ident, $y:ident: $yk:ident, $i:expr) => {{
        let i = $i;
        let a = bin_loop!(@load $xk, $L, $ld, $x, i);
        let b = bin_loop!(@load $yk, $L, $ld, $y, i);
        let r: [f32; $L] = std::array::from_fn(|k| $f(a[k], b[k]));
        // SAFETY: `i + L <= n = dst.len()`; the features are the caller's.
        unsafe { lanes::$st($dst.as_mut_ptr().add(i), r) };
    }};
    ($L:literal, $S:ty, $ld:ident, $st:ident, $dst:ident, $f:ident,
     $x:ident: $xk:ident, $y:ident: $yk:ident) => {{
        let n = $dst.len();
        if n < $L {
            for k in 0..n {
                let (a, b) = (bin_loop!(@at $xk, $x, k), bin_loop!(@at $yk, $y, k));
                $dst[k].write(<$S>::narrow($f(a, b)));
            }
        } else {
            bin_loop!(@cover $S, $L, $dst, n, i => {
                bin_loop!(@vector $L, $ld, $st, $dst, $f, $x: $xk, $y: $yk, i);
            });
        }
    }};
}

/// A fused binary and unary loop for one format at one width.
macro_rules! fused {
    ($features:literal, $L:literal, $S:ty, $bin:ident, $un:ident, $ld:ident, $st:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $bin(
            x: Operand<'_, $S>,
            y: Operand<'_, $S>,
            dst: &mut [MaybeUninit<$S>],
            f: &impl Fn(f32, f32) -> f32,
        ) {
            let n = dst.len();
            for o in [x, y] {
                if let Operand::Run(s) = o {
                    assert!(s.len() >= n, "fused loop: operand shorter than the output");
                }
            }
            // One loop per kind of operand pair: a `match` on the operands inside the
            // loop cost 9 of its 39 instructions per 16 bfloat16 elements.
            match (x, y) {
                (Operand::Run(a), Operand::Run(b)) => {
                    bin_loop!($L, $S, $ld, $st, dst, f, a: run, b: run)
                }
                (Operand::Run(a), Operand::Splat(b)) => {
                    bin_loop!($L, $S, $ld, $st, dst, f, a: run, b: splat)
                }
                (Operand::Splat(a), Operand::Run(b)) => {
                    bin_loop!($L, $S, $ld, $st, dst, f, a: splat, b: run)
                }
                (Operand::Splat(a), Operand::Splat(b)) => {
                    dst.fill(MaybeUninit::new(<$S>::narrow(f(a, b))))
                }
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $un(x: &[$S], dst: &mut [MaybeUninit<$S>], f: &impl Fn(f32) -> f32) {
            let n = dst.len();
            assert!(x.len() >= n, "fused loop: operand shorter than the output");
            if n < $L {
                for (d, &v) in dst.iter_mut().zip(&x[..n]) {
                    d.write(<$S>::narrow(f(v.widen())));
                }
                return;
            }
            // As `bin_loop`: whole vectors only, the first and last overlapping.
            bin_loop!(@cover $S, $L, dst, n, i => {
                bin_loop!(@unary $L, $ld, $st, dst, f, x, i);
            });
        }
    };
}

fused!(
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,avx512bf16",
    32,
    bf16,
    bin_bf16_512ne,
    un_bf16_512ne,
    ld_bf16_32,
    st_bf16_32_ne
);
fused!(
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
    16,
    bf16,
    bin_bf16_512,
    un_bf16_512,
    ld_bf16_16,
    st_bf16_16
);
fused!(
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
    16,
    f16,
    bin_f16_512,
    un_f16_512,
    ld_f16_16,
    st_f16_16
);
fused!(
    "avx2,fma,f16c",
    16,
    bf16,
    bin_bf16_256,
    un_bf16_256,
    ld_bf16_8x2,
    st_bf16_8x2
);
fused!(
    "avx2,fma,f16c",
    8,
    f16,
    bin_f16_256,
    un_f16_256,
    ld_f16_8,
    st_f16_8
);
// float32 at AVX-512 and AVX2 width (the baseline build is SSE2): the same operations
// per element, so the same bits, in a quarter (an eighth) of the instructions of the
// 4-lane loop. The wider loop moves a whole cache line per load and store: a 384²
// `add` (1.7 MB, in the two cores' L2) took 20 µs at AVX2 width (PyTorch: 13 µs).
fused!(
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
    16,
    f32,
    bin_f32_512,
    un_f32_512,
    ld_f32_16,
    st_f32_16
);
fused!(
    "avx2,fma",
    8,
    f32,
    bin_f32_256,
    un_f32_256,
    ld_f32_8,
    st_f32_8
);

/// `s` as `&[U]` when `T` is `U`.
fn cast<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
    crate::unary::ewise::same::<T, U>(s)
}

/// `s` as `&mut [U]` when `T` is `U`.
fn cast_mut<T: 'static, U: 'static>(s: &mut [T]) -> Option<&mut [U]> {
    crate::unary::ewise::same_mut::<T, U>(s)
}

/// `o` as an operand of `U` when `S` is `U`.
fn operand<S: 'static, U: 'static>(o: Operand<'_, S>) -> Option<Operand<'_, U>> {
    Some(match o {
        Operand::Run(s) => Operand::Run(cast::<S, U>(s)?),
        Operand::Splat(v) => Operand::Splat(v),
    })
}

/// `dst[i] = f(x[i], y[i])` for bfloat16, float16 or float32 `S`, one pass in registers
/// (every element of `dst` written); `false` (nothing written) when `S` is another type
/// or the CPU lacks the SIMD features. Run operands are at least `dst.len()` long.
pub(crate) fn binary<S: Element>(
    x: Operand<'_, S>,
    y: Operand<'_, S>,
    dst: &mut [MaybeUninit<S>],
    f: &impl Fn(f32, f32) -> f32,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if TypeId::of::<S>() == TypeId::of::<f32>() && avx2() {
            let (Some(x), Some(y), Some(d)) = (
                operand::<S, f32>(x),
                operand::<S, f32>(y),
                cast_mut::<_, MaybeUninit<f32>>(dst),
            ) else {
                return false;
            };
            if matches!(width(), Some(Width::Avx512 | Width::Avx512Bf16)) {
                // SAFETY: `width()` checked the AVX-512 features.
                unsafe { bin_f32_512(x, y, d, f) };
            } else {
                // SAFETY: `avx2()` checked the features.
                unsafe { bin_f32_256(x, y, d, f) };
            }
            return true;
        }
        let Some(w) = width() else { return false };
        if TypeId::of::<S>() == TypeId::of::<bf16>() {
            let (Some(x), Some(y), Some(d)) = (
                operand::<S, bf16>(x),
                operand::<S, bf16>(y),
                cast_mut::<_, MaybeUninit<bf16>>(dst),
            ) else {
                return false;
            };
            // SAFETY: `width()` checked the CPU has the features of the function called.
            unsafe {
                match w {
                    Width::Avx512Bf16 => bin_bf16_512ne(x, y, d, f),
                    Width::Avx512 => bin_bf16_512(x, y, d, f),
                    Width::Avx2 => bin_bf16_256(x, y, d, f),
                }
            }
            return true;
        }
        if TypeId::of::<S>() == TypeId::of::<f16>() {
            let (Some(x), Some(y), Some(d)) = (
                operand::<S, f16>(x),
                operand::<S, f16>(y),
                cast_mut::<_, MaybeUninit<f16>>(dst),
            ) else {
                return false;
            };
            // SAFETY: as above.
            unsafe {
                match w {
                    Width::Avx512 | Width::Avx512Bf16 => bin_f16_512(x, y, d, f),
                    Width::Avx2 => bin_f16_256(x, y, d, f),
                }
            }
            return true;
        }
    }
    let _ = (x, y, dst, f);
    false
}

/// `dst[i] = f(x[i])` for bfloat16, float16 or float32 `S` (see [`binary`]).
pub(crate) fn unary<S: Element>(
    x: &[S],
    dst: &mut [MaybeUninit<S>],
    f: &impl Fn(f32) -> f32,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if let (true, Some(x), Some(d)) = (
            avx2(),
            cast::<S, f32>(x),
            cast_mut::<_, MaybeUninit<f32>>(dst),
        ) {
            if matches!(width(), Some(Width::Avx512 | Width::Avx512Bf16)) {
                // SAFETY: `width()` checked the AVX-512 features.
                unsafe { un_f32_512(x, d, f) };
            } else {
                // SAFETY: `avx2()` checked the features.
                unsafe { un_f32_256(x, d, f) };
            }
            return true;
        }
        let Some(w) = width() else { return false };
        if let (Some(x), Some(d)) = (cast::<S, bf16>(x), cast_mut::<_, MaybeUninit<bf16>>(dst)) {
            // SAFETY: `width()` checked the CPU has the features of the function called.
            unsafe {
                match w {
                    Width::Avx512Bf16 => un_bf16_512ne(x, d, f),
                    Width::Avx512 => un_bf16_512(x, d, f),
                    Width::Avx2 => un_bf16_256(x, d, f),
                }
            }
            return true;
        }
        if let (Some(x), Some(d)) = (cast::<S, f16>(x), cast_mut::<_, MaybeUninit<f16>>(dst)) {
            // SAFETY: as above.
            unsafe {
                match w {
                    Width::Avx512 | Width::Avx512Bf16 => un_f16_512(x, d, f),
                    Width::Avx2 => un_f16_256(x, d, f),
                }
            }
            return true;
        }
    }
    let _ = (x, dst, f);
    false
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    //! Every width the CPU has, on every 16-bit pattern, against the scalar rounding of
    //! the float32 result (the widths the CPU lacks are printed as skipped).
    use super::*;

    fn patterns<S>(from: impl Fn(u16) -> S, scramble: bool) -> Vec<S> {
        // Not a multiple of 16 or 8, so the tails run too.
        (0..=u16::MAX - 5)
            .map(|b| {
                from(if scramble {
                    b.wrapping_mul(7919) ^ 0x5A5A
                } else {
                    b
                })
            })
            .collect()
    }

    /// Every pair of an `x` operand and a `y` operand (each pair of kinds has its own
    /// loop).
    fn pairs<'a, A, B>(xs: &'a [A], ys: &'a [B]) -> impl Iterator<Item = (&'a A, &'a B)> {
        xs.iter().flat_map(move |a| ys.iter().map(move |b| (a, b)))
    }

    type Bin<S> =
        fn(Operand<'_, S>, Operand<'_, S>, &mut [MaybeUninit<S>], &dyn Fn(f32, f32) -> f32);
    type Un<S> = fn(&[S], &mut [MaybeUninit<S>], &dyn Fn(f32) -> f32);

    fn check<S: Scalar + Element>(
        from: impl Fn(u16) -> S + Copy,
        bits: impl Fn(S) -> u16,
        bin: Bin<S>,
        un: Un<S>,
    ) {
        let (x, y) = (patterns(from, false), patterns(from, true));
        let mut out = vec![MaybeUninit::<S>::uninit(); x.len()];
        let ops: [&dyn Fn(f32, f32) -> f32; 3] = [&|a, b| a + b, &|a, b| a * b, &|a, b| a / b];
        // Every pair of operand kinds (each has its own loop).
        let (xs, ys) = (
            [
                (Operand::Run(&x[..]), None),
                (Operand::Splat(-2.5), Some(-2.5)),
            ],
            [
                (Operand::Run(&y[..]), None),
                (Operand::Splat(1.0e-3), Some(1.0e-3)),
            ],
        );
        for f in ops {
            for ((xo, xa), (yo, ya)) in pairs(&xs, &ys) {
                bin(*xo, *yo, &mut out, f);
                for (k, o) in out.iter().enumerate() {
                    let a = xa.unwrap_or_else(|| x[k].widen());
                    let b = ya.unwrap_or_else(|| y[k].widen());
                    // SAFETY: the loop wrote every element.
                    let got = bits(unsafe { o.assume_init() });
                    assert_eq!(got, bits(S::narrow(f(a, b))), "element {k}");
                }
            }
        }
        un(&x, &mut out, &|a| a * 3.0 - 1.0);
        for (k, o) in out.iter().enumerate() {
            // SAFETY: the loop wrote every element.
            let got = bits(unsafe { o.assume_init() });
            assert_eq!(
                got,
                bits(S::narrow(x[k].widen() * 3.0 - 1.0)),
                "element {k}"
            );
        }
    }

    #[test]
    fn the_float32_loops_give_the_scalar_bits() {
        if !avx2() {
            eprintln!("skipped: the AVX2 float32 loop (the CPU lacks AVX2/FMA)");
            return;
        }
        // Every bfloat16-sized exponent/sign pattern with scrambled low mantissa bits:
        // zeros, subnormals, infinities and NaNs included; a length that leaves a tail.
        let x: Vec<f32> = (0..=u16::MAX - 5)
            .map(|b| f32::from_bits((b as u32) << 16 | (b as u32).wrapping_mul(40503) & 0xFFFF))
            .collect();
        let y: Vec<f32> = x.iter().rev().copied().collect();
        let mut out = vec![MaybeUninit::<f32>::uninit(); x.len()];
        let ops: [&dyn Fn(f32, f32) -> f32; 3] = [&|a, b| a + b, &|a, b| a * b, &|a, b| a / b];
        let same = |out: &[MaybeUninit<f32>], want: &dyn Fn(usize) -> f32| {
            for (k, o) in out.iter().enumerate() {
                // SAFETY: the loop wrote every element.
                let got = unsafe { o.assume_init() };
                assert_eq!(got.to_bits(), want(k).to_bits(), "element {k}");
            }
        };
        // Every pair of operand kinds (each has its own loop): (operand, value at `k`).
        type Side<'a> = (Operand<'a, f32>, &'a dyn Fn(usize) -> f32);
        let (xs, ys): ([Side<'_>; 2], [Side<'_>; 2]) = (
            [
                (Operand::Run(&x), &|k| x[k]),
                (Operand::Splat(0.75), &|_| 0.75),
            ],
            [
                (Operand::Run(&y), &|k| y[k]),
                (Operand::Splat(-2.5), &|_| -2.5),
            ],
        );
        for f in ops {
            for ((xo, xv), (yo, yv)) in pairs(&xs, &ys) {
                // SAFETY: `avx2()` checked the features.
                unsafe { bin_f32_256(*xo, *yo, &mut out, &f) };
                same(&out, &|k| f(xv(k), yv(k)));
            }
        }
        // SAFETY: as above.
        unsafe { un_f32_256(&x, &mut out, &|a| a * 3.0 - 1.0) };
        same(&out, &|k| x[k] * 3.0 - 1.0);
        if !matches!(width(), Some(Width::Avx512 | Width::Avx512Bf16)) {
            eprintln!("skipped: the AVX-512 float32 loop (the CPU lacks AVX-512)");
            return;
        }
        for f in ops {
            for ((xo, xv), (yo, yv)) in pairs(&xs, &ys) {
                // SAFETY: `width()` checked the AVX-512 features.
                unsafe { bin_f32_512(*xo, *yo, &mut out, &f) };
                same(&out, &|k| f(xv(k), yv(k)));
            }
        }
        // SAFETY: as above.
        unsafe { un_f32_512(&x, &mut out, &|a| a * 3.0 - 1.0) };
        same(&out, &|k| x[k] * 3.0 - 1.0);
    }

    #[test]
    fn every_width_rounds_every_pattern_like_the_scalar_casts() {
        use std::arch::is_x86_feature_detected as has;
        let w512 = has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
        let w256 = has!("avx2") && has!("fma") && has!("f16c");
        if w512 {
            // SAFETY (all four): the CPU has the AVX-512 features (checked above).
            check(
                bf16::from_bits,
                bf16::to_bits,
                |x, y, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { bin_bf16_512(x, y, d, &f) }
                },
                |x, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { un_bf16_512(x, d, &f) }
                },
            );
            check(
                f16::from_bits,
                f16::to_bits,
                |x, y, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { bin_f16_512(x, y, d, &f) }
                },
                |x, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { un_f16_512(x, d, &f) }
                },
            );
        } else {
            eprintln!("skipped: the AVX-512 fused 16-bit loops (the CPU lacks AVX-512 F/BW/DQ/VL)");
        }
        if w512 && has!("avx512bf16") {
            // SAFETY (both): the CPU has AVX-512 and AVX512-BF16 (checked above).
            check(
                bf16::from_bits,
                bf16::to_bits,
                |x, y, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { bin_bf16_512ne(x, y, d, &f) }
                },
                |x, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { un_bf16_512ne(x, d, &f) }
                },
            );
        } else {
            eprintln!("skipped: the AVX512-BF16 fused bfloat16 loops (the CPU lacks AVX512-BF16)");
        }
        if w256 {
            // SAFETY (all four): the CPU has AVX2, FMA and F16C (checked above).
            check(
                bf16::from_bits,
                bf16::to_bits,
                |x, y, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { bin_bf16_256(x, y, d, &f) }
                },
                |x, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { un_bf16_256(x, d, &f) }
                },
            );
            check(
                f16::from_bits,
                f16::to_bits,
                |x, y, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { bin_f16_256(x, y, d, &f) }
                },
                |x, d, f| {
                    // SAFETY: the CPU has the function's features (checked above).
                    unsafe { un_f16_256(x, d, &f) }
                },
            );
        } else {
            eprintln!("skipped: the AVX2 fused 16-bit loops (the CPU lacks AVX2/FMA/F16C)");
        }
    }

    #[test]
    fn every_start_and_length_gives_the_scalar_bits() {
        // The loops write an unaligned first vector up to the aligned stores
        // (`aligned_start`) and a last one ending at the output's end, both overlapping
        // others; outputs shorter than a vector go one by one: outputs starting at every
        // element of a 64-byte line, of lengths on both sides of a vector and of where
        // the alignment starts, operands placed alike or not.
        fn run<S: Scalar + Element>(from: impl Fn(f32) -> S) {
            let data = |k: usize| from((k % 97) as f32 * 0.37 - 17.0);
            let (x, y): (Vec<S>, Vec<S>) =
                ((0..1200).map(data).collect(), (7..1207).map(data).collect());
            let f = |a: f32, b: f32| a * b - a;
            let g = |a: f32| a * 3.0 - 1.0;
            let mut buf = [MaybeUninit::<S>::uninit(); 1200];
            for start in 0..32 {
                for len in [1, 15, 16, 17, 31, 32, 33, 63, 65, 255, 256, 257, 300, 1100] {
                    for shift in [0, 1] {
                        let (xs, ys) = (&x[start + shift..][..len], &y[start..][..len]);
                        let dst = &mut buf[start..][..len];
                        if !binary(Operand::Run(xs), Operand::Run(ys), dst, &f) {
                            eprintln!("skipped: the fused loops (the CPU lacks the features)");
                            return;
                        }
                        for (k, d) in dst.iter().enumerate() {
                            // SAFETY: the loop wrote every element.
                            let got = unsafe { d.assume_init() };
                            let want = S::narrow(f(xs[k].widen(), ys[k].widen()));
                            assert!(
                                got.widen().to_bits() == want.widen().to_bits(),
                                "binary at {start}+{k} of {len}"
                            );
                        }
                        assert!(unary(xs, dst, &g));
                        for (k, d) in dst.iter().enumerate() {
                            // SAFETY: as above.
                            let got = unsafe { d.assume_init() };
                            let want = S::narrow(g(xs[k].widen()));
                            assert!(
                                got.widen().to_bits() == want.widen().to_bits(),
                                "unary at {start}+{k} of {len}"
                            );
                        }
                    }
                }
            }
        }
        run::<f32>(|v| v);
        run::<bf16>(bf16::from_f32);
        run::<f16>(f16::from_f32);
    }
}
