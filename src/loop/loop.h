/*
 * loop.h -- the loop IR and the lowering into it, above graph/.
 *
 *   lower.c   decomposed graph -> loop IR (buffers with loop bodies); also
 *             the index algebra (ix_) and expressions (ex_)
 *   check.c   loop_check: the invariants lowering guarantees, verified
 *
 * The loop IR follows Inductor's: every value that must exist in memory is a
 * Buffer whose body says how to compute one element (Pointwise) or one
 * output of a reduction (Reduction) from loads `load(buf, index)`, where an
 * index is an affine expression of the loop variables v0..vk, with floor
 * division and modulo where a reshape needs them. Views never copy: they
 * compose into indices. Size-1 dims are dropped from every iteration space
 * (they contribute nothing to an index), so `[1024, 1]` iterates as `[1024]`.
 *
 * The scheduler makes one node per computed buffer, named op<N> after the
 * buffer buf<N> it computes, and fuses pairs in rounds; every can_fuse rule
 * is a named function in sched.c with the reason string it reports. All
 * thresholds live in KilnConfig.
 *
 * Memory: each LoopProgram and Schedule owns a Pool (an Arena) holding all
 * of its data; freeing it frees everything. Pool allocation failure
 * longjmps to the pass's entry, which frees the pool and returns
 * KILN_ERR_NOMEM, so no pass checks individual allocations.
 */
#ifndef KILN_LOOP_H
#define KILN_LOOP_H

#include "graph/graph.h"

/* ===== Index: integer expressions over loop variables ===================== */

typedef enum {
    IX_VAR,      /* v<v> */
    IX_CONST,    /* v */
    IX_ADD,      /* a[0] + ... + a[n-1] */
    IX_MUL,      /* a[0] * v (v a constant) */
    IX_FLOORDIV, /* floor(a[0] / v), v > 0 */
    IX_MOD,      /* a[0] mod v (floor semantics), v > 0 */
} IndexKind;

typedef struct Index Index;
struct Index {
    IndexKind kind;
    int64_t v; /* VAR: the variable; CONST: the value; MUL/FLOORDIV/MOD: the constant */
    int n;     /* ADD: number of terms; MUL/FLOORDIV/MOD: 1 */
    Index **a; /* the operands */
};

Index *ix_var(Pool *p, int v);
Index *ix_const(Pool *p, int64_t c);
Index *ix_add(Pool *p, Index *a, Index *b);
Index *ix_mul(Pool *p, Index *a, int64_t c);
Index *ix_div(Pool *p, Index *a, int64_t c);
Index *ix_mod(Pool *p, Index *a, int64_t c);
/* Canonical form given the range [0, ranges[v]) of each variable: constants
 * folded, affine terms collected as sum of coeff*atom sorted by atom, then
 * the constant; (e//c)*c + e%c -> e; e//1 -> e; e%1 -> 0; a div or mod whose
 * operand's range allows it folded away; a variable of range 1 -> 0. */
Index *ix_simplify(Pool *p, const Index *ix, int nvars, const int64_t *ranges);
/* Replace v<i> by map[i] (not simplified). */
Index *ix_subst(Pool *p, const Index *ix, Index *const *map);
/* Structural order of canonical indices; 0 when equal. */
int ix_cmp(const Index *a, const Index *b);
/* Bit v set when variable v occurs. */
uint32_t ix_vars(const Index *ix);
/* An affine index of canonical form: coef[v] (nvars of them) and offset.
 * false when a div or mod remains. */
bool ix_affine(const Index *ix, int nvars, int64_t *coef, int64_t *offset);
/* "1024*v0 + v1" */
void ix_print(Str *s, const Index *ix);
const char *ix_str(Pool *p, const Index *ix);
/* Contiguous (C order) index of coordinates vars[] in shape[]; size-1 dims
 * contribute nothing. */
Index *ix_contiguous(Pool *p, int rank, const int64_t *shape, Index *const *vars);

/* ===== Expr: the body of a loop ======================================== */

