//! Binary elementwise ops with broadcasting and PyTorch's type promotion: arithmetic
//! (`add`, `sub`, `mul`, `div`, `pow`, `atan2`, `maximum`, `minimum`, `remainder`),
//! their scalar forms, comparisons and the logical ops.
//!
//! The result dtype is `torch.result_type` of the operands (dimensioned tensors
//! outrank 0-dim tensors, which outrank Python scalars); true division and `atan2`
//! of integers give float32. Operands are promoted to the result dtype and computed
//! in its compute type (float16/bfloat16 in float32, rounded once). Integer
//! arithmetic wraps. A single-value second operand of `mul`/`div` on a 16-bit
//! result (and the scalar of `x * s`, `x / s`, `x ** s`) is used unrounded in
//! float32, as PyTorch's `original_scalar_value<opmath_t>` does; other ops round it
//! to the result dtype first.
//!
//! Same-shape contiguous operands run as one tight (auto-vectorised) loop, a
//! single-value operand is splatted, broadcasting walks coalesced runs (a bias add
//! `[N, M] + [M]` is `N` runs of `M`), and large outputs are split over the threads
//! ([`amp_tensor::parallel`]).

use amp_tensor::{
    broadcast_shapes, ensure, result_type, DType, Element, Error, Operand, Result, Scalar, Tensor,
};

use crate::compute::Real;
use crate::unary::ewise::{
    self, any_kernel, ensure_cpu, int_kernel, meta, zip1, zip2, Arg, Guards, Int, Src,
};

/// The binary arithmetic ops, named as in PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b` (an error with bool operands, as PyTorch).
    Sub,
    /// `a * b`.
    Mul,
    /// True division `a / b` (integers give float32).
    Div,
    /// `a ** b`.
    Pow,
    /// `atan2(a, b)` (integers give float32).
    Atan2,
    /// Elementwise maximum; NaN propagates.
    Maximum,
    /// Elementwise minimum; NaN propagates.
    Minimum,
    /// Python's modulo: the result has the sign of the divisor.
    Remainder,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 9] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Atan2,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Remainder,
    ];

    /// PyTorch's name of the op.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Atan2 => "atan2",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Remainder => "remainder",
        }
    }

    /// The output dtype for operands whose `result_type` is `promoted`: float32 for
    /// the float-only ops (`div`, `atan2`) on integers and bools, else `promoted`.
    pub const fn out_dtype(self, promoted: DType) -> DType {
        match self {
            BinaryOp::Div | BinaryOp::Atan2 if !promoted.is_floating_point() => DType::F32,
            _ => promoted,
        }
    }
}

/// Elementwise comparisons (bool results).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `a == b`.
    Eq,
    /// `a != b` (true where either is NaN).
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

impl CmpOp {
    /// Every comparison.
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    /// PyTorch's name of the op.
    pub const fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// One binary computation, after promotion and broadcasting.
struct Job<'t> {
    op: BinaryOp,
    dims: Vec<usize>,
    x: Src<'t>,
    y: Src<'t>,
    /// Whether a single-value `x` / `y` is read unrounded into the compute type.
    opmath: [bool; 2],
    /// `x + alpha * y` (`x - alpha * y` for `Sub`).
    alpha: Option<f64>,
    /// The exponent of `pow(tensor, scalar)`, for PyTorch's special cases.
    scalar_exp: Option<f64>,
    /// `s / y` computed as PyTorch's `__rtruediv__`: `reciprocal(y) * s`.
    rdiv: bool,
}

fn sub_bool_error(both: bool) -> Error {
    Error::invalid(
        "sub",
        if both {
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
        } else {
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        },
    )
}

/// PyTorch's `sub_check`: subtraction never takes a bool operand.
fn check_sub(op: BinaryOp, a_bool: bool, b_bool: bool) -> Result<()> {
    if op == BinaryOp::Sub && (a_bool || b_bool) {
        return Err(sub_bool_error(a_bool && b_bool));
    }
    Ok(())
}

fn is_bool_scalar(s: Scalar) -> bool {
    matches!(s, Scalar::Bool(_))
}

