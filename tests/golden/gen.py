#!/usr/bin/python3
"""
gen.py -- golden data for kiln: every op of the .kiln text format checked
against NumPy, an implementation kiln shares no code with.

Each case below is a name, a .kiln program, optional input distributions and
a NumPy reference. The program's `input`, `weight ... = file(...)` and
`output` lines are read back here, so shapes are written once (in the
program). For each case this writes

    cases/<name>/prog.kiln          the program
    cases/<name>/<input>.npy        one file per declared input
    cases/<name>/<weight file>.npy  one per file("...") weight
    cases/<name>/expect_<out>.npy   one per output (f32, f64 for a case
                                    with f64 inputs, or bool for
                                    comparisons)

and cases/index.txt with the case names, one per line. tests/test_golden.c
runs every case through kiln's reference interpreter and compares.

References compute in float64 from the float32 inputs and cast the result to
float32 (bool outputs stay bool); a case whose inputs are f64 keeps its
float results in float64, and kiln must then match them to double
precision. Where a discontinuous op (a comparison,
floor) reads a computed value, the reference computes that value in float32
like kiln does, so a rounding difference cannot flip a result.

Every input is drawn from np.random.default_rng seeded by a stable hash of
(1234, case name): adding or reordering cases does not change other cases'
data. Run with /usr/bin/python3 (it has numpy):

    /usr/bin/python3 tests/golden/gen.py
"""
import math
import os
import re
import shutil
import sys
import textwrap
import zlib
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "cases")
SEED = 1234
MAX_NUMEL = 4096

# ---- input distributions: (rng, shape) -> float64 or bool array ---------


def normal(scale=1.0):
    return lambda rng, shape: rng.standard_normal(shape) * scale


def uniform(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def ints(lo, hi):
    """Small integers as floats: equality comparisons hit both outcomes."""
    return lambda rng, shape: rng.integers(lo, hi + 1, shape).astype(np.float64)


def nonzero(rng, shape):
    """|x| in [0.5, 2): safe for division and reciprocal."""
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


positive = uniform(0.25, 3.0)   # bases of log, sqrt, rsqrt, pow; variances


def boolean(rng, shape):
    return rng.random(shape) < 0.5


# ---- NumPy references of kiln's ops ------------------------------------

erf = np.vectorize(math.erf, otypes=[np.float64])


def f32(a):
    return np.asarray(a, dtype=np.float32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def silu(x):
    return x * sigmoid(x)


def rsqrt(x):
    return 1.0 / np.sqrt(x)


def relu(x):
    return np.maximum(x, 0.0)


def axes(dim):
    if dim is None:
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def red(fn, x, dim=None, keepdim=False):
    return fn(x, axis=axes(dim), keepdims=keepdim)


def softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x, dim):
    s = x - x.max(axis=dim, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=dim, keepdims=True))


def layer_norm(x, nshape, w=None, b=None, eps=1e-5):
    ax = tuple(range(x.ndim - len(nshape), x.ndim))
    mu = x.mean(axis=ax, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=ax, keepdims=True)   # biased
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def batch_norm(x, mean, var, w=None, b=None, eps=1e-5):
    shp = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + eps)
    if w is not None:
        y = y * w.reshape(shp)
    if b is not None:
        y = y + b.reshape(shp)
    return y


def clamp(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def slice_(x, dim, start, end, step=1):
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Direct NCHW convolution: one einsum per kernel tap and group."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    n, c, h, wd = x.shape
    co, cig, kh, kw = w.shape
    assert c == cig * groups and co % groups == 0
    cog = co // groups
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, co, oh, ow))
    for g in range(groups):
        xg = xp[:, g * cig:(g + 1) * cig]
        wg = w[g * cog:(g + 1) * cog]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * cog:(g + 1) * cog] += np.einsum(
                    "nchw,oc->nohw", patch, wg[:, :, i, j])
    if b is not None:
        out += b.reshape(1, co, 1, 1)
    return out


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """Transposed NCHW convolution as a scatter: each kernel tap adds the
    input, spread out by the stride, into an uncropped output, which padding
    then crops (output_padding extends the far edge)."""
    (sh, sw), (ph, pw) = pair(stride), pair(padding)
    (oph, opw), (dh, dw) = pair(output_padding), pair(dilation)
    n, c, h, wd = x.shape
    ci, cog, kh, kw = w.shape
    assert ci == c and c % groups == 0
    cig, co = c // groups, cog * groups
    full = np.zeros((n, co, (h - 1) * sh + dh * (kh - 1) + 1 + oph,
                     (wd - 1) * sw + dw * (kw - 1) + 1 + opw))
    for g in range(groups):
        xg, wg = x[:, g * cig:(g + 1) * cig], w[g * cig:(g + 1) * cig]
        for i in range(kh):
            for j in range(kw):
                full[:, g * cog:(g + 1) * cog, i * dh:i * dh + sh * (h - 1) + 1:sh,
                     j * dw:j * dw + sw * (wd - 1) + 1:sw] += np.einsum(
                         "nchw,co->nohw", xg, wg[:, :, i, j])
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    out = full[:, :, ph:ph + oh, pw:pw + ow]
    if b is not None:
        out = out + b.reshape(1, co, 1, 1)
    return out


def gather(x, i, axis=0):
    """numpy.take with kiln's float indices."""
    assert np.all(i == np.floor(i))
    return np.take(x, i.astype(np.int64), axis=axis)


def torch_crosscheck():
    """Once, when Debian's python3-torch is there: conv_transpose2d above
    against torch.nn.functional.conv_transpose2d on the configurations the
    cases use and a few more. The golden data never needs torch."""
    try:
        import torch
    except ImportError:
        print("torch not installed: conv_transpose2d cross-check skipped", file=sys.stderr)
        return
    rng = np.random.default_rng(7)
    configs = [  # x shape, w shape, stride, padding, output_padding, groups, dilation
        ((1, 3, 4, 4), (3, 2, 3, 3), 2, 1, 1, 1, 1),
        ((2, 4, 5, 3), (4, 3, 3, 2), (2, 3), (1, 0), (1, 2), 2, (1, 2)),
        ((1, 2, 3, 5), (2, 3, 2, 4), 1, 0, 0, 1, 1),
        ((1, 3, 5, 4), (3, 1, 3, 3), 2, 1, 0, 3, 1),
        ((1, 2, 4, 3), (2, 2, 3, 2), 1, (2, 1), 1, 1, 2),
        ((2, 6, 3, 3), (6, 2, 1, 1), 3, 0, 2, 3, 1),
    ]
    for xs, ws, st, pd, op, gr, dl in configs:
        x, w = rng.standard_normal(xs), rng.standard_normal(ws)
        b = rng.standard_normal(ws[1] * gr)
        ours = conv_transpose2d(x, w, b, st, pd, op, gr, dl)
        theirs = torch.nn.functional.conv_transpose2d(
            torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), pair(st), pair(pd),
            pair(op), gr, pair(dl)).numpy()
        assert ours.shape == theirs.shape and np.allclose(ours, theirs, atol=1e-10), (xs, ws)
    print(f"torch cross-check: conv_transpose2d agrees on {len(configs)} configurations",
          file=sys.stderr)


def torch_pad(x, pad, mode="constant", value=0.0):
    """F.pad: pad holds (before, after) pairs from the last dim; negative
    widths crop first."""
    idx, widths = [slice(None)] * x.ndim, [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d, b, a = x.ndim - 1 - i, pad[2 * i], pad[2 * i + 1]
        idx[d] = slice(max(-b, 0), x.shape[d] - max(-a, 0))
        widths[d] = (max(b, 0), max(a, 0))
    x = x[tuple(idx)]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode={"replicate": "edge", "reflect": "reflect"}[mode])


