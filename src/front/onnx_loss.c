/*
 * onnx_loss.c -- NegativeLogLikelihoodLoss (opsets 12, 13) and
 * SoftmaxCrossEntropyLoss (12, 13), from kiln's ops.
 *
 * Scores x are (N, C) or (N, C, d1, ...), targets t (N) or (N, d1, ...)
 * with values in [0, C) or ignore_index. The loss at each position is
 * -x[n, t, d...] * w[t] (w = 1 without weights), 0 where t is ignore_index:
 *
 *   picked = sum over C of where(c == t, x, 0)   (a one-hot select: a
 *            comparison and a reduction, which fuse; no gather over C)
 *   wt     = gather(w or ones, t') with t' = 0 where ignored and C where
 *            t < 0, so that a target outside [0, C) fails the run with the
 *            gather's message instead of adding nothing
 *   loss   = -picked * wt, then as reduction says: none (the positions),
 *            sum, or mean = sum(loss) / sum(wt) (0 / 0 when every target is
 *            ignored: NaN, as ONNX's reference)
 *
 * SoftmaxCrossEntropyLoss is that over log_softmax(x, axis 1), whose value
 * is its optional second output.
 */
#include "front/front.h"
#include <string.h>

static bool loss(OxNode *n, bool softmax) {
    if (!ox_need_in(n, 0) || !ox_need_in(n, 1)) return false;
    Graph *g = n->im->g;
    OxVal *xv = ox_in(n, 0), *tv = ox_in(n, 1), *wv = ox_in(n, 2);
    int r = xv->rank;
    if (r < 2) return ox_nfail(n, "the scores need rank >= 2, got %d", r);
    int64_t C = xv->shape[1];
    if (tv->rank != r - 1 || tv->shape[0] != xv->shape[0])
        return ox_nfail(n, "the targets need shape (N, d1, ...) of the scores (N, C, d1, ...)");
    for (int i = 1; i < tv->rank; i++)
        if (tv->shape[i] != xv->shape[i + 1])
            return ox_nfail(n, "target dim %d is %lld, the scores' %lld", i,
                            (long long)tv->shape[i], (long long)xv->shape[i + 1]);
    if (wv && (wv->rank != 1 || wv->shape[0] != C))
        return ox_nfail(n, "the weights need shape (%lld)", (long long)C);
    if (C >= (1 << 24)) return ox_nfail(n, "unsupported: 2^24 classes or more");
    int mode = ox_attr_is(n, "reduction", "mean", true)    ? 2
               : ox_attr_is(n, "reduction", "sum", false)  ? 1
               : ox_attr_is(n, "reduction", "none", false) ? 0
                                                           : -1;
    if (mode < 0) return ox_nfail(n, "reduction must be none, sum or mean");
    bool has_ignore = ox_attr(n, "ignore_index") != NULL;
    double ignore = (double)ox_attr_i(n, "ignore_index", 0);
    kiln_value x = ox_gin(n, 0), t = ox_gin(n, 1);
    if (softmax) x = kiln_log_softmax(g, x, 1);
    /* t as (N, 1, d...) against the classes as (1, C, 1, ...) */
    int64_t ts[KILN_MAX_RANK], cs[KILN_MAX_RANK];
    double *iota = arena_alloc(&n->im->arena, sizeof(double) * (size_t)C);
    if (!iota) return ox_nomem(n);
    for (int64_t c = 0; c < C; c++) iota[c] = (double)c;
    for (int i = 0; i < r; i++) {
        ts[i] = i == 0 ? xv->shape[0] : i == 1 ? 1 : xv->shape[i];
        cs[i] = i == 1 ? C : 1;
    }
    kiln_value t1 = kiln_reshape(g, t, r, ts);
    kiln_value hot = kiln_binary(g, "eq", ox_const_tensor(n, r, cs, iota), t1);
    int one = 1;
    kiln_value picked = kiln_reduce(g, "sum", kiln_where(g, hot, x, ox_sc(g, 0)), 1, &one, 0);
    kiln_value ignored = has_ignore ? kiln_binary(g, "eq", t, ox_sc(g, ignore)) : KILN_NONE;
    kiln_value safe = kiln_where(g, kiln_binary(g, "lt", t, ox_sc(g, 0)), ox_sc(g, (double)C), t);
    if (has_ignore) safe = kiln_where(g, ignored, ox_sc(g, 0), safe);
    kiln_value w;
    if (wv) {
        w = ox_gin(n, 2);
    } else {
        double *ones = arena_alloc(&n->im->arena, sizeof(double) * (size_t)C);
        if (!ones) return ox_nomem(n);
        for (int64_t c = 0; c < C; c++) ones[c] = 1;
        int64_t c1[1] = {C};
        w = ox_const_tensor(n, 1, c1, ones);
    }
    kiln_value wt = kiln_gather(g, w, safe, 0);
    if (has_ignore) wt = kiln_where(g, ignored, ox_sc(g, 0), wt);
    kiln_value y = kiln_binary(g, "mul", kiln_unary(g, "neg", picked), wt);
    if (mode >= 1) {
        kiln_value total = kiln_reduce(g, "sum", y, 0, NULL, 0);
        y = mode == 1 ? total : kiln_binary(g, "div", total, kiln_reduce(g, "sum", wt, 0, NULL, 0));
    }
    if (!ox_set_graph(n, 0, y, OT_FLOAT)) return false;
    return !softmax || ox_set_graph(n, 1, x, OT_FLOAT);
}

static bool op_nll(OxNode *n) { return loss(n, false); }
static bool op_sce(OxNode *n) { return loss(n, true); }

/* ---- this file's handlers (onnx_ops.c looks ops up here) ---------------- */

const OxHandler ox_loss_ops[] = {
    {"NegativeLogLikelihoodLoss", op_nll},
    {"SoftmaxCrossEntropyLoss", op_sce},
};
const size_t ox_loss_nops = sizeof ox_loss_ops / sizeof ox_loss_ops[0];
