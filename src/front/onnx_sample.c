/*
 * onnx_sample.c -- GridSample (opsets 16 and 20): X (N, C, spatial...)
 * sampled at the grid's normalized points (N, out..., d), nearest, linear
 * or cubic (Keys, a = -0.75), with zeros, border or reflection padding,
 * align_corners either way; 1 to 3 spatial dims.
 *
 * The grid is a run-time tensor, so the sample positions are computed in
 * the graph: each tap of the interpolation (1, 2^d or 4^d of them) is one
 * gather from X laid out (N * spatial, C) at an index computed pointwise
 * from the grid, times its weight; the taps are summed. Semantics follow
 * ONNX's reference (PyTorch's grid_sampler): the point is unnormalized
 * ((g + 1) / 2 (D - 1) aligned, ((g + 1) D - 1) / 2 not), nearest rounds
 * half to even (2-D; half away from zero in 3-D), a point outside the
 * border range [x_min, x_max] ([0, D - 1] aligned, [-0.5, D - 0.5] not)
 * is clamped to [0, D - 1] (border) or reflected into the range
 * (reflection), and each tap outside the image reads 0 (zeros), the
 * nearest edge pixel (border) or its reflection, truncated (reflection).
 */
#include "front/front.h"
#include <math.h>
#include <string.h>

enum { GS_NEAREST, GS_LINEAR, GS_CUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECT };

static kiln_value bin(Graph *g, const char *op, kiln_value a, kiln_value b) {
    return kiln_binary(g, op, a, b);
}

/* trunc(v): toward zero. */
static kiln_value trunc_v(Graph *g, kiln_value v) {
    return kiln_where(g, bin(g, "lt", v, ox_sc(g, 0)), kiln_unary(g, "ceil", v),
                      kiln_unary(g, "floor", v));
}

/* The reference's reflection of v into [lo, hi] (hi > lo): reflected by
 * the near border, as many times as it takes. */
static kiln_value reflect(Graph *g, kiln_value v, double lo, double hi) {
    double rng = hi - lo;
    kiln_value below = bin(g, "lt", v, ox_sc(g, lo)), above = bin(g, "gt", v, ox_sc(g, hi));
    kiln_value dx =
        kiln_where(g, below, bin(g, "sub", ox_sc(g, lo), v), bin(g, "sub", v, ox_sc(g, hi)));
    kiln_value k = kiln_unary(g, "floor", bin(g, "div", dx, ox_sc(g, rng)));
    kiln_value r = bin(g, "sub", dx, bin(g, "mul", k, ox_sc(g, rng)));
    kiln_value odd = bin(g, "ne", kiln_unary(g, "floor", bin(g, "mul", k, ox_sc(g, 0.5))),
                         bin(g, "mul", k, ox_sc(g, 0.5)));
    kiln_value from_lo = bin(g, "add", ox_sc(g, lo), r), from_hi = bin(g, "sub", ox_sc(g, hi), r);
    kiln_value lo_side = kiln_where(g, odd, from_hi, from_lo); /* below */
    kiln_value hi_side = kiln_where(g, odd, from_lo, from_hi); /* above */
    return kiln_where(g, below, lo_side, kiln_where(g, above, hi_side, v));
}

/* Tap index i (an integral value) of a dim of length D: its pixel index,
 * in range, and (zeros padding) a mask of whether it was inside. */
static kiln_value tap_index(Graph *g, kiln_value i, int64_t D, int pad, double lo, double hi,
                            kiln_value *inside) {
    double top = (double)(D - 1);
    *inside = KILN_NONE;
    if (pad == GS_ZEROS)
        *inside = kiln_where(g, bin(g, "ge", i, ox_sc(g, 0)), bin(g, "le", i, ox_sc(g, top)),
                             bin(g, "ge", i, ox_sc(g, 0)));
    if (pad == GS_REFLECT) i = hi > lo ? trunc_v(g, reflect(g, i, lo, hi)) : ox_sc(g, 0);
    return kiln_clamp(g, i, 1, 0, 1, top);
}

