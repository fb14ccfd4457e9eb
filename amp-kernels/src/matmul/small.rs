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
    //! ([`Lanes`]), one tile loop generic over it.
    use super::{GemmFloat, Product, SmallVector};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Rows of `A` per register tile: eight independent multiply-add chains, enough
    /// for two FMA units with four cycles of latency.
    const ROWS: usize = 8;

    /// A `B` whose rows are not contiguous is copied into a stack buffer of this many
    /// elements when it fits (else the portable loop takes the product).
    const PACK: usize = 4096;

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
    unsafe fn widest<Wide: Lanes, Narrow: Lanes<E = Wide::E>>(pr: Product<'_, Wide::E>) -> bool {
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
    unsafe fn on_avx2<L: Lanes>(pr: Product<'_, L::E>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { run::<L>(pr) }
    }

    /// [`run`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F, and `L` needs no more; the contract of [`run`].
    #[target_feature(enable = "avx512f")]
    unsafe fn on_avx512<L: Lanes>(pr: Product<'_, L::E>) -> bool {
        // SAFETY: the caller's contract.
        unsafe { run::<L>(pr) }
    }

    /// `pr` on register type `L`, with `B` copied row-major first when its rows are
    /// not contiguous; false (nothing done) when such a `B` is larger than [`PACK`].
    ///
    /// # Safety
    /// The contract of [`small_product`](super::small_product); the CPU has `L`'s
    /// features.
    #[inline(always)]
    unsafe fn run<L: Lanes>(pr: Product<'_, L::E>) -> bool {
        let (b, sb, ib) = pr.b;
        let (k, n) = (pr.k, pr.n);
        // SAFETY: matrix `ib` of `b` lies inside it (the caller's contract).
        let b0 = unsafe { b.as_ptr().add(sb.offsets[ib]) };
        if sb.cs == 1 {
            // SAFETY: `B`'s rows are contiguous, `sb.rs` apart; the caller's contract.
            unsafe { tiles::<L>(pr, b0, sb.rs) };
            return true;
        }
        if k * n > PACK {
            return false;
        }
        let mut buf = [MaybeUninit::<L::E>::uninit(); PACK];
        for j in 0..n {
            for p in 0..k {
                // SAFETY: element (p, j) of matrix `ib`, inside `b`.
                buf[p * n + j].write(unsafe { *b0.add(p * sb.rs + j * sb.cs) });
            }
        }
        // SAFETY: `buf` holds `B` row-major (`k×n`, all written above).
        unsafe { tiles::<L>(pr, buf.as_ptr().cast(), n) };
        true
    }

    /// `pr` with `B`'s rows contiguous at `b`, `brs` apart, in register tiles of `R`
    /// output rows × `V` vectors of columns with `R·V` = [`ROWS`] accumulators (fewer
    /// rows, more columns for short outputs), the columns left over in one-vector tiles
    /// (the last one masked).
    ///
    /// # Safety
    /// As for [`run`], with `b` pointing at `B`.
    #[inline(always)]
    unsafe fn tiles<L: Lanes>(pr: Product<'_, L::E>, b: *const L::E, brs: usize) {
        let Product {
            m,
            n,
            k,
            a: (a, sa, ia),
            d,
            dst_factor,
            read_dst,
            alpha,
            ..
        } = pr;
        // SAFETY: (all the pointer arithmetic below) rows `i..i + R` of `A`, the
        // columns `j..j + V·N` of `B` and of the output lie inside their matrices.
        unsafe {
            let zero = <L::E as num_traits::Zero>::zero();
            let input = read_dst && dst_factor != zero;
            let at = Tile {
                a: a.as_ptr().add(sa.offsets[ia]),
                ars: sa.rs,
                acs: sa.cs,
                b,
                brs,
                k,
                len: L::N,
                d,
                n,
                alpha: L::splat(alpha),
                factor: L::splat(dst_factor),
                input,
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

    /// One vector of output columns: where its operands and output start.
    #[derive(Clone, Copy)]
    struct Tile<L: Lanes> {
        a: *const L::E,
        ars: usize,
        acs: usize,
        /// `B`'s first row at this tile's first column.
        b: *const L::E,
        brs: usize,
        k: usize,
        /// Columns in this tile (1..=N).
        len: usize,
        /// The output's row 0 at this tile's first column.
        d: *mut L::E,
        /// The output's row length.
        n: usize,
        alpha: L,
        factor: L,
        /// Whether `factor * output` is added.
        input: bool,
    }

    impl<L: Lanes> Tile<L> {
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
                    let bv: [L; V] = std::array::from_fn(|v| L::load(brow.add(v * L::N), self.len));
                    let ap = a.add(p * self.acs);
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = L::splat(*ap.add(r * self.ars));
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
                            out = self.factor.mul(L::load(o, self.len)).add(out);
                        }
                        out.store(o, self.len);
                    }
                }
            }
        }
    }
}
