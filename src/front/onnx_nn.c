/*
 * onnx_nn.c -- linear algebra, convolution, normalization and pooling:
 * MatMul, Gemm, Conv (1-D as 2-D of height 1), ConvTranspose, the
 * normalizations, MaxPool / AveragePool and their global forms.
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- linear algebra and convolution ------------------------------------------ */

static bool op_matmul(OxNode *n) {
    return ox_set_graph(n, 0, kiln_matmul(n->im->g, ox_gin(n, 0), ox_gin(n, 1)), OT_FLOAT);
}

static bool op_gemm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value a = ox_gin(n, 0), b = ox_gin(n, 1);
    if (ox_attr_i(n, "transA", 0)) a = kiln_transpose(g, a, 0, 1);
    if (ox_attr_i(n, "transB", 0)) b = kiln_transpose(g, b, 0, 1);
    double alpha = ox_attr_f(n, "alpha", 1), beta = ox_attr_f(n, "beta", 1);
    kiln_value y = kiln_matmul(g, a, b);
    if (alpha != 1) y = kiln_binary(g, "mul", y, kiln_scalar(g, alpha));
    if (ox_in(n, 2) && beta != 0) {
        kiln_value c = ox_gin(n, 2);
        if (beta != 1) c = kiln_binary(g, "mul", c, kiln_scalar(g, beta));
        y = kiln_binary(g, "add", y, c);
    }
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* Spatial geometry shared by Conv, ConvTranspose and the pools: kernel,
 * strides, dilations and begin/end pads, auto_pad resolved. */
typedef struct {
    int ns; /* spatial dims */
    int64_t in[3], k[3], stride[3], dil[3], pb[3], pe[3];
} Geom;

static bool geom_read(OxNode *n, int ns, const int64_t *in_sp, const int64_t *kernel, Geom *gm) {
    int64_t pads[6];
    gm->ns = ns;
    for (int i = 0; i < ns; i++) {
        gm->in[i] = in_sp[i];
        gm->k[i] = kernel[i];
        gm->stride[i] = gm->dil[i] = 1;
        gm->pb[i] = gm->pe[i] = 0;
    }
    int c1 = ox_attr_ints(n, "strides", gm->stride, 3),
        c2 = ox_attr_ints(n, "dilations", gm->dil, 3);
    int c3 = ox_attr_ints(n, "pads", pads, 6);
    if (c1 < -1 || c2 < -1 || c3 < -1) return false;
    if ((c1 >= 0 && c1 != ns) || (c2 >= 0 && c2 != ns) || (c3 >= 0 && c3 != 2 * ns))
        return ox_nfail(n, "strides, dilations or pads do not match %d spatial dims", ns);
    for (int i = 0; c3 > 0 && i < ns; i++) gm->pb[i] = pads[i], gm->pe[i] = pads[ns + i];
    const int64_t big = (int64_t)1 << 24; /* keeps every size computation in range */
    for (int i = 0; i < ns; i++)
        if (gm->stride[i] < 1 || gm->stride[i] > big || gm->dil[i] < 1 || gm->dil[i] > big ||
            gm->pb[i] < 0 || gm->pb[i] > big || gm->pe[i] < 0 || gm->pe[i] > big || gm->k[i] < 1 ||
            gm->k[i] > big)
            return ox_nfail(n,
                            "strides and dilations must be 1 to 2^24, pads 0 to 2^24 "
                            "(spatial dim %d)",
                            i);
    return true;
}

/* auto_pad SAME_UPPER / SAME_LOWER: output = ceil(in / stride). */
static void geom_auto_pad(OxNode *n, Geom *gm) {
    bool upper = ox_attr_is(n, "auto_pad", "SAME_UPPER", false);
    bool lower = ox_attr_is(n, "auto_pad", "SAME_LOWER", false);
    if (ox_attr_is(n, "auto_pad", "VALID", false))
        for (int i = 0; i < gm->ns; i++) gm->pb[i] = gm->pe[i] = 0;
    if (!upper && !lower) return;
    for (int i = 0; i < gm->ns; i++) {
        int64_t out = (gm->in[i] + gm->stride[i] - 1) / gm->stride[i];
        int64_t total = (out - 1) * gm->stride[i] + (gm->k[i] - 1) * gm->dil[i] + 1 - gm->in[i];
        if (total < 0) total = 0;
        gm->pb[i] = upper ? total / 2 : total - total / 2;
        gm->pe[i] = total - gm->pb[i];
    }
}

/* x as rank 4 for a 1-D op: (N, C, L) -> (N, C, 1, L). */
static kiln_value to_2d(Graph *g, kiln_value x) {
    if (x < 0) return KILN_NONE;
    const int64_t *s = kiln_value_shape(g, x);
    int64_t shape[4] = {s[0], s[1], 1, s[2]};
    return kiln_reshape(g, x, 4, shape);
}

