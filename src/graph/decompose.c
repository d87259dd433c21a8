/*
 * decompose.c -- composite ops become primitives.   requires: a valid graph;
 * gives: a graph with no KIND_COMPOSITE node, same inputs and outputs.
 *
 * The scheduler only understands pointwise ops, reductions, views, externs
 * and random values, so softmax, layer_norm and the rest are rewritten here,
 * before lowering or interpreting, into exactly those. The rewrite builds a
 * new graph through the public builders (which re-check shapes), with the
 * graph's `origin` set to the composite's name: every primitive remembers the
 * op the user wrote, and kernel names and logs show it (a fused softmax is
 * `cpp_fused_softmax_0`, not `cpp_fused_amax_div_exp_sub_sum_0`).
 *
 * Pattern rewrites (rewrite.c: Conv-BN folding) are planned over the source
 * graph first and applied in the same walk: a folded pair's batch_norm node
 * becomes the folded conv, and the nodes the fold replaces are not copied.
 */
#include "graph/graph.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

static int bin(Graph *g, const char *op, int a, int b) { return kiln_binary(g, op, a, b); }
static int num(Graph *g, double v) { return kiln_scalar(g, v); }

/* The reduced dims of a reduction-like node as ints. */
static int dims_of(const Node *n, int *dims) {
    for (int i = 0; i < n->nattr; i++) dims[i] = (int)n->attr[i];
    return n->nattr;
}

static int mean(Graph *g, int x, int nd, const int *dims, bool keepdim) {
    const Node *xn = graph_node(g, x);
    int64_t count = 1;
    for (int i = 0; i < nd; i++) count *= xn->shape[dims[i]];
    if (nd == 0) count = node_numel(xn);
    int s = kiln_reduce(g, "sum", x, nd, nd ? dims : NULL, keepdim);
    return bin(g, "mul", s, num(g, 1.0 / (double)count));
}

/* softmax = exp(x - amax) / sum(exp(x - amax)), the max keeps exp finite */
static int softmax(Graph *g, int x, const Node *n, bool logarithmic) {
    int dims[KILN_MAX_RANK], nd = dims_of(n, dims);
    if (nd == 0) {
        dims[0] = 0;
        nd = 1;
    } /* a scalar: reduce over nothing */
    int m = kiln_reduce(g, "amax", x, nd, dims, 1);
    int sh = bin(g, "sub", x, m);
    int e = kiln_unary(g, "exp", sh);
    int s = kiln_reduce(g, "sum", e, nd, dims, 1);
    if (logarithmic) return bin(g, "sub", sh, kiln_unary(g, "log", s));
    return bin(g, "div", e, s);
}

/* layer_norm over the last len(normalized_shape) dims, biased variance */
static int layer_norm(Graph *g, int x, const Node *n, const int *map) {
    int rank = graph_node(g, x)->rank, dims[KILN_MAX_RANK];
    for (int i = 0; i < n->nattr; i++) dims[i] = rank - n->nattr + i;
    int mu = mean(g, x, n->nattr, dims, true);
    int d = bin(g, "sub", x, mu);
    int var = mean(g, bin(g, "mul", d, d), n->nattr, dims, true);
    int y = bin(g, "mul", d, kiln_unary(g, "rsqrt", bin(g, "add", var, num(g, n->f[0]))));
    if (n->flags & NF_LN_WEIGHT) y = bin(g, "mul", y, map[n->in[1]]);
    if (n->flags & NF_LN_BIAS) y = bin(g, "add", y, map[n->in[2]]);
    return y;
}

/* A per-channel [C] parameter viewed as [C, 1, ...] to broadcast at dim 1. */
static int per_channel(Graph *g, int p, int rank) {
    int64_t shape[KILN_MAX_RANK];
    shape[0] = graph_node(g, p)->shape[0];
    for (int i = 1; i < rank - 1; i++) shape[i] = 1;
    return kiln_reshape(g, p, rank - 1, shape);
}

/* Inference batch norm as a scale and a shift per channel, the form
 * PyTorch's CPU kernel and ONNX Runtime compute: s = gamma / sqrt(var +
 * eps), y = x s + (beta - mean s). Per element that is a multiply and an
 * add (s and the shift are per-channel values, computed once per channel
 * in a fused loop) where (x - mean) / sqrt(var + eps) gamma + beta takes
 * four operations. */
