//! Unary elementwise ops (`neg`, `exp`, `sigmoid`, `gelu`, `erfinv`, `round`, ...),
//! `softplus` and the `isfinite`/`isnan`/`isinf` tests, with PyTorch's dtype rules.
//!
//! float16 and bfloat16 are widened to float32 a chunk at a time (vectorised casts),
//! computed in float32 and rounded once (the ops computed in float then read the
//! rounded results from a table of the 65536 inputs, built by that same path once a
//! process has computed as many elements: [`table16`]); float32 computes in float32
//! and float64 in float64. Integer inputs keep their dtype for `neg`, `abs`, `sign`, `square`,
//! `relu`, `floor`, `ceil` and `round`; the transcendental ops give float32 for them,
//! as PyTorch does.
//!
//! This file also holds [`ewise`], the strided elementwise engine shared with the
//! binary and ternary ops: operands with any strides, offsets or broadcast (zero)
//! strides are walked as coalesced runs, widened in chunks, and large outputs are
//! split over the threads ([`amp_tensor::parallel`]).

use std::any::TypeId;
use std::mem::MaybeUninit;

use amp_tensor::{cast_into, cast_into_uninit, ensure, DType, Element, Error, Result, Tensor};

use self::ewise::{ensure_cpu, full_tensor, int_kernel, zip1, Arg, Guards, RoundEven, Src};
use crate::compute::{with_slice, Real, CHUNK};
use crate::vmath::{self, F32Map};

/// The strided elementwise engine behind the unary, binary and ternary kernels.
pub(crate) mod ewise {
    use std::any::TypeId;
    use std::borrow::Cow;
    use std::mem::MaybeUninit;
    use std::sync::RwLockReadGuard;

    use amp_tensor::{
        cast_into, cast_into_uninit, with_dtype, CpuStorage, DType, Element, Error, Kind, Layout,
        Operand, Result, Scalar, Storage, Tensor,
    };

    use crate::compute::{ensure_same_device, CHUNK};

    /// Outputs with at least this many elements are computed by several threads.
    pub(crate) const PARALLEL_MIN: usize = 32 * 1024;

    /// Elements widened / computed / narrowed at a time (fits L1 with three operands).
    const PIECE: usize = CHUNK;

    /// Rows per tile when an operand is read across its innermost dimension.
    const TILE_ROWS: usize = 64;

    /// Columns per tile. Narrow tiles keep the lines a transposed operand touches
    /// in L1 despite its power-of-two stride (measured on a 1024×1024 float32
    /// `x.t() + y`: 64×16 tiles take ~0.6× the time of plain rows, 64×32 ~2×).
    const TILE_COLS: usize = 16;