/* A weight operand reshaped to 2-D spatial: made so directly when it is a
 * constant, so it stays a weight (Conv-BN folding). */
static kiln_value weight_2d(OxNode *n, OxVal *w) {
    if (!w->c || w->v >= 0) return to_2d(n->im->g, ox_graph(n, w));
    OxVal t = *w;
    t.name = NULL; /* a weight of its own, numbered */
    t.rank = 4;
    t.shape[2] = 1;
    t.shape[3] = w->shape[2];
    return ox_materialize(n, &t);
}

static kiln_value from_2d(Graph *g, kiln_value y) {
    if (y < 0) return KILN_NONE;
    const int64_t *s = kiln_value_shape(g, y);
    int64_t shape[3] = {s[0], s[1], s[3]};
    return kiln_reshape(g, y, 3, shape);
}

/* Pad x's spatial dims by gm's pads (constant 0): asymmetric padding. */
static kiln_value pad_spatial(Graph *g, kiln_value x, const Geom *gm, int rank) {
    int64_t b[KILN_MAX_RANK] = {0}, e[KILN_MAX_RANK] = {0};
    for (int i = 0; i < gm->ns; i++)
        b[rank - gm->ns + i] = gm->pb[i], e[rank - gm->ns + i] = gm->pe[i];
    return kiln_pad(g, x, KILN_PAD_CONSTANT, rank, b, e, 0);
}

static bool conv_geom(OxNode *n, OxVal *x, OxVal *w, Geom *gm) {
    int ns = x->rank - 2;
    if (ns < 1 || ns > 3) return ox_nfail(n, "unsupported: %d-D convolution", ns);
    if (w->rank != x->rank)
        return ox_nfail(n, "the weight has rank %d, the input %d", w->rank, x->rank);
    if (!geom_read(n, ns, x->shape + 2, w->shape + 2, gm)) return false;
    geom_auto_pad(n, gm);
    return true;
}

/* Depth tap kd of a 3-D weight (M, C, KD, KH, KW) as a 2-D one: a weight
 * of its own when w is a constant. */
static kiln_value weight_tap(OxNode *n, OxVal *w, int64_t kd) {
    Graph *g = n->im->g;
    int64_t s4[4] = {w->shape[0], w->shape[1], w->shape[3], w->shape[4]}, hw = s4[2] * s4[3];
    if (!w->c) {
        kiln_value t = kiln_slice(g, ox_graph(n, w), 2, kd, kd + 1, 1);
        return kiln_reshape(g, t, 4, s4);
    }
    OxVal t = {.type = OT_FLOAT, .rank = 4, .v = KILN_NONE}; /* unnamed: numbered */
    memcpy(t.shape, s4, sizeof s4);
    t.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(s4[0] * s4[1] * hw));
    if (!t.c) return ox_nomem(n), KILN_NONE;
    for (int64_t mc = 0; mc < s4[0] * s4[1]; mc++)
        memcpy(t.c + mc * hw, w->c + (mc * w->shape[2] + kd) * hw, sizeof(double) * (size_t)hw);
    return ox_materialize(n, &t);
}

/* A 3-D convolution as 2-D ones (kiln's conv is 2-D): output depth od sums
 * conv2d(x[:, :, id], w[:, :, kd]) over the depth taps kd, id = od * stride
 * + kd * dilation - pad (taps in the padding add nothing); the depth
 * slices are concatenated. */
