//! Elementwise ops: unary math, binary arithmetic with broadcasting and promotion,
//! scalar forms (`__rpow__`, `__rtruediv__`, ...), comparisons, `where`, `clamp`.

use amp_kernels::{BinaryOp, CmpOp, UnaryOp};
use amp_tensor::Scalar;

use super::names::{self, ADDCDIV, ADDCMUL, CLAMP, SOFTPLUS, WHERE};
use super::{enter, promoted, sum_to};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{grad_if, record, Kept, SavedOutput};
use crate::{Result, Tensor};

/// Whether a backward formula's declared reads (`|g, x, out|`) name `$name`.
macro_rules! reads {
    ($name:ident in $($r:ident)*) => {
        [$(stringify!($r)),*].contains(&stringify!($name))
    };
}

/// One declared read of a formula, bound from what its op kept: an input (`Kept`) or the
/// output (`SavedOutput`).
macro_rules! bind_read {
    (out, $inputs:tt, $out:ident) => {
        &$out.as_ref().expect("the output is kept when a formula reads it").get()
    };
    ($name:ident, {$($input:ident => $kept:ident),*}, $out:ident) => {
        bind_read!(@find $name, $($input => $kept),*)
    };
    (@find $name:ident, $input:ident => $kept:ident $(, $rest:ident => $rk:ident)*) => {{
        if stringify!($name) == stringify!($input) {
            $kept.get()
        } else {
            bind_read!(@find $name, $($rest => $rk),*)
        }
    }};
    (@find $name:ident,) => {
        unreachable!("a formula reads an operand its op does not have")
    };
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $fname:ident = $op:ident, $kop:ident, $node:literal, |$g:ident $(, $r:ident)*| $bw:expr;)*) => {$(
        $(#[$doc])*
        pub fn $fname(x: &Tensor) -> Result<Tensor> {
            let ([x], _body) = enter(&names::$op, [x])?;
            let out = amp_kernels::unary(UnaryOp::$kop, x.data())?;
            // Only what the formula reads: the input, the output, or nothing.
            let _kx = Kept::new(&x, reads!(x in $($r)*));
            let _ko = reads!(out in $($r)*).then(|| SavedOutput::new(&out, 0));
            Ok(record(out, $node, &[&x], move |$g| {
                $(let $r = bind_read!($r, {x => _kx}, _ko);)*
                Ok(vec![Some($bw)])
            }))
        }
    )*};
}