    /// `s` as a slice of `U` when `T` and `U` are the same type.
    #[inline(always)]
    pub(crate) fn same<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
        if TypeId::of::<T>() == TypeId::of::<U>() {
            // SAFETY: `T` and `U` are the same type (equal `TypeId`s).
            Some(unsafe { &*(s as *const [T] as *const [U]) })
        } else {
            None
        }
    }

    /// `s` as a mutable slice of `U` when `T` and `U` are the same type.
    #[inline(always)]
    pub(crate) fn same_mut<T: 'static, U: 'static>(s: &mut [T]) -> Option<&mut [U]> {
        if TypeId::of::<T>() == TypeId::of::<U>() {
            // SAFETY: `T` and `U` are the same type (equal `TypeId`s).
            Some(unsafe { &mut *(s as *mut [T] as *mut [U]) })
        } else {
            None
        }
    }

    /// Round-half-to-even (`torch.round`), which `num_traits::Float` lacks.
    pub(crate) trait RoundEven: Copy {
        /// The nearest integer, ties to even.
        fn round_even(self) -> Self;
    }
    impl RoundEven for f32 {
        #[inline(always)]
        fn round_even(self) -> Self {
            self.round_ties_even()
        }
    }
    impl RoundEven for f64 {
        #[inline(always)]
        fn round_even(self) -> Self {
            self.round_ties_even()
        }
    }

    /// The integer dtypes' arithmetic (wrapping, as PyTorch's CPU kernels behave).
    pub(crate) trait Int: Element + Ord {
        /// Zero.
        const ZERO: Self;
        /// Wrapping `self + o`.
        fn wadd(self, o: Self) -> Self;
        /// Wrapping `self - o`.
        fn wsub(self, o: Self) -> Self;
        /// Wrapping `self * o`.
        fn wmul(self, o: Self) -> Self;
        /// Wrapping `-self`.
        fn wneg(self) -> Self;
        /// Wrapping `|self|`.
        fn wabs(self) -> Self;
        /// -1, 0 or 1.
        fn sign(self) -> Self;
        /// `self ** e` as PyTorch's `powi`: wrapping; a negative exponent gives 0
        /// except for bases 1 and -1.
        fn ipow(self, e: Self) -> Self;
        /// Python's modulo (the sign of the divisor); `d` must not be 0.
        fn pymod(self, d: Self) -> Self;
        /// `self` as an exact value of this type, if `v` is one.
        fn from_integral(v: f64) -> Option<Self>;
    }

    macro_rules! int_impl {
        ($($t:ty),*) => {$(
            impl Int for $t {
                const ZERO: Self = 0;
                #[inline(always)]
                fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
                #[inline(always)]
                fn wsub(self, o: Self) -> Self { self.wrapping_sub(o) }
                #[inline(always)]
                fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
                #[inline(always)]
                fn wneg(self) -> Self { self.wrapping_neg() }
                #[inline(always)]
                fn wabs(self) -> Self { self.wrapping_abs() }
                #[inline(always)]
                fn sign(self) -> Self { self.signum() }
                #[inline]
                fn ipow(self, e: Self) -> Self {
                    if e < 0 {
                        return match self {
                            1 => 1,
                            -1 => if e % 2 != 0 { -1 } else { 1 },
                            _ => 0,
                        };
                    }
                    let (mut base, mut e, mut acc): (Self, Self, Self) = (self, e, 1);
                    while e > 0 {
                        if e & 1 == 1 {
                            acc = acc.wrapping_mul(base);
                        }
                        e >>= 1;
                        if e > 0 {
                            base = base.wrapping_mul(base);
                        }
                    }
                    acc
                }
                #[inline(always)]
                fn pymod(self, d: Self) -> Self {
                    let r = self.wrapping_rem(d);
                    if r != 0 && ((r < 0) != (d < 0)) { r.wrapping_add(d) } else { r }
                }
                fn from_integral(v: f64) -> Option<Self> {
                    let ok = v.fract() == 0.0 && v >= <$t>::MIN as f64 && v <= <$t>::MAX as f64;
                    ok.then_some(v as $t)
                }
            }
        )*};
    }
    int_impl!(i32, i64);

    /// Bind `$T` (storage) and `$C` (compute) for any dtype: float16/bfloat16 compute
    /// in float32, the other types in themselves.
    macro_rules! any_kernel {
        ($dtype:expr, |$T:ident, $C:ident| $body:expr) => {
            amp_tensor::bind_dtypes!($dtype, $body, [
                F16 => {$T = amp_tensor::half::f16, $C = f32}
                BF16 => {$T = amp_tensor::half::bf16, $C = f32}
                F32 => {$T = f32, $C = f32}
                F64 => {$T = f64, $C = f64}
                I32 => {$T = i32, $C = i32}
                I64 => {$T = i64, $C = i64}
                Bool => {$T = bool, $C = bool}
            ])
        };
    }
    pub(crate) use any_kernel;

    /// Bind `$T` to the integer element type of `$dtype` (int32 / int64), else
    /// evaluate `$other`.
    macro_rules! int_kernel {
        ($dtype:expr, |$T:ident| $body:expr, _ => $other:expr) => {
            amp_tensor::bind_dtypes!($dtype, $body, [I32 => {$T = i32} I64 => {$T = i64}],
                _ => $other)
        };
    }
    pub(crate) use int_kernel;

    /// Fail unless every tensor is a host tensor on one device.
    pub(crate) fn ensure_cpu(op: &'static str, ts: &[&Tensor]) -> Result<()> {
        ensure_same_device(op, ts)?;
        match ts.iter().find(|t| !t.device().is_cpu()) {
            Some(t) => Err(Error::no_device_kernel(op, t.device())),
            None => Ok(()),
        }
    }

    /// The `result_type` operand describing `t`.
    #[inline]
    pub(crate) fn meta(t: &Tensor) -> Operand {
        Operand::Tensor {
            dtype: t.dtype(),
            ndim: t.rank(),
        }
    }

    /// The elements of `st` as `T`, or a dtype error naming `op`.
    #[inline]
    pub(crate) fn slice_of<'s, T: Element>(
        st: &'s CpuStorage,
        op: &'static str,
    ) -> Result<&'s [T]> {
        T::slice(st).ok_or_else(|| Error::DTypeMismatch {
            op,
            expected: T::DTYPE,
            got: st.dtype(),
        })
    }

    /// `s` cast to `U` with PyTorch's rules (a float scalar narrows through float32
    /// into 16-bit types, truncates into integers).
    #[inline]
    pub(crate) fn scalar_as<U: Element>(s: Scalar) -> U {
        match s {
            Scalar::Bool(b) => U::from_bool(b),
            Scalar::Int(i) => U::from_i64(i),
            Scalar::Float(f) => U::from_f64(f),
        }
    }

    /// `s` in compute type `C`: cast straight to `C` when `opmath`, else rounded to
    /// the storage type `T` first.
    #[inline]
    pub(crate) fn splat_value<T: Element, C: Element>(s: Scalar, opmath: bool) -> C {
        if opmath {
            scalar_as::<C>(s)
        } else {
            scalar_as::<T>(s).cast::<C>()
        }
    }

    /// The value of a one-element tensor as a [`Scalar`] of its kind (exact).
    pub(crate) fn tensor_scalar(t: &Tensor, op: &'static str) -> Result<Scalar> {
        let st = t.storage();
        with_dtype!(t.dtype(), S => {
            let v: S = slice_of::<S>(st.cpu()?, op)?[t.layout().offset()];
            Ok(match S::KIND {
                Kind::Bool => Scalar::Bool(v.to_bool()),
                Kind::Int => Scalar::Int(v.to_i64()),
                Kind::Float | Kind::Double => Scalar::Float(v.to_f64()),
            })
        })
    }

    /// A tensor of `dims` filled with `value` cast to `dtype`, or
    /// [`Error::OutOfMemory`].
    pub(crate) fn full_tensor(
        dims: &[usize],
        value: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        Tensor::try_full(dims.to_vec(), value, dtype)
    }

    /// One operand of an elementwise op after promotion.
    #[derive(Clone)]
    pub(crate) enum Src<'t> {
        /// A tensor in the op's dtype (any strides, broadcastable to the output):
        /// the caller's tensor itself when it already has that dtype.
        Full(Cow<'t, Tensor>),
        /// One value at every output position: a Python scalar or the element of a
        /// one-element tensor, kept exact until the kernel casts it.
        One(Scalar),
    }

    impl<'t> Src<'t> {
        /// `t` as an operand of an op computing in `dtype`: a one-element tensor
        /// becomes its value, other tensors are cast to `dtype` (borrowed when equal).
        pub(crate) fn of(t: &'t Tensor, dtype: DType, op: &'static str) -> Result<Src<'t>> {
            if t.elem_count() == 1 {
                Ok(Src::One(tensor_scalar(t, op)?))
            } else if t.dtype() == dtype {
                Ok(Src::Full(Cow::Borrowed(t)))
            } else {
                Ok(Src::Full(Cow::Owned(t.to_dtype(dtype)?)))
            }
        }

        /// `t` as it is (no promotion), for single-input kernels.
        pub(crate) fn full(t: &'t Tensor) -> Src<'t> {
            Src::Full(Cow::Borrowed(t))
        }

        /// The tensor of a [`Src::Full`] operand.
        pub(crate) fn tensor(&self) -> Option<&Tensor> {
            match self {
                Src::Full(t) => Some(t.as_ref()),
                Src::One(_) => None,
            }
        }

        /// This operand as a kernel argument; `st` is the storage of a full tensor.
        pub(crate) fn arg<'s, T: Element, C: Element>(
            &'s self,
            st: Option<&'s CpuStorage>,
            opmath: bool,
            op: &'static str,
        ) -> Result<Arg<'s, T, C>> {
            match self {
                Src::One(s) => Ok(Arg::Splat(splat_value::<T, C>(*s, opmath))),
                Src::Full(t) => {
                    let st =
                        st.ok_or_else(|| Error::invalid(op, "operand storage is not readable"))?;
                    Ok(Arg::Strided(slice_of::<T>(st, op)?, t.layout()))
                }
            }
        }
    }

    /// Read guards over the storages of up to `N` operands, one guard per distinct
    /// storage (so `x op x` never takes the same lock twice).
    pub(crate) struct Guards<'t, const N: usize> {
        guards: [Option<RwLockReadGuard<'t, Storage>>; N],
        owner: [usize; N],
    }

    impl<'t, const N: usize> Guards<'t, N> {
        /// Lock the storages of the given tensors (`None` entries lock nothing).
        pub(crate) fn new(ts: [Option<&'t Tensor>; N]) -> Self {
            let owner: [usize; N] = std::array::from_fn(|i| match ts[i] {
                Some(t) => (0..i)
                    .find(|&j| ts[j].is_some_and(|u| u.same_storage(t)))
                    .unwrap_or(i),
                None => i,
            });
            let guards = std::array::from_fn(|i| match ts[i] {
                Some(t) if owner[i] == i => Some(t.storage()),
                _ => None,
            });
            Guards { guards, owner }
        }

        /// The host storage of operand `i`, if it is a locked tensor.
        ///
        /// # Errors
        /// [`amp_tensor::Error::NoDeviceKernel`] for a device tensor.
        pub(crate) fn get(&self, i: usize) -> Result<Option<&CpuStorage>> {
            self.guards[self.owner[i]]
                .as_ref()
                .map(|g| g.cpu())
                .transpose()
        }
    }

    /// A stack buffer of [`PIECE`] elements, initialised lazily (only as far as used).
    pub(crate) struct Buf<C> {
        data: [MaybeUninit<C>; PIECE],
        init: usize,
    }

    impl<C: Element> Buf<C> {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Buf {
                data: [const { MaybeUninit::uninit() }; PIECE],
                init: 0,
            }
        }

        /// The first `len` (≤ [`PIECE`]) elements.
        #[inline(always)]
        pub(crate) fn get(&mut self, len: usize) -> &mut [C] {
            if self.init < len {
                for s in &mut self.data[self.init..len] {
                    s.write(C::default());
                }
                self.init = len;
            }
            // SAFETY: the first `self.init >= len` elements are initialised.
            unsafe { &mut *(&mut self.data[..len] as *mut [MaybeUninit<C>] as *mut [C]) }
        }
    }

    /// One input of a kernel: storage `T`, seen in compute type `C`.
    pub(crate) enum Arg<'a, T, C> {
        /// The same value at every output position (already in compute type).
        Splat(C),
        /// Elements of a buffer placed by a layout broadcastable to the output.
        Strided(&'a [T], &'a Layout),
    }

    impl<T, C> Arg<'_, T, C> {
        #[inline]
        fn layout(&self) -> Option<&Layout> {
            match self {
                Arg::Splat(_) => None,
                Arg::Strided(_, l) => Some(l),
            }
        }
    }

    /// A piece of one operand in compute type.
    enum Piece<'a, C> {
        One(C),
        Many(&'a [C]),
    }

    /// `len` elements of `arg` from storage index `start` by `stride`, as compute type
    /// (borrowed when no conversion or gather is needed).
    #[inline(always)]
    fn load<'r, T: Element, C: Element>(
        arg: &Arg<'r, T, C>,
        start: usize,
        stride: usize,
        len: usize,
        buf: &'r mut Buf<C>,
    ) -> Piece<'r, C> {
        match *arg {
            Arg::Splat(v) => Piece::One(v),
            Arg::Strided(data, _) => {
                if stride == 0 || len == 1 {
                    Piece::One(data[start].cast())
                } else if stride == 1 {
                    let s = &data[start..start + len];
                    match same::<T, C>(s) {
                        Some(s) => Piece::Many(s),
                        None => {
                            let b = buf.get(len);
                            cast_into(s, b);
                            Piece::Many(b)
                        }
                    }
                } else {
                    let b = buf.get(len);
                    for (k, d) in b.iter_mut().enumerate() {
                        *d = data[start + k * stride].cast();
                    }
                    Piece::Many(b)
                }
            }
        }
    }

    /// Like [`load`], always as a slice (splats are written out).
    #[inline(always)]
    fn load_many<'r, T: Element, C: Element>(
        arg: &Arg<'r, T, C>,
        start: usize,
        stride: usize,
        len: usize,
        buf: &'r mut Buf<C>,
    ) -> &'r [C] {
        match *arg {
            Arg::Splat(v) => {
                let b = buf.get(len);
                b.fill(v);
                b
            }
            Arg::Strided(data, _) if stride == 1 => {
                let s = &data[start..start + len];
                match same::<T, C>(s) {
                    Some(s) => s,
                    None => {
                        let b = buf.get(len);
                        cast_into(s, b);
                        b
                    }
                }
            }
            Arg::Strided(data, _) => {
                let b = buf.get(len);
                for (k, d) in b.iter_mut().enumerate() {
                    *d = data[start + k * stride].cast();
                }
                b
            }
        }
    }

    /// Compute into the (possibly uninitialised) `dst` through `fill`, which writes
    /// every element of the slice it is given: directly when the result type is the
    /// output type, else into `tmp` and narrowed with the vectorised casts.
    #[inline(always)]
    fn store<R: Element, O: Element>(
        dst: &mut [MaybeUninit<O>],
        tmp: &mut Buf<R>,
        fill: impl FnOnce(&mut [MaybeUninit<R>]),
    ) {
        if let Some(d) = same_mut::<MaybeUninit<O>, MaybeUninit<R>>(dst) {
            fill(d)
        } else {
            let t = tmp.get(dst.len());
            // SAFETY: `t` is initialised; `fill` only ever writes initialised values
            // through the `MaybeUninit` view, so `t` stays initialised.
            fill(unsafe { &mut *(t as *mut [R] as *mut [MaybeUninit<R>]) });
            cast_into_uninit(t, dst);
        }
    }

    /// `d[i] = v` for every element of a possibly uninitialised slice.
    #[inline(always)]
    fn fill_with<R: Copy>(d: &mut [MaybeUninit<R>], v: R) {
        for d in d {
            d.write(v);
        }
    }

    /// How to walk the output: runs along a coalesced innermost dimension.
    pub(crate) struct Plan<const K: usize> {
        offsets: [usize; K],
        inner: usize,
        inner_strides: [usize; K],
        /// Coalesced outer dimensions, outermost first: (size, stride per operand).
        outer: Vec<(usize, [usize; K])>,
    }

    impl<const K: usize> Plan<K> {
        /// A plan for an output of shape `out` whose operands have these layouts
        /// (`None` for splats); each layout must broadcast to `out`.
        pub(crate) fn new(out: &[usize], layouts: [Option<&Layout>; K]) -> Self {
            let n: usize = out.iter().product();
            let offsets = layouts.map(|l| l.map_or(0, |l| l.offset()));
            if layouts
                .iter()
                .all(|l| l.is_none_or(|l| l.elem_count() == n && l.is_contiguous()))
            {
                return Plan {
                    offsets,
                    inner: n,
                    inner_strides: layouts.map(|l| l.is_some() as usize),
                    outer: Vec::new(),
                };
            }
            let rank = out.len();
            let stride_of = |l: Option<&Layout>, d: usize| -> usize {
                let Some(l) = l else { return 0 };
                let lr = l.rank();
                if d + lr < rank {
                    return 0;
                }
                let ld = d + lr - rank;
                if l.dims()[ld] == 1 {
                    0
                } else {
                    l.strides()[ld]
                }
            };
            // Innermost group first; merge a dimension into the group inside it when
            // every operand steps over that group contiguously.
            let mut groups: Vec<(usize, [usize; K])> = Vec::new();
            let mut inner: Option<(usize, [usize; K])> = None;
            for d in (0..rank).rev() {
                let size = out[d];
                if size == 1 {
                    continue;
                }
                let s: [usize; K] = std::array::from_fn(|k| stride_of(layouts[k], d));
                let fits = |g: &(usize, [usize; K])| (0..K).all(|k| s[k] == g.1[k] * g.0);
                if let Some(g) = groups.last_mut() {
                    if fits(g) {
                        g.0 *= size;
                    } else {
                        groups.push((size, s));
                    }
                    continue;
                }
                match inner.as_mut() {
                    Some(g) if fits(g) => g.0 *= size,
                    Some(_) => groups.push((size, s)),
                    None => inner = Some((size, s)),
                }
            }
            let (inner, inner_strides) = inner.unwrap_or((1, [0; K]));
            groups.reverse();
            Plan {
                offsets,
                inner,
                inner_strides,
                outer: groups,
            }
        }

        /// Call `f(out_index, len, starts, strides)` for the runs covering output
        /// positions `lo..hi`. Runs come in row-major order, except that when an
        /// operand reads its innermost dimension with a stride of 16 or more (a transposed
        /// operand), full rows are visited in tiles of [`TILE_ROWS`] rows by
        /// [`TILE_COLS`] columns so the lines it touches stay in cache.
        pub(crate) fn runs(
            &self,
            lo: usize,
            hi: usize,
            f: &mut dyn FnMut(usize, usize, [usize; K], [usize; K]),
        ) {
            if lo >= hi {
                return;
            }
            let (m, s) = (self.inner, self.inner_strides);
            if self.outer.is_empty() {
                let starts = std::array::from_fn(|k| self.offsets[k] + lo * s[k]);
                return f(lo, hi - lo, starts, s);
            }
            let nd = self.outer.len();
            let mut idx = vec![0usize; nd];
            let mut base = self.offsets;
            let (mut q, r) = (lo / m, lo % m);
            for d in (0..nd).rev() {
                let (size, st) = self.outer[d];
                idx[d] = q % size;
                q /= size;
                for k in 0..K {
                    base[k] += idx[d] * st[k];
                }
            }
            // Step `base` to the next row (odometer over the outer dimensions).
            let advance = |idx: &mut [usize], base: &mut [usize; K]| {
                for d in (0..nd).rev() {
                    let (size, st) = self.outer[d];
                    idx[d] += 1;
                    for k in 0..K {
                        base[k] += st[k];
                    }
                    if idx[d] < size {
                        return;
                    }
                    idx[d] = 0;
                    for k in 0..K {
                        base[k] -= st[k] * size;
                    }
                }
            };
            let mut pos = lo;
            if r != 0 {
                let len = (m - r).min(hi - pos);
                f(pos, len, std::array::from_fn(|k| base[k] + r * s[k]), s);
                pos += len;
                advance(&mut idx, &mut base);
            }
            let tile = m > TILE_COLS && s.iter().any(|&st| st >= 16);
            while pos + m <= hi {
                if tile && pos + TILE_ROWS * m <= hi {
                    let mut bases = [[0usize; K]; TILE_ROWS];
                    for b in bases.iter_mut() {
                        *b = base;
                        advance(&mut idx, &mut base);
                    }
                    for c in (0..m).step_by(TILE_COLS) {
                        let len = TILE_COLS.min(m - c);
                        for (t, b) in bases.iter().enumerate() {
                            f(
                                pos + t * m + c,
                                len,
                                std::array::from_fn(|k| b[k] + c * s[k]),
                                s,
                            );
                        }
                    }
                    pos += TILE_ROWS * m;
                } else {
                    f(pos, m, base, s);
                    pos += m;
                    advance(&mut idx, &mut base);
                }
            }
            if pos < hi {
                f(pos, hi - pos, base, s);
            }
        }
    }

    /// A vector of `n` outputs written by `task(chunk, first_index)`, over the threads in
    /// large chunks when `n` is large, else on the calling thread; [`Error::OutOfMemory`]
    /// when the output cannot be allocated.
    ///
    /// The output is never initialised first (a zeroed fresh buffer cost a fifth of a
    /// 192×192 float32 `add`): `task` must write every element of the chunk it gets.
    pub(crate) fn run_tasks<O: Element>(
        n: usize,
        task: impl Fn(&mut [MaybeUninit<O>], usize) + Sync,
    ) -> Result<Vec<O>> {
        let mut out = amp_tensor::pool::try_vec_with_capacity::<O>(n)?;
        let spare = &mut out.spare_capacity_mut()[..n];
        if n >= PARALLEL_MIN {
            let per = amp_tensor::parallel::part_len(n, PARALLEL_MIN).next_multiple_of(PIECE);
            amp_tensor::parallel::for_each_chunk_mut(spare, per, &|i, c| task(c, i * per));
        } else if n > 0 {
            task(spare, 0);
        }
        // SAFETY: the chunks cover `0..n` and every task wrote its whole chunk (a
        // panicking task propagates before this line, leaving the vector empty).
        unsafe { out.set_len(n) };
        Ok(out)
    }

    /// Split the run `(o, len, starts, strides)` into pieces of at most [`PIECE`].
    #[inline(always)]
    fn pieces<const K: usize>(
        len: usize,
        starts: [usize; K],
        strides: [usize; K],
        mut f: impl FnMut(usize, usize, [usize; K]),
    ) {
        let mut done = 0;
        while done < len {
            let l = (len - done).min(PIECE);
            f(
                done,
                l,
                std::array::from_fn(|k| starts[k] + done * strides[k]),
            );
            done += l;
        }
    }

    /// `out[i] = f(x[i])` over an output of shape `dims`.
    pub(crate) fn zip1<T, C, R, O>(
        dims: &[usize],
        x: Arg<T, C>,
        f: impl Fn(C) -> R + Sync,
    ) -> Result<Vec<O>>
    where
        T: Element,
        C: Element,
        R: Element,
        O: Element,
    {
        let n = dims.iter().product();
        let plan = Plan::new(dims, [x.layout()]);
        run_tasks(n, |out: &mut [MaybeUninit<O>], lo| {
            let (mut bx, mut br) = (Buf::<C>::new(), Buf::<R>::new());
            plan.runs(lo, lo + out.len(), &mut |o, len, st, sd| {
                // A run the register loops take goes to them whole (their dispatch
                // once per run, not per piece: 3-7% of a 1024² `add`'s time).
                if let (Arg::Strided(d, _), [1]) = (&x, sd) {
                    if TypeId::of::<C>() == TypeId::of::<f32>()
                        && TypeId::of::<R>() == TypeId::of::<f32>()
                    {
                        if let Some(xs) = same::<T, O>(&d[st[0]..][..len]) {
                            let g = |a: f32| f(C::from_f32(a)).to_f32();
                            if crate::half16::unary(xs, &mut out[o - lo..][..len], &g) {
                                return;
                            }
                        }
                    }
                }
                pieces(len, st, sd, |done, l, st| {
                    let dst = &mut out[o - lo + done..][..l];
                    let px = load(&x, st[0], sd[0], l, &mut bx);
                    store(dst, &mut br, |d| match px {
                        Piece::One(v) => fill_with(d, f(v)),
                        Piece::Many(s) => {
                            for (d, &v) in d.iter_mut().zip(s) {
                                d.write(f(v));
                            }
                        }
                    });
                });
            });
        })
    }

    /// `out[i] = f(x[i], y[i])` over an output of shape `dims` (broadcasting).
    pub(crate) fn zip2<T1, C1, T2, C2, R, O>(
        dims: &[usize],
        x: Arg<T1, C1>,
        y: Arg<T2, C2>,
        f: impl Fn(C1, C2) -> R + Sync,
    ) -> Result<Vec<O>>
    where
        T1: Element,
        C1: Element,
        T2: Element,
        C2: Element,
        R: Element,
        O: Element,
    {
        let n = dims.iter().product();
        let plan = Plan::new(dims, [x.layout(), y.layout()]);
        run_tasks(n, |out: &mut [MaybeUninit<O>], lo| {
            let (mut bx, mut by, mut br) = (Buf::<C1>::new(), Buf::<C2>::new(), Buf::<R>::new());
            plan.runs(lo, lo + out.len(), &mut |o, len, st, sd| {
                // As in `zip1`: a fused run goes through registers whole.
                if fused16(&x, &y, st, sd, len, &mut out[o - lo..][..len], &f) {
                    return;
                }
                pieces(len, st, sd, |done, l, st| {
                    let dst = &mut out[o - lo + done..][..l];
                    let px = load(&x, st[0], sd[0], l, &mut bx);
                    let py = load(&y, st[1], sd[1], l, &mut by);
                    store(dst, &mut br, |d| match (px, py) {
                        (Piece::Many(a), Piece::Many(b)) => {
                            for ((d, &a), &b) in d.iter_mut().zip(a).zip(b) {
                                d.write(f(a, b));
                            }
                        }
                        (Piece::Many(a), Piece::One(b)) => {
                            for (d, &a) in d.iter_mut().zip(a) {
                                d.write(f(a, b));
                            }
                        }
                        (Piece::One(a), Piece::Many(b)) => {
                            for (d, &b) in d.iter_mut().zip(b) {
                                d.write(f(a, b));
                            }
                        }
                        (Piece::One(a), Piece::One(b)) => fill_with(d, f(a, b)),
                    });
                });
            });
        })
    }

    /// `dst[i] = f(x, y)` over one piece in one pass through registers when both
    /// inputs and the output are the same 16-bit type computed in float32 (see
    /// [`crate::half16`]); `false` (nothing written) otherwise.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn fused16<T1, T2, O, C1, C2, R>(
        x: &Arg<T1, C1>,
        y: &Arg<T2, C2>,
        st: [usize; 2],
        sd: [usize; 2],
        l: usize,
        dst: &mut [MaybeUninit<O>],
        f: &impl Fn(C1, C2) -> R,
    ) -> bool
    where
        T1: Element,
        T2: Element,
        O: Element,
        C1: Element,
        C2: Element,
        R: Element,
    {
        use crate::half16::Operand;
        if TypeId::of::<C1>() != TypeId::of::<f32>()
            || TypeId::of::<C2>() != TypeId::of::<f32>()
            || TypeId::of::<R>() != TypeId::of::<f32>()
        {
            return false;
        }
        fn operand<'a, T: Element, S: Element, C: Element>(
            a: &Arg<'a, T, C>,
            start: usize,
            stride: usize,
            l: usize,
        ) -> Option<Operand<'a, S>> {
            match *a {
                Arg::Splat(v) => Some(Operand::Splat(v.to_f32())),
                Arg::Strided(d, _) => match stride {
                    0 => Some(Operand::Splat(d[start].to_f32())),
                    1 => Some(Operand::Run(same::<T, S>(&d[start..][..l])?)),
                    _ => None,
                },
            }
        }
        let (Some(xo), Some(yo)) = (
            operand::<T1, O, C1>(x, st[0], sd[0], l),
            operand::<T2, O, C2>(y, st[1], sd[1], l),
        ) else {
            return false;
        };
        if matches!((xo, yo), (Operand::Splat(_), Operand::Splat(_))) {
            return false;
        }
        crate::half16::binary(xo, yo, dst, &|a: f32, b: f32| {
            f(C1::from_f32(a), C2::from_f32(b)).to_f32()
        })
    }

    /// `out[i] = f(x[i], y[i], z[i])` over an output of shape `dims` (broadcasting).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(crate) fn zip3<T1, C1, T2, C2, T3, C3, R, O>(
        dims: &[usize],
        x: Arg<T1, C1>,
        y: Arg<T2, C2>,
        z: Arg<T3, C3>,
        f: impl Fn(C1, C2, C3) -> R + Sync,
    ) -> Result<Vec<O>>
    where
        T1: Element,
        C1: Element,
        T2: Element,
        C2: Element,
        T3: Element,
        C3: Element,
        R: Element,
        O: Element,
    {
        let n = dims.iter().product();
        let plan = Plan::new(dims, [x.layout(), y.layout(), z.layout()]);
        run_tasks(n, |out: &mut [MaybeUninit<O>], lo| {
            let (mut bx, mut by, mut bz) = (Buf::<C1>::new(), Buf::<C2>::new(), Buf::<C3>::new());
            let mut br = Buf::<R>::new();
            plan.runs(lo, lo + out.len(), &mut |o, len, st, sd| {
                pieces(len, st, sd, |done, l, st| {
                    let a = load_many(&x, st[0], sd[0], l, &mut bx);
                    let b = load_many(&y, st[1], sd[1], l, &mut by);
                    let c = load_many(&z, st[2], sd[2], l, &mut bz);
                    let dst = &mut out[o - lo + done..][..l];
                    store(dst, &mut br, |d| {
                        for (((d, &a), &b), &c) in d.iter_mut().zip(a).zip(b).zip(c) {
                            d.write(f(a, b, c));
                        }
                    });
                });
            });
        })
    }

    /// `true` when some element `arg` reads is zero (integer divisors).
    pub(crate) fn any_zero<T: Int>(arg: &Arg<T, T>) -> bool {
        match *arg {
            Arg::Splat(v) => v == T::ZERO,
            Arg::Strided(data, layout) => {
                let mut found = false;
                layout.for_each_run(|start, len, stride| {
                    found |= (0..len).any(|k| data[start + k * stride] == T::ZERO);
                });
                found
            }
        }
    }
}

