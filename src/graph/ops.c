/* ops.c -- the op table (ops.def) and its lookup. */
#include "graph/graph.h"
#include <string.h>

/* ---- the op table ---------------------------------------------------- */

const OpInfo op_info[OP_COUNT] = {
#define X(e, name, kind, arity, expensive, cform) {name, kind, arity, expensive, cform},
#include "graph/ops.def"
#undef X
};

/* Adding or removing an op is more than a line in ops.def: the interpreter,
 * lowering, the parser, the ONNX importer and the tests each have a place
 * for it (docs/adding-an-op.md lists them). This count makes the compiler
 * stop whoever changes the table until they have looked. */
_Static_assert(OP_COUNT == 64, "ops.def changed: see docs/adding-an-op.md, then update this count");

int op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_info[i].name, name) == 0) return i;
    return -1;
}