static bool conv3d(OxNode *n, const Geom *gm, kiln_conv_params p) {
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *wv = ox_in(n, 1);
    int64_t d = xv->shape[2],
            od_n =
                (d + gm->pb[0] + gm->pe[0] - (gm->dil[0] * (gm->k[0] - 1) + 1)) / gm->stride[0] + 1;
    kiln_value x = ox_gin(n, 0),
               *slices =
                   arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)(od_n > 0 ? od_n : 1));
    if (x < 0 || od_n < 1 || !slices)
        return x >= 0 && od_n < 1 ? ox_nfail(n, "the kernel is larger than the input") : false;
    if (gm->pb[1] != gm->pe[1] || gm->pb[2] != gm->pe[2]) {
        int64_t b[5] = {0, 0, 0, gm->pb[1], gm->pb[2]}, e[5] = {0, 0, 0, gm->pe[1], gm->pe[2]};
        x = kiln_pad(g, x, KILN_PAD_CONSTANT, 5, b, e, 0);
        p.padding[0] = p.padding[1] = 0;
    }
    const int64_t *xs = kiln_value_shape(g, x);
    kiln_value *taps = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)gm->k[0]);
    if (!xs || !taps) return xs ? ox_nomem(n) : false;
    for (int64_t kd = 0; kd < gm->k[0]; kd++)
        if ((taps[kd] = weight_tap(n, wv, kd)) < 0) return false;
    int64_t x4[4] = {xs[0], xs[1], xs[3], xs[4]};
    for (int64_t od = 0; od < od_n; od++) {
        kiln_value acc = KILN_NONE;
        for (int64_t kd = 0; kd < gm->k[0]; kd++) {
            int64_t id = od * gm->stride[0] + kd * gm->dil[0] - gm->pb[0];
            if (id < 0 || id >= d) continue;
            kiln_value xi = kiln_reshape(g, kiln_slice(g, x, 2, id, id + 1, 1), 4, x4);
            kiln_value t = kiln_conv2d(g, xi, taps[kd], KILN_NONE, &p);
            acc = acc == KILN_NONE ? t : kiln_binary(g, "add", acc, t);
            if (acc < 0) return false;
        }
        if (acc == KILN_NONE)
            return ox_nfail(n, "unsupported: an output depth slice lies in the padding");
        const int64_t *ys = kiln_value_shape(g, acc);
        int64_t y5[5] = {ys[0], ys[1], 1, ys[2], ys[3]};
        slices[od] = kiln_reshape(g, acc, 5, y5);
    }
    kiln_value y = od_n == 1 ? slices[0] : kiln_concat(g, (int)od_n, slices, 2);
    if (ox_in(n, 2)) {
        int64_t bs[4] = {wv->shape[0], 1, 1, 1};
        y = kiln_binary(g, "add", y, kiln_reshape(g, ox_gin(n, 2), 4, bs));
    }
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

bool ox_conv(OxNode *n) {
    Graph *g = n->im->g;
    Geom gm;
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1) || !conv_geom(n, ox_in(n, 0), ox_in(n, 1), &gm))
        return false;
    if (gm.ns == 3) {
        kiln_conv_params p = kiln_conv_defaults();
        p.groups = (int)ox_attr_i(n, "group", 1);
        for (int i = 0; i < 2; i++) {
            p.stride[i] = (int)gm.stride[i + 1];
            p.dilation[i] = (int)gm.dil[i + 1];
            p.padding[i] = (int)gm.pb[i + 1];
        }
        return conv3d(n, &gm, p);
    }
    bool one = gm.ns == 1;
    kiln_value x = one ? to_2d(g, ox_gin(n, 0)) : ox_gin(n, 0);
    kiln_value w = one ? weight_2d(n, ox_in(n, 1)) : ox_gin(n, 1);
    kiln_value b = ox_in(n, 2) ? ox_gin(n, 2) : KILN_NONE;
    kiln_conv_params p = kiln_conv_defaults();
    p.groups = (int)ox_attr_i(n, "group", 1);
    bool sym = true;
    for (int i = 0; i < gm.ns; i++) sym &= gm.pb[i] == gm.pe[i];
    for (int i = 0; i < gm.ns; i++) {
        int d = one ? 1 : i;
        p.stride[d] = (int)gm.stride[i];
        p.dilation[d] = (int)gm.dil[i];
        p.padding[d] = sym ? (int)gm.pb[i] : 0;
    }
    if (!sym && one) { /* x is (N, C, 1, L) now: pad its last dim */
        Geom g2 = {.ns = 1, .pb = {gm.pb[0]}, .pe = {gm.pe[0]}};
        x = pad_spatial(g, x, &g2, 4);
    } else if (!sym) {
        x = pad_spatial(g, x, &gm, 4);
    }
    kiln_value y = kiln_conv2d(g, x, w, b, &p);
    return ox_set_graph(n, 0, one ? from_2d(g, y) : y, OT_FLOAT);
}

/* A (N, M, OH, OW) tensor of zeros, for a depth slice nothing reaches. */
static kiln_value zeros4(Graph *g, const int64_t *shape) {
    int64_t ones[4] = {1, 1, 1, 1};
    return kiln_expand(g, kiln_reshape(g, kiln_scalar(g, 0), 4, ones), 4, shape);
}

/* A 3-D transposed convolution as 2-D ones: input depth id and kernel tap
 * kd reach output depth od = id * stride + kd * dilation - pad_begin; each
 * output depth slice sums its 2-D transposed convolutions (zeros when none
 * reaches it), and the slices are concatenated. p: the H and W params
 * (symmetric padding; asymmetric is cropped after). */
