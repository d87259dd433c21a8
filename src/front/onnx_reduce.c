/*
 * onnx_reduce.c -- Softmax, LogSoftmax, the Reduce* family, ArgMax / ArgMin,
 * Hardmax and MeanVarianceNormalization.
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- softmax, reductions, argmax ----------------------------------------- */

/* Softmax before opset 13 flattens to 2-D at axis (default 1); from 13 it is
 * over the one axis (default -1). */
static bool op_softmax_like(OxNode *n, bool log) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    if (x < 0) return false;
    int r = kiln_value_rank(g, x);
    bool old = n->im->opset < 13;
    int64_t axis = ox_attr_i(n, "axis", old ? 1 : -1);
    if (!ox_norm_axis(n, &axis, r)) return false;
    if (!old || axis == r - 1) {
        kiln_value y = log ? kiln_log_softmax(g, x, (int)axis) : kiln_softmax(g, x, (int)axis);
        return ox_set_graph(n, 0, y, OT_FLOAT);
    }
    int64_t s[2] = {1, 1};
    const int64_t *xs = kiln_value_shape(g, x);
    int64_t keep[KILN_MAX_RANK];
    memcpy(keep, xs, sizeof(int64_t) * (size_t)r);
    for (int i = 0; i < r; i++) s[i >= axis] *= xs[i];
    kiln_value f = kiln_reshape(g, x, 2, s);
    f = log ? kiln_log_softmax(g, f, 1) : kiln_softmax(g, f, 1);
    return ox_set_graph(n, 0, kiln_reshape(g, f, r, keep), OT_FLOAT);
}

static bool op_softmax(OxNode *n) { return op_softmax_like(n, false); }
static bool op_log_softmax(OxNode *n) { return op_softmax_like(n, true); }

/* Reduce over the axes of the node (attribute, or input 1: ReduceSum from
 * opset 13, every Reduce* from 18); none: every dim, unless
 * noop_with_empty_axes. */
static bool reduce_axes(OxNode *n, int rank, int *dims, int *nd, bool *noop) {
    int64_t axes[KILN_MAX_RANK];
    bool input = n->im->opset >= 18 || (n->im->opset >= 13 && !strcmp(ox_opname(n), "ReduceSum"));
    int na = input ? (ox_in(n, 1) ? ox_const_ints(n, 1, axes, KILN_MAX_RANK, "axes") : -1)
                   : ox_attr_ints(n, "axes", axes, KILN_MAX_RANK);
    if (na < -1) return false;
    *noop = na <= 0 && ox_attr_i(n, "noop_with_empty_axes", 0);
    *nd = 0;
    for (int i = 0; i < na; i++) {
        if (!ox_norm_axis(n, &axes[i], rank)) return false;
        dims[(*nd)++] = (int)axes[i];
    }
    if (*nd == 0)
        for (int i = 0; i < rank; i++) dims[(*nd)++] = i;
    return true;
}

/* ReduceSum, Prod, Max, Min or Mean of a constant (shape arithmetic such
 * as the element count of a Shape): computed here, a constant still. */
