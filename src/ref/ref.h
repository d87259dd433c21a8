/*
 * ref.h -- the reference: the interpreter (unfused, op by op), the oracle
 * every fused result is checked against, and the tolerances of that check.
 *
 *   interp.c     runs a decomposed graph node by node in float, f64 nodes
 *                in double (double accumulation)
 *   tolerance.c  how far a fused result may be from the interpreter's,
 *                and how far the interpreter itself moves (the spread)
 */
#ifndef KILN_REF_H
#define KILN_REF_H

#include "graph/graph.h"

/* ===== interp.c ======================================================== */

/* Run a decomposed graph. inputs[i] holds input i as numel floats (bool as
 * 0/1; an f64 input: numel doubles). outputs[i] receives a kmalloc'd array
 * of numel floats (of doubles for an f64 output). */
kiln_status interp_run(Graph *g, float *const *inputs, float **outputs);
/* The same with every computed float value nudged by about the error fused
 * code may make there (seed != 0; see perturb in interp.c), and
 * kiln_interpret likewise: rt_reference_spread's runs. */
kiln_status interp_run_perturbed(Graph *g, float *const *inputs, float **outputs, uint64_t seed);
kiln_status kiln_interpret_perturbed(kiln_graph *g, const kiln_tensor *inputs, kiln_tensor *outputs,
                                     uint64_t seed);

/* ===== tolerance.c ===================================================== */

/* Tolerance of fused against interpreted results (kiln run --check, tests,
 * the fuzzer); see rt_tolerance in tolerance.c for how each class is set. */
typedef struct {
    double atol, rtol;
    int64_t reduce_n; /* the largest reduction or extern dot-product length (1: none) */
} RtTolerance;
RtTolerance rt_tolerance(const Graph *dec);
/* |got - want| in units of atol + rtol |want| (> 1 fails). NaN matches NaN
 * and an infinity the same infinity; anything else non-finite fails. */
double rt_excess(double got, double want, RtTolerance t);
/* How far the reference itself moves: the interpreter run `runs` more
 * times with its intermediate values nudged (kiln_interpret_perturbed,
 * seeds 1..runs), and per output element the largest change against want
 * (a bool flip counts 1; a non-finite value where want is finite, or the
 * reverse, INFINITY). spread[i] receives a new f32 tensor of output i's
 * shape (free with kiln_tensor_free). Large where an element is
 * ill-conditioned; see tolerance.c. */
kiln_status rt_reference_spread(kiln_graph *g, const kiln_tensor *in, const kiln_tensor *want,
                                int runs, kiln_tensor *spread);
/* Runs of rt_reference_spread the checks use, and how many spreads of
 * allowance an element gets on top of the tolerance. */
#define RT_SPREAD_RUNS 32
#define RT_SPREAD_K 4.0
/* rt_excess with RT_SPREAD_K times the element's spread added to the
 * allowance; an infinite spread (the reference itself is undetermined
 * there) accepts any value. */
double rt_excess_spread(double got, double want, float spread, RtTolerance t);
/* One output element of either dtype (a bool as 0/1) against the
 * reference: a bool must match unless the reference itself flipped there
 * (spread > 0); a float goes through rt_excess_spread (spread 0: exactly
 * rt_excess). The excess, > 1 fails. */
double rt_check_excess(kiln_dtype dt, double got, double want, float spread, RtTolerance t);

#endif