static bool conv_transpose3d(OxNode *n, const Geom *gm, const int64_t *opad,
                             kiln_conv_transpose_params p) {
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *wv = ox_in(n, 1);
    const int64_t *xs = xv->shape;
    int64_t d = xs[2], kd_n = gm->k[0], s = gm->stride[0], dl = gm->dil[0];
    int64_t od_n = s * (d - 1) + opad[0] + dl * (kd_n - 1) + 1 - gm->pb[0] - gm->pe[0];
    int64_t o4[4] = {xs[0], wv->shape[1] * p.groups, 0, 0}, x4[4] = {xs[0], xs[1], xs[3], xs[4]};
    for (int i = 0; i < 2; i++)
        o4[2 + i] = p.stride[i] * (xs[3 + i] - 1) + p.output_padding[i] +
                    p.dilation[i] * (gm->k[1 + i] - 1) + 1 - 2 * p.padding[i];
    kiln_value x = ox_gin(n, 0),
               *taps = arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)kd_n);
    kiln_value *slices =
        arena_alloc(&n->im->arena, sizeof(kiln_value) * (size_t)(od_n > 0 ? od_n : 1));
    if (x < 0 || !taps || !slices) return x < 0 ? false : ox_nomem(n);
    if (od_n < 1 || o4[2] < 1 || o4[3] < 1) return ox_nfail(n, "the output would be empty");
    for (int64_t kd = 0; kd < kd_n; kd++)
        if ((taps[kd] = weight_tap(n, wv, kd)) < 0) return false;
    for (int64_t od = 0; od < od_n; od++) {
        kiln_value acc = KILN_NONE;
        for (int64_t id = 0; id < d; id++)
            for (int64_t kd = 0; kd < kd_n; kd++) {
                if (id * s + kd * dl - gm->pb[0] != od) continue;
                kiln_value xi = kiln_reshape(g, kiln_slice(g, x, 2, id, id + 1, 1), 4, x4);
                kiln_value t = kiln_conv_transpose2d(g, xi, taps[kd], KILN_NONE, &p);
                acc = acc == KILN_NONE ? t : kiln_binary(g, "add", acc, t);
                if (acc < 0) return false;
            }
        if (acc == KILN_NONE) acc = zeros4(g, o4);
        int64_t y5[5] = {o4[0], o4[1], 1, o4[2], o4[3]};
        if ((slices[od] = kiln_reshape(g, acc, 5, y5)) < 0) return false;
    }
    kiln_value y = od_n == 1 ? slices[0] : kiln_concat(g, (int)od_n, slices, 2);
    if (gm->pb[1] != gm->pe[1] || gm->pb[2] != gm->pe[2]) {
        int64_t b[5] = {0, 0, 0, -gm->pb[1], -gm->pb[2]}, e[5] = {0, 0, 0, -gm->pe[1], -gm->pe[2]};
        y = kiln_pad(g, y, KILN_PAD_CONSTANT, 5, b, e, 0);
    }
    if (ox_in(n, 2)) {
        int64_t bs[4] = {o4[1], 1, 1, 1};
        y = kiln_binary(g, "add", y, kiln_reshape(g, ox_gin(n, 2), 4, bs));
    }
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

static bool op_conv_transpose(OxNode *n) {
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0), *w = ox_in(n, 1);
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    int ns = x->rank - 2;
    if (ns < 1 || ns > 3) return ox_nfail(n, "unsupported: %d-D transposed convolution", ns);
    if (w->rank != x->rank)
        return ox_nfail(n, "the weight has rank %d, the input %d", w->rank, x->rank);
    Geom gm;
    int64_t opad[3] = {0, 0, 0}, oshape[3];
    if (!geom_read(n, ns, x->shape + 2, w->shape + 2, &gm)) return false;
    int c1 = ox_attr_ints(n, "output_padding", opad, 3),
        c2 = ox_attr_ints(n, "output_shape", oshape, 3);
    if (c1 < -1 || c2 < -1) return false;
    for (int i = 0; i < ns; i++)
        if (opad[i] < 0 || opad[i] > (1 << 24) ||
            (c2 == ns && (oshape[i] < 1 || oshape[i] > (1 << 30))))
            return ox_nfail(n, "output_padding or output_shape is out of range");
    bool same = ox_attr_is(n, "auto_pad", "SAME_UPPER", false) ||
                ox_attr_is(n, "auto_pad", "SAME_LOWER", false);
    for (int i = 0; i < ns && (c2 == ns || same); i++) {
        /* total padding from the wanted output size (ONNX's formula) */
        int64_t want = c2 == ns ? oshape[i] : x->shape[2 + i] * gm.stride[i];
        int64_t total =
            gm.stride[i] * (x->shape[2 + i] - 1) + opad[i] + ((gm.k[i] - 1) * gm.dil[i] + 1) - want;
        bool lower = ox_attr_is(n, "auto_pad", "SAME_LOWER", false);
        gm.pb[i] = lower ? (total + 1) / 2 : total / 2;
        gm.pe[i] = total - gm.pb[i];
        if (total < 0) gm.pb[i] = 0, gm.pe[i] = 0, opad[i] += -total;
    }
    bool one = ns == 1;
    kiln_conv_transpose_params p = {{1, 1}, {0, 0}, {0, 0}, {1, 1}, (int)ox_attr_i(n, "group", 1)};
    if (ns == 3) {
        for (int i = 0; i < 2; i++) {
            p.stride[i] = (int)gm.stride[i + 1];
            p.dilation[i] = (int)gm.dil[i + 1];
            p.output_padding[i] = (int)opad[i + 1];
            p.padding[i] = gm.pb[i + 1] == gm.pe[i + 1] ? (int)gm.pb[i + 1] : 0;
        }
        return conv_transpose3d(n, &gm, opad, p);
    }
    bool sym = true;
    for (int i = 0; i < ns; i++) sym &= gm.pb[i] == gm.pe[i];
    for (int i = 0; i < ns; i++) {
        int d = one ? 1 : i;
        p.stride[d] = (int)gm.stride[i];
        p.dilation[d] = (int)gm.dil[i];
        p.output_padding[d] = (int)opad[i];
        p.padding[d] = sym ? (int)gm.pb[i] : 0;
    }
    kiln_value xv = one ? to_2d(g, ox_gin(n, 0)) : ox_gin(n, 0);
    kiln_value wv = one ? weight_2d(n, w) : ox_gin(n, 1);
    kiln_value y = kiln_conv_transpose2d(g, xv, wv, ox_in(n, 2) ? ox_gin(n, 2) : KILN_NONE, &p);
    if (!sym && y >= 0) {
        Geom crop = gm;
        for (int i = 0; i < ns; i++) crop.pb[i] = -gm.pb[i], crop.pe[i] = -gm.pe[i];
        if (one)
            crop.pb[1] = crop.pb[0], crop.pe[1] = crop.pe[0], crop.pb[0] = crop.pe[0] = 0,
            crop.ns = 2;
        y = pad_spatial(g, y, &crop, 4);
    }
    return ox_set_graph(n, 0, one ? from_2d(g, y) : y, OT_FLOAT);
}

