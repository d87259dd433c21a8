/*
 * front.h -- the front ends, above graph/: each turns a file into a graph
 * (or tensors) through the public builders.
 *
 *   parse.c     the .kiln text format (public: kiln_parse, kiln_parse_file)
 *   npy.c       numpy .npy files <-> kiln_tensor (public: kiln_npy_read,
 *               kiln_npy_write)
 *   onnx.c      ONNX models and .pb tensors (public: kiln_onnx_import ...)
 *   onnx_ops.c  one converter per ONNX op
 *
 * The rest of this header is the ONNX importer's (src/cli/onnx_test.c,
 * outside the library, runs the backend conformance tests). Names carry
 * the prefix ox_ / OX.
 *
 * A model is imported node by node, in the file's (topological) order.
 * Every ONNX value is an OxVal: either a constant known at import time
 * (initializers, Constant nodes, and everything computed from constants
 * alone: the shape arithmetic of exported models folds away here) or a
 * kiln graph value. Constants live on the host as doubles (exact for every
 * int32 and for int64 shape arithmetic, and for every f32) and become
 * kiln_weight nodes only when a graph op reads them.
 */
#ifndef KILN_FRONT_H
#define KILN_FRONT_H

#include "graph/graph.h"
#include "onnx.pb-c.h"

/* ONNX element types kiln knows by name (TensorProto.DataType). */
enum {
    OT_FLOAT = 1, OT_UINT8 = 2, OT_INT8 = 3, OT_UINT16 = 4, OT_INT16 = 5, OT_INT32 = 6,
    OT_INT64 = 7, OT_STRING = 8, OT_BOOL = 9, OT_FLOAT16 = 10, OT_DOUBLE = 11,
    OT_UINT32 = 12, OT_UINT64 = 13,
};

typedef struct {
    const char *name;
    int type;                    /* ONNX element type (OT_...) */
    int rank;
    int64_t shape[KILN_MAX_RANK];
    double *c;                   /* a constant: numel values; NULL for a graph value */
    double *spec;                /* a graph input's value given at import, read only
                                  * where a constant is needed (Range bounds) */
    kiln_value v;                /* graph value; for a constant, its node once made */
} OxVal;

typedef struct {
    Graph *g;
    const char *path;            /* named in every message */
    int opset;                   /* of the default domain */
    Arena arena;                 /* values and constants; freed after import */
    OxVal **tab;                 /* open-addressing hash table by name */
    int cap, count;
    int nconst;                  /* numbering of unnamed constants */
} OxImp;

/* The node being converted: its inputs resolved (NULL: absent optional). */
typedef struct {
    OxImp *im;
    const Onnx__NodeProto *n;
    int index;
    int nin;
    OxVal **in;
} OxNode;

/* ---- onnx.c ---- */
int64_t ox_numel(const OxVal *v);
const char *ox_type_name(int type);
/* Element k of a dense tensor of any kiln dtype, as a double. */
double ox_tensor_elem(const kiln_tensor *t, int64_t k);
/* A value's slot, created (zeroed, v = KILN_NONE) when absent; NULL: no memory. */
OxVal *ox_val(OxImp *im, const char *name);
OxVal *ox_find(OxImp *im, const char *name);
/* TensorProto -> constant (any numeric type); false with g's error set. */
bool ox_tensor_const(OxImp *im, const Onnx__TensorProto *t, OxVal *out);

/* ---- onnx_ops.c ---- */
/* Convert one node; false with the graph's error set (ox_import adds the
 * node's index, name and op to the message). */
bool ox_convert(OxNode *n);
/* The graph value of v (a constant becomes a weight, or a scalar). */
kiln_value ox_graph(OxNode *n, OxVal *v);
/* The same for a model output (a constant is always a weight). */
kiln_value ox_graph_output(OxNode *n, OxVal *v);

#endif
