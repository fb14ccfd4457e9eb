//! Grid sampling (`torch.nn.functional.grid_sample`), 2-d and 3-d, bilinear and nearest
//! (and 2-d bicubic, PyTorch's cubic convolution with `A = -0.75` over a 4×4 neighbourhood
//! whose taps are each padded), with zeros / border / reflection padding and both
//! `align_corners` conventions.
//!
//! [`grid_sample_plan`] turns a grid into, per output point, the flat input positions of
//! its corners (`-1` outside) with their weights, plus the source coordinates and their
//! derivatives with respect to the grid; [`grid_sample`] applies a plan to every channel.
//! The autograd op builds its differentiable form from the same plan.

use amp_tensor::pool::{try_filled, try_zeroed};
use amp_tensor::{cast_into, cast_slice, ensure, Error, Result, Tensor};

/// The number of elements of `dims`, saturating: a buffer sized by a count that does not
/// fit fails to allocate ([`Error::OutOfMemory`]) instead of wrapping.
fn count(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}
use num_traits::{One, Zero};

use crate::compute::{with_slice, Real};

named_mode! {
    /// Interpolation mode.
    pub enum GridMode {
        /// (Tri)linear interpolation of the `2^n` corners.
        Bilinear = "bilinear",
        /// The nearest input position (ties to even).
        Nearest = "nearest",
        /// Cubic convolution (`A = -0.75`) of the 4×4 neighbourhood, 4-d inputs only; the
        /// source coordinate is not padded, each tap is.
        Bicubic = "bicubic",
    }
    else |other| -> Error { Error::invalid("grid_sample", format!("nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', but got: '{other}'")) }
}

named_mode! {
    /// What out-of-range coordinates read.
    pub enum GridPadding {
        /// Zero outside the input.
        Zeros = "zeros",
        /// Coordinates clipped to the border.
        Border = "border",
        /// Coordinates reflected at the border, then clipped.
        Reflection = "reflection",
    }
    else |other| -> Error { Error::invalid("grid_sample", format!("nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or 'reflection', but got: '{other}'")) }
}

/// The sampling plan of a grid (see the module docs). `K` is `2^n` (bilinear), 16
/// (bicubic: tap `4·i + j` at row offset `i - 1`, column offset `j - 1`) or 1.
#[derive(Clone, Debug)]
pub struct GridPlan {
    /// int64 `[N, K, out...]`: flat input position of each corner, `-1` outside.
    pub index: Tensor,
    /// `[N, K, out...]` (the compute dtype: f32 or f64): each corner's weight.
    pub weight: Tensor,
    /// `[N, n, out...]`: source coordinate per dim (grid order: x, y, z).
    pub coord: Tensor,
    /// `[N, n, out...]`: derivative of each source coordinate w.r.t. its grid value.
    pub mult: Tensor,
    /// `[N, n, out...]`: the floor of each source coordinate (bilinear, bicubic) or the
    /// rounded one.
    pub base: Tensor,
}

/// PyTorch's bicubic coefficients of the four taps at offsets -1, 0, 1, 2 for the
/// fraction `t` (`get_cubic_upsample_coefficients`, `A = -0.75`).
fn cubic_weights<C: Real>(t: C) -> [C; 4] {
    let c = |v: f64| C::from_f64c(v);
    let a = c(-0.75);
    // |x| <= 1 and 1 < |x| < 2 (PyTorch's cubic_convolution1 / cubic_convolution2).
    let near = |x: C| ((a + c(2.0)) * x - (a + c(3.0))) * x * x + C::one();
    let far = |x: C| ((a * x - c(5.0) * a) * x + c(8.0) * a) * x - c(4.0) * a;
    [
        far(t + C::one()),
        near(t),
        near(C::one() - t),
        far(c(2.0) - t),
    ]
}

/// PyTorch's `reflect_coordinates` with the derivative sign.
fn reflect<C: Real>(x: C, twice_low: i64, twice_high: i64) -> (C, C) {
    if twice_low == twice_high {
        return (C::zero(), C::zero());
    }
    let min = C::from_f64c(twice_low as f64 / 2.0);
    let span = C::from_f64c((twice_high - twice_low) as f64 / 2.0);
    let mut v = x - min;
    let mut sign = C::one();
    if v < C::zero() {
        sign = -C::one();
        v = -v;
    }
    let extra = v % span;
    let flips = (v / span).floor();
    if flips.to_f64c().rem_euclid(2.0) == 0.0 {
        (extra + min, sign)
    } else {
        (span - extra + min, -sign)
    }
}

/// Clip to `[0, size - 1]` with the derivative (0 at and beyond the bounds).
fn clip<C: Real>(x: C, size: usize) -> (C, C) {
    let hi = C::from_f64c(size as f64 - 1.0);
    if x <= C::zero() {
        (C::zero(), C::zero())
    } else if x >= hi {
        (hi, C::zero())
    } else {
        (x, C::one())
    }
}

