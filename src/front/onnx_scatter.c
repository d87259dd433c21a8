/*
 * onnx_scatter.c -- ScatterElements (opsets 11 to 18) and ScatterND (11 to
 * 18), with every reduction (none, add, mul; max and min from 18), for
 * indices known at import (constants, or int inputs given with -i).
 *
 * With the indices known, where each update lands is known: for every
 * position of the output, the updates that write it, in order. So a
 * scatter is gathers: with K the most updates any position receives,
 * layer k (k < K) is gather(updates, table_k) where a position has a k-th
 * update, and the output is data combined with the layers by the
 * reduction (none: the last update replaces data; add: data plus each;
 * mul: times each; max, min), selected by a mask where a layer has no
 * update. Indices known only at run time are refused with a message (a
 * scatter with run-time indices is no gather). MaxUnpool, a scatter into
 * zeros, is here too.
 */
#include "front/front.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };
enum { SCATTER_MAX_LAYERS = 64 };

static int reduction(OxNode *n) {
    static const char *const names[] = {"none", "add", "mul", "max", "min"};
    int since[] = {0, 16, 16, 18, 18};
    for (int i = 0; i < 5; i++)
        if (ox_attr_is(n, "reduction", names[i], i == 0))
            return n->im->opset >= since[i] || i == 0 ? i : -1;
    return -1;
}

/* Output = data with update u[j] written (reduced) at flat position
 * target[j], j < m, in order. */
static bool scatter(OxNode *n, const int64_t *target, int64_t m, int red) {
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *uv = ox_in(n, 2);
    int64_t total = ox_numel(xv), *count = kcalloc((size_t)total + 1, sizeof(int64_t));
    if (!count) return ox_nomem(n);
    int64_t K = 0;
    for (int64_t j = 0; j < m; j++) K = ++count[target[j]] > K ? count[target[j]] : K;
    if (red == RED_NONE) K = K ? 1 : 0; /* only the last write shows */
    if (K > SCATTER_MAX_LAYERS) {
        kfree(count);
        return ox_nfail(n, "unsupported: one position receives more than %d updates",
                        SCATTER_MAX_LAYERS);
    }
    double *tab = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(K * total + 1));
    double *has = arena_alloc(&n->im->arena, sizeof(double) * (size_t)(K * total + 1));
    if (!tab || !has) return kfree(count), ox_nomem(n);
    for (int64_t q = 0; q < K * total; q++) tab[q] = 0, has[q] = 0;
    memset(count, 0, sizeof(int64_t) * (size_t)total);
    for (int64_t j = 0; j < m; j++) {
        int64_t t = target[j], k = red == RED_NONE ? 0 : count[t]++;
        tab[k * total + t] = (double)j;
        has[k * total + t] = 1;
    }
    kfree(count);
    int64_t flat[1] = {total}, mflat[1] = {m};
    kiln_value y = kiln_reshape(g, ox_graph(n, xv), 1, flat);
    kiln_value u = kiln_reshape(g, ox_graph(n, uv), 1, mflat);
    for (int64_t k = 0; k < K && y >= 0; k++) {
        kiln_value layer = kiln_gather(g, u, ox_const_tensor(n, 1, flat, tab + k * total), 0);
        kiln_value mask =
            kiln_binary(g, "ne", ox_const_tensor(n, 1, flat, has + k * total), ox_sc(g, 0));
        kiln_value v = red == RED_ADD   ? kiln_binary(g, "add", y, layer)
                       : red == RED_MUL ? kiln_binary(g, "mul", y, layer)
                       : red == RED_MAX ? kiln_binary(g, "maximum", y, layer)
                       : red == RED_MIN ? kiln_binary(g, "minimum", y, layer)
                                        : layer;
        y = kiln_where(g, mask, v, y);
    }
    return y >= 0 && ox_set_graph(n, 0, kiln_reshape(g, y, xv->rank, xv->shape), xv->type);
}

/* What both scatters check first: their three inputs and the reduction
 * (*red), which this opset must know. */
static bool scatter_start(OxNode *n, int *red) {
    for (int k = 0; k < 3; k++)
        if (!ox_need_in(n, k)) return false;
    if ((*red = reduction(n)) < 0)
        return ox_nfail(n, "unsupported reduction at opset %d", n->im->opset);
    return true;
}

