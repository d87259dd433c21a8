/*
 * graph.h -- the graph IR and the passes over it, above base/.
 *
 *   ops.def     the op table: one X(...) line per op
 *   ops.c       op_info and op_lookup
 *   graph.c     graphs, errors, outputs, inspection
 *   build.c     the public builders (kiln_input ... kiln_conv2d): operand
 *               checks and shape inference
 *   rewrite.c   pattern rewrites applied while decomposing (Conv-BN folding)
 *   decompose.c composite ops -> primitives, keeping each one's origin
 *
 * Names: graph_, rw_, dec_, op_ prefixes across files.
 */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "base/base.h"

/* ===== op table (ops.def) ============================================= */

typedef enum {
    KIND_SOURCE,    /* input, weight, scalar constant */
    KIND_POINTWISE, /* elementwise with numpy broadcasting: fuses freely */
    KIND_REDUCTION, /* sum/amax/amin/prod over some dims */
    KIND_VIEW,      /* permute/reshape/expand/slice: index arithmetic only */
    KIND_EXTERN,    /* matmul/conv2d: a library call, a wall for loop fusion */
    KIND_RANDOM,    /* rand: materialized once, never recomputed */
    KIND_COMPOSITE, /* rewritten into primitives by decompose.c */
} OpKind;

typedef enum {
#define X(e, name, kind, arity, expensive, cform) OP_##e,
#include "graph/ops.def"
#undef X
    OP_COUNT
} Op;

typedef struct {
    const char *name;
    OpKind kind;
    int arity;
    bool expensive;    /* tens of instructions per element (ops.def) */
    const char *cform; /* its form in generated kernels */
} OpInfo;

extern const OpInfo op_info[OP_COUNT];
/* The op with this name, or -1. */
int op_lookup(const char *name);

/* ===== graph.c ========================================================== */

#define MAX_IN 5                         /* most operands of any op (batch_norm) */
#define MAX_ATTR (2 * KILN_MAX_RANK + 1) /* PAD: mode, before[rank], after[rank] */

/* Node flags. */
enum {
    NF_KEEPDIM = 1 << 0,   /* reductions: keep reduced dims as size 1 */
    NF_HAS_MIN = 1 << 1,   /* clamp */
    NF_HAS_MAX = 1 << 2,   /* clamp */
    NF_TAP = 1 << 3,       /* a view made by a pool decomposition for a window
                            * tap after the first: not counted as a user of
                            * what it views (see lower.c, analyze) */
    NF_CEIL = 1 << 4,      /* pools: ceil_mode */
    NF_COUNT_PAD = 1 << 5, /* avg_pool: count_include_pad */
};

/*
 * One operation. Attribute meaning by op:
 *   reductions, softmax, log_softmax:  attr = dims (normalized, sorted)
 *   PERMUTE: attr = perm;  RESHAPE, EXPAND: attr = output shape
 *   SLICE:   attr = {dim, start, end, step} (normalized as Python's
 *            slice.indices; step may be negative, then end may be -1)
 *   PAD:     attr = {mode, before[rank], after[rank]}; f[0] = value.
 *            Only KILN_PAD_CONSTANT reaches lowering and the interpreter;
 *            decompose.c rewrites edge and reflect into slices and concats
 *   CONCAT:  attr = {dim}; in = the parts (at most MAX_IN; the builder nests)
 *   MAX_POOL, AVG_POOL: attr = {ns, kernel[ns], stride[ns], dilation[ns],
 *            pad_begin[ns], pad_end[ns]}; flags NF_CEIL, NF_COUNT_PAD
 *   LAYER_NORM: attr = normalized_shape; f[0] = eps; in = x [, w] [, b]
 *               with flags bit 8 = has weight, bit 9 = has bias
 *   BATCH_NORM: f[0] = eps; in = x, mean, var, w, b (w/b may be -1)
 *   CONV2D:  attr = {sh, sw, ph, pw, dh, dw, groups}; in = x, w [, b]
 *   GATHER:  attr = {axis} (normalized); in = data, indices
 *   CONV_TRANSPOSE2D: attr = {sh, sw, ph, pw, oph, opw, dh, dw, groups}; in = x, w [, b]
 *   CALL:    call = what runs (GraphCall); in = the packed operands
 *   CONST:   f[0] = value;  CLAMP: f[0] = min, f[1] = max
 *   DROPOUT: f[0] = p;  RAND, DROPOUT: seed
 */
typedef struct {
    Op op;
    kiln_dtype dtype; /* KILN_F32, KILN_F64 or KILN_BOOL */
    int rank;
    int64_t shape[KILN_MAX_RANK];
    int nin;
    int in[MAX_IN]; /* operand node ids; -1 for an absent optional */
    int nattr;
    int64_t attr[MAX_ATTR];
    double f[2];
    unsigned flags;
    uint64_t seed;
    const char *origin;           /* the user-level op this node came from */
    const char *name;             /* input/weight/output name, or NULL */
    float *data;                  /* WEIGHT: numel floats (F64: doubles), arena-owned */
    const struct GraphCall *call; /* CALL: the sub-programs (the graph owns them) */
} Node;

