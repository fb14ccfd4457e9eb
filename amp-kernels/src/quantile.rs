//! `quantile` / `nanquantile` over the rows of a matrix, and
//! `fake_quantize_per_tensor_affine`.
//!
//! Quantiles follow PyTorch: each row is sorted (NaN last), the rank of `q` is
//! `q * (count - 1)` computed in the input's type (`count` excludes NaNs for
//! `nanquantile`; a row with a NaN gives NaN for `quantile`), and the two order
//! statistics around the rank are combined by the interpolation mode. The kernel also
//! returns where each result came from (the two source columns and the weight of the
//! upper one) so the backward can route gradients without sorting again.

use amp_tensor::pool::try_with_capacity;
use amp_tensor::{ensure, DType, Error, Result, Tensor};

use crate::compute::Real;

named_mode! {
    /// How a quantile between two order statistics is computed.
    pub enum QuantileInterpolation {
        /// `below + (above - below) * frac`.
        Linear = "linear",
        /// The order statistic below.
        Lower = "lower",
        /// The order statistic above.
        Higher = "higher",
        /// The mean of the two.
        Midpoint = "midpoint",
        /// The nearer one (ties to the even rank).
        Nearest = "nearest",
    }
    else |other| -> Error { Error::invalid("quantile", format!("interpolation must be one of linear, lower, higher, midpoint or nearest. Got {other}")) }
}

/// The quantiles of each row of a `[rows, n]` tensor.
#[derive(Debug, Clone)]
pub struct QuantileRows {
    /// `[rows, nq]` values, the input's dtype.
    pub values: Tensor,
    /// `[rows, nq]` int64: the column of the order statistic below.
    pub lo: Tensor,
    /// `[rows, nq]` int64: the column of the order statistic above.
    pub hi: Tensor,
    /// `[rows, nq]` weight of the upper statistic (the input's dtype): the gradient goes
    /// `1 - weight` to `lo` and `weight` to `hi`.
    pub weight: Tensor,
}

/// PyTorch's CPU `lerp`.
fn lerp<C: Real>(a: C, b: C, w: C) -> C {
    let half = C::from_f64c(0.5);
    if w.abs() < half {
        a + w * (b - a)
    } else {
        b - (b - a) * (C::one() - w)
    }
}

/// Quantiles `q` (each in `[0, 1]`) of every row of the 2-D `x` (float32 or float64),
/// ignoring NaNs with `ignore_nan` (`nanquantile`).
pub fn quantile_rows(
    x: &Tensor,
    q: &[f64],
    interpolation: QuantileInterpolation,
    ignore_nan: bool,
) -> Result<QuantileRows> {
    const OP: &str = "quantile";
    ensure!(x.rank() == 2, invalid(OP, "expected a 2-D tensor of rows"));
    if let Some(bad) = q.iter().find(|v| !(0.0..=1.0).contains(*v)) {
        return Err(Error::invalid(
            OP,
            format!("quantile() q values must be in the range [0, 1] but got {bad}"),
        ));
    }
    let (rows, n) = (x.dims()[0], x.dims()[1]);
    ensure!(
        n != 0,
        invalid(OP, "quantile() input tensor must be non-empty")
    );
    match x.dtype() {
        DType::F32 => rows_impl::<f32>(x, q, interpolation, ignore_nan, rows, n),
        DType::F64 => rows_impl::<f64>(x, q, interpolation, ignore_nan, rows, n),
        _ => Err(Error::invalid(
            OP,
            format!(
                "quantile() input tensor must be either float or double dtype, but got {}",
                x.dtype()
            ),
        )),
    }
}