/* The known index values of input 1, or NULL with the error set. */
static const double *known_indices(OxNode *n) {
    OxVal *iv = ox_in(n, 1);
    const double *c = ox_known(iv);
    if (!c)
        ox_nfail(n,
                 "unsupported: the indices '%s' are computed at run time (a scatter needs them "
                 "at import: give their value, kiln run -i %s=FILE)",
                 iv->name, iv->name);
    return c;
}

static bool op_scatter_elements(OxNode *n) {
    int red;
    if (!scatter_start(n, &red)) return false;
    OxVal *xv = ox_in(n, 0), *iv = ox_in(n, 1), *uv = ox_in(n, 2);
    int64_t axis = ox_attr_i(n, "axis", 0);
    if (!ox_norm_axis(n, &axis, xv->rank)) return false;
    if (iv->rank != xv->rank || uv->rank != iv->rank)
        return ox_nfail(n, "data, indices and updates need one rank");
    for (int i = 0; i < iv->rank; i++)
        if (uv->shape[i] != iv->shape[i] || (i != axis && iv->shape[i] > xv->shape[i]))
            return ox_nfail(n, "indices dim %d does not fit the updates or the data", i);
    const double *c = known_indices(n);
    if (!c) return false;
    int64_t m = ox_numel(iv), stride[KILN_MAX_RANK], pos[KILN_MAX_RANK] = {0};
    int64_t *target = kmalloc(sizeof(int64_t) * (size_t)(m + 1)), d = xv->shape[axis];
    if (!target) return ox_nomem(n);
    for (int i = xv->rank - 1, s = 1; i >= 0; s *= (int)xv->shape[i], i--) stride[i] = s;
    for (int64_t j = 0; j < m; j++, ox_next_index(iv->rank, iv->shape, pos)) {
        double t = c[j] < 0 ? c[j] + (double)d : c[j];
        if (!(t >= 0 && t < (double)d)) {
            kfree(target);
            return ox_nfail(n, "index %g is outside [-%lld, %lld)", c[j], (long long)d,
                            (long long)d);
        }
        int64_t at = 0;
        for (int i = 0; i < xv->rank; i++) at += (i == axis ? (int64_t)t : pos[i]) * stride[i];
        target[j] = at;
    }
    bool ok = scatter(n, target, m, red);
    kfree(target);
    return ok;
}

static bool op_scatter_nd(OxNode *n) {
    int red;
    if (!scatter_start(n, &red)) return false;
    OxVal *xv = ox_in(n, 0), *iv = ox_in(n, 1), *uv = ox_in(n, 2);
    if (iv->rank < 1) return ox_nfail(n, "indices need rank >= 1");
    int q = (int)iv->shape[iv->rank - 1];
    if (q < 1 || q > xv->rank) return ox_nfail(n, "the index tuples have %d entries", q);
    /* updates: indices.shape[:-1] + data.shape[q:] */
    int want = iv->rank - 1 + xv->rank - q;
    bool fits = uv->rank == want;
    for (int i = 0; fits && i < iv->rank - 1; i++) fits = uv->shape[i] == iv->shape[i];
    for (int i = q; fits && i < xv->rank; i++)
        fits = uv->shape[iv->rank - 1 + i - q] == xv->shape[i];
    if (!fits) return ox_nfail(n, "the updates' shape does not match indices and data");
    const double *c = known_indices(n);
    if (!c) return false;
    int64_t rows = ox_numel(iv) / q, slice = 1, stride[KILN_MAX_RANK];
    for (int i = q; i < xv->rank; i++) slice *= xv->shape[i];
    for (int i = xv->rank - 1, s = 1; i >= 0; s *= (int)xv->shape[i], i--) stride[i] = s;
    int64_t *target = kmalloc(sizeof(int64_t) * (size_t)(rows * slice + 1));
    if (!target) return ox_nomem(n);
    for (int64_t j = 0; j < rows; j++) {
        int64_t at = 0;
        for (int i = 0; i < q; i++) {
            double t = c[j * q + i], d = (double)xv->shape[i];
            if (t < 0) t += d;
            if (!(t >= 0 && t < d)) {
                kfree(target);
                return ox_nfail(n, "index %g of dim %d is out of range", c[j * q + i], i);
            }
            at += (int64_t)t * stride[i];
        }
        for (int64_t e = 0; e < slice; e++) target[j * slice + e] = at + e;
    }
    bool ok = scatter(n, target, rows * slice, red);
    kfree(target);
    return ok;
}

