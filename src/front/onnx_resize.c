/*
 * onnx_resize.c -- Resize (opsets 10 to 19) and Upsample (7, 9).
 *
 * Every mode is separable, so a resize is one pass per resized axis, and
 * each pass is index arithmetic done here at import: output position o of
 * the axis reads input positions idx[t][o] with weights w[t][o], t < taps,
 * both constants (kiln's shapes are static). The pass is then
 * sum_t gather(x, idx[t], axis) * w[t] (w along the axis, broadcast
 * elsewhere); nearest is one gather. The positions follow ONNX's reference
 * (onnx/reference/ops/op_resize.py):
 *
 *   x_original from the output position by coordinate_transformation_mode
 *   (half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners,
 *   asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize with roi;
 *   align_corners divides by scale * in - 1, the output length before
 *   rounding, as the reference does: 0.6 x 4 gives 3 / 1.4, not 3 / 1);
 *   the left pixel b = floor(x_original), or x_original - 1 when it is an
 *   integer, ratio = x_original - b in (0, 1]; the n taps b - n/2 + 1 ...
 *   b + n/2, clamped to the edges (the reference pads with edge values);
 *   coefficients: nearest 2 taps, one of them 1 by nearest_mode; linear
 *   1 - ratio, ratio; cubic Keys' kernel with cubic_coeff_a; with
 *   antialias (opset 18) and a downscale the kernel is stretched by
 *   1 / scale (more taps) and normalized; exclude_outside zeroes the taps
 *   beyond the input and normalizes; tf_crop_and_resize gives
 *   extrapolation_value where x_original lies outside the input.
 *
 * Output sizes: sizes, or floor(in * scale) (times the roi's extent for
 * tf_crop_and_resize); opset 18's axes name the dims scales or sizes are
 * for, and keep_aspect_ratio_policy (not_larger, not_smaller) makes one
 * scale of the sizes. Before opset 11 (Resize 10, Upsample) positions are
 * asymmetric and nearest rounds down. scales, sizes and roi must be known
 * at import (constants, or inputs given with -i).
 */
#include "front/front.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CT_HALF_PIXEL, CT_HALF_SYM, CT_PYTORCH, CT_ALIGN, CT_ASYM, CT_TF_NN, CT_TF_CROP };
enum { NM_ROUND_FLOOR, NM_ROUND_CEIL, NM_FLOOR, NM_CEIL };
enum { RM_NEAREST, RM_LINEAR, RM_CUBIC };
enum { MAX_TAPS = 64 };

typedef struct {
    int mode, ct, nearest;
    double a; /* cubic_coeff_a */
    bool exclude, antialias;
    double extrapolation;
} ResizeAttrs;

/* x_original of output position o (see the header). */
static double original(const ResizeAttrs *ra, double o, int64_t in, int64_t out, double scale,
                       double start, double end) {
    switch (ra->ct) {
    case CT_HALF_SYM: {
        double adj = (double)out / (scale * (double)in), center = (double)in / 2;
        return center * (1 - adj) + (o + 0.5) / scale - 0.5;
    }
    case CT_PYTORCH: return out > 1 ? (o + 0.5) / scale - 0.5 : 0;
    case CT_ALIGN: { /* the reference divides by the unrounded output length */
        double len = scale * (double)in;
        return len == 1 ? 0 : o * (double)(in - 1) / (len - 1);
    }
    case CT_ASYM: return o / scale;
    case CT_TF_NN: return (o + 0.5) / scale;
    case CT_TF_CROP:
        return out > 1 ? start * (double)(in - 1) +
                             o * (end - start) * (double)(in - 1) / (double)(out - 1)
                       : 0.5 * (start + end) * (double)(in - 1);
    default: return (o + 0.5) / scale - 0.5;
    }
}

static double cubic(double x, double a) {
    x = fabs(x);
    if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0;
}

/* The taps' count for a scale, and their coefficients for a ratio:
 * offsets from the left pixel are first .. first + n - 1. */
