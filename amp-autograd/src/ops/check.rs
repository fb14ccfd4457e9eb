//! Argument checks that PyTorch makes before an op runs, with its messages word for word.
//!
//! Each op calls its check right after it enters the dispatch point (so under autocast the
//! check sees the arguments as the op's body will, as PyTorch's kernels do). The generic
//! checks (`size`, `expand_to`, `floating`) mirror ATen's helpers; the op-specific ones
//! follow the op's ATen implementation in the order its checks run there. The errors suite
//! of the conformance crate (PyTorch-computed refusals) pins every text.

use amp_tensor::{DType, Error as TensorError};

use crate::{Error, Result, Tensor};

/// An error with PyTorch's text word for word.
pub(crate) fn refused(op: &'static str, msg: String) -> Error {
    Error::Tensor(TensorError::refused(op, msg))
}

fn not_implemented(op: &'static str, dtype: DType) -> Error {
    Error::Tensor(TensorError::UnsupportedDType { op, dtype })
}

/// `torch.Size([3, 4])`, as Python prints a shape.
pub(crate) fn torch_size(dims: &[usize]) -> String {
    format!("torch.Size({dims:?})")
}

/// `t.size(dim)` with PyTorch's errors: a 0-dim tensor has no dimensions, and `dim` must
/// be in range.
pub(crate) fn size(t: &Tensor, dim: usize) -> Result<usize> {
    if t.rank() == 0 {
        return Err(refused(
            "size",
            format!("Dimension specified as {dim} but tensor has no dimensions"),
        ));
    }
    t.dims()
        .get(dim)
        .copied()
        .ok_or(Error::Tensor(TensorError::DimOutOfRange {
            dim: dim as i64,
            ndim: t.rank(),
        }))
}

/// That `t` expands to `target` (`Tensor.expand`'s checks and messages).
pub(crate) fn expand_to(t: &Tensor, target: &[usize]) -> Result<()> {
    let dims = t.dims();
    if dims.len() > target.len() {
        return Err(refused(
            "expand",
            format!(
                "expand({}{{{dims:?}}}, size={target:?}): the number of sizes provided ({}) must \
                 be greater or equal to the number of dimensions in the tensor ({})",
                t.dtype().tensor_type_name(),
                target.len(),
                dims.len()
            ),
        ));
    }
    let lead = target.len() - dims.len();
    for (i, &d) in dims.iter().enumerate() {
        let want = target[lead + i];
        if d != 1 && d != want {
            return Err(refused(
                "expand",
                format!(
                    "The expanded size of the tensor ({want}) must match the existing size ({d}) \
                     at non-singleton dimension {}.  Target sizes: {target:?}.  Tensor sizes: \
                     {dims:?}",
                    lead + i
                ),
            ));
        }
    }
    Ok(())
}

/// `expected scalar type {want} but found {t}` unless `t` has dtype `want` (the check of
/// ATen's typed data access).
pub(crate) fn scalar_type(op: &'static str, want: DType, t: &Tensor) -> Result<()> {
    if t.dtype() == want {
        return Ok(());
    }
    Err(refused(
        op,
        format!(
            "expected scalar type {} but found {}",
            want.scalar_type_name(),
            t.dtype().scalar_type_name()
        ),
    ))
}

/// `addbmm(input, batch1, batch2)`.
pub(crate) fn addbmm(input: &Tensor, b1: &Tensor, b2: &Tensor) -> Result<()> {
    expand_to(input, &[size(b1, 1)?, size(b2, 2)?])?;
    for (t, name) in [(b1, "batch1"), (b2, "batch2")] {
        if t.rank() != 3 {
            return Err(refused("addbmm", format!("{name} must be a 3D tensor")));
        }
    }
    let (d1, d2) = (b1.dims(), b2.dims());
    if d1[0] != d2[0] {
        return Err(refused(
            "addbmm",
            format!(
                "batch1 and batch2 must have same number of batches, got {} and {}",
                d1[0], d2[0]
            ),
        ));
    }
    if d1[2] != d2[1] {
        return Err(refused(
            "addbmm",
            format!(
                "Incompatible matrix sizes for bmm ({}x{} and {}x{})",
                d1[1], d1[2], d2[1], d2[2]
            ),
        ));
    }
    let pair = |a: &str, x: DType, y: DType| {
        refused(
            "addbmm",
            format!(
                "{a} and mat2 must have the same dtype, but got {} and {}",
                x.scalar_type_name(),
                y.scalar_type_name()
            ),
        )
    };
    if input.dtype() != b2.dtype() {
        return Err(pair("self", input.dtype(), b2.dtype()));
    }
    if b1.dtype() != b2.dtype() {
        return Err(pair("mat1", b1.dtype(), b2.dtype()));
    }
    Ok(())
}