static int batch_norm(Graph *g, int x, const Node *n, const int *map) {
    int rank = graph_node(g, x)->rank;
    int s = kiln_unary(g, "rsqrt", bin(g, "add", map[n->in[2]], num(g, n->f[0])));
    if (n->in[3] >= 0) s = bin(g, "mul", s, map[n->in[3]]);
    int t = bin(g, "mul", map[n->in[1]], s);
    t = n->in[4] >= 0 ? bin(g, "sub", map[n->in[4]], t) : kiln_unary(g, "neg", t);
    return bin(g, "add", bin(g, "mul", x, per_channel(g, s, rank)), per_channel(g, t, rank));
}

/* dropout: keep where u >= p, scaled by 1/(1-p); u is materialized once */
static int dropout(Graph *g, int x, const Node *n) {
    double p = n->f[0];
    int u = kiln_rand_like(g, x, n->seed);
    int keep = bin(g, "ge", u, num(g, p));
    int kept = p < 1 ? bin(g, "div", x, num(g, 1.0 - p)) : num(g, 0.0);
    return kiln_where(g, keep, kept, num(g, 0.0));
}

static int clamp(Graph *g, int x, const Node *n) {
    if (n->flags & NF_HAS_MIN) x = bin(g, "maximum", x, num(g, n->f[0]));
    if (n->flags & NF_HAS_MAX) x = bin(g, "minimum", x, num(g, n->f[1]));
    return x;
}

/* ---- edge and reflect padding: slices and a concat per padded dim ---------- */

/* The border parts of one dim of x (size m): edge repeats the end element
 * (a size-1 slice expanded), reflect mirrors without it (a negative-step
 * slice: x[b:0:-1] before, x[m-2:m-2-a:-1] after). */
static int border(Graph *g, int x, int mode, int d, int64_t width, bool front) {
    const Node *xn = graph_node(g, x);
    int64_t m = xn->shape[d];
    if (mode == KILN_PAD_REFLECT) {
        int64_t end = m - 2 - width; /* -1 would mean "the last element": run to the start */
        return front ? kiln_slice(g, x, d, width, 0, -1)
                     : kiln_slice(g, x, d, m - 2, end < 0 ? INT64_MIN : end, -1);
    }
    int64_t shape[KILN_MAX_RANK];
    for (int k = 0; k < xn->rank; k++) shape[k] = k == d ? width : -1;
    int e = kiln_slice(g, x, d, front ? 0 : m - 1, front ? 1 : m, 1);
    return e < 0 ? e : kiln_expand(g, e, xn->rank, shape);
}

static int pad_border(Graph *g, int x, const Node *n) {
    int rank = n->rank, mode = (int)n->attr[0];
    const int64_t *b = n->attr + 1, *a = n->attr + 1 + rank;
    for (int d = 0; d < rank && x >= 0; d++) /* negative widths crop first */
        if (b[d] < 0 || a[d] < 0)
            x = kiln_slice(g, x, d, b[d] < 0 ? -b[d] : 0,
                           graph_node(g, x)->shape[d] + (a[d] < 0 ? a[d] : 0), 1);
    for (int d = 0; d < rank && x >= 0; d++) {
        int parts[3], k = 0;
        if (b[d] > 0) parts[k++] = border(g, x, mode, d, b[d], true);
        parts[k++] = x;
        if (a[d] > 0) parts[k++] = border(g, x, mode, d, a[d], false);
        if (k > 1) x = kiln_concat(g, k, parts, d);
    }
    return x;
}

/* ---- pooling: the window's taps as strided slices of the padded input ------ */

typedef struct {
    int ns; /* spatial dims: the last ns dims of x */
    int64_t k[3], s[3], dil[3], pb[3], pe[3];
} PoolGeom;

static PoolGeom pool_geom(const Node *n) {
    PoolGeom p;
    p.ns = (int)n->attr[0];
    int64_t *f[5] = {p.k, p.s, p.dil, p.pb, p.pe};
    for (int j = 0; j < 5; j++)
        for (int i = 0; i < p.ns; i++) f[j][i] = n->attr[1 + j * p.ns + i];
    return p;
}