def pool_out(n, k, s, d, pb, pe, ceil):
    """PyTorch's pooling_output_shape."""
    room = n + pb + pe - (d * (k - 1) + 1)
    out = (-(-room // s) if ceil else room // s) + 1
    if ceil and (out - 1) * s >= n + pb:
        out -= 1
    return out


def pool(x, kind, k, s=None, pads=None, d=None, ceil=False, include_pad=True):
    """Max or average pooling over the spatial dims x.shape[2:], window by
    window: the taps inside the input, the divisor by PyTorch's rule (taps
    inside the declared padding, or inside the input)."""
    ns = x.ndim - 2
    s, d = s or k, d or [1] * ns
    pb, pe = pads or ([0] * ns, [0] * ns)
    size = x.shape[2:]
    outs = [pool_out(size[i], k[i], s[i], d[i], pb[i], pe[i], ceil) for i in range(ns)]
    y = np.zeros(x.shape[:2] + tuple(outs))
    for o in np.ndindex(*outs):
        pos = [[o[i] * s[i] - pb[i] + j * d[i] for j in range(k[i])] for i in range(ns)]
        v = x
        for i in range(ns):
            v = np.take(v, [p for p in pos[i] if 0 <= p < size[i]], axis=2 + i)
        axes = tuple(range(2, 2 + ns))
        if kind == "max":
            y[(Ellipsis,) + o] = v.max(axis=axes)
            continue
        lo = [-pb[i] if include_pad else 0 for i in range(ns)]
        hi = [size[i] + pe[i] if include_pad else size[i] for i in range(ns)]
        count = np.prod([sum(lo[i] <= p < hi[i] for p in pos[i]) for i in range(ns)])
        y[(Ellipsis,) + o] = v.sum(axis=axes) / count
    return y


# ---- the cases -----------------------------------------------------------

CASES = []


def case(name, prog, ref, dist=None):
    """Register a case. dist maps input/weight names to distributions
    (default: standard normal for f32, fair coin for bool)."""
    assert re.fullmatch(r"[a-z0-9_]+", name), name
    assert name not in [c.name for c in CASES], name
    CASES.append(SimpleNamespace(name=name, prog=textwrap.dedent(prog).strip() + "\n",
                                 ref=ref, dist=dist or {}))


# -- pointwise, unary
case("neg", """
    input x: f32[3, 5]
    y = neg(x)
    z = -x
    output y, z
""", lambda v: {"y": -v.x, "z": -v.x})
case("abs", """
    input x: f32[4, 6]
    y = abs(x)
    output y
""", lambda v: {"y": np.abs(v.x)})
case("relu", """
    input x: f32[2, 3, 7]
    y = relu(x)
    output y
""", lambda v: {"y": relu(v.x)})
case("sigmoid", """
    input x: f32[5, 9]
    y = sigmoid(x)
    output y
""", lambda v: {"y": sigmoid(v.x)}, {"x": normal(4.0)})
case("tanh", """
    input x: f32[5, 9]
    y = tanh(x)
    output y
""", lambda v: {"y": np.tanh(v.x)}, {"x": normal(3.0)})
case("exp", """
    input x: f32[4, 4]
    y = exp(x)
    output y
""", lambda v: {"y": np.exp(v.x)}, {"x": normal(2.0)})
case("log", """
    input x: f32[4, 8]
    y = log(x)
    output y
""", lambda v: {"y": np.log(v.x)}, {"x": positive})
case("sqrt", """
    input x: f32[4, 8]
    y = sqrt(x)
    output y
""", lambda v: {"y": np.sqrt(v.x)}, {"x": positive})
case("rsqrt", """
    input x: f32[4, 8]
    y = rsqrt(x)
    output y
""", lambda v: {"y": rsqrt(v.x)}, {"x": positive})
case("sin_cos", """
    input x: f32[6, 7]
    s = sin(x)
    c = cos(x)
    output s, c
""", lambda v: {"s": np.sin(v.x), "c": np.cos(v.x)}, {"x": normal(3.0)})
case("erf", """
    input x: f32[3, 11]
    y = erf(x)
    output y
""", lambda v: {"y": erf(v.x)}, {"x": normal(1.5)})
case("gelu", """
    input x: f32[2, 5, 6]
    y = gelu(x)
    output y
""", lambda v: {"y": gelu(v.x)}, {"x": normal(2.5)})
case("silu", """
    input x: f32[2, 3, 4, 5]
    y = silu(x)
    output y
""", lambda v: {"y": silu(v.x)}, {"x": normal(3.0)})
case("floor_ceil", """
    input x: f32[5, 8]
    f = floor(x)
    c = ceil(x)
    output f, c
""", lambda v: {"f": np.floor(v.x), "c": np.ceil(v.x)}, {"x": normal(3.0)})
case("floor_scaled", """
    input x: f32[5, 8]
    f = floor(x * 4 - 0.5)
    output f
""", lambda v: {"f": np.floor(f32(f32(v.x) * np.float32(4)) - np.float32(0.5))},
    {"x": normal(2.0)})
case("reciprocal", """
    input x: f32[4, 7]
    y = reciprocal(x)
    output y
""", lambda v: {"y": 1.0 / v.x}, {"x": nonzero})

# -- pointwise, binary
case("pow_tensor", """
    input a: f32[3, 6]
    input b: f32[3, 6]
    y = pow(a, b)
    output y
""", lambda v: {"y": np.power(v.a, v.b)}, {"a": positive})
case("pow_scalar", """
    input a: f32[4, 5]
    sq = pow(a, 2)
    rt = pow(a, 0.5)
    ng = pow(a, -1.5)
    output sq, rt, ng
""", lambda v: {"sq": v.a ** 2, "rt": v.a ** 0.5, "ng": v.a ** -1.5}, {"a": positive})
case("pow_broadcast", """
    input a: f32[3, 1]
    input e: f32[4]
    y = pow(a, e)
    output y
""", lambda v: {"y": np.power(v.a, v.e)}, {"a": positive})
case("true_divide_by_row_sum", """
    input a: f32[5, 9]
    s = sum(a, 1, keepdim=true)
    y = true_divide(a, s)
    output y
""", lambda v: {"y": v.a / v.a.sum(1, keepdims=True)}, {"a": positive})
case("rank8_permute_sum", """
    input a: f32[2, 1, 3, 1, 2, 2, 1, 3]
    p = permute(a, [7, 0, 6, 1, 5, 2, 4, 3])
    y = sum(relu(p) + 1, [1, 3]) * 2
    output y
""", lambda v: {"y": (np.maximum(np.transpose(v.a, [7, 0, 6, 1, 5, 2, 4, 3]), 0) + 1).sum(
    axis=(1, 3)) * 2})
case("fmod", """
    input a: f32[4, 6]
    input b: f32[6]
    y = fmod(a, b)
    output y
""", lambda v: {"y": np.fmod(v.a, v.b)}, {"a": normal(4.0), "b": nonzero})
case("maximum_minimum", """
    input a: f32[3, 4]
    input b: f32[4]
    hi = maximum(a, b)
    lo = minimum(a, b)
    output hi, lo
""", lambda v: {"hi": np.maximum(v.a, v.b), "lo": np.minimum(v.a, v.b)})
case("arith_infix", """
    input a: f32[4, 5]
    input b: f32[4, 5]
    s = a + b
    d = a - b
    p = a * b
    q = a / b
    output s, d, p, q
""", lambda v: {"s": v.a + v.b, "d": v.a - v.b, "p": v.a * v.b, "q": v.a / v.b},
    {"b": nonzero})

# -- clamp
case("clamp_min", """
    input x: f32[4, 6]
    y = clamp(x, min=-0.5)
    output y
""", lambda v: {"y": clamp(v.x, lo=-0.5)})
case("clamp_max", """
    input x: f32[4, 6]
    y = clamp(x, max=0.25)
    output y
""", lambda v: {"y": clamp(v.x, hi=0.25)})
case("clamp_both", """
    input x: f32[2, 3, 5]
    y = clamp(x, min=-1, max=0.5)
    output y
""", lambda v: {"y": clamp(v.x, -1.0, 0.5)}, {"x": normal(2.0)})
case("clamp_positional", """
    input x: f32[3, 7]
    y = clamp(x, -0.75, 1.25)
    output y
""", lambda v: {"y": clamp(v.x, -0.75, 1.25)}, {"x": normal(2.0)})

# -- comparisons and where
case("cmp_funcs", """
    input a: f32[4, 6]
    input b: f32[4, 6]
    c_lt = lt(a, b)
    c_le = le(a, b)
    c_gt = gt(a, b)
    c_ge = ge(a, b)
    c_eq = eq(a, b)
    c_ne = ne(a, b)
    output c_lt, c_le, c_gt, c_ge, c_eq, c_ne
""", lambda v: {"c_lt": v.a < v.b, "c_le": v.a <= v.b, "c_gt": v.a > v.b,
                "c_ge": v.a >= v.b, "c_eq": v.a == v.b, "c_ne": v.a != v.b},
    {"a": ints(-2, 2), "b": ints(-2, 2)})
case("cmp_infix", """
    input a: f32[5, 5]
    input b: f32[5, 5]
    c_lt = a < b
    c_le = a <= b
    c_gt = a > b
    c_ge = a >= b
    c_eq = a == b
    c_ne = a != b
    output c_lt, c_le, c_gt, c_ge, c_eq, c_ne
""", lambda v: {"c_lt": v.a < v.b, "c_le": v.a <= v.b, "c_gt": v.a > v.b,
                "c_ge": v.a >= v.b, "c_eq": v.a == v.b, "c_ne": v.a != v.b},
    {"a": ints(-2, 2), "b": ints(-2, 2)})
case("cmp_scalar", """
    input x: f32[4, 8]
    pos = x > 0
    small = x <= 0.5
    flip = 1 < x
    one = x == 1
    output pos, small, flip, one
""", lambda v: {"pos": v.x > 0, "small": v.x <= 0.5, "flip": 1 < v.x, "one": v.x == 1},
    {"x": lambda rng, s: rng.integers(-4, 5, s) * 0.5})
case("cmp_broadcast", """
    input a: f32[3, 1]
    input b: f32[1, 4]
    c = a < b
    e = eq(a, b)
    output c, e
""", lambda v: {"c": v.a < v.b, "e": v.a == v.b}, {"a": ints(-1, 1), "b": ints(-1, 1)})
case("cmp_computed", """
    input x: f32[6, 6]
    input y: f32[6, 6]
    c = x + 1 > y * 2   # comparison binds looser than arithmetic
    output c
""", lambda v: {"c": f32(f32(v.x) + np.float32(1)) > f32(f32(v.y) * np.float32(2))})
case("where_cmp", """
    input x: f32[4, 5]
    input y: f32[4, 5]
    z = where(x > y, x, y * 2)
    output z
""", lambda v: {"z": np.where(v.x > v.y, v.x, v.y * 2)})
case("where_bool_input", """
    input c: bool[3, 4]
    input a: f32[3, 4]
    input b: f32[3, 4]
    z = where(c, a, b)
    output z
""", lambda v: {"z": np.where(v.c, v.a, v.b)})
case("where_broadcast_scalars", """
    input c: bool[3, 1]
    input a: f32[1, 4]
    z = where(c, a, 0)
    r = where(a < 0, 0, a)
    output z, r
""", lambda v: {"z": np.where(v.c, v.a, 0.0), "r": np.where(v.a < 0, 0.0, v.a)})
case("where_bool_rank3", """
    input c: bool[2, 1, 5]
    input a: f32[2, 3, 5]
    input b: f32[5]
    z = where(c, a, b)
    w = where(c, b, -a)
    output z, w
""", lambda v: {"z": np.where(v.c, v.a, v.b), "w": np.where(v.c, v.b, -v.a)})

# -- broadcasting and literals
case("bcast_size1_both", """
    input a: f32[3, 1]
    input b: f32[1, 4]
    s = a + b
    p = a * b
    d = b - a
    output s, p, d
""", lambda v: {"s": v.a + v.b, "p": v.a * v.b, "d": v.b - v.a})
case("bcast_rank0", """
    input x: f32[3, 4]
    input s: f32[]
    y = x * s + s
    z = s - x
    output y, z
""", lambda v: {"y": v.x * v.s + v.s, "z": v.s - v.x})
case("bcast_rank0_only", """
    input s: f32[]
    input t: f32[]
    u = s * t + 1
    w = exp(s) - t
    output u, w
""", lambda v: {"u": v.s * v.t + 1, "w": np.exp(v.s) - v.t})
case("bcast_ranks", """
    input x: f32[2, 3, 4]
    input r: f32[4]
    input c: f32[3, 1]
    a = x + r
    m = x * c
    b = r - c
    output a, m, b
""", lambda v: {"a": v.x + v.r, "m": v.x * v.c, "b": v.r - v.c})
case("bcast_rank4_mixed", """
    input a: f32[2, 1, 4, 1]
    input b: f32[3, 1, 5]
    y = a * b + a
    output y
""", lambda v: {"y": v.a * v.b + v.a})
case("literals", """
    input x: f32[4, 5]
    a = x * 2 + 1
    b = -x
    c = 1 / x
    d = 2 - x
    e = x / 4 + 1e-3
    output a, b, c, d, e
""", lambda v: {"a": v.x * 2 + 1, "b": -v.x, "c": 1 / v.x, "d": 2 - v.x, "e": v.x / 4 + 1e-3},
    {"x": nonzero})
case("precedence", """
    input a: f32[3, 4]
    input b: f32[3, 4]
    input c: f32[3, 4]
    input d: f32[3, 4]
    p1 = a + b * c - d / c
    p2 = (a + b) * c
    p3 = a - b - c
    p4 = a / c / d
    p5 = -a * b
    p6 = -(a + b)
    p7 = a - -b
    output p1, p2, p3, p4, p5, p6, p7
""", lambda v: {"p1": v.a + v.b * v.c - v.d / v.c, "p2": (v.a + v.b) * v.c,
                "p3": v.a - v.b - v.c, "p4": v.a / v.c / v.d, "p5": -v.a * v.b,
                "p6": -(v.a + v.b), "p7": v.a + v.b}, {"c": nonzero, "d": nonzero})
case("comments_blank_lines", """
    # a program with comments everywhere

    input x: f32[2, 8]    # trailing comment
    # between statements
    y = relu(x) * 3  # another

    output y   # done
""", lambda v: {"y": relu(v.x) * 3})

# -- pointwise chains (the fusion seeds; the interpreter must agree)
case("chain_seed", """
    input x: f32[8, 16]
    y = sin(relu(x + 1) * 2)
    output y
""", lambda v: {"y": np.sin(relu(v.x + 1) * 2)})
case("wall_seed", """
    input x: f32[8, 16]
    y = relu(x - mean(x))
    output y
""", lambda v: {"y": relu(v.x - v.x.mean())})
case("wall_shared_chain", """
    input x: f32[8, 16]
    t = relu(x * 2 + 1)
    y = relu(t - mean(t)) * 3
    output y
""", lambda v: (lambda t: {"y": relu(t - t.mean()) * 3})(relu(v.x * 2 + 1)))


def long_chain_prog(n):
    lines = ["input x: f32[4, 16]", "t0 = tanh(x)"]
    for i in range(1, n):
        lines.append(f"t{i} = tanh(t{i - 1} * 1.25 + 0.125)")
    lines.append(f"output t{n - 1}")
    return "\n".join(lines)


def long_chain_ref(v, n):
    t = np.tanh(v.x)
    for _ in range(1, n):
        t = np.tanh(t * 1.25 + 0.125)
    return {f"t{n - 1}": t}


case("long_chain", long_chain_prog(40), lambda v: long_chain_ref(v, 40))
case("multi_output_shared", """
    input x: f32[6, 10]
    t = exp(x) - 1
    a = t * t
    b = sum(t, dim=1)
    c = t
    output a, b, c
""", lambda v: (lambda t: {"a": t * t, "b": t.sum(1), "c": t})(np.exp(v.x) - 1))

# -- weights
case("weight_file", """
    input x: f32[3, 6]
    weight w: f32[6] = file("w.npy")
    weight m: f32[3, 1] = file("m.npy")
    y = x * w + m
    output y
""", lambda v: {"y": v.x * v.w + v.m})
case("weight_ones_zeros", """
    input x: f32[3, 4]
    weight o: f32[4] = ones
    weight z: f32[3, 4] = zeros
    y = x * o + z + 1
    output y
""", lambda v: {"y": v.x + 1})

# -- reductions
case("sum_dim", """
    input x: f32[4, 6]
    a = sum(x, dim=1)
    b = sum(x, 0)
    output a, b
""", lambda v: {"a": v.x.sum(1), "b": v.x.sum(0)})
case("sum_keepdim_list", """
    input x: f32[3, 4, 5]
    y = sum(x, dim=[0, 2], keepdim=true)
    z = sum(x, dim=[2, 0])
    output y, z
""", lambda v: {"y": red(np.sum, v.x, [0, 2], True), "z": red(np.sum, v.x, [0, 2])})
case("sum_all", """
    input x: f32[5, 7]
    y = sum(x)
    k = sum(x, keepdim=true)
    output y, k
""", lambda v: {"y": v.x.sum(), "k": v.x.sum(keepdims=True)})
case("sum_neg_dims", """
    input x: f32[2, 3, 4, 5]
    a = sum(x, dim=-1)
    b = sum(x, dim=[-1, -3], keepdim=true)
    c = sum(x, dim=[0, -2])
    output a, b, c
""", lambda v: {"a": v.x.sum(-1), "b": red(np.sum, v.x, [-1, -3], True),
                "c": red(np.sum, v.x, [0, -2])})
case("sum_every_dim_list", """
    input x: f32[2, 3, 4]
    y = sum(x, dim=[0, 1, 2])
    output y
""", lambda v: {"y": v.x.sum()})
case("sum_large", """
    input x: f32[64, 64]
    a = sum(x)
    r = sum(x, dim=1)
    c = sum(x, dim=0)
    output a, r, c
""", lambda v: {"a": v.x.sum(), "r": v.x.sum(1), "c": v.x.sum(0)})
case("mean_dims", """
    input x: f32[2, 3, 4, 5]
    a = mean(x, dim=[0, 2, 3], keepdim=true)
    b = mean(x)
    c = mean(x, dim=-1)
    d = mean(x, dim=[-1, -2])
    output a, b, c, d
""", lambda v: {"a": red(np.mean, v.x, [0, 2, 3], True), "b": v.x.mean(),
                "c": v.x.mean(-1), "d": red(np.mean, v.x, [-1, -2])})
case("amax_amin", """
    input x: f32[5, 6]
    a = amax(x, dim=1)
    b = amin(x, dim=0, keepdim=true)
    c = amax(x)
    d = amin(x)
    output a, b, c, d
""", lambda v: {"a": v.x.max(1), "b": v.x.min(0, keepdims=True),
                "c": v.x.max(), "d": v.x.min()})
case("amax_amin_rank3", """
    input x: f32[3, 4, 5]
    a = amax(x, dim=[0, 2])
    b = amin(x, dim=[-1, 0], keepdim=true)
    output a, b
""", lambda v: {"a": red(np.max, v.x, [0, 2]), "b": red(np.min, v.x, [-1, 0], True)})
case("prod", """
    input x: f32[3, 4, 5]
    a = prod(x, dim=-1, keepdim=true)
    b = prod(x, dim=[0, 1])
    c = prod(x, dim=1)
    output a, b, c
""", lambda v: {"a": v.x.prod(-1, keepdims=True), "b": red(np.prod, v.x, [0, 1]),
                "c": v.x.prod(1)}, {"x": uniform(0.6, 1.5)})
case("prod_all_signed", """
    input x: f32[2, 6]
    y = prod(x)
    output y
""", lambda v: {"y": v.x.prod()}, {"x": nonzero})
case("rowsum_seed", """
    input x: f32[8, 16]
    y = sum(relu(x + 1), dim=1)
    output y
""", lambda v: {"y": relu(v.x + 1).sum(1)})
case("siblings_seed", """
    input x: f32[8, 16]
    m = amax(x, dim=1)
    s = sum(x, dim=1)
    output m, s
""", lambda v: {"m": v.x.max(1), "s": v.x.sum(1)})
case("layout_seed", """
    input x: f32[8, 16]
    r = sum(x, dim=1)
    c = sum(x, dim=0)
    output r, c
""", lambda v: {"r": v.x.sum(1), "c": v.x.sum(0)})
case("reduce_of_reduce", """
    input x: f32[3, 4, 5]
    y = amax(sum(x, dim=2), dim=0)
    z = mean(amin(x, dim=1, keepdim=true), dim=[0, 2])
    output y, z
""", lambda v: {"y": v.x.sum(2).max(0), "z": red(np.mean, v.x.min(1, keepdims=True), [0, 2])})
case("center_keepdim", """
    input x: f32[6, 9]
    c = x - mean(x, dim=1, keepdim=true)
    n = c / sqrt(mean(c * c, dim=1, keepdim=true) + 1e-5)
    output c, n
""", lambda v: (lambda c: {"c": c, "n": c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)})(
    v.x - v.x.mean(1, keepdims=True)))

# -- composites
case("softmax_2d", """
    input x: f32[4, 8]
    y = softmax(x, dim=1)
    output y
""", lambda v: {"y": softmax(v.x, 1)})
case("softmax_rank4", """
    input x: f32[2, 3, 4, 5]
    a = softmax(x, 1)
    b = softmax(x, dim=-1)
    output a, b
""", lambda v: {"a": softmax(v.x, 1), "b": softmax(v.x, -1)})
case("softmax_large_values", """
    input x: f32[3, 16]
    y = softmax(x * 30, dim=-1)
    output y
""", lambda v: {"y": softmax(f32(f32(v.x) * np.float32(30)).astype(np.float64), -1)},
    {"x": normal(3.0)})
case("softmax_dim0_rank3", """
    input x: f32[5, 3, 4]
    y = softmax(x, dim=0)
    output y
""", lambda v: {"y": softmax(v.x, 0)})
case("log_softmax", """
    input x: f32[3, 7]
    a = log_softmax(x, dim=-1)
    b = log_softmax(x, 0)
    output a, b
""", lambda v: {"a": log_softmax(v.x, -1), "b": log_softmax(v.x, 0)}, {"x": normal(2.0)})
case("log_softmax_rank3", """
    input x: f32[2, 6, 5]
    y = log_softmax(x, dim=1)
    output y
""", lambda v: {"y": log_softmax(v.x, 1)})
case("layer_norm_affine", """
    input x: f32[4, 8]
    weight w: f32[8] = file("w.npy")
    weight b: f32[8] = file("b.npy")
    y = layer_norm(x, [8], w, b)
    output y
""", lambda v: {"y": layer_norm(v.x, [8], v.w, v.b)})
case("layer_norm_plain_rank3", """
    input x: f32[2, 5, 12]
    y = layer_norm(x, [12])
    output y
""", lambda v: {"y": layer_norm(v.x, [12])}, {"x": normal(3.0)})
case("layer_norm_2d_shape", """
    input x: f32[2, 3, 4, 6]
    input w: f32[4, 6]
    input b: f32[4, 6]
    y = layer_norm(x, [4, 6], w, b)
    output y
""", lambda v: {"y": layer_norm(v.x, [4, 6], v.w, v.b)})
case("layer_norm_eps_weight_only", """
    input x: f32[6, 10]
    input w: f32[10]
    y = layer_norm(x, [10], w, eps=1e-3)
    output y
""", lambda v: {"y": layer_norm(v.x, [10], v.w, eps=1e-3)}, {"x": normal(0.1)})
case("layer_norm_bias_kw", """
    input x: f32[3, 8]
    input b: f32[8]
    y = layer_norm(x, [8], bias=b)
    output y
""", lambda v: {"y": layer_norm(v.x, [8], b=v.b)})
case("batch_norm_rank4", """
    input x: f32[2, 3, 4, 5]
    input m: f32[3]
    input v: f32[3]
    input w: f32[3]
    input b: f32[3]
    y = batch_norm(x, m, v, w, b)
    output y
""", lambda v: {"y": batch_norm(v.x, v.m, v.v, v.w, v.b)}, {"v": positive})
case("batch_norm_rank2_plain", """
    input x: f32[6, 4]
    input m: f32[4]
    input v: f32[4]
    y = batch_norm(x, m, v)
    output y
""", lambda v: {"y": batch_norm(v.x, v.m, v.v)}, {"v": positive})
case("batch_norm_rank3_file_eps", """
    input x: f32[2, 5, 7]
    weight m: f32[5] = file("m.npy")
    weight v: f32[5] = file("v.npy")
    weight w: f32[5] = file("w.npy")
    weight b: f32[5] = file("b.npy")
    y = batch_norm(x, m, v, w, b, eps=1e-3)
    output y
""", lambda v: {"y": batch_norm(v.x, v.m, v.v, v.w, v.b, eps=1e-3)},
    {"v": uniform(0.01, 2.0)})
case("composites_chain", """
    input x: f32[4, 6, 8]
    g = gelu(layer_norm(x, [8]))
    s = softmax(silu(g), dim=-1)
    c = clamp(mean(s, dim=[0, 1]), min=0.1, max=0.15)
    output s, c
""", lambda v: (lambda s: {"s": s, "c": clamp(red(np.mean, s, [0, 1]), 0.1, 0.15)})(
    softmax(silu(gelu(layer_norm(v.x, [8]))), -1)))

# -- views
case("transpose_out", """
    input x: f32[3, 5]
    y = transpose(x, 0, 1)
    output y
""", lambda v: {"y": v.x.T})
case("transpose_rank3_neg", """
    input x: f32[2, 3, 4]
    a = transpose(x, 0, 2)
    b = transpose(x, -1, -2)
    output a, b
""", lambda v: {"a": v.x.transpose(2, 1, 0), "b": v.x.transpose(0, 2, 1)})
case("permute", """
    input x: f32[2, 3, 4]
    a = permute(x, [2, 0, 1])
    b = permute(x, [-1, 1, 0])
    output a, b
""", lambda v: {"a": v.x.transpose(2, 0, 1), "b": v.x.transpose(2, 1, 0)})
case("reshape_infer", """
    input x: f32[4, 6]
    a = reshape(x, [-1, 4])
    b = reshape(x, [2, -1, 3])
    c = reshape(x, [-1])
    output a, b, c
""", lambda v: {"a": v.x.reshape(-1, 4), "b": v.x.reshape(2, -1, 3), "c": v.x.reshape(-1)})
case("reshape_rank0", """
    input s: f32[]
    input x: f32[1, 1]
    a = reshape(s, [1, 1]) + x
    b = reshape(x, [])
    output a, b
""", lambda v: {"a": v.s.reshape(1, 1) + v.x, "b": v.x.reshape(())})
case("reshape_of_transpose", """
    input x: f32[3, 4]
    a = reshape(transpose(x, 0, 1), [-1])
    b = reshape(transpose(x, 0, 1), [2, 6])
    output a, b
""", lambda v: {"a": v.x.T.reshape(-1), "b": v.x.T.reshape(2, 6)})
case("reshape_of_permute_rank4", """
    input x: f32[2, 3, 4, 5]
    y = reshape(permute(x, [0, 2, 1, 3]), [8, 15])
    output y
""", lambda v: {"y": v.x.transpose(0, 2, 1, 3).reshape(8, 15)})
case("transpose_of_reshape", """
    input x: f32[24]
    y = transpose(reshape(x, [4, 6]), 0, 1)
    z = contiguous(y) * 2
    output y, z
""", lambda v: {"y": v.x.reshape(4, 6).T, "z": v.x.reshape(4, 6).T * 2})
case("expand", """
    input x: f32[3, 1]
    a = expand(x, [3, 4])
    b = expand(x, [2, -1, 5])
    output a, b
""", lambda v: {"a": np.broadcast_to(v.x, (3, 4)), "b": np.broadcast_to(v.x, (2, 3, 5))})
case("expand_compute", """
    input x: f32[1, 4]
    input y: f32[3, 4]
    e = expand(x, [3, 4])
    s = sum(e * y, dim=0)
    t = sum(expand(x, [5, 3, 4]), dim=[0, 1])
    output s, t
""", lambda v: {"s": (v.x * v.y).sum(0), "t": v.x[0] * 15})
case("slice_basic", """
    input x: f32[5, 8]
    a = slice(x, 1, 1, 4)
    b = slice(x, 0, 0, 5, step=2)
    c = slice(x, 1, -3, 100)
    d = slice(x, -1, 2, 8, step=3)
    output a, b, c, d
""", lambda v: {"a": v.x[:, 1:4], "b": v.x[0:5:2], "c": v.x[:, -3:100], "d": v.x[:, 2:8:3]})
case("slice_negative_bounds", """
    input x: f32[10, 3]
    a = slice(x, 0, -7, -1, step=2)
    b = slice(x, 0, -100, 4)
    output a, b
""", lambda v: {"a": v.x[-7:-1:2], "b": v.x[-100:4]})
case("slice_of_transpose", """
    input x: f32[4, 6]
    y = slice(transpose(x, 0, 1), 0, 1, 6, step=2)
    output y
""", lambda v: {"y": v.x.T[1:6:2]})
case("reshape_of_slice", """
    input x: f32[6, 8]
    y = reshape(slice(x, 1, 0, 8, step=2), [4, 6])
    z = reshape(slice(x, 0, 1, 5), [-1])
    output y, z
""", lambda v: {"y": v.x[:, 0:8:2].reshape(4, 6), "z": v.x[1:5].reshape(-1)})
case("views_composed", """
    input x: f32[2, 3, 4]
    input y: f32[4, 3]
    p = permute(x, [2, 1, 0])
    s = slice(p, 0, 1, 4)
    r = reshape(s, [3, -1])
    t = transpose(y, 0, 1)
    z = r + expand(slice(t, 1, 0, 1), [3, 6])
    output z
""", lambda v: {"z": v.x.transpose(2, 1, 0)[1:4].reshape(3, -1)
                + np.broadcast_to(v.y.T[:, 0:1], (3, 6))})
case("view_pointwise_mix", """
    input x: f32[3, 5]
    input y: f32[5, 3]
    a = transpose(x, 0, 1) + y
    b = x * transpose(y, 1, 0)
    output a, b
""", lambda v: {"a": v.x.T + v.y, "b": v.x * v.y.T})
case("contiguous", """
    input x: f32[3, 4, 2]
    c = contiguous(permute(x, [1, 2, 0]))
    r = reshape(c, [4, 6])
    output c, r
""", lambda v: {"c": v.x.transpose(1, 2, 0), "r": v.x.transpose(1, 2, 0).reshape(4, 6)})
case("reduce_over_views", """
    input x: f32[4, 6]
    a = sum(transpose(x, 0, 1), dim=1)
    b = amax(slice(x, 1, 1, 6, step=2), dim=0)
    c = mean(reshape(x, [2, 12]), dim=-1)
    output a, b, c
""", lambda v: {"a": v.x.T.sum(1), "b": v.x[:, 1:6:2].max(0), "c": v.x.reshape(2, 12).mean(-1)})

# -- matmul
case("mm_odd_file_weight", """
    input x: f32[7, 13]
    weight w: f32[13, 5] = file("w.npy")
    y = matmul(x, w)
    output y
""", lambda v: {"y": v.x @ v.w})
case("mm_infix", """
    input a: f32[6, 9]
    input b: f32[9, 4]
    y = a @ b
    z = a @ b + 1
    output y, z
""", lambda v: {"y": v.a @ v.b, "z": v.a @ v.b + 1})
case("mm_1d_2d", """
    input a: f32[6]
    input b: f32[6, 5]
    y = matmul(a, b)
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_2d_1d", """
    input a: f32[4, 7]
    input b: f32[7]
    y = a @ b
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_1d_1d", """
    input a: f32[9]
    input b: f32[9]
    y = matmul(a, b)
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_batched_broadcast", """
    input a: f32[2, 1, 3, 4]
    input b: f32[5, 4, 6]
    y = matmul(a, b)
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_batched_3d_2d", """
    input a: f32[3, 4, 5]
    input b: f32[5, 2]
    y = a @ b
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_1d_batched", """
    input a: f32[4]
    input b: f32[2, 4, 5]
    input c: f32[2, 3, 4]
    y = a @ b
    z = c @ a
    output y, z
""", lambda v: {"y": v.a @ v.b, "z": v.c @ v.a})
case("mm_transposed_operands", """
    input a: f32[5, 3]
    input b: f32[4, 5]
    x = transpose(a, 0, 1) @ transpose(b, 0, 1)
    y = b @ expand(slice(a, 1, 0, 1), [5, 7])
    output x, y
""", lambda v: {"x": v.a.T @ v.b.T, "y": v.b @ np.broadcast_to(v.a[:, 0:1], (5, 7))})
case("mm_batched_permuted", """
    input q: f32[2, 3, 4, 5]
    input k: f32[2, 3, 6, 5]
    s = q @ transpose(k, -1, -2)
    p = softmax(s * 0.5, dim=-1)
    output s, p
""", lambda v: (lambda s: {"s": s, "p": softmax(s * 0.5, -1)})(v.q @ v.k.swapaxes(-1, -2)))
case("mm_sliced_operand", """
    input a: f32[6, 10]
    input b: f32[8, 3]
    y = slice(a, 1, 1, 9) @ b
    z = slice(slice(a, 0, 0, 6, step=2), 1, 2, 10) @ slice(b, 1, 1, 3)
    output y, z
""", lambda v: {"y": v.a[:, 1:9] @ v.b, "z": v.a[0:6:2, 2:10] @ v.b[:, 1:3]})
case("mm_odd_transposed_weight", """
    input x: f32[11, 5]
    weight w: f32[11, 13] = file("w.npy")
    y = transpose(w, 0, 1) @ x
    z = transpose(x, 0, 1) @ slice(w, 1, 2, 9)
    output y, z
""", lambda v: {"y": v.w.T @ v.x, "z": v.x.T @ v.w[:, 2:9]})
case("mm_batch_broadcast_transposed", """
    input a: f32[3, 1, 4, 5]
    input b: f32[2, 6, 5]
    y = a @ transpose(b, -1, -2)
    output y
""", lambda v: {"y": v.a @ v.b.swapaxes(-1, -2)})
case("extern_seed", """
    input x: f32[8, 12]
    weight w: f32[12, 10] = file("w.npy")
    y = relu((x + 1) @ w)
    output y
""", lambda v: {"y": relu((v.x + 1) @ v.w)})
case("mlp_block", """
    input x: f32[5, 16]
    weight w1: f32[16, 24] = file("w1.npy")
    weight b1: f32[24] = file("b1.npy")
    weight w2: f32[24, 8] = file("w2.npy")
    h = gelu(x @ w1 + b1)
    y = layer_norm(h @ w2 + x @ slice(w1, 1, 0, 8), [8])
    output y
""", lambda v: {"y": layer_norm(gelu(v.x @ v.w1 + v.b1) @ v.w2 + v.x @ v.w1[:, 0:8], [8])},
    {"w1": normal(0.25), "w2": normal(0.2)})

# -- conv2d
case("conv_1x1", """
    input x: f32[2, 4, 5, 5]
    input w: f32[6, 4, 1, 1]
    y = conv2d(x, w)
    output y
""", lambda v: {"y": conv2d(v.x, v.w)})
case("conv_3x3_pad_bias", """
    input x: f32[1, 3, 8, 8]
    input w: f32[4, 3, 3, 3]
    input b: f32[4]
    y = conv2d(x, w, b, padding=1)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, padding=1)})
