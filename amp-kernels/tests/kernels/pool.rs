//! Pooling, padding and grid-sampling kernels against direct reference loops in f64.

use amp_kernels::{
    adaptive_windows, avg_pool_windows, avg_pool_windows_backward, grid_sample, max_pool_windows,
    pad, pad_backward, plane_gather, plane_scatter, GridMode, GridPadding, PadMode, PoolParams,
};
use amp_tensor::{DType, Generator, Tensor};
use proptest::prelude::*;

fn randn(dims: &[usize], seed: u64) -> Tensor {
    Tensor::randn(dims.to_vec(), DType::F64, &mut Generator::new(seed)).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()) || (x.is_nan() && y.is_nan()),
            "element {i}: {x} vs {y}"
        );
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `<A x, g> == <x, Aᵀ g>` within `tol`: `ax` is `A x`, `atg` the backward's `Aᵀ g`.
fn assert_adjoint(ax: &Tensor, g: &Tensor, x: &[f64], atg: &Tensor, tol: f64) {
    let lhs = dot(&ax.to_vec_f64(), &g.to_vec_f64());
    let rhs = dot(x, &atg.to_vec_f64());
    assert!((lhs - rhs).abs() < tol, "{lhs} vs {rhs}");
}

/// PyTorch's output-size rule, written out.
fn out_size(i: i64, k: i64, s: i64, p: i64, d: i64, ceil: bool) -> i64 {
    let eff = d * (k - 1) + 1;
    let mut o = if ceil {
        (i + 2 * p - eff + s - 1) / s + 1
    } else {
        (i + 2 * p - eff) / s + 1
    };
    if ceil && (o - 1) * s >= i + p {
        o -= 1;
    }
    o
}

/// The 2-d window of `pp` in the references' integer arithmetic: kernel, stride,
/// padding and dilation, and the ceil mode.
fn window2(pp: &PoolParams) -> ([[i64; 2]; 4], bool) {
    let int2 = |v: &Vec<usize>| [v[0] as i64, v[1] as i64];
    let (k, s, p, d) = (&pp.kernel, &pp.stride, &pp.padding, &pp.dilation);
    ([int2(k), int2(s), int2(p), int2(d)], pp.ceil_mode)
}

/// Direct max_pool2d of `planes` planes of `h` x `w`: (values, flat indices).
fn ref_max_pool2d(
    x: &[f64],
    [planes, h, w]: [usize; 3],
    pp: &PoolParams,
) -> (Vec<f64>, Vec<i64>, [usize; 2]) {
    let ([k, s, p, d], ceil) = window2(pp);
    let oh = out_size(h as i64, k[0], s[0], p[0], d[0], ceil);
    let ow = out_size(w as i64, k[1], s[1], p[1], d[1], ceil);
    let (mut v, mut ix) = (vec![], vec![]);
    for pl in 0..planes {
        for i in 0..oh {
            for j in 0..ow {
                let mut best = f64::NEG_INFINITY;
                let mut at = -1i64;
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        let r = i * s[0] - p[0] + a * d[0];
                        let c = j * s[1] - p[1] + b * d[1];
                        if r < 0 || c < 0 || r >= h as i64 || c >= w as i64 {
                            continue;
                        }
                        let val = x[pl * h * w + (r as usize) * w + c as usize];
                        if at < 0 || val > best || val.is_nan() {
                            best = val;
                            at = r * w as i64 + c;
                        }
                    }
                }
                v.push(best);
                ix.push(at);
            }
        }
    }
    (v, ix, [oh as usize, ow as usize])
}

/// Direct avg_pool2d of `planes` planes of `h` x `w` (the dilation is 1).
fn ref_avg_pool2d(
    x: &[f64],
    [planes, h, w]: [usize; 3],
    pp: &PoolParams,
    include_pad: bool,
    div: Option<f64>,
) -> Vec<f64> {
    let ([k, s, p, _], ceil) = window2(pp);
    let oh = out_size(h as i64, k[0], s[0], p[0], 1, ceil);
    let ow = out_size(w as i64, k[1], s[1], p[1], 1, ceil);
    let mut v = vec![];
    for pl in 0..planes {
        for i in 0..oh {
            for j in 0..ow {
                let (r0, c0) = (i * s[0] - p[0], j * s[1] - p[1]);
                let (r1, c1) = (
                    (r0 + k[0]).min(h as i64 + p[0]),
                    (c0 + k[1]).min(w as i64 + p[1]),
                );
                let pool = ((r1 - r0) * (c1 - c0)) as f64;
                let (mut sum, mut n) = (0.0, 0.0);
                for r in r0.max(0)..r1.min(h as i64) {
                    for c in c0.max(0)..c1.min(w as i64) {
                        sum += x[pl * h * w + r as usize * w + c as usize];
                        n += 1.0;
                    }
                }
                v.push(sum / div.unwrap_or(if include_pad { pool } else { n }));
            }
        }
    }
    v
}

