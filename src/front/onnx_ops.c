/*
 * onnx_ops.c -- one ONNX node into kiln graph ops (or into a constant): the
 * dispatch to the handler tables of onnx_elementwise.c, onnx_nn.c,
 * onnx_shape.c, onnx_reduce.c, onnx_resize.c, onnx_loss.c, onnx_rnn.c,
 * onnx_scatter.c, onnx_index.c, onnx_signal.c, onnx_sample.c,
 * onnx_quant.c, onnx_seq.c, onnx_text.c, onnx_train.c and onnx_einsum.c
 * (and If, Loop and Scan in onnx.c); onnx_node.c holds what handlers share.
 *
 * Each supported op has a handler in one of those files' tables. A handler reads
 * its inputs (OxVal: constant or graph value) and attributes, and sets its
 * outputs. Two paths:
 *
 * - Constant folding. When every input of a node is a constant and the op
 *   has a host evaluator (the shape arithmetic exported models are full of:
 *   Shape, Gather, Concat, Unsqueeze, Slice, Cast, Range, Add, Mul, ...),
 *   the result is computed here, in doubles, and stays a constant. Inputs
 *   that must be known to build the graph (Reshape's shape, Slice's starts,
 *   ReduceSum's axes, Pad's pads, ...) are then constants in every sensible
 *   model, and a clear error otherwise.
 * - Graph building. Otherwise the node maps to kiln builders, decomposed
 *   where kiln has no op of its own (LeakyRelu = where(x < 0, a*x, x),
 *   ArgMax = amax + where(x == max, iota, BIG) + amin, Tile = reshape,
 *   expand, reshape views, a 1-D conv = a 2-D conv of height 1, ...).
 *
 * Types: kiln graphs compute in f32, f64 and bool. DOUBLE values are f64;
 * int32/int64/uint32/uint64 run-time values and constants past 2^24 are
 * f64 too (exact to 2^53), the narrow integers and small constants f32.
 * OxVal.type keeps the ONNX type, which decides integer division, Cast and
 * the type of the model's outputs.
 */
#include "front/front.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every handler table, searched in this order. */
static const struct {
    const OxHandler *ops;
    const size_t *n;
} tables[] = {
    {ox_elementwise_ops, &ox_elementwise_nops},
    {ox_nn_ops, &ox_nn_nops},
    {ox_shape_ops, &ox_shape_nops},
    {ox_reduce_ops, &ox_reduce_nops},
    {ox_resize_ops, &ox_resize_nops},
    {ox_loss_ops, &ox_loss_nops},
    {ox_rnn_ops, &ox_rnn_nops},
    {ox_control_ops, &ox_control_nops},
    {ox_scatter_ops, &ox_scatter_nops},
    {ox_index_ops, &ox_index_nops},
    {ox_signal_ops, &ox_signal_nops},
    {ox_sample_ops, &ox_sample_nops},
    {ox_quant_ops, &ox_quant_nops},
    {ox_seq_ops, &ox_seq_nops},
    {ox_text_ops, &ox_text_nops},
    {ox_einsum_ops, &ox_einsum_nops},
};

static const OxHandler *find_handler(const char *op) {
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (size_t i = 0; i < *tables[t].n; i++)
            if (!strcmp(tables[t].ops[i].name, op)) return &tables[t].ops[i];
    return NULL;
}

/* The training domain's ops (onnx_train.c), found only in that domain. */
static const char TRAINING[] = "ai.onnx.preview.training";

static const OxHandler *find_training(const char *op) {
    for (size_t i = 0; i < ox_train_nops; i++)
        if (!strcmp(ox_train_ops[i].name, op)) return &ox_train_ops[i];
    return NULL;
}

bool ox_supported(const char *domain, const char *op) {
    if (op && domain && !strcmp(domain, TRAINING)) return find_training(op) != NULL;
    if (domain && *domain && strcmp(domain, "ai.onnx")) return false;
    return op && (ox_elementwise_fn(op) || find_handler(op));
}

/* Every op but Constant reads input 0: checked once here. */
bool ox_convert(OxNode *n) {
    const char *op = ox_opname(n) ? ox_opname(n) : "";
    const char *dom = n->n->domain ? n->n->domain : "";
    if (!strcmp(dom, TRAINING) && find_training(op)) return find_training(op)->fn(n);
    bool (*elementwise)(OxNode *) = ox_elementwise_fn(op);
    const OxHandler *h = elementwise ? NULL : find_handler(op);
    if (*dom && strcmp(dom, "ai.onnx"))
        return ox_nfail(n, "unsupported op %s.%s (opset %d) at node %d", dom, op, n->im->opset,
                        n->index);
    if (!elementwise && !h)
        return ox_nfail(n, "unsupported op %s (opset %d) at node %d", op, n->im->opset, n->index);
    /* Constant and SequenceEmpty have no inputs; Loop's trip count and Scan-8's sequence_lens
     * may be absent */
    bool optional0 = !strcmp(op, "Constant") || !strcmp(op, "Loop") || !strcmp(op, "Scan") ||
                     !strcmp(op, "SequenceEmpty");
    if (!optional0 && !ox_in(n, 0)) return ox_nfail(n, "input 0 is required");
    return elementwise ? elementwise(n) : h->fn(n);
}