static int coeffs(const ResizeAttrs *ra, double ratio, double scale, double *c, int *first) {
    if (ra->mode == RM_NEAREST) {
        bool right = ratio == 1 || (ra->nearest == NM_ROUND_FLOOR  ? ratio > 0.5
                                    : ra->nearest == NM_ROUND_CEIL ? ratio >= 0.5
                                                                   : ra->nearest == NM_CEIL);
        c[0] = !right, c[1] = right, *first = 0;
        return 2;
    }
    double s = ra->antialias && scale < 1 ? scale : 1, sum = 0;
    int lo = ra->mode == RM_LINEAR ? (int)floor(-1 / s) + 1 : (int)floor(-2 / s) + 1;
    int n = 2 - 2 * lo;
    if (n > MAX_TAPS) return -1;
    for (int k = 0; k < n; k++) {
        double x = ((double)(lo + k) - ratio) * s;
        c[k] = ra->mode == RM_LINEAR ? fmax(0, 1 - fabs(x)) : cubic(x, ra->a);
        sum += c[k];
    }
    if (s < 1)
        for (int k = 0; k < n; k++) c[k] /= sum;
    *first = lo;
    return n;
}

/* When every output position takes one input position whole (nearest,
 * or taps landing on pixels) and those follow idx = o / k (a k-fold
 * upsample) or idx = c + o k (a strided downsample), the pass is a view:
 * reshape and expand, or a strided slice, which fuse into the loops of
 * their producer and consumers like any view (kiln explain shows one
 * kernel for relu(resize(x)) + y); other tables are gathers. KILN_NONE
 * when no view fits. */
static kiln_value pick_view(OxNode *n, kiln_value v, int rank, int d, int64_t in, int64_t out,
                            int ntap, const double *idx, const double *w) {
    Graph *g = n->im->g;
    double *pick = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(out + 1));
    if (!pick) return ox_nomem(n), KILN_NONE;
    for (int64_t o = 0; o < out; o++) {
        int found = 0;
        for (int t = 0; t < ntap; t++) {
            if (w[t * out + o] == 0) continue;
            if (w[t * out + o] != 1 || found++) return KILN_NONE;
            pick[o] = idx[t * out + o];
        }
        if (!found) return KILN_NONE;
    }
    int64_t k = out / in;
    bool repeat = out == in * k;
    for (int64_t o = 0; repeat && o < out; o++) repeat = pick[o] == (double)(o / k);
    if (repeat) {
        int64_t s[KILN_MAX_RANK + 1], e[KILN_MAX_RANK + 1], r[KILN_MAX_RANK];
        const int64_t *sh = kiln_value_shape(g, v);
        if (rank + 1 > KILN_MAX_RANK) return KILN_NONE;
        for (int i = 0, j = 0; i < rank; i++) {
            s[j] = e[j] = r[i] = sh[i];
            if (i == d) s[++j] = 1, e[j] = k, r[i] = out;
            j++;
        }
        kiln_value up = kiln_expand(g, kiln_reshape(g, v, rank + 1, s), rank + 1, e);
        return kiln_reshape(g, up, rank, r);
    }
    int64_t c = (int64_t)pick[0], step = out > 1 ? (int64_t)(pick[1] - pick[0]) : 1;
    if (step < 1) return KILN_NONE;
    for (int64_t o = 0; o < out; o++)
        if (pick[o] != (double)(c + o * step)) return KILN_NONE;
    return kiln_slice(g, v, d, c, c + (out - 1) * step + 1, step);
}

/* x padded by its edge values p on both sides of dim d (a view). */
static kiln_value pad_edge(Graph *g, kiln_value v, int rank, int d, int64_t p) {
    int64_t b[KILN_MAX_RANK] = {0};
    b[d] = p;
    return p ? kiln_pad(g, v, KILN_PAD_EDGE, rank, b, b, 0) : v;
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * (1 + fabs(a)); }

