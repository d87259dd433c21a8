/*
 * codegen.h -- C code generation: a Schedule becomes one C source, which
 * the runtime (runtime/) compiles and runs.
 *
 *   codegen.c   the driver: kernels, their stages and functions, cg_generate
 *   emit.c      a member's expression as C temporaries, loads and stores
 *   loops.c     a kernel's loop nest: merged dims, parallel loops, pragmas
 *   outer.c     strategy: outer reduction (a contiguous parallel dim moved
 *               below the reduced loops)
 *   tiles.c     strategy: tiles for transposes
 *   pairs.c     strategy: row pairs (two rows per row-loop iteration)
 *   stream.c    strategy: streamed (non-temporal) stores through tiles
 *   prefetch.c  strategy: row prefetch, and row reductions in lanes
 *   epilogue.c  strategy: an extern's fused epilogue as a callback
 *   calls.c     extern calls and the entry point kiln_entry
 *   prelude.c   the prelude: vecmath.h, base/kiln_rt.h and helpers pasted
 *               in front of the kernels
 *   vecmath.h   float math that vectorizes (pasted into every source)
 *
 * The generated code links against nothing but libm and libgomp: the
 * extern kernels (OpenBLAS matmul, conv2d) reach it as function pointers in
 * a KilnRT, and every buffer as a pointer in bufs[], indexed by buffer id.
 * The first part of this header is what the rest of kiln uses; the second
 * ("inside codegen/") is shared by codegen's files only.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "sched/sched.h"

/* ===== the interface between generated code and the runtime ============= */

/* Flags the runtime appends to the JIT's standard ones. Without
 * -fno-math-errno sqrtf keeps a scalar errno path and its loop stays scalar;
 * without -fno-trapping-math floorf/ceilf are not vectorized. Neither
 * changes a value: kiln never reads errno or floating-point flags. */
#define CG_EXTRA_FLAGS "-fno-math-errno -fno-trapping-math"

/* Flags the JIT adds where the compiler is GCC (the params are its own;
 * jit.c): loop unswitching on conditions the loop does not change, allowed
 * on larger loops and more levels than GCC's defaults (50 insns, 3
 * levels). A concat or a pad read in a loop guards its loads with tests of
 * outer loop variables (`c ? x[i] : 0.0f`). GCC 12 does not vectorize a
 * masked load whose mask is such a scalar (it finds "no vectype" for it)
 * unless the loop is unswitched first, and with its defaults it unswitches
 * only small loops. Unswitched, each copy of the loop has constant guards
 * and vectorizes: nudenet's detection head (a concat under a sigmoid) took
 * 0.47 ms and takes 0.05 (docs/decisions.md: Loop unswitching for guarded
 * loads). */
#define CG_GCC_FLAGS "--param max-unswitch-insns=2000 --param max-unswitch-level=10"

/* The marker comment on the `for` line of every innermost loop, so a test can
 * match the compiler's vectorization report to the loops it must cover. */
#define CG_INNER_MARK "/* inner loop */"
/* ... and on a part of a split inner loop too short for a vector (fewer
 * than CG_SHORT_PART iterations: a row's padded edge), which GCC leaves
 * scalar */
#define CG_SHORT_MARK "/* inner loop, a short part */"
#define CG_SHORT_PART 16
/* The line after the prototypes of the kernels' functions: what precedes
 * it every translation unit of a split compile repeats (jit.c). */
#define CG_PROTOS_END "/* ===== end of prototypes ===== */"
/* Opens the comment above each of the kernels' functions (an epilogue's
 * two together): where a split compile may cut (jit.c). */
#define CG_FN_COMMENT "\n/*\n * "
/* The comment above kiln_entry. */
#define CG_ENTRY_COMMENT "/* The program: every kernel and extern kernel in call order. */"

/* The generated entry point: bufs[i] holds buffer i of the loop program
 * (NULL for buffers that never exist in memory), rt the extern kernels
 * (KilnRT, base/kiln_rt.h: the one definition both sides compile).
 * Returns 0; KILN_RT_ERR_INPUT when an extern kernel found bad input
 * (rt->err says why); another nonzero value when an extern kernel or a
 * scratch allocation failed. */
typedef int (*KilnEntry)(float *const *bufs, const KilnRT *rt);