/// The floating kernel: storage `T`, compute `C`.
fn float_binary<T: Element, C: Real>(job: &Job<'_>) -> Result<Vec<T>> {
    let name = job.op.name();
    let g = Guards::new([job.x.tensor(), job.y.tensor()]);
    let x: Arg<T, C> = job.x.arg(g.get(0)?, job.opmath[0], name)?;
    let y: Arg<T, C> = job.y.arg(g.get(1)?, job.opmath[1], name)?;
    let d = &job.dims[..];
    // Round a compute value to the storage type (an intermediate PyTorch stores).
    let narrow = |v: C| -> C { v.cast::<T>().cast::<C>() };
    let alpha = job
        .alpha
        .filter(|&a| a != 1.0)
        .map(|a| narrow(C::from_f64c(a)));
    match job.op {
        BinaryOp::Add => match alpha {
            None => zip2(d, x, y, |p: C, q: C| p + q),
            Some(al) => zip2(d, x, y, move |p: C, q: C| p + al * q),
        },
        BinaryOp::Sub => match alpha {
            None => zip2(d, x, y, |p: C, q: C| p - q),
            Some(al) => zip2(d, x, y, move |p: C, q: C| p - al * q),
        },
        BinaryOp::Mul => zip2(d, x, y, |p: C, q: C| p * q),
        BinaryOp::Div if job.rdiv => zip2(d, x, y, move |s: C, q: C| narrow(C::one() / q) * s),
        BinaryOp::Div => zip2(d, x, y, |p: C, q: C| p / q),
        BinaryOp::Pow => match job.scalar_exp {
            Some(2.0) => zip2(d, x, y, |p: C, _: C| p * p),
            Some(3.0) => zip2(d, x, y, |p: C, _: C| p * p * p),
            Some(0.5) => zip2(d, x, y, |p: C, _: C| p.sqrt()),
            Some(-0.5) => zip2(d, x, y, |p: C, _: C| C::one() / p.sqrt()),
            Some(-1.0) => zip2(d, x, y, |p: C, _: C| C::one() / p),
            Some(-2.0) => zip2(d, x, y, |p: C, _: C| C::one() / (p * p)),
            _ => zip2(d, x, y, |p: C, q: C| p.powf(q)),
        },
        BinaryOp::Atan2 => zip2(d, x, y, |p: C, q: C| p.atan2(q)),
        BinaryOp::Maximum => zip2(d, x, y, |p: C, q: C| {
            if p.is_nan() || q.is_nan() {
                C::nan()
            } else if p > q {
                p
            } else {
                q
            }
        }),
        BinaryOp::Minimum => zip2(d, x, y, |p: C, q: C| {
            if p.is_nan() || q.is_nan() {
                C::nan()
            } else if p < q {
                p
            } else {
                q
            }
        }),
        BinaryOp::Remainder => zip2(d, x, y, |p: C, q: C| {
            let m = p % q;
            if m != C::zero() && ((q < C::zero()) != (m < C::zero())) {
                m + q
            } else {
                m
            }
        }),
    }
}

/// The integer kernel (wrapping arithmetic).
fn int_binary<T: Int>(job: &Job<'_>) -> Result<Vec<T>> {
    let name = job.op.name();
    let g = Guards::new([job.x.tensor(), job.y.tensor()]);
    let x: Arg<T, T> = job.x.arg(g.get(0)?, false, name)?;
    let y: Arg<T, T> = job.y.arg(g.get(1)?, false, name)?;
    let d = &job.dims[..];
    let alpha = match job.alpha {
        None => None,
        Some(a) => Some(T::from_integral(a).ok_or_else(|| {
            Error::invalid(
                name,
                "For integral input tensors, argument alpha must not be a floating point number.",
            )
        })?),
    };
    match job.op {
        BinaryOp::Add => match alpha {
            None => zip2(d, x, y, |p: T, q: T| p.wadd(q)),
            Some(al) => zip2(d, x, y, move |p: T, q: T| p.wadd(al.wmul(q))),
        },
        BinaryOp::Sub => match alpha {
            None => zip2(d, x, y, |p: T, q: T| p.wsub(q)),
            Some(al) => zip2(d, x, y, move |p: T, q: T| p.wsub(al.wmul(q))),
        },
        BinaryOp::Mul => zip2(d, x, y, |p: T, q: T| p.wmul(q)),
        BinaryOp::Pow => zip2(d, x, y, |p: T, q: T| p.ipow(q)),
        BinaryOp::Maximum => zip2(d, x, y, |p: T, q: T| p.max(q)),
        BinaryOp::Minimum => zip2(d, x, y, |p: T, q: T| p.min(q)),
        BinaryOp::Remainder => {
            ensure!(!ewise::any_zero(&y), invalid(name, "ZeroDivisionError"));
            zip2(d, x, y, |p: T, q: T| p.pymod(q))
        }
        // Promoted to float32 by `BinaryOp::out_dtype`; never integer here.
        BinaryOp::Div | BinaryOp::Atan2 => Err(Error::UnsupportedDType {
            op: name,
            dtype: T::DTYPE,
        }),
    }
}

