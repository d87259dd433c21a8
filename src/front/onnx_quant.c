/*
 * onnx_quant.c -- ONNX's quantization ops: QuantizeLinear,
 * DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
 * QLinearMatMul and QLinearConv, over int8 and uint8 (and int16, uint16,
 * int32 where the spec allows them).
 *
 * kiln computes them in f32: dequantize (x - zero_point, times the scale),
 * the f32 op, quantize (divide by the scale, round half to even, add the
 * zero point, saturate), the pointwise parts fused into their neighbours.
 * Every 8- and 16-bit value is exact in f32, and so is every product of two
 * 8-bit values; a matmul or conv sums them exactly while each sum stays
 * below 2^24 (16.7 million: 256 terms of 255 x 255, far more of typical
 * values). Past that, f32 rounding of the sum can move a requantized value
 * by one step, where ONNX Runtime's int32 accumulation does not. Speed of
 * int8 kernels is later work.
 */
#include "front/front.h"
#include <math.h>
#include <string.h>

/* The saturation range of a quantized type. */
static bool qrange(OxNode *n, int type, double *lo, double *hi) {
    switch (type) {
    case OT_UINT8: *lo = 0, *hi = 255; return true;
    case OT_INT8: *lo = -128, *hi = 127; return true;
    case OT_UINT16: *lo = 0, *hi = 65535; return true;
    case OT_INT16: *lo = -32768, *hi = 32767; return true;
    case OT_INT32: *lo = -2147483648.0, *hi = 2147483647.0; return true;
    }
    return ox_nfail(n, "unsupported: quantized type %s", ox_type_name(type));
}

/* A scale or zero point p broadcast along axis of a rank-r tensor whose
 * dim there is len: a scalar (or 1 element) as it is, a 1-D one of len
 * values reshaped to run along the axis. */
static kiln_value along(OxNode *n, OxVal *p, int axis, int r, int64_t len, const char *what) {
    Graph *g = n->im->g;
    int64_t m = ox_numel(p), s[KILN_MAX_RANK];
    if (m == 1) return kiln_reshape(g, ox_graph(n, p), 0, s);
    if (p->rank != 1 || m != len)
        return ox_nfail(n, "%s must be a scalar or 1-D of %lld (the axis' length), not %lld values",
                        what, (long long)len, (long long)m),
               KILN_NONE;
    for (int i = 0; i < r; i++) s[i] = i == axis ? len : 1;
    return kiln_reshape(g, ox_graph(n, p), r, s);
}

/* round-half-even(v) + zp, saturated to type. */
static kiln_value quantize(OxNode *n, kiln_value v, kiln_value zp, int type) {
    Graph *g = n->im->g;
    double lo = 0, hi = 0;
    if (!qrange(n, type, &lo, &hi)) return KILN_NONE;
    kiln_value r = ox_round_even(g, v);
    if (zp >= 0) r = kiln_binary(g, "add", r, zp);
    return kiln_clamp(g, r, 1, lo, 1, hi);
}

/* The zero point of input k (absent: none), its type in *type (the
 * default when absent). */
static kiln_value zero_point(OxNode *n, int k, int axis, int r, int64_t len, int *type) {
    OxVal *z = ox_in(n, k);
    if (!z) return KILN_NONE;
    *type = z->type;
    return along(n, z, axis, r, len, "the zero point");
}

/* The axis of a per-axis scale (input 1): axis, checked against x's rank
 * only when the scale has more than one value (a per-tensor scale ignores
 * it, as a rank-1 x with the default axis 1 needs). */
static bool qaxis(OxNode *n, const OxVal *x, int64_t *axis, int64_t *len) {
    *axis = ox_attr_i(n, "axis", 1);
    if (ox_numel(ox_in(n, 1)) == 1) return *axis = 0, *len = 1, true;
    if (!ox_norm_axis(n, axis, x->rank)) return false;
    *len = x->shape[*axis];
    return true;
}

static bool block_free(OxNode *n) {
    return ox_attr_i(n, "block_size", 0) == 0 ||
           ox_nfail(n, "unsupported: blocked quantization (block_size)");
}

/* QuantizeLinear: y = saturate(round(x / scale) + zero_point), the type
 * the zero point's (uint8 without one; output_dtype from 21). */
static bool op_quantize(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1) || !block_free(n)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    int64_t axis, len;
    if (!qaxis(n, x, &axis, &len)) return false;
    int type = (int)ox_attr_i(n, "output_dtype", 0);
    if (!type) type = OT_UINT8;
    kiln_value s = along(n, ox_in(n, 1), (int)axis, x->rank, len, "the scale");
    kiln_value z = zero_point(n, 2, (int)axis, x->rank, len, &type);
    if (s < 0 || (ox_in(n, 2) && z < 0)) return false;
    kiln_value y = quantize(n, kiln_binary(g, "true_divide", ox_gin(n, 0), s), z, type);
    return ox_set_graph(n, 0, y, type);
}