/* ---- normalization -------------------------------------------------------- */

static bool only_first_output(OxNode *n) {
    for (size_t k = 1; k < n->n->n_output; k++)
        if (n->n->output[k][0])
            return ox_nfail(n, "unsupported: output %d (training-mode statistics)", (int)k);
    return true;
}

kiln_value ox_normalize(Graph *g, kiln_value x, int nd, const int *dims, double eps,
                        kiln_value *mean_out, kiln_value *rstd_out);

/* Training mode: normalized with the batch's statistics (over every dim
 * but channels; the variance biased), and the running statistics updated
 * with momentum (outputs 1 and 2). */
static bool batch_norm_training(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0), mean, rstd;
    if (x < 0) return false;
    int r = kiln_value_rank(g, x), dims[KILN_MAX_RANK], nd = 0;
    if (r < 2) return ox_nfail(n, "the input needs rank >= 2");
    for (int i = 0; i < r; i++)
        if (i != 1) dims[nd++] = i;
    double eps = ox_attr_f(n, "epsilon", 1e-5), mom = ox_attr_f(n, "momentum", 0.9);
    kiln_value y = ox_normalize(g, x, nd, dims, eps, &mean, &rstd);
    y = kiln_binary(g, "mul", y, ox_per_channel(g, ox_gin(n, 1), r));
    y = kiln_binary(g, "add", y, ox_per_channel(g, ox_gin(n, 2), r));
    int64_t c = kiln_value_shape(g, x)[1];
    kiln_value m = kiln_reshape(g, mean, 1, &c);
    kiln_value dx = kiln_binary(g, "sub", x, mean);
    kiln_value var =
        kiln_reshape(g, kiln_reduce(g, "mean", kiln_binary(g, "mul", dx, dx), nd, dims, 0), 1, &c);
    kiln_value rm = kiln_binary(g, "add", kiln_binary(g, "mul", ox_gin(n, 3), kiln_scalar(g, mom)),
                                kiln_binary(g, "mul", m, kiln_scalar(g, 1 - mom)));
    kiln_value rv = kiln_binary(g, "add", kiln_binary(g, "mul", ox_gin(n, 4), kiln_scalar(g, mom)),
                                kiln_binary(g, "mul", var, kiln_scalar(g, 1 - mom)));
    (void)rstd;
    return ox_set_graph(n, 0, y, OT_FLOAT) && ox_set_graph(n, 1, rm, OT_FLOAT) &&
           ox_set_graph(n, 2, rv, OT_FLOAT);
}

