//! Dtype conversion of whole buffers: generic element casts, with vectorised
//! f32↔f16 (F16C via `half`, chosen at run time) and f32↔bf16 (AVX2 when present)
//! fast paths (bf16 loops compiled for AVX-512 and AVX2, picked at run time), tiled
//! copies of transposed matrices, parallel ([`crate::parallel`]) from 32K elements.
//! float32 → float16/bfloat16 outputs of `STREAM_BYTES` (64 MB) and more are written
//! with AVX-512 streaming stores, bit-identical to the ordinary loops.

use std::mem::MaybeUninit;

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::{Element, Layout, Result};

/// Buffers at least this long are converted by several threads. A conversion of this
/// many float32 elements takes 2–3 µs on one core; [`crate::parallel::for_each`]'s
/// fork-join costs well under a microsecond. (With a threshold of 256K elements and
/// rayon's parallel iterators, which hand the call to the pool and put the caller to
/// sleep, a 256K-element float32 → bfloat16 cast took 45 µs on a 2-core AMD EPYC and a
/// 128K one 11 µs on one thread.)
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// `f(src_part, dst_part)` over matching parts of `src` and `dst` (same length): on the
/// calling thread below [`PARALLEL_THRESHOLD`] elements, else in parts of
/// [`crate::parallel::part_len`] over [`crate::parallel::for_each_chunk_mut`].
fn zip_parts<T: Sync, U: Send>(src: &[T], dst: &mut [U], f: &(dyn Fn(&[T], &mut [U]) + Sync)) {
    debug_assert_eq!(src.len(), dst.len());
    let n = dst.len();
    if n < PARALLEL_THRESHOLD {
        return f(src, dst);
    }
    let per = crate::parallel::part_len(n, PARALLEL_THRESHOLD);
    crate::parallel::for_each_chunk_mut(dst, per, &|i, d| f(&src[i * per..][..d.len()], d));
}

/// A vector of `n` elements written by `fill` (which must write every element), or
/// [`crate::Error::OutOfMemory`] when the buffer cannot be allocated.
/// Large vectors reuse a dropped buffer from the [`crate::pool`] cache when one fits.
pub(crate) fn fill_vec<U: Element>(
    n: usize,
    fill: impl FnOnce(&mut [MaybeUninit<U>]),
) -> Result<Vec<U>> {
    let mut v = crate::pool::try_vec_with_capacity::<U>(n)?;
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: `fill` initialised all `n` elements (every caller writes each slot once).
    unsafe { v.set_len(n) };
    Ok(v)
}

/// f32 → bfloat16, round to nearest even, NaN to PyTorch's canonical 0x7FC0: the
/// scalar form of every f32 → bf16 cast here (kernels that fuse the rounding into their
/// own loops use it to give the same bits as [`cast_into`]).
#[inline(always)]
pub fn round_to_bf16(x: f32) -> bf16 {
    bf16::from_bits(f32_to_bf16_bits(x))
}

/// f32 → bf16 bits, round to nearest even; NaN becomes PyTorch's canonical 0x7FC0.
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if (b & 0x7FFF_FFFF) > 0x7F80_0000 {
        0x7FC0
    } else {
        rounded
    }
}

#[inline(always)]
fn f32_to_bf16_loop(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(bf16::from_bits(f32_to_bf16_bits(s)));
    }
}

/// `fn $name(src, dst)`: `$lp` compiled for AVX-512 (16 lanes) or AVX2 (8 lanes),
/// whichever the CPU has (checked at run time), else as plain code.
macro_rules! vectorised {
    ($name:ident, $lp:ident, $S:ty, $D:ty) => {
        fn $name(src: &[$S], dst: &mut [MaybeUninit<$D>]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw")]
                unsafe fn avx512(src: &[$S], dst: &mut [MaybeUninit<$D>]) {
                    $lp(src, dst)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2(src: &[$S], dst: &mut [MaybeUninit<$D>]) {
                    $lp(src, dst)
                }
                if std::arch::is_x86_feature_detected!("avx512bw") {
                    // SAFETY: the CPU supports AVX-512 F and BW (checked just above).
                    return unsafe { avx512(src, dst) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { avx2(src, dst) };
                }
            }
            $lp(src, dst)
        }
    };
}

#[inline(always)]
fn bf16_to_f32_loop(src: &[bf16], dst: &mut [MaybeUninit<f32>]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(f32::from_bits((s.to_bits() as u32) << 16));
    }
}

vectorised!(bf16_to_f32_chunk, bf16_to_f32_loop, bf16, f32);