unary_ops! {
    /// `-x`.
    neg = NEG, Neg, "NegBackward0", |g| neg(g)?;
    /// `|x|` (gradient `sign(x)`, 0 at 0).
    abs = ABS, Abs, "AbsBackward0", |g, x| mul(g, &sign(x)?)?;
    /// `e^x`.
    exp = EXP, Exp, "ExpBackward0", |g, out| mul(g, out)?;
    /// `e^x - 1`.
    expm1 = EXPM1, Expm1, "Expm1Backward0", |g, out| mul(g, &add_scalar(out, 1.0)?)?;
    /// Natural log.
    log = LOG, Log, "LogBackward0", |g, x| div(g, x)?;
    /// `log(1 + x)`.
    log1p = LOG1P, Log1p, "Log1PBackward0", |g, x| div(g, &add_scalar(x, 1.0)?)?;
    /// Base-2 log.
    log2 = LOG2, Log2, "Log2Backward0", |g, x| div(g, &mul_scalar(x, std::f64::consts::LN_2)?)?;
    /// Base-10 log.
    log10 = LOG10, Log10, "Log10Backward0", |g, x| div(g, &mul_scalar(x, std::f64::consts::LN_10)?)?;
    /// Square root.
    sqrt = SQRT, Sqrt, "SqrtBackward0", |g, out| div(g, &mul_scalar(out, 2.0)?)?;
    /// `1 / sqrt(x)`.
    rsqrt = RSQRT, Rsqrt, "RsqrtBackward0", |g, out| mul(g, &mul_scalar(&pow_scalar(out, 3.0)?, -0.5)?)?;
    /// `1 / x`.
    reciprocal = RECIPROCAL, Reciprocal, "ReciprocalBackward0", |g, out| mul(g, &neg(&square(out)?)?)?;
    /// Sine.
    sin = SIN, Sin, "SinBackward0", |g, x| mul(g, &cos(x)?)?;
    /// Cosine.
    cos = COS, Cos, "CosBackward0", |g, x| mul(g, &neg(&sin(x)?)?)?;
    /// Tangent.
    tan = TAN, Tan, "TanBackward0", |g, out| mul(g, &add_scalar(&square(out)?, 1.0)?)?;
    /// Arcsine.
    asin = ASIN, Asin, "AsinBackward0", |g, x| div(g, &sqrt(&rsub_scalar(&square(x)?, 1.0)?)?)?;
    /// Arccosine.
    acos = ACOS, Acos, "AcosBackward0", |g, x| neg(&div(g, &sqrt(&rsub_scalar(&square(x)?, 1.0)?)?)?)?;
    /// Arctangent.
    atan = ATAN, Atan, "AtanBackward0", |g, x| div(g, &add_scalar(&square(x)?, 1.0)?)?;
    /// Hyperbolic sine.
    sinh = SINH, Sinh, "SinhBackward0", |g, x| mul(g, &cosh(x)?)?;
    /// Hyperbolic cosine.
    cosh = COSH, Cosh, "CoshBackward0", |g, x| mul(g, &sinh(x)?)?;
    /// Hyperbolic tangent.
    tanh = TANH, Tanh, "TanhBackward0", |g, out| mul(g, &rsub_scalar(&square(out)?, 1.0)?)?;
    /// Logistic sigmoid.
    sigmoid = SIGMOID, Sigmoid, "SigmoidBackward0", |g, out| mul(g, &mul(out, &rsub_scalar(out, 1.0)?)?)?;
    /// `max(x, 0)`.
    relu = RELU, Relu, "ReluBackward0", |g, x| threshold_backward(g, x, 0.0)?;
    /// Exact GELU, `x * Φ(x)`.
    gelu = GELU, Gelu, "GeluBackward0", |g, x| if !is_grad_enabled()
        && g.dtype() == x.dtype()
        && g.dims() == x.dims()
    {
        // One pass, one launch on a device (PyTorch's gelu_backward); under
        // create_graph the formula below.
        Tensor::from_raw(amp_kernels::gelu_backward(g.data(), x.data())?)
    } else {
        let cdf = mul_scalar(&add_scalar(&erf(&mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2)?)?, 1.0)?, 0.5)?;
        let pdf = mul_scalar(&exp(&mul_scalar(&square(x)?, -0.5)?)?, 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)?;
        mul(g, &add(&cdf, &mul(x, &pdf)?)?)?
    };
    /// Error function.
    erf = ERF, Erf, "ErfBackward0", |g, x| mul(g, &mul_scalar(&exp(&neg(&square(x)?)?)?, std::f64::consts::FRAC_2_SQRT_PI)?)?;
    /// Inverse error function.
    erfinv = ERFINV, Erfinv, "ErfinvBackward0", |g, out| mul(g, &mul_scalar(&exp(&square(out)?)?, std::f64::consts::PI.sqrt() / 2.0)?)?;
    /// `x * x`.
    square = SQUARE, Square, "PowBackward0", |g, x| mul(g, &mul_scalar(x, 2.0)?)?;
    /// Sign (-1, 0, 1); gradient zero.
    sign = SIGN, Sign, "SignBackward0", |g| zeros_like(g);
    /// Floor; gradient zero.
    floor = FLOOR, Floor, "FloorBackward0", |g| zeros_like(g);
    /// Ceil; gradient zero.
    ceil = CEIL, Ceil, "CeilBackward0", |g| zeros_like(g);
    /// Round half to even; gradient zero.
    round = ROUND, Round, "RoundBackward0", |g| zeros_like(g);
}