/// `baddbmm(input, batch1, batch2)`.
pub(crate) fn baddbmm(input: &Tensor, b1: &Tensor, b2: &Tensor) -> Result<()> {
    expand_to(input, &[size(b1, 0)?, size(b1, 1)?, size(b2, 2)?])?;
    if input.dtype() != b1.dtype() {
        return Err(refused(
            "baddbmm",
            format!(
                "Input dtypes must be the same, got: input {}, batch1: {}, batch2: {}",
                input.dtype().cpp_type_name(),
                b1.dtype().cpp_type_name(),
                b2.dtype().cpp_type_name()
            ),
        ));
    }
    for (t, name) in [(b1, "batch1"), (b2, "batch2")] {
        if t.rank() != 3 {
            return Err(refused("baddbmm", format!("{name} must be a 3D tensor")));
        }
    }
    let (d1, d2) = (b1.dims(), b2.dims());
    if d2[0] != d1[0] || d2[1] != d1[2] {
        return Err(refused(
            "baddbmm",
            format!(
                "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: \
                 [{}, {}].",
                d1[0], d1[2], d2[0], d2[1]
            ),
        ));
    }
    scalar_type("baddbmm", b1.dtype(), b2)
}

/// `addmv(input, mat, vec)`.
pub(crate) fn addmv(input: &Tensor, mat: &Tensor, vec: &Tensor) -> Result<()> {
    let dt = [input.dtype(), mat.dtype(), vec.dtype()];
    if dt[0] != dt[1] || dt[1] != dt[2] {
        return Err(refused(
            "addmv",
            format!(
                "addmv input tensors must have the same dtype, but got {}, {}, and {}",
                dt[0].scalar_type_name(),
                dt[1].scalar_type_name(),
                dt[2].scalar_type_name()
            ),
        ));
    }
    if mat.rank() != 2 || vec.rank() != 1 || input.rank() > 1 {
        return Err(refused(
            "addmv",
            format!(
                "vector + matrix @ vector expected, got {}, {}, {}",
                input.rank(),
                mat.rank(),
                vec.rank()
            ),
        ));
    }
    let (m, v) = (mat.dims(), vec.dims());
    let n = input.dims().iter().product::<usize>();
    if m[1] != v[0] || (m[0] != n && n != 1) {
        return Err(refused(
            "addmv",
            format!(
                "size mismatch, got input ({}), mat ({}x{}), vec ({})",
                input.dims().first().copied().unwrap_or(1),
                m[0],
                m[1],
                v[0]
            ),
        ));
    }
    Ok(())
}

/// `addr(input, vec1, vec2)`.
pub(crate) fn addr(input: &Tensor, v1: &Tensor, v2: &Tensor) -> Result<()> {
    for (t, name) in [(v1, "vec1"), (v2, "vec2")] {
        if t.rank() != 1 {
            return Err(refused(
                "addr",
                format!("addr: Expected 1-D argument {name}, but got {}-D", t.rank()),
            ));
        }
    }
    expand_to(input, &[v1.dims()[0], v2.dims()[0]])
}

/// `prelu(input, weight)`: no type promotion.
pub(crate) fn prelu(x: &Tensor, w: &Tensor) -> Result<()> {
    if x.dtype() == w.dtype() {
        return Ok(());
    }
    Err(refused(
        "prelu",
        format!(
            "prelu: Type promoting not supported. Got {} and {}",
            x.dtype().scalar_type_name(),
            w.dtype().scalar_type_name()
        ),
    ))
}

/// `bilinear(input1, input2, weight, bias)`: one dtype for all.
pub(crate) fn bilinear(x1: &Tensor, x2: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    let d = x1.dtype();
    if x2.dtype() == d && w.dtype() == d && bias.is_none_or(|b| b.dtype() == d) {
        return Ok(());
    }
    let bias = bias.map_or(String::new(), |b| {
        format!(", bias: {}", b.dtype().cpp_type_name())
    });
    Err(refused(
        "bilinear",
        format!(
            "All tensors must have the same dtype, got input1: {}, input2: {}, weight: {}{bias}",
            d.cpp_type_name(),
            x2.dtype().cpp_type_name(),
            w.dtype().cpp_type_name()
        ),
    ))
}