/* DequantizeLinear: y = (x - zero_point) * scale. */
static bool op_dequantize(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1) || !block_free(n)) return false;
    Graph *g = n->im->g;
    OxVal *x = ox_in(n, 0);
    if (!ox_is_int_type(x->type))
        return ox_nfail(n, "unsupported: dequantizing %s", ox_type_name(x->type));
    int64_t axis, len;
    if (!qaxis(n, x, &axis, &len)) return false;
    int zt = x->type;
    kiln_value s = along(n, ox_in(n, 1), (int)axis, x->rank, len, "the scale");
    kiln_value z = zero_point(n, 2, (int)axis, x->rank, len, &zt);
    if (s < 0 || (ox_in(n, 2) && z < 0)) return false;
    kiln_value v = ox_gin(n, 0);
    if (z >= 0) v = kiln_binary(g, "sub", v, z);
    return ox_set_graph(n, 0, kiln_binary(g, "mul", v, s), OT_FLOAT);
}

/* DynamicQuantizeLinear: uint8 with scale (max(0, max x) - min(0, min x))
 * / 255 and zero point saturate(round(-min / scale)); an all-zero x has
 * scale 0, zero point 0 and y 0. */
static bool op_dynamic_quantize(OxNode *n) {
    if (!ox_need_in(n, 0)) return false;
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0), zero = ox_sc(g, 0);
    kiln_value mx = kiln_binary(g, "maximum", kiln_reduce(g, "amax", x, 0, NULL, 0), zero);
    kiln_value mn = kiln_binary(g, "minimum", kiln_reduce(g, "amin", x, 0, NULL, 0), zero);
    kiln_value scale = kiln_binary(g, "div", kiln_binary(g, "sub", mx, mn), ox_sc(g, 255));
    kiln_value safe = kiln_where(g, kiln_binary(g, "eq", scale, zero), ox_sc(g, 1), scale);
    kiln_value zp = quantize(n, kiln_binary(g, "true_divide", kiln_unary(g, "neg", mn), safe),
                             KILN_NONE, OT_UINT8);
    kiln_value y = quantize(n, kiln_binary(g, "true_divide", x, safe), zp, OT_UINT8);
    return ox_set_graph(n, 0, y, OT_UINT8) && ox_set_graph(n, 1, scale, OT_FLOAT) &&
           ox_set_graph(n, 2, zp, OT_UINT8);
}

/* v - zero point k, the zero point along axis of v's rank (or none). */
static kiln_value shifted(OxNode *n, int vk, int zk, int axis, int64_t len) {
    Graph *g = n->im->g;
    OxVal *v = ox_in(n, vk);
    int zt;
    kiln_value z = zero_point(n, zk, axis, v->rank, len, &zt);
    if (ox_in(n, zk) && z < 0) return KILN_NONE;
    return z >= 0 ? kiln_binary(g, "sub", ox_gin(n, vk), z) : ox_gin(n, vk);
}

/* MatMulInteger: (A - a_zero_point) @ (B - b_zero_point), int32; a's zero
 * point per row (its dim -2) or one, b's per column (dim -1) or one. */
static bool op_matmul_integer(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    OxVal *a = ox_in(n, 0), *b = ox_in(n, 1);
    if (a->rank < 2 || b->rank < 2)
        return ox_nfail(n, "unsupported: 1-D operands (kiln reads 2-D and batched ones)");
    kiln_value av = shifted(n, 0, 2, a->rank - 2, a->shape[a->rank - 2]);
    kiln_value bv = shifted(n, 1, 3, b->rank - 1, b->shape[b->rank - 1]);
    if (av < 0 || bv < 0) return false;
    return ox_set_graph(n, 0, kiln_matmul(n->im->g, av, bv), OT_INT32);
}

/* QLinearMatMul: quantize((a - a_zp) @ (b - b_zp) * a_scale * b_scale /
 * y_scale, y_zp); b's scale and zero point may be per column. */
static bool op_qlinear_matmul(OxNode *n) {
    for (int k = 0; k < 8; k++)
        if (!ox_need_in(n, k)) return false;
    Graph *g = n->im->g;
    OxVal *a = ox_in(n, 0), *b = ox_in(n, 3), *yz = ox_in(n, 7);
    if (a->rank < 2 || b->rank < 2)
        return ox_nfail(n, "unsupported: 1-D operands (kiln reads 2-D and batched ones)");
    int64_t M = a->shape[a->rank - 2], N = b->shape[b->rank - 1];
    kiln_value av = shifted(n, 0, 2, a->rank - 2, M), bv = shifted(n, 3, 5, b->rank - 1, N);
    kiln_value as = along(n, ox_in(n, 1), a->rank - 2, a->rank, M, "a_scale");
    kiln_value bs = along(n, ox_in(n, 4), b->rank - 1, b->rank, N, "b_scale");
    kiln_value ys = along(n, ox_in(n, 6), 0, 0, 1, "y_scale");
    kiln_value yzp = along(n, yz, 0, 0, 1, "y_zero_point");
    if (av < 0 || bv < 0 || as < 0 || bs < 0 || ys < 0 || yzp < 0) return false;
    kiln_value acc = kiln_matmul(g, av, bv);
    kiln_value v = kiln_binary(g, "true_divide",
                               kiln_binary(g, "mul", kiln_binary(g, "mul", acc, as), bs), ys);
    return ox_set_graph(n, 0, quantize(n, v, yzp, yz->type), yz->type);
}

