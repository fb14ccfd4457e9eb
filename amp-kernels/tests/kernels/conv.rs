//! Convolution kernels against a direct-loop float64 reference: random shapes, strides,
//! padding, dilation and groups, 1-3 spatial dims, every float dtype; the transposed
//! convolution and the input/weight/bias gradients against the same loops (as adjoints).

use amp_kernels::{
    conv, conv_bias_grad, conv_input_grad, conv_output_dims, conv_transpose, conv_weight_grad,
    ConvParams,
};
use amp_tensor::{DType, Generator, Tensor};
use amp_testing::tensors::bits;
use proptest::prelude::*;

/// One convolution problem, spatial dims padded to 3.
#[derive(Debug, Clone)]
struct Case {
    rank: usize,
    n: usize,
    groups: usize,
    cg: usize,
    og: usize,
    input: Vec<usize>,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
}

impl Case {
    fn params(&self) -> ConvParams {
        ConvParams::new(&self.stride, &self.padding, &self.dilation, self.groups)
    }
    fn x_dims(&self) -> Vec<usize> {
        let mut v = vec![self.n, self.groups * self.cg];
        v.extend(&self.input);
        v
    }
    fn w_dims(&self) -> Vec<usize> {
        let mut v = vec![self.groups * self.og, self.cg];
        v.extend(&self.kernel);
        v
    }
    fn out(&self) -> Vec<usize> {
        (0..self.rank)
            .map(|i| {
                (self.input[i] + 2 * self.padding[i] - self.dilation[i] * (self.kernel[i] - 1) - 1)
                    / self.stride[i]
                    + 1
            })
            .collect()
    }
    /// The output padding that makes the transposed convolution of an output of this
    /// case give back the case's input size (always below the stride).
    fn output_padding(&self) -> Vec<usize> {
        (self.out().iter().enumerate())
            .map(|(i, &o)| {
                let base = (o - 1) * self.stride[i] + self.dilation[i] * (self.kernel[i] - 1) + 1
                    - 2 * self.padding[i];
                self.input[i] - base
            })
            .collect()
    }
    fn y_dims(&self) -> Vec<usize> {
        let mut v = vec![self.n, self.groups * self.og];
        v.extend(self.out());
        v
    }
}

fn flat(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |a, (&i, &d)| a * d + i)
}

/// Calls `f(x_index, w_index, y_index)` for every multiply-add of the convolution.
fn each_tap(c: &Case, mut f: impl FnMut(usize, usize, usize)) {
    let (xd, wd, yd) = (c.x_dims(), c.w_dims(), c.y_dims());
    let out = c.out();
    let r = c.rank;
    let kcount: usize = c.kernel.iter().product();
    let ocount: usize = out.iter().product();
    for n in 0..c.n {
        for g in 0..c.groups {
            for o in 0..c.og {
                for ci in 0..c.cg {
                    for oi in 0..ocount {
                        let mut opos = vec![0; r];
                        let mut rem = oi;
                        for d in (0..r).rev() {
                            opos[d] = rem % out[d];
                            rem /= out[d];
                        }
                        'k: for ki in 0..kcount {
                            let mut kpos = vec![0; r];
                            let mut rem = ki;
                            for d in (0..r).rev() {
                                kpos[d] = rem % c.kernel[d];
                                rem /= c.kernel[d];
                            }
                            let mut ipos = vec![0; r];
                            for d in 0..r {
                                let v = (opos[d] * c.stride[d] + kpos[d] * c.dilation[d]) as isize
                                    - c.padding[d] as isize;
                                if v < 0 || v >= c.input[d] as isize {
                                    continue 'k;
                                }
                                ipos[d] = v as usize;
                            }
                            let mut xi = vec![n, g * c.cg + ci];
                            xi.extend(&ipos);
                            let mut wi = vec![g * c.og + o, ci];
                            wi.extend(&kpos);
                            let mut yi = vec![n, g * c.og + o];
                            yi.extend(&opos);
                            f(flat(&xi, &xd), flat(&wi, &wd), flat(&yi, &yd));
                        }
                    }
                }
            }
        }
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (1usize..=3).prop_flat_map(|rank| {
        (
            Just(rank),
            1usize..=3,
            1usize..=3,
            1usize..=3,
            1usize..=3,
            proptest::collection::vec(
                (1usize..=7, 1usize..=3, 1usize..=3, 0usize..=2, 1usize..=2),
                rank,
            ),
        )
            .prop_filter_map("empty output", |(rank, n, groups, cg, og, dims)| {
                let c = Case {
                    rank,
                    n,
                    groups,
                    cg,
                    og,
                    input: dims.iter().map(|d| d.0).collect(),
                    kernel: dims.iter().map(|d| d.1).collect(),
                    stride: dims.iter().map(|d| d.2).collect(),
                    padding: dims.iter().map(|d| d.3).collect(),
                    dilation: dims.iter().map(|d| d.4).collect(),
                };
                let ok = (0..rank)
                    .all(|i| c.input[i] + 2 * c.padding[i] > c.dilation[i] * (c.kernel[i] - 1));
                ok.then_some(c)
            })
    })
}