/// The one list of the unary elementwise ops: each op's variant, its PyTorch name and,
/// for the ops with a CUDA kernel, the kernel's body (a C++ expression of `x` in the
/// compute type `A`). `$then!` receives the list; [`UnaryOp`] (the enum, [`UnaryOp::ALL`],
/// [`UnaryOp::name`]) and the CUDA unary module (`cuda::sources::UNARY` and
/// `UNARY_OPS`) are both generated from it, so a name is written once. The entries after
/// `@device_only` are CUDA kernels with no CPU op (`silu`, which the CPU writes from
/// `sigmoid` and `mul`).
macro_rules! with_unary_ops {
    ($then:path) => {
        $then! {
            /// `-x`.
            Neg = "neg", cuda "-x";
            /// `|x|`.
            Abs = "abs", cuda "amp_abs(x)";
            /// `e^x`.
            Exp = "exp", cuda "amp_exp(x)";
            /// `e^x - 1`, accurate near 0.
            Expm1 = "expm1", cuda "amp_expm1(x)";
            /// Natural logarithm.
            Log = "log", cuda "amp_log(x)";
            /// `log(1 + x)`, accurate near 0.
            Log1p = "log1p", cuda "amp_log1p(x)";
            /// Base-2 logarithm.
            Log2 = "log2", cuda "amp_log2(x)";
            /// Base-10 logarithm.
            Log10 = "log10", cuda "amp_log10(x)";
            /// Square root.
            Sqrt = "sqrt", cuda "amp_sqrt(x)";
            /// `1 / sqrt(x)`.
            Rsqrt = "rsqrt", cuda "A(1) / amp_sqrt(x)";
            /// `1 / x`.
            Reciprocal = "reciprocal", cuda "A(1) / x";
            /// Sine.
            Sin = "sin", cuda "amp_sin(x)";
            /// Cosine.
            Cos = "cos", cuda "amp_cos(x)";
            /// Tangent.
            Tan = "tan", cuda "amp_tan(x)";
            /// Arcsine.
            Asin = "asin", cuda "amp_asin(x)";
            /// Arccosine.
            Acos = "acos", cuda "amp_acos(x)";
            /// Arctangent.
            Atan = "atan", cuda "amp_atan(x)";
            /// Hyperbolic sine.
            Sinh = "sinh", cuda "amp_sinh(x)";
            /// Hyperbolic cosine.
            Cosh = "cosh", cuda "amp_cosh(x)";
            /// Hyperbolic tangent.
            Tanh = "tanh", cuda "amp_tanh(x)";
            /// Logistic sigmoid `1 / (1 + e^-x)`, evaluated without overflow.
            Sigmoid = "sigmoid", cuda "A(1) / (A(1) + amp_exp(-x))";
            /// `max(x, 0)` (NaN propagates).
            Relu = "relu", cuda "(x != x || x > A(0)) ? x : A(0)";
            /// Exact GELU, `x * Φ(x) = x/2 * (1 + erf(x/√2))`.
            Gelu = "gelu", cuda "A(0.5) * x * (A(1) + amp_erf(x * A(0.70710678118654752440)))";
            /// GELU with PyTorch's tanh approximation (`approximate='tanh'`).
            GeluTanh = "gelu";
            /// The error function.
            Erf = "erf", cuda "amp_erf(x)";
            /// The inverse error function (PyTorch's `calc_erfinv`).
            Erfinv = "erfinv";
            /// -1, 0 or 1 (0 for NaN, as PyTorch).
            Sign = "sign", cuda "(x > A(0)) ? A(1) : ((x < A(0)) ? A(-1) : x)";
            /// Round toward -∞.
            Floor = "floor", cuda "amp_floor(x)";
            /// Round toward +∞.
            Ceil = "ceil", cuda "amp_ceil(x)";
            /// Round half to even (`torch.round`).
            Round = "round", cuda "amp_rint(x)";
            /// `x * x`.
            Square = "square", cuda "x * x";
            @device_only:
            silu = "x / (A(1) + amp_exp(-x))";
        }
    };
}
pub(crate) use with_unary_ops;