/* The integer convolutions: Conv of (x - x_zp) and (w - w_zp) (w's zero
 * point per output channel or one; folded into a constant w), plus B
 * (int32, QLinearConv). Returns the accumulator (f32 holding integers). */
static kiln_value conv_integer(OxNode *n, int xk, int xzk, int wk, int wzk, int bk) {
    OxVal *x = ox_in(n, xk), *w = ox_in(n, wk), *wz = wzk >= 0 ? ox_in(n, wzk) : NULL;
    if (w->rank < 3) return ox_nfail(n, "W must be (M, C/group, k...)"), KILN_NONE;
    int64_t M = w->shape[0];
    kiln_value xv = shifted(n, xk, xzk, 1, x->rank > 1 ? x->shape[1] : 1);
    if (xv < 0) return KILN_NONE;
    OxVal xs = {.name = x->name, .type = OT_FLOAT, .rank = x->rank, .v = xv};
    memcpy(xs.shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    OxVal ws = *w;
    ws.type = OT_FLOAT;
    if (wz && ox_numel(wz) != 1 && ox_numel(wz) != M)
        return ox_nfail(n, "the weight zero point must be one or one per output channel"),
               KILN_NONE;
    if (w->c && wz && wz->c) { /* a constant weight: shifted at import */
        int64_t per = ox_numel(w) / M, one = ox_numel(wz) == 1;
        ws.c = arena_alloc(&n->im->arena, sizeof(double) * (size_t)ox_numel(w));
        if (!ws.c) return ox_nomem(n), KILN_NONE;
        for (int64_t i = 0; i < ox_numel(w); i++) ws.c[i] = w->c[i] - wz->c[one ? 0 : i / per];
        ws.v = KILN_NONE;
    } else if (wz) {
        ws.c = NULL;
        ws.v = shifted(n, wk, wzk, 0, M);
        if (ws.v < 0) return KILN_NONE;
    }
    OxVal *in[3] = {&xs, &ws, bk >= 0 ? ox_in(n, bk) : NULL};
    OxVal bias;
    if (in[2]) bias = *in[2], bias.type = OT_FLOAT, in[2] = &bias;
    OxNode c = *n;
    c.nin = 3;
    c.in = in;
    if (!ox_conv(&c)) return KILN_NONE;
    OxVal *o = ox_out_slot(n, 0);
    return o ? o->v : KILN_NONE;
}

static bool op_conv_integer(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    kiln_value acc = conv_integer(n, 0, 2, 1, 3, -1);
    return ox_set_graph(n, 0, acc, OT_INT32);
}

/* QLinearConv: quantize((conv + B) * x_scale * w_scale[m] / y_scale, y_zp). */
static bool op_qlinear_conv(OxNode *n) {
    for (int k = 0; k < 8; k++)
        if (!ox_need_in(n, k)) return false;
    Graph *g = n->im->g;
    OxVal *w = ox_in(n, 3), *yz = ox_in(n, 7);
    kiln_value acc = conv_integer(n, 0, 2, 3, 5, ox_in(n, 8) ? 8 : -1);
    if (acc < 0) return false;
    int r = kiln_value_rank(g, acc);
    kiln_value xs = along(n, ox_in(n, 1), 0, 0, 1, "x_scale");
    kiln_value wsc = along(n, ox_in(n, 4), 1, r, w->shape[0], "w_scale");
    kiln_value ys = along(n, ox_in(n, 6), 0, 0, 1, "y_scale");
    kiln_value yzp = along(n, yz, 0, 0, 1, "y_zero_point");
    if (xs < 0 || wsc < 0 || ys < 0 || yzp < 0) return false;
    kiln_value v = kiln_binary(g, "true_divide",
                               kiln_binary(g, "mul", kiln_binary(g, "mul", acc, xs), wsc), ys);
    return ox_set_graph(n, 0, quantize(n, v, yzp, yz->type), yz->type);
}

const OxHandler ox_quant_ops[] = {
    {"QuantizeLinear", op_quantize},
    {"DequantizeLinear", op_dequantize},
    {"DynamicQuantizeLinear", op_dynamic_quantize},
    {"MatMulInteger", op_matmul_integer},
    {"ConvInteger", op_conv_integer},
    {"QLinearMatMul", op_qlinear_matmul},
    {"QLinearConv", op_qlinear_conv},
};
const size_t ox_quant_nops = sizeof ox_quant_ops / sizeof ox_quant_ops[0];