/* ===== codegen.c ========================================================== */

typedef struct {
    const char *prefix; /* prepended to kiln_entry and every kernel name (NULL: none) */
    bool no_prelude;    /* leave out the prelude: several programs share one (cg_prelude) */
    bool double_acc;    /* sums and products accumulate in double (slower, closer to the
                           * interpreter); default float */
} CgOptions;

/* One call of kiln_entry: a generated kernel or an extern kernel, with the
 * buffers it touches (what the memory planner needs). */
typedef struct {
    const char *name; /* the kernel's function name, or extern_kernels.mm ... */
    int kernel;       /* its index in Schedule.kernels */
    int nbufs;
    int *bufs;       /* buffer ids it reads or writes, ascending */
    bool *writes;    /* per entry of bufs: written */
    bool parallel;   /* runs an OpenMP parallel loop */
    int inner_loops; /* innermost loops (each marked CG_INNER_MARK) */
} CgCall;

typedef struct {
    Pool pool;          /* owns everything below */
    const char *source; /* the C source, NUL-terminated */
    size_t len;
    const char *entry; /* the entry point's symbol: <prefix>kiln_entry */
    int ncalls;
    CgCall *calls; /* in call order = Schedule.kernels order */
} CgOutput;

/* Generate the C source of a schedule. out is filled (free with cg_free)
 * on success; on failure err says why (an internal limit or out of memory). */
kiln_status cg_generate(const Schedule *s, CgOutput *out, char *err, size_t errlen);
kiln_status cg_generate_opts(const Schedule *s, const CgOptions *opt, CgOutput *out, char *err,
                             size_t errlen);
void cg_free(CgOutput *out);
/* The prelude alone into *out, kmalloc'd (for sources built with
 * no_prelude). KILN_ERR_NOMEM, or KILN_ERR_ENV when vecmath.h is not
 * embedded and cannot be read. */
kiln_status cg_prelude(char **out, char *err, size_t errlen);

/* ===== inside codegen/: the generator's state, shared by its files ========= */

#include <setjmp.h>

/* A kernel runs in parallel only when its loops cover at least this many
 * elements, weighted by the ops each computes (loops.c, work_factor): an
 * OpenMP fork/join costs a few microseconds, about what one core needs to
 * stream 32K floats (128 KB) from cache. */
#define CG_PARALLEL_MIN 32768

/* Outer reduction (outer.c): the block of the innermost parallel dim that
 * one pass over the reduced dims accumulates: 128 floats are 8 cache lines
 * per reduced row, enough for the prefetcher, and the accumulators of a
 * few reductions stay in L1. */
#define CG_OUTER_BLOCK 128

/* Transposing pointwise kernels walk tiles of this many elements square:
 * 32 rows of 32 floats are 64 cache lines, well inside L1. */
#define CG_TILE 32

/* Outer parallel loops are collapsed (OpenMP collapse) until they give at
 * least this many iterations to share, so a [4, 100000] nest still spreads. */
#define CG_PARALLEL_ITERS 256

/* Per-thread row scratch up to this size lives on the thread's stack (an
 * OpenMP worker's stack is at least 2 MB); larger rows are malloc'd once per
 * thread and kernel call. */
#define CG_STACK_SCRATCH 16384

/* pow(x, n) with an integer constant |n| <= this is unrolled multiplication
 * (in double, so the result is rounded once, like the interpreter's). */
#define CG_POWI_MAX 64

/* A row reduction kernel runs two rows per iteration of its row loop when
 * rows have at least this many elements (pairs.c). */
#define CG_PAIR_MIN 1024

/* Streamed stores (stream.c): a kernel writes a buffer of at least this
 * many bytes through a per-thread tile and kiln_stream (non-temporal
 * stores). 16 MiB is past any core's L2 and the L3 share of a core on
 * common servers, so the lines would be evicted before a later kernel read
 * them. Rows up to CG_STREAM_ROW floats are streamed whole; longer
 * innermost loops (a flat pointwise loop) run in blocks of CG_STREAM_TILE. */
#define CG_STREAM_MIN ((int64_t)16 << 20)

#define CG_STREAM_ROW 16384

#define CG_STREAM_TILE 2048

#define CG_STREAM_TILE_MATH 128