/* The tap weights of fraction t: linear 1 - t, t; cubic Keys' four. */
static void tap_weights(Graph *g, int mode, kiln_value t, kiln_value *w) {
    if (mode == GS_LINEAR) {
        w[0] = bin(g, "sub", ox_sc(g, 1), t), w[1] = t;
        return;
    }
    const double A = -0.75;
    for (int k = 0; k < 4; k++) {
        /* distance from the tap: 1 + t, t, 1 - t, 2 - t */
        kiln_value d = k == 0   ? bin(g, "add", t, ox_sc(g, 1))
                       : k == 1 ? t
                       : k == 2 ? bin(g, "sub", ox_sc(g, 1), t)
                                : bin(g, "sub", ox_sc(g, 2), t);
        if (k == 1 || k == 2) /* ((A + 2) d - (A + 3)) d^2 + 1 */
            w[k] =
                bin(g, "add",
                    bin(g, "mul", bin(g, "sub", bin(g, "mul", d, ox_sc(g, A + 2)), ox_sc(g, A + 3)),
                        bin(g, "mul", d, d)),
                    ox_sc(g, 1));
        else /* ((A d - 5 A) d + 8 A) d - 4 A */
            w[k] =
                bin(g, "sub",
                    bin(g, "mul",
                        bin(g, "add",
                            bin(g, "mul",
                                bin(g, "sub", bin(g, "mul", d, ox_sc(g, A)), ox_sc(g, 5 * A)), d),
                            ox_sc(g, 8 * A)),
                        d),
                    ox_sc(g, 4 * A));
    }
}

