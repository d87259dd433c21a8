/*
 * stubs.c -- TEMPORARY: builders declared in kiln.h whose implementation is
 * being written on other branches. Each returns an error; each branch that
 * implements a builder deletes its stub here.
 */
#include "kiln_int.h"

kiln_value kiln_gather(kiln_graph *g, kiln_value data, kiln_value indices, int axis) {
    (void)data; (void)indices; (void)axis;
    return graph_fail(g, KILN_ERR_INPUT, "gather: not implemented yet");
}
kiln_value kiln_conv_transpose2d(kiln_graph *g, kiln_value x, kiln_value w,
                                 kiln_value bias, const kiln_conv_transpose_params *p) {
    (void)x; (void)w; (void)bias; (void)p;
    return graph_fail(g, KILN_ERR_INPUT, "conv_transpose2d: not implemented yet");
}
