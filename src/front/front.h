/*
 * front.h -- the front ends, above graph/: each turns a file into a graph
 * (or tensors) through the public builders.
 *
 *   lex.c       the .kiln tokenizer
 *   parse.c     the .kiln text format (public: kiln_parse, kiln_parse_file)
 *   npy.c       numpy .npy files <-> kiln_tensor (public: kiln_npy_read,
 *               kiln_npy_write)
 *   onnx.c      ONNX models and .pb tensors (public: kiln_onnx_import ...)
 *   onnx_values.c  the importer's value table (names -> OxVal)
 *   onnx_ops.c  the dispatch of one ONNX node to its handler, in
 *               onnx_elementwise.c, onnx_nn.c, onnx_shape.c or onnx_reduce.c
 *               (onnx_node.c: what the handlers share)
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

/* ===== lex.c: the .kiln tokenizer ======================================== */

typedef enum { T_EOF, T_NEWLINE, T_NAME, T_NUMBER, T_STRING, T_PUNCT, T_ERROR } TokKind;

typedef struct {
    TokKind kind;
    int pos, len;  /* the bytes of the source it covers */
    int line, col; /* 1-based position of its first byte */
    bool is_int;   /* T_NUMBER written without '.' or exponent */
    int64_t ival;  /* T_NUMBER with is_int */
    double num;    /* T_NUMBER */
} Token;

/* The longest name, in bytes (input, weight and output names are copied). */
#define LEX_MAX_NAME 127

/* The tokenizer's input and output. */
typedef struct {
    const char *src; /* the source; need not be NUL-terminated */
    int len;
    Token *toks; /* kmalloc'd; ends with T_EOF, or at a T_ERROR */
    int ntoks, cap;
    char lexmsg[128]; /* the message of the T_ERROR token, if any */
} Lexer;

/* Tokenize lx->src. False only when out of memory (toks may then hold a
 * partial array, which the caller kfrees all the same). */
bool lex_run(Lexer *lx);

#include "onnx.pb-c.h"

/* ONNX element types kiln knows by name (TensorProto.DataType). */
enum {
    OT_FLOAT = 1,
    OT_UINT8 = 2,
    OT_INT8 = 3,
    OT_UINT16 = 4,
    OT_INT16 = 5,
    OT_INT32 = 6,
    OT_INT64 = 7,
    OT_STRING = 8,
    OT_BOOL = 9,
    OT_FLOAT16 = 10,
    OT_DOUBLE = 11,
    OT_UINT32 = 12,
    OT_UINT64 = 13,
    OT_BFLOAT16 = 16,
};

typedef struct OxVal {
    const char *name;
    int type; /* ONNX element type (OT_...) */
    int rank;
    int64_t shape[KILN_MAX_RANK];
    double *c;    /* a constant: numel values; NULL for a graph value */
    double *spec; /* a graph input's value given at import, read only
                                  * where a constant is needed (Range bounds) */
    kiln_value v; /* graph value; for a constant, its node once made */
    bool is_seq;  /* a sequence (onnx_seq.c): nseq elements, type theirs */
    bool dead;    /* out of scope (a sub-program's value): ox_find does not see it */
    /* a graph value known to be base + off element by element (an integer
     * computed from another at run time: a Loop's i + 1), base a graph value
     * of the same numel: a Slice from i to i + 1 has a known length */
    bool affine;
    kiln_value base;
    double off;
    int nseq;
    struct OxVal **seq;
} OxVal;

