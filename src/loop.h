/*
 * loop.h -- the loop IR, the lowering into it, the fusion scheduler and the
 * reports on what it decided.
 *
 *   lower.c   decomposed graph -> loop IR (buffers with loop bodies); also
 *             the index algebra (ix_), expressions (ex_) and the Pool
 *   sched.c   loop IR -> scheduler nodes -> fusion rounds -> kernels
 *   report.c  explain text, JSON report, Graphviz dot, the Plan helper and
 *             the KILN_LOGS switch
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

#include "kiln_int.h"
#include "target.h"
#include <setjmp.h>

/* ===== configuration ================================================== */

/* Topics of KILN_LOGS (a comma list: fusion,schedule,inline,loop_ir,rewrite;
 * "all"). */
enum {
    LOG_FUSION = 1 << 0,    /* rounds: candidates, rejections, fusions */
    LOG_SCHEDULE = 1 << 1,  /* the scheduler nodes before fusion, final kernels */
    LOG_INLINE = 1 << 2,    /* each pointwise value: inlined or materialized, why */
    LOG_LOOP_IR = 1 << 3,   /* the loop IR after lowering */
    LOG_REWRITE = 1 << 4,   /* graph rewrites applied or declined (Conv-BN folding) */
};

/* Every threshold of lowering and fusion, with where its default comes from. */
typedef struct {
    /* A pointwise value read by more consumers than this is materialized:
     * recomputing it in each costs more than one write and N reads. 4 follows
     * Inductor's realize_reads_threshold. */
    int max_inline_users;
    /* A pointwise value whose expression (with everything inlined into it)
     * has more ops than this is materialized, bounding kernel bodies and
     * recompute; Inductor's realize_opcount_threshold is 30. */
    int max_inline_ops;
    /* A fused node never holds more member nodes than this ("exceeds max
     * fusion"); Inductor's config.max_fusion_size. */
    int max_fusion_size;
    /* At most this many fusion rounds (Inductor: 10). */
    int max_rounds;
    /* The register budget of the target's vector unit: 32 zmm registers on
     * AVX-512 (16 ymm on AVX2). A fused body estimated to keep more values
     * live at once would spill ("register pressure"). */
    int vector_registers;
    /* Candidate pairs are only formed between a buffer's users at most this
     * many users apart (Inductor's max_fusion_buffer_group_pairwise_attempts). */
    int proximity_window;
    /* A horizontal fusion may raise the planned peak memory by at most this
     * fraction of it (0: not at all). */
    double peak_memory_slack;
    /* Pointwise consumers of an extern's output (bias, BN affine, relu, a
     * residual add, chains of these) fuse into the extern call as its
     * epilogue, run on each output block while it is in cache (on). false:
     * an extern is a wall ("node1 is extern"), as in Inductor. */
    bool extern_epilogue;
    /* LOG_* bits; kiln_config_default() reads them from KILN_LOGS. */
    unsigned logs;
    /* Where log lines go; NULL means stderr. */
    FILE *log;
    /* The instruction-set tier kernels are compiled for (target.h);
     * kiln_config_default() takes $KILN_TARGET when valid and runnable,
     * else the highest tier this CPU runs. */
    Target target;
} KilnConfig;