case("conv_7x7_stride2", """
    input x: f32[1, 3, 16, 16]
    weight w: f32[4, 3, 7, 7] = file("w.npy")
    weight b: f32[4] = file("b.npy")
    y = conv2d(x, w, b, stride=2, padding=3)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, stride=2, padding=3)}, {"w": normal(0.2)})
case("conv_stride2_nopad", """
    input x: f32[2, 2, 9, 9]
    input w: f32[3, 2, 3, 3]
    y = conv2d(x, w, stride=2)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, stride=2)})
case("conv_dilation2", """
    input x: f32[1, 2, 10, 10]
    input w: f32[3, 2, 3, 3]
    input b: f32[3]
    y = conv2d(x, w, b, padding=2, dilation=2)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, padding=2, dilation=2)})
case("conv_groups2", """
    input x: f32[2, 4, 6, 6]
    input w: f32[6, 2, 3, 3]
    input b: f32[6]
    y = conv2d(x, w, b, padding=1, groups=2)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, padding=1, groups=2)})
case("conv_depthwise", """
    input x: f32[1, 5, 7, 7]
    input w: f32[5, 1, 3, 3]
    y = conv2d(x, w, stride=1, padding=1, groups=5)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, padding=1, groups=5)})
case("conv_depthwise_mult_stride2", """
    input x: f32[2, 3, 8, 8]
    input w: f32[6, 1, 5, 5]
    input b: f32[6]
    y = conv2d(x, w, b, stride=2, padding=2, groups=3)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, stride=2, padding=2, groups=3)})