typedef enum {
    EX_LOAD,   /* buf at index */
    EX_CONST,  /* value */
    EX_OP,     /* op(args) for a pointwise op of ops.def */
    EX_SELECT, /* lo <= index < hi ? args[0] : args[1] (pad, concat) */
} ExprKind;

/* An absent bound of a select: the simplifier drops a comparison that the
 * index's range already satisfies. */
#define EX_NOLO INT64_MIN
#define EX_NOHI INT64_MAX

typedef struct Expr Expr;
struct Expr {
    ExprKind kind;
    kiln_dtype dtype; /* of the result */
    Op op;            /* EX_OP */
    int nargs;
    Expr **args;
    int buf;        /* EX_LOAD */
    Index *index;   /* EX_LOAD, EX_SELECT: canonical over the body's variables */
    double value;   /* EX_CONST */
    int64_t lo, hi; /* EX_SELECT: the range of index that picks args[0] */
};

Expr *ex_load(Pool *p, int buf, Index *index, kiln_dtype dt);
Expr *ex_const(Pool *p, double v);
Expr *ex_op(Pool *p, Op op, kiln_dtype dt, int nargs, Expr *const *args);
/* A select, folded to one branch when the range of index over ranges (nvars
 * variables) decides the predicate; a satisfied bound becomes EX_NOLO/NOHI.
 * The branch not taken may address outside its buffers (a pad's border, a
 * concat's other parts): codegen guards the loads of both branches. */
Expr *ex_select(Pool *p, Index *index, int64_t lo, int64_t hi, Expr *a, Expr *b, int nvars,
                const int64_t *ranges);
/* A copy with every load index substituted by map and simplified over ranges. */
Expr *ex_subst(Pool *p, const Expr *e, Index *const *map, int nvars, const int64_t *ranges);
int ex_nops(const Expr *e); /* number of EX_OP nodes */
/* Does e compute or hold an f64 value anywhere (and, with loads, load
 * one)? */
bool ex_has_f64(const Expr *e, bool loads);
/* Does op e compute in f64: a cast in its result's type, any other op when
 * its result or an operand is f64? */
bool ex_op_f64(const Expr *e);
/* The first expensive op (op_info[].expensive, ops.def) or -1. */
int ex_expensive(const Expr *e);
/* Sethi-Ullman number: registers needed to evaluate e without spilling. */
int ex_regs(const Expr *e);
/* Call fn for every load (in evaluation order). */
void ex_loads(const Expr *e, void (*fn)(const Expr *load, void *ud), void *ud);
/* Call fn for every select (its predicate index is e->index). */
void ex_selects(const Expr *e, void (*fn)(const Expr *sel, void *ud), void *ud);

/* ===== Buffers and the loop program ======================================= */

typedef enum {
    BODY_INPUT,     /* a runtime input */
    BODY_WEIGHT,    /* a compile-time constant: data */
    BODY_POINTWISE, /* out[contig(size)] = expr over v0..v(np-1) */
    BODY_REDUCTION, /* out[contig(size)] = rop over v(np).. of expr over parallel ++ reduced vars */
    BODY_EXTERN,    /* a library call: ext_op(operands) */
    BODY_RAND,      /* uniform [0,1) of the seed at each contiguous index */
} BodyKind;

typedef enum { ROP_SUM, ROP_AMAX, ROP_AMIN, ROP_PROD } ReduceOp;
extern const char *const rop_name[]; /* "sum", "max", "min", "prod" */

/* An extern operand: a strided view of a buffer, so a transposed operand can
 * become a BLAS transpose instead of a copy. */
typedef struct {
    int buf;
    int rank;
    int64_t shape[KILN_MAX_RANK];
    int64_t stride[KILN_MAX_RANK]; /* in elements; 0 for a broadcast dim */
    int64_t offset;
} BufView;

