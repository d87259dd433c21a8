#!/usr/bin/python3
"""models/compare.py -- does an output match PyTorch's?

  /usr/bin/python3 models/compare.py GOT.npy WANT.npy [--rtol 1e-3] [--atol 1e-4]

Passes when every element satisfies |got - want| <= atol + rtol * |want|
(numpy.allclose's rule), shapes are equal and no value is NaN or infinite
where PyTorch's is finite. Prints one line: max abs error, max rel error
(|got - want| / |want| over elements with |want| > atol), the worst element
measured against the tolerance, and PASS or FAIL; exits 1 on FAIL.

Why rtol 1e-3, atol 1e-4: the models' outputs are O(1) (logits up to ~2,
encoder activations up to ~6); PyTorch's own float32 output is within
~2e-6 of a float64 run of the same model (models/export.py records this in
manifest.json), and ONNX Runtime's within ~3e-6 of PyTorch's. A compiler
that reassociates sums over 4608-element convolution windows or 1024-wide
matmuls differs by a few ulps per layer; 1e-4 absolute leaves room for that
across ~50 layers while any wrong index, missing bias or misfolded
BatchNormalization is off by 1e-2 or more.
"""

import argparse
import sys

import numpy as np


def compare(got, want, rtol, atol):
    """-> (ok, message)."""
    if got.shape != want.shape:
        return False, "shape %s, want %s" % (list(got.shape), list(want.shape))
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return False, "%d non-finite values where PyTorch's are finite" % int((~np.isfinite(got) & finite).sum())
    err = np.abs(got - want)
    allowed = atol + rtol * np.abs(want)
    worst = int(np.argmax(err / allowed))
    big = np.abs(want) > atol
    rel = float((err[big] / np.abs(want[big])).max()) if big.any() else 0.0
    ok = bool(np.all(err <= allowed))
    idx = np.unravel_index(worst, want.shape)
    return ok, "max abs %.3g, max rel %.3g, worst %s: got %.7g want %.7g (%.3g x tolerance)" % (
        float(err.max()), rel, list(map(int, idx)), got[idx], want[idx], err[idx] / allowed[idx])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("got")
    ap.add_argument("want")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-4)
    a = ap.parse_args()
    ok, msg = compare(np.load(a.got), np.load(a.want), a.rtol, a.atol)
    print("%s (rtol %g, atol %g): %s" % ("PASS" if ok else "FAIL", a.rtol, a.atol, msg))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