case("conv_nonsquare_lists", """
    input x: f32[2, 3, 7, 11]
    input w: f32[4, 3, 3, 5]
    input b: f32[4]
    y = conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[1, 2])
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b, stride=(2, 1), padding=(1, 2), dilation=(1, 2))})
case("conv_nonsquare_input", """
    input x: f32[1, 2, 5, 12]
    input w: f32[2, 2, 3, 3]
    y = conv2d(x, w, padding=1, stride=2)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, padding=1, stride=2)})
case("conv_bn_relu_const", """
    input x: f32[1, 3, 8, 8]
    weight w: f32[8, 3, 3, 3] = file("w.npy")
    weight m: f32[8] = file("m.npy")
    weight v: f32[8] = file("v.npy")
    weight g: f32[8] = file("g.npy")
    weight b: f32[8] = file("b.npy")
    y = relu(batch_norm(conv2d(x, w, padding=1), m, v, g, b))
    output y
""", lambda v: {"y": relu(batch_norm(conv2d(v.x, v.w, padding=1), v.m, v.v, v.g, v.b))},
    {"v": positive})
case("conv_bn_fold_groups_bias", """
    input x: f32[2, 4, 7, 7]
    weight w: f32[6, 2, 3, 3] = file("w.npy")
    weight cb: f32[6] = file("cb.npy")
    weight m: f32[6] = file("m.npy")
    weight v: f32[6] = file("v.npy")
    weight g: f32[6] = file("g.npy")
    y = batch_norm(conv2d(x, w, cb, stride=2, padding=1, groups=2), m, v, g)
    output y
""", lambda v: {"y": batch_norm(conv2d(v.x, v.w, v.cb, stride=2, padding=1, groups=2),
                                v.m, v.v, v.g)}, {"v": positive})
