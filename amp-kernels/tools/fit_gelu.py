"""Fit the per-interval polynomials of the normal CDF that `vmath`'s GELU tables use.

Two tables, each fitted by Lawson's iteration over Chebyshev nodes in float64
(`math.erfc` is accurate in both tails), then evaluated as the kernel does (float32,
fused multiply-adds) and checked:

- `PHI` (AVX-512, `vpermt2ps` selects among 32 pieces): Phi(x) = 0.5 * erfc(-x / sqrt 2)
  on [-6, 6), 32 intervals of 3/8, degree 6 in d = x - centre, least maximum relative
  error. Prints the worst absolute and relative errors of Phi.
- `TAIL` (AVX2, `vpermps` selects among 8 pieces): Q(t) = Phi(-t) on [0, 6), 8
  intervals of 3/4, degree 7, least maximum error relative to max(Q, 1e-3). The kernel
  takes t = |x| and writes x * Q(t) for x < 0 and x * (1 - Q(t)) for x >= 0. Prints
  the worst GELU error in the units of `vmath`'s test (`gelu_close_to_f64`): at most
  1.0 passes it.

    python3 amp-kernels/tools/fit_gelu.py   # needs numpy
"""
import math

import numpy as np

f32 = np.float32


def phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def fit(fun, lo, h, i, deg, floor):
    k = np.arange(400)
    d = 0.52 * h * np.cos(np.pi * (k + 0.5) / 400)  # a little past both ends
    x = lo + (i + 0.5) * h + d
    y = np.array([fun(v) for v in x])
    w = 1.0 / np.maximum(y, floor)
    v = np.vander(d, deg + 1, increasing=True)
    lw = np.ones_like(d)
    for _ in range(30):
        s = w * np.sqrt(lw)
        c, *_ = np.linalg.lstsq(v * s[:, None], y * s, rcond=None)
        e = np.abs(v @ c - y) * w
        lw = lw * e
        lw /= lw.sum()
    return c


def horner(coef, idx, d):
    """The kernel's Horner rule: one float32 rounding per fused multiply-add."""
    deg = coef.shape[1] - 1
    d = d.astype(np.float64)
    p = coef[idx, deg].astype(np.float64)
    for j in range(deg - 1, -1, -1):
        p = f32(p * d + coef[idx, j].astype(np.float64)).astype(np.float64)
    return p


def print_table(name, coef):
    n, deg = coef.shape[0], coef.shape[1] - 1
    print(f"const {name}: [[f32; {n}]; {deg + 1}] = [")
    for j in range(deg + 1):
        print("    [" + ", ".join(str(v) for v in coef[:, j]) + "],")
    print("];")


def phi_table():
    n, deg, lo, hi = 32, 6, -6.0, 6.0
    h = (hi - lo) / n
    coef = np.array([fit(phi, lo, h, i, deg, 0.0) for i in range(n)], dtype=f32)
    xs = np.linspace(-7, 7, 1_400_001).astype(f32)
    xc = np.clip(xs, f32(lo), f32(hi))
    s = f32(xc * f32(1.0 / h) + f32(-lo / h))
    idx = np.minimum(s.astype(np.int64), n - 1)
    d = f32(xc - (idx * h + (lo + h / 2)).astype(f32))
    got = np.where(xs < lo, 0.0, horner(coef, idx, d))
    want = np.array([phi(float(v)) for v in xs])
    inside = xs >= lo
    err = np.abs(got - want)
    print(f"// max |error| {err.max():.3e}; max relative error on [-6, 6] "
          f"{(err[inside] / want[inside]).max():.3e}")
    print_table("PHI", coef)


def tail_table():
    n, deg, hi = 8, 7, 6.0
    h = hi / n
    coef = np.array(
        [fit(lambda t: phi(-t), 0.0, h, i, deg, 1e-3) for i in range(n)], dtype=f32
    )
    xs = np.concatenate([
        np.linspace(-7, 7, 1_400_001),
        np.linspace(-1e-3, 1e-3, 20_001),
        np.logspace(-30, 1.5, 100_000),
        -np.logspace(-30, 1.5, 100_000),
    ]).astype(f32)
    t = np.minimum(np.abs(xs), f32(hi))
    idx = (f32(t * f32(1.0 / h)).astype(np.int64)) & (n - 1)
    d = f32(t - f32(idx.astype(f32) * f32(h) + f32(h / 2)))
    q = np.where(np.abs(xs) < hi, horner(coef, idx, d), 0.0).astype(f32)
    got = (xs * np.where(xs < 0, q, f32(1) - q).astype(f32)).astype(np.float64)
    want = np.array([v * phi(v) for v in xs.astype(np.float64)])
    ulp = np.spacing(np.abs(want.astype(f32))).astype(np.float64)
    err = np.abs(got - want)
    tol = np.finfo(f32).eps * np.abs(xs.astype(np.float64))
    # The test passes an x within 3 ulps or within eps * |x|.
    worst = np.minimum(err / ulp / 3.0, err / np.maximum(tol, 1e-300)).max()
    print(f"// GELU through the table: worst error {worst:.3f} of the test's bound")
    print_table("TAIL", coef)


def main():
    phi_table()
    tail_table()


if __name__ == "__main__":
    main()