enum { NF_LN_WEIGHT = 1 << 8, NF_LN_BIAS = 1 << 9 };

/* One line on a rewrite dec_run applied or declined ("folded batch_norm %7
 * into conv2d %6 ..."), kept in the rewritten graph for logs and explain. */
typedef struct GraphNote GraphNote;
struct GraphNote {
    const char *text; /* arena-owned */
    GraphNote *next;
};

struct kiln_graph {
    Arena arena; /* owns node names, weight data, arrays */
    Node *nodes; /* kmalloc'd, grows */
    int n, cap;
    int *inputs;
    int ninputs, capinputs; /* INPUT node ids, declaration order */
    int *outputs;
    int noutputs, capoutputs; /* output node ids */
    const char **outnames;    /* parallel to outputs */
    const char *origin;       /* when set, new nodes take this origin */
    GraphNote *notes;         /* rewrites applied or declined, in order (arena) */
    struct GraphCall *calls;  /* the CALL nodes' sub-programs, to free with the graph */
    int nnotes;
    char err[1024];
    kiln_status status; /* sticky: the first failure */
    /* An ONNX model whose symbolic dims took the shapes given at import:
     * its bytes and file name (kmalloc'd), so that a program compiled from
     * the graph can import it again at other input shapes (runtime.c,
     * kiln_program_run); NULL for any other graph. */
    unsigned char *model;
    size_t model_len;
    char *model_name;
};

typedef kiln_graph Graph;

/*
 * Control flow (OP_CALL): sub-programs the runtime calls, each a graph of
 * its own compiled to a program of its own; the calling node is a wall for
 * fusion like an extern kernel. Its one operand packs every value the
 * sub-programs read, each flattened and cast to the node's dtype, in the
 * order below; its value packs what they give, then scratch space the
 * runtime uses (views slice the results out). Every sub-program input and
 * output has the node's dtype (the importer casts inside the body).
 *
 * CALL_LOOP (ONNX Loop and Scan): body[0] runs once per iteration.
 *   operand: [trip count] [condition] states... scan inputs... captures...
 *     (a scan input: its length times one slice, the sliced axis first and
 *     in iteration order)
 *   body inputs: [iteration] [condition] states... scan slices... captures...
 *   body outputs: [condition] states... scan slices...
 *     (the [] ones are there when `loop` is set: ONNX Loop's form)
 *   value: states... scan outputs (each trips times one slice)...; then
 *     scratch: states... [iteration] [condition in] [condition out]
 *   The trip count is `trips` when >= 0, else the operand's (has_trip; a
 *   value past 2^63 or none at all: unbounded); the loop also stops when the
 *   condition (has_cond: its start value) turns false. Scan outputs need
 *   `trips` and no condition: their size is static.
 * CALL_IF: body[0] (then) or body[1] (else), by the operand's first element
 *   (one of them may be missing, refused[] says why: taking it is an error).
 *   operand: [condition] then's captures... else's captures...
 *   value: the taken branch's outputs.
 */
typedef enum { CALL_LOOP, CALL_IF } CallKind;
typedef struct GraphCall {
    CallKind kind;
    kiln_graph *body[2]; /* owned */
    bool loop;           /* LOOP: the body has ONNX Loop's iteration and condition */
    bool has_trip;       /* LOOP: the operand starts with the trip count */
    bool has_cond;       /* LOOP: then with the start condition */
    int64_t trips;       /* LOOP: the iterations when known at compile time, else -1 */
    int nstate, nscan_in, nscan_out;
    const char *label; /* "Loop 'name' (node 3)", for explain */
    /* IF: why a branch did not import at these shapes (its body NULL): a
     * run whose condition takes it fails with this (NULL: it imported) */
    const char *refused[2];
    struct GraphCall *next; /* the owning graph's list */
} GraphCall;

/* What body k of a call is, for messages: "body", "then_branch" or
 * "else_branch". */
const char *graph_call_part(const GraphCall *c, int k);
/* Body k's name for explain and the profile: the path of calls that leads
 * to the call ("" at the top), the call's label and graph_call_part. */
void graph_call_name(char *buf, size_t len, const char *path, const GraphCall *c, int k);
/* The message of a run that takes IF branch b, which was refused. */
void graph_call_refusal(const GraphCall *c, int b, char *buf, size_t len);
/* The call's captures of body b (LOOP: after the states and scan slices). */
int graph_call_ncap(const GraphCall *c, int b);
/* The number of elements of body b's input or output k (its dense numel). */
int64_t graph_call_numel(const kiln_graph *body, bool output, int k);
/* The operand's numel (at least 1: an operand of nothing holds one unused
 * element) and the value's, scratch included (for the builder). */