fn params2(k: [usize; 2], s: [usize; 2], p: [usize; 2], d: [usize; 2], ceil: bool) -> PoolParams {
    PoolParams {
        kernel: k.to_vec(),
        stride: s.to_vec(),
        padding: p.to_vec(),
        dilation: d.to_vec(),
        ceil_mode: ceil,
    }
}

#[test]
fn max_pool2d_matches_reference_with_padding_dilation_ceil() {
    let x = randn(&[2, 3, 7, 6], 1);
    let xv = x.to_vec_f64();
    for (k, s, p, d, ceil) in [
        ([2, 2], [2, 2], [0, 0], [1, 1], false),
        ([3, 2], [2, 1], [1, 1], [1, 2], true),
        ([3, 3], [3, 2], [1, 0], [2, 1], true),
        ([2, 3], [1, 3], [1, 1], [1, 1], false),
    ] {
        let pp = params2(k, s, p, d, ceil);
        let geo = pp.windows("max_pool2d", &[7, 6], None).unwrap();
        let (v, i) = max_pool_windows("max_pool2d", &x, &[geo]).unwrap();
        let (rv, ri, os) = ref_max_pool2d(&xv, [6, 7, 6], &pp);
        assert_eq!(v.dims(), &[2, 3, os[0], os[1]]);
        close(&v.to_vec_f64(), &rv, 0.0);
        assert_eq!(i.to_vec::<i64>().unwrap(), ri);
    }
}

#[test]
fn max_pool_propagates_nan_and_rejects_big_padding() {
    let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 2.0], [1, 1, 4]).unwrap();
    let pp = PoolParams {
        kernel: vec![2],
        stride: vec![2],
        padding: vec![0],
        dilation: vec![1],
        ceil_mode: false,
    };
    let geo = pp.windows("max_pool1d", &[4], None).unwrap();
    let (v, i) = max_pool_windows("max_pool1d", &x, &[geo]).unwrap();
    let v = v.to_vec_f64();
    assert!(v[0].is_nan());
    assert_eq!(v[1], 3.0);
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 2]);
    let bad = PoolParams {
        padding: vec![2],
        ..pp
    };
    assert!(bad.windows("max_pool1d", &[4], None).is_err());
}

#[test]
fn avg_pool2d_matches_reference_and_backward_is_adjoint() {
    let x = randn(&[1, 2, 6, 5], 2);
    let xv = x.to_vec_f64();
    for (k, s, p, ceil, inc, div) in [
        ([2, 2], [2, 2], [0, 0], false, true, None),
        ([3, 3], [2, 2], [1, 1], true, true, None),
        ([3, 2], [2, 1], [1, 1], true, false, None),
        ([2, 3], [1, 2], [1, 0], false, true, Some(5.0)),
    ] {
        let pp = params2(k, s, p, [1, 1], ceil);
        let geo = pp.windows("avg_pool2d", &[6, 5], Some(inc)).unwrap();
        let out = avg_pool_windows("avg_pool2d", &x, &geo, div).unwrap();
        let r = ref_avg_pool2d(&xv, [2, 6, 5], &pp, inc, div);
        close(&out.to_vec_f64(), &r, 1e-12);
        // <A x, g> == <x, A^T g>.
        let g = randn(out.dims(), 9);
        let at = avg_pool_windows_backward("avg_pool2d", &g, &[6, 5], &geo, div).unwrap();
        assert_adjoint(&out, &g, &xv, &at, 1e-10);
    }
}

