#!/usr/bin/python3
"""
fit_gelu.py -- the coefficients of kiln's gelu (src/codegen/vecmath.h:
kiln_vm_log2_2phi and kiln_vm_half_exp2), fitted here and printed as C.

    /usr/bin/python3 scripts/fit_gelu.py      (Debian: python3-numpy, python3-mpmath)

Not run by the build or the tests: the printed coefficients are pasted
into src/codegen/vecmath.h, and tests/test_vecmath.c checks the function they
make against erfc in double. Deterministic: a run prints the same
coefficients.

gelu(x) = x Phi(x). With a = |x| and h = Phi(-a), kiln computes
q = log2(2 Phi(-a)) = a P(a) (so h = 2^(q - 1)), rounds q to the nearest
integer n, and h = half_exp2(q - n) 2^n, where half_exp2(r) = 2^r / 2.

P (degree 7 on [0, 5.5]) is fitted weighted by how q's error reaches the
tolerance of gelu's result: an error e in q is a relative error e ln2 in
h, which is h e ln2 / (1 - h) of x (1 - h) (x >= 0, tolerance an ulp, a
relative 2^-23) and |x| h e ln2 absolute for x < 0 (tolerance 2^-23
absolute). half_exp2 (degree 6 on [-0.5, 0.5], constant term 1/2 exactly)
is fitted for relative error.

Each fit is a weighted least-squares fit iterated towards minimax
(Lawson's reweighting). Float coefficients: the lowest power is fitted,
rounded to float and fixed, and the rest refitted without it, up to the
highest, so the rounding of each is compensated by those after it.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40
A = 5.5          # h = Phi(-a) is 0 in kiln from a = 5.5 on
P_DEGREE = 7
E_DEGREE = 6


def lawson(V, f, w, iters=60):
    ww = w.copy()
    for _ in range(iters):
        c, *_ = np.linalg.lstsq(V * ww[:, None], f * ww, rcond=None)
        e = (V @ c - f) * w
        ww = ww * np.sqrt(np.abs(e) / np.abs(e).max() + 1e-4)
        ww /= ww.max()
    return c


def fit_float(V, f, w):
    c = np.zeros(V.shape[1])
    for k in range(V.shape[1]):
        rest = lawson(V[:, k:], f - V[:, :k] @ c[:k], w)
        c[k] = np.float32(rest[0])
    return c


def cheb(n, lo, hi):
    return lo + (hi - lo) * (np.cos(np.pi * (np.arange(n) + 0.5) / n) + 1) / 2


def main():
    a = cheb(3000, 0.0, A)
    h = np.array([float(mp.ncdf(-mp.mpf(x))) for x in a])
    q = np.array([float(mp.log(2 * mp.ncdf(-mp.mpf(x)), 2)) for x in a])
    w = h * np.maximum(1 / (1 - h), a)
    V = np.stack([a ** (k + 1) for k in range(P_DEGREE + 1)], 1)
    cq = fit_float(V, q, w)
    eq = np.abs((V @ cq - q) * w).max() * np.log(2) / 2.0 ** -23

    r = cheb(2000, -0.5, 0.5)
    f = 0.5 * 2.0 ** r
    V2 = np.stack([r ** k for k in range(1, E_DEGREE + 1)], 1)
    ce = fit_float(V2, f - 0.5, 1 / f)
    ee = np.abs((V2 @ ce + 0.5 - f) / f).max()

    print("/* log2(2 Phi(-a)) = a P(a): at most %.3f of gelu's tolerance */" % eq)
    print("float p = %.10ef;" % cq[-1])
    for c in cq[-2::-1]:
        print("p = KILN_VM_FMAF(p, a, %.10ef);" % c)
    print("return p * a;")
    print("/* 2^r / 2: relative error 2^%.1f */" % np.log2(ee))
    print("float p = %.10ef;" % ce[-1])
    for c in ce[-2::-1]:
        print("p = KILN_VM_FMAF(p, r, %.10ef);" % c)
    print("return KILN_VM_FMAF(p, r, 0.5f);")


if __name__ == "__main__":
    main()