/// The parameters of `layer_norm` / `group_norm` on the CPU: the input's dtype, or float32
/// beside a 16-bit input (ATen's "mixed dtype" rule, `check_mixed_data_type`).
pub(crate) fn norm_parameters(
    op: &'static str,
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<()> {
    let params = [weight, bias];
    let first = params.iter().flatten().next().map(|p| p.dtype());
    if first.is_some_and(|d| d != x.dtype()) {
        if params.iter().flatten().any(|p| p.dtype() != DType::F32) {
            return Err(refused(
                op,
                "mixed dtype (CPU): expect parameter to have scalar type of Float".into(),
            ));
        }
        if !x.dtype().is_reduced_float() {
            return Err(refused(
                op,
                "mixed dtype (CPU): all inputs must share same datatype.".into(),
            ));
        }
        return Ok(());
    }
    params
        .into_iter()
        .flatten()
        .try_for_each(|p| scalar_type(op, x.dtype(), p))
}

/// `cdist(x1, x2)`: floating point, one dtype, and no 16-bit kernel on the CPU.
pub(crate) fn cdist(x1: &Tensor, x2: &Tensor) -> Result<()> {
    for (t, name) in [(x1, "X1"), (x2, "X2")] {
        if !t.dtype().is_floating_point() {
            return Err(refused(
                "cdist",
                format!(
                    "cdist only supports floating-point dtypes, {name} got: {}",
                    t.dtype().scalar_type_name()
                ),
            ));
        }
    }
    if x1.dtype().is_reduced_float() {
        return Err(not_implemented("cdist", x1.dtype()));
    }
    scalar_type("cdist", x1.dtype(), x2)
}

/// An op whose CPU kernel has no 16-bit (or integer) instantiation in PyTorch: `kernel` is
/// the name its message gives (`pdist`, `avg_pool3d_out_frame`).
pub(crate) fn float32_or_64(kernel: &'static str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::F32 | DType::F64 => Ok(()),
        d => Err(not_implemented(kernel, d)),
    }
}

/// An op whose CPU kernel takes every floating dtype: `kernel` is the name its message
/// gives.
pub(crate) fn floating(kernel: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_floating_point() {
        Ok(())
    } else {
        Err(not_implemented(kernel, t.dtype()))
    }
}

/// `nll_loss` / `cross_entropy`'s Python-level checks: a 1-D or higher input whose batch
/// matches the target's.
pub(crate) fn nll_batch(input: &Tensor, target: &Tensor) -> Result<()> {
    if input.rank() < 1 {
        return Err(refused(
            "nll_loss",
            format!("Expected 1 or more dimensions (got {})", input.rank()),
        ));
    }
    let (n, t) = (input.dims()[0], target.dims().first().copied().unwrap_or(1));
    if input.rank() >= 2 && target.rank() >= 1 && n != t {
        return Err(refused(
            "nll_loss",
            format!("Expected input batch_size ({n}) to match target batch_size ({t})."),
        ));
    }
    Ok(())
}

/// `binary_cross_entropy(input, target)`: one shape, one dtype.
pub(crate) fn binary_cross_entropy(input: &Tensor, target: &Tensor) -> Result<()> {
    if input.dims() != target.dims() {
        return Err(refused(
            "binary_cross_entropy",
            format!(
                "Using a target size ({}) that is different to the input size ({}) is \
                 deprecated. Please ensure they have the same size.",
                torch_size(target.dims()),
                torch_size(input.dims())
            ),
        ));
    }
    if input.dtype() != target.dtype() {
        return Err(refused(
            "binary_cross_entropy",
            format!(
                "Found dtype {} but expected {}",
                target.dtype().scalar_type_name(),
                input.dtype().scalar_type_name()
            ),
        ));
    }
    Ok(())
}