#[test]
fn adaptive_avg_pool3d_matches_reference() {
    let (d, h, w) = (5, 4, 7);
    let x = randn(&[2, d, h, w], 3);
    let xv = x.to_vec_f64();
    let os = [3, 2, 4];
    let geo: Vec<_> = [d, h, w]
        .iter()
        .zip(os)
        .map(|(&i, o)| adaptive_windows(i, o).unwrap())
        .collect();
    let out = avg_pool_windows("adaptive_avg_pool3d", &x, &geo, None).unwrap();
    assert_eq!(out.dims(), &[2, 3, 2, 4]);
    let mut r = vec![];
    let lim = |o: usize, i: usize, n: usize| ((o * i) / n, ((o + 1) * i).div_ceil(n));
    for pl in 0..2 {
        for a in 0..os[0] {
            for b in 0..os[1] {
                for c in 0..os[2] {
                    let (a0, a1) = lim(a, d, os[0]);
                    let (b0, b1) = lim(b, h, os[1]);
                    let (c0, c1) = lim(c, w, os[2]);
                    let mut s = 0.0;
                    for i in a0..a1 {
                        for j in b0..b1 {
                            for k in c0..c1 {
                                s += xv[((pl * d + i) * h + j) * w + k];
                            }
                        }
                    }
                    r.push(s / ((a1 - a0) * (b1 - b0) * (c1 - c0)) as f64);
                }
            }
        }
    }
    close(&out.to_vec_f64(), &r, 1e-12);
}

fn ref_pad1(i: i64, n: i64, mode: PadMode) -> Option<i64> {
    match mode {
        PadMode::Constant => (0..n).contains(&i).then_some(i),
        PadMode::Replicate => Some(i.max(0).min(n - 1)),
        PadMode::Reflect => {
            let mut j = i;
            while j < 0 || j >= n {
                if j < 0 {
                    j = -j;
                }
                if j >= n {
                    j = 2 * (n - 1) - j;
                }
            }
            Some(j)
        }
        PadMode::Circular => Some(((i % n) + n) % n),
    }
}

#[test]
fn pad2d_matches_reference_for_every_mode() {
    let (h, w) = (4, 5);
    let x = randn(&[2, h, w], 4);
    let xv = x.to_vec_f64();
    for mode in [
        PadMode::Constant,
        PadMode::Reflect,
        PadMode::Replicate,
        PadMode::Circular,
    ] {
        let pads = [(1i64, 2i64), (3, -1)];
        let out = pad(&x, &pads, mode, 0.5).unwrap();
        let (oh, ow) = (h as i64 + 3, w as i64 + 2);
        assert_eq!(out.dims(), &[2, oh as usize, ow as usize]);
        let mut r = vec![];
        for pl in 0..2 {
            for i in 0..oh {
                for j in 0..ow {
                    let si = ref_pad1(i - 1, h as i64, mode);
                    let sj = ref_pad1(j - 3, w as i64, mode);
                    r.push(match (si, sj) {
                        (Some(a), Some(b)) => xv[pl * h * w + a as usize * w + b as usize],
                        _ => 0.5,
                    });
                }
            }
        }
        close(&out.to_vec_f64(), &r, 0.0);
        // The backward is the adjoint of the (value-free) pad.
        let g = randn(out.dims(), 5);
        let gi = pad_backward(&g, &[h, w], &pads, mode).unwrap();
        let out0 = pad(&x, &pads, mode, 0.0).unwrap();
        assert_adjoint(&out0, &g, &xv, &gi, 1e-10);
    }
    assert!(pad(&x, &[(0, 0), (5, 0)], PadMode::Reflect, 0.0).is_err());
}