static bool reduce_const(OxNode *n, const char *op) {
    OxVal *x = ox_in(n, 0);
    int dims[KILN_MAX_RANK], nd, r = x->rank;
    bool noop, keep = ox_attr_i(n, "keepdims", 1) != 0, red[KILN_MAX_RANK] = {false};
    if (!reduce_axes(n, r, dims, &nd, &noop)) return false;
    if (noop) nd = 0;
    for (int i = 0; i < nd; i++) red[dims[i]] = true;
    int64_t os[KILN_MAX_RANK], ks[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0}, count = 1;
    int orank = 0;
    for (int i = 0; i < r; i++) {
        ks[i] = red[i] ? 1 : x->shape[i];
        count *= red[i] ? x->shape[i] : 1;
        if (!red[i] || keep) os[orank++] = ks[i];
    }
    OxVal *o = ox_set_const(n, 0, x->type, orank, os);
    if (!o) return ox_nomem(n);
    int64_t m = ox_numel(o);
    /* NaN marks "no value yet"; over nothing, the identity (mean 0 / 0) */
    double none = !strcmp(op, "Prod")  ? 1
                  : ox_numel(x) > 0    ? NAN
                  : !strcmp(op, "Sum") ? 0
                  : !strcmp(op, "Max") ? -INFINITY
                  : !strcmp(op, "Min") ? INFINITY
                                       : NAN;
    for (int64_t k = 0; k < m; k++) o->c[k] = none;
    for (int64_t k = 0; k < ox_numel(x); k++, ox_next_index(r, x->shape, idx)) {
        int64_t at = 0;
        for (int i = 0; i < r; i++) at = at * ks[i] + (red[i] ? 0 : idx[i]);
        double v = x->c[k], *c = &o->c[at];
        if (!strcmp(op, "Prod"))
            *c *= v;
        else if (isnan(*c))
            *c = v;
        else if (!strcmp(op, "Max"))
            *c = v > *c || isnan(v) ? v : *c;
        else if (!strcmp(op, "Min"))
            *c = v < *c || isnan(v) ? v : *c;
        else
            *c += v;
    }
    for (int64_t k = 0; !strcmp(op, "Mean") && k < m; k++) {
        o->c[k] /= (double)count;
        if (ox_is_int_type(x->type)) o->c[k] = trunc(o->c[k]); /* as ONNX's reference */
    }
    return true;
}

static bool op_reduce(OxNode *n) {
    Graph *g = n->im->g;
    const char *op = ox_opname(n) + 6; /* after "Reduce" */
    if (ox_in(n, 0) && ox_in(n, 0)->c &&
        (!strcmp(op, "Sum") || !strcmp(op, "Prod") || !strcmp(op, "Max") || !strcmp(op, "Min") ||
         !strcmp(op, "Mean")))
        return reduce_const(n, op);
    kiln_value x = ox_gin(n, 0);
    if (x < 0) return false;
    int dims[KILN_MAX_RANK], nd;
    bool noop, keep = ox_attr_i(n, "keepdims", 1) != 0;
    if (!reduce_axes(n, kiln_value_rank(g, x), dims, &nd, &noop)) return false;
    if (noop) return ox_set_graph(n, 0, x, ox_in(n, 0)->type);
    if (kiln_value_rank(g, x) == 0) return ox_set_graph(n, 0, x, ox_in(n, 0)->type);
    kiln_value y;
    if (!strcmp(op, "Sum"))
        y = kiln_reduce(g, "sum", x, nd, dims, keep);
    else if (!strcmp(op, "Mean"))
        y = kiln_reduce(g, "mean", x, nd, dims, keep);
    else if (!strcmp(op, "Max"))
        y = kiln_reduce(g, "amax", x, nd, dims, keep);
    else if (!strcmp(op, "Min"))
        y = kiln_reduce(g, "amin", x, nd, dims, keep);
    else if (!strcmp(op, "Prod"))
        y = kiln_reduce(g, "prod", x, nd, dims, keep);
    else if (!strcmp(op, "SumSquare") || !strcmp(op, "L2"))
        y = kiln_reduce(g, "sum", kiln_binary(g, "mul", x, x), nd, dims, keep);
    else if (!strcmp(op, "L1"))
        y = kiln_reduce(g, "sum", kiln_unary(g, "abs", x), nd, dims, keep);
    else if (!strcmp(op, "LogSum"))
        y = kiln_unary(g, "log", kiln_reduce(g, "sum", x, nd, dims, keep));
    else { /* LogSumExp, shifted by the max for range */
        kiln_value m = kiln_reduce(g, "amax", x, nd, dims, 1);
        kiln_value e = kiln_unary(g, "exp", kiln_binary(g, "sub", x, m));
        y = kiln_binary(g, "add", kiln_unary(g, "log", kiln_reduce(g, "sum", e, nd, dims, 1)), m);
        if (!keep) {
            int64_t s[KILN_MAX_RANK];
            int r = 0;
            const int64_t *ys = kiln_value_shape(g, x);
            for (int i = 0; i < kiln_value_rank(g, x); i++) {
                bool red = false;
                for (int k = 0; k < nd; k++) red |= dims[k] == i;
                if (!red) s[r++] = ys[i];
            }
            y = kiln_reshape(g, y, r, s);
        }
    }
    if (!strcmp(op, "L2")) y = kiln_unary(g, "sqrt", y);
    return ox_set_graph(n, 0, y, ox_in(n, 0)->type);
}