/// The bool kernel: `add`/`maximum` are `or`, `mul`/`minimum` are `and`.
fn bool_binary(job: &Job<'_>) -> Result<Vec<bool>> {
    let name = job.op.name();
    let g = Guards::new([job.x.tensor(), job.y.tensor()]);
    let x: Arg<bool, bool> = job.x.arg(g.get(0)?, false, name)?;
    let y: Arg<bool, bool> = job.y.arg(g.get(1)?, false, name)?;
    let d = &job.dims[..];
    match job.op {
        BinaryOp::Add if job.alpha == Some(0.0) => zip2(d, x, y, |p: bool, _: bool| p),
        BinaryOp::Add | BinaryOp::Maximum => zip2(d, x, y, |p: bool, q: bool| p | q),
        BinaryOp::Mul | BinaryOp::Minimum => zip2(d, x, y, |p: bool, q: bool| p & q),
        // `pow(x, False)` is ones and `pow(x, True)` a copy (PyTorch's shortcuts).
        BinaryOp::Pow if job.scalar_exp == Some(0.0) => zip2(d, x, y, |_: bool, _: bool| true),
        BinaryOp::Pow if job.scalar_exp == Some(1.0) => zip2(d, x, y, |p: bool, _: bool| p),
        BinaryOp::Sub => Err(sub_bool_error(true)),
        BinaryOp::Pow | BinaryOp::Div | BinaryOp::Atan2 | BinaryOp::Remainder => {
            Err(Error::UnsupportedDType {
                op: name,
                dtype: DType::Bool,
            })
        }
    }
}

/// Run `job` producing dtype `od`.
fn run(job: Job<'_>, od: DType) -> Result<Tensor> {
    if od.is_floating_point() {
        return crate::float_kernel!(od, job.op.name(), |T, C| {
            Tensor::from_vec(float_binary::<T, C>(&job)?, job.dims)
        });
    }
    int_kernel!(od, |T| Tensor::from_vec(int_binary::<T>(&job)?, job.dims),
        _ => Tensor::from_vec(bool_binary(&job)?, job.dims))
}

/// `a op b` (with `alpha` for add/sub) over two tensors.
fn tensor_op(op: BinaryOp, a: &Tensor, b: &Tensor, alpha: Option<f64>) -> Result<Tensor> {
    let name = op.name();
    check_sub(op, a.dtype() == DType::Bool, b.dtype() == DType::Bool)?;
    crate::compute::on_device!(name, [a, b], crate::cuda::route::binary(op, a, b, alpha));
    ensure_cpu(name, &[a, b])?;
    let promoted = result_type(&[meta(a), meta(b)]).unwrap_or(a.dtype());
    let od = op.out_dtype(promoted);
    let dims = if a.dims() == b.dims() {
        a.dims().to_vec()
    } else {
        broadcast_shapes(name, a.dims(), b.dims())?
    };
    let job = Job {
        op,
        dims,
        x: Src::of(a, od, name)?,
        y: Src::of(b, od, name)?,
        opmath: [false, matches!(op, BinaryOp::Mul | BinaryOp::Div)],
        alpha,
        scalar_exp: None,
        rdiv: false,
    };
    run(job, od)
}

/// `a op b` elementwise with broadcasting (PyTorch's error text on a shape mismatch)
/// and type promotion (`torch.result_type`; `div` and `atan2` of integers give
/// float32). Returns a new contiguous tensor.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    tensor_op(op, a, b, None)
}