int64_t graph_call_in_numel(const GraphCall *c);
int64_t graph_call_out_numel(const GraphCall *c);
/* The trip count an operand element holds (a double): < 0 for none (NaN,
 * or 2^63 and past). */
int64_t graph_call_trips(double v);
/* Free a call not given to graph_call (its bodies too); NULL is fine. */
void graph_call_free(GraphCall *c);
/* A call node over the packed operand: takes ownership of c (freed with g
 * even on failure); the value has dtype that of the operand. */
kiln_value graph_call(Graph *g, GraphCall *c, kiln_value packed);

/* Record a failure (only the first one is kept); returns KILN_NONE. */
int graph_fail(Graph *g, kiln_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clear a recorded failure (the parser adds positions and continues). */
void graph_clear_error(Graph *g);
/* Record "out of memory"; returns KILN_NONE. */
int graph_nomem(Graph *g);
/* A usable operand of builder op: a value of this graph, and no earlier
 * failure (else the failure is recorded, naming op). */
bool graph_ok_value(Graph *g, kiln_value v, const char *op);
/* Grow an int array by one slot; false when out of memory. */
bool graph_push_int(int **arr, int *n, int *cap, int v);
/* Append a node; shape must be set. Returns its id or KILN_NONE. */
int graph_add(Graph *g, const Node *n);
static inline const Node *graph_node(const Graph *g, int id) { return &g->nodes[id]; }
static inline int64_t node_numel(const Node *n) { return util_numel(n->rank, n->shape); }
/* Number of users of each node (outputs count as a user). kmalloc'd. */
int *graph_use_counts(const Graph *g);
/* "[2, 3]" */
void graph_shape_str(char *buf, size_t len, int rank, const int64_t *shape);
/* One node as a line of text (kiln_graph_dump). */
void graph_dump_node(FILE *f, const Graph *g, int id);
/* Does t match the declared dtype and shape of input i, with data? The
 * interpreter and the compiled runtime check every run's inputs with it. */
kiln_status graph_check_input(const Graph *g, int i, const kiln_tensor *t, char *err,
                              size_t errlen);
/* A new weight whose data (zeroed, numel floats, arena-owned) the caller
 * fills through *data: kiln_weight without a buffer to copy from (the
 * ONNX importer converts its constants straight into it). */
int graph_weight_alloc(Graph *g, const char *name, int rank, const int64_t *shape, float **data);
/* The same of dtype F32 or F64 (numel doubles: Node.data then holds doubles). */
int graph_weight_alloc_typed(Graph *g, const char *name, kiln_dtype dt, int rank,
                             const int64_t *shape, void **data);
/* Copy a node into another graph with operands remapped by map[]. */
int graph_copy_node(Graph *dst, const Graph *src, int id, const int *map);

/* Append a note (printf-style) to g->notes; false when out of memory. */
bool graph_note(Graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ===== rewrite.c ======================================================== */

/* Pattern rewrites, planned over the source graph and applied by dec_run
 * while it copies nodes into the decomposed graph.
 *
 * Conv-BN folding: a BATCH_NORM whose input is a CONV2D that nothing else
 * uses (not another op, not an output), where the conv's weight and bias and
 * all of BN's parameters are WEIGHT nodes, becomes one conv with weight
 * w * gamma/sqrt(var+eps) per output channel and bias
 * (b - mean) * gamma/sqrt(var+eps) + beta. */
typedef struct {
    int *bn_conv; /* per node: for a BATCH_NORM that folds, its conv; else -1 */
    bool *drop;   /* per node: not copied (the folded conv, weights read only
                      * by folded pairs) */
    int nfolds;
} RwPlan;

/* Plan the rewrites of src; notes on declined folds go to notes_to (may be
 * NULL). KILN_ERR_NOMEM or KILN_OK; free with rw_plan_free. */
kiln_status rw_plan(const Graph *src, Graph *notes_to, RwPlan *plan);
void rw_plan_free(RwPlan *plan);
/* Emit the folded conv of BATCH_NORM node bn (plan->bn_conv[bn] >= 0) into
 * dst, operands mapped by map[]; returns its id, or KILN_NONE with dst's
 * error set. */
int rw_fold_conv_bn(Graph *dst, const Graph *src, int bn, const int *map);

/* ===== decompose.c ===================================================== */

/* Rewrite composites into primitives: dst (new, empty) receives the
 * primitive graph with the same inputs (same order) and outputs (same
 * order and names). Each primitive's origin is the composite's name.
 * The pattern rewrites of rewrite.c are applied first (they change no
 * input or output), and dst->notes says which were applied or declined. */
kiln_status dec_run(const Graph *src, Graph *dst);

#endif