/* MaxUnpool (9, 11): X's values written into zeros of the pooled-from
 * shape at the flat output positions I holds (MaxPool's Indices), I known
 * at import; a position written twice keeps the last. One gather from
 * X flattened with a zero after it: each output position reads its value,
 * or the zero. The output's spatial size is output_shape's, or
 * (in - 1) * stride + kernel - pads. */
static bool op_max_unpool(OxNode *n) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *iv = ox_in(n, 1);
    int r = xv->rank, ns = r - 2;
    if (r < 3) return ox_nfail(n, "X must be (N, C, spatial...), not rank %d", r);
    if (iv->rank != r || memcmp(iv->shape, xv->shape, sizeof(int64_t) * (size_t)r))
        return ox_nfail(n, "I must have X's shape");
    int64_t ks[KILN_MAX_RANK], st[KILN_MAX_RANK], pads[2 * KILN_MAX_RANK] = {0};
    int64_t out[KILN_MAX_RANK];
    if (ox_attr_ints(n, "kernel_shape", ks, KILN_MAX_RANK) != ns)
        return ox_nfail(n, "kernel_shape must have %d values", ns);
    for (int i = 0; i < ns; i++) st[i] = 1;
    int nst = ox_attr_ints(n, "strides", st, KILN_MAX_RANK),
        npd = ox_attr_ints(n, "pads", pads, 2 * KILN_MAX_RANK);
    if (nst == -2 || npd == -2) return false;
    if ((nst >= 0 && nst != ns) || (npd >= 0 && npd != 2 * ns))
        return ox_nfail(n, "strides and pads must have %d and %d values", ns, 2 * ns);
    int64_t def[KILN_MAX_RANK];
    def[0] = out[0] = xv->shape[0], def[1] = out[1] = xv->shape[1];
    for (int i = 0; i < ns; i++)
        def[i + 2] = out[i + 2] = (xv->shape[i + 2] - 1) * st[i] + ks[i] - pads[i] - pads[i + ns];
    if (ox_in(n, 2) && ox_const_ints(n, 2, out, KILN_MAX_RANK, "output_shape") != r)
        return ox_known(ox_in(n, 2)) ? ox_nfail(n, "output_shape must have %d values", r) : false;
    int64_t total = util_numel(r, out), dtotal = util_numel(r, def), m = ox_numel(xv);
    if (!ox_index_fits(n, total, "an output") || !ox_index_fits(n, m + 1, "an input")) return false;
    for (int i = 0; i < r; i++)
        if (out[i] < 1 || def[i] < 1 || out[i] < def[i] || (i < 2 && out[i] != def[i]))
            return ox_nfail(n, "the output's dim %d is %lld, for an unpooled %lld", i,
                            (long long)out[i], (long long)def[i]);
    const double *c = known_indices(n);
    if (!c) return false;
    double *src = arena_alloc(&n->im->arena, sizeof(double) * (size_t)total);
    if (!src) return ox_nomem(n);
    for (int64_t p = 0; p < total; p++) src[p] = (double)m;
    /* an index is a position in the unpooled shape (as MaxPool's Indices),
     * placed at the same coordinates of a larger output_shape */
    for (int64_t q = 0; q < m; q++) {
        if (!(c[q] >= 0 && c[q] < (double)dtotal))
            return ox_nfail(n, "index %g is outside the unpooled %lld elements", c[q],
                            (long long)dtotal);
        int64_t rest = (int64_t)c[q], at = 0, stride = 1;
        for (int i = r - 1; i >= 0; stride *= out[i], rest /= def[i], i--)
            at += rest % def[i] * stride;
        src[at] = (double)q;
    }
    int64_t flat[1] = {m}, one[1] = {1};
    kiln_value parts[2] = {kiln_reshape(g, ox_graph(n, xv), 1, flat),
                           ox_const_tensor(n, 1, one, &(double){0})};
    kiln_value y =
        kiln_gather(g, kiln_concat(g, 2, parts, 0), ox_const_tensor(n, 1, &total, src), 0);
    return ox_set_graph(n, 0, kiln_reshape(g, y, r, out), xv->type);
}

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_scatter_ops[] = {
    {"ScatterElements", op_scatter_elements},
    {"Scatter", op_scatter_elements}, /* opsets 9, 10: ScatterElements' earlier name */
    {"ScatterND", op_scatter_nd},
    {"MaxUnpool", op_max_unpool},
};
const size_t ox_scatter_nops = sizeof ox_scatter_ops / sizeof ox_scatter_ops[0];
