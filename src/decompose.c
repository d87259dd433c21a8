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
#include "kiln_int.h"
#include <math.h>
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
    if (nd == 0) { dims[0] = 0; nd = 1; }  /* a scalar: reduce over nothing */
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

static int batch_norm(Graph *g, int x, const Node *n, const int *map) {
    int rank = graph_node(g, x)->rank;
    int mu = per_channel(g, map[n->in[1]], rank), var = per_channel(g, map[n->in[2]], rank);
    int inv = kiln_unary(g, "rsqrt", bin(g, "add", var, num(g, n->f[0])));
    int y = bin(g, "mul", bin(g, "sub", x, mu), inv);
    if (n->in[3] >= 0) y = bin(g, "mul", y, per_channel(g, map[n->in[3]], rank));
    if (n->in[4] >= 0) y = bin(g, "add", y, per_channel(g, map[n->in[4]], rank));
    return y;
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

/* Rewrite one composite node in dst; returns the value standing for it. */
static int expand_composite(Graph *dst, const Node *n, const int *map) {
    int x = map[n->in[0]], dims[KILN_MAX_RANK];
    switch (n->op) {
    case OP_MEAN:
        return mean(dst, x, dims_of(n, dims), dims, n->flags & NF_KEEPDIM);
    case OP_SOFTMAX: return softmax(dst, x, n, false);
    case OP_LOG_SOFTMAX: return softmax(dst, x, n, true);
    case OP_LAYER_NORM: return layer_norm(dst, x, n, map);
    case OP_BATCH_NORM: return batch_norm(dst, x, n, map);
    case OP_GELU: /* erf form: x/2 * (1 + erf(x/sqrt(2))) */
        return bin(dst, "mul", bin(dst, "mul", x, num(dst, 0.5)),
                   bin(dst, "add", num(dst, 1.0),
                       kiln_unary(dst, "erf", bin(dst, "mul", x, num(dst, M_SQRT1_2)))));
    case OP_SILU: return bin(dst, "mul", x, kiln_unary(dst, "sigmoid", x));
    case OP_CLAMP: return clamp(dst, x, n);
    case OP_DROPOUT: return dropout(dst, x, n);
    default: break;
    }
    return graph_fail(dst, KILN_ERR_INPUT, "no decomposition for %s", op_info[n->op].name);
}

kiln_status dec_run(const Graph *src, Graph *dst) {
    if (src->status != KILN_OK) {
        graph_fail(dst, src->status, "%s", src->err);
        return src->status;
    }
    RwPlan rw;
    int *map = kcalloc((size_t)(src->n ? src->n : 1), sizeof(int));
    if (!map || rw_plan(src, dst, &rw) != KILN_OK) {
        kfree(map);
        return (graph_fail(dst, KILN_ERR_NOMEM, "out of memory"), KILN_ERR_NOMEM);
    }
    for (int i = 0; i < src->n && dst->status == KILN_OK; i++) {
        const Node *n = &src->nodes[i];
        if (rw.drop[i]) {
            map[i] = KILN_NONE;   /* replaced by a rewrite: nothing refers to it */
            continue;
        }
        if (rw.bn_conv[i] >= 0) {
            map[i] = rw_fold_conv_bn(dst, src, i, map);
            continue;
        }
        if (op_info[n->op].kind != KIND_COMPOSITE) {
            map[i] = graph_copy_node(dst, src, i, map);
            continue;
        }
        dst->origin = arena_strdup(&dst->arena, n->origin);
        map[i] = dst->origin ? expand_composite(dst, n, map)
                             : graph_fail(dst, KILN_ERR_NOMEM, "out of memory");
        dst->origin = NULL;
    }
    for (int i = 0; i < src->noutputs && dst->status == KILN_OK; i++)
        kiln_output(dst, map[src->outputs[i]], src->outnames[i]);
    rw_plan_free(&rw);
    kfree(map);
    return dst->status;
}
