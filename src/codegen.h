/*
 * codegen.h -- the last stages of the pipeline: C code generation
 * (codegen.c) and the compiled program (runtime.c).
 *
 *   codegen.c  Schedule -> one C source: the prelude (headers, vecmath.h,
 *              the runtime interface, helpers), one static function per
 *              generated kernel, and the entry point kiln_entry that calls
 *              the kernels and the extern kernels in order
 *   runtime.c  Graph -> plan -> source -> JIT -> a program that runs:
 *              memory planning (intermediates share one arena by liveness),
 *              threads, the public kiln_compile / kiln_program_* API
 *
 * The generated code links against nothing but libm and libgomp: the
 * extern kernels (OpenBLAS matmul, conv2d) reach it as function pointers in
 * a KilnRT, and every buffer as a pointer in bufs[], indexed by buffer id.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "externs.h"
#include "jit.h"
#include "loop.h"

/* ===== the interface between generated code and the runtime ============= */

/* Flags the runtime appends to the JIT's standard ones. Without
 * -fno-math-errno sqrtf keeps a scalar errno path and its loop stays scalar;
 * without -fno-trapping-math floorf/ceilf are not vectorized. Neither
 * changes a value: kiln never reads errno or floating-point flags. */
#define CG_EXTRA_FLAGS "-fno-math-errno -fno-trapping-math"

/* The marker comment on the `for` line of every innermost loop, so a test can
 * match the compiler's vectorization report to the loops it must cover. */
#define CG_INNER_MARK "/* inner loop */"

/* Extern kernels as the generated code calls them. codegen.c prints the same
 * struct into every source (with ExtView spelled KilnView, ExtEpilogue
 * KilnEpilogue); keep the two in step. An extern call with fused pointwise
 * consumers passes its epilogue, `epi_<k>_cb` with kiln_entry's bufs as
 * ctx, and the library calls it on each output block it completes; without
 * one it passes NULL, NULL. */
typedef struct {
    int (*mm)(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
              int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx);
    int (*conv2d)(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                  const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                  ExtEpilogue epi, void *ctx);
    int (*gather)(const float *data, const ExtView *dv, const float *idx, const ExtView *iv,
                  int axis, float *out, ExtEpilogue epi, void *ctx, char *err, size_t errlen);
    int (*conv_transpose2d)(const float *x, const int64_t xs[4], const float *w,
                            const int64_t ws[4], const float *bias, float *y,
                            const int64_t ys[4], const int64_t attr[9], ExtEpilogue epi,
                            void *ctx);
    char *err;            /* a run's message buffer: an extern that finds bad input */
    size_t errlen;        /* (EXT_ERR_INPUT) says why there */
    /* conv2d whose weight operand is a compile-time constant (a weight
     * buffer, dense): the library may keep its reordered copy across calls
     * (ext_conv2d_const_epi). Last, so a test's table may leave it NULL:
     * rt_run then uses conv2d. */
    int (*conv2d_const)(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                        const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                        ExtEpilogue epi, void *ctx);
} KilnRT;

/* The generated entry point: bufs[i] holds buffer i of the loop program
 * (NULL for buffers that never exist in memory). Returns 0; CG_ERR_INPUT
 * when an extern kernel found bad input (rt->err says why); another nonzero
 * value when an extern kernel or a scratch allocation failed. */
#define CG_ERR_INPUT 2
typedef int (*KilnEntry)(float *const *bufs, const KilnRT *rt);

/* ===== codegen.c ========================================================== */

typedef struct {
    const char *prefix;   /* prepended to kiln_entry and every kernel name (NULL: none) */
    bool no_prelude;      /* leave out the prelude: several programs share one (cg_prelude) */
    bool double_acc;      /* sums and products accumulate in double (slower, closer to the
                           * interpreter); default float */
} CgOptions;

/* One call of kiln_entry: a generated kernel or an extern kernel, with the
 * buffers it touches (what the memory planner needs). */
typedef struct {
    const char *name;     /* the kernel's function name, or extern_kernels.mm ... */
    int kernel;           /* its index in Schedule.kernels */
    int nbufs;
    int *bufs;            /* buffer ids it reads or writes, ascending */
    bool *writes;         /* per entry of bufs: written */
    bool parallel;        /* runs an OpenMP parallel loop */
    int inner_loops;      /* innermost loops (each marked CG_INNER_MARK) */
} CgCall;