fn randn(dims: &[usize], gen: &mut Generator) -> Tensor {
    Tensor::randn(dims.to_vec(), DType::F64, gen).unwrap()
}

fn assert_close(got: &Tensor, want: &[f64], dtype: DType, what: &str) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let g = got.to_vec_f64();
    assert_eq!(g.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let tol = match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-4,
        DType::BF16 => 3e-2,
        _ => 4e-3,
    } * scale;
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol, "{what}[{i}] ({dtype}): {a} vs {b}");
    }
}

/// The inputs rounded to `dtype` (so the reference sees what the kernel sees).
fn rounded(t: &Tensor, dtype: DType) -> (Tensor, Vec<f64>) {
    let r = t.to_dtype(dtype).unwrap();
    let v = r.to_vec_f64();
    (r, v)
}

const DTYPES: [DType; 4] = [DType::F64, DType::F32, DType::BF16, DType::F16];

/// The forward, input, weight and bias gradients of case `c` (inputs drawn from
/// `seed`) in every float dtype against the direct loops.
fn check(c: &Case, seed: u64, bias: bool) {
    let mut gen = Generator::new(seed);
    let x64 = randn(&c.x_dims(), &mut gen);
    let w64 = randn(&c.w_dims(), &mut gen);
    let b64 = randn(&[c.groups * c.og], &mut gen);
    let g64 = randn(&c.y_dims(), &mut gen);
    let bt64 = randn(&[c.groups * c.cg], &mut gen);
    let p = c.params();
    assert_eq!(
        conv_output_dims(&c.x_dims(), &c.w_dims(), &p, false).unwrap(),
        c.y_dims()
    );
    for dtype in DTYPES {
        let (x, xv) = rounded(&x64, dtype);
        let (w, wv) = rounded(&w64, dtype);
        let (b, bv) = rounded(&b64, dtype);
        let (g, gv) = rounded(&g64, dtype);
        let ylen = gv.len();
        let mut y = vec![0.0; ylen];
        let mut gx = vec![0.0; xv.len()];
        let mut gw = vec![0.0; wv.len()];
        each_tap(c, |xi, wi, yi| {
            y[yi] += xv[xi] * wv[wi];
            gx[xi] += gv[yi] * wv[wi];
            gw[wi] += gv[yi] * xv[xi];
        });
        let per = ylen / (c.n * c.groups * c.og);
        if bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v += bv[(i / per) % (c.groups * c.og)];
            }
        }
        let out = conv(&x, &w, bias.then_some(&b), &p).unwrap();
        assert_eq!(out.dims().to_vec(), c.y_dims());
        assert_close(&out, &y, dtype, "conv");
        let gi = conv_input_grad(&g, &w, &c.x_dims(), &p).unwrap();
        assert_close(&gi, &gx, dtype, "input grad");
        if bias {
            // The same product as a transposed convolution, with a bias of its own.
            let (bt, btv) = rounded(&bt64, dtype);
            let pt = p.clone().with_output_padding(&c.output_padding());
            let got = conv_transpose(&g, &w, Some(&bt), &pt).unwrap();
            let per_in = xv.len() / (c.n * c.groups * c.cg);
            let want: Vec<f64> = (gx.iter().enumerate())
                .map(|(i, v)| v + btv[(i / per_in) % (c.groups * c.cg)])
                .collect();
            assert_close(&got, &want, dtype, "conv_transpose");
        }
        let gwk = conv_weight_grad(&x, &g, &c.w_dims(), &p).unwrap();
        assert_close(&gwk, &gw, dtype, "weight grad");
        let mut gb = vec![0.0; c.groups * c.og];
        for (i, v) in gv.iter().enumerate() {
            gb[(i / per) % (c.groups * c.og)] += v;
        }
        assert_close(&conv_bias_grad(&g).unwrap(), &gb, dtype, "bias grad");
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(12))]

    /// Random Winograd cases (16-bit 3×3 stride-1 convolutions with 16+ channels; the
    /// input gradient too where the padding is at most 2): every clipped-tile, padding
    /// and group combination against the direct loops, forward and gradients.
    #[test]
    fn winograd_shapes_match_direct_loops(
        n in 1usize..=2,
        groups in 1usize..=2,
        cg in 16usize..=18,
        og in 16usize..=18,
        h in 6usize..=14,
        w in 6usize..=40,
        ph in 0usize..=3,
        pw in 0usize..=3,
        seed in 0u64..1000,
        bias in any::<bool>(),
    ) {
        prop_assume!((h + 2 * ph - 2) * (w + 2 * pw - 2) >= 64);
        let c = case(n, groups, cg, og, &[h, w], &[3, 3], &[1], &[ph, pw], &[1]);
        check(&c, seed, bias);
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(24))]

    #[test]
    fn forward_and_grads_match_direct_loops(c in case_strategy(), seed in 0u64..1000, bias in any::<bool>()) {
        check(&c, seed, bias);
    }

    #[test]
    fn transposed_is_the_input_adjoint(c in case_strategy(), seed in 0u64..1000) {
        // conv_transpose(y, w) with weight [G·O, C, k] maps [N, G·O, out] to [N, G·C, in']
        // where in' is the smallest input the convolution maps to `out`, plus
        // output_padding; choose output_padding so in' equals the case's input.
        let op = c.output_padding();
        prop_assume!(op.iter().zip(&c.stride).zip(&c.dilation).all(|((&o, &s), &d)| o < s || o < d));
        prop_assume!(op.iter().zip(&c.stride).all(|(&o, &s)| o < s));
        let p = c.params().with_output_padding(&op);
        let mut gen = Generator::new(seed);
        let y = randn(&c.y_dims(), &mut gen);
        let w = randn(&c.w_dims(), &mut gen);
        let b = randn(&[c.groups * c.cg], &mut gen);
        let got = conv_transpose(&y, &w, Some(&b), &p).unwrap();
        prop_assert_eq!(got.dims().to_vec(), c.x_dims());
        let (yv, wv, bv) = (y.to_vec_f64(), w.to_vec_f64(), b.to_vec_f64());
        let mut want = vec![0.0; got.elem_count()];
        each_tap(&c, |xi, wi, yi| want[xi] += yv[yi] * wv[wi]);
        let per: usize = c.input.iter().product();
        for (i, v) in want.iter_mut().enumerate() {
            *v += bv[(i / per) % (c.groups * c.cg)];
        }
        assert_close(&got, &want, DType::F64, "conv_transpose");
    }
}