macro_rules! declare_unary_ops {
    (
        $($(#[$doc:meta])* $variant:ident = $name:literal $(, cuda $body:literal)?;)*
        @device_only: $($dev_name:ident = $dev_body:literal;)*
    ) => {
        /// The unary elementwise ops, named as in PyTorch.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum UnaryOp {
            $($(#[$doc])* $variant,)*
        }

        impl UnaryOp {
            /// Every unary op.
            pub const ALL: [UnaryOp; [$(UnaryOp::$variant),*].len()] = [$(UnaryOp::$variant),*];

            /// PyTorch's name of the op (`GeluTanh` is `gelu` with `approximate='tanh'`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$variant => $name,)*
                }
            }

            /// The op of the CUDA unary module computing this op (its kernels are
            /// `unary_<op>_<dtype>`), `None` where the list gives it no device body
            /// (`GeluTanh` shares `gelu`'s name, not its formula).
            pub const fn cuda_kernel(self) -> Option<&'static str> {
                match self {
                    $(UnaryOp::$variant => declare_unary_ops!(@kernel $name $($body)?),)*
                }
            }
        }
    };
    (@kernel $name:literal) => { None };
    (@kernel $name:literal $body:literal) => { Some($name) };
}
with_unary_ops!(declare_unary_ops);

