/*
 * stubs.c -- TEMPORARY: builders declared in kiln.h whose implementation is
 * being written on other branches. Each returns an error; each branch that
 * implements a builder deletes its stub here.
 */
#include "kiln_int.h"

kiln_value kiln_pad(kiln_graph *g, kiln_value x, kiln_pad_mode mode, int n,
                    const int64_t *before, const int64_t *after, double value) {
    (void)x; (void)mode; (void)n; (void)before; (void)after; (void)value;
    return graph_fail(g, KILN_ERR_INPUT, "pad: not implemented yet");
}
kiln_value kiln_concat(kiln_graph *g, int n, const kiln_value *xs, int dim) {
    (void)n; (void)xs; (void)dim;
    return graph_fail(g, KILN_ERR_INPUT, "concat: not implemented yet");
}
kiln_value kiln_max_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p) {
    (void)x; (void)p;
    return graph_fail(g, KILN_ERR_INPUT, "max_pool: not implemented yet");
}
kiln_value kiln_avg_pool(kiln_graph *g, kiln_value x, const kiln_pool_params *p) {
    (void)x; (void)p;
    return graph_fail(g, KILN_ERR_INPUT, "avg_pool: not implemented yet");
}