/// A case from per-dim lists (one value applies to every spatial dim).
#[allow(clippy::too_many_arguments)]
fn case(
    n: usize,
    groups: usize,
    cg: usize,
    og: usize,
    input: &[usize],
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
) -> Case {
    let rank = input.len();
    let full = |v: &[usize]| {
        if v.len() == 1 {
            vec![v[0]; rank]
        } else {
            v.to_vec()
        }
    };
    Case {
        rank,
        n,
        groups,
        cg,
        og,
        input: input.to_vec(),
        kernel: kernel.to_vec(),
        stride: full(stride),
        padding: full(padding),
        dilation: full(dilation),
    }
}

/// Convolutions with stride 1 across rows and "same" width, whose im2col copies whole
/// runs of rows: tiles that end mid-row and span depth planes, dilation, unpadded
/// height, padding wider than the input, 1d, strided depth, groups.
#[test]
fn same_width_tiles_match_direct_loops() {
    #[rustfmt::skip]
    let cases = [
        // n, groups, cg, og, input, kernel, stride, padding, dilation
        case(2, 1, 64, 8, &[20, 20], &[3, 3], &[1], &[1], &[1]),
        case(1, 1, 48, 4, &[18, 19], &[3, 3], &[1], &[2], &[2]),
        case(1, 2, 16, 4, &[8, 8, 8], &[3, 3, 3], &[1], &[1], &[1]),
        case(2, 1, 40, 3, &[9, 12], &[3, 5], &[1], &[0, 2], &[1]),
        case(1, 1, 8, 2, &[9, 7], &[2, 3], &[1], &[2, 1], &[1]),
        case(3, 1, 5, 2, &[3, 1], &[3, 3], &[1], &[1, 1], &[1]),
        case(2, 3, 4, 2, &[11], &[5], &[1], &[2], &[1]),
        case(1, 1, 6, 3, &[5, 4, 4], &[3, 3, 3], &[2, 1, 1], &[1], &[1]),
    ];
    for (i, c) in cases.iter().enumerate() {
        let last = c.rank - 1;
        assert_eq!(c.out()[last], c.input[last], "case {i} is not same-width");
        check(c, i as u64, i % 2 == 0);
    }
}