/// f32 → bfloat16 ([`round_to_bf16`]'s bits): the scalar loop compiled for AVX-512
/// where the CPU has it (as [`vectorised!`] does), else 16 lanes at a time with AVX2
/// intrinsics ([`simd::f32_to_bf16_avx2`]), else the plain loop. Compiled for AVX2, the
/// scalar loop packed and blended every 8 lanes in two 128-bit halves (14 instructions
/// per 8 elements); rounding 16 lanes and packing them with one `vpackusdw` and one
/// permute takes 19 per 16.
fn f32_to_bf16_chunk(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn avx512(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
            f32_to_bf16_loop(src, dst)
        }
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU supports AVX-512 F and BW (checked just above).
            return unsafe { avx512(src, dst) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { simd::f32_to_bf16_avx2(src, dst) };
        }
    }
    f32_to_bf16_loop(src, dst)
}

/// SIMD pieces of the bfloat16 rounding that kernels of other crates fuse into their
/// own loops (the same bits as [`round_to_bf16`]).
#[cfg(target_arch = "x86_64")]
pub mod simd {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use half::bf16;

    /// The bfloat16 rounding of 8 float32 lanes (nearest even, NaN → `0x7FC0`, as
    /// [`round_to_bf16`](super::round_to_bf16)) in the high 16 bits of each lane; the
    /// low 16 bits are left over (shift them out or mask them off).
    ///
    /// # Safety
    /// The caller runs with AVX2.
    #[inline(always)]
    pub unsafe fn round_bf16_high_avx2(r: __m256) -> __m256i {
        // SAFETY: register-only intrinsics; AVX2 is the caller's.
        unsafe {
            let bits = _mm256_castps_si256(r);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
            let t = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(r, r));
            _mm256_blendv_epi8(t, _mm256_set1_epi32(0x7FC0_0000), nan)
        }
    }

    /// 8 float32 lanes rounded to bfloat16 ([`round_bf16_high_avx2`]) and packed in
    /// order into 8 16-bit lanes.
    ///
    /// # Safety
    /// The caller runs with AVX2.
    #[inline(always)]
    pub unsafe fn bf16_bits8_avx2(v: __m256) -> __m128i {
        // SAFETY: register-only intrinsics; AVX2 is the caller's. Every lane is in
        // 0..=0xFFFF after the shift, so the saturating pack keeps it.
        unsafe {
            let t = _mm256_srli_epi32::<16>(round_bf16_high_avx2(v));
            _mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
        }
    }

    /// 16 float32 lanes (`lo` then `hi`) rounded to bfloat16 ([`round_bf16_high_avx2`])
    /// and packed in order into 16 16-bit lanes: `vpackusdw` interleaves the two
    /// vectors' 128-bit halves, the permute puts them in order.
    ///
    /// # Safety
    /// The caller runs with AVX2.
    #[inline(always)]
    pub unsafe fn bf16_bits16_avx2(lo: __m256, hi: __m256) -> __m256i {
        // SAFETY: as [`bf16_bits8_avx2`].
        unsafe {
            let a = _mm256_srli_epi32::<16>(round_bf16_high_avx2(lo));
            let b = _mm256_srli_epi32::<16>(round_bf16_high_avx2(hi));
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b))
        }
    }

    /// [`super::f32_to_bf16_chunk`] with AVX2: 16 lanes rounded, shifted down, packed
    /// (`vpackusdw` interleaves the two vectors' 128-bit halves, the permute puts them in
    /// order) and stored; the last `n % 16` by the scalar loop.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn f32_to_bf16_avx2(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` elements of both slices; unaligned loads and stores.
            unsafe {
                let a = _mm256_loadu_ps(src.as_ptr().add(i));
                let b = _mm256_loadu_ps(src.as_ptr().add(i + 8));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), bf16_bits16_avx2(a, b));
            }
            i += 16;
        }
        super::f32_to_bf16_loop(&src[i..n], &mut dst[i..n]);
    }
}