/// PyTorch's `grid_sampler_unnormalize`: the unpadded source coordinate of grid value `g`
/// along a dim of `size`, and its derivative.
fn unnormalize<C: Real>(g: C, size: usize, align: bool) -> (C, C) {
    let s = C::from_f64c(size as f64);
    let one = C::one();
    let two = one + one;
    if align {
        ((g + one) / two * (s - one), (s - one) / two)
    } else {
        (((g + one) * s - one) / two, s / two)
    }
}

/// The source coordinate of grid value `g` along a dim of `size`, and its derivative.
fn source<C: Real>(g: C, size: usize, padding: GridPadding, align: bool) -> (C, C) {
    let (x, m) = unnormalize(g, size, align);
    pad(x, m, size, padding, align)
}

/// PyTorch's `compute_coordinates`: coordinate `x` (derivative `m`) under `padding`.
fn pad<C: Real>(x: C, m: C, size: usize, padding: GridPadding, align: bool) -> (C, C) {
    let (mut x, mut m) = (x, m);
    match padding {
        GridPadding::Zeros => {}
        GridPadding::Border => {
            let (c, d) = clip(x, size);
            x = c;
            m = m * d;
        }
        GridPadding::Reflection => {
            let (r, d) = if align {
                reflect(x, 0, 2 * (size as i64 - 1))
            } else {
                reflect(x, -1, 2 * size as i64 - 1)
            };
            let (c, d2) = clip(r, size);
            x = c;
            m = m * d * d2;
        }
    }
    (x, m)
}

fn check(input: &[usize], grid: &Tensor) -> Result<(usize, usize, Vec<usize>)> {
    let op = "grid_sample";
    let gd = grid.dims();
    if !(gd.len() == 4 || gd.len() == 5)
        || input.len() != gd.len()
        || gd[gd.len() - 1] != gd.len() - 2
    {
        return Err(Error::invalid(
            op,
            format!("grid_sampler(): expected 4D or 5D input and grid with same number of dimensions, and grid of shape [N, ..., {}], but got input with sizes {input:?} and grid with sizes {gd:?}", gd.len().saturating_sub(2)),
        ));
    }
    ensure!(input[0] == gd[0], invalid(op, "grid_sampler(): expected grid and input to have same batch size, but got input with sizes {input:?} and grid with sizes {gd:?}"));
    ensure!(!input[2..].contains(&0), invalid(op, "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes {input:?}"));
    let n = gd.len() - 2;
    Ok((gd[0], n, gd[1..=n].to_vec()))
}