fn rows_impl<C: Real>(
    x: &Tensor,
    q: &[f64],
    interpolation: QuantileInterpolation,
    ignore_nan: bool,
    rows: usize,
    n: usize,
) -> Result<QuantileRows> {
    let data = x.try_contiguous()?.host_vec::<C>()?;
    let nq = q.len();
    let one_row = |r: usize| -> Vec<(C, i64, i64, C)> {
        let row = &data[r * n..(r + 1) * n];
        let mut order: Vec<usize> = (0..n).collect();
        // NaN sorts last; equal values keep their order.
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                _ => x.partial_cmp(&y).expect("not NaN"),
            }
        });
        let valid = row.iter().filter(|v| !v.is_nan()).count();
        let has_nan = valid < n;
        q.iter()
            .map(|&qv| {
                let qc = C::from_f64c(qv);
                let mut rank = if ignore_nan {
                    qc * (C::from_f64c(valid as f64) - C::one())
                } else if has_nan {
                    C::from_f64c((n - 1) as f64)
                } else {
                    qc * C::from_f64c((n - 1) as f64)
                };
                match interpolation {
                    QuantileInterpolation::Lower => rank = rank.floor(),
                    QuantileInterpolation::Higher => rank = rank.ceil(),
                    QuantileInterpolation::Nearest => {
                        // Round half to even, as torch.round.
                        let r = rank.round();
                        rank = if (rank - rank.trunc()).abs() == C::from_f64c(0.5) {
                            C::from_f64c(2.0) * (rank / C::from_f64c(2.0)).round()
                        } else {
                            r
                        };
                    }
                    _ => {}
                }
                // Truncation toward zero, as `toType(kLong)`; clamp into the row.
                let below = (rank.to_f64c().trunc().max(0.0) as usize).min(n - 1);
                let lo = order[below];
                match interpolation {
                    QuantileInterpolation::Linear | QuantileInterpolation::Midpoint => {
                        let above = (rank.ceil().to_f64c().max(0.0) as usize).min(n - 1);
                        let hi = order[above];
                        let w = if interpolation == QuantileInterpolation::Midpoint {
                            C::from_f64c(0.5)
                        } else {
                            rank - C::from_f64c(below as f64)
                        };
                        (lerp(row[lo], row[hi], w), lo as i64, hi as i64, w)
                    }
                    _ => (row[lo], lo as i64, lo as i64, C::zero()),
                }
            })
            .collect()
    };
    let mut per: Vec<Vec<(C, i64, i64, C)>> = try_with_capacity(rows)?;
    if rows > 1 && rows * n >= 1 << 15 {
        per.extend(amp_tensor::parallel::map(rows, &one_row));
    } else {
        per.extend((0..rows).map(one_row));
    }
    let len = rows.saturating_mul(nq);
    let mut vals = try_with_capacity(len)?;
    let mut los = try_with_capacity(len)?;
    let mut his = try_with_capacity(len)?;
    let mut ws = try_with_capacity(len)?;
    for (v, lo, hi, w) in per.into_iter().flatten() {
        vals.push(v);
        los.push(lo);
        his.push(hi);
        ws.push(w);
    }
    Ok(QuantileRows {
        values: Tensor::from_vec(vals, [rows, nq])?,
        lo: Tensor::from_vec(los, [rows, nq])?,
        hi: Tensor::from_vec(his, [rows, nq])?,
        weight: Tensor::from_vec(ws, [rows, nq])?,
    })
}

/// `fake_quantize_per_tensor_affine`: `(clamp(round(x / scale) + zero_point, quant_min,
/// quant_max) - zero_point) * scale` (round half to even, `1 / scale` in float32), and the
/// mask (`bool`) of the elements whose unclamped quantized value lies within
/// `[quant_min, quant_max]`, where the straight-through gradient passes.
pub fn fake_quantize_per_tensor_affine(
    x: &Tensor,
    scale: f64,
    zero_point: i64,
    quant_min: i64,
    quant_max: i64,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "fake_quantize_per_tensor_affine";
    ensure!(
        quant_min <= quant_max,
        invalid(
            OP,
            "`quant_min` should be less than or equal to `quant_max`."
        )
    );
    ensure!(
        !(zero_point < quant_min || zero_point > quant_max),
        invalid(
            OP,
            "`zero_point` must be between `quant_min` and `quant_max`."
        )
    );
    fn run<C: Real>(
        x: &Tensor,
        scale: f64,
        zp: i64,
        qmin: i64,
        qmax: i64,
    ) -> Result<(Vec<C>, Vec<bool>)> {
        let xs = x.host_vec_as::<C>()?;
        let sc = scale as f32;
        let inv = C::from_f64c((1.0f32 / sc) as f64);
        let (lo, hi) = (qmin as f64, qmax as f64);
        let zf = zp as f64;
        let mut out = (try_with_capacity(xs.len())?, try_with_capacity(xs.len())?);
        out.extend(xs.iter().map(|&v| {
            let p = v * inv;
            // nearbyint: round half to even.
            let r = p.round();
            let r = if (p - p.trunc()).abs() == C::from_f64c(0.5) {
                C::from_f64c(2.0) * (p / C::from_f64c(2.0)).round()
            } else {
                r
            };
            let qf = zf + r.to_f64c();
            let qv = qf.max(lo).min(hi) as i64;
            let out = C::from_f64c((qv - zp) as f64) * C::from_f64c(sc as f64);
            (out, qf >= lo && qf <= hi)
        }));
        Ok(out)
    }
    let dims = x.dims().to_vec();
    let (out, mask) = match x.dtype() {
        DType::F64 => {
            let (o, m) = run::<f64>(x, scale, zero_point, quant_min, quant_max)?;
            (Tensor::from_vec(o, dims.clone())?, m)
        }
        d if d.is_floating_point() => {
            let (o, m) = run::<f32>(x, scale, zero_point, quant_min, quant_max)?;
            (Tensor::from_vec(o, dims.clone())?.to_dtype(d)?, m)
        }
        d => return Err(Error::UnsupportedDType { op: OP, dtype: d }),
    };
    Ok((out, Tensor::from_vec(mask, dims)?))
}