impl UnaryOp {
    /// `true` for the ops that keep an integer dtype (the rest compute in float).
    pub const fn keeps_integers(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Square
                | UnaryOp::Relu
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
        )
    }
}

/// Numerically stable logistic sigmoid.
#[inline(always)]
fn sigmoid_c<C: Real>(v: C) -> C {
    if v >= C::zero() {
        C::one() / (C::one() + (-v).exp())
    } else {
        let e = v.exp();
        e / (C::one() + e)
    }
}

/// PyTorch's `calc_erfinv`: a rational approximation (central range |y| ≤ 0.7, and
/// a tail form) refined by two Newton steps; ±1 → ±inf, |y| > 1 → NaN.
#[inline]
fn erfinv_c<C: Real>(y: C) -> C {
    const A: [f64; 4] = [0.886226899, -1.645349621, 0.914624893, -0.140543331];
    const B: [f64; 4] = [-2.118377725, 1.442710462, -0.329097515, 0.012229801];
    const CC: [f64; 4] = [-1.970840454, -1.624906493, 3.429567803, 1.641345311];
    const D: [f64; 2] = [3.543889200, 1.637067800];
    let c = C::from_f64c;
    let one = C::one();
    let y_abs = y.abs();
    if y_abs > one {
        return C::nan();
    }
    if y_abs == one {
        return if y.is_sign_negative() {
            C::neg_infinity()
        } else {
            C::infinity()
        };
    }
    let mut x = if y_abs <= c(0.7) {
        let z = y * y;
        let num = ((c(A[3]) * z + c(A[2])) * z + c(A[1])) * z + c(A[0]);
        let dem = (((c(B[3]) * z + c(B[2])) * z + c(B[1])) * z + c(B[0])) * z + one;
        y * num / dem
    } else {
        let z = (-((one - y_abs) / c(2.0)).ln()).sqrt();
        let num = ((c(CC[3]) * z + c(CC[2])) * z + c(CC[1])) * z + c(CC[0]);
        let dem = (c(D[1]) * z + c(D[0])) * z + one;
        let num = if y.is_sign_negative() {
            -num.abs()
        } else {
            num.abs()
        };
        num / dem
    };
    let k = c(2.0) / c(std::f64::consts::PI.sqrt());
    x = x - (x.erf() - y) / (k * (-x * x).exp());
    x = x - (x.erf() - y) / (k * (-x * x).exp());
    x
}

