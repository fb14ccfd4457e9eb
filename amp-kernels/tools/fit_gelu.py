"""Fit the per-interval polynomials of the normal CDF that `vmath::gelu_avx512` uses.

Phi(x) = 0.5 * erfc(-x / sqrt 2) on [-6, 6) is cut into 32 intervals of 3/8; on each,
a degree-6 polynomial in d = x - centre is fitted for the least maximum relative error
(Lawson's iteration over Chebyshev nodes, in float64; `math.erfc` is accurate in both
tails). The script then evaluates the table as the kernel does (float32, fused
multiply-adds) and prints the worst absolute and relative errors, then the Rust table.

    python3 amp-kernels/tools/fit_gelu.py   # needs numpy
"""
import math

import numpy as np

N, DEG, LO, HI = 32, 6, -6.0, 6.0
H = (HI - LO) / N


def phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def fit(i):
    k = np.arange(400)
    d = 0.52 * H * np.cos(np.pi * (k + 0.5) / 400)  # a little past both ends
    x = LO + (i + 0.5) * H + d
    y = np.array([phi(v) for v in x])
    w = 1.0 / y
    v = np.vander(d, DEG + 1, increasing=True)
    lw = np.ones_like(d)
    for _ in range(30):
        s = w * np.sqrt(lw)
        c, *_ = np.linalg.lstsq(v * s[:, None], y * s, rcond=None)
        e = np.abs(v @ c - y) * w
        lw = lw * e
        lw /= lw.sum()
    return c


def evaluate(coef, xs):
    f32 = np.float32
    xc = np.clip(xs, f32(LO), f32(HI))
    s = f32(xc * f32(1.0 / H) + f32(-LO / H))
    idx = np.minimum(s.astype(np.int64), N - 1)
    d = f32(xc - (idx * H + (LO + H / 2)).astype(np.float32)).astype(np.float64)
    p = coef[idx, DEG].astype(np.float64)
    for j in range(DEG - 1, -1, -1):
        p = f32(p * d + coef[idx, j].astype(np.float64)).astype(np.float64)
    return np.where(xs < LO, 0.0, p)


def main():
    coef = np.array([fit(i) for i in range(N)], dtype=np.float32)
    xs = np.linspace(-7, 7, 1_400_001).astype(np.float32)
    got = evaluate(coef, xs)
    want = np.array([phi(float(v)) for v in xs])
    inside = xs >= LO
    err = np.abs(got - want)
    print(f"// max |error| {err.max():.3e}; max relative error on [-6, 6] "
          f"{(err[inside] / want[inside]).max():.3e}")
    print(f"const PHI: [[f32; {N}]; {DEG + 1}] = [")
    for j in range(DEG + 1):
        print("    [" + ", ".join(str(v) for v in coef[:, j]) + "],")
    print("];")


if __name__ == "__main__":
    main()