/* The tables of an integer-factor resize as views (see the header):
 * upsampling by k = out / in when output k i + j reads input i + off[t][j]
 * with weight W[t][j] for every i (edges clamped, as an edge pad does), a
 * sum over the distinct offsets s of (x shifted by s) times a weight per
 * phase j, interleaved by a reshape; downsampling when output o reads
 * k o + off[t] with weight W[t] for every o, a sum of strided slices of
 * the edge-padded x. pos holds the unclamped positions. */
static kiln_value periodic_view(OxNode *n, kiln_value v, int rank, int d, int64_t in, int64_t out,
                                int ntap, const double *pos, const double *w) {
    Graph *g = n->im->g;
    double lo = 0, hi = (double)(in - 1);
    for (int64_t q = 0; q < ntap * out; q++) lo = fmin(lo, pos[q]), hi = fmax(hi, pos[q]);
    int64_t P = (int64_t)fmax(-lo, hi - (double)(in - 1));
    if (P > in + 16) return KILN_NONE;
    kiln_value padded = pad_edge(g, v, rank, d, P), y = KILN_NONE;
    if (out % in == 0) { /* up by k */
        int64_t k = out / in;
        for (int t = 0; t < ntap; t++)
            for (int64_t o = 0; o < out; o++)
                if (!near(pos[t * out + o] - (double)(o / k), pos[t * out + o % k]) ||
                    !near(w[t * out + o], w[t * out + o % k]))
                    return KILN_NONE;
        int64_t s4[KILN_MAX_RANK + 1], wshape[KILN_MAX_RANK + 1], flat[KILN_MAX_RANK];
        const int64_t *sh = kiln_value_shape(g, v);
        if (rank + 1 > KILN_MAX_RANK || k > 64) return KILN_NONE;
        for (int i = 0, j = 0; i < rank; i++, j++) {
            s4[j] = sh[i], wshape[j] = 1, flat[i] = i == d ? out : sh[i];
            if (i == d) s4[++j] = 1, wshape[j] = k;
        }
        double offs[MAX_TAPS * 64];
        int noffs = 0;
        for (int t = 0; t < ntap; t++)
            for (int64_t j = 0; j < k; j++) {
                double s = pos[t * out + j];
                bool seen = w[t * out + j] == 0;
                for (int m = 0; m < noffs && !seen; m++) seen = offs[m] == s;
                if (!seen) offs[noffs++] = s;
            }
        for (int m = 0; m < noffs; m++) {
            double ws[64];
            bool one = true;
            for (int64_t j = 0; j < k; j++) {
                ws[j] = 0;
                for (int t = 0; t < ntap; t++)
                    if (pos[t * out + j] == offs[m]) ws[j] += w[t * out + j];
                one &= ws[j] == 1;
            }
            int64_t at = P + (int64_t)offs[m];
            kiln_value sh_m =
                kiln_reshape(g, kiln_slice(g, padded, d, at, at + in, 1), rank + 1, s4);
            kiln_value term;
            if (one) { /* weight 1 in every phase: an expand, no multiply */
                int64_t e[KILN_MAX_RANK + 1];
                memcpy(e, s4, sizeof e);
                e[d + 1] = k;
                term = kiln_expand(g, sh_m, rank + 1, e);
            } else {
                term = kiln_binary(g, "mul", sh_m, ox_const_tensor(n, rank + 1, wshape, ws));
            }
            y = y < 0 ? term : kiln_binary(g, "add", y, term);
        }
        return y < 0 ? KILN_NONE : kiln_reshape(g, y, rank, flat);
    }
    int64_t k = out > 1 ? (int64_t)(pos[1] - pos[0]) : 1;
    if (k < 1) return KILN_NONE;
    for (int t = 0; t < ntap; t++)
        for (int64_t o = 0; o < out; o++)
            if (pos[t * out + o] != pos[t * out] + (double)(o * k) ||
                !near(w[t * out + o], w[t * out]))
                return KILN_NONE;
    for (int t = 0; t < ntap; t++) {
        if (w[t * out] == 0) continue;
        int64_t at = P + (int64_t)pos[t * out];
        kiln_value tap = kiln_slice(g, padded, d, at, at + (out - 1) * k + 1, k);
        if (w[t * out] != 1) tap = kiln_binary(g, "mul", tap, ox_sc(g, w[t * out]));
        y = y < 0 ? tap : kiln_binary(g, "add", y, tap);
    }
    return y;
}