case("conv_bn_relu_runtime", """
    input x: f32[1, 3, 6, 6]
    weight w: f32[4, 3, 3, 3] = file("w.npy")
    input m: f32[4]
    input v: f32[4]
    input g: f32[4]
    input b: f32[4]
    y = relu(batch_norm(conv2d(x, w, padding=1), m, v, g, b))
    output y
""", lambda v: {"y": relu(batch_norm(conv2d(v.x, v.w, padding=1), v.m, v.v, v.g, v.b))},
    {"v": positive})
case("conv_depthwise_7x7_bn", """
    input x: f32[1, 4, 12, 12]
    weight w: f32[4, 1, 7, 7] = file("w.npy")
    weight m: f32[4] = file("m.npy")
    weight v: f32[4] = file("v.npy")
    y = relu(batch_norm(conv2d(x, w, stride=2, padding=3, groups=4), m, v, eps=1e-3))
    output y
""", lambda v: {"y": relu(batch_norm(conv2d(v.x, v.w, stride=2, padding=3, groups=4),
                                     v.m, v.v, eps=1e-3))}, {"v": positive, "w": normal(0.3)})
case("conv_residual", """
    input x: f32[1, 4, 6, 6]
    input w: f32[4, 4, 3, 3]
    input b: f32[4]
    y = relu(conv2d(x, w, b, padding=1) + x)
    p = mean(y, dim=[2, 3])
    output y, p
""", lambda v: (lambda y: {"y": y, "p": red(np.mean, y, [2, 3])})(
    relu(conv2d(v.x, v.w, v.b, padding=1) + v.x)), {"w": normal(0.3)})