/* x padded so that every window of the output (ceil_mode's last one too)
 * lies inside: the declared padding plus what ceil_mode's last window needs. */
static int pool_pad(Graph *g, int x, const Node *n, const PoolGeom *p, double value, bool *padded) {
    const Node *xn = graph_node(g, x);
    int64_t before[KILN_MAX_RANK] = {0}, after[KILN_MAX_RANK] = {0};
    *padded = false;
    for (int i = 0; i < p->ns; i++) {
        int d = xn->rank - p->ns + i;
        int64_t need = (n->shape[d] - 1) * p->s[i] + p->dil[i] * (p->k[i] - 1) + 1;
        int64_t have = xn->shape[d] + p->pb[i] + p->pe[i];
        before[d] = p->pb[i];
        after[d] = p->pe[i] + (need > have ? need - have : 0);
        *padded |= before[d] > 0 || after[d] > 0;
    }
    return kiln_pad(g, x, KILN_PAD_CONSTANT, xn->rank, before, after, value);
}

/* Tap t (a flat index over the kernel's positions): one strided slice per
 * spatial dim. Taps after the first carry NF_TAP: the window is one
 * consumer reading k neighbours, as Inductor's pooling lowering is one user
 * of its input, so a pointwise producer (max_pool(relu(x))) is inlined into
 * the window instead of being materialized for having k users. */
/* The same over the first nd spatial dims only (the others as they are). */
static int pool_tap_dims(Graph *g, int xp, const Node *n, const PoolGeom *p, int64_t t, int nd) {
    int v = xp, rank = n->rank;
    for (int i = nd - 1; i >= 0 && v >= 0; i--) {
        int64_t j = t % p->k[i], d = rank - p->ns + i, start = j * p->dil[i];
        t /= p->k[i];
        v = kiln_slice(g, v, (int)d, start, start + (n->shape[d] - 1) * p->s[i] + 1, p->s[i]);
        if (v >= 0 && v != xp && i == nd - 1 && t + j > 0 && graph_node(g, v)->in[0] == xp)
            g->nodes[v].flags |= NF_TAP;
    }
    return v;
}

static int pool_tap(Graph *g, int xp, const Node *n, const PoolGeom *p, int64_t t) {
    return pool_tap_dims(g, xp, n, p, t, p->ns);
}

/* The taps along the last spatial dim alone: one strided slice each. */
static int pool_tap_last(Graph *g, int xp, const Node *n, const PoolGeom *p, int64_t j) {
    int d = n->rank - 1, i = p->ns - 1;
    int64_t start = j * p->dil[i];
    int v = kiln_slice(g, xp, d, start, start + (n->shape[d] - 1) * p->s[i] + 1, p->s[i]);
    if (v >= 0 && j > 0 && graph_node(g, v)->in[0] == xp) g->nodes[v].flags |= NF_TAP;
    return v;
}

/* How many taps of output position o (one dim) fall inside [lo, hi) of the
 * unpadded coordinates. */
static int64_t taps_inside(const PoolGeom *p, int i, int64_t o, int64_t lo, int64_t hi) {
    int64_t c = 0;
    for (int64_t j = 0; j < p->k[i]; j++) {
        int64_t at = o * p->s[i] - p->pb[i] + j * p->dil[i];
        c += at >= lo && at < hi;
    }
    return c;
}

/* avg_pool's divisor per output position, separable over the spatial dims:
 * taps inside the declared padding (count_include_pad, PyTorch's rule: the
 * extra padding of ceil_mode is not counted) or inside the input. A uniform
 * divisor is a scalar; otherwise 1/count is a weight of the spatial shape
 * computed here, at build time. */