static bool op_batch_norm(OxNode *n) {
    if (ox_attr_i(n, "training_mode", 0)) return batch_norm_training(n);
    if (!only_first_output(n)) return false;
    kiln_value y = kiln_batch_norm(n->im->g, ox_gin(n, 0), ox_gin(n, 3), ox_gin(n, 4), ox_gin(n, 1),
                                   ox_gin(n, 2), ox_attr_f(n, "epsilon", 1e-5));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* A per-channel parameter (C) as (C, 1, ..., 1) for a rank-r input. */
kiln_value ox_per_channel(Graph *g, kiln_value p, int r) {
    if (p < 0) return KILN_NONE;
    int64_t shape[KILN_MAX_RANK];
    shape[0] = kiln_value_shape(g, p)[0];
    for (int i = 1; i < r - 1; i++) shape[i] = 1;
    return kiln_reshape(g, p, r - 1, shape);
}

/* (x - mean) / sqrt(var + eps) over dims; var is the biased variance.
 * mean and rstd (may be NULL) receive the statistics (dims kept). */
kiln_value ox_normalize(Graph *g, kiln_value x, int nd, const int *dims, double eps,
                        kiln_value *mean_out, kiln_value *rstd_out) {
    kiln_value mean = kiln_reduce(g, "mean", x, nd, dims, 1);
    kiln_value d = kiln_binary(g, "sub", x, mean);
    kiln_value var = kiln_reduce(g, "mean", kiln_binary(g, "mul", d, d), nd, dims, 1);
    kiln_value rstd = kiln_unary(g, "rsqrt", kiln_binary(g, "add", var, kiln_scalar(g, eps)));
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
    return kiln_binary(g, "mul", d, rstd);
}

/* The spatial dims 2.. of an (N, C, ...) input x into dims; their count,
 * or -1 (with the failure recorded) when x is missing or of rank < 3. */
static int spatial_dims(OxNode *n, kiln_value x, int *dims) {
    if (x < 0) return -1;
    int r = kiln_value_rank(n->im->g, x);
    if (r < 3) return ox_nfail(n, "the input needs rank >= 3, got %d", r), -1;
    for (int i = 2; i < r; i++) dims[i - 2] = i;
    return r - 2;
}

static bool op_instance_norm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    int dims[KILN_MAX_RANK], ns = spatial_dims(n, x, dims);
    if (ns < 0) return false;
    int r = ns + 2;
    kiln_value y = ox_normalize(g, x, ns, dims, ox_attr_f(n, "epsilon", 1e-5), NULL, NULL);
    y = kiln_binary(g, "mul", y, ox_per_channel(g, ox_gin(n, 1), r));
    y = kiln_binary(g, "add", y, ox_per_channel(g, ox_gin(n, 2), r));
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* Input 0 as (N, C, spatial...): its value, graph value and C; false
 * with the error when it is not of rank 3 or more. */
static bool nc_input(OxNode *n, OxVal **xv, kiln_value *x, int64_t *C) {
    *xv = ox_in(n, 0);
    *x = ox_gin(n, 0);
    if (*x < 0) return false;
    if ((*xv)->rank < 3) return ox_nfail(n, "the input needs rank >= 3, got %d", (*xv)->rank);
    *C = (*xv)->shape[1];
    return true;
}

/* GroupNormalization: x (N, C, ...) normalized over each group of C / G
 * channels and the spatial dims, as (N, G, C/G * spatial). Scale and bias
 * hold one value per group before opset 21, one per channel from 21. */
static bool op_group_norm(OxNode *n) {
    Graph *g = n->im->g;
    OxVal *xv;
    kiln_value x;
    int64_t C, G = ox_attr_i(n, "num_groups", 0);
    if (!nc_input(n, &xv, &x, &C)) return false;
    if (G < 1 || C % G)
        return ox_nfail(n, "num_groups %lld must divide the %lld channels", (long long)G,
                        (long long)C);
    int64_t rest = 1, per_group = n->im->opset < 21 ? G : C;
    for (int i = 1; i < xv->rank; i++) rest *= xv->shape[i];
    for (int k = 1; k <= 2; k++) {
        OxVal *p = ox_in(n, k);
        if (!p || ox_numel(p) != per_group)
            return ox_nfail(n, "scale and bias need %lld values (one per %s at opset %d)",
                            (long long)per_group, n->im->opset < 21 ? "group" : "channel",
                            n->im->opset);
    }
    int64_t s3[3] = {xv->shape[0], G, rest / G};
    int dim = 2;
    kiln_value y = ox_normalize(g, kiln_reshape(g, x, 3, s3), 1, &dim,
                                ox_attr_f(n, "epsilon", 1e-5), NULL, NULL);
    y = kiln_reshape(g, y, xv->rank, xv->shape);
    for (int k = 1; k <= 2; k++) {
        kiln_value p = ox_gin(n, k);
        if (n->im->opset < 21) { /* per group: each value repeated for C / G channels */
            int64_t col[2] = {G, 1}, rep[2] = {G, C / G}, flat[1] = {C};
            p = kiln_reshape(g, kiln_expand(g, kiln_reshape(g, p, 2, col), 2, rep), 1, flat);
        }
        y = kiln_binary(g, k == 1 ? "mul" : "add", y, ox_per_channel(g, p, xv->rank));
    }
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

/* LRN: x / (bias + alpha / size * sum of x^2 over the channels
 * c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2))^beta, the window
 * a sum of `size` channel slices of the zero-padded square. */
static bool op_lrn(OxNode *n) {
    Graph *g = n->im->g;
    OxVal *xv;
    kiln_value x;
    int64_t C, size = ox_attr_i(n, "size", 0);
    if (!nc_input(n, &xv, &x, &C)) return false;
    if (size < 1 || size > 1024) return ox_nfail(n, "size must be 1 to 1024");
    double alpha = ox_attr_f(n, "alpha", 1e-4), beta = ox_attr_f(n, "beta", 0.75),
           bias = ox_attr_f(n, "bias", 1.0);
    int64_t b[KILN_MAX_RANK] = {0}, e[KILN_MAX_RANK] = {0};
    b[1] = (size - 1) / 2, e[1] = size - 1 - b[1];
    kiln_value sq = kiln_pad(g, kiln_binary(g, "mul", x, x), KILN_PAD_CONSTANT, xv->rank, b, e, 0);
    kiln_value sum = KILN_NONE;
    for (int64_t k = 0; k < size; k++) {
        kiln_value s = kiln_slice(g, sq, 1, k, k + C, 1);
        sum = sum < 0 ? s : kiln_binary(g, "add", sum, s);
    }
    kiln_value den = kiln_binary(
        g, "add", kiln_binary(g, "mul", sum, ox_sc(g, alpha / (double)size)), ox_sc(g, bias));
    return ox_set_graph(n, 0, kiln_binary(g, "div", x, kiln_binary(g, "pow", den, ox_sc(g, beta))),
                        OT_FLOAT);
}

/* LayerNormalization; its optional outputs Mean and InvStdDev are the
 * statistics over the normalized dims. */
static bool op_layer_norm(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0), mean, rstd;
    if (x < 0) return false;
    int r = kiln_value_rank(g, x), dims[KILN_MAX_RANK], nd = 0;
    int64_t axis = ox_attr_i(n, "axis", -1);
    if (!ox_norm_axis(n, &axis, r)) return false;
    for (int i = (int)axis; i < r; i++) dims[nd++] = i;
    kiln_value y = ox_normalize(g, x, nd, dims, ox_attr_f(n, "epsilon", 1e-5), &mean, &rstd);
    y = kiln_binary(g, "mul", y, ox_gin(n, 1));
    if (ox_in(n, 2)) y = kiln_binary(g, "add", y, ox_gin(n, 2));
    return ox_set_graph(n, 0, y, OT_FLOAT) && ox_set_graph(n, 1, mean, OT_FLOAT) &&
           ox_set_graph(n, 2, rstd, OT_FLOAT);
}

/* ---- pooling ----------------------------------------------------------------- */

/* A constant (1, 1, OH, OW) or (N, C, 1, 1) of flat input indices. */
static kiln_value index_const(OxNode *n, const int64_t *shape, int64_t a0, int64_t a1, int64_t a2,
                              int64_t a3, int64_t off) {
    OxVal t = {.type = OT_FLOAT, .rank = 4, .v = KILN_NONE};
    int64_t m = shape[0] * shape[1] * shape[2] * shape[3], idx[4] = {0};
    memcpy(t.shape, shape, sizeof(int64_t) * 4);
    if (!(t.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)m)))
        return ox_nomem(n), KILN_NONE;
    for (int64_t i = 0; i < m; i++, ox_next_index(4, shape, idx))
        t.c[i] = (double)(idx[0] * a0 + idx[1] * a1 + idx[2] * a2 + idx[3] * a3 + off);
    return ox_materialize(n, &t);
}