/// `t` itself, recorded as also depending on `x` with a zero derivative. Backward
/// formulas whose value does not involve `x` but whose PyTorch counterpart takes it
/// (`threshold_backward`, `nll_loss_backward`) use it under `create_graph`, so the
/// first-order gradient requires grad and the second-order gradient is zeros, as in
/// PyTorch.
pub(crate) fn link_zero(t: Tensor, x: &Tensor) -> Tensor {
    if !is_grad_enabled() || !x.requires_grad() {
        return t;
    }
    let (xd, xt, xv) = (x.dims().to_vec(), x.dtype(), x.device());
    record(
        t.data().clone(),
        "ThresholdBackwardBackward0",
        &[&t, x],
        move |gg| {
            Ok(vec![
                Some(gg.clone()),
                Some(Tensor::zeros_on(xd.clone(), xt, xv)?),
            ])
        },
    )
}

/// `x <= threshold ? 0 : g` (`threshold_backward`), differentiable in `g` (its own
/// derivative) with a zero derivative in `x`, as PyTorch's `ThresholdBackwardBackward0`.
pub(crate) fn threshold_backward(g: &Tensor, x: &Tensor, threshold: f64) -> Result<Tensor> {
    let out = amp_kernels::threshold_backward(g.data(), x.data(), threshold)?;
    let (xs, xd, xt, xv) = (x.clone(), x.dims().to_vec(), x.dtype(), x.device());
    Ok(record(
        out,
        "ThresholdBackwardBackward0",
        &[g, x],
        move |gg| {
            Ok(vec![
                Some(threshold_backward(gg, &xs, threshold)?),
                Some(Tensor::zeros_on(xd.clone(), xt, xv)?),
            ])
        },
    ))
}

/// Zeros shaped like `t` (no graph).
pub fn zeros_like(t: &Tensor) -> Tensor {
    Tensor::from_raw(t.data().zeros_like())
}

/// Ones shaped like `t` (no graph).
pub fn ones_like(t: &Tensor) -> Tensor {
    Tensor::from_raw(t.data().ones_like())
}

/// `log(1 + exp(beta x)) / beta`, linear above `threshold`.
pub fn softplus(x: &Tensor, beta: f64, threshold: f64) -> Result<Tensor> {
    let ([x], _body) = enter(&SOFTPLUS, [x])?;
    let out = amp_kernels::softplus(x.data(), beta, threshold)?;
    let xs = x.clone();
    Ok(record(out, "SoftplusBackward0", &[&x], move |g| {
        let bx = mul_scalar(&xs, beta)?;
        let s = sigmoid(&bx)?;
        let linear = gt_scalar(&bx, threshold)?;
        Ok(vec![Some(where_(&linear, g, &mul(g, &s)?)?)])
    }))
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $fname:ident = $op:ident, $kop:ident, $node:literal, |$g:ident|
        a($($ra:ident),*): $ga:expr, b($($rb:ident),*): $gb:expr;)*) => {$(
        $(#[$doc])*
        pub fn $fname(a: &Tensor, b: &Tensor) -> Result<Tensor> {
            let ([a, b], _body) = enter(&names::$op, [a, b])?;
            let out = amp_kernels::binary(BinaryOp::$kop, a.data(), b.data())?;
            let (ra, rb) = (a.requires_grad(), b.requires_grad());
            // Each side's formula declares what it reads; keep that only when the side
            // needs a gradient.
            let read = |name: &str| {
                (ra && [$(stringify!($ra)),*].contains(&name))
                    || (rb && [$(stringify!($rb)),*].contains(&name))
            };
            let (_ka, _kb) = (Kept::new(&a, read("a")), Kept::new(&b, read("b")));
            let _ko = read("out").then(|| SavedOutput::new(&out, 0));
            let (da, db) = (a.dims().to_vec(), b.dims().to_vec());
            Ok(record(out, $node, &[&a, &b], move |$g| {
                let ga = grad_if(ra, || {
                    $(let $ra = bind_read!($ra, {a => _ka, b => _kb}, _ko);)*
                    sum_to(&$ga, &da)
                })?;
                let gb = grad_if(rb, || {
                    $(let $rb = bind_read!($rb, {a => _ka, b => _kb}, _ko);)*
                    sum_to(&$gb, &db)
                })?;
                Ok(vec![ga, gb])
            }))
        }
    )*};
}