KilnConfig kiln_config_default(void);
/* The LOG_* bits named in KILN_LOGS (0 when unset). Unknown names are ignored. */
unsigned loop_logs_from_env(void);
/* printf to cfg->log (or stderr) when topic is on. */
void loop_log(const KilnConfig *cfg, unsigned topic, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ===== Pool: an Arena that longjmps when it runs out ====================== */

typedef struct {
    Arena arena;
    jmp_buf *oom;            /* where to go on failure; NULL: abort() */
} Pool;

void *pool_alloc(Pool *p, size_t n);          /* zeroed, never NULL */
char *pool_strdup(Pool *p, const char *s);
char *pool_printf(Pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Grow an array held in the pool to hold at least `need` items (doubling). */
void *pool_grow(Pool *p, void *arr, int *cap, int need, size_t item);
void pool_free(Pool *p);

/* A growable string in a pool. */
typedef struct {
    Pool *pool;
    char *s;
    size_t n, cap;
} Str;
void str_init(Str *s, Pool *p);
void str_putf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *str_get(Str *s);     /* "" when nothing was written */

/* ===== Index: integer expressions over loop variables ===================== */

typedef enum {
    IX_VAR,        /* v<v> */
    IX_CONST,      /* v */
    IX_ADD,        /* a[0] + ... + a[n-1] */
    IX_MUL,        /* a[0] * v (v a constant) */
    IX_FLOORDIV,   /* floor(a[0] / v), v > 0 */
    IX_MOD,        /* a[0] mod v (floor semantics), v > 0 */
} IndexKind;

typedef struct Index Index;
struct Index {
    IndexKind kind;
    int64_t v;     /* VAR: the variable; CONST: the value; MUL/FLOORDIV/MOD: the constant */
    int n;         /* ADD: number of terms; MUL/FLOORDIV/MOD: 1 */
    Index **a;     /* the operands */
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
    EX_LOAD,     /* buf at index */
    EX_CONST,    /* value */
    EX_OP,       /* op(args) for a pointwise op of ops.def */
    EX_SELECT,   /* lo <= index < hi ? args[0] : args[1] (pad, concat) */
} ExprKind;

/* An absent bound of a select: the simplifier drops a comparison that the
 * index's range already satisfies. */
#define EX_NOLO INT64_MIN
#define EX_NOHI INT64_MAX

typedef struct Expr Expr;
struct Expr {
    ExprKind kind;
    kiln_dtype dtype;    /* of the result */
    Op op;               /* EX_OP */
    int nargs;
    Expr **args;
    int buf;             /* EX_LOAD */
    Index *index;        /* EX_LOAD, EX_SELECT: canonical over the body's variables */
    double value;        /* EX_CONST */
    int64_t lo, hi;      /* EX_SELECT: the range of index that picks args[0] */
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
int ex_nops(const Expr *e);            /* number of EX_OP nodes */
/* The first expensive op (exp log sin cos tanh erf pow sigmoid) or -1. */
int ex_expensive(const Expr *e);
bool op_is_expensive(Op op);
/* Sethi-Ullman number: registers needed to evaluate e without spilling. */
int ex_regs(const Expr *e);
/* Call fn for every load (in evaluation order). */
void ex_loads(const Expr *e, void (*fn)(const Expr *load, void *ud), void *ud);
/* Call fn for every select (its predicate index is e->index). */
void ex_selects(const Expr *e, void (*fn)(const Expr *sel, void *ud), void *ud);

/* ===== Buffers and the loop program ======================================= */

typedef enum {
    BODY_INPUT,      /* a runtime input */
    BODY_WEIGHT,     /* a compile-time constant: data */
    BODY_POINTWISE,  /* out[contig(size)] = expr over v0..v(np-1) */
    BODY_REDUCTION,  /* out[contig(size)] = rop over v(np).. of expr over parallel ++ reduced vars */
    BODY_EXTERN,     /* a library call: ext_op(operands) */
    BODY_RAND,       /* uniform [0,1) of the seed at each contiguous index */
} BodyKind;

typedef enum { ROP_SUM, ROP_AMAX, ROP_AMIN, ROP_PROD } ReduceOp;
extern const char *const rop_name[];   /* "sum", "max", "min", "prod" */

/* An extern operand: a strided view of a buffer, so a transposed operand can
 * become a BLAS transpose instead of a copy. */
typedef struct {
    int buf;
    int rank;
    int64_t shape[KILN_MAX_RANK];
    int64_t stride[KILN_MAX_RANK];    /* in elements; 0 for a broadcast dim */
    int64_t offset;
} BufView;

typedef struct {
    int id;
    const char *name;          /* buf<N> for computed buffers, the name for inputs/weights */
    kiln_dtype dtype;
    int rank;
    int64_t shape[KILN_MAX_RANK];   /* contiguous, C order */
    int64_t numel;
    BodyKind body;
    int np;                    /* POINTWISE, RAND: iteration sizes; REDUCTION: parallel sizes */
    int64_t size[KILN_MAX_RANK];
    int nr;                    /* REDUCTION: reduced sizes (vars v(np)..v(np+nr-1)) */
    int64_t rsize[KILN_MAX_RANK];
    ReduceOp rop;
    Expr *expr;                /* POINTWISE, REDUCTION */
    Op ext_op;                 /* EXTERN: OP_MATMUL or OP_CONV2D */
    int nopnds;
    BufView opnd[3];
    int nattr;
    int64_t attr[MAX_ATTR];
    uint64_t seed;             /* RAND */
    const float *data;         /* WEIGHT (the graph owns it) */
    int node;                  /* the graph node whose value this holds */
    bool is_output;
    int norigins;              /* origin op names, sorted, unique */
    const char **origins;
    int ncover;                /* graph node ids computed in its body, ascending */
    int *cover;
    const char *reason;        /* why it was materialized */
} Buffer;

static inline bool buf_computed(const Buffer *b) {
    return b->body != BODY_INPUT && b->body != BODY_WEIGHT;
}

/* One inlining decision of the lowering (for logs and explain). */
typedef struct {
    int node;                  /* graph node */
    int buf;                   /* the buffer it became, or -1: inlined */
    int users, ops;
    const char *reason;        /* why materialized / why inlined */
} InlineDecision;

typedef struct {
    Pool pool;
    const Graph *g;            /* the decomposed graph (not owned) */
    Buffer **bufs;             /* in creation order = program order */
    int nbufs, capbufs;
    int ncomputed;             /* computed buffers: ids of the scheduler nodes */
    int ninputs;
    int *inputs;               /* buffer of graph input i */
    int noutputs;
    int *outputs;              /* buffer of graph output i */
    const char **outnames;
    int *node_buf;             /* graph node -> buffer holding its value, or -1 */
    bool *live;                /* graph node is needed by some output */
    InlineDecision *dec;
    int ndec, capdec;
    int64_t unfused_bytes;     /* eager traffic: every op reads operands, writes result */
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

/* ===== scheduler ========================================================== */

/* A read or write of a scheduler node: (buffer, canonical index, sizes). The
 * index is over the node's iteration variables: pointwise its output dims;
 * reduction its parallel dims then its reduced dims. A write's sizes are the
 * node's parallel sizes; a read's are its full iteration sizes. */
typedef struct {
    int buf;
    const Index *index;
    const char *ix;            /* canonical text of index */
    int nsizes;
    int64_t sizes[KILN_MAX_RANK];
    bool write;
    int64_t bytes;             /* distinct elements addressed x element size */
} Dep;

typedef struct {
    const char *name;          /* op<N> */
    int buf;                   /* the buffer it computes */
    BodyKind body;
    int device;                /* 0: the CPU (the only device so far) */
    int np, nr;                /* loop structure: parallel sizes, reduced sizes */
    int64_t P[KILN_MAX_RANK], R[KILN_MAX_RANK];
    int64_t numel, rnumel;     /* the group */
    int ndeps;
    Dep *deps;
    uint64_t *anc;             /* ancestors: bitset over nodes */
    int regs;                  /* Sethi-Ullman number of its body */
} SNode;

typedef enum { KK_POINTWISE, KK_REDUCTION, KK_EXTERN } KernelKind;
extern const char *const kernel_kind_name[];
/* A stage of a reduction kernel: an inner loop over the reduced dims, or a
 * per-row scalar step, inside the shared outer loop over the parallel dims. */
typedef enum { STAGE_INNER, STAGE_ROW } StageKind;
/* Where a member's result lives. */
typedef enum {
    STORE_GLOBAL,     /* written to memory: an output or read by another kernel */
    STORE_REGISTER,   /* consumed in the same loop body only */
    STORE_ROW_LOCAL,  /* consumed in a later stage of the same row: a per-row local */
} StoreKind;
extern const char *const store_name[];

typedef struct {
    const char *name;          /* fused node name: members joined by '_' */
    const char *kernel;        /* cpp_fused_<origins>_<k> or extern_kernels.<op> */
    KernelKind kind;
    int n;
    int *members;              /* node indices in program order */
    int *stage;                /* stage of each member */
    StoreKind *store;          /* of each member */
    int nstages;
    StageKind *stage_kind;
    int np, nr;
    int64_t P[KILN_MAX_RANK], R[KILN_MAX_RANK];
    int64_t numel, rnumel;
    int loop_nests;            /* 1 for a generated kernel, 0 for an extern call */
    int norigins;
    const char **origins;
    int regs;                  /* estimated live vector values */
    int64_t load_bytes, store_bytes;
} Kernel;

typedef enum { EV_ROUND, EV_REJECT, EV_DEFER, EV_FOUND, EV_FUSE, EV_DONE } EventKind;
/* The fusion log, kept for explain: one entry per line of KILN_LOGS=fusion. */
typedef struct {
    EventKind kind;
    int round;
    const char *a, *b;         /* node names */
    const char *reason;
    int n0, n1;                /* EV_ROUND: nodes; EV_FOUND: n0 possible; EV_DONE: before, after */
} Event;

typedef struct {
    int possible;              /* "found N possible fusions" */
    int nfused, capfused;
    const char **fused_a, **fused_b;   /* the pairs fused, in order */
    int nodes_before, nodes_after;
} Round;

typedef struct {
    const char *node1, *node2, *reason;
    int round;
} Rejection;

typedef struct Schedule {
    Pool pool;
    const LoopProgram *prog;
    const Graph *g;
    KilnConfig cfg;
    int nnodes;
    SNode *nodes;              /* node i computes buffer nodes[i].buf */
    int *node_of_buf;          /* buffer -> node, or -1 */
    int nkernels;
    Kernel *kernels;           /* in call order */
    int nrounds;
    Round *rounds;
    int nrejected, caprejected;
    Rejection *rejected;
    int nevents, capevents;
    Event *events;
    int64_t unfused_bytes, fused_bytes, peak_bytes;
    char why[640];             /* scratch for formatted reasons */
} Schedule;

kiln_status sched_run(const LoopProgram *p, const KilnConfig *cfg, Schedule **out, char *err,
                      size_t errlen);
void sched_free(Schedule *s);
/* Why nodes a and b (by name, "op3") could not be fused, each as its own
 * node in program order; NULL when they could. For tests and explain. */
const char *sched_why_not(Schedule *s, const char *a, const char *b);
/* Peak bytes of the final call sequence: inputs, weights and outputs live
 * throughout, every other stored buffer from its kernel to its last reader. */
int64_t sched_peak_memory(const Schedule *s);
int sched_node_index(const Schedule *s, const char *name);   /* -1 if none */
/* What the library runs for an extern buffer (externs.c's choice by shape,
 * backend and CPU: "oneDNN (...)", "OpenBLAS sgemm", ...), for reports. */
const char *sched_extern_path(const Buffer *b, char *buf, size_t n);
/* One line of the fusion log, as KILN_LOGS=fusion prints it. */
void sched_print_event(FILE *f, const Schedule *s, const Event *e);
/* "SchedulerNode(name='op0'), Pointwise(['[1024, 1024]', 'origins=[add, mul]'])" */
void sched_print_nodes(FILE *f, const Schedule *s);

/* ===== reports (report.c) ================================================ */

/* What the CLI prints on top of a schedule. */
typedef struct {
    int nodes_before, nodes_after, nrounds, nkernels, ncalls, nextern;
    int64_t unfused_bytes, fused_bytes, peak_memory_bytes;
} PlanSummary;
void sched_summary(const Schedule *s, PlanSummary *out);

/* The compile pipeline up to scheduling, owned as one object. */
typedef struct {
    Graph *dec;                /* the decomposed graph (owned) */
    LoopProgram *prog;
    Schedule *sched;
} Plan;
kiln_status plan_build(const Graph *g, const KilnConfig *cfg, Plan **out, char *err,
                       size_t errlen);
void plan_free(Plan *p);

/* Extra members of the JSON report, written by the caller (check, timing):
 * fn prints `, "key": value` pairs. NULL for none. */
typedef struct {
    void (*fn)(FILE *f, void *ud);
    void *ud;
} ReportHooks;

void report_explain(FILE *f, const Schedule *s);
void report_json(FILE *f, const Schedule *s, const ReportHooks *hooks);
void report_dot(FILE *f, const Schedule *s);
/* The loop nest of one kernel as indented text. */
void report_loop_nest(FILE *f, const Schedule *s, const Kernel *k, const char *indent);

#endif