/// f32 → float16 (round to nearest even, as `half`'s `f16::from_f32` and the CPU's
/// `vcvtps2ph` both do, NaN payloads included) with the conversion instruction, 16 or 8
/// lanes at a time: `half`'s slice routine checks the CPU and converts four lanes per
/// call, which made a float16 `add` a fifth of the speed of a bfloat16 one.
fn f32_to_f16_chunk(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f")]
            unsafe fn body(src: &[f32], dst: &mut [MaybeUninit<f16>]) -> usize {
                let mut i = 0;
                while i + 16 <= src.len() {
                    // SAFETY: `i + 16 <= len` for both slices (the caller passes equal
                    // lengths); unaligned loads and stores.
                    unsafe {
                        let x = _mm512_loadu_ps(src.as_ptr().add(i));
                        let h =
                            _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                        _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
                    }
                    i += 16;
                }
                i
            }
            // SAFETY: the CPU has AVX-512F (checked just above).
            let done = unsafe { body(&src[..n], &mut dst[..n]) };
            return f32_to_f16_tail(&src[done..n], &mut dst[done..n]);
        }
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn body(src: &[f32], dst: &mut [MaybeUninit<f16>]) -> usize {
                let mut i = 0;
                while i + 8 <= src.len() {
                    // SAFETY: as above, eight lanes.
                    unsafe {
                        let x = _mm256_loadu_ps(src.as_ptr().add(i));
                        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                        _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
                    }
                    i += 8;
                }
                i
            }
            // SAFETY: the CPU has AVX2 and F16C (checked just above).
            let done = unsafe { body(&src[..n], &mut dst[..n]) };
            return f32_to_f16_tail(&src[done..n], &mut dst[done..n]);
        }
    }
    f32_to_f16_tail(src, dst)
}

fn f32_to_f16_tail(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
    uninit_as_init(dst).convert_from_f32_slice(src);
}

/// float16 → f32 (exact) with the conversion instruction, 16 or 8 lanes at a time (see
/// [`f32_to_f16_chunk`]).
fn f16_to_f32_chunk(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f")]
            unsafe fn body(src: &[f16], dst: &mut [MaybeUninit<f32>]) -> usize {
                let mut i = 0;
                while i + 16 <= src.len() {
                    // SAFETY: `i + 16 <= len` for both slices; unaligned loads and stores.
                    unsafe {
                        let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                        _mm512_storeu_ps(dst.as_mut_ptr().add(i).cast(), _mm512_cvtph_ps(h));
                    }
                    i += 16;
                }
                i
            }
            // SAFETY: the CPU has AVX-512F (checked just above).
            let done = unsafe { body(&src[..n], &mut dst[..n]) };
            return f16_to_f32_tail(&src[done..n], &mut dst[done..n]);
        }
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn body(src: &[f16], dst: &mut [MaybeUninit<f32>]) -> usize {
                let mut i = 0;
                while i + 8 <= src.len() {
                    // SAFETY: as above, eight lanes.
                    unsafe {
                        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                        _mm256_storeu_ps(dst.as_mut_ptr().add(i).cast(), _mm256_cvtph_ps(h));
                    }
                    i += 8;
                }
                i
            }
            // SAFETY: the CPU has AVX2 and F16C (checked just above).
            let done = unsafe { body(&src[..n], &mut dst[..n]) };
            return f16_to_f32_tail(&src[done..n], &mut dst[done..n]);
        }
    }
    f16_to_f32_tail(src, dst)
}

fn f16_to_f32_tail(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
    src.convert_to_f32_slice(uninit_as_init(dst));
}

fn uninit_as_init<U>(dst: &mut [MaybeUninit<U>]) -> &mut [U] {
    // The half conversion routines take `&mut [U]`; they only write. Zero-initialise
    // first is unnecessary for plain-old-data: every bit pattern of f16/f32 is valid.
    // SAFETY: f16 and f32 have no invalid bit patterns and the slice is only written.
    unsafe { &mut *(dst as *mut [MaybeUninit<U>] as *mut [U]) }
}

/// Reinterpret a slice of `T` as a slice of `V` when they are the same type.
fn same<T: Element, V: Element>(s: &[T]) -> Option<&[V]> {
    // SAFETY: `DTYPE` is unique per element type, so equal dtypes mean T == V.
    (T::DTYPE == V::DTYPE).then(|| unsafe { &*(s as *const [T] as *const [V]) })
}

fn same_mut<T: Element, V: Element>(s: &mut [MaybeUninit<T>]) -> Option<&mut [MaybeUninit<V>]> {
    // SAFETY: as in `same`.
    (T::DTYPE == V::DTYPE)
        .then(|| unsafe { &mut *(s as *mut [MaybeUninit<T>] as *mut [MaybeUninit<V>]) })
}

fn cast_chunk<T: Element, U: Element>(src: &[T], dst: &mut [MaybeUninit<U>]) {
    // Fast paths for the conversions AMP does all the time (resolved at compile time).
    if let (Some(s), Some(d)) = (same::<T, f32>(src), same_mut::<U, bf16>(dst)) {
        return f32_to_bf16_chunk(s, d);
    }
    if let (Some(s), Some(d)) = (same::<T, bf16>(src), same_mut::<U, f32>(dst)) {
        return bf16_to_f32_chunk(s, d);
    }
    if let (Some(s), Some(d)) = (same::<T, f32>(src), same_mut::<U, f16>(dst)) {
        return f32_to_f16_chunk(s, d);
    }
    if let (Some(s), Some(d)) = (same::<T, f16>(src), same_mut::<U, f32>(dst)) {
        return f16_to_f32_chunk(s, d);
    }
    if let (Some(s), Some(d)) = (same::<T, U>(src), same_mut::<U, U>(dst)) {
        for (d, &s) in d.iter_mut().zip(s) {
            d.write(s);
        }
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s.cast::<U>());
    }
}