static int avg_scale(Graph *g, const Node *n, const Node *xn, const PoolGeom *p) {
    int rank = n->rank, ns = p->ns;
    int64_t shape[3], total = 1, full = 1;
    for (int i = 0; i < ns; i++) {
        shape[i] = n->shape[rank - ns + i];
        total *= shape[i];
        full *= p->k[i];
    }
    bool f64 = xn->dtype == KILN_F64;
    double *w = kmalloc(sizeof(double) * (size_t)total);
    float *wf = kmalloc(sizeof(float) * (size_t)total);
    if (!w || !wf) {
        kfree(w), kfree(wf);
        return graph_fail(g, KILN_ERR_NOMEM, "out of memory");
    }
    bool uniform = true;
    for (int64_t f = 0; f < total; f++) {
        int64_t rest = f, count = 1;
        for (int i = ns - 1; i >= 0; i--) {
            int64_t o = rest % shape[i], in = xn->shape[rank - ns + i];
            rest /= shape[i];
            count *= n->flags & NF_COUNT_PAD ? taps_inside(p, i, o, -p->pb[i], in + p->pe[i])
                                             : taps_inside(p, i, o, 0, in);
        }
        w[f] = 1.0 / (double)count;
        wf[f] = 1.0f / (float)count;
        uniform = uniform && count == full;
    }
    char name[64];
    snprintf(name, sizeof name, "avg_pool_scale_%d", g->n);
    int v = uniform ? num(g, 1.0 / (double)full)
                    : kiln_weight_typed(g, name, f64 ? KILN_F64 : KILN_F32, ns, shape,
                                        f64 ? (void *)w : (void *)wf);
    kfree(w), kfree(wf);
    return v;
}

/* A 3-D window's taps read the padded input under three nested border
 * tests, loads that GCC 12 does not vectorize (a masked load under a mask
 * that is invariant in the inner loop), so a 3-D pool materializes its
 * padded input (one vectorized pad kernel, with a pointwise producer fused
 * into it) and the window reads it without tests. So does a padded window
 * with a stride above 1 along the last dim: its border-tested loads are
 * strided, and GCC vectorizes neither those nor the loop. Unpadded
 * windows, and padded ones with a unit stride along the last dim (masked
 * unit-stride loads), stay fused: there one kernel is faster
 * (docs/decisions.md: Pools: a materialized pad for 3-D and strided padded
 * windows). */
static int pooling(Graph *g, int x, const Node *n) {
    bool is_max = n->op == OP_MAX_POOL, padded;
    const char *combine = is_max ? "maximum" : "add";
    PoolGeom p = pool_geom(n);
    int64_t taps = 1, kw = p.k[p.ns - 1], rest;
    for (int i = 0; i < p.ns; i++) taps *= p.k[i];
    rest = taps / kw;
    int xp = pool_pad(g, x, n, &p, is_max ? -INFINITY : 0.0, &padded);
    if ((p.ns == 3 || (padded && p.s[p.ns - 1] > 1)) && xp >= 0)
        xp = kiln_unary(g, "contiguous", xp);
    /* A big window is separable: the max (or sum) along the last dim,
     * materialized, then over the others: kw + rest taps per output
     * instead of kw * rest (a 13x13 max pool: 26 instead of 169), for one
     * more pass over memory. Worth it from 2 (kw + rest) <= taps: 4x4 and
     * up, not 3x3 (docs/decisions.md: Separable pools). */
    if (p.ns > 1 && 2 * (kw + rest) <= taps && xp >= 0) {
        int row = pool_tap_last(g, xp, n, &p, 0);
        for (int64_t j = 1; j < kw && row >= 0; j++)
            row = bin(g, combine, row, pool_tap_last(g, xp, n, &p, j));
        if (row >= 0) row = kiln_unary(g, "contiguous", row);
        int acc = row >= 0 ? pool_tap_dims(g, row, n, &p, 0, p.ns - 1) : row;
        for (int64_t t = 1; t < rest && acc >= 0; t++)
            acc = bin(g, combine, acc, pool_tap_dims(g, row, n, &p, t, p.ns - 1));
        if (is_max || acc < 0) return acc;
        return bin(g, "mul", acc, avg_scale(g, n, graph_node(g, x), &p));
    }
    int acc = pool_tap(g, xp, n, &p, 0);
    for (int64_t t = 1; t < taps && acc >= 0; t++)
        acc = bin(g, combine, acc, pool_tap(g, xp, n, &p, t));
    if (is_max || acc < 0) return acc;
    return bin(g, "mul", acc, avg_scale(g, n, graph_node(g, x), &p));
}

