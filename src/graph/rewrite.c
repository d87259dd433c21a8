/*
 * rewrite.c -- pattern rewrites of the graph, applied by dec_run while it
 * copies the program into its decomposed form.
 *     requires: a valid graph;  gives: the same inputs and outputs, fewer ops.
 *
 * Conv-BN folding. In inference, batch_norm is a per-channel affine map
 *     y = (conv(x, w) + b - mean) * s + beta,   s = gamma / sqrt(var + eps),
 * and a per-output-channel scale commutes with the convolution's sum over
 * input channels and taps, so the pair equals one convolution with
 *     w'[o] = w[o] * s[o],   b'[o] = (b[o] - mean[o]) * s[o] + beta[o]
 * (no gamma: 1, no beta: 0, no conv bias: 0). When w, b and the four BN
 * parameters are compile-time constants (WEIGHT nodes) this is computed once
 * here and BN disappears from the program: Conv-BN-ReLU is a conv and a relu,
 * and the relu can become the conv's epilogue. The folded data is computed in
 * double and rounded to f32 once.
 *
 * A fold is declined, with a note saying why, when any of those values is a
 * runtime input (it is not known at compile time; BN then decomposes into
 * pointwise ops the scheduler fuses), when the conv's output has another user
 * or is a program output (it would have to exist unscaled anyway), or when
 * a folded value would not be finite (var + eps <= 0: leave the arithmetic to
 * run as written). Weights that only the folded pairs read are not copied
 * into the decomposed graph, so folding never doubles weight memory.
 */
#include "graph/graph.h"
#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* ---- when a pair folds ------------------------------------------------- */

static bool is_const(const Graph *g, int id) { return id >= 0 && g->nodes[id].op == OP_WEIGHT; }
static bool const_or_absent(const Graph *g, int id) { return id < 0 || is_const(g, id); }

/* The per-channel scale s and folded bias b', or false when one would not
 * be finite in f32. Either output array may be NULL. */
static bool fold_params(const Graph *g, const Node *bn, const Node *conv, double *scale,
                        double *bias) {
    const float *mean = g->nodes[bn->in[1]].data, *var = g->nodes[bn->in[2]].data;
    const float *gamma = bn->in[3] >= 0 ? g->nodes[bn->in[3]].data : NULL;
    const float *beta = bn->in[4] >= 0 ? g->nodes[bn->in[4]].data : NULL;
    const float *cb = conv->nin > 2 && conv->in[2] >= 0 ? g->nodes[conv->in[2]].data : NULL;
    for (int64_t o = 0; o < conv->shape[1]; o++) {
        double v = (double)var[o] + bn->f[0];
        if (!(v > 0)) return false;
        double s = (gamma ? gamma[o] : 1.0) / sqrt(v);
        double b = ((cb ? cb[o] : 0.0) - mean[o]) * s + (beta ? beta[o] : 0.0);
        if (!(fabs(s) <= FLT_MAX && fabs(b) <= FLT_MAX)) return false;
        if (scale) scale[o] = s;
        if (bias) bias[o] = b;
    }
    return true;
}

/* Whether BATCH_NORM node bn with conv input c folds; if not, why (in why). */
static bool folds(const Graph *g, const Node *bn, int c, const int *uses, char *why, size_t len) {
    static const char *const param[] = {"", "running_mean", "running_var", "weight", "bias"};
    const Node *conv = &g->nodes[c];
    const char *r = NULL;
    if (!is_const(g, conv->in[1]))
        r = "the conv weight is not a compile-time constant";
    else if (conv->nin > 2 && !const_or_absent(g, conv->in[2]))
        r = "the conv bias is not a compile-time constant";
    for (int k = 1; k < 5 && !r; k++)
        if (!(k < 3 ? is_const(g, bn->in[k]) : const_or_absent(g, bn->in[k]))) {
            util_fmt(why, len, "batch_norm's %s is not a compile-time constant", param[k]);
            return false;
        }
    for (int k = 1; k < 5 && !r; k++)
        if (bn->in[k] >= 0 && g->nodes[bn->in[k]].dtype != KILN_F32)
            r = "a batch_norm parameter is not f32";
    for (int i = 0; i < g->noutputs && !r; i++)
        if (g->outputs[i] == c) r = "the conv's output is a program output";
    if (!r && uses[c] > 1) r = "the conv's output has another user";
    if (!r && (node_numel(&g->nodes[conv->in[0]]) == 0 || node_numel(&g->nodes[conv->in[1]]) == 0 ||
               node_numel(bn) == 0))
        r = "an empty value (a dim of 0): the conv is its bias, or nothing";
    if (!r && !fold_params(g, bn, conv, NULL, NULL)) r = "a folded value would not be finite";
    if (r) util_fmt(why, len, "%s", r);
    return !r;
}

/* Every operand slot of node id that a fold removes from the program. */
static void unuse_operands(const Graph *g, int id, int *remaining) {
    const Node *n = &g->nodes[id];
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0) remaining[n->in[k]]--;
}