/* A streaming kernel with expensive math asks, at the start of each tile,
 * for its large inputs this many elements ahead (plan_stream). */
#define CG_STREAM_PF_AHEAD 1024

/* Row prefetch: the second pass runs in blocks of this many elements, each
 * asking for its part of the next row. */
#define CG_ROW_PF_BLOCK 256
/* ... and only where the rows the first pass reads, all of them, are at
 * least this many bytes: smaller ones are in the L2 already, and asking
 * for them cost more than it saved (docs/decisions.md: Row prefetch). */
#define CG_ROW_PF_MIN ((int64_t)2 << 20)

/* ... and, when its length is a multiple of this, reduces into this many
 * lanes (spread_stage). */
#define CG_LANES 16

#define MAXL (2 * KILN_MAX_RANK) /* loops of a nest: parallel then reduced */

/* A value held by a C expression, valid at a loop depth while that depth's
 * epoch is unchanged (an inner loop's values die with it). */
typedef struct {
    const char *key; /* CSE: the right-hand side; registers: "buf:index" */
    const char *c;   /* the C expression holding it */
    int level;
    unsigned epoch;
} Ent;

typedef struct {
    Ent *e;
    int n, cap;
} Table;

/* The whole source. */
typedef struct {
    Pool *pool;
    jmp_buf jb;
    char *err;
    size_t errlen;
    const Schedule *s;
    const LoopProgram *p;
    kiln_status status; /* of a failure other than the pool's (cg_fail: INPUT) */
    char *owned_vm;     /* the pasted headers' text (pasted_headers) */
    const char *prefix;
    bool no_prelude;
    bool double_acc;
    const char **bufname; /* the C name of each buffer */
    Str out;
    Str protos; /* a prototype of every function of the kernels (cg_prepend_prelude) */
    CgCall *calls;
    struct Epi *epi; /* per kernel: an extern's epilogue (gen_epilogue) */
} Gen;

/* The epilogue of extern kernel k: its function, the buffer the library
 * writes, and the buffers the epilogue touches besides that one. */
typedef struct Epi {
    const char *fn; /* <prefix>epi_<k>; NULL: the call has no epilogue */
    int target;     /* the extern's buffer, or the last member's (in place) */
    uint8_t *use;   /* per buffer: USE_READ | USE_WRITE, target excluded */
} Epi;

enum { USE_READ = 1, USE_WRITE = 2 };

/* One row scratch array. */
typedef struct {
    const char *name;
    int64_t n;
    bool f64; /* doubles, not floats */
} Scratch;

/* A loop: `for (int64_t name = lo; name < hi; name += step)`. */
typedef struct {
    const char *name;
    int64_t extent;      /* the range of the dims it runs: [0, extent) */
    const char *lo, *hi; /* NULL: 0 and extent */
    int64_t step;        /* 1, or the block size of a block loop */
} Loop;

/* Row pairs (want_pairs, cg_make_pairs, cg_pair_row): a row reduction over long
 * rows runs its innermost row loop two rows at a time. */
typedef struct {
    int n;                /* rows per row-loop iteration: 1, or 2 */
    const char *row_name; /* the row loop's own variable */
    const char *sfx;      /* "" for the first row, "_1" for the second */
} CgPairs;

/* Outer reduction (want_outer, cg_make_outer): the contiguous parallel loop
 * moved below the reduced loops. */
typedef struct {
    int xin;      /* the moved loop; -1: none */
    int *members; /* members whose results the row nest stores */
    int n;
} CgOuter;

/* Streamed stores (plan_stream, cg_stream_store): large outputs through a
 * per-thread tile and non-temporal stores. */
typedef struct {
    bool on;       /* pointwise: large stores go through tiles */
    bool used;     /* some store went through a tile: fence at the end */
    int64_t tile;  /* pointwise: elements per tile of a split innermost loop */
    Str post;      /* a row stage's streamed stores: tiles copied out after it */
    Str vpost;     /* the same per vector of the loop (kiln_stream16) */
    int vloop;     /* the loop vpost streams from (-1: none) */
    bool vdone;    /* that loop ran in vectors: vpost, not post */
    bool prefetch; /* pointwise, tiles of math: prefetch large inputs ahead */
} CgStream;

/* Row prefetch (note_row_load, cg_row_prefetch): the next row's loads asked
 * for while later stages work on this one. */