/// Convert `src` into `dst` (same length) on the calling thread, with the vectorised
/// fast paths. Kernels use it to widen a chunk of f16/bf16 into f32 and back.
pub fn cast_into<T: Element, U: Element>(src: &[T], dst: &mut [U]) {
    assert_eq!(src.len(), dst.len(), "cast_into: length mismatch");
    // SAFETY: viewing initialised elements as MaybeUninit is always sound; we only write.
    let d = unsafe { &mut *(dst as *mut [U] as *mut [MaybeUninit<U>]) };
    cast_chunk(src, d)
}

/// Convert `src` into possibly uninitialised `dst` (same length) on the calling
/// thread, with the vectorised fast paths; every element of `dst` is written.
pub fn cast_into_uninit<T: Element, U: Element>(src: &[T], dst: &mut [MaybeUninit<U>]) {
    assert_eq!(src.len(), dst.len(), "cast_into_uninit: length mismatch");
    cast_chunk(src, dst)
}

/// Outputs of at least this many bytes are written with non-temporal (streaming)
/// stores, as `memcpy` does for copies this large: they cannot stay in cache anyway,
/// and a streaming store skips reading each destination line before writing it
/// (a quarter of the traffic of an f32 -> 16-bit cast).
pub const STREAM_BYTES: usize = 64 << 20;

/// Narrow f32 to f16/bf16 with streaming stores where the CPU has AVX-512 (else the
/// ordinary conversion). The values are those of [`cast_chunk`], bit for bit.
fn cast_chunk_streaming<T: Element, U: Element>(src: &[T], dst: &mut [MaybeUninit<U>]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        if let (Some(s), Some(d)) = (same::<T, f32>(src), same_mut::<U, bf16>(dst)) {
            // SAFETY: AVX-512 F/BW are present (checked above).
            return unsafe { stream::f32_to_bf16(s, d) };
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            if let (Some(s), Some(d)) = (same::<T, f32>(src), same_mut::<U, f16>(dst)) {
                // SAFETY: AVX-512 F/BW and F16C are present (checked above).
                return unsafe { stream::f32_to_f16(s, d) };
            }
        }
    }
    cast_chunk(src, dst)
}

#[cfg(target_arch = "x86_64")]
mod stream {
    //! 16 lanes at a time, 32-byte aligned streaming stores; the unaligned head and the
    //! tail go through the scalar loops. Each function ends with `sfence`, so its
    //! stores are ordered before whatever the thread does next (the fork-join's
    //! completion count then publishes them to the caller).
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use half::{bf16, f16};