static bool op_grid_sample(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *gr = ox_in(n, 1);
    int r = x->rank, nd = r - 2;
    if (nd < 1 || nd > 3) return ox_nfail(n, "X must have 1 to 3 spatial dims, not %d", nd);
    if (gr->rank != r || gr->shape[0] != x->shape[0] || gr->shape[r - 1] != nd)
        return ox_nfail(n, "the grid must be (N, out..., %d) with X's N", nd);
    int mode = ox_attr_is(n, "mode", "nearest", false) ? GS_NEAREST
               : ox_attr_is(n, "mode", "bicubic", false) || ox_attr_is(n, "mode", "cubic", false)
                   ? GS_CUBIC
               : ox_attr_is(n, "mode", n->im->opset >= 20 ? "linear" : "bilinear", true) ||
                       ox_attr_is(n, "mode", "linear", false) ||
                       ox_attr_is(n, "mode", "bilinear", false)
                   ? GS_LINEAR
                   : -1;
    int pad = ox_attr_is(n, "padding_mode", "zeros", true)         ? GS_ZEROS
              : ox_attr_is(n, "padding_mode", "border", false)     ? GS_BORDER
              : ox_attr_is(n, "padding_mode", "reflection", false) ? GS_REFLECT
                                                                   : -1;
    if (mode < 0 || pad < 0) return ox_nfail(n, "unknown mode or padding_mode");
    bool align = ox_attr_i(n, "align_corners", 0) != 0;
    int64_t N = x->shape[0], C = x->shape[1], P = 1, os[KILN_MAX_RANK];
    for (int i = 0; i < nd; i++) P *= x->shape[2 + i];
    /* X as (N * P, C) */
    int perm[KILN_MAX_RANK];
    perm[0] = 0;
    for (int i = 0; i < nd; i++) perm[1 + i] = 2 + i;
    perm[r - 1] = 1;
    int64_t flat[2] = {N * P, C};
    kiln_value data = kiln_reshape(g, kiln_permute(g, ox_gin(n, 0), r, perm), 2, flat);
    /* per spatial dim i: the point's coordinate (N, out..., 1), from grid
     * component nd - 1 - i (the grid lists x, y, z: the last dim first) */
    int taps = mode == GS_NEAREST ? 1 : mode == GS_LINEAR ? 2 : 4;
    kiln_value w[3][4], inside[3][4], idx[3][4];
    int64_t stride = P;
    for (int i = 0; i < nd; i++) {
        int64_t D = x->shape[2 + i];
        stride /= D;
        double lo = align ? 0 : -0.5, hi = align ? (double)(D - 1) : (double)D - 0.5;
        kiln_value v = kiln_slice(g, ox_gin(n, 1), r - 1, nd - 1 - i, nd - i, 1);
        v = align ? bin(g, "mul", bin(g, "add", v, ox_sc(g, 1)), ox_sc(g, 0.5 * (double)(D - 1)))
                  : bin(g, "mul",
                        bin(g, "sub",
                            bin(g, "mul", bin(g, "add", v, ox_sc(g, 1)), ox_sc(g, (double)D)),
                            ox_sc(g, 1)),
                        ox_sc(g, 0.5));
        if (mode == GS_NEAREST)
            v = nd == 2 ? ox_round_even(g, v)
                        : kiln_where(g, bin(g, "lt", v, ox_sc(g, 0)),
                                     kiln_unary(g, "ceil", bin(g, "sub", v, ox_sc(g, 0.5))),
                                     kiln_unary(g, "floor", bin(g, "add", v, ox_sc(g, 0.5))));
        kiln_value out = kiln_where(g, bin(g, "lt", v, ox_sc(g, lo)), bin(g, "lt", v, ox_sc(g, lo)),
                                    bin(g, "gt", v, ox_sc(g, hi)));
        if (pad == GS_BORDER)
            v = kiln_where(g, out, kiln_clamp(g, v, 1, 0, 1, (double)(D - 1)), v);
        else if (pad == GS_REFLECT && hi > lo)
            v = reflect(g, v, lo, hi);
        kiln_value f = mode == GS_NEAREST ? trunc_v(g, v) : kiln_unary(g, "floor", v);
        if (mode != GS_NEAREST) tap_weights(g, mode, bin(g, "sub", v, f), w[i]);
        int first = mode == GS_CUBIC ? -1 : 0;
        for (int k = 0; k < taps; k++) {
            kiln_value ti = bin(g, "add", f, ox_sc(g, (double)(first + k)));
            idx[i][k] = bin(g, "mul", tap_index(g, ti, D, pad, lo, hi, &inside[i][k]),
                            ox_sc(g, (double)stride));
        }
    }
    /* n * P, broadcast over the output positions */
    for (int i = 0; i < r; i++) os[i] = i == 0 ? N : 1;
    double *nv = arena_alloc(&n->im->arena, sizeof(double) * (size_t)N);
    if (!nv) return ox_nomem(n);
    for (int64_t b = 0; b < N; b++) nv[b] = (double)(b * P);
    kiln_value nbase = ox_const_tensor(n, r, os, nv);
    if (nbase < 0) return false;
    int64_t is[KILN_MAX_RANK];
    for (int i = 0; i < r - 1; i++) is[i] = gr->shape[i];
    int total = 1;
    for (int i = 0; i < nd; i++) total *= taps;
    kiln_value y = KILN_NONE;
    for (int c = 0; c < total; c++) {
        kiln_value at = nbase, wt = KILN_NONE, ok = KILN_NONE;
        for (int i = 0, rest = c; i < nd; i++, rest /= taps) {
            int k = rest % taps;
            at = bin(g, "add", at, idx[i][k]);
            if (mode != GS_NEAREST) wt = wt < 0 ? w[i][k] : bin(g, "mul", wt, w[i][k]);
            if (inside[i][k] >= 0) ok = ok < 0 ? inside[i][k] : kiln_where(g, ok, inside[i][k], ok);
        }
        kiln_value s = kiln_gather(g, data, kiln_reshape(g, at, r - 1, is), 0); /* (N, out..., C) */
        if (ok >= 0)
            wt = wt < 0 ? kiln_where(g, ok, ox_sc(g, 1), ox_sc(g, 0))
                        : kiln_where(g, ok, wt, ox_sc(g, 0));
        if (wt >= 0) s = bin(g, "mul", s, wt);
        y = y < 0 ? s : bin(g, "add", y, s);
    }
    /* (N, out..., C) -> (N, C, out...) */
    perm[0] = 0, perm[1] = r - 1;
    for (int i = 0; i < nd; i++) perm[2 + i] = 1 + i;
    return ox_set_graph(n, 0, kiln_permute(g, y, r, perm), OT_FLOAT);
}

const OxHandler ox_sample_ops[] = {
    {"GridSample", op_grid_sample},
};
const size_t ox_sample_nops = sizeof ox_sample_ops / sizeof ox_sample_ops[0];