typedef struct {
    bool record;       /* collecting the first stage's row loads */
    const char **addr; /* their addresses (C text, in the row and r loop vars) */
    int n, cap;
} CgPrefetch;

/* Row reductions in lanes (spread_stage). */
typedef struct {
    const char *index; /* the lane's index (C text) in a spread stage, or NULL */
} CgLanes;

/* An extern's epilogue (gen_epilogue). */
typedef struct {
    bool on; /* the kernel is an epilogue: loops over a flat range */
} CgEpilogue;

/* One kernel. The loops form the row nest (pnest: the parallel dims, shared
 * by every stage) and, below it, the current stage's nest (snest: the
 * reduced dims of an inner stage; nothing for a row step). Levels: 0 is
 * the function body, the body of the j-th loop of the row nest is level
 * j + 1 (npl, the row level, is the innermost), the body of the j-th loop of
 * the stage nest is level npl + 1 + j. The strategies that change this
 * shape (outer.c, pairs.c, tiles.c, stream.c, prefetch.c, epilogue.c) keep
 * their state in their own member (rp, outer, st, pf, lane, epi). */
typedef struct {
    Gen *g;
    const Kernel *k;
    int ndims, npd; /* dims: P then R; npd P dims */
    int64_t size[MAXL];
    int loop_of[MAXL]; /* dim -> loop running it */
    int64_t div[MAXL]; /* dim value = (loop var / div) % size */
    Loop loop[MAXL + 1];
    int nloops;
    int pnest[MAXL + 1], npl; /* the row nest */
    int rl[MAXL], nrl;        /* the reduced dims' loops */
    int snest[MAXL + 1], nsn; /* the current stage's nest */
    int level_of[MAXL + 1];   /* loop -> level while it is open, else -1 */
    int innermost;            /* the loop of the innermost open level, or -1 */
    int collapse;             /* parallel loops collapsed by OpenMP; 0: serial */
    bool full_par;            /* np == 0: the reduced loop runs in parallel */
    Str block[MAXL + 1];      /* code at each level, relative indentation */
    unsigned epoch[MAXL + 1];
    int inner;             /* innermost level of the current stage */
    bool strided;          /* the current innermost loop has a non-unit access */
    bool far;              /* ... one that is not `near` (IxText) */
    bool guarded;          /* the current nest has a guarded load (see emit_branch) */
    bool row_guarded;      /* a stage without loops of its own had one: it sits in the
                                  * row nest's innermost loop (see nest_text) */
    int stage_loops;       /* stages that ran loops of their own */
    Table cse, regs, rows; /* temporaries, member values, row scratch */
    int ntmp;
    uint8_t *use; /* per buffer: USE_READ | USE_WRITE */
    Str clauses;  /* reduction clauses of the current stage */
    Str post;     /* code after the current stage's loop */
    Scratch *scratch;
    int nscratch, capscratch;
    int inner_loops;
    bool has_red;      /* the current stage has a reduction */
    const char *guard; /* inside a select's branch: when its loads are valid, or NULL */
    int guard_level;   /* deepest loop the guard uses */
    /* The strategies, each owning its state (see their types above). */
    CgPairs rp;     /* row pairs */
    CgOuter outer;  /* outer reduction */
    CgStream st;    /* streamed stores */
    CgPrefetch pf;  /* row prefetch, and prefetch ahead of tiles */
    CgLanes lane;   /* row reductions in lanes */
    CgEpilogue epi; /* an extern's epilogue */
    bool f64;       /* computes or stores f64: plain loops only (kernel_f64, loops.c) */
} KGen;

typedef struct {
    const char *c; /* a temporary, a scalar or a literal */
    int level;
} Val;

typedef struct {
    const char *c; /* C text of the index */
    int level;     /* deepest loop it uses */
    bool unit;     /* the innermost loop steps it by 0 or 1 */
    bool near;     /* ... or by 2 to 4 (vector loads and permutes) */
} IxText;

static inline const Buffer *buf_of(const Gen *g, int b) { return g->p->bufs[b]; }

static inline const SNode *snode(const Gen *g, int nd) { return &g->s->nodes[nd]; }

static inline const Buffer *member_buf(const KGen *K, int i) {
    return buf_of(K->g, snode(K->g, K->k->members[i])->buf);
}