/* MaxPool's Indices output (2-D): the flat input index of each window's
 * first maximum. Each kernel tap (kh, kw) is a strided slice of x padded
 * with -FLT_MAX; from the last tap to the first, where it equals the max
 * its index wins. storage_order 1 counts H fastest. */
static bool max_pool_indices(OxNode *n, const Geom *gm, kiln_value y) {
    Graph *g = n->im->g;
    const int64_t *xs = ox_in(n, 0)->shape, *ys = kiln_value_shape(g, y);
    bool col = ox_attr_i(n, "storage_order", 0) != 0;
    int64_t h = xs[2], w = xs[3], oh = ys[2], ow = ys[3], b[4] = {0, 0, gm->pb[0], gm->pb[1]},
            e[4] = {0};
    int64_t sh = col ? 1 : w, sw = col ? h : 1, one[4] = {1, 1, oh, ow},
            nc[4] = {xs[0], xs[1], 1, 1};
    for (int i = 0; i < 2; i++) {
        int64_t need = (gm->k[i] - 1) * gm->dil[i] + (ys[2 + i] - 1) * gm->stride[i] + 1;
        e[2 + i] = need > xs[2 + i] + gm->pb[i] ? need - xs[2 + i] - gm->pb[i] : 0;
    }
    kiln_value xp = kiln_pad(g, ox_gin(n, 0), KILN_PAD_CONSTANT, 4, b, e, -FLT_MAX),
               idx = KILN_NONE;
    for (int64_t k = gm->k[0] * gm->k[1] - 1; k >= 0 && xp >= 0; k--) {
        int64_t kh = k / gm->k[1] * gm->dil[0], kw = k % gm->k[1] * gm->dil[1];
        kiln_value t = kiln_slice(g, xp, 2, kh, kh + (oh - 1) * gm->stride[0] + 1, gm->stride[0]);
        t = kiln_slice(g, t, 3, kw, kw + (ow - 1) * gm->stride[1] + 1, gm->stride[1]);
        int64_t off = (kh - gm->pb[0]) * sh + (kw - gm->pb[1]) * sw;
        kiln_value ik = index_const(n, one, 0, 0, gm->stride[0] * sh, gm->stride[1] * sw, off);
        idx = kiln_where(g, kiln_binary(g, "eq", t, y), ik, idx < 0 ? kiln_scalar(g, -1) : idx);
    }
    kiln_value base = index_const(n, nc, xs[1] * h * w, h * w, 0, 0, 0);
    return ox_set_graph(n, 1, kiln_binary(g, "add", idx, base), OT_INT64);
}