/// Run `op` on a floating tensor with storage `T`, computing in `C`: from the op's
/// [`table16`] where `T` is 16 bits wide and the table is there, else directly.
fn float_unary<T: amp_tensor::Element, C: Real + RoundEven>(
    op: UnaryOp,
    x: &Tensor,
) -> Result<Tensor> {
    let build = || table16::build::<T>(|all| float_unary_direct::<T, C>(op, all));
    if let Some(table) = table16::table_for::<T>(op, x.elem_count(), build)? {
        let xc = x.try_contiguous()?;
        let out = with_slice::<T, _>(&xc, |src| {
            ewise::run_tasks(src.len(), |out: &mut [MaybeUninit<T>], lo| {
                table16::look_up(table, &src[lo..lo + out.len()], out)
            })
        })??;
        return Tensor::from_vec(out, x.dims());
    }
    float_unary_direct::<T, C>(op, x)
}

/// [`float_unary`] computing every element.
fn float_unary_direct<T: amp_tensor::Element, C: Real + RoundEven>(
    op: UnaryOp,
    x: &Tensor,
) -> Result<Tensor> {
    if let Some(out) = float_unary_simd::<T, C>(op, x) {
        return out;
    }
    let g = Guards::new([Some(x)]);
    let arg = Src::full(x);
    let a: Arg<T, C> = arg.arg(g.get(0)?, false, op.name())?;
    let dims = x.dims();
    macro_rules! go {
        ($f:expr) => {
            zip1::<T, C, C, T>(dims, a, $f)?
        };
    }
    let half = C::from_f64c(0.5);
    let out = match op {
        UnaryOp::Neg => go!(|v: C| -v),
        UnaryOp::Abs => go!(|v: C| v.abs()),
        UnaryOp::Exp => go!(|v: C| v.exp()),
        UnaryOp::Expm1 => go!(|v: C| v.exp_m1()),
        UnaryOp::Log => go!(|v: C| v.ln()),
        UnaryOp::Log1p => go!(|v: C| v.ln_1p()),
        UnaryOp::Log2 => go!(|v: C| v.log2()),
        UnaryOp::Log10 => go!(|v: C| v.log10()),
        UnaryOp::Sqrt => go!(|v: C| v.sqrt()),
        UnaryOp::Rsqrt => go!(|v: C| C::one() / v.sqrt()),
        UnaryOp::Reciprocal => go!(|v: C| C::one() / v),
        UnaryOp::Sin => go!(|v: C| v.sin()),
        UnaryOp::Cos => go!(|v: C| v.cos()),
        UnaryOp::Tan => go!(|v: C| v.tan()),
        UnaryOp::Asin => go!(|v: C| v.asin()),
        UnaryOp::Acos => go!(|v: C| v.acos()),
        UnaryOp::Atan => go!(|v: C| v.atan()),
        UnaryOp::Sinh => go!(|v: C| v.sinh()),
        UnaryOp::Cosh => go!(|v: C| v.cosh()),
        UnaryOp::Tanh => go!(|v: C| v.tanh()),
        UnaryOp::Sigmoid => go!(sigmoid_c::<C>),
        UnaryOp::Relu => go!(|v: C| if v < C::zero() { C::zero() } else { v }),
        UnaryOp::Gelu => {
            let s = C::from_f64c(std::f64::consts::FRAC_1_SQRT_2);
            go!(move |v: C| v * half * (C::one() + (v * s).erf()))
        }
        UnaryOp::GeluTanh => {
            let beta =
                C::from_f64c(std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5);
            let kappa = C::from_f64c(0.044715);
            go!(move |v: C| {
                let inner = beta * (v + kappa * (v * v * v));
                half * v * (C::one() + inner.tanh())
            })
        }
        UnaryOp::Erf => go!(|v: C| v.erf()),
        UnaryOp::Erfinv => go!(erfinv_c::<C>),
        UnaryOp::Sign => go!(|v: C| {
            if v > C::zero() {
                C::one()
            } else if v < C::zero() {
                -C::one()
            } else {
                C::zero()
            }
        }),
        UnaryOp::Floor => go!(|v: C| v.floor()),
        UnaryOp::Ceil => go!(|v: C| v.ceil()),
        UnaryOp::Round => go!(|v: C| v.round_even()),
        UnaryOp::Square => go!(|v: C| v * v),
    };
    Tensor::from_vec(out, dims.to_vec())
}

/// `exp`, `tanh`, `sigmoid`, `erf`, `gelu` and `gelu(approximate='tanh')` computed in
/// float32 through the vectorised [`vmath`] kernels (AVX-512 or AVX2 + FMA, chosen at
/// run time), in pieces of [`CHUNK`] widened / computed / narrowed elements over
/// [`ewise::run_tasks`]. `None` when the op, the compute type or the CPU does not
/// qualify (the scalar path runs).
fn float_unary_simd<T: Element, C: 'static>(op: UnaryOp, x: &Tensor) -> Option<Result<Tensor>> {
    if TypeId::of::<C>() != TypeId::of::<f32>() {
        return None;
    }
    let map = match op {
        UnaryOp::Exp => F32Map::Exp,
        UnaryOp::Tanh => F32Map::Tanh,
        UnaryOp::Sigmoid => F32Map::Sigmoid,
        UnaryOp::Erf => F32Map::Erf,
        UnaryOp::Gelu => F32Map::Gelu,
        UnaryOp::GeluTanh => F32Map::GeluTanh,
        _ => return None,
    };
    let level = vmath::level()?;
    if map == F32Map::Gelu
        && matches!(T::DTYPE, DType::F32 | DType::BF16 | DType::F16)
        && vmath::has_gelu_table()
    {
        // Straight from the storage type, widened and rounded in registers.
        let out = with_slice::<T, _>(x, |src| {
            ewise::run_tasks(src.len(), |out: &mut [MaybeUninit<T>], lo| {
                let done = vmath::gelu_table(&src[lo..lo + out.len()], out);
                assert!(done, "gelu_table: the CPU and the type were checked above");
            })
        });
        return Some(out.and_then(|out| Tensor::from_vec(out?, x.dims())));
    }
    let out = with_slice::<T, _>(x, |src| {
        ewise::run_tasks(src.len(), |out: &mut [MaybeUninit<T>], lo| {
            map_widened(level, map, &src[lo..lo + out.len()], out)
        })
    });
    Some(out.and_then(|out| Tensor::from_vec(out?, x.dims())))
}

/// `out[i] = map(src[i])` computed in float32: [`CHUNK`] elements at a time widened,
/// mapped by [`vmath::map_f32`] and rounded (float32 storage is mapped in place).
fn map_widened<T: Element>(
    level: vmath::Level,
    map: F32Map,
    src: &[T],
    out: &mut [MaybeUninit<T>],
) {
    let (mut xb, mut yb) = ([0f32; CHUNK], [MaybeUninit::<f32>::uninit(); CHUNK]);
    for (k, o) in out.chunks_mut(CHUNK).enumerate() {
        let len = o.len();
        let xs = as_f32(&src[k * CHUNK..][..len], &mut xb);
        match ewise::same_mut::<MaybeUninit<T>, MaybeUninit<f32>>(o) {
            Some(d) => {
                vmath::map_f32(level, map, xs, d);
            }
            None => {
                let y = vmath::map_f32(level, map, xs, &mut yb[..len]);
                cast_into_uninit(y, o);
            }
        }
    }
}

/// `s` as float32: itself when it is float32, else widened into the front of `buf`
/// (at least as long).
fn as_f32<'a, T: Element>(s: &'a [T], buf: &'a mut [f32]) -> &'a [f32] {
    match ewise::same::<T, f32>(s) {
        Some(v) => v,
        None => {
            cast_into(s, &mut buf[..s.len()]);
            &buf[..s.len()]
        }
    }
}