/// `binary_cross_entropy`'s kernel check: every input element in `[0, 1]` (NaN is not).
pub(crate) fn probabilities(x: &Tensor) -> Result<()> {
    if x.elem_count() == 0 || !x.dtype().is_floating_point() {
        return Ok(());
    }
    let lo = amp_kernels::min_all(x.data())?.item_f64()?;
    let hi = amp_kernels::max_all(x.data())?.item_f64()?;
    if lo >= 0.0 && hi <= 1.0 {
        return Ok(());
    }
    Err(refused(
        "binary_cross_entropy",
        "all elements of input should be between 0 and 1".into(),
    ))
}

/// `binary_cross_entropy_with_logits(input, target)`: one shape, floating input, and a
/// target whose dtype the floating result can be written to.
pub(crate) fn bce_with_logits(input: &Tensor, target: &Tensor) -> Result<()> {
    if input.dims() != target.dims() {
        return Err(refused(
            "binary_cross_entropy_with_logits",
            format!(
                "Target size ({}) must be the same as input size ({})",
                torch_size(target.dims()),
                torch_size(input.dims())
            ),
        ));
    }
    floating("log_sigmoid_cpu", input)?;
    cast_result("binary_cross_entropy_with_logits", input.dtype(), target)
}

/// `result type {r} can't be cast to the desired output type {t}`: a floating result
/// written into an integer (or bool) tensor.
pub(crate) fn cast_result(op: &'static str, result: DType, t: &Tensor) -> Result<()> {
    if t.dtype().is_floating_point() || !result.is_floating_point() {
        return Ok(());
    }
    Err(refused(
        op,
        format!(
            "result type {} can't be cast to the desired output type {}",
            result.scalar_type_name(),
            t.dtype().scalar_type_name()
        ),
    ))
}

/// `kl_div(input, target)`: floating inputs only.
pub(crate) fn kl_div(input: &Tensor, target: &Tensor) -> Result<()> {
    if input.dtype().is_floating_point() && target.dtype().is_floating_point() {
        return Ok(());
    }
    Err(refused(
        "kl_div",
        "kl_div: Integral inputs not supported.".into(),
    ))
}

/// The `mean()` of a non-floating tensor (a loss reduced by its mean).
pub(crate) fn mean_dtype(t: &Tensor) -> Result<()> {
    if t.dtype().is_floating_point() {
        return Ok(());
    }
    Err(refused(
        "mean",
        format!(
            "mean(): could not infer output dtype. Input dtype must be either a floating point \
             or complex dtype. Got: {}",
            t.dtype().scalar_type_name()
        ),
    ))
}

/// `margin_ranking_loss(input1, input2, target)`: three tensors of one rank.
pub(crate) fn margin_ranking_loss(x1: &Tensor, x2: &Tensor, target: &Tensor) -> Result<()> {
    if x1.rank() == x2.rank() && x2.rank() == target.rank() {
        return Ok(());
    }
    Err(refused(
        "margin_ranking_loss",
        format!(
            "margin_ranking_loss : All input tensors should have same dimension but got sizes: \
             input1: {}, input2: {}, target: {} ",
            torch_size(x1.dims()),
            torch_size(x2.dims()),
            torch_size(target.dims())
        ),
    ))
}

/// `soft_margin_loss(input, target)`: `log(1 + exp(-target * input))` is written into a
/// tensor of the input's shape and dtype.
pub(crate) fn soft_margin_loss(input: &Tensor, target: &Tensor) -> Result<()> {
    if input.dtype() == DType::Bool {
        return Err(refused(
            "soft_margin_loss",
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to \
             invert a mask, use the `~` or `logical_not()` operator instead."
                .into(),
        ));
    }
    if let Ok(shape) = amp_tensor::broadcast_shapes("soft_margin_loss", input.dims(), target.dims())
    {
        if shape != input.dims() {
            return Err(refused(
                "soft_margin_loss",
                format!(
                    "output with shape {:?} doesn't match the broadcast shape {shape:?}",
                    input.dims()
                ),
            ));
        }
    }
    let result = amp_tensor::promote_types(input.dtype(), target.dtype());
    cast_result("soft_margin_loss", result, input)
}

/// `cross(input, other)`: no bool kernel, no type promotion.
pub(crate) fn cross(input: &Tensor, other: &Tensor) -> Result<()> {
    if input.dtype() == DType::Bool {
        return Err(not_implemented("cross", DType::Bool));
    }
    scalar_type("linalg_cross", input.dtype(), other)
}