binary_ops! {
    /// `a + b` with broadcasting and type promotion.
    add = ADD, Add, "AddBackward0", |g| a(): g.clone(), b(): g.clone();
    /// `a - b`.
    sub = SUB, Sub, "SubBackward0", |g| a(): g.clone(), b(): neg(g)?;
    /// `a * b`.
    mul = MUL, Mul, "MulBackward0", |g| a(b): mul(g, b)?, b(a): mul(g, a)?;
    /// `a / b` (true division).
    div = DIV, Div, "DivBackward0", |g| a(b): div(g, b)?, b(a, b): neg(&div(&mul(g, a)?, &square(b)?)?)?;
    /// `a ** b` (elementwise).
    pow = POW, Pow, "PowBackward1", |g|
        a(a, b): mul(g, &mul(b, &pow(a, &sub_scalar(b, 1.0)?)?)?)?,
        b(a, out): mul(g, &mul(out, &log(a)?)?)?;
    /// `atan2(a, b)`.
    atan2 = ATAN2, Atan2, "Atan2Backward0", |g|
        a(a, b): mul(g, &div(b, &add(&square(a)?, &square(b)?)?)?)?,
        b(a, b): mul(g, &div(&neg(a)?, &add(&square(a)?, &square(b)?)?)?)?;
    /// Elementwise maximum (NaN propagates; ties split the gradient).
    maximum = MAXIMUM, Maximum, "MaximumBackward0", |g|
        a(a, b): mul(g, &tie_weights(a, b, CmpOp::Gt)?.0)?,
        b(a, b): mul(g, &tie_weights(a, b, CmpOp::Gt)?.1)?;
    /// Elementwise minimum.
    minimum = MINIMUM, Minimum, "MinimumBackward0", |g|
        a(a, b): mul(g, &tie_weights(a, b, CmpOp::Lt)?.0)?,
        b(a, b): mul(g, &tie_weights(a, b, CmpOp::Lt)?.1)?;
}

/// Weights 1/0 (0.5 on ties) of each side of maximum/minimum.
fn tie_weights(a: &Tensor, b: &Tensor, cmp: CmpOp) -> Result<(Tensor, Tensor)> {
    let dt = amp_tensor::promote_types(a.dtype(), b.dtype());
    let win = Tensor::from_raw(amp_kernels::compare(cmp, a.data(), b.data())?.to_dtype(dt)?);
    let tie = Tensor::from_raw(amp_kernels::compare(CmpOp::Eq, a.data(), b.data())?.to_dtype(dt)?);
    let half = mul_scalar(&tie, 0.5)?;
    let wa = add(&win, &half)?;
    let wb = rsub_scalar(&wa, 1.0)?;
    Ok((wa, wb))
}

/// `a + alpha * b` (`torch.add(a, b, alpha=alpha)`).
pub fn add_scaled(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    let ([a, b], _body) = enter(&names::ADD, [a, b])?;
    let out = amp_kernels::add_scaled(a.data(), b.data(), alpha)?;
    let (da, db) = (a.dims().to_vec(), b.dims().to_vec());
    let (ra, rb) = (a.requires_grad(), b.requires_grad());
    Ok(record(out, "AddBackward0", &[&a, &b], move |g| {
        Ok(vec![
            grad_if(ra, || sum_to(g, &da))?,
            grad_if(rb, || sum_to(&mul_scalar(g, alpha)?, &db))?,
        ])
    }))
}

/// `a - alpha * b`.
pub fn sub_scaled(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    let ([a, b], _body) = enter(&names::SUB, [a, b])?;
    add_scaled(&a, &b, -alpha)
}