/// `a op s` for a Python-style scalar `s` (`x + 1`, `x * 0.5`, `x ** 2`). The result
/// dtype is `result_type([a, s])`: a float scalar lifts an integer tensor to float32
/// but keeps a bfloat16 tensor bfloat16. For `mul`, `div` and `pow` the scalar is
/// used unrounded in the compute type (bf16 `x * 0.1` multiplies by `0.1f32`); the
/// other ops round it to the result dtype first. Integer tensors to negative
/// integer powers are an error, as in PyTorch.
pub fn binary_scalar(op: BinaryOp, a: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
    let s = s.into();
    let name = op.name();
    check_sub(op, a.dtype() == DType::Bool, is_bool_scalar(s))?;
    crate::compute::on_device!(
        name,
        [a],
        crate::cuda::route::binary_scalar(op, a, s, false)
    );
    ensure_cpu(name, &[a])?;
    if op == BinaryOp::Pow && !a.dtype().is_floating_point() {
        if let Scalar::Int(e) = s {
            ensure!(
                e >= 0,
                invalid(name, "Integers to negative integer powers are not allowed.")
            );
        }
    }
    let promoted = result_type(&[meta(a), Operand::Scalar(s)]).unwrap_or(a.dtype());
    let od = op.out_dtype(promoted);
    let job = Job {
        op,
        dims: a.dims().to_vec(),
        x: Src::of(a, od, name)?,
        y: Src::One(s),
        opmath: [
            false,
            matches!(op, BinaryOp::Mul | BinaryOp::Div | BinaryOp::Pow),
        ],
        alpha: None,
        scalar_exp: (op == BinaryOp::Pow).then(|| s.to_f64()),
        rdiv: false,
    };
    run(job, od)
}

/// `s op b` for a Python-style scalar `s` (`1 - x`, `2 / x`, `2 ** x`), with the
/// dtype rules of [`binary_scalar`]. `s / b` is computed as PyTorch's
/// `__rtruediv__` does, `reciprocal(b) * s`.
pub fn scalar_binary(op: BinaryOp, s: impl Into<Scalar>, b: &Tensor) -> Result<Tensor> {
    let s = s.into();
    let name = op.name();
    check_sub(op, is_bool_scalar(s), b.dtype() == DType::Bool)?;
    crate::compute::on_device!(name, [b], crate::cuda::route::binary_scalar(op, b, s, true));
    ensure_cpu(name, &[b])?;
    let promoted = result_type(&[Operand::Scalar(s), meta(b)]).unwrap_or(b.dtype());
    let od = op.out_dtype(promoted);
    let job = Job {
        op,
        dims: b.dims().to_vec(),
        x: Src::One(s),
        y: Src::of(b, od, name)?,
        opmath: [matches!(op, BinaryOp::Mul | BinaryOp::Div), false],
        alpha: None,
        scalar_exp: None,
        rdiv: op == BinaryOp::Div,
    };
    run(job, od)
}

macro_rules! binary_wrappers {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Tensor, b: &Tensor) -> Result<Tensor> {
            binary(BinaryOp::$op, a, b)
        }
    )*};
}

binary_wrappers! {
    /// `a + b` with broadcasting and promotion.
    add => Add;
    /// `a - b` with broadcasting and promotion.
    sub => Sub;
    /// `a * b` with broadcasting and promotion.
    mul => Mul;
    /// `a / b` (true division) with broadcasting and promotion.
    div => Div;
    /// `a ** b` with broadcasting and promotion.
    pow => Pow;
    /// `atan2(a, b)` with broadcasting and promotion.
    atan2 => Atan2;
    /// Elementwise maximum (NaN propagates).
    maximum => Maximum;
    /// Elementwise minimum (NaN propagates).
    minimum => Minimum;
    /// Python modulo (`torch.remainder`).
    remainder => Remainder;
}

/// `a + alpha * b` (`torch.add(a, b, alpha=alpha)`). For 16-bit results `alpha` is
/// rounded to the result dtype and the sum computed in float32 and rounded once;
/// integer results need an integral `alpha`.
pub fn add_scaled(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    tensor_op(BinaryOp::Add, a, b, Some(alpha))
}

/// `a - alpha * b` (`torch.sub(a, b, alpha=alpha)`).
pub fn sub_scaled(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    tensor_op(BinaryOp::Sub, a, b, Some(alpha))
}

macro_rules! scalar_wrappers {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(a: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
            binary_scalar(BinaryOp::$op, a, s)
        }
    )*};
}

scalar_wrappers! {
    /// `a + s`.
    add_scalar => Add;
    /// `a - s`.
    sub_scalar => Sub;
    /// `a * s`.
    mul_scalar => Mul;
    /// `a / s`.
    div_scalar => Div;
    /// `a ** s`.
    pow_scalar => Pow;
}