/// 2-d 3×3 convolutions with stride 1 and enough channels that float16 and bfloat16
/// run through Winograd F(2×2, 3×3): odd output sizes (clipped tiles), several tile
/// chunks, padding wider than a tile, groups, no padding, a 3-d kernel of depth 1.
#[test]
fn winograd_matches_direct_loops() {
    #[rustfmt::skip]
    let cases = [
        // n, groups, cg, og, input, kernel, stride, padding, dilation
        case(2, 1, 16, 16, &[10, 10], &[3, 3], &[1], &[1], &[1]),
        case(1, 2, 16, 17, &[9, 13], &[3, 3], &[1], &[0, 2], &[1]),
        case(1, 1, 20, 16, &[21, 30], &[3, 3], &[1], &[1], &[1]),
        case(1, 1, 16, 16, &[6, 6], &[3, 3], &[1], &[3], &[1]),
        case(2, 1, 16, 18, &[11, 9], &[3, 3], &[1], &[0], &[1]),
        case(1, 1, 16, 16, &[1, 8, 8], &[1, 3, 3], &[1], &[0, 1, 1], &[1]),
    ];
    for (i, c) in cases.iter().enumerate() {
        check(c, 100 + i as u64, i % 2 == 1);
    }
}

#[test]
fn bad_shapes_and_dtypes_are_errors() {
    let x = Tensor::zeros([1, 4, 5, 5], DType::F32);
    let w = Tensor::zeros([6, 2, 3, 3], DType::F32);
    // groups must divide channels consistently
    assert!(conv(&x, &w, None, &ConvParams::new(&[1], &[0], &[1], 1)).is_err());
    assert!(conv(&x, &w, None, &ConvParams::new(&[1], &[0], &[1], 2)).is_ok());
    assert!(conv(&x, &w, None, &ConvParams::new(&[1], &[0], &[1], 4)).is_err());
    // kernel larger than the padded input
    let big = Tensor::zeros([6, 2, 7, 7], DType::F32);
    assert!(conv(&x, &big, None, &ConvParams::new(&[1], &[0], &[1], 2)).is_err());
    // mixed dtypes, integer dtype, wrong bias, zero stride, wrong list length
    let w64 = w.to_dtype(DType::F64).unwrap();
    assert!(conv(&x, &w64, None, &ConvParams::new(&[1], &[0], &[1], 2)).is_err());
    let xi = x.to_dtype(DType::I64).unwrap();
    let wi = w.to_dtype(DType::I64).unwrap();
    assert!(conv(&xi, &wi, None, &ConvParams::new(&[1], &[0], &[1], 2)).is_err());
    let b = Tensor::zeros([5], DType::F32);
    assert!(conv(&x, &w, Some(&b), &ConvParams::new(&[1], &[0], &[1], 2)).is_err());
    assert!(conv(&x, &w, None, &ConvParams::new(&[0], &[0], &[1], 2)).is_err());
    assert!(conv(&x, &w, None, &ConvParams::new(&[1, 1, 1], &[0], &[1], 2)).is_err());
    // rank mismatch
    let x3 = Tensor::zeros([1, 4, 5], DType::F32);
    assert!(conv(&x3, &w, None, &ConvParams::default()).is_err());
    // transposed: output padding must be smaller than stride or dilation
    let wt = Tensor::zeros([4, 3, 3, 3], DType::F32);
    let p = ConvParams::new(&[1], &[0], &[1], 1).with_output_padding(&[1]);
    assert!(conv_transpose(&x, &wt, None, &p).is_err());
    let p = ConvParams::new(&[2], &[0], &[1], 1).with_output_padding(&[1]);
    assert_eq!(
        conv_transpose(&x, &wt, None, &p).unwrap().dims(),
        &[1, 3, 12, 12]
    );
}