/* What cg_walk_load gathers (outer.c, tiles.c). */
/* How the loads of the inner stage walk the innermost reduced loop (lr) and
 * the innermost parallel loop (lp). */
typedef struct {
    KGen *K;
    int nvars, lr, lp;
    bool r_strided, r_unit, p_unit;
} Walk;

/* ---- codegen.c ---- */
void cg_begin_stage(KGen *K, StageKind kind);
void cg_fail(Gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
void cg_end_stage(KGen *K);
void cg_gen_stages(KGen *K);
CgCall cg_make_call(Gen *g, int kidx, const uint8_t *use, bool parallel, int inner);
void cg_open_stage(KGen *K, const int *ids, int n);
void cg_scratch_decls(KGen *K, Str *o, int ind, bool in_region);

/* ---- prelude.c ---- */
void cg_prepend_prelude(Gen *g);

/* ---- emit.c ---- */
void cg_add_scratch(KGen *K, const char *name, int64_t n);
void cg_add_scratch_typed(KGen *K, const char *name, int64_t n, bool f64);
const char *cg_c_ident(Pool *p, const char *prefix, const char *name);
Val cg_emit_branch(KGen *K, const Expr *e, int nvars, const char *cond, int level);
Val cg_emit_expr(KGen *K, const Expr *e, int nvars);
void cg_gen_member(KGen *K, int i);
void cg_line(KGen *K, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool cg_loop_coefs(const KGen *K, const int64_t *coef, int nvars, int64_t *lc);
int cg_member_vars(const SNode *n);
void cg_note_access(KGen *K, int buf, IxText ix, uint8_t how);
IxText cg_print_index(const KGen *K, const Index *ix, int nvars);
void cg_put_indented(Str *o, const char *text, int ind);
const char *cg_reg_key(Pool *p, int buf, const char *ix);
const char *cg_rop_identity(ReduceOp op);
const Index *cg_store_index(KGen *K, int nvars, const int64_t *sizes);
void cg_table_add(Pool *p, Table *t, const char *key, const char *c, int level, unsigned epoch);

/* ---- loops.c ---- */
bool cg_has_scratch_region(const KGen *K);
bool cg_is_parallel(const KGen *K);
/* Kernel K's index in its Schedule (its call number in kiln_entry). */
int cg_kernel_index(const KGen *K);
void cg_nest_text(KGen *K, Str *o, bool row_nest, const int *ids, int j, int n, int level0, int ind,
                  const char *row_guard);
int cg_new_loop(KGen *K, const char *name, int64_t extent);
void cg_open_nest(KGen *K, const int *ids, int n);
void cg_setup_kernel(KGen *K);
int cg_split_loop(KGen *K, int L, int64_t block);

/* ---- outer.c ---- */
void cg_gen_outer_reduction_member(KGen *K, int i);
void cg_gen_outer_stages(KGen *K);
void cg_make_outer(KGen *K);
void cg_walk_load(const Expr *e, void *ud);
bool cg_want_outer(KGen *K);

/* ---- tiles.c ---- */
void cg_make_tiles(KGen *K);
bool cg_want_tiles(KGen *K);

/* ---- pairs.c ---- */
void cg_make_pairs(KGen *K);
void cg_pair_row(KGen *K, int p);
bool cg_want_pairs(KGen *K);

/* ---- stream.c ---- */
void cg_note_stream_load(KGen *K, int buf, IxText ix);
void cg_plan_stream(KGen *K);
bool cg_stream_store(KGen *K, const Buffer *b, IxText ix, Val v);
const char *cg_subst_ident(Pool *p, const char *text, const char *name, const char *repl);

/* ---- prefetch.c ---- */
void cg_note_row_load(KGen *K, int buf, IxText ix);
void cg_pf_add(KGen *K, const char *at);
void cg_row_prefetch(KGen *K, int r, int blk);
int cg_spread_stage(KGen *K, int st);

/* ---- epilogue.c ---- */
void cg_epilogue_bounds(KGen *K);
void cg_epilogue_merges(int ndims, bool *ok);
void cg_gen_epilogue(Gen *g, int kidx);

/* ---- calls.c ---- */
void cg_entry_text(Gen *g, const bool *returns_int);

#endif
