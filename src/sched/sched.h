/*
 * sched.h -- the fusion scheduler and the reports on what it decided.
 *
 *   sched.c   loop IR -> scheduler nodes -> fusion rounds -> kernels
 *   report.c  explain text, JSON report, Graphviz dot
 *   check.c   sched_check: the invariants the scheduler guarantees, verified
 */
#ifndef KILN_SCHED_H
#define KILN_SCHED_H

#include "externs/externs.h"
#include "loop/loop.h"

/* ===== scheduler ========================================================== */

/* A read or write of a scheduler node: (buffer, canonical index, sizes). The
 * index is over the node's iteration variables: pointwise its output dims;
 * reduction its parallel dims then its reduced dims. A write's sizes are the
 * node's parallel sizes; a read's are its full iteration sizes. */
typedef struct {
    int buf;
    const Index *index;
    const char *ix; /* canonical text of index */
    int nsizes;
    int64_t sizes[KILN_MAX_RANK];
    bool write;
    int64_t bytes; /* distinct elements addressed x element size */
} Dep;

typedef struct {
    const char *name; /* op<N> */
    int buf;          /* the buffer it computes */
    BodyKind body;
    int device; /* 0: the CPU (the only device so far) */
    int np, nr; /* loop structure: parallel sizes, reduced sizes */
    int64_t P[KILN_MAX_RANK], R[KILN_MAX_RANK];
    int64_t numel, rnumel; /* the group */
    int ndeps;
    Dep *deps;
    uint64_t *anc; /* ancestors: bitset over nodes */
    int regs;      /* Sethi-Ullman number of its body */
} SNode;

typedef enum { KK_POINTWISE, KK_REDUCTION, KK_EXTERN } KernelKind;
extern const char *const kernel_kind_name[];
/* A stage of a reduction kernel: an inner loop over the reduced dims, or a
 * per-row scalar step, inside the shared outer loop over the parallel dims. */
typedef enum { STAGE_INNER, STAGE_ROW } StageKind;
/* Where a member's result lives. */
typedef enum {
    STORE_GLOBAL,    /* written to memory: an output or read by another kernel */
    STORE_REGISTER,  /* consumed in the same loop body only */
    STORE_ROW_LOCAL, /* consumed in a later stage of the same row: a per-row local */
} StoreKind;
extern const char *const store_name[];

typedef struct {
    const char *name;   /* fused node name: members joined by '_' */
    const char *kernel; /* cpp_fused_<origins>_<k> or extern_kernels.<op> */
    KernelKind kind;
    int n;
    int *members;     /* node indices in program order */
    int *stage;       /* stage of each member */
    StoreKind *store; /* of each member */
    int nstages;
    StageKind *stage_kind;
    int np, nr;
    int64_t P[KILN_MAX_RANK], R[KILN_MAX_RANK];
    int64_t numel, rnumel;
    int loop_nests; /* 1 for a generated kernel, 0 for an extern call */
    int norigins;
    const char **origins;
    int regs; /* estimated live vector values */
    int64_t load_bytes, store_bytes;
} Kernel;

typedef enum { EV_ROUND, EV_REJECT, EV_DEFER, EV_FOUND, EV_FUSE, EV_DONE } EventKind;
/* The fusion log, kept for explain: one entry per line of KILN_LOGS=fusion. */
typedef struct {
    EventKind kind;
    int round;
    const char *a, *b; /* node names */
    const char *reason;
    int n0, n1; /* EV_ROUND: nodes; EV_FOUND: n0 possible; EV_DONE: before, after */
} Event;

typedef struct {
    int possible; /* "found N possible fusions" */
    int nfused, capfused;
    const char **fused_a, **fused_b; /* the pairs fused, in order */
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
    SNode *nodes;     /* node i computes buffer nodes[i].buf */
    int *node_of_buf; /* buffer -> node, or -1 */
    int nkernels;
    Kernel *kernels; /* in call order */
    int nrounds;
    Round *rounds;
    int nrejected, caprejected;
    Rejection *rejected;
    int nevents, capevents;
    Event *events;
    int64_t unfused_bytes, fused_bytes, peak_bytes;
    char why[640]; /* scratch for formatted reasons */
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
int sched_node_index(const Schedule *s, const char *name); /* -1 if none */
/* What the library runs for an extern buffer (externs/'s choice by shape,
 * backend and CPU: "oneDNN (...)", "OpenBLAS sgemm", ...), for reports. */
const char *sched_extern_path(const LoopProgram *p, const Buffer *b, char *buf, size_t n);
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

/* ===== check.c ============================================================ */

/* Verify the invariants sched.c guarantees (check.c lists them): one node
 * per computed buffer, each in exactly one kernel of at most max_fusion_size
 * members; kernels in call order, reading only sources, their own members
 * and what earlier kernels stored; valid stages, kinds and loops; traffic
 * sums; rounds and the fusion log naming valid nodes. KILN_OK, or
 * KILN_ERR_INPUT with the first violation in err, naming the node or kernel
 * ("schedule check: kernel 1 (cpp_fused_add_0) reads buf2, which kernel 3
 * (cpp_fused_sin_1) produces later"): a bug in the compiler, not in the
 * program. KILN_ERR_NOMEM if its one node table cannot be allocated.
 * O(size of the schedule). */
kiln_status sched_check(const Schedule *s, char *err, size_t errlen);

#endif