/// The sampling plan of `grid` (`[N, out..., n]`) over an input of dims `input`
/// (`[N, C, in...]`).
pub fn grid_sample_plan(
    input: &[usize],
    grid: &Tensor,
    mode: GridMode,
    padding: GridPadding,
    align_corners: bool,
) -> Result<GridPlan> {
    let op = "grid_sample";
    crate::ensure_float(op, grid)?;
    let (nb, n, out_sp) = check(input, grid)?;
    ensure!(
        !(mode == GridMode::Bicubic && n != 2),
        invalid(
            op,
            "grid_sampler(): bicubic interpolation only supports 4D input"
        )
    );
    let pts: usize = out_sp.iter().product();
    // Sizes in grid order (x: last input dim).
    let sizes: Vec<usize> = (0..n).map(|d| input[input.len() - 1 - d]).collect();
    let k = match mode {
        GridMode::Bilinear => 1usize << n,
        GridMode::Nearest => 1,
        GridMode::Bicubic => 16,
    };
    let shape = |m: usize| {
        let mut s = vec![nb, m];
        s.extend(&out_sp);
        s
    };
    float_kernel!(grid.dtype(), op, |T, C| {
        let g: Vec<C> = with_slice::<T, _>(grid, |gs| -> Result<Vec<C>> {
            let mut b = try_zeroed::<C>(gs.len())?;
            cast_into(gs, &mut b);
            Ok(b)
        })??;
        let (nkp, nnp) = (count(&[nb, k, pts]), count(&[nb, n, pts]));
        let mut index = try_filled(nkp, -1i64)?;
        let mut weight = try_zeroed::<C>(nkp)?;
        let mut coord = try_zeroed::<C>(nnp)?;
        let mut mult = try_zeroed::<C>(nnp)?;
        let mut base = try_zeroed::<C>(nnp)?;
        for b in 0..nb {
            for p in 0..pts {
                let gp = &g[(b * pts + p) * n..][..n];
                let mut lo = [0i64; 3];
                let mut t = [C::zero(); 3];
                let mut finite = true;
                for d in 0..n {
                    let (x, m) = if mode == GridMode::Bicubic {
                        unnormalize(gp[d], sizes[d], align_corners)
                    } else {
                        source(gp[d], sizes[d], padding, align_corners)
                    };
                    let at = (b * n + d) * pts + p;
                    coord[at] = x;
                    mult[at] = m;
                    if !x.is_finite() {
                        finite = false;
                        base[at] = x;
                        continue;
                    }
                    let f = match mode {
                        GridMode::Bilinear | GridMode::Bicubic => x.floor(),
                        GridMode::Nearest => C::from_f64c(x.to_f64c().round_ties_even()),
                    };
                    base[at] = f;
                    lo[d] = f.to_f64c() as i64;
                    t[d] = x - f;
                }
                if !finite {
                    continue;
                }
                if mode == GridMode::Bicubic {
                    let (cx, cy) = (cubic_weights(t[0]), cubic_weights(t[1]));
                    let (w_in, h_in) = (sizes[0], sizes[1]);
                    for c in 0..16 {
                        let (i, j) = (c / 4, c % 4);
                        // Each tap padded on its own (PyTorch's `get_value_bounded`).
                        let tap = |base: i64, off: usize, size: usize| -> i64 {
                            let v = C::from_f64c((base + off as i64 - 1) as f64);
                            pad(v, C::one(), size, padding, align_corners).0.to_f64c() as i64
                        };
                        let (col, row) = (tap(lo[0], j, w_in), tap(lo[1], i, h_in));
                        let at = (b * k + c) * pts + p;
                        if col >= 0 && row >= 0 && (col as usize) < w_in && (row as usize) < h_in {
                            index[at] = row * w_in as i64 + col;
                        }
                        weight[at] = cy[i] * cx[j];
                    }
                    continue;
                }
                for c in 0..k {
                    let mut flat = 0i64;
                    let mut inside = true;
                    let mut w = C::one();
                    // Flat position: dims from the outermost (z or y) to x.
                    for d in (0..n).rev() {
                        let bit = (c >> d) & 1;
                        let pos = lo[d] + bit as i64;
                        inside &= pos >= 0 && pos < sizes[d] as i64;
                        flat = flat * sizes[d] as i64 + pos;
                        if mode == GridMode::Bilinear {
                            w *= if bit == 1 { t[d] } else { C::one() - t[d] };
                        }
                    }
                    let at = (b * k + c) * pts + p;
                    if inside {
                        index[at] = flat;
                    }
                    weight[at] = w;
                }
            }
        }
        let mk = |v: Vec<C>, m: usize| Tensor::from_vec(v, shape(m));
        Ok(GridPlan {
            index: Tensor::from_vec(index, shape(k))?,
            weight: mk(weight, k)?,
            coord: mk(coord, n)?,
            mult: mk(mult, n)?,
            base: mk(base, n)?,
        })
    })
}

/// `grid_sample(input, grid)`: `input` `[N, C, in...]`, `grid` `[N, out..., n]` with
/// `n` = 2 or 3; the result `[N, C, out...]` has `input`'s dtype (both must match).
pub fn grid_sample(
    input: &Tensor,
    grid: &Tensor,
    mode: GridMode,
    padding: GridPadding,
    align_corners: bool,
) -> Result<Tensor> {
    let op = "grid_sample";
    crate::ensure_float(op, input)?;
    ensure!(input.dtype() == grid.dtype(), invalid(op, "grid_sampler(): expected input and grid to have the same dtype, but input has {} and grid has {}", input.dtype(), grid.dtype()));
    let plan = grid_sample_plan(input.dims(), grid, mode, padding, align_corners)?;
    let (nb, ch) = (input.dims()[0], input.dims()[1]);
    let in_len: usize = input.dims()[2..].iter().product();
    let out_sp = &grid.dims()[1..grid.rank() - 1];
    let pts: usize = out_sp.iter().product();
    let k = plan.index.dims()[1];
    let idx: Vec<i64> = plan.index.host_vec_as()?;
    let mut out_dims = vec![nb, ch];
    out_dims.extend(out_sp);
    float_kernel!(input.dtype(), op, |T, C| {
        let w: Vec<C> = plan.weight.host_vec_as()?;
        with_slice::<T, _>(input, |xs| {
            let mut out = try_zeroed::<C>(count(&[nb, ch, pts]))?;
            if pts > 0 && in_len > 0 {
                amp_tensor::parallel::for_each_chunk_mut(&mut out, pts, &|plane, o| {
                    let b = plane / ch;
                    let mut buf = vec![C::zero(); in_len];
                    cast_into(&xs[plane * in_len..][..in_len], &mut buf);
                    for c in 0..k {
                        let ri = &idx[(b * k + c) * pts..][..pts];
                        let rw = &w[(b * k + c) * pts..][..pts];
                        for ((ov, &i), &wv) in o.iter_mut().zip(ri).zip(rw) {
                            if i >= 0 {
                                *ov += wv * buf[i as usize];
                            }
                        }
                    }
                });
            }
            Tensor::from_vec(cast_slice::<C, T>(&out)?, &out_dims)
        })?
    })
}
