/* tolerance.c -- how far a fused result may be from the reference. */
#include "ref/ref.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ===== tolerances ======================================================================= */

/* The length of the dot products or reductions behind node n, or 1. */
static int64_t reduce_length(const Graph *g, const Node *n) {
    const Node *a = n->nin > 0 && n->in[0] >= 0 ? graph_node(g, n->in[0]) : NULL;
    switch (op_info[n->op].kind) {
    case KIND_REDUCTION: return a && node_numel(n) > 0 ? node_numel(a) / node_numel(n) : 1;
    case KIND_EXTERN:
        if (n->op == OP_CALL) /* the iterations compound like a sum's terms */
            return n->call->trips > 1 ? n->call->trips : 1;
        if (n->op == OP_MATMUL && a) return a->rank ? a->shape[a->rank - 1] : 1;
        if (n->op == OP_CONV2D && n->nin > 1) {
            const Node *w = graph_node(g, n->in[1]);
            return w->shape[1] * w->shape[2] * w->shape[3];
        }
        if (n->op == OP_CONV_TRANSPOSE2D && n->nin > 1) {
            const Node *w = graph_node(g, n->in[1]);
            return w->shape[0] / n->attr[8] * w->shape[2] * w->shape[3];
        }
        return 1;
    default: return 1;
    }
}

/*
 * Per-op-class tolerances. The interpreter rounds every op's result once
 * from double (transcendentals in double, reductions and dot products
 * accumulated in double); the fused code computes in float:
 *   pointwise only     atol 1e-5, rtol 1e-5: vecmath.h's functions are a
 *                      few ulp (~5e-7 relative) from the correctly rounded
 *                      value, and a chain of a dozen ops compounds that to
 *                      well under 1e-5.
 *   reductions and     float accumulation in another order (SIMD lanes,
 *   externs over n     OpenMP partial sums, BLAS blocking) against double:
 *                      the error of a sum grows like sqrt(n) ulps of its
 *                      partial sums, and a row statistic feeding a division
 *                      by a small spread (layer_norm of a near-constant row
 *                      divides by sqrt(eps) ~ 3e-3) amplifies it, so
 *                      atol = 1e-4 sqrt(n) and rtol = 1e-4 (n the longest
 *                      reduction or dot product in the program).
 */
RtTolerance rt_tolerance(const Graph *dec) {
    RtTolerance t = {1e-5, 1e-5, 1};
    for (int i = 0; i < dec->n; i++) {
        int64_t n = reduce_length(dec, graph_node(dec, i));
        if (n > t.reduce_n) t.reduce_n = n;
    }
    if (t.reduce_n > 1) {
        t.atol = 1e-4 * sqrt((double)t.reduce_n);
        t.rtol = 1e-4;
    }
    return t;
}

double rt_excess(double got, double want, RtTolerance t) {
    if (!isfinite(want)) return (isnan(want) ? isnan(got) : got == want) ? 0.0 : INFINITY;
    if (!isfinite(got)) return INFINITY;
    return fabs((double)got - (double)want) / (t.atol + t.rtol * fabs((double)want));
}

/*
 * The reference's own spread. The interpreter is the oracle, but an
 * ill-conditioned element (a row normalized by a tiny spread, values with
 * a large common offset, sqrt near 0, a comparison at a tie) has no
 * well-defined float answer: rounding anywhere before it moves it by more
 * than any fixed tolerance. Such an element shows itself when the
 * interpreter runs again with every intermediate value nudged by about the
 * error the fused code may make there (kiln_interpret_perturbed: two ulps
 * after a pointwise op, sqrt(n) ulps after a reduction over n): it moves
 * about as much as the fused result does (random perturbation as a
 * sensitivity estimate, as Monte Carlo arithmetic does). A
 * well-conditioned element moves by a few ulps and keeps the plain
 * tolerance.
 */
kiln_status rt_reference_spread(kiln_graph *g, const kiln_tensor *in, const kiln_tensor *want,
                                int runs, kiln_tensor *spread) {
    int nout = kiln_num_outputs(g);
    kiln_tensor *ref = kcalloc((size_t)nout + 1, sizeof *ref);
    kiln_status st = ref ? KILN_OK : KILN_ERR_NOMEM;
    for (int i = 0; i < nout; i++) spread[i] = (kiln_tensor){0};
    for (int i = 0; i < nout && st == KILN_OK; i++) {
        spread[i] = kiln_output_desc(g, i);
        spread[i].dtype = KILN_F32;
        if ((st = kiln_tensor_alloc(&spread[i])) == KILN_OK)
            memset(spread[i].data, 0, sizeof(float) * (size_t)kiln_tensor_numel(&spread[i]));
    }
    for (int r = 0; r < runs && st == KILN_OK; r++) {
        st = kiln_interpret_perturbed(g, in, ref, (uint64_t)r + 1);
        for (int i = 0; i < nout && st == KILN_OK; i++) {
            float *sp = spread[i].data;
            for (int64_t k = 0; k < kiln_tensor_numel(&want[i]); k++) {
                double a, b;
                if (want[i].dtype == KILN_BOOL) {
                    a = ((const uint8_t *)ref[i].data)[k], b = ((const uint8_t *)want[i].data)[k];
                } else if (want[i].dtype == KILN_F64) {
                    a = ((const double *)ref[i].data)[k], b = ((const double *)want[i].data)[k];
                } else {
                    a = ((const float *)ref[i].data)[k], b = ((const float *)want[i].data)[k];
                }
                double d = 0; /* NaN meets NaN; one side non-finite: undetermined */
                if (a != b && !(isnan(a) && isnan(b)))
                    d = isfinite(a) && isfinite(b) ? fabs(a - b) : INFINITY;
                if (d > sp[k]) sp[k] = (float)d;
            }
        }
        for (int i = 0; i < nout; i++) kiln_tensor_free(&ref[i]);
    }
    kfree(ref);
    if (st != KILN_OK)
        for (int i = 0; i < nout; i++) kiln_tensor_free(&spread[i]);
    return st;
}

double rt_excess_spread(double got, double want, float spread, RtTolerance t) {
    if (isinf(spread) && spread > 0) return 0.0;
    if (!isfinite(want) || !isfinite(got)) return rt_excess(got, want, t);
    return fabs((double)got - (double)want) /
           (t.atol + t.rtol * fabs((double)want) + RT_SPREAD_K * spread);
}

double rt_check_excess(kiln_dtype dt, double got, double want, float spread, RtTolerance t) {
    if (dt == KILN_BOOL) return (got != 0) == (want != 0) || spread > 0 ? 0.0 : INFINITY;
    return rt_excess_spread(got, want, spread, t);
}