    /// The number of leading elements of 2 bytes before `p` is 32-byte aligned.
    fn head_len<D>(p: *const D, n: usize) -> usize {
        (((32 - (p as usize) % 32) % 32) / 2).min(n)
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn f32_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
        let n = src.len().min(dst.len());
        let head = head_len(dst.as_ptr(), n);
        super::f32_to_bf16_loop(&src[..head], &mut dst[..head]);
        let mut i = head;
        let (one, bias) = (_mm512_set1_epi32(1), _mm512_set1_epi32(0x7FFF));
        let (abs_mask, inf) = (
            _mm512_set1_epi32(0x7FFF_FFFF),
            _mm512_set1_epi32(0x7F80_0000),
        );
        let qnan = _mm512_set1_epi32(0x7FC0);
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` elements of both slices; `dst + i` is 32-byte
            // aligned (the head brought it there and each step adds 32 bytes).
            unsafe {
                let b = _mm512_loadu_si512(src.as_ptr().add(i).cast());
                // Round to nearest even, as `f32_to_bf16_bits`; NaN -> 0x7FC0.
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(b, bias), lsb));
                let nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs_mask), inf);
                let r = _mm512_mask_mov_epi32(r, nan, qnan);
                _mm256_stream_si256(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi16(r));
            }
            i += 16;
        }
        super::f32_to_bf16_loop(&src[i..n], &mut dst[i..n]);
        _mm_sfence();
    }

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
        let n = src.len().min(dst.len());
        let head = head_len(dst.as_ptr(), n);
        for (d, &s) in dst[..head].iter_mut().zip(&src[..head]) {
            d.write(f16::from_f32(s));
        }
        let mut i = head;
        while i + 16 <= n {
            // SAFETY: as in `f32_to_bf16`.
            unsafe {
                let x = _mm512_loadu_ps(src.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                _mm256_stream_si256(dst.as_mut_ptr().add(i).cast(), h);
            }
            i += 16;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            d.write(f16::from_f32(s));
        }
        _mm_sfence();
    }
}

/// Convert a contiguous slice, in parallel when it is large; [`crate::Error::OutOfMemory`]
/// when the output cannot be allocated.
pub fn cast_slice<T: Element, U: Element>(src: &[T]) -> Result<Vec<U>> {
    fill_vec(src.len(), |dst| {
        if src.len() * std::mem::size_of::<U>() >= STREAM_BYTES {
            zip_parts(src, dst, &cast_chunk_streaming);
        } else {
            zip_parts(src, dst, &cast_chunk);
        }
    })
}

/// Gather the elements `layout` selects from `src` in row-major order, converting
/// each to `U`. Contiguous layouts take [`cast_slice`]. [`crate::Error::OutOfMemory`]
/// when the output cannot be allocated.
pub fn gather_cast<T: Element, U: Element>(src: &[T], layout: &Layout) -> Result<Vec<U>> {
    if let Some(r) = layout.contiguous_range() {
        return cast_slice(&src[r]);
    }
    if let Some(out) = gather_transposed(src, layout) {
        return out;
    }
    let (n, run) = (layout.elem_count(), layout.run_len());
    fill_vec(n, |out| {
        if n >= PARALLEL_THRESHOLD && run > 0 {
            // Parts of whole runs, each gathered from its own first run.
            let per = (crate::parallel::part_len(n, PARALLEL_THRESHOLD) / run).max(1);
            crate::parallel::for_each_chunk_mut(out, per * run, &|c, part| {
                gather_runs(src, layout, c * per..c * per + part.len() / run, part);
            });
        } else if let Some(runs) = n.checked_div(run) {
            gather_runs(src, layout, 0..runs, out);
        }
    })
}

/// Runs `runs` of `layout` ([`Layout::for_each_run_in`]) from `src` into `out`, which
/// holds exactly their elements, converted to `U`.
fn gather_runs<T: Element, U: Element>(
    src: &[T],
    layout: &Layout,
    runs: std::ops::Range<usize>,
    out: &mut [MaybeUninit<U>],
) {
    let mut i = 0;
    layout.for_each_run_in(runs, |start, len, stride| {
        let dst = &mut out[i..i + len];
        if stride == 1 {
            cast_chunk(&src[start..start + len], dst);
        } else if stride == 0 {
            // Broadcast (expanded) dimensions: one value repeated.
            let v = src[start].cast::<U>();
            dst.iter_mut().for_each(|d| {
                d.write(v);
            });
        } else {
            for (k, d) in dst.iter_mut().enumerate() {
                d.write(src[start + k * stride].cast::<U>());
            }
        }
        i += len;
    });
    debug_assert_eq!(i, out.len(), "gather_runs: the runs fill the output");
}

/// [`gather_transposed`] applies to matrices with at least this many rows and columns.
const TILE: usize = 32;

/// Output rows per task of [`gather_transposed`].
const RUN: usize = 64;

/// Gather of a layout whose last two dimensions read as a transposed matrix (stride 1
/// on the second-to-last, a long stride on the last, as `w.t()` or a gradient computed
/// as `(gᵀ @ x)ᵀ`): copied tile by tile so both sides stay in cache, over
/// [`crate::parallel::for_each`] when large. `None` for other layouts (the run-by-run
/// gather handles them); the error of an output that cannot be allocated.
fn gather_transposed<T: Element, U: Element>(src: &[T], layout: &Layout) -> Option<Result<Vec<U>>> {
    let rank = layout.rank();
    if rank < 2 {
        return None;
    }
    let (dims, strides) = (layout.dims(), layout.strides());
    let (r, c, sc) = (dims[rank - 2], dims[rank - 1], strides[rank - 1]);
    if strides[rank - 2] != 1 || sc < TILE || r < TILE || c < TILE {
        return None;
    }
    let outer = Layout::new(
        dims[..rank - 2].to_vec(),
        strides[..rank - 2].to_vec(),
        layout.offset(),
    );
    let alloc = || -> Result<(Vec<usize>, Vec<U>)> {
        let bases = crate::pool::try_collect(outer.elem_count(), outer.offsets())?;
        Ok((
            bases,
            crate::pool::try_recycled_vec::<U>(layout.elem_count())?,
        ))
    };
    let (bases, mut out) = match alloc() {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    // Rows `i0..i0 + RUN` of one matrix (out[i][j] = src[base + i + j * sc]), through
    // square tiles of `w` (a cache line of the narrower type, at most 32): a tile's
    // source runs are read whole into a buffer on the stack, transposed there, and
    // its output rows written whole. Reading or writing a column of the matrix in
    // place instead touches one cache line per row, and when the row length is a
    // multiple of 4 KiB all those lines fall into the same L1 set and evict each
    // other: a 1024² float32 `t().contiguous()` took 2.3 ms (1.8 GB/s, 2-core Xeon).
    let w = (64 / size_of::<T>().min(size_of::<U>()).max(1)).clamp(8, 32);
    let block = |rows: &mut [U], base: usize, i0: usize| {
        let nr = rows.len() / c;
        if T::DTYPE == U::DTYPE {
            // A bit copy: in vector registers where the CPU has them for this size.
            let last = base + i0 + (nr - 1) + (c - 1) * sc;
            assert!(last < src.len(), "transposed gather out of bounds");
            // SAFETY: `T` and `U` are the same type (one dtype, one element type);
            // the reads `base + i0 + i + j * sc` (i < nr, j < c) end at `last`, inside
            // `src`; the writes `i * c + j` lie inside `rows` (`nr * c` long).
            let done = unsafe {
                crate::transpose::transpose(
                    src.as_ptr().add(base + i0).cast::<U>(),
                    sc,
                    rows.as_mut_ptr(),
                    c,
                    nr,
                    c,
                )
            };
            if done {
                return;
            }
        }
        let mut tile = [[U::default(); 32]; RUN];
        for j0 in (0..c).step_by(w) {
            let wj = w.min(c - j0);
            for jj in 0..wj {
                let run = &src[base + i0 + (j0 + jj) * sc..][..nr];
                for (row, v) in tile.iter_mut().zip(run) {
                    row[jj] = v.cast::<U>();
                }
            }
            for i in 0..nr {
                // An element loop, not `copy_from_slice`: a run this short is faster
                // inline than as a `memmove` call.
                let out = &mut rows[i * c + j0..][..wj];
                for (o, &v) in out.iter_mut().zip(&tile[i]) {
                    *o = v;
                }
            }
        }
    };
    let per_block = RUN * c;
    if out.len() >= PARALLEL_THRESHOLD {
        // One task per block of `RUN` rows of one matrix.
        let blocks = r.div_ceil(RUN);
        let out_ptr = crate::parallel::SendPtr(out.as_mut_ptr());
        crate::parallel::for_each(bases.len() * blocks, &|t| {
            let (m, b) = (t / blocks, t % blocks);
            let start = m * r * c + b * per_block;
            let len = per_block.min((m + 1) * r * c - start);
            // SAFETY: task `t` writes rows `b * RUN..` of matrix `m` only, elements
            // `start..start + len` of `out`, disjoint from every other task's and
            // inside `out` (`bases.len() * r * c` long); `out` is not touched otherwise
            // until `for_each` returns.
            let rows = unsafe { std::slice::from_raw_parts_mut(out_ptr.at(start), len) };
            block(rows, bases[m], b * RUN);
        });
    } else {
        for (mat, &base) in out.chunks_mut(r * c).zip(&bases) {
            for (b, rows) in mat.chunks_mut(per_block).enumerate() {
                block(rows, base, b * RUN);
            }
        }
    }
    Some(Ok(out))
}

/// Copy (with a cast) from a gathered source into the places `dst_layout` selects.
pub fn scatter_cast<T: Element, U: Element>(src: &[T], dst: &mut [U], dst_layout: &Layout) {
    debug_assert_eq!(src.len(), dst_layout.elem_count());
    if let Some(r) = dst_layout.contiguous_range() {
        zip_parts(src, &mut dst[r], &|s, d| cast_into(s, d));
        return;
    }
    let mut i = 0;
    dst_layout.for_each_run(|start, len, stride| {
        for k in 0..len {
            dst[start + k * stride] = src[i + k].cast();
        }
        i += len;
    });
}

/// The transpose of a matrix into a row-major buffer, on the calling thread:
/// `dst[i * cols + j] = src[j * src_stride + i]` for `i < rows`, `j < cols` (`src` holds
/// `cols` rows of `rows` elements, each `src_stride` apart: a column-major `rows × cols`
/// matrix). In vector registers for 2-, 4- and 8-byte elements where the CPU has them,
/// tile by tile, else element by element; the bits are the same either way.
///
/// # Panics
/// When `dst` is shorter than `rows * cols`, `src_stride < rows` with more than one
/// column, or the last source element lies outside `src`.
pub fn transpose_into<T: Element>(
    src: &[T],
    src_stride: usize,
    dst: &mut [T],
    rows: usize,
    cols: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(dst.len() >= rows * cols, "transpose_into: output too short");
    assert!(
        cols == 1 || src_stride >= rows,
        "transpose_into: overlapping source rows"
    );
    assert!(
        (cols - 1) * src_stride + rows <= src.len(),
        "transpose_into: source out of bounds"
    );
    // SAFETY: reads `j * src_stride + i` end at the element checked above; writes
    // `i * cols + j` end before `rows * cols`, inside `dst`.
    let done = unsafe {
        crate::transpose::transpose(src.as_ptr(), src_stride, dst.as_mut_ptr(), cols, rows, cols)
    };
    if !done {
        for (i, out) in dst[..rows * cols].chunks_exact_mut(cols).enumerate() {
            for (j, o) in out.iter_mut().enumerate() {
                *o = src[j * src_stride + i];
            }
        }
    }
}

/// Copy (with a cast) the elements `src_layout` selects from `src` into the places
/// `dst_layout` selects in `dst` (same element count), without an intermediate buffer when
/// either side is contiguous. The two buffers are distinct, so nothing aliases.
/// [`crate::Error::OutOfMemory`] when neither side is contiguous and the intermediate
/// buffer cannot be allocated (nothing is written then).
pub fn copy_cast<T: Element, U: Element>(
    src: &[T],
    src_layout: &Layout,
    dst: &mut [U],
    dst_layout: &Layout,
) -> Result<()> {
    debug_assert_eq!(src_layout.elem_count(), dst_layout.elem_count());
    match (src_layout.contiguous_range(), dst_layout.contiguous_range()) {
        (Some(rs), Some(rd)) => {
            zip_parts(&src[rs], &mut dst[rd], &|s, d| cast_into(s, d));
        }
        (Some(rs), None) => scatter_cast(&src[rs], dst, dst_layout),
        (None, Some(rd)) => {
            let dst = &mut dst[rd];
            let mut i = 0;
            src_layout.for_each_run(|start, len, stride| {
                let d = &mut dst[i..i + len];
                if stride == 1 {
                    cast_into(&src[start..start + len], d);
                } else {
                    for (k, d) in d.iter_mut().enumerate() {
                        *d = src[start + k * stride].cast();
                    }
                }
                i += len;
            });
        }
        (None, None) => scatter_cast(&gather_cast::<T, T>(src, src_layout)?, dst, dst_layout),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gather of at least `PARALLEL_THRESHOLD` elements, split into parts of whole
    /// runs each started from its own run index, gives the elements in the layout's
    /// order: attention's head permutation (runs of 32), a transposed slice with a step
    /// (runs of one strided element), an expanded dim (runs of a repeated value) and a
    /// run count that does not divide into the parts evenly.
    #[test]
    fn parallel_gathers_keep_the_layout_order() {
        let src: Vec<f32> = (0..(1 << 18)).map(|i| i as f32 * 0.5 - 7.0).collect();
        let base = Layout::contiguous([4, 64, 8, 32]);
        let layouts = [
            base.permute(&[0usize, 2, 1, 3]).unwrap(),
            Layout::contiguous([256, 1024])
                .transpose(0usize, 1usize)
                .unwrap()
                .slice(1usize, 3, 256, 3)
                .unwrap(),
            Layout::contiguous([37, 1, 29])
                .broadcast_as(&[37, 41, 29])
                .unwrap(),
            Layout::contiguous([3, 11, 1000])
                .slice(2usize, 0, 999, 1)
                .unwrap(),
        ];
        for (i, l) in layouts.iter().enumerate() {
            assert!(l.elem_count() >= PARALLEL_THRESHOLD, "layout {i} is large");
            assert!(l.contiguous_range().is_none(), "layout {i} is strided");
            let want: Vec<f32> = l.offsets().map(|o| src[o]).collect();
            assert_eq!(
                gather_cast::<f32, f32>(&src, l).unwrap(),
                want,
                "layout {i}"
            );
            let narrow: Vec<bf16> = want.iter().map(|&v| round_to_bf16(v)).collect();
            assert_eq!(
                gather_cast::<f32, bf16>(&src, l).unwrap(),
                narrow,
                "layout {i}"
            );
        }
    }

    #[test]
    fn bf16_matches_half_for_every_non_nan_input_pattern_sample() {
        // exhaustive over the 16-bit patterns is in the integration tests; here a sweep
        for hi in (0u32..=0xFFFF).step_by(7) {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = f32::from_bits((hi << 16) | lo);
                let ours = bf16::from_bits(f32_to_bf16_bits(x));
                if x.is_nan() {
                    assert_eq!(ours.to_bits(), 0x7FC0);
                } else {
                    assert_eq!(ours.to_bits(), bf16::from_f32(x).to_bits(), "{x:e}");
                }
            }
        }
    }

    /// Each vector form of the f32 → bfloat16 cast the CPU runs gives the scalar
    /// rounding's bits for every high half with the low halves that round down, tie
    /// (both ways) and round up, NaNs and infinities included, over a length that
    /// leaves a tail.
    #[test]
    fn bf16_chunks_round_every_pattern_like_the_scalar_form() {
        let src: Vec<f32> = (0u32..=0xFFFF)
            .flat_map(|hi| [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF].map(|lo| (hi << 16) | lo))
            .map(f32::from_bits)
            .chain([1.5, -0.25, 3.0])
            .collect();
        type Narrow<'a> = &'a dyn Fn(&[f32], &mut [MaybeUninit<bf16>]);
        let check = |what: &str, f: Narrow<'_>| {
            let mut dst = vec![MaybeUninit::<bf16>::uninit(); src.len()];
            f(&src, &mut dst);
            for (k, (d, &x)) in dst.iter().zip(&src).enumerate() {
                // SAFETY: the conversion wrote every element.
                let got = unsafe { d.assume_init() }.to_bits();
                assert_eq!(
                    got,
                    f32_to_bf16_bits(x),
                    "{what}: element {k} ({:#x})",
                    x.to_bits()
                );
            }
        };
        check("f32_to_bf16_chunk", &|s, d| f32_to_bf16_chunk(s, d));
        check("f32_to_bf16_loop", &|s, d| f32_to_bf16_loop(s, d));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            check("f32_to_bf16_avx2", &|s, d| unsafe {
                simd::f32_to_bf16_avx2(s, d)
            });
        } else {
            eprintln!("skipped: the AVX2 f32 -> bfloat16 loop (the CPU lacks AVX2)");
        }
    }

    #[test]
    fn parallel_path_equals_scalar() {
        let src: Vec<f32> = (0..PARALLEL_THRESHOLD + 123)
            .map(|i| (i as f32).sin() * 1e3)
            .collect();
        let a: Vec<bf16> = cast_slice(&src).unwrap();
        let b: Vec<f16> = cast_slice(&src).unwrap();
        for (i, &s) in src.iter().enumerate() {
            assert_eq!(a[i], bf16::from_f32(s));
            assert_eq!(b[i], f16::from_f32(s));
        }
        let back: Vec<f32> = cast_slice(&a).unwrap();
        assert_eq!(back[77], a[77].to_f32());
    }

    /// The tiled gather of transposed matrices equals the element-by-element one, for
    /// batched, odd-sized, offset, small (sequential) and large (parallel) layouts, with
    /// and without a cast.
    #[test]
    fn transposed_gather_equals_offsets_walk() {
        let check = |dims: &[usize], strides: &[usize], offset: usize| {
            let layout = Layout::new(dims.to_vec(), strides.to_vec(), offset);
            let end = offset
                + dims
                    .iter()
                    .zip(strides)
                    .map(|(d, s)| (d - 1) * s)
                    .sum::<usize>();
            let src: Vec<f32> = (0..=end).map(|i| i as f32 * 0.5 - 7.0).collect();
            let want: Vec<bf16> = layout.offsets().map(|o| bf16::from_f32(src[o])).collect();
            assert!(
                gather_transposed::<f32, bf16>(&src, &layout).is_some(),
                "{dims:?}"
            );
            assert_eq!(
                gather_cast::<f32, bf16>(&src, &layout).unwrap(),
                want,
                "{dims:?}"
            );
            // Same type: tiles of 16 (a cache line of float32), not 32.
            let same: Vec<f32> = layout.offsets().map(|o| src[o]).collect();
            assert_eq!(
                gather_cast::<f32, f32>(&src, &layout).unwrap(),
                same,
                "{dims:?}"
            );
        };
        check(&[33, 70], &[1, 33], 0);
        check(&[40, 45], &[1, 50], 3);
        check(&[3, 37, 41], &[37 * 41, 1, 37], 0);
        check(&[2, 3, 33, 35], &[3 * 33 * 35, 33 * 35, 1, 33], 1);
        check(&[700, 800], &[1, 700], 0);
        check(&[2, 520, 530], &[520 * 530, 1, 520], 0);
    }
}
