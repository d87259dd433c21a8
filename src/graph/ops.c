/* ops.c -- the op table (ops.def) and its lookup. */
#include "graph/graph.h"
#include <string.h>

/* ---- the op table ---------------------------------------------------- */

const OpInfo op_info[OP_COUNT] = {
#define X(e, name, kind, arity, cform) {name, kind, arity, cform},
#include "graph/ops.def"
#undef X
};

int op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_info[i].name, name) == 0) return i;
    return -1;
}