typedef struct {
    int id;
    const char *name; /* buf<N> for computed buffers, the name for inputs/weights */
    kiln_dtype dtype;
    int rank;
    int64_t shape[KILN_MAX_RANK]; /* contiguous, C order */
    int64_t numel;
    BodyKind body;
    int np; /* POINTWISE, RAND: iteration sizes; REDUCTION: parallel sizes */
    int64_t size[KILN_MAX_RANK];
    int nr; /* REDUCTION: reduced sizes (vars v(np)..v(np+nr-1)) */
    int64_t rsize[KILN_MAX_RANK];
    ReduceOp rop;
    Expr *expr; /* POINTWISE, REDUCTION */
    Op ext_op;  /* EXTERN: OP_MATMUL or OP_CONV2D */
    int nopnds;
    BufView opnd[3];
    int nattr;
    int64_t attr[MAX_ATTR];
    const GraphCall *call; /* EXTERN OP_CALL: the sub-programs (the graph owns them) */
    uint64_t seed;         /* RAND */
    const float *data;     /* WEIGHT (the graph owns it) */
    int node;              /* the graph node whose value this holds */
    bool is_output;
    int norigins; /* origin op names, sorted, unique */
    const char **origins;
    int ncover; /* graph node ids computed in its body, ascending */
    int *cover;
    const char *reason; /* why it was materialized */
} Buffer;

static inline bool buf_computed(const Buffer *b) {
    return b->body != BODY_INPUT && b->body != BODY_WEIGHT;
}

/* One inlining decision of the lowering (for logs and explain). */
typedef struct {
    int node; /* graph node */
    int buf;  /* the buffer it became, or -1: inlined */
    int users, ops;
    const char *reason; /* why materialized / why inlined */
} InlineDecision;

typedef struct {
    Pool pool;
    const Graph *g; /* the decomposed graph (not owned) */
    Buffer **bufs;  /* in creation order = program order */
    int nbufs, capbufs;
    int ncomputed; /* computed buffers: ids of the scheduler nodes */
    int ninputs;
    int *inputs; /* buffer of graph input i */
    int noutputs;
    int *outputs; /* buffer of graph output i */
    const char **outnames;
    int *node_buf; /* graph node -> buffer holding its value, or -1 */
    bool *live;    /* graph node is needed by some output */
    InlineDecision *dec;
    int ndec, capdec;
    int64_t unfused_bytes; /* eager traffic: every op reads operands, writes result */
} LoopProgram;

/* Lower a decomposed graph (no composite ops) to the loop IR. */
kiln_status lower_run(const Graph *g, const KilnConfig *cfg, LoopProgram **out, char *err,
                      size_t errlen);
void lower_free(LoopProgram *p);
/* Print a buffer ("buf0: Pointwise([1024, 1024], sin(...)) origins=[...]"). */
void lower_print_buffer(FILE *f, const LoopProgram *p, const Buffer *b);
void lower_print(FILE *f, const LoopProgram *p);
/* Expression text ("sin(relu(load(x, 1024*v0 + v1) + 1.0))"). */
void ex_print(Str *s, const LoopProgram *p, const Expr *e);
/* Element size of a dtype in bytes. */
int64_t loop_elsize(kiln_dtype dt);
/* The entries of a gathered dim of axis_len that nidx indices read: one
 * per index at most (an embedding lookup reads a few rows of a large
 * table), never more than all. Unfused and fused traffic both count so. */
int64_t lower_gathered_rows(int64_t axis_len, int64_t nidx);

/* ===== check.c =========================================================== */

/* Verify the invariants lower.c guarantees (check.c lists them): buffers
 * read only earlier buffers, indices use only their body's loop variables,
 * iteration sizes are >= 1 and cover the buffer, ops have op_info's kind and
 * arity, extern operands stay inside their buffers. KILN_OK, or
 * KILN_ERR_INPUT with the first violation in err, naming the buffer
 * ("loop IR check: buf3 loads buf7, which is computed later"): a bug in the
 * compiler, not in the program. Allocates nothing; O(size of the IR). */
kiln_status loop_check(const LoopProgram *p, char *err, size_t errlen);

#endif