case("conv_of_view", """
    input x: f32[1, 6, 2, 3]
    input w: f32[2, 2, 2, 2]
    y = conv2d(reshape(transpose(x, 1, 3), [1, 2, 6, 3]), w)
    output y
""", lambda v: {"y": conv2d(v.x.transpose(0, 3, 2, 1).reshape(1, 2, 6, 3), v.w)})


# -- gather (numpy.take) and conv_transpose2d
case("gather_axis0_1d", """
    input x: f32[5, 4]
    input i: f32[3]
    y = gather(x, i)
    output y
""", lambda v: {"y": gather(v.x, v.i)}, {"i": ints(-5, 4)})
case("gather_axis1_2d_relu", """
    input x: f32[3, 6, 2]
    input i: f32[2, 4]
    y = gather(x, i, axis=1)
    z = relu(y) * 2
    output y, z
""", lambda v: (lambda y: {"y": y, "z": relu(y) * 2})(gather(v.x, v.i, 1)), {"i": ints(-6, 5)})
case("gather_axis_neg1_scalar_index", """
    input x: f32[2, 3, 7]
    input i: f32[]
    y = gather(x, i, axis=-1)
    output y
""", lambda v: {"y": gather(v.x, v.i, -1)}, {"i": ints(-7, 6)})
case("gather_negative_only", """
    input x: f32[4, 3]
    input i: f32[2, 2]
    y = gather(x, i, -1)
    output y
""", lambda v: {"y": gather(v.x, v.i, -1)}, {"i": ints(-3, -1)})
case("gather_of_views", """
    input x: f32[4, 5]
    input i: f32[6]
    y = gather(transpose(x, 0, 1), reshape(i, 2, 3), axis=1)
    output y
""", lambda v: {"y": gather(v.x.T, v.i.reshape(2, 3), 1)}, {"i": ints(-4, 3)})
case("gather_embedding", """
    weight e: f32[10, 8] = file("e.npy")
    input t: f32[2, 5]
    input b: f32[8]
    y = gather(e, t) * 2 + b
    output y
""", lambda v: {"y": gather(v.e, v.t) * 2 + v.b}, {"t": ints(0, 9)})
case("convt_stride2_pad_outpad_bias", """
    input x: f32[1, 3, 4, 4]
    weight w: f32[3, 2, 3, 3] = file("w.npy")
    input b: f32[2]
    y = conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)
    output y
""", lambda v: {"y": conv_transpose2d(v.x, v.w, v.b, 2, 1, 1)})
case("convt_groups_dilation_lists", """
    input x: f32[2, 4, 5, 3]
    weight w: f32[4, 3, 3, 2] = file("w.npy")
    input b: f32[6]
    y = conv_transpose2d(x, w, b, stride=[2, 3], padding=[1, 0], output_padding=[1, 2], groups=2, dilation=[1, 2])
    output y
""", lambda v: {"y": conv_transpose2d(v.x, v.w, v.b, (2, 3), (1, 0), (1, 2), 2, (1, 2))})
case("convt_plain_odd", """
    input x: f32[1, 2, 3, 5]
    input w: f32[2, 3, 2, 4]
    y = conv_transpose2d(x, w)
    output y
""", lambda v: {"y": conv_transpose2d(v.x, v.w)})
case("convt_depthwise_relu", """
    input x: f32[1, 3, 5, 4]
    weight w: f32[3, 1, 3, 3] = file("w.npy")
    y = relu(conv_transpose2d(x, w, None, 2, 1, 0, 3))
    output y
""", lambda v: {"y": relu(conv_transpose2d(v.x, v.w, None, 2, 1, 0, 3))})
case("convt_outpad_below_dilation", """
    input x: f32[1, 2, 4, 3]
    input w: f32[2, 2, 3, 2]
    y = conv_transpose2d(x, w, padding=[2, 1], output_padding=1, dilation=2)
    output y
""", lambda v: {"y": conv_transpose2d(v.x, v.w, None, 1, (2, 1), 1, 1, 2)})
case("convt_1x1_stride3_groups", """
    input x: f32[2, 6, 3, 3]
    input w: f32[6, 2, 1, 1]
    input b: f32[6]
    y = conv_transpose2d(x, w, b, stride=3, output_padding=2, groups=3)
    output y
""", lambda v: {"y": conv_transpose2d(v.x, v.w, v.b, 3, 0, 2, 3)})

# -- corners: literal operands, size-1 and rank-6 shapes, degenerate sizes
case("literal_first_operand", """
    input x: f32[3, 5]
    a = pow(2, x)
    b = maximum(x, 0.5)
    c = minimum(1, x)
    d = where(x > 0, 1, -1)
    output a, b, c, d
""", lambda v: {"a": 2.0 ** v.x, "b": np.maximum(v.x, 0.5), "c": np.minimum(1.0, v.x),
                "d": np.where(v.x > 0, 1.0, -1.0)})
case("pow_negative_base_int_exp", """
    input x: f32[4, 6]
    sq = pow(x, 2)
    cu = pow(x, 3)
    inv = pow(x, -1)
    output sq, cu, inv
""", lambda v: {"sq": v.x ** 2, "cu": v.x ** 3, "inv": v.x ** -1.0}, {"x": nonzero})
case("rank6", """
    input x: f32[2, 1, 3, 2, 1, 4]
    input y: f32[3, 1, 2, 5, 1]
    p = permute(x, [5, 4, 3, 2, 1, 0])
    s = sum(x, dim=[1, 3, -1], keepdim=true)
    z = x + y
    m = amax(z, dim=[0, 2, 4])
    output p, s, m
""", lambda v: {"p": v.x.transpose(5, 4, 3, 2, 1, 0), "s": red(np.sum, v.x, [1, 3, -1], True),
                "m": red(np.max, v.x + v.y, [0, 2, 4])})
case("size1_dims", """
    input x: f32[4, 1, 5]
    a = softmax(x, dim=1)
    b = amax(x, dim=1)
    c = layer_norm(x, [1, 5])
    d = sum(x, dim=[1], keepdim=true) * x
    output a, b, c, d
""", lambda v: {"a": softmax(v.x, 1), "b": v.x.max(1), "c": layer_norm(v.x, [1, 5]),
                "d": v.x.sum(1, keepdims=True) * v.x})