/// PyTorch's grid_sampler_2d for one point, written out.
#[allow(clippy::too_many_arguments)]
fn ref_grid_point(
    plane: &[f64],
    h: usize,
    w: usize,
    gx: f64,
    gy: f64,
    mode: GridMode,
    pad_mode: GridPadding,
    align: bool,
) -> f64 {
    let unnorm = |g: f64, size: usize| -> f64 {
        let s = size as f64;
        if align {
            (g + 1.0) / 2.0 * (s - 1.0)
        } else {
            ((g + 1.0) * s - 1.0) / 2.0
        }
    };
    let padded = |c: f64, size: usize| -> f64 {
        let s = size as f64;
        let mut c = c;
        let clip = |c: f64| c.max(0.0).min(s - 1.0);
        match pad_mode {
            GridPadding::Zeros => {}
            GridPadding::Border => c = clip(c),
            GridPadding::Reflection => {
                let (lo, hi) = if align {
                    (0.0, s - 1.0)
                } else {
                    (-0.5, s - 0.5)
                };
                if hi > lo {
                    let span = hi - lo;
                    let mut v = (c - lo).abs();
                    let flips = (v / span).floor();
                    v %= span;
                    c = if flips as i64 % 2 == 0 {
                        lo + v
                    } else {
                        hi - v
                    };
                } else {
                    c = 0.0;
                }
                c = clip(c);
            }
        }
        c
    };
    let src = |g: f64, size: usize| padded(unnorm(g, size), size);
    let (x, y) = (src(gx, w), src(gy, h));
    let at = |r: i64, c: i64| -> f64 {
        if r >= 0 && c >= 0 && (r as usize) < h && (c as usize) < w {
            plane[r as usize * w + c as usize]
        } else {
            0.0
        }
    };
    match mode {
        GridMode::Nearest => at(y.round_ties_even() as i64, x.round_ties_even() as i64),
        GridMode::Bilinear => {
            let (x0, y0) = (x.floor(), y.floor());
            let (tx, ty) = (x - x0, y - y0);
            let (c0, r0) = (x0 as i64, y0 as i64);
            at(r0, c0) * (1.0 - tx) * (1.0 - ty)
                + at(r0, c0 + 1) * tx * (1.0 - ty)
                + at(r0 + 1, c0) * (1.0 - tx) * ty
                + at(r0 + 1, c0 + 1) * tx * ty
        }
        GridMode::Bicubic => {
            // Keys' cubic convolution, A = -0.75, over the unpadded coordinate's 4×4
            // neighbourhood; each tap's coordinate padded, then truncated.
            let a = -0.75;
            let kernel = |d: f64| {
                let d = d.abs();
                if d <= 1.0 {
                    (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
                } else {
                    a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
                }
            };
            let (x, y) = (unnorm(gx, w), unnorm(gy, h));
            let (x0, y0) = (x.floor(), y.floor());
            let mut sum = 0.0;
            for i in -1..3 {
                let mut row = 0.0;
                for j in -1..3 {
                    let (cx, cy) = (x0 + j as f64, y0 + i as f64);
                    let v = at(padded(cy, h) as i64, padded(cx, w) as i64);
                    row += kernel(x - cx) * v;
                }
                sum += kernel(y - (y0 + i as f64)) * row;
            }
            sum
        }
    }
}

#[test]
fn grid_sample2d_matches_reference_for_every_mode() {
    let (n, c, h, w, oh, ow) = (2, 3, 4, 5, 3, 6);
    let x = randn(&[n, c, h, w], 6);
    let mut gen = Generator::new(7);
    let grid = Tensor::uniform([n, oh, ow, 2], -1.6, 1.6, DType::F64, &mut gen).unwrap();
    let (xv, gv) = (x.to_vec_f64(), grid.to_vec_f64());
    for mode in [GridMode::Bilinear, GridMode::Nearest, GridMode::Bicubic] {
        for pm in [
            GridPadding::Zeros,
            GridPadding::Border,
            GridPadding::Reflection,
        ] {
            for align in [false, true] {
                let out = grid_sample(&x, &grid, mode, pm, align).unwrap();
                assert_eq!(out.dims(), &[n, c, oh, ow]);
                let mut r = vec![];
                for b in 0..n {
                    for ch in 0..c {
                        let plane = &xv[(b * c + ch) * h * w..][..h * w];
                        for p in 0..oh * ow {
                            let g = &gv[(b * oh * ow + p) * 2..][..2];
                            r.push(ref_grid_point(plane, h, w, g[0], g[1], mode, pm, align));
                        }
                    }
                }
                close(&out.to_vec_f64(), &r, 1e-12);
            }
        }
    }
}

#[test]
fn grid_sample3d_identity_grid_reproduces_input() {
    let (d, h, w) = (2, 3, 4);
    let x = randn(&[1, 2, d, h, w], 8);
    let mut g = vec![];
    for i in 0..d {
        for j in 0..h {
            for k in 0..w {
                let lin = |v: usize, n: usize| -1.0 + 2.0 * v as f64 / (n - 1) as f64;
                g.extend([lin(k, w), lin(j, h), lin(i, d)]);
            }
        }
    }
    let grid = Tensor::from_vec(g, [1, d, h, w, 3]).unwrap();
    for mode in [GridMode::Bilinear, GridMode::Nearest] {
        let out = grid_sample(&x, &grid, mode, GridPadding::Zeros, true).unwrap();
        close(&out.to_vec_f64(), &x.to_vec_f64(), 1e-12);
    }
    // Bicubic is 2-d only, as in PyTorch.
    let e = grid_sample(&x, &grid, GridMode::Bicubic, GridPadding::Zeros, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("bicubic interpolation only supports 4D input"),
        "{e}"
    );
}

#[test]
fn sixteen_bit_inputs_compute_in_f32_and_round_once() {
    let x32 = Tensor::randn([1, 2, 6, 6], DType::F32, &mut Generator::new(10)).unwrap();
    let x16 = x32.to_dtype(DType::BF16).unwrap();
    let xr = x16.to_dtype(DType::F32).unwrap();
    let pp = params2([3, 3], [2, 2], [1, 1], [1, 1], true);
    let geo = pp.windows("avg_pool2d", &[6, 6], Some(true)).unwrap();
    let a = avg_pool_windows("avg_pool2d", &x16, &geo, None).unwrap();
    assert_eq!(a.dtype(), DType::BF16);
    let b = avg_pool_windows("avg_pool2d", &xr, &geo, None)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(a.to_vec_f64(), b.to_vec_f64());
    let g = Tensor::from_vec(vec![-0.25f32, 0.5, 0.75, -1.0], [1, 2, 1, 2])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let s = grid_sample(
        &x32.to_dtype(DType::F16).unwrap(),
        &g.reshape([1, 1, 2, 2]).unwrap(),
        GridMode::Bilinear,
        GridPadding::Zeros,
        false,
    )
    .unwrap();
    assert_eq!(s.dtype(), DType::F16);
    assert!(max_pool_windows(
        "max_pool2d",
        &Tensor::from_vec(vec![1i64; 4], [1, 2, 2]).unwrap(),
        &[pp.windows("max_pool2d", &[2, 2], None).unwrap()]
    )
    .is_err());
}

#[test]
fn plane_gather_and_scatter_are_adjoint_and_unpool_writes() {
    let x = randn(&[2, 3, 4], 11);
    let idx = Tensor::from_vec(vec![3i64, -1, 0, 11, 5, 5], [2, 1, 3]).unwrap();
    let xs = x.reshape([2, 3, 2, 2]).unwrap();
    let gth = plane_gather(&xs, 2, &idx.reshape([2, 1, 1, 3]).unwrap(), 0.0);
    // 11 is out of range for a 2x2 plane.
    assert!(gth.is_err());
    let idx = Tensor::from_vec(vec![3i64, -1, 0, 1, 2, 2], [2, 1, 3]).unwrap();
    let v = plane_gather(&x, 1, &idx, 7.0).unwrap();
    let xv = x.to_vec_f64();
    let vv = v.to_vec_f64();
    for b in 0..2 {
        for c in 0..3 {
            let row = [[3i64, -1, 0], [1, 2, 2]][b];
            for (j, &i) in row.iter().enumerate() {
                let want = if i < 0 {
                    7.0
                } else {
                    xv[(b * 3 + c) * 4 + i as usize]
                };
                assert_eq!(vv[(b * 3 + c) * 3 + j], want);
            }
        }
    }
    let g = randn(&[2, 3, 3], 12);
    let s = plane_scatter(&g, &idx, &[4], true).unwrap();
    let v0 = plane_gather(&x, 1, &idx, 0.0).unwrap();
    assert_adjoint(&v0, &g, &xv, &s, 1e-12);
    let set = plane_scatter(&g, &idx, &[4], false).unwrap().to_vec_f64();
    let gv = g.to_vec_f64();
    assert_eq!(set[(3 + 1) * 4 + 2], gv[(3 + 1) * 3 + 2]); // last write wins
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(24))]

    #[test]
    fn max_pool2d_random_geometry(
        h in 3usize..9, w in 3usize..9, k0 in 1usize..4, k1 in 1usize..4,
        s0 in 1usize..3, s1 in 1usize..3, d0 in 1usize..3, d1 in 1usize..3,
        ceil in any::<bool>(), seed in 0u64..1000,
    ) {
        let (p0, p1) = (k0 / 2, k1 / 2);
        prop_assume!(out_size(h as i64, k0 as i64, s0 as i64, p0 as i64, d0 as i64, ceil) > 0);
        prop_assume!(out_size(w as i64, k1 as i64, s1 as i64, p1 as i64, d1 as i64, ceil) > 0);
        let x = randn(&[2, h, w], seed);
        let pp = params2([k0, k1], [s0, s1], [p0, p1], [d0, d1], ceil);
        let geo = pp.windows("max_pool2d", &[h, w], None).unwrap();
        let (v, i) = max_pool_windows("max_pool2d", &x, &[geo]).unwrap();
        let (rv, ri, _) = ref_max_pool2d(&x.to_vec_f64(), [2, h, w], &pp);
        prop_assert_eq!(v.to_vec_f64(), rv);
        prop_assert_eq!(i.to_vec::<i64>().unwrap(), ri);
    }
}