macro_rules! scalar_ops {
    ($($(#[$doc:meta])* $fname:ident = $op:ident, $node:literal, |$x:ident, $s:ident| $fwd:expr, |$g:ident, $ss:ident $(, $r:ident)*| $bw:expr;)*) => {$(
        $(#[$doc])*
        pub fn $fname(x: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
            let s: Scalar = s.into();
            let ([x], _body) = enter(&names::$op, [x])?;
            let out = { let $x = x.data(); let $s = s; $fwd? };
            let _kx = Kept::new(&x, reads!(x in $($r)*));
            let _ko = reads!(out in $($r)*).then(|| SavedOutput::new(&out, 0));
            Ok(record(out, $node, &[&x], move |$g| {
                #[allow(unused_variables)]
                let $ss = s;
                $(let $r = bind_read!($r, {x => _kx}, _ko);)*
                Ok(vec![Some($bw)])
            }))
        }
    )*};
}

scalar_ops! {
    /// `x + s`.
    add_scalar = ADD, "AddBackward1", |x, s| amp_kernels::binary_scalar(BinaryOp::Add, x, s), |g, s| g.clone();
    /// `x - s`.
    sub_scalar = SUB, "SubBackward1", |x, s| amp_kernels::binary_scalar(BinaryOp::Sub, x, s), |g, s| g.clone();
    /// `s - x` (`__rsub__`).
    rsub_scalar = RSUB, "RsubBackward1", |x, s| amp_kernels::scalar_binary(BinaryOp::Sub, s, x), |g, s| neg(g)?;
    /// `x * s`.
    mul_scalar = MUL, "MulBackward1", |x, s| amp_kernels::binary_scalar(BinaryOp::Mul, x, s), |g, s| mul_scalar(g, s)?;
    /// `x / s`.
    div_scalar = DIV, "DivBackward1", |x, s| amp_kernels::binary_scalar(BinaryOp::Div, x, s), |g, s| div_scalar(g, s)?;
    /// `s / x` (`__rdiv__` / `__rtruediv__`).
    rdiv_scalar = DUNDER_RDIV, "DivBackward1", |x, s| amp_kernels::scalar_binary(BinaryOp::Div, s, x), |g, s, x| neg(&div(&mul_scalar(g, s)?, &square(x)?)?)?;
    /// `x ** s` (`__pow__` with a number).
    pow_scalar = POW, "PowBackward0", |x, s| amp_kernels::binary_scalar(BinaryOp::Pow, x, s), |g, s, x| {
        let e = s.to_f64();
        if e == 0.0 { zeros_like(g) } else { mul(g, &mul_scalar(&pow_scalar(x, e - 1.0)?, e)?)? }
    };
    /// `s ** x` (`__rpow__`).
    rpow_scalar = DUNDER_RPOW, "PowBackward2", |x, s| amp_kernels::scalar_binary(BinaryOp::Pow, s, x), |g, s, out| {
        let base = s.to_f64();
        if base == 0.0 { zeros_like(g) } else { mul(g, &mul_scalar(out, base.ln())?)? }
    };
}

/// `s / x` under the name `__rtruediv__` (Python's `2 / x`).
pub fn rtruediv_scalar(x: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
    let ([x], _body) = enter(&names::DUNDER_RTRUEDIV, [x])?;
    rdiv_scalar(&x, s)
}

/// `x ** s` under the name `__pow__`.
pub fn dunder_pow(x: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
    let ([x], _body) = enter(&names::DUNDER_POW, [x])?;
    pow_scalar(&x, s)
}

macro_rules! comparisons {
    ($($(#[$doc:meta])* $fname:ident, $sname:ident, $cop:ident;)*) => {$(
        $(#[$doc])*
        pub fn $fname(a: &Tensor, b: &Tensor) -> Result<Tensor> {
            Ok(Tensor::from_raw(amp_kernels::compare(CmpOp::$cop, a.data(), b.data())?))
        }
        $(#[$doc])*
        pub fn $sname(a: &Tensor, s: impl Into<Scalar>) -> Result<Tensor> {
            Ok(Tensor::from_raw(amp_kernels::compare_scalar(CmpOp::$cop, a.data(), s)?))
        }
    )*};
}

comparisons! {
    /// Elementwise `==` (a bool tensor, not differentiable).
    eq, eq_scalar, Eq;
    /// Elementwise `!=`.
    ne, ne_scalar, Ne;
    /// Elementwise `<`.
    lt, lt_scalar, Lt;
    /// Elementwise `<=`.
    le, le_scalar, Le;
    /// Elementwise `>`.
    gt, gt_scalar, Gt;
    /// Elementwise `>=`.
    ge, ge_scalar, Ge;
}

/// `cond ? a : b` elementwise (cond a bool tensor), broadcasting all three.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ([cond, a, b], _body) = enter(&WHERE, [cond, a, b])?;
    let out = amp_kernels::where_cond(cond.data(), a.data(), b.data())?;
    let (c2, da, db) = (cond.clone(), a.dims().to_vec(), b.dims().to_vec());
    let (ra, rb) = (a.requires_grad(), b.requires_grad());
    Ok(record(out, "WhereBackward0", &[&a, &b], move |g| {
        let z = zeros_like(g);
        Ok(vec![
            grad_if(ra, || sum_to(&where_(&c2, g, &z)?, &da))?,
            grad_if(rb, || sum_to(&where_(&c2, &z, g)?, &db))?,
        ])
    }))
}

/// Clamp into `[min, max]` (either bound optional); gradient passes where unclamped.
pub fn clamp(x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    let ([x], _body) = enter(&CLAMP, [x])?;
    let out = amp_kernels::clamp(x.data(), min, max)?;
    let xs = x.clone();
    Ok(record(out, "ClampBackward1", &[&x], move |g| {
        let mut keep = ones_like(g);
        if let Some(lo) = min {
            keep = mul(&keep, &ge_scalar(&xs, lo)?.to_dtype(g.dtype())?)?;
        }
        if let Some(hi) = max {
            keep = mul(&keep, &le_scalar(&xs, hi)?.to_dtype(g.dtype())?)?;
        }
        Ok(vec![Some(mul(g, &keep)?)])
    }))
}

/// `input + value * t1 * t2`.
pub fn addcmul(input: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    let ([input, t1, t2], _body) = enter(&ADDCMUL, [input, t1, t2])?;
    let [input, t1, t2] = promoted([&input, &t1, &t2])?;
    add(&input, &mul_scalar(&mul(&t1, &t2)?, value)?)
}

/// `input + value * t1 / t2`.
pub fn addcdiv(input: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    let ([input, t1, t2], _body) = enter(&ADDCDIV, [input, t1, t2])?;
    let [input, t1, t2] = promoted([&input, &t1, &t2])?;
    add(&input, &mul_scalar(&div(&t1, &t2)?, value)?)
}

/// Methods mirroring the free functions.
impl Tensor {
    pub fn neg(&self) -> Result<Tensor> {
        neg(self)
    }
    pub fn abs(&self) -> Result<Tensor> {
        abs(self)
    }
    pub fn exp(&self) -> Result<Tensor> {
        exp(self)
    }
    pub fn log(&self) -> Result<Tensor> {
        log(self)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        sqrt(self)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        tanh(self)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        sigmoid(self)
    }
    pub fn relu(&self) -> Result<Tensor> {
        relu(self)
    }
    pub fn square(&self) -> Result<Tensor> {
        square(self)
    }
    pub fn add(&self, o: &Tensor) -> Result<Tensor> {
        add(self, o)
    }
    pub fn sub(&self, o: &Tensor) -> Result<Tensor> {
        sub(self, o)
    }
    pub fn mul(&self, o: &Tensor) -> Result<Tensor> {
        mul(self, o)
    }
    pub fn div(&self, o: &Tensor) -> Result<Tensor> {
        div(self, o)
    }
    pub fn pow(&self, o: &Tensor) -> Result<Tensor> {
        pow(self, o)
    }
    pub fn add_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        add_scalar(self, s)
    }
    pub fn mul_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        mul_scalar(self, s)
    }
    pub fn div_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        div_scalar(self, s)
    }
    pub fn pow_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        pow_scalar(self, s)
    }
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        clamp(self, min, max)
    }
}