/* Rewrite one composite node in dst; returns the value standing for it. */
static int expand_composite(Graph *dst, const Node *n, const int *map) {
    int x = map[n->in[0]], dims[KILN_MAX_RANK];
    switch (n->op) {
    case OP_MEAN: return mean(dst, x, dims_of(n, dims), dims, n->flags & NF_KEEPDIM);
    case OP_SOFTMAX: return softmax(dst, x, n, false);
    case OP_LOG_SOFTMAX: return softmax(dst, x, n, true);
    case OP_LAYER_NORM: return layer_norm(dst, x, n, map);
    case OP_BATCH_NORM: return batch_norm(dst, x, n, map);
    case OP_SILU: return bin(dst, "mul", x, kiln_unary(dst, "sigmoid", x));
    case OP_CLAMP: return clamp(dst, x, n);
    case OP_DROPOUT: return dropout(dst, x, n);
    case OP_MAX_POOL:
    case OP_AVG_POOL: return pooling(dst, x, n);
    case OP_PAD: return pad_border(dst, x, n);
    default: break;
    }
    return graph_fail(dst, KILN_ERR_INPUT, "no decomposition for %s", op_info[n->op].name);
}

/* Edge and reflect pads are rewritten like composites; constant pads are
 * primitive views. */
static bool border_pad(const Node *n) { return n->op == OP_PAD && n->attr[0] != KILN_PAD_CONSTANT; }

/* ---- empty values -------------------------------------------------------
 *
 * A value with no elements (a dim of 0) needs no kernel: whatever computes
 * it writes nothing. So dec_run copies no node whose result is empty, and
 * lowering, the scheduler and the interpreter never meet one: an empty
 * input stays declared (callers still pass it) and is never read, and an
 * empty output becomes an empty weight. A node whose result is not empty
 * but which reads an empty operand follows from its kind alone, whatever
 * the op:
 *   - a reduction over nothing is its identity (sum 0, prod 1, amax -inf,
 *     amin +inf); mean is 0 / 0, NaN, as in NumPy and PyTorch;
 *   - a concat leaves the empty part out;
 *   - a constant pad of nothing is all padding;
 *   - a matmul or convolution whose contraction is empty is zeros, plus the
 *     convolution's bias.
 * A pool, a gather or an edge or reflect pad of nothing has no window,
 * index or edge to read: refused. */

static bool reads_empty(const Node *n, const bool *empty) {
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0 && empty[n->in[k]]) return true;
    return false;
}

/* v broadcast to n's shape (and dtype). */
static int fill_like(Graph *g, const Node *n, int v) {
    int y = n->rank ? kiln_expand(g, v, n->rank, n->shape) : kiln_unary(g, "contiguous", v);
    return n->dtype == KILN_BOOL ? bin(g, "ne", y, num(g, 0.0)) : kiln_cast(g, y, n->dtype);
}

/* A constant fill for node n (id) that reads an empty operand, noted. */
static int fill_noted(Graph *g, const Node *n, int id, double v, const char *what) {
    graph_note(g, "%s %%%d reads an empty value (a dim of 0): %s %g", op_info[n->op].name, id, what,
               v);
    return fill_like(g, n, num(g, v));
}

/* The value of node n (id; not empty) that reads an empty operand, or a
 * failure. */
static int of_empty(Graph *g, const Node *n, int id, const int *map, const bool *empty) {
    switch (n->op) {
    case OP_SUM: return fill_noted(g, n, id, 0.0, "its identity,");
    case OP_PROD: return fill_noted(g, n, id, 1.0, "its identity,");
    case OP_AMAX: return fill_noted(g, n, id, -INFINITY, "its identity,");
    case OP_AMIN: return fill_noted(g, n, id, INFINITY, "its identity,");
    case OP_MEAN: return fill_noted(g, n, id, NAN, "0 / 0,");
    case OP_MATMUL: return fill_noted(g, n, id, 0.0, "an empty contraction,");
    case OP_PAD:
        if (n->attr[0] == KILN_PAD_CONSTANT) return fill_noted(g, n, id, n->f[0], "all padding,");
        break;
    case OP_CONV2D:
    case OP_CONV_TRANSPOSE2D: {
        if (n->nin < 3 || n->in[2] < 0) return fill_noted(g, n, id, 0.0, "an empty contraction,");
        graph_note(g, "%s %%%d reads an empty value (a dim of 0): an empty contraction, its bias",
                   op_info[n->op].name, id);
        int64_t shape[KILN_MAX_RANK];
        shape[0] = n->shape[1];
        for (int d = 1; d < n->rank - 1; d++) shape[d] = 1;
        return fill_like(g, n, kiln_reshape(g, map[n->in[2]], n->rank - 1, shape));
    }
    case OP_CONCAT: {
        int parts[MAX_IN], np = 0;
        for (int k = 0; k < n->nin; k++)
            if (!empty[n->in[k]]) parts[np++] = map[n->in[k]];
        graph_note(g, "concat %%%d leaves out %d empty part%s", id, n->nin - np,
                   n->nin - np > 1 ? "s" : "");
        return np == 1 ? parts[0] : kiln_concat(g, np, parts, (int)n->attr[0]);
    }
    default: break;
    }
    char s[128];
    graph_shape_str(s, sizeof s, n->rank, n->shape);
    return graph_fail(g, KILN_ERR_INPUT,
                      "%s: unsupported: an empty operand (a dim of 0) for a result of shape %s",
                      op_info[n->op].name, s);
}