typedef struct {
    Pool pool;            /* owns everything below */
    const char *source;   /* the C source, NUL-terminated */
    size_t len;
    const char *entry;    /* the entry point's symbol: <prefix>kiln_entry */
    int ncalls;
    CgCall *calls;        /* in call order = Schedule.kernels order */
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

/* ===== runtime.c =========================================================== */

typedef struct RtProgram RtProgram;

/* Where the time of a compile went and what memory a run needs. */
typedef struct {
    double plan_ms;        /* decompose + lower + schedule */
    double codegen_ms;
    double compile_ms;     /* the C compiler; 0 on a JIT cache hit */
    double load_ms;        /* JIT total: cache lookup, compiler, dlopen */
    int cache_hit;         /* 1: no compiler ran */
    int ncalls;            /* kernels + extern calls */
    int64_t arena_bytes;   /* one block holding every intermediate buffer */
    int64_t io_bytes;      /* inputs + outputs (the caller's memory) */
    int64_t peak_bytes;    /* io_bytes + arena_bytes; weights are not counted */
    int64_t intermediate_bytes;  /* the intermediates' sizes summed (no reuse) */
    const char *target;    /* the tier the kernels were compiled for: "v3" */
    char jit_flags[256];   /* the flags beyond the JIT's own: CG_EXTRA_FLAGS, the tier's */
} RtStats;

/* Decompose, lower, schedule, generate, JIT-compile and plan memory. */
kiln_status rt_compile(const Graph *g, const KilnConfig *cfg, RtProgram **out, char *err,
                       size_t errlen);
/* Compile n graphs with one compiler run (tests: many small programs).
 * out[i] receives program i; they share the loaded object *lib, which the
 * caller closes (jit_close) after freeing the programs. */
kiln_status rt_compile_many(const Graph *const *gs, int n, const KilnConfig *cfg,
                            RtProgram **out, JitLib **lib, char *err, size_t errlen);
/* Run: inputs[i] is input i as numel floats (bools 0/1), outputs[i] a dense
 * float array of output i's numel; none may alias another. Not reentrant
 * for one program (its arena is shared by runs). */
kiln_status rt_run(RtProgram *p, const float *const *inputs, float **outputs, char *err,
                   size_t errlen);
void rt_free(RtProgram *p);
const char *rt_source(const RtProgram *p);
/* The generated code and its calls (tests, reports). */
const CgOutput *rt_code(const RtProgram *p);
const RtStats *rt_stats(const RtProgram *p);
const Schedule *rt_schedule(const RtProgram *p);
/* The decomposed graph the program runs (inputs, outputs, their types). */
const Graph *rt_graph(const RtProgram *p);
/* Threads for kernels and BLAS: n <= 0 means $KILN_NUM_THREADS, else every
 * core. Process-wide (one OpenMP pool). Returns the count now in effect. */
int rt_set_threads(int n);
/* Arena offset of buffer b, or -1 when it does not live in the arena. */
int64_t rt_buffer_offset(const RtProgram *p, int b);
/* Tests: the extern kernels every run calls (process-wide; NULL: the
 * library's, ext_matmul_epi and ext_conv2d_epi), e.g. to hand epilogues
 * ranges the library never would. */
void rt_set_externs(const KilnRT *rt);

/* Tolerance of fused against interpreted results (kiln run --check, tests,
 * the fuzzer); see rt_tolerance in runtime.c for how each class is set. */
typedef struct {
    double atol, rtol;
    int64_t reduce_n;      /* the largest reduction or extern dot-product length (1: none) */
} RtTolerance;
RtTolerance rt_tolerance(const Graph *dec);
/* |got - want| in units of atol + rtol |want| (> 1 fails). NaN matches NaN
 * and an infinity the same infinity; anything else non-finite fails. */
double rt_excess(float got, float want, RtTolerance t);
/* How far the reference itself moves: the interpreter run `runs` more
 * times with its intermediate values nudged (kiln_interpret_perturbed,
 * seeds 1..runs), and per output element the largest change against want
 * (a bool flip counts 1; a non-finite value where want is finite, or the
 * reverse, INFINITY). spread[i] receives a new f32 tensor of output i's
 * shape (free with kiln_tensor_free). Large where an element is
 * ill-conditioned; see runtime.c. */
kiln_status rt_reference_spread(kiln_graph *g, const kiln_tensor *in, const kiln_tensor *want,
                                int runs, kiln_tensor *spread);
/* Runs of rt_reference_spread the checks use, and how many spreads of
 * allowance an element gets on top of the tolerance. */
#define RT_SPREAD_RUNS 32
#define RT_SPREAD_K 4.0
/* rt_excess with RT_SPREAD_K times the element's spread added to the
 * allowance; an infinite spread (the reference itself is undetermined
 * there) accepts any value. */
double rt_excess_spread(float got, float want, float spread, RtTolerance t);
/* One output element of either dtype (a bool as 0/1) against the
 * reference: a bool must match unless the reference itself flipped there
 * (spread > 0); a float goes through rt_excess_spread (spread 0: exactly
 * rt_excess). The excess, > 1 fails. */
double rt_check_excess(kiln_dtype dt, float got, float want, float spread, RtTolerance t);

/* The lowering and scheduling configuration for public options (fuse 0:
 * nothing inlined, no fusion rounds: one kernel per op). */
KilnConfig rt_config(const kiln_options *o);

/* The runtime object behind a public kiln_program (CLI: stats, schedule). */
RtProgram *kiln_program_rt(kiln_program *p);

#endif