case("rank0_reductions_views", """
    input s: f32[]
    a = sum(s)
    b = mean(s) + amax(s)
    e = expand(s, [2, 3])
    r = reshape(s, [1])
    output a, b, e, r
""", lambda v: {"a": v.s, "b": v.s + v.s, "e": np.broadcast_to(v.s, (2, 3)),
                "r": v.s.reshape(1)})
case("slice_big_step", """
    input x: f32[7, 4]
    a = slice(x, 0, 0, 7, step=20)
    b = slice(x, 0, 1, 7, step=5)
    c = slice(x, 1, 3, 4)
    output a, b, c
""", lambda v: {"a": v.x[0:7:20], "b": v.x[1:7:5], "c": v.x[:, 3:4]})
case("mm_2d_3d_broadcast", """
    input a: f32[3, 4]
    input b: f32[2, 4, 5]
    y = a @ b
    output y
""", lambda v: {"y": v.a @ v.b})
case("mm_unit_dims", """
    input a: f32[1, 6]
    input b: f32[6, 1]
    outer = b @ a
    inner = a @ b
    output outer, inner
""", lambda v: {"outer": v.b @ v.a, "inner": v.a @ v.b})
case("mm_expanded_batch", """
    input a: f32[1, 3, 4]
    input b: f32[4, 2]
    y = expand(a, [3, 3, 4]) @ expand(b, [3, 4, 2])
    output y
""", lambda v: {"y": np.broadcast_to(v.a, (3, 3, 4)) @ np.broadcast_to(v.b, (3, 4, 2))})
case("conv_stride_gt_kernel", """
    input x: f32[3, 2, 7, 8]
    input w: f32[4, 2, 2, 2]
    y = conv2d(x, w, stride=3)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, stride=3)})
case("conv_output_1x1", """
    input x: f32[2, 3, 5, 5]
    input w: f32[2, 3, 5, 5]
    input b: f32[2]
    y = conv2d(x, w, b)
    output y
""", lambda v: {"y": conv2d(v.x, v.w, v.b)})
case("layer_norm_whole_tensor", """
    input x: f32[3, 4, 5]
    input w: f32[3, 4, 5]
    y = layer_norm(x, [3, 4, 5], w)
    output y
""", lambda v: {"y": layer_norm(v.x, [3, 4, 5], v.w)})
case("weight_reused", """
    input x: f32[4, 4]
    weight w: f32[4, 4] = file("w.npy")
    y = (x @ w) @ w + w
    z = transpose(w, 0, 1) * x
    output y, z
""", lambda v: {"y": (v.x @ v.w) @ v.w + v.w, "z": v.w.T * v.x})
case("output_is_input", """
    input x: f32[2, 3]
    y = x * 2
    output x, y
""", lambda v: {"x": v.x, "y": v.x * 2})
case("bool_input_passthrough", """
    input c: bool[2, 5]
    input x: f32[2, 5]
    k = x > 0
    output c, k
""", lambda v: {"c": v.c, "k": v.x > 0})


# -- f64: inputs of doubles, computed in double (no weights: a .kiln weight
# is f32). The inputs sit near 1000 with small differences, where float
# arithmetic would keep nothing of them.
def near1000(rng, shape):
    return 1000.0 + rng.standard_normal(shape) * 1e-6


case("f64_pointwise", """
    input x: f64[4, 9]
    input y: f64[4, 9]
    d = (x - y) * 1e6
    a = exp(d * 0.1) + sin(d) * cos(d) - tanh(d) + sigmoid(d) + gelu(d) + erf(d)
    b = sqrt(abs(d)) + log(abs(d) + 1.0) + rsqrt(abs(d) + 0.5) + reciprocal(d + 10.0)
    c = pow(abs(d) + 1.0, 0.7) + floor(d * 4.0) + ceil(d) + relu(d - 0.25) + neg(d)
    m = maximum(d, 0.1) - minimum(d, -0.1) + where(d > 0.3, d * 2.0, d / 3.0)
    output a, b, c, m
""", lambda v: (lambda d: {
    "a": np.exp(d * 0.1) + np.sin(d) * np.cos(d) - np.tanh(d) + sigmoid(d) + gelu(d) + erf(d),
    "b": np.sqrt(np.abs(d)) + np.log(np.abs(d) + 1.0) + rsqrt(np.abs(d) + 0.5)
         + 1.0 / (d + 10.0),
    "c": (np.abs(d) + 1.0) ** 0.7 + np.floor(d * 4.0) + np.ceil(d) + relu(d - 0.25) - d,
    "m": np.maximum(d, 0.1) - np.minimum(d, -0.1) + np.where(d > 0.3, d * 2.0, d / 3.0)})(
        (v.x - v.y) * 1e6),
    dist={"x": near1000, "y": near1000})
case("f64_reductions", """
    input x: f64[5, 12]
    s = sum(x, 1)
    p = prod(x * 0.001, 1)
    hi = amax(x, 0)
    lo = amin(x, 1, keepdim=true)
    m = mean(x)
    sm = softmax((x - 1000.0) * 1e6, 1)
    ls = log_softmax((x - 1000.0) * 1e6, 0)
    ln = layer_norm((x - 1000.0) * 1e6, [12])
    output s, p, hi, lo, m, sm, ls, ln
""", lambda v: {"s": v.x.sum(1), "p": (v.x * 0.001).prod(1), "hi": v.x.max(0),
                "lo": v.x.min(1, keepdims=True), "m": v.x.mean(),
                "sm": softmax((v.x - 1000.0) * 1e6, 1), "ls": log_softmax((v.x - 1000.0) * 1e6, 0),
                "ln": layer_norm((v.x - 1000.0) * 1e6, [12])},
    dist={"x": near1000})
case("f64_matmul_views", """
    input a: f64[2, 6, 5]
    input b: f64[5, 3]
    c = matmul(a, b) + 1.0
    t = transpose(a, 1, 2)
    d = cat([t, t * 2.0], 1)
    e = pad(slice(a, 2, 1, 4), [1, 1], value=0.5)
    output c, d, e
""", lambda v: {"c": v.a @ v.b + 1.0,
                "d": np.concatenate([v.a.transpose(0, 2, 1), v.a.transpose(0, 2, 1) * 2.0], 1),
                "e": np.pad(v.a[:, :, 1:4], [(0, 0), (0, 0), (1, 1)], constant_values=0.5)})


# ---- writing the data ------------------------------------------------------

DTYPE = {"f32": np.float32, "f64": np.float64, "bool": np.bool_}


def parse_shape(text):
    text = text.strip()
    return tuple(int(d) for d in text.split(",")) if text else ()


def strip_comment(line):
    return line.split("#", 1)[0].strip()


def declarations(prog):
    """(inputs, weights, outputs) read from a program's text."""
    inputs, weights, outputs = [], [], None
    for line in map(strip_comment, prog.splitlines()):
        m = re.fullmatch(r"input\s+(\w+)\s*:\s*(f32|f64|bool)\s*\[([^\]]*)\]", line)
        if m:
            inputs.append((m[1], m[2], parse_shape(m[3])))
            continue
        m = re.fullmatch(r'weight\s+(\w+)\s*:\s*f32\s*\[([^\]]*)\]\s*=\s*file\("([^"]+)"\)', line)
        if m:
            weights.append((m[1], "f32", parse_shape(m[2]), m[3]))
            continue
        m = re.fullmatch(r"weight\s+(\w+)\s*:\s*f32\s*\[([^\]]*)\]\s*=\s*(ones|zeros)", line)
        if m:
            weights.append((m[1], "f32", parse_shape(m[2]), m[3]))
            continue
        m = re.fullmatch(r"output\s+(.*)", line)
        if m:
            outputs = [o.strip() for o in m[1].split(",")]
    assert outputs, "program has no output line"
    return inputs, weights, outputs


def rng_for(name):
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def check_size(what, shape):
    n = int(np.prod(shape, dtype=np.int64))
    assert n <= MAX_NUMEL, f"{what}: {n} elements > {MAX_NUMEL}"


def draw(c, rng, name, dtype, shape):
    dist = c.dist.get(name, boolean if dtype == "bool" else normal())
    a = np.asarray(dist(rng, shape))
    assert a.shape == shape, (c.name, name, a.shape, shape)
    return a.astype(DTYPE[dtype])


def save(path, a):
    with open(path, "wb") as f:
        np.save(f, a, allow_pickle=False)


# -- pad, cat, negative-step slices, pooling (the ops the ONNX importer needed)
case("pad_constant", """
    input x: f32[3, 4, 5]
    a = pad(x, [1, 2, 0, 3], value=1.5)
    b = pad(x, [2, 2, 1, 1, 1, 0])
    c = pad(x, [-1, 2, 1, -2], value=-3.0)
    output a, b, c
""", lambda v: {"a": torch_pad(v.x, [1, 2, 0, 3], value=1.5),
                "b": torch_pad(v.x, [2, 2, 1, 1, 1, 0]),
                "c": torch_pad(v.x, [-1, 2, 1, -2], value=-3.0)})
case("pad_replicate", """
    input x: f32[2, 3, 4]
    a = pad(x, [2, 3, 1, 0], mode="replicate")
    b = pad(x, [-1, 2, 3, -1], mode="replicate")
    output a, b
""", lambda v: {"a": torch_pad(v.x, [2, 3, 1, 0], "replicate"),
                "b": torch_pad(v.x, [-1, 2, 3, -1], "replicate")})
case("pad_reflect", """
    input x: f32[3, 4, 5]
    a = pad(x, [4, 3, 2, 3], mode="reflect")
    b = pad(x, [1, -2, 0, 1, 2, 1], mode="reflect")
    output a, b
""", lambda v: {"a": torch_pad(v.x, [4, 3, 2, 3], "reflect"),
                "b": torch_pad(v.x, [1, -2, 0, 1, 2, 1], "reflect")})
case("pad_of_pointwise", """
    input x: f32[4, 6]
    p = pad(relu(x) * 2.0, [1, 1, 2, 0], value=-1.0)
    y = p + 1.0
    s = sum(pad(exp(x), [1, 1], mode="reflect"), dim=1)
    output y, s
""", lambda v: {"y": torch_pad(np.maximum(v.x, 0) * 2, [1, 1, 2, 0], value=-1.0) + 1,
                "s": torch_pad(np.exp(v.x), [1, 1], "reflect").sum(1)})
case("cat_three", """
    input a: f32[2, 3, 4]
    input b: f32[2, 1, 4]
    input c: f32[2, 5, 4]
    x = cat([a, b, c], dim=1)
    y = cat([a * 2.0, relu(a), a + 1.0], dim=-1)
    z = sum(cat([exp(c), b], 1), dim=1)
    output x, y, z
""", lambda v: {"x": np.concatenate([v.a, v.b, v.c], 1),
                "y": np.concatenate([v.a * 2, np.maximum(v.a, 0), v.a + 1], -1),
                "z": np.concatenate([np.exp(v.c), v.b], 1).sum(1)})
case("cat_many", """
    input a: f32[2, 3]
    input b: f32[1, 3]
    y = cat([a, b, a, b, a, b, a], dim=0)
    output y
""", lambda v: {"y": np.concatenate([v.a, v.b, v.a, v.b, v.a, v.b, v.a], 0)})
case("slice_negative_step", """
    input x: f32[7, 6]
    input w: f32[6, 4]
    a = slice(x, 1, 5, 1, step=-2)
    b = slice(x, 0, -1, -100, step=-1)
    c = slice(x, 1, 100, -100, step=-3)
    d = matmul(slice(x, 0, -1, -100, step=-1), slice(w, 0, -1, -100, step=-1))
    e = sum(slice(x, 0, 5, 0, step=-2) * 2.0, dim=0)
    output a, b, c, d, e
""", lambda v: {"a": v.x[:, 5:1:-2], "b": v.x[::-1], "c": v.x[:, ::-3],
                "d": v.x[::-1] @ v.w[::-1], "e": (v.x[5:0:-2] * 2).sum(0)})
case("max_pool_1d_2d", """
    input x: f32[2, 3, 11]
    input y: f32[2, 2, 9, 10]
    a = max_pool1d(x, 3, stride=2, padding=1)
    b = max_pool2d(y, 3, stride=2, padding=1, dilation=2, ceil_mode=true)
    c = max_pool2d(relu(y), [2, 3], stride=[2, 3], ceil_mode=true)
    d = max_pool2d(y, 3, stride=1, padding=[0, 1, 1, 0])
    output a, b, c, d
""", lambda v: {"a": pool(v.x, "max", [3], [2], ([1], [1])),
                "b": pool(v.y, "max", [3, 3], [2, 2], ([1, 1], [1, 1]), [2, 2], True),
                "c": pool(np.maximum(v.y, 0), "max", [2, 3], [2, 3], ceil=True),
                "d": pool(v.y, "max", [3, 3], [1, 1], ([0, 1], [1, 0]))})
case("max_pool_3d", """
    input x: f32[1, 2, 5, 6, 7]
    a = max_pool3d(x, 2, ceil_mode=true)
    b = max_pool3d(x, [3, 2, 3], stride=[1, 2, 2], padding=[1, 0, 1])
    output a, b
""", lambda v: {"a": pool(v.x, "max", [2, 2, 2], ceil=True),
                "b": pool(v.x, "max", [3, 2, 3], [1, 2, 2], ([1, 0, 1], [1, 0, 1]))})
case("pool_separable", """
    input x: f32[2, 3, 13, 13]
    input z: f32[1, 2, 4, 6, 7]
    a = max_pool2d(x, 13, stride=1, padding=6)
    b = max_pool2d(relu(x), 5, stride=1, padding=2)
    c = max_pool2d(x, [4, 5], stride=[2, 3], padding=[1, 2], ceil_mode=true)
    d = avg_pool2d(x, 5, stride=1, padding=2, count_include_pad=false)
    e = avg_pool2d(x, 4, stride=2, padding=1, ceil_mode=true)
    f = max_pool3d(z, 3, stride=1, padding=1)
    g = max_pool2d(x, 5, stride=1, padding=4, dilation=2)
    output a, b, c, d, e, f, g
""", lambda v: {"a": pool(v.x, "max", [13, 13], [1, 1], ([6, 6], [6, 6])),
                "b": pool(np.maximum(v.x, 0), "max", [5, 5], [1, 1], ([2, 2], [2, 2])),
                "c": pool(v.x, "max", [4, 5], [2, 3], ([1, 2], [1, 2]), ceil=True),
                "d": pool(v.x, "avg", [5, 5], [1, 1], ([2, 2], [2, 2]), include_pad=False),
                "e": pool(v.x, "avg", [4, 4], [2, 2], ([1, 1], [1, 1]), ceil=True),
                "f": pool(v.z, "max", [3, 3, 3], [1, 1, 1], ([1, 1, 1], [1, 1, 1])),
                "g": pool(v.x, "max", [5, 5], [1, 1], ([4, 4], [4, 4]), [2, 2])})
case("avg_pool", """
    input x: f32[2, 3, 11]
    input y: f32[2, 2, 9, 10]
    input z: f32[1, 2, 5, 6, 7]
    a = avg_pool1d(x, 4, stride=3, padding=2, count_include_pad=false)
    b = avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=true)
    c = avg_pool2d(y, [3, 2], stride=[2, 3], padding=1, ceil_mode=true, count_include_pad=false)
    d = avg_pool3d(z, [2, 3, 2], stride=2, padding=1)
    e = avg_pool2d(y, 3, padding=[1, 0, 0, 1], dilation=2)
    f = avg_pool2d(relu(y) + 1.0, 2)
    output a, b, c, d, e, f
""", lambda v: {"a": pool(v.x, "avg", [4], [3], ([2], [2]), include_pad=False),
                "b": pool(v.y, "avg", [3, 3], [2, 2], ([1, 1], [1, 1]), ceil=True),
                "c": pool(v.y, "avg", [3, 2], [2, 3], ([1, 1], [1, 1]), ceil=True,
                          include_pad=False),
                "d": pool(v.z, "avg", [2, 3, 2], [2, 2, 2], ([1, 1, 1], [1, 1, 1])),
                "e": pool(v.y, "avg", [3, 3], [3, 3], ([1, 0], [0, 1]), [2, 2]),
                "f": pool(np.maximum(v.y, 0) + 1, "avg", [2, 2])})


def write_case(c):
    d = os.path.join(OUT, c.name)
    os.makedirs(d)
    with open(os.path.join(d, "prog.kiln"), "w") as f:
        f.write(c.prog)
    inputs, weights, outputs = declarations(c.prog)
    rng = rng_for(c.name)
    env = {}
    for name, dtype, shape in inputs:
        check_size(f"{c.name}/{name}", shape)
        a = draw(c, rng, name, dtype, shape)
        save(os.path.join(d, name + ".npy"), a)
        env[name] = a if dtype == "bool" else a.astype(np.float64)
    for name, dtype, shape, src in weights:
        check_size(f"{c.name}/{name}", shape)
        if src in ("ones", "zeros"):
            a = (np.ones if src == "ones" else np.zeros)(shape, np.float32)
        else:
            assert src == name + ".npy" and name not in env, (c.name, src)
            a = draw(c, rng, name, dtype, shape)
            save(os.path.join(d, src), a)
        env[name] = a.astype(np.float64)
    with np.errstate(all="raise"):
        got = c.ref(SimpleNamespace(**env))
    assert sorted(got) == sorted(outputs), (c.name, sorted(got), outputs)
    f64 = any(dtype == "f64" for _, dtype, _ in inputs)
    for name in outputs:
        a = np.asarray(got[name])
        a = a if a.dtype == np.bool_ else a.astype(np.float64 if f64 else np.float32)
        check_size(f"{c.name}/expect_{name}", a.shape)
        assert a.dtype == np.bool_ or np.all(np.isfinite(a)), (c.name, name)
        save(os.path.join(d, f"expect_{name}.npy"), a.copy(order="C"))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    torch_crosscheck()
    for c in CASES:
        write_case(c)
    with open(os.path.join(OUT, "index.txt"), "w") as f:
        f.write("".join(c.name + "\n" for c in CASES))
    total = sum(os.path.getsize(os.path.join(r, n))
                for r, _, names in os.walk(OUT) for n in names)
    print(f"{len(CASES)} cases, {total} bytes in {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