typedef struct {
    Graph *g;
    const char *path; /* named in every message */
    int opset;        /* of the default domain */
    Arena arena;      /* values and constants; freed after import */
    OxVal **tab;      /* open-addressing hash table by name */
    int cap, count;
    int nconst;                    /* numbering of unnamed constants */
    const Onnx__GraphProto *graph; /* the model's main graph (Gradient reads it) */
    int pass, npasses;             /* an unrolled Loop or Scan body's pass (0: none): its
                        * constants' weights are named "name#pass" */
    char given[256];               /* the inputs whose symbolic dims took a given shape,
                      * "x [1,3,225,224]": named in a node's error */
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
/* Take a name out of scope: ox_find no longer finds it, ox_val makes it anew. */
void ox_forget(OxImp *im, const char *name);
/* TensorProto -> constant (any numeric type); false with g's error set. */
bool ox_tensor_const(OxImp *im, const Onnx__TensorProto *t, OxVal *out);

/* ---- onnx_ops.c ---- */
/* Convert one node; false with the graph's error set (ox_import adds the
 * node's index, name and op to the message). */
bool ox_convert(OxNode *n);
/* Whether the importer has a handler for op in domain ("" or "ai.onnx"). */
bool ox_supported(const char *domain, const char *op);
/* The graph value of v (a constant becomes a weight, or a scalar). */
kiln_value ox_graph(OxNode *n, OxVal *v);
/* The same for a model output (a constant is always a weight). */
kiln_value ox_graph_output(OxNode *n, OxVal *v);

/* ---- the op handlers (onnx_ops.c dispatches, onnx_*.c convert) ---- */

/* One ONNX op's converter: reads the node's inputs and attributes, sets
 * its outputs; false with the failure recorded (ox_nfail). */
typedef bool (*OxHandlerFn)(OxNode *n);
typedef struct {
    const char *name; /* the ONNX op type */
    OxHandlerFn fn;
} OxHandler;
/* Each file's handlers, searched by onnx_ops.c. */
extern const OxHandler ox_elementwise_ops[], ox_nn_ops[], ox_shape_ops[], ox_reduce_ops[],
    ox_resize_ops[], ox_loss_ops[], ox_rnn_ops[], ox_control_ops[], ox_scatter_ops[],
    ox_index_ops[], ox_signal_ops[], ox_sample_ops[], ox_quant_ops[], ox_seq_ops[], ox_text_ops[],
    ox_train_ops[], ox_einsum_ops[];
extern const size_t ox_elementwise_nops, ox_nn_nops, ox_shape_nops, ox_reduce_nops, ox_resize_nops,
    ox_loss_nops, ox_rnn_nops, ox_control_nops, ox_scatter_nops, ox_index_nops, ox_signal_nops,
    ox_sample_nops, ox_quant_nops, ox_seq_nops, ox_text_nops, ox_train_nops, ox_einsum_nops;
/* onnx_elementwise.c: the handler of a unary or binary elementwise op
 * (Add, Sqrt, ...: its tables), or NULL. */
OxHandlerFn ox_elementwise_fn(const char *op);

/* onnx_node.c: a constant evaluator: a, b, c the operands (unused ones 0),
 * type the ONNX type of a. */
typedef double (*EvalFn)(double a, double b, double c, int type);
bool ox_all_const(const OxNode *n);
const Onnx__AttributeProto *ox_attr(const OxNode *n, const char *name);
double ox_attr_f(const OxNode *n, const char *name, double def);
int64_t ox_attr_i(const OxNode *n, const char *name, int64_t def);
int ox_attr_ints(OxNode *n, const char *name, int64_t *out, int max);
/* Attribute name's floats (at most max): the count, -1 when absent. */
int ox_attr_floats(OxNode *n, const char *name, double *out, int max);
bool ox_attr_is(const OxNode *n, const char *name, const char *s, bool def);
int64_t ox_bcast_offset(const OxVal *v, int rank, const int64_t *idx);
bool ox_bcast_shape(OxNode *n, int nv, OxVal **v, int *rank, int64_t *shape);
int ox_const_ints(OxNode *n, int k, int64_t *out, int max, const char *what);
bool ox_eval_const(OxNode *n, int nv, OxVal **v, EvalFn f, int outtype);
void ox_spec_eval(OxNode *n, int nv, OxVal **v, EvalFn f, int outtype);
int ox_get_axes(OxNode *n, int since, int k, int64_t *axes, int max);
kiln_value ox_gin(OxNode *n, int k);
OxVal *ox_in(const OxNode *n, int k);
bool ox_is_int_type(int t);
/* float16 and bfloat16: f32 in the graph, rounded where stored (Cast). */
bool ox_is_half_type(int t);
/* int32, int64, uint32, uint64: held in f64 in the graph when from an input
 * or past 2^24 (exact to 2^53). */
bool ox_is_wide_int(int t);
/* Indices computed in the graph are f32: an index space of count elements
 * fits below 2^24, else the node is refused (what names the space). */
bool ox_index_fits(OxNode *n, int64_t count, const char *what);
/* Integer arithmetic wraps (two's complement) in types of up to 32 bits
 * (ox_wrap_graph: 8 and 16 bits in f32, 32 bits in f64):
 * r reduced into the type's range (64-bit types and floats: r itself). */
double ox_wrap_int(double r, int type);
/* int8, uint8, int16, uint16: every value and every sum or product of two
 * (after the split in onnx_elementwise.c) is exact in f32, so the graph
 * wraps their arithmetic exactly (ox_wrap_graph; other types: v itself). */
bool ox_is_narrow_int(int type);
kiln_value ox_wrap_graph(Graph *g, kiln_value v, int type);
const double *ox_known(const OxVal *v);
/* A constant in the graph: a weight (f32; f64 for a DOUBLE and for
 * integers past 2^24), a weak scalar (rank 0), or a bool (a weight
 * compared with 0). */
kiln_value ox_materialize(OxNode *n, OxVal *v);
/* A constant tensor of the given shape and values (copied), in the graph:
 * f32, or f64 in a node with a DOUBLE input. */
kiln_value ox_const_tensor(OxNode *n, int rank, const int64_t *shape, const double *vals);
/* A constant of rank dims, 1 in each but dim, which holds 0 .. len - 1. */
kiln_value ox_iota(OxNode *n, int rank, int dim, int64_t len);
/* x's graph value with a dim of 1 inserted at position at (0 .. rank). */
kiln_value ox_insert_dim(OxNode *n, OxVal *x, int at);
bool ox_need_in(OxNode *n, int k);
void ox_next_index(int rank, const int64_t *shape, int64_t *idx);
bool ox_nfail(OxNode *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool ox_nomem(OxNode *n);
bool ox_norm_axis(OxNode *n, int64_t *a, int rank);
const char *ox_opname(const OxNode *n);
OxVal *ox_out_slot(OxNode *n, int k);
OxVal *ox_set_const(OxNode *n, int k, int type, int rank, const int64_t *shape);
bool ox_set_graph(OxNode *n, int k, kiln_value v, int type);
int64_t ox_to_i64(double d);
const char *ox_unnamed(OxImp *im, char *buf, size_t len);
/* onnx_elementwise.c, onnx_nn.c: what other handlers share (ox_e_div:
 * ONNX Div on constants, integer division truncating). */
double ox_e_div(double a, double b, double c, int t);
kiln_value ox_normalize(Graph *g, kiln_value x, int nd, const int *dims, double eps,
                        kiln_value *mean_out, kiln_value *rstd_out);
kiln_value ox_per_channel(Graph *g, kiln_value p, int r);
/* onnx_nn.c: Conv of n's inputs 0 to 2 (X, W, B; n->in may be replaced,
 * as the integer convolutions do), into output 0. */
bool ox_conv(OxNode *n);
kiln_value ox_sc(Graph *g, double v);
/* onnx_elementwise.c: x rounded half to even (ONNX Round, numpy's rint). */
kiln_value ox_round_even(Graph *g, kiln_value x);

#endif