/* An empty output: a weight with no elements, "NAME (empty)", of like's
 * dtype (bool included: it holds nothing). */
static int empty_weight(Graph *g, const Node *like, const char *output) {
    char name[300];
    float *data;
    snprintf(name, sizeof name, "%.*s (empty)", (int)sizeof name - 10, output ? output : "");
    int v = graph_weight_alloc(g, name, like->rank, like->shape, &data);
    if (v >= 0) g->nodes[v].dtype = like->dtype;
    return v;
}

kiln_status dec_run(const Graph *src, Graph *dst) {
    if (src->status != KILN_OK) {
        graph_fail(dst, src->status, "%s", src->err);
        return src->status;
    }
    RwPlan rw;
    int *map = kcalloc((size_t)(src->n ? src->n : 1), sizeof(int));
    bool *empty = kcalloc((size_t)(src->n ? src->n : 1), sizeof(bool));
    if (!map || !empty || rw_plan(src, dst, &rw) != KILN_OK) {
        kfree(map);
        kfree(empty);
        return (graph_fail(dst, KILN_ERR_NOMEM, "out of memory"), KILN_ERR_NOMEM);
    }
    int ndropped = 0;
    for (int i = 0; i < src->n && dst->status == KILN_OK; i++) {
        const Node *n = &src->nodes[i];
        if ((empty[i] = node_numel(n) == 0) && n->op != OP_INPUT) {
            map[i] = KILN_NONE; /* computes nothing; nothing reads it */
            ndropped += op_info[n->op].kind != KIND_SOURCE;
            continue;
        }
        if (n->op != OP_INPUT && reads_empty(n, empty)) { /* (rw_plan folds no such conv) */
            dst->origin = arena_strdup(&dst->arena, n->origin ? n->origin : op_info[n->op].name);
            map[i] = dst->origin ? of_empty(dst, n, i, map, empty)
                                 : graph_fail(dst, KILN_ERR_NOMEM, "out of memory");
            dst->origin = NULL;
            continue;
        }
        if (rw.drop[i]) {
            map[i] = KILN_NONE; /* replaced by a rewrite: nothing refers to it */
            continue;
        }
        if (rw.bn_conv[i] >= 0) {
            map[i] = rw_fold_conv_bn(dst, src, i, map);
            continue;
        }
        if (op_info[n->op].kind != KIND_COMPOSITE && !border_pad(n)) {
            map[i] = graph_copy_node(dst, src, i, map);
            continue;
        }
        dst->origin = arena_strdup(&dst->arena, n->origin);
        map[i] = dst->origin ? expand_composite(dst, n, map)
                             : graph_fail(dst, KILN_ERR_NOMEM, "out of memory");
        dst->origin = NULL;
    }
    if (ndropped && dst->status == KILN_OK)
        graph_note(dst, "%d op%s with an empty result (a dim of 0) compute%s nothing: no kernel",
                   ndropped, ndropped > 1 ? "s" : "", ndropped > 1 ? "" : "s");
    for (int i = 0; i < src->noutputs && dst->status == KILN_OK; i++) {
        int o = src->outputs[i];
        int v = empty[o] ? empty_weight(dst, &src->nodes[o], src->outnames[i]) : map[o];
        kiln_output(dst, v, src->outnames[i]);
    }
    rw_plan_free(&rw);
    kfree(map);
    kfree(empty);
    return dst->status;
}