/// The comparison kernel in compute type `C` (exact widening of `T`).
fn cmp_kernel<T: Element, C: Element>(
    op: CmpOp,
    dims: &[usize],
    x: &Src<'_>,
    y: &Src<'_>,
) -> Result<Vec<bool>> {
    let name = op.name();
    let g = Guards::new([x.tensor(), y.tensor()]);
    let x: Arg<T, C> = x.arg(g.get(0)?, false, name)?;
    let y: Arg<T, C> = y.arg(g.get(1)?, false, name)?;
    match op {
        CmpOp::Eq => zip2(dims, x, y, |p: C, q: C| p == q),
        CmpOp::Ne => zip2(dims, x, y, |p: C, q: C| p != q),
        CmpOp::Lt => zip2(dims, x, y, |p: C, q: C| p < q),
        CmpOp::Le => zip2(dims, x, y, |p: C, q: C| p <= q),
        CmpOp::Gt => zip2(dims, x, y, |p: C, q: C| p > q),
        CmpOp::Ge => zip2(dims, x, y, |p: C, q: C| p >= q),
    }
}

fn compare_srcs(
    op: CmpOp,
    dims: Vec<usize>,
    x: Src<'_>,
    y: Src<'_>,
    dtype: DType,
) -> Result<Tensor> {
    let out = any_kernel!(dtype, |T, C| cmp_kernel::<T, C>(op, &dims, &x, &y)?);
    Tensor::from_vec(out, dims)
}

/// `a op b` elementwise as a bool tensor, broadcasting, compared in the promoted
/// dtype (`result_type([a, b])`).
pub fn compare(op: CmpOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let dt = result_type(&[meta(a), meta(b)]).unwrap_or(a.dtype());
    crate::compute::on_device!(name, [a, b], crate::cuda::route::compare(name, a, b, dt));
    ensure_cpu(name, &[a, b])?;
    let dims = broadcast_shapes(name, a.dims(), b.dims())?;
    compare_srcs(op, dims, Src::of(a, dt, name)?, Src::of(b, dt, name)?, dt)
}

/// `a op s` elementwise as a bool tensor, compared in `result_type([a, s])` (the
/// scalar is cast to that dtype, as PyTorch does).
pub fn compare_scalar(op: CmpOp, a: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
    let s = s.into();
    let name = op.name();
    let dt = result_type(&[meta(a), Operand::Scalar(s)]).unwrap_or(a.dtype());
    crate::compute::on_device!(
        name,
        [a],
        crate::cuda::route::compare_scalar(name, a, s, dt)
    );
    ensure_cpu(name, &[a])?;
    compare_srcs(
        op,
        a.dims().to_vec(),
        Src::of(a, dt, name)?,
        Src::One(s),
        dt,
    )
}

/// A bool tensor of `f(a != 0, b != 0)` with broadcasting (NaN counts as `true`).
fn logical2(
    name: &'static str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(bool, bool) -> bool + Sync,
) -> Result<Tensor> {
    ensure_cpu(name, &[a, b])?;
    let dims = broadcast_shapes(name, a.dims(), b.dims())?;
    let (x, y) = (
        Src::of(a, DType::Bool, name)?,
        Src::of(b, DType::Bool, name)?,
    );
    let g = Guards::new([x.tensor(), y.tensor()]);
    let out: Vec<bool> = zip2(
        &dims,
        x.arg::<bool, bool>(g.get(0)?, false, name)?,
        y.arg::<bool, bool>(g.get(1)?, false, name)?,
        f,
    )?;
    Tensor::from_vec(out, dims)
}

/// Elementwise logical and (any dtype; nonzero is `true`), as a bool tensor.
pub fn logical_and(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    logical2("logical_and", a, b, |p, q| p & q)
}

/// Elementwise logical or (any dtype; nonzero is `true`), as a bool tensor.
pub fn logical_or(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    logical2("logical_or", a, b, |p, q| p | q)
}

/// Elementwise logical not (any dtype; zero gives `true`), as a bool tensor.
pub fn logical_not(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "logical_not";
    ensure_cpu(OP, &[a])?;
    let x = Src::of(a, DType::Bool, OP)?;
    let g = Guards::new([x.tensor()]);
    let out: Vec<bool> = zip1(
        a.dims(),
        x.arg::<bool, bool>(g.get(0)?, false, OP)?,
        |p: bool| !p,
    )?;
    Tensor::from_vec(out, a.dims())
}