/* One pass: axis d of v from in to out positions. */
static kiln_value resize_axis(OxNode *n, const ResizeAttrs *ra, kiln_value v, int rank, int d,
                              int64_t in, int64_t out, double scale, double start, double end) {
    Graph *g = n->im->g;
    int ntap = 0;
    double c[MAX_TAPS];
    int first;
    /* the widest kernel any position needs (the count depends on the scale only) */
    if ((ntap = coeffs(ra, 0.5, scale, c, &first)) < 0)
        return ox_nfail(n, "a downscale this large needs more than %d taps", MAX_TAPS), KILN_NONE;
    double *idx = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(ntap * out + 1));
    double *w = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(ntap * out + 1));
    double *outside = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(out + 1));
    double *pos = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(ntap * out + 1));
    if (!idx || !w || !outside || !pos) return ox_nomem(n), KILN_NONE;
    bool identity = in == out, any_outside = false;
    for (int64_t o = 0; o < out; o++) {
        double x = original(ra, (double)o, in, out, scale, start, end);
        outside[o] = ra->ct == CT_TF_CROP && (x < 0 || x > (double)(in - 1));
        any_outside |= outside[o] != 0;
        double b = floor(x);
        if (b == x) b -= 1;
        double ratio = x - b, sum = 0;
        coeffs(ra, ratio, scale, c, &first);
        for (int t = 0; t < ntap; t++) {
            double at = b + first + t;
            bool beyond = at < 0 || at > (double)(in - 1);
            pos[t * out + o] = at;
            idx[t * out + o] = at < 0 ? 0 : at > (double)(in - 1) ? (double)(in - 1) : at;
            w[t * out + o] = ra->exclude && beyond ? 0 : c[t];
            sum += w[t * out + o];
        }
        for (int t = 0; ra->exclude && sum != 0 && t < ntap; t++) w[t * out + o] /= sum;
        for (int t = 0; t < ntap; t++)
            identity &= w[t * out + o] == 0 || (w[t * out + o] == 1 && idx[t * out + o] == o);
    }
    if (identity && !any_outside) return v;
    if (!any_outside) {
        kiln_value view = pick_view(n, v, rank, d, in, out, ntap, idx, w);
        if (view == KILN_NONE && !ra->exclude)
            view = periodic_view(n, v, rank, d, in, out, ntap, pos, w);
        if (view != KILN_NONE) return view;
    }
    int64_t line[1] = {out}, wshape[KILN_MAX_RANK];
    for (int i = 0; i < rank; i++) wshape[i] = i == d ? out : 1;
    kiln_value y = KILN_NONE;
    for (int t = 0; t < ntap; t++) {
        bool zero = true, one = true;
        for (int64_t o = 0; o < out; o++) {
            zero &= w[t * out + o] == 0;
            one &= w[t * out + o] == 1;
        }
        if (zero) continue;
        kiln_value tap = kiln_gather(g, v, ox_const_tensor(n, 1, line, idx + t * out), d);
        if (!one) tap = kiln_binary(g, "mul", tap, ox_const_tensor(n, rank, wshape, w + t * out));
        y = y < 0 ? tap : kiln_binary(g, "add", y, tap);
    }
    if (y < 0)
        y = kiln_binary(g, "mul", kiln_gather(g, v, ox_const_tensor(n, 1, line, idx), d),
                        ox_sc(g, 0)); /* every weight 0 (exclude_outside everywhere) */
    if (any_outside)
        y = kiln_where(g,
                       kiln_binary(g, "ne", ox_const_tensor(n, rank, wshape, outside), ox_sc(g, 0)),
                       ox_sc(g, ra->extrapolation), y);
    return y;
}

