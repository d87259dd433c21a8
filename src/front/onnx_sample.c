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
    if (!ox_index_fits(n, N * P, "an image batch")) return false;
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

/* RoiAlign (10, 16): for each region (x1, y1, x2, y2 of rois, scaled by
 * spatial_scale, shifted by half a pixel in half_pixel mode, at least 1 x 1
 * in output_half_pixel mode) an output_height x output_width grid of bins,
 * each the average (mode avg) or the largest weighted corner (mode max, as
 * ONNX Runtime) of sampling_ratio^2 bilinear samples, computed as
 * Detectron's RoIAlign does: a sample beyond a pixel outside the image
 * reads 0, one inside is clamped to it. The regions are run-time values,
 * so each sample's four corners are gathers at computed indices from X
 * laid out (N H W, C); sampling_ratio 0 (a number of samples that depends
 * on each region's size) needs the regions known at import. */
static bool op_roi_align(OxNode *n) {
    for (int k = 0; k < 3; k++)
        if (!ox_need_in(n, k)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *rv = ox_in(n, 1), *bv = ox_in(n, 2);
    if (x->rank != 4) return ox_nfail(n, "X must be (N, C, H, W)");
    if (rv->rank != 2 || rv->shape[1] != 4 || bv->rank != 1 || bv->shape[0] != rv->shape[0])
        return ox_nfail(n, "rois must be (R, 4) and batch_indices (R)");
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3], R = rv->shape[0];
    if (!ox_index_fits(n, N * H * W, "an image batch")) return false;
    int64_t oh = ox_attr_i(n, "output_height", 1), ow = ox_attr_i(n, "output_width", 1);
    int64_t sr = ox_attr_i(n, "sampling_ratio", 0);
    double scale = ox_attr_f(n, "spatial_scale", 1);
    bool half =
        n->im->opset >= 16 && ox_attr_is(n, "coordinate_transformation_mode", "half_pixel", true);
    bool maxmode = ox_attr_is(n, "mode", "max", false);
    if (!maxmode && !ox_attr_is(n, "mode", "avg", true))
        return ox_nfail(n, "mode must be avg or max");
    if (oh < 1 || ow < 1 || oh * ow > 4096)
        return ox_nfail(n, "output_height and output_width out of range");
    if (sr < 1)
        return ox_nfail(n, "unsupported: sampling_ratio 0 (the number of samples depends on each "
                           "region's size, known only at run time)");
    if (sr > 8) return ox_nfail(n, "unsupported: sampling_ratio above 8");
    /* X as (N H W, C); the regions' coordinates as (R, 1, 1, 1) */
    int perm[4] = {0, 2, 3, 1};
    int64_t flat[2] = {N * H * W, C}, col[4] = {R, 1, 1, 1};
    kiln_value data = kiln_reshape(g, kiln_permute(g, ox_gin(n, 0), 4, perm), 2, flat);
    kiln_value c[4];
    for (int k = 0; k < 4; k++) {
        c[k] = kiln_reshape(g, kiln_slice(g, ox_gin(n, 1), 1, k, k + 1, 1), 4, col);
        c[k] = bin(g, "sub", bin(g, "mul", c[k], ox_sc(g, scale)), ox_sc(g, half ? 0.5 : 0));
    }
    kiln_value rw = bin(g, "sub", c[2], c[0]), rh = bin(g, "sub", c[3], c[1]);
    if (!half) rw = kiln_clamp(g, rw, 1, 1, 0, 0), rh = kiln_clamp(g, rh, 1, 1, 0, 0);
    kiln_value bw = bin(g, "mul", rw, ox_sc(g, 1.0 / (double)ow));
    kiln_value bh = bin(g, "mul", rh, ox_sc(g, 1.0 / (double)oh));
    int64_t bs[4] = {R, 1, 1, 1};
    kiln_value base =
        bin(g, "mul", kiln_reshape(g, ox_gin(n, 2), 4, bs), ox_sc(g, (double)(H * W)));
    kiln_value ph = ox_iota(n, 4, 1, oh), pw = ox_iota(n, 4, 2, ow);
    if (ph < 0 || pw < 0) return false;
    kiln_value y = KILN_NONE;
    int64_t is[3] = {R, oh, ow};
    for (int64_t iy = 0; iy < sr; iy++)
        for (int64_t ix = 0; ix < sr; ix++) {
            /* the sample's point: (R, oh, 1, 1) and (R, 1, ow, 1) */
            kiln_value sy = bin(
                g, "add", c[1],
                bin(g, "mul", bh, bin(g, "add", ph, ox_sc(g, ((double)iy + 0.5) / (double)sr))));
            kiln_value sx = bin(
                g, "add", c[0],
                bin(g, "mul", bw, bin(g, "add", pw, ox_sc(g, ((double)ix + 0.5) / (double)sr))));
            kiln_value out =
                kiln_where(g, bin(g, "lt", sy, ox_sc(g, -1)), bin(g, "lt", sy, ox_sc(g, -1)),
                           bin(g, "gt", sy, ox_sc(g, (double)H)));
            kiln_value outx =
                kiln_where(g, bin(g, "lt", sx, ox_sc(g, -1)), bin(g, "lt", sx, ox_sc(g, -1)),
                           bin(g, "gt", sx, ox_sc(g, (double)W)));
            out = kiln_where(g, out, out, outx); /* (R, oh, ow, 1) */
            kiln_value yy = kiln_clamp(g, sy, 1, 0, 0, 0), xx = kiln_clamp(g, sx, 1, 0, 0, 0);
            kiln_value yl = kiln_clamp(g, kiln_unary(g, "floor", yy), 0, 0, 1, (double)(H - 1));
            kiln_value xl = kiln_clamp(g, kiln_unary(g, "floor", xx), 0, 0, 1, (double)(W - 1));
            yy = kiln_where(g, bin(g, "ge", yl, ox_sc(g, (double)(H - 1))), yl, yy);
            xx = kiln_where(g, bin(g, "ge", xl, ox_sc(g, (double)(W - 1))), xl, xx);
            kiln_value yh = kiln_clamp(g, bin(g, "add", yl, ox_sc(g, 1)), 0, 0, 1, (double)(H - 1));
            kiln_value xh = kiln_clamp(g, bin(g, "add", xl, ox_sc(g, 1)), 0, 0, 1, (double)(W - 1));
            kiln_value ly = bin(g, "sub", yy, yl), lx = bin(g, "sub", xx, xl);
            kiln_value hy = bin(g, "sub", ox_sc(g, 1), ly), hx = bin(g, "sub", ox_sc(g, 1), lx);
            kiln_value ys[2] = {yl, yh}, xs[2] = {xl, xh}, wy[2] = {hy, ly}, wx[2] = {hx, lx};
            kiln_value acc = KILN_NONE;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    kiln_value at =
                        bin(g, "add", base,
                            bin(g, "add", bin(g, "mul", ys[a], ox_sc(g, (double)W)), xs[b]));
                    kiln_value v =
                        kiln_gather(g, data, kiln_reshape(g, at, 3, is), 0); /* (R, oh, ow, C) */
                    kiln_value w = kiln_where(g, out, ox_sc(g, 0), bin(g, "mul", wy[a], wx[b]));
                    kiln_value t = bin(g, "mul", v, w);
                    acc = acc < 0 ? t : bin(g, maxmode ? "maximum" : "add", acc, t);
                }
            y = y < 0 ? acc : bin(g, maxmode ? "maximum" : "add", y, acc);
        }
    if (!maxmode) y = bin(g, "mul", y, ox_sc(g, 1.0 / (double)(sr * sr)));
    int back[4] = {0, 3, 1, 2}; /* (R, oh, ow, C) -> (R, C, oh, ow) */
    return ox_set_graph(n, 0, kiln_permute(g, y, 4, back), OT_FLOAT);
}

const OxHandler ox_sample_ops[] = {
    {"GridSample", op_grid_sample},
    {"RoiAlign", op_roi_align},
};
const size_t ox_sample_nops = sizeof ox_sample_ops / sizeof ox_sample_ops[0];