static bool op_pool(OxNode *n, bool max) {
    OxVal *x = ox_in(n, 0);
    if (!ox_need_in(n, 0)) return false;
    bool indices = max && n->n->n_output > 1 && n->n->output[1][0];
    if (indices && (x->rank != 4 || ox_attr_i(n, "ceil_mode", 0)))
        return ox_nfail(n, "unsupported: MaxPool indices other than 2-D without ceil_mode");
    int ns = x->rank - 2;
    int64_t kernel[3];
    if (ns < 1 || ns > 3) return ox_nfail(n, "the input needs 1 to 3 spatial dims");
    if (ox_attr_ints(n, "kernel_shape", kernel, 3) != ns)
        return ox_nfail(n, "kernel_shape must have %d values", ns);
    Geom gm;
    if (!geom_read(n, ns, x->shape + 2, kernel, &gm)) return false;
    geom_auto_pad(n, &gm);
    kiln_pool_params p = {.nspatial = ns,
                          .ceil_mode = (int)ox_attr_i(n, "ceil_mode", 0),
                          .count_include_pad = (int)ox_attr_i(n, "count_include_pad", 0)};
    for (int i = 0; i < ns; i++) {
        p.kernel[i] = gm.k[i];
        p.stride[i] = gm.stride[i];
        p.dilation[i] = gm.dil[i];
        p.pad_begin[i] = gm.pb[i];
        p.pad_end[i] = gm.pe[i];
    }
    Graph *g = n->im->g;
    kiln_value y = max ? kiln_max_pool(g, ox_gin(n, 0), &p) : kiln_avg_pool(g, ox_gin(n, 0), &p);
    return ox_set_graph(n, 0, y, OT_FLOAT) && (!indices || max_pool_indices(n, &gm, y));
}

static bool op_max_pool(OxNode *n) { return op_pool(n, true); }
static bool op_avg_pool(OxNode *n) { return op_pool(n, false); }

static bool op_global_pool(OxNode *n, const char *red) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    int dims[KILN_MAX_RANK], ns = spatial_dims(n, x, dims);
    if (ns < 0) return false;
    return ox_set_graph(n, 0, kiln_reduce(g, red, x, ns, dims, 1), OT_FLOAT);
}

static bool op_global_avg(OxNode *n) { return op_global_pool(n, "mean"); }
static bool op_global_max(OxNode *n) { return op_global_pool(n, "amax"); }

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_nn_ops[] = {
    {"MatMul", op_matmul},
    {"Gemm", op_gemm},
    {"Conv", ox_conv},
    {"ConvTranspose", op_conv_transpose},
    {"BatchNormalization", op_batch_norm},
    {"InstanceNormalization", op_instance_norm},
    {"LayerNormalization", op_layer_norm},
    {"GroupNormalization", op_group_norm},
    {"LRN", op_lrn},
    {"MaxPool", op_max_pool},
    {"AveragePool", op_avg_pool},
    {"GlobalAveragePool", op_global_avg},
    {"GlobalMaxPool", op_global_max},
};
const size_t ox_nn_nops = sizeof ox_nn_ops / sizeof ox_nn_ops[0];
