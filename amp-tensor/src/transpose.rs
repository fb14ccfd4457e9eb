//! Transposing copies of 2-, 4- and 8-byte elements in vector registers: the tiles of
//! [`crate::convert`]'s transposed gather when source and output share a dtype (a
//! bit copy).
//!
//! The region is cut into square tiles one cache line wide (16 × 16 four-byte
//! elements, 32 × 32 two-byte, 8 × 8 eight-byte), each moved as micro-tiles of 8 × 8
//! (4 × 4 for eight bytes) transposed in registers: a tile reads whole source lines
//! and writes whole output lines, so it does not matter that the rows of a matrix
//! whose length is a multiple of 4 KiB all fall into the same L1 set. The strips at
//! the edges that do not fill a tile are copied element by element.
//!
//! Measured on a 2-core AVX-512 Xeon (float32, both threads): a 1024² transposing
//! copy took 0.63 ms against 1.29 ms for the tile-by-element loop, 2048² 2.6 ms
//! against 7.0 ms.

/// Copy with `dst[i * dc + j] = src[j * sc + i]` for `i < rows`, `j < cols`, in vector
/// registers where the CPU allows it for this element size; `false` (nothing written)
/// when there is no vector form (other sizes, or no AVX for 4- and 8-byte elements),
/// and the caller copies element by element.
///
/// # Safety
/// `src` must be valid for reads at every `j * sc + i` and `dst` for writes at every
/// `i * dc + j` (`i < rows`, `j < cols`); `T` must be a plain value whose bits may
/// be copied (every [`crate::Element`]).
pub(crate) unsafe fn transpose<T: Copy>(
    src: *const T,
    sc: usize,
    dst: *mut T,
    dc: usize,
    rows: usize,
    cols: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match size_of::<T>() {
            2 => {
                // SAFETY: the caller's ranges, for elements of the same size; SSE2 is
                // part of x86_64.
                unsafe {
                    tiles::<u16, 32, 8>(
                        src.cast(),
                        sc,
                        dst.cast(),
                        dc,
                        rows,
                        cols,
                        |s, ss, d, ds| x86::t8x8_u16(s, ss, d, ds),
                    )
                };
                return true;
            }
            4 if std::arch::is_x86_feature_detected!("avx") => {
                // SAFETY: the caller's ranges, for elements of the same size; AVX checked.
                unsafe { x86::tiles_u32(src.cast(), sc, dst.cast(), dc, rows, cols) };
                return true;
            }
            8 if std::arch::is_x86_feature_detected!("avx") => {
                // SAFETY: the caller's ranges, for elements of the same size; AVX checked.
                unsafe { x86::tiles_u64(src.cast(), sc, dst.cast(), dc, rows, cols) };
                return true;
            }
            _ => {}
        }
    }
    let _ = (src, sc, dst, dc, rows, cols);
    false
}