kiln_status rw_plan(const Graph *src, Graph *notes_to, RwPlan *plan) {
    size_t n = (size_t)(src->n ? src->n : 1);
    memset(plan, 0, sizeof *plan);
    int *uses = graph_use_counts(src), *remaining = kcalloc(n, sizeof(int));
    plan->bn_conv = kmalloc(sizeof(int) * n);
    plan->drop = kcalloc(n, sizeof(bool));
    if (!uses || !remaining || !plan->bn_conv || !plan->drop) goto nomem;
    memcpy(remaining, uses, sizeof(int) * (size_t)src->n);
    for (int i = 0; i < src->n; i++) {
        const Node *bn = &src->nodes[i];
        plan->bn_conv[i] = -1;
        if (bn->op != OP_BATCH_NORM || src->nodes[bn->in[0]].op != OP_CONV2D) continue;
        int c = bn->in[0];
        char why[128];
        if (!folds(src, bn, c, uses, why, sizeof why)) {
            if (notes_to && !graph_note(notes_to,
                                        "not folding batch_norm into conv2d (source "
                                        "nodes %%%d, %%%d): %s",
                                        c, i, why))
                goto nomem;
            continue;
        }
        plan->bn_conv[i] = c;
        plan->drop[c] = true;
        plan->nfolds++;
        /* the conv's own use by bn goes too; its operands move to the new conv,
         * except the weights, which the fold replaces */
        unuse_operands(src, i, remaining);
        remaining[src->nodes[c].in[1]]--;
        if (src->nodes[c].nin > 2 && src->nodes[c].in[2] >= 0) remaining[src->nodes[c].in[2]]--;
    }
    for (int i = 0; i < src->n; i++)
        if (src->nodes[i].op == OP_WEIGHT && uses[i] > 0 && remaining[i] == 0) plan->drop[i] = true;
    kfree(uses);
    kfree(remaining);
    return KILN_OK;
nomem:
    kfree(uses);
    kfree(remaining);
    rw_plan_free(plan);
    return KILN_ERR_NOMEM;
}

void rw_plan_free(RwPlan *plan) {
    kfree(plan->bn_conv);
    kfree(plan->drop);
    memset(plan, 0, sizeof *plan);
}

/* ---- emitting the folded conv -------------------------------------------- */

static bool name_used(const Graph *g, const char *name) {
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].name && strcmp(g->nodes[i].name, name) == 0) return true;
    return false;
}

/* base, or base_2, base_3, ...: a weight name neither graph declares. */
static void fresh_name(const Graph *src, const Graph *dst, const char *base, char *out,
                       size_t len) {
    util_fmt(out, len, "%s", base);
    for (int k = 2; name_used(src, out) || name_used(dst, out); k++)
        util_fmt(out, len, "%s_%d", base, k);
}

/* A new WEIGHT in dst holding data (numel floats, copied). */
static int add_weight(Graph *dst, const Graph *src, const char *base, int rank,
                      const int64_t *shape, const float *data) {
    char name[160];
    fresh_name(src, dst, base, name, sizeof name);
    const char *saved = dst->origin;
    dst->origin = NULL;
    int v = kiln_weight(dst, name, rank, shape, data);
    dst->origin = saved;
    return v;
}

int rw_fold_conv_bn(Graph *dst, const Graph *src, int bn, const int *map) {
    const Node *b = &src->nodes[bn], *conv = &src->nodes[b->in[0]], *w = &src->nodes[conv->in[1]];
    int64_t oc = conv->shape[1], per = node_numel(w) / oc;
    double *scale = kmalloc(sizeof(double) * (size_t)oc),
           *bias = kmalloc(sizeof(double) * (size_t)oc);
    float *wf = kmalloc(sizeof(float) * (size_t)node_numel(w)),
          *bf = kmalloc(sizeof(float) * (size_t)oc);
    int v = KILN_NONE;
    if (!scale || !bias || !wf || !bf) {
        graph_fail(dst, KILN_ERR_NOMEM, "out of memory");
        goto done;
    }
    bool ok = fold_params(src, b, conv, scale, bias);
    assert(ok); /* rw_plan checked it */
    (void)ok;
    for (int64_t o = 0; o < oc; o++) {
        for (int64_t k = 0; k < per; k++)
            wf[o * per + k] = (float)(w->data[o * per + k] * scale[o]);
        bf[o] = (float)bias[o];
    }
    char base[160];
    util_fmt(base, sizeof base, "%s_folded", w->name);
    int wv = add_weight(dst, src, base, w->rank, w->shape, wf);
    util_fmt(base, sizeof base, "%s_folded_bias", w->name);
    int bv = add_weight(dst, src, base, 1, &oc, bf);
    kiln_conv_params p = {{(int)conv->attr[0], (int)conv->attr[1]},
                          {(int)conv->attr[2], (int)conv->attr[3]},
                          {(int)conv->attr[4], (int)conv->attr[5]},
                          (int)conv->attr[6]};
    const char *saved = dst->origin;
    dst->origin = NULL; /* the folded conv is a conv2d: its kernel is extern_kernels.conv2d */
    v = kiln_conv2d(dst, map[conv->in[0]], wv, bv, &p);
    dst->origin = saved;
    if (v >= 0 && !graph_note(dst,
                              "folded batch_norm into conv2d %%%d: weight %s -> %s, bias "
                              "-> %s (source nodes %%%d, %%%d)",
                              v, w->name, dst->nodes[wv].name, dst->nodes[bv].name, b->in[0], bn))
        v = graph_fail(dst, KILN_ERR_NOMEM, "out of memory");
done:
    kfree(scale);
    kfree(bias);
    kfree(wf);
    kfree(bf);
    return v;
}