/* A string attribute's index in names, or -1 (an error named by the caller). */
static int attr_choice(OxNode *n, const char *attr, const char *const *names, int count, int def) {
    if (ox_attr_is(n, attr, names[def], true)) return def;
    for (int i = 0; i < count; i++)
        if (ox_attr_is(n, attr, names[i], false)) return i;
    return -1;
}

static bool read_attrs(OxNode *n, ResizeAttrs *ra, bool upsample) {
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const cts[] = {
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    static const char *const nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    int opset = n->im->opset;
    ra->mode = attr_choice(n, "mode", modes, 3, 0);
    if (ra->mode < 0 && ox_attr_is(n, "mode", "bilinear", false)) ra->mode = RM_LINEAR;
    if (ra->mode < 0 || (ra->mode == RM_CUBIC && (upsample || opset < 11)))
        return ox_nfail(n, "unsupported mode (nearest, linear%s)", opset < 11 ? "" : ", cubic");
    if (upsample || opset < 11) {
        ra->ct = CT_ASYM, ra->nearest = NM_FLOOR;
    } else {
        ra->ct = attr_choice(n, "coordinate_transformation_mode", cts, 7, 0);
        ra->nearest = attr_choice(n, "nearest_mode", nms, 4, 0);
        if (ra->ct < 0 || (ra->ct == CT_HALF_SYM && opset < 19) ||
            (ra->ct == CT_TF_NN && opset >= 13))
            return ox_nfail(n, "unsupported coordinate_transformation_mode at opset %d", opset);
        if (ra->nearest < 0) return ox_nfail(n, "unsupported nearest_mode");
    }
    ra->a = ox_attr_f(n, "cubic_coeff_a", -0.75);
    ra->exclude = ox_attr_i(n, "exclude_outside", 0) != 0;
    ra->antialias = opset >= 18 && ox_attr_i(n, "antialias", 0) != 0;
    ra->extrapolation = ox_attr_f(n, "extrapolation_value", 0);
    return true;
}

/* Input k's known float values (NULL and count 0 when absent or empty). */
static const double *known(OxNode *n, int k, int64_t *count, const char *what, bool *ok) {
    OxVal *v = ox_in(n, k);
    *count = v ? ox_numel(v) : 0;
    if (!v || !*count) return NULL;
    const double *c = ox_known(v);
    if (!c) {
        ox_nfail(n,
                 "unsupported: the %s input '%s' is computed at run time (kiln's shapes are "
                 "static: give its value, kiln run -i %s=FILE)",
                 what, v->name, v->name);
        *ok = false;
    }
    return c;
}

static bool resize(OxNode *n, bool upsample) {
    if (!ox_need_in(n, 0)) return false;
    OxVal *x = ox_in(n, 0);
    int r = x->rank, opset = n->im->opset;
    ResizeAttrs ra;
    if (!read_attrs(n, &ra, upsample)) return false;
    /* which dims scales and sizes are for (opset 18's axes) */
    int64_t axes[KILN_MAX_RANK];
    int na = opset >= 18 ? ox_attr_ints(n, "axes", axes, KILN_MAX_RANK) : -1;
    if (na < -1) return false;
    if (na < 0)
        for (na = 0; na < r; na++) axes[na] = na;
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], r)) return false;
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i]) return ox_nfail(n, "axis %lld repeats", (long long)axes[i]);
    }
    double scales[KILN_MAX_RANK], roi[2 * KILN_MAX_RANK];
    int64_t out[KILN_MAX_RANK];
    for (int i = 0; i < r; i++) scales[i] = 1, out[i] = x->shape[i], roi[i] = 0, roi[r + i] = 1;
    bool ok = true;
    int64_t ns = 0, nz = 0, nr = 0;
    const double *sv = NULL, *zv = NULL, *rv = NULL;
    double s[KILN_MAX_RANK];
    if (upsample && opset < 9) {
        int m = ox_attr_floats(n, "scales", s, KILN_MAX_RANK);
        if (m < 0) return m == -1 ? ox_nfail(n, "the scales attribute is required") : false;
        sv = s, ns = m;
        for (int i = 0; i < m; i++) scales[i] = s[i];
    } else if (upsample || opset < 11) {
        sv = known(n, 1, &ns, "scales", &ok);
    } else {
        rv = known(n, 1, &nr, "roi", &ok);
        sv = known(n, 2, &ns, "scales", &ok);
        zv = known(n, 3, &nz, "sizes", &ok);
    }
    if (!ok) return false;
    if (ns && nz) return ox_nfail(n, "scales and sizes are both given");
    if (!ns && !nz) return ox_nfail(n, "needs scales or sizes");
    if ((ns && ns != na) || (nz && nz != na))
        return ox_nfail(n, "%s has %lld values for %d dims", ns ? "scales" : "sizes",
                        (long long)(ns ? ns : nz), na);
    if (rv && ra.ct == CT_TF_CROP) {
        if (nr != 2 * na) return ox_nfail(n, "roi has %lld values for %d dims", (long long)nr, na);
        for (int i = 0; i < na; i++) roi[axes[i]] = rv[i], roi[r + axes[i]] = rv[na + i];
    }
    if (ns) {
        for (int i = 0; i < na; i++) {
            int d = (int)axes[i];
            if (!(sv[i] > 0) || sv[i] > 1e6)
                return ox_nfail(n, "scale %g of dim %d is not in (0, 1e6]", sv[i], d);
            scales[d] = sv[i];
            double ext = ra.ct == CT_TF_CROP ? roi[r + d] - roi[d] : 1;
            out[d] = (int64_t)floor((double)x->shape[d] * ext * sv[i]);
        }
    } else {
        int policy =
            opset >= 18
                ? attr_choice(n, "keep_aspect_ratio_policy",
                              (const char *const[]){"stretch", "not_larger", "not_smaller"}, 3, 0)
                : 0;
        if (policy < 0) return ox_nfail(n, "unsupported keep_aspect_ratio_policy");
        double one = policy == 1 ? INFINITY : 0;
        for (int i = 0; i < na; i++) {
            int d = (int)axes[i];
            if (zv[i] < 1 || zv[i] > (double)((int64_t)1 << 30))
                return ox_nfail(n, "size %g of dim %d is out of range", zv[i], d);
            double s = zv[i] / (double)x->shape[d];
            one = policy == 1 ? fmin(one, s) : fmax(one, s);
            out[d] = (int64_t)zv[i], scales[d] = s;
        }
        for (int i = 0; policy && i < na; i++) {
            int d = (int)axes[i];
            scales[d] = one;
            out[d] = (int64_t)floor(one * (double)x->shape[d] + 0.5);
        }
    }
    for (int d = 0; d < r; d++)
        if (out[d] < 1) return ox_nfail(n, "dim %d resizes to %lld (empty)", d, (long long)out[d]);
    kiln_value v = ox_graph(n, x);
    for (int d = 0; d < r && v >= 0; d++)
        v = resize_axis(n, &ra, v, r, d, x->shape[d], out[d], scales[d], roi[d], roi[r + d]);
    return v >= 0 && ox_set_graph(n, 0, v, x->type);
}

static bool op_resize(OxNode *n) { return resize(n, false); }
static bool op_upsample(OxNode *n) { return resize(n, true); }

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_resize_ops[] = {
    {"Resize", op_resize},
    {"Upsample", op_upsample},
};
const size_t ox_resize_nops = sizeof ox_resize_ops / sizeof ox_resize_ops[0];