/// Tables of a unary op's result for each of the 65536 bfloat16 or float16 inputs.
///
/// A 16-bit storage type has only 65536 values, so an op computed in float (every op
/// but the ones that [keep integers](UnaryOp::keeps_integers): `neg`, `abs`, `relu`,
/// ... are a few vector instructions) of a 16-bit tensor is one load per element from
/// a 128 KiB table (in L2), built once per process, op and type ([`BUILD_AFTER`](table16::BUILD_AFTER)) by
/// the direct path itself over a tensor of every bit pattern: the bits are the direct
/// path's on this CPU, which computes each element on its own, so no neighbour or
/// chunk boundary changes a result. Where the CPU has no 16-bit arithmetic (AVX2), the
/// direct path costs the float32 op (`sin`, `log`, ... call the scalar library per
/// element; `gelu` took ~36 cycles per 8 lanes on an AMD EPYC before its AVX2 table)
/// plus the widening and the rounding, so a 16-bit `gelu` was slower than the float32
/// one although it moves half the bytes.
mod table16 {
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    use amp_tensor::half::{bf16, f16};
    use amp_tensor::{Element, Result, Tensor};

    use super::{ewise, UnaryOp};

    /// A table is built once the elements computed directly by `(op, type)` reach this
    /// many, the table's own cost (the op over 65536 elements), so the process spends at
    /// most twice the work it would with a table from the start (the rent-or-buy rule)
    /// and a program that maps a few small tensors never builds one.
    pub(super) const BUILD_AFTER: usize = 1 << 16;

    /// One slot per `(op, type)`.
    const SLOTS: usize = 2 * UnaryOp::ALL.len();

    /// The tables, by `(op, type)` ([`slot`]); each built once.
    static TABLES: [OnceLock<Box<[u16]>>; SLOTS] = [const { OnceLock::new() }; SLOTS];

    /// The elements computed directly so far, by `(op, type)`.
    static COMPUTED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    /// The table of `op` for the 16-bit type `T` when it is built or this call of `n`
    /// elements brings the direct work to [`BUILD_AFTER`] (then `build` makes it);
    /// `None` for other types, for the ops that keep integers, and otherwise (the
    /// caller computes directly). Errors are `build`'s.
    pub(super) fn table_for<T: Element>(
        op: UnaryOp,
        n: usize,
        build: impl FnOnce() -> Result<Box<[u16]>>,
    ) -> Result<Option<&'static [u16]>> {
        let Some(slot) = slot::<T>(op) else {
            return Ok(None);
        };
        let cell = &TABLES[slot];
        if let Some(t) = cell.get() {
            return Ok(Some(t));
        }
        if COMPUTED[slot].fetch_add(n, Ordering::Relaxed) + n < BUILD_AFTER {
            return Ok(None);
        }
        let table = build()?;
        Ok(Some(cell.get_or_init(|| table)))
    }

    /// The index of `(op, T)` in [`TABLES`], `None` unless `T` is bfloat16 or float16
    /// and `op` computes in float, and for `gelu` where the CPU computes it in
    /// registers from its own table of Φ (AVX-512), 32 elements a step, faster than one
    /// load per element.
    fn slot<T: Element>(op: UnaryOp) -> Option<usize> {
        if op == UnaryOp::Gelu && crate::vmath::has_gelu_table() {
            return None;
        }
        let ty = if ewise::same::<T, bf16>(&[]).is_some() {
            0
        } else if ewise::same::<T, f16>(&[]).is_some() {
            1
        } else {
            return None;
        };
        (!op.keeps_integers()).then_some(2 * op as usize + ty)
    }

    /// The bits of `direct` (the op computed element by element) over a tensor of each
    /// bit pattern of `T` (16 bits), in pattern order.
    pub(super) fn build<T: Element>(
        direct: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Box<[u16]>> {
        let all = Tensor::from_vec(
            (0..=u16::MAX).map(from_bits::<T>).collect::<Vec<T>>(),
            vec![1 << 16],
        )?;
        let y: Vec<T> = direct(&all)?.host_vec()?;
        Ok(y.into_iter().map(bits).collect())
    }

    /// `out[i] = table[bits(src[i])]` (`T` is bfloat16 or float16, as [`table_for`]
    /// returned a table only for them).
    pub(super) fn look_up<T: Element>(table: &[u16], src: &[T], out: &mut [MaybeUninit<T>]) {
        let table: &[u16; 1 << 16] = table.try_into().expect("a table has 65536 entries");
        for (o, &v) in out.iter_mut().zip(src) {
            o.write(from_bits::<T>(table[bits(v) as usize]));
        }
    }

    /// The 16 bits of a bfloat16 or float16 value.
    #[inline(always)]
    fn bits<T: Element>(v: T) -> u16 {
        if let Some(&[b]) = ewise::same::<T, bf16>(&[v]) {
            return b.to_bits();
        }
        match ewise::same::<T, f16>(&[v]) {
            Some(&[h]) => h.to_bits(),
            _ => unreachable!("16-bit tables hold bfloat16 and float16 only"),
        }
    }

    /// The bfloat16 or float16 value of 16 bits.
    #[inline(always)]
    fn from_bits<T: Element>(b: u16) -> T {
        let (hb, hh) = ([bf16::from_bits(b)], [f16::from_bits(b)]);
        if let Some(&[v]) = ewise::same::<bf16, T>(&hb) {
            return v;
        }
        match ewise::same::<f16, T>(&hh) {
            Some(&[v]) => v,
            _ => unreachable!("16-bit tables hold bfloat16 and float16 only"),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A table lookup gives the direct path's bits for every bit pattern of both
        /// types and every op computed in float, with the patterns shuffled and a length
        /// that is not a multiple of any vector width (so the direct path's chunk
        /// boundaries and scalar tails fall elsewhere than when the table was built).
        #[test]
        fn lookups_give_the_direct_bits_of_every_pattern() {
            fn check<T: Element, C: crate::compute::Real + super::super::RoundEven>() {
                // A fixed permutation of the patterns (an odd multiplier), one left out.
                let x: Vec<T> = (0..u16::MAX)
                    .map(|i| from_bits::<T>(i.wrapping_mul(40503).wrapping_add(7)))
                    .collect();
                let xt = Tensor::from_vec(x.clone(), vec![x.len()]).unwrap();
                for op in UnaryOp::ALL.into_iter().filter(|op| !op.keeps_integers()) {
                    let direct = |t: &Tensor| super::super::float_unary_direct::<T, C>(op, t);
                    let table = build::<T>(direct).unwrap();
                    let want: Vec<T> = direct(&xt).unwrap().host_vec().unwrap();
                    let mut looked = vec![MaybeUninit::<T>::uninit(); x.len()];
                    look_up(&table, &x, &mut looked);
                    for (k, (w, l)) in want.iter().zip(&looked).enumerate() {
                        // SAFETY: `look_up` wrote every element.
                        let l = bits(unsafe { l.assume_init() });
                        assert_eq!(l, bits(*w), "{op:?}: element {k} ({:#06x})", bits(x[k]));
                    }
                }
            }
            check::<bf16, f32>();
            check::<f16, f32>();
        }
    }
}

/// The gradient of exact GELU, `grad · (Φ(x) + x·φ(x))`, in one pass (PyTorch's
/// `gelu_backward` with `approximate='none'`): `grad` and `x` of one floating dtype and
/// shape; the result has them. float16/bfloat16 compute in float32, rounded once; on
/// CPUs with FMA the float32 math is vectorised.
pub fn gelu_backward(grad: &Tensor, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "gelu_backward";
    crate::compute::on_device!(OP, [grad, x], crate::cuda::route::gelu_backward(grad, x));
    ensure_cpu(OP, &[grad, x])?;
    ensure!(
        grad.dims() == x.dims(),
        invalid(
            OP,
            "grad {:?} and self {:?} must have the same shape",
            grad.dims(),
            x.dims()
        )
    );
    if grad.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: x.dtype(),
            got: grad.dtype(),
        });
    }
    let (g, xc) = (grad.try_contiguous()?, x.try_contiguous()?);
    crate::float_kernel!(x.dtype(), OP, |T, C| {
        let out = with_slice::<T, _>(&g, |gs| {
            with_slice::<T, _>(&xc, |xs| gelu_backward_slices::<T, C>(gs, xs))
        })???;
        Tensor::from_vec(out, x.dims())
    })
}

