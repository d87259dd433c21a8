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

#include "sched/sched.h"

/* ===== the interface between generated code and the runtime ============= */

/* Flags the runtime appends to the JIT's standard ones. Without
 * -fno-math-errno sqrtf keeps a scalar errno path and its loop stays scalar;
 * without -fno-trapping-math floorf/ceilf are not vectorized. Neither
 * changes a value: kiln never reads errno or floating-point flags. */
#define CG_EXTRA_FLAGS "-fno-math-errno -fno-trapping-math"

/* The marker comment on the `for` line of every innermost loop, so a test can
 * match the compiler's vectorization report to the loops it must cover. */
#define CG_INNER_MARK "/* inner loop */"

/* The generated entry point: bufs[i] holds buffer i of the loop program
 * (NULL for buffers that never exist in memory), rt the extern kernels
 * (KilnRT, base/kiln_rt.h: the one definition both sides compile).
 * Returns 0; KILN_RT_ERR_INPUT when an extern kernel found bad input
 * (rt->err says why); another nonzero value when an extern kernel or a
 * scratch allocation failed. */
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

#endif