/// The benchmark workload's kernels (forward, input grad, weight grad), timed.
/// `cargo test -p amp-kernels --release --test kernels conv:: -- --ignored --nocapture`
#[test]
#[ignore]
fn timing_conv2d_64x64_3x3_batch32() {
    let mut gen = Generator::new(0);
    let x = Tensor::randn([32, 64, 32, 32], DType::F32, &mut gen).unwrap();
    let w = Tensor::randn([64, 64, 3, 3], DType::F32, &mut gen).unwrap();
    let p = ConvParams::new(&[1], &[1], &[1], 1);
    for dtype in [DType::F32, DType::BF16] {
        let (x, w) = (x.to_dtype(dtype).unwrap(), w.to_dtype(dtype).unwrap());
        let y = conv(&x, &w, None, &p).unwrap();
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let y2 = conv(&x, &w, None, &p).unwrap();
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            let gx = conv_input_grad(&y, &w, x.dims(), &p).unwrap();
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            let gw = conv_weight_grad(&x, &y, w.dims(), &p).unwrap();
            best[2] = best[2].min(t.elapsed().as_secs_f64());
            drop((y2, gx, gw));
        }
        println!(
            "{dtype}: forward {:.1} ms, input grad {:.1} ms, weight grad {:.1} ms",
            best[0] * 1e3,
            best[1] * 1e3,
            best[2] * 1e3
        );
    }
}

/// The weight gradient of a batch spread over threads sums fixed pieces of samples in
/// a fixed order: repeated calls give the same bits, whichever thread ran which piece
/// and when (rayon's `try_fold`, used before, cut its pieces where work was stolen).
#[test]
fn batch_weight_grad_bits_do_not_depend_on_timing() {
    let c = case(32, 1, 16, 16, &[16, 16], &[3, 3], &[1], &[1], &[1]);
    let p = c.params();
    let mut gen = Generator::new(41);
    let x = randn(&c.x_dims(), &mut gen).to_dtype(DType::F32).unwrap();
    let g = randn(&c.y_dims(), &mut gen).to_dtype(DType::F32).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        let first = bits(&conv_weight_grad(&x, &g, &c.w_dims(), &p).unwrap());
        for round in 0..20 {
            let again = bits(&conv_weight_grad(&x, &g, &c.w_dims(), &p).unwrap());
            assert!(again == first, "round {round}: the weight gradient changed");
        }
    });
}