/// [`gelu_backward`] over contiguous slices, in chunks over [`ewise::run_tasks`].
fn gelu_backward_slices<T: Element, C: Real>(g: &[T], x: &[T]) -> Result<Vec<T>> {
    let level = vmath::level().filter(|_| TypeId::of::<C>() == TypeId::of::<f32>());
    ewise::run_tasks(x.len(), |out: &mut [MaybeUninit<T>], lo| {
        let (mut gb, mut xb) = ([0f32; CHUNK], [0f32; CHUNK]);
        let mut yb = [MaybeUninit::<f32>::uninit(); CHUNK];
        for (k, o) in out.chunks_mut(CHUNK).enumerate() {
            let n = o.len();
            let (gs, xs) = (&g[lo + k * CHUNK..][..n], &x[lo + k * CHUNK..][..n]);
            match level {
                Some(level) => {
                    // float32 storage is read and written in place.
                    let (gw, xw) = (as_f32(gs, &mut gb), as_f32(xs, &mut xb));
                    match ewise::same_mut::<MaybeUninit<T>, MaybeUninit<f32>>(o) {
                        Some(d) => vmath::gelu_grad_f32(level, gw, xw, d),
                        None => {
                            vmath::gelu_grad_f32(level, gw, xw, &mut yb[..n]);
                            // SAFETY: `gelu_grad_f32` wrote all `n` elements.
                            let y = unsafe {
                                &*(&yb[..n] as *const [MaybeUninit<f32>] as *const [f32])
                            };
                            cast_into_uninit(y, o);
                        }
                    }
                }
                None => {
                    let half = C::from_f64c(0.5);
                    let pdf = C::from_f64c(
                        std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5,
                    );
                    let r2 = C::from_f64c(std::f64::consts::FRAC_1_SQRT_2);
                    for ((d, &gv), &xv) in o.iter_mut().zip(gs).zip(xs) {
                        let (gv, xv): (C, C) =
                            (C::from_f64c(gv.to_f64()), C::from_f64c(xv.to_f64()));
                        let cdf = half * (C::one() + (xv * r2).erf());
                        let dens = (-half * xv * xv).exp() * pdf;
                        d.write(T::from_f64((gv * (cdf + xv * dens)).to_f64c()));
                    }
                }
            }
        }
    })
}

/// Run a dtype-keeping `op` on an int32/int64 tensor.
fn int_unary<T: ewise::Int>(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let g = Guards::new([Some(x)]);
    let src = Src::full(x);
    let a: Arg<T, T> = src.arg(g.get(0)?, false, op.name())?;
    let dims = x.dims();
    let out: Vec<T> = match op {
        UnaryOp::Neg => zip1(dims, a, |v: T| v.wneg())?,
        UnaryOp::Abs => zip1(dims, a, |v: T| v.wabs())?,
        UnaryOp::Sign => zip1(dims, a, |v: T| v.sign())?,
        UnaryOp::Square => zip1(dims, a, |v: T| v.wmul(v))?,
        UnaryOp::Relu => zip1(dims, a, |v: T| v.max(T::ZERO))?,
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => return x.try_copy(),
        _ => {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: x.dtype(),
            })
        }
    };
    Tensor::from_vec(out, dims.to_vec())
}

/// Run a dtype-keeping `op` on a bool tensor (PyTorch: `sign` is the identity,
/// `square` gives int64, the rest are errors).
fn bool_unary(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Sign => x.try_copy(),
        UnaryOp::Square => x.to_dtype(DType::I64)?.try_contiguous(),
        UnaryOp::Neg => Err(Error::invalid(
            "neg",
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.",
        )),
        UnaryOp::Relu => Err(Error::invalid("relu", "Boolean inputs not supported for relu")),
        _ => Err(Error::UnsupportedDType {
            op: op.name(),
            dtype: DType::Bool,
        }),
    }
}

/// Apply a unary op elementwise. Floating inputs keep their dtype (16-bit types are
/// computed in float32 and rounded once); integer inputs keep their dtype for the
/// ops of [`UnaryOp::keeps_integers`] and give float32 for the others (GELU rejects
/// them, as PyTorch does). The output is a new contiguous tensor.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    crate::compute::on_device!(op.name(), [x], crate::cuda::route::unary(op, x));
    ensure_cpu(op.name(), &[x])?;
    let dt = x.dtype();
    if !dt.is_floating_point() {
        if op.keeps_integers() {
            return int_kernel!(dt, |T| int_unary::<T>(op, x), _ => bool_unary(op, x));
        }
        if matches!(op, UnaryOp::Gelu | UnaryOp::GeluTanh) {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: dt,
            });
        }
        return float_unary::<f32, f32>(op, &x.to_dtype(DType::F32)?);
    }
    crate::float_kernel!(dt, op.name(), |T, C| float_unary::<T, C>(op, x))
}

macro_rules! unary_wrappers {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(x: &Tensor) -> Result<Tensor> {
            unary(UnaryOp::$op, x)
        }
    )*};
}

unary_wrappers! {
    /// `-x` (an error for bool tensors).
    neg => Neg;
    /// `|x|`.
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// `e^x - 1`.
    expm1 => Expm1;
    /// Natural logarithm.
    log => Log;
    /// `log(1 + x)`.
    log1p => Log1p;
    /// Base-2 logarithm.
    log2 => Log2;
    /// Base-10 logarithm.
    log10 => Log10;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// `1 / x`.
    reciprocal => Reciprocal;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Tangent.
    tan => Tan;
    /// Arcsine.
    asin => Asin;
    /// Arccosine.
    acos => Acos;
    /// Arctangent.
    atan => Atan;
    /// Hyperbolic sine.
    sinh => Sinh;
    /// Hyperbolic cosine.
    cosh => Cosh;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// Logistic sigmoid.
    sigmoid => Sigmoid;
    /// `max(x, 0)`.
    relu => Relu;
    /// Exact GELU.
    gelu => Gelu;
    /// GELU, tanh approximation.
    gelu_tanh => GeluTanh;
    /// Error function.
    erf => Erf;
    /// Inverse error function.
    erfinv => Erfinv;
    /// Sign (-1, 0, 1).
    sign => Sign;
    /// Floor.
    floor => Floor;
    /// Ceil.
    ceil => Ceil;
    /// Round half to even.
    round => Round;
    /// `x * x` (bool gives int64).
    square => Square;
}

/// PyTorch's `softplus`: `x` where `x * beta > threshold`, else
/// `log1p(exp(beta * x)) / beta` (floating inputs only; 16-bit types compute in
/// float32 with `beta` and `threshold` in float32).
pub fn softplus(x: &Tensor, beta: f64, threshold: f64) -> Result<Tensor> {
    const OP: &str = "softplus";
    ensure_cpu(OP, &[x])?;
    crate::float_kernel!(x.dtype(), OP, |T, C| {
        let g = Guards::new([Some(x)]);
        let src = Src::full(x);
        let a: Arg<T, C> = src.arg(g.get(0)?, false, OP)?;
        let (b, th) = (C::from_f64c(beta), C::from_f64c(threshold));
        let out: Vec<T> = zip1(x.dims(), a, move |v: C| {
            if v * b > th {
                v
            } else {
                (v * b).exp().ln_1p() / b
            }
        })?;
        Tensor::from_vec(out, x.dims())
    })
}

/// A bool tensor of `pred` on each element of a floating `x`; `int_value` for every
/// element of an integer or bool tensor.
fn float_test(
    op: &'static str,
    x: &Tensor,
    int_value: bool,
    pred: fn(f64) -> bool,
) -> Result<Tensor> {
    ensure_cpu(op, &[x])?;
    if !x.dtype().is_floating_point() {
        return full_tensor(x.dims(), int_value, DType::Bool);
    }
    crate::float_kernel!(x.dtype(), op, |T, C| {
        let g = Guards::new([Some(x)]);
        let src = Src::full(x);
        let a: Arg<T, C> = src.arg(g.get(0)?, false, op)?;
        let out: Vec<bool> = zip1(x.dims(), a, |v: C| pred(v.to_f64c()))?;
        Tensor::from_vec(out, x.dims())
    })
}

/// `true` where the element is neither infinite nor NaN (all `true` for integers).
pub fn isfinite(x: &Tensor) -> Result<Tensor> {
    float_test("isfinite", x, true, f64::is_finite)
}

/// `true` where the element is NaN (all `false` for integers).
pub fn isnan(x: &Tensor) -> Result<Tensor> {
    float_test("isnan", x, false, f64::is_nan)
}

/// `true` where the element is ±inf (all `false` for integers).
pub fn isinf(x: &Tensor) -> Result<Tensor> {
    float_test("isinf", x, false, f64::is_infinite)
}