/* ArgMax/ArgMin = the first (or last) index where x equals its extreme:
 * amin (amax) over where(x == m, iota, BIG (-1)), iota a constant. */
/* The index of the first (or last) extreme of x along ax, dims kept. */
static kiln_value arg_extreme(OxNode *n, kiln_value x, int ax, bool max, bool last, bool keep) {
    Graph *g = n->im->g;
    int r = kiln_value_rank(g, x);
    kiln_value iota = ox_iota(n, r, ax, kiln_value_shape(g, x)[ax]);
    kiln_value m = kiln_reduce(g, max ? "amax" : "amin", x, 1, &ax, 1);
    kiln_value hit = kiln_binary(g, "eq", x, m);
    kiln_value idx = kiln_where(g, hit, iota, kiln_scalar(g, last ? -1 : 1e9));
    return kiln_reduce(g, last ? "amax" : "amin", idx, 1, &ax, keep);
}

static bool op_arg(OxNode *n, bool max) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    if (x < 0) return false;
    int64_t axis = ox_attr_i(n, "axis", 0);
    if (!ox_norm_axis(n, &axis, kiln_value_rank(g, x))) return false;
    bool last = ox_attr_i(n, "select_last_index", 0) != 0, keep = ox_attr_i(n, "keepdims", 1) != 0;
    return ox_set_graph(n, 0, arg_extreme(n, x, (int)axis, max, last, keep), OT_INT64);
}

/* Hardmax: 1 at the first maximum along axis, else 0; before opset 13
 * over the 2-D coercion at axis, as Softmax. */
static bool op_hardmax(OxNode *n) {
    Graph *g = n->im->g;
    kiln_value x = ox_gin(n, 0);
    if (x < 0) return false;
    int r = kiln_value_rank(g, x);
    bool old = n->im->opset < 13;
    int64_t axis = ox_attr_i(n, "axis", old ? 1 : -1), s[2] = {1, 1}, keep[KILN_MAX_RANK];
    if (!ox_norm_axis(n, &axis, r)) return false;
    memcpy(keep, kiln_value_shape(g, x), sizeof(int64_t) * (size_t)r);
    int ax = (int)axis;
    if (old) {
        for (int i = 0; i < r; i++) s[i >= axis] *= keep[i];
        x = kiln_reshape(g, x, 2, s);
        ax = 1;
    }
    int rr = old ? 2 : r;
    kiln_value first = arg_extreme(n, x, ax, true, false, true);
    kiln_value at = kiln_binary(g, "eq", ox_iota(n, rr, ax, kiln_value_shape(g, x)[ax]), first);
    kiln_value y = kiln_where(g, at, kiln_scalar(g, 1), kiln_scalar(g, 0));
    if (old) y = kiln_reshape(g, y, r, keep);
    return ox_set_graph(n, 0, y, OT_FLOAT);
}

static bool op_argmax(OxNode *n) { return op_arg(n, true); }
static bool op_argmin(OxNode *n) { return op_arg(n, false); }

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_reduce_ops[] = {
    {"Softmax", op_softmax},        {"LogSoftmax", op_log_softmax}, {"ReduceSum", op_reduce},
    {"ReduceMean", op_reduce},      {"ReduceMax", op_reduce},       {"ReduceMin", op_reduce},
    {"ReduceProd", op_reduce},      {"ReduceL2", op_reduce},        {"ReduceL1", op_reduce},
    {"ReduceSumSquare", op_reduce}, {"ReduceLogSum", op_reduce},    {"ReduceLogSumExp", op_reduce},
    {"ArgMax", op_argmax},          {"ArgMin", op_argmin},          {"Hardmax", op_hardmax},
};
const size_t ox_reduce_nops = sizeof ox_reduce_ops / sizeof ox_reduce_ops[0];