/// The tile walk: `L × L` tiles (one cache line of `E` wide) made of `M × M`
/// micro-tiles moved by `micro(src, sc, dst, dc)`, then the edge strips by element.
///
/// # Safety
/// As [`transpose`]; `micro` must read an `M × M` block at `src` (row stride `sc`) and
/// write its transpose at `dst` (row stride `dc`), nothing else.
#[inline(always)]
unsafe fn tiles<E: Copy, const L: usize, const M: usize>(
    src: *const E,
    sc: usize,
    dst: *mut E,
    dc: usize,
    rows: usize,
    cols: usize,
    micro: impl Fn(*const E, usize, *mut E, usize),
) {
    let (full_r, full_c) = (rows / L * L, cols / L * L);
    // SAFETY: every address below has `i < rows`, `j < cols` (the caller's ranges).
    unsafe {
        for i0 in (0..full_r).step_by(L) {
            for j0 in (0..full_c).step_by(L) {
                for i in (i0..i0 + L).step_by(M) {
                    for j in (j0..j0 + L).step_by(M) {
                        micro(src.add(j * sc + i), sc, dst.add(i * dc + j), dc);
                    }
                }
            }
        }
        let edge = |i: usize, j: usize| *dst.add(i * dc + j) = *src.add(j * sc + i);
        for i in 0..full_r {
            (full_c..cols).for_each(|j| edge(i, j));
        }
        for i in full_r..rows {
            (0..cols).for_each(|j| edge(i, j));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::tiles;

    /// 16 × 16 tiles of 8 × 8 micro-tiles, compiled for AVX.
    ///
    /// # Safety
    /// As [`super::transpose`], on a CPU with AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn tiles_u32(
        src: *const u32,
        sc: usize,
        dst: *mut u32,
        dc: usize,
        rows: usize,
        cols: usize,
    ) {
        // SAFETY: the caller's ranges; AVX is enabled here.
        unsafe {
            tiles::<u32, 16, 8>(src, sc, dst, dc, rows, cols, |s, ss, d, ds| {
                t8x8_u32(s, ss, d, ds)
            })
        }
    }

    /// 8 × 8 tiles of 4 × 4 micro-tiles, compiled for AVX.
    ///
    /// # Safety
    /// As [`super::transpose`], on a CPU with AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn tiles_u64(
        src: *const u64,
        sc: usize,
        dst: *mut u64,
        dc: usize,
        rows: usize,
        cols: usize,
    ) {
        // SAFETY: the caller's ranges; AVX is enabled here.
        unsafe {
            tiles::<u64, 8, 4>(src, sc, dst, dc, rows, cols, |s, ss, d, ds| {
                t4x4_u64(s, ss, d, ds)
            })
        }
    }

    /// One 8 × 8 block of 4-byte elements: rows loaded, interleaved in pairs, in
    /// quads, then the 128-bit halves exchanged.
    ///
    /// # Safety
    /// `s` readable as 8 rows of 8 at stride `ss`, `d` writable likewise at `ds`; AVX.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn t8x8_u32(s: *const u32, ss: usize, d: *mut u32, ds: usize) {
        // SAFETY: the caller's 8 × 8 blocks.
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(s.add(i * ss).cast()));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            // Columns 4q..4q+1 (0x44) and 4q+2..4q+3 (0xEE) of rows 0-3 / 4-7.
            let u = [
                _mm256_shuffle_ps::<0x44>(t0, t2),
                _mm256_shuffle_ps::<0xEE>(t0, t2),
                _mm256_shuffle_ps::<0x44>(t1, t3),
                _mm256_shuffle_ps::<0xEE>(t1, t3),
                _mm256_shuffle_ps::<0x44>(t4, t6),
                _mm256_shuffle_ps::<0xEE>(t4, t6),
                _mm256_shuffle_ps::<0x44>(t5, t7),
                _mm256_shuffle_ps::<0xEE>(t5, t7),
            ];
            for c in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(u[c], u[c + 4]);
                let hi = _mm256_permute2f128_ps::<0x31>(u[c], u[c + 4]);
                _mm256_storeu_ps(d.add(c * ds).cast(), lo);
                _mm256_storeu_ps(d.add((c + 4) * ds).cast(), hi);
            }
        }
    }

    /// One 4 × 4 block of 8-byte elements.
    ///
    /// # Safety
    /// `s` readable as 4 rows of 4 at stride `ss`, `d` writable likewise at `ds`; AVX.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn t4x4_u64(s: *const u64, ss: usize, d: *mut u64, ds: usize) {
        // SAFETY: the caller's 4 × 4 blocks.
        unsafe {
            let r: [__m256d; 4] = std::array::from_fn(|i| _mm256_loadu_pd(s.add(i * ss).cast()));
            let t0 = _mm256_unpacklo_pd(r[0], r[1]);
            let t1 = _mm256_unpackhi_pd(r[0], r[1]);
            let t2 = _mm256_unpacklo_pd(r[2], r[3]);
            let t3 = _mm256_unpackhi_pd(r[2], r[3]);
            _mm256_storeu_pd(d.cast(), _mm256_permute2f128_pd::<0x20>(t0, t2));
            _mm256_storeu_pd(d.add(ds).cast(), _mm256_permute2f128_pd::<0x20>(t1, t3));
            _mm256_storeu_pd(d.add(2 * ds).cast(), _mm256_permute2f128_pd::<0x31>(t0, t2));
            _mm256_storeu_pd(d.add(3 * ds).cast(), _mm256_permute2f128_pd::<0x31>(t1, t3));
        }
    }

    /// One 8 × 8 block of 2-byte elements (SSE2, part of x86_64): interleaved as
    /// 16-, 32- then 64-bit pairs.
    ///
    /// # Safety
    /// `s` readable as 8 rows of 8 at stride `ss`, `d` writable likewise at `ds`.
    #[inline(always)]
    pub(super) unsafe fn t8x8_u16(s: *const u16, ss: usize, d: *mut u16, ds: usize) {
        // SAFETY: the caller's 8 × 8 blocks; SSE2 is baseline on x86_64.
        unsafe {
            let r: [__m128i; 8] = std::array::from_fn(|i| _mm_loadu_si128(s.add(i * ss).cast()));
            let a = [
                _mm_unpacklo_epi16(r[0], r[1]),
                _mm_unpackhi_epi16(r[0], r[1]),
                _mm_unpacklo_epi16(r[2], r[3]),
                _mm_unpackhi_epi16(r[2], r[3]),
                _mm_unpacklo_epi16(r[4], r[5]),
                _mm_unpackhi_epi16(r[4], r[5]),
                _mm_unpacklo_epi16(r[6], r[7]),
                _mm_unpackhi_epi16(r[6], r[7]),
            ];
            let b = [
                _mm_unpacklo_epi32(a[0], a[2]),
                _mm_unpackhi_epi32(a[0], a[2]),
                _mm_unpacklo_epi32(a[1], a[3]),
                _mm_unpackhi_epi32(a[1], a[3]),
                _mm_unpacklo_epi32(a[4], a[6]),
                _mm_unpackhi_epi32(a[4], a[6]),
                _mm_unpacklo_epi32(a[5], a[7]),
                _mm_unpackhi_epi32(a[5], a[7]),
            ];
            for c in 0..4 {
                _mm_storeu_si128(d.add(2 * c * ds).cast(), _mm_unpacklo_epi64(b[c], b[c + 4]));
                _mm_storeu_si128(
                    d.add((2 * c + 1) * ds).cast(),
                    _mm_unpackhi_epi64(b[c], b[c + 4]),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transpose;

    /// Every size and shape against the element-by-element definition: full tiles,
    /// edge strips on either side, strides longer than the region.
    fn check<T: Copy + PartialEq + std::fmt::Debug>(make: impl Fn(usize) -> T) {
        for (rows, cols) in [(64, 64), (37, 70), (16, 3), (1, 40), (33, 33), (128, 96)] {
            let (sc, dc) = (rows + 5, cols + 3);
            let src: Vec<T> = (0..sc * cols).map(&make).collect();
            let fill = make(usize::MAX);
            let mut dst = vec![fill; dc * rows];
            // SAFETY: `src` holds `cols` rows of `sc`, `dst` `rows` rows of `dc`.
            let done = unsafe { transpose(src.as_ptr(), sc, dst.as_mut_ptr(), dc, rows, cols) };
            if !done {
                continue;
            }
            for i in 0..rows {
                for j in 0..dc {
                    let want = if j < cols { src[j * sc + i] } else { fill };
                    assert_eq!(dst[i * dc + j], want, "{rows}x{cols} at ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn transposes_every_element_size() {
        check(|i| i as u16);
        check(|i| i as u32);
        check(|i| i as u64);
        check(|i| [i as u8; 3]);
    }
}
