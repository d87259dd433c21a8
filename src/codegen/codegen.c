/*
 * codegen.c -- a schedule becomes one C source.   requires: a Schedule;
 * gives: C text that the JIT compiles, and each call's buffers for the
 * memory planner.
 *
 * The source is self-contained: a prelude (libc headers, the text of
 * vecmath.h, the KilnRT interface, small helpers), one static function per
 * generated kernel, and `int kiln_entry(float *const *bufs, const KilnRT *rt)`
 * calling the kernels and the extern kernels in the schedule's order.
 *
 * A kernel is a loop nest. A pointwise kernel loops over its iteration
 * sizes; a reduction kernel has one outer loop nest over the parallel dims
 * (the row) holding its stages in order: an inner loop nest over the
 * reduced dims, or a per-row scalar step. Every member's expression is
 * emitted as a sequence of `float tmpN = ...;` temporaries, each placed at the
 * depth of the deepest loop variable it uses, so anything that depends only on
 * the row (a loaded row statistic, rsqrt(var + eps)) is computed once per row
 * outside the inner loop, and equal subexpressions are computed once (CSE on
 * the right-hand side text). A member's value is kept for its readers in the
 * same kernel: in a temporary (same loop body), in a per-row scalar (a
 * reduction's result, a row step's value) or in a per-thread row scratch
 * array (an inner-loop value read by a later stage); only STORE_GLOBAL
 * members are written to memory.
 *
 * Vectorization: the innermost loop of each nest carries `#pragma omp simd`
 * (with reduction clauses for sums, products, max and min; max/min keep a
 * NaN flag so that NaN propagates like torch.amax), loads are plain array
 * reads with affine indices, and transcendentals use vecmath.h's branch-free
 * functions instead of libm, behind `declare simd` wrappers so each body is
 * compiled once. Adjacent dims are merged into one loop when every index in
 * the kernel walks them as one (a contiguous [64, 1024] is one loop of
 * 65536). Two loop orders keep the innermost loop contiguous where the
 * natural one would stride: a reduction over a strided dim (sum(x, dim=0))
 * moves the contiguous parallel loop inside the reduced loops, over blocks
 * with an accumulator per element ("outer reduction"); a pointwise kernel
 * with a transposed read walks its last two loops in tiles. A row reduction
 * that reads long rows once runs two rows per row-loop iteration in one
 * inner loop ("row pairs", see KGen). A buffer of 16 MiB or more is written
 * through a per-thread tile and non-temporal stores ("streamed stores", see
 * KGen). A division by a value the inner loop does not change (softmax's
 * row sum) is a multiply by its reciprocal, computed once outside the loop
 * (div_by_invariant). The outermost
 * loops run under `#pragma omp parallel for` when the kernel is big enough
 * (CG_PARALLEL_MIN). Every innermost loop's `for` line carries
 * CG_INNER_MARK so a test can match it with GCC's vectorization report.
 *
 * Extern epilogues: an extern kernel with fused pointwise members (the
 * scheduler's extern epilogue) becomes a library call plus a static
 * function `epi_<k>(out, start, count, buffers...)` that applies the members
 * to the flat output elements [start, start + count), and a callback
 * `epi_<k>_cb(ctx, c, start, count)` that the library (src/externs/) calls on
 * each output block right after computing it. The members are generated as
 * a pointwise kernel of their own, reading the library's output as `out`,
 * over at most two loops: the innermost group of dims that merge (the
 * vectorized loop) and one loop over all the others, each clipped to the
 * range; broadcast operands (a bias per column, BN parameters per channel)
 * index with division and modulo of the outer loop, once per row. The
 * library writes the extern's buffer when something else reads it, else the
 * last member's buffer, which the epilogue overwrites in place.
 *
 * Errors: internal limits and pool exhaustion longjmp to cg_generate, which
 * returns a status and a message; nothing is printed.
 */
#include "codegen/codegen.h"
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ===== tuning =============================================================== */

/* A kernel runs in parallel only when its loops cover at least this many
 * elements: an OpenMP fork/join costs a few microseconds, about what one core
 * needs to stream 32K floats (128 KB) from cache. */
#define CG_PARALLEL_MIN 32768
/* Outer reduction (see KGen): the block of the innermost parallel dim that
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
 * rows have at least this many elements (see KGen: row pairs). */
#define CG_PAIR_MIN 1024
/* Streamed stores (see KGen): a kernel writes a buffer of at least this
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
/* ... and, when its length is a multiple of this, reduces into this many
 * lanes (spread_stage). */
#define CG_LANES 16

#define MAXL (2 * KILN_MAX_RANK)   /* loops of a nest: parallel then reduced */

/* ===== vecmath.h's text ===================================================== */

/* The Makefile turns the two headers the prelude pastes, src/codegen/vecmath.h
 * and src/base/kiln_rt.h, into C string literals (vecmath_src.inc and
 * kiln_rt_src.inc, in the build's include path) so an installed kiln needs
 * no source tree. Without them, the headers are read at run time from the
 * source tree ($KILN_VECMATH_H and $KILN_RT_H override the paths). */
#if defined(__has_include)
#if __has_include("vecmath_src.inc") && __has_include("kiln_rt_src.inc")
#define CG_HEADERS_EMBEDDED 1
static const char vecmath_text[] =
#include "vecmath_src.inc"
    ;
static const char kiln_rt_text[] =
#include "kiln_rt_src.inc"
    ;
#endif
#endif

/* A header the prelude pastes: its path from this file's folder, the
 * variable that overrides it, and the embedded text. */
typedef struct {
    const char *rel, *env;
    const char *text;
} PreludeHeader;

#ifdef CG_HEADERS_EMBEDDED
static const PreludeHeader hdr_vecmath = {"vecmath.h", "KILN_VECMATH_H", vecmath_text};
static const PreludeHeader hdr_kiln_rt = {"../base/kiln_rt.h", "KILN_RT_H", kiln_rt_text};
#else
static const PreludeHeader hdr_vecmath = {"vecmath.h", "KILN_VECMATH_H", NULL};
static const PreludeHeader hdr_kiln_rt = {"../base/kiln_rt.h", "KILN_RT_H", NULL};

/* h's file in the source tree, as the compiler saw it, into *text
 * (kmalloc'd). */
static kiln_status read_header(const PreludeHeader *h, char **text, char *err, size_t errlen) {
    char path[1024];
    const char *env = getenv(h->env);
    const char *file = __FILE__, *slash = strrchr(file, '/');
    if (env) util_fmt(path, sizeof path, "%s", env);
    else util_fmt(path, sizeof path, "%.*s%s", slash ? (int)(slash - file + 1) : 0, file, h->rel);
    FILE *f = fopen(path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        if (f) fclose(f);
        util_fmt(err, errlen, "codegen: cannot read %s (build with the Makefile's *_src.inc)",
                 path);
        return KILN_ERR_ENV;
    }
    *text = kmalloc((size_t)n + 1);
    size_t got = *text ? fread(*text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!*text) {
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    (*text)[got] = 0;
    return KILN_OK;
}
#endif

/* A header's text: the embedded copy, or read from the source tree into
 * *owned (the caller kfrees it). */
static kiln_status header_source(const PreludeHeader *h, const char **text, char **owned,
                                 char *err, size_t errlen) {
    *owned = NULL;
#ifdef CG_HEADERS_EMBEDDED
    (void)err, (void)errlen;
    *text = h->text;
    return KILN_OK;
#else
    kiln_status st = read_header(h, owned, err, errlen);
    *text = *owned;
    return st;
#endif
}

/* The text the prelude pastes after its head: vecmath.h, then kiln_rt.h,
 * into *out (kmalloc'd; the caller kfrees it). */
static kiln_status pasted_headers(char **out, char *err, size_t errlen) {
    const char *vm, *rt;
    char *own_vm, *own_rt = NULL;
    *out = NULL;
    kiln_status st = header_source(&hdr_vecmath, &vm, &own_vm, err, errlen);
    if (st == KILN_OK) st = header_source(&hdr_kiln_rt, &rt, &own_rt, err, errlen);
    if (st == KILN_OK) {
        static const char sep[] = "\n/* ===== kiln_rt.h: the interface with the runtime ===== */\n";
        size_t n = strlen(vm) + strlen(sep) + strlen(rt) + 1;
        if ((*out = kmalloc(n))) util_fmt(*out, n, "%s%s%s", vm, sep, rt);
        else util_fmt(err, errlen, "out of memory"), st = KILN_ERR_NOMEM;
    }
    kfree(own_vm);
    kfree(own_rt);
    return st;
}

/* ===== the prelude ============================================================ */

static const char prelude_head[] =
    "/*\n"
    " * Generated by kiln, an operator-fusing tensor compiler.\n"
    " * Compile: cc -O3 -fopenmp -shared -fPIC -std=c11 " CG_EXTRA_FLAGS " and the target's\n"
    " * flags (kiln explain names them: -march=x86-64-v3 -mtune=native, ...).\n"
    " * Entry: int kiln_entry(float *const *bufs, const KilnRT *rt); bufs[i] is buffer i.\n"
    " */\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <stdlib.h>\n"
    "\n"
    "/* ===== vecmath.h: float math that vectorizes ===== */\n";

/* `kiln_<f>_v`: vecmath's kiln_<f> behind a declare-simd wrapper. */
#define KILN_SIMD_FN(f)                                                        \
    "#pragma omp declare simd notinbranch\n"                                    \
    "__attribute__((noinline, unused)) static float kiln_" #f "_v(float x) { return kiln_" #f "(x); }\n"

/* After vecmath.h and kiln_rt.h. */
static const char prelude_tail[] =
    "\n/* ===== vector functions =====\n"
    " * The expensive functions out of line, with OpenMP SIMD clones: GCC\n"
    " * compiles each body once (a vector clone that vectorized loops call once\n"
    " * per vector, as fast as inlining it) instead of inlining a copy at every\n"
    " * use, which made a kernel of 50 sines take seconds to compile. Unused ones\n"
    " * cost nothing. */\n"
    KILN_SIMD_FN(expf) KILN_SIMD_FN(logf) KILN_SIMD_FN(sinf) KILN_SIMD_FN(cosf)
    KILN_SIMD_FN(tanhf) KILN_SIMD_FN(erff) KILN_SIMD_FN(sigmoid) KILN_SIMD_FN(gelu)
    "\n/* ===== helpers ===== */\n"
    "\n"
    "/* pow(x, n) for an integer constant n: multiplication in double, rounded\n"
    " * once (unrolled and vectorized once n is known). */\n"
    "static inline float kiln_powi(float x, int n) {\n"
    "    double r = 1.0, b = x;\n"
    "    for (int m = n < 0 ? -n : n; m; m >>= 1) {\n"
    "        if (m & 1) r *= b;\n"
    "        b *= b;\n"
    "    }\n"
    "    return (float)(n < 0 ? 1.0 / r : r);\n"
    "}\n"
    "\n"
    "/* pow(x, 0.5): sqrt, except pow(-inf, 0.5) = inf and pow(-0, 0.5) = +0. */\n"
    "static inline float kiln_pow_half(float x) {\n"
    "    return kiln_vm_sel(x == -KILN_VM_INF, KILN_VM_INF, sqrtf(x) + 0.0f);\n"
    "}\n"
    "\n"
    "/* Floor division and modulo for indices that may be negative. */\n"
    "static inline int64_t kiln_floordiv(int64_t a, int64_t b) {\n"
    "    return a / b - (a % b != 0 && (a < 0) != (b < 0));\n"
    "}\n"
    "static inline int64_t kiln_floormod(int64_t a, int64_t b) {\n"
    "    return a - kiln_floordiv(a, b) * b;\n"
    "}\n"
    "\n"
    "/* Copy a strided view into a dense array, for an extern operand the\n"
    " * library cannot take as it is. */\n"
    "static inline void kiln_pack(const float *src, const KilnView *v, float *dst) {\n"
    "    int64_t idx[KILN_RT_MAX_RANK] = {0}, n = 1;\n"
    "    for (int d = 0; d < v->rank; d++) n *= v->shape[d];\n"
    "    for (int64_t i = 0; i < n; i++) {\n"
    "        int64_t off = v->offset;\n"
    "        for (int d = 0; d < v->rank; d++) off += idx[d] * v->stride[d];\n"
    "        dst[i] = src[off];\n"
    "        for (int d = v->rank - 1; d >= 0 && ++idx[d] == v->shape[d]; d--) idx[d] = 0;\n"
    "    }\n"
    "}\n"
    "\n"
    "/* Ask for n floats from p in the cache, a prefetch per 64-byte line: a\n"
    " * row kernel asks for its next row while later passes work on this one\n"
    " * in L1 (codegen.c: row prefetch). Never faults. */\n"
    "static inline void kiln_prefetch(const float *p, int64_t n) {\n"
    "    for (int64_t k = 0; k < n; k += 16) __builtin_prefetch(p + k, 0, 3);\n"
    "}\n"
    "\n"
    "/* kiln_prefetch(p + off, n) where that lies inside p[0..size): a\n"
    " * streaming kernel asks for the input a few KiB ahead of its tile. */\n"
    "static inline void kiln_prefetch_ahead(const float *p, int64_t off, int64_t n, int64_t size) {\n"
    "    if (off + n <= size) kiln_prefetch(p + off, n);\n"
    "}\n"
    "\n"
    "/* dst[0..n) = src[0..n) with non-temporal stores: whole cache lines go to\n"
    " * memory without being read first (an ordinary store reads the line it\n"
    " * writes, a third of a copy's traffic). Kernels write outputs far larger\n"
    " * than the caches this way (codegen.c: streamed stores), from a tile the\n"
    " * loop filled in L1. Non-temporal stores are weakly ordered: each thread\n"
    " * that streamed runs kiln_stream_fence once, before the kernel ends. */\n"
    "#if defined(__GNUC__) && !defined(__clang__) && (defined(__AVX512F__) || defined(__AVX__))\n"
    "#define kiln_stream_fence() __builtin_ia32_sfence()\n"
    "#else\n"
    "#define kiln_stream_fence() ((void)0)\n"
    "#endif\n"
    "static void kiln_stream(float *restrict dst, const float *restrict src, int64_t n) {\n"
    "    int64_t i = 0;\n"
    "#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)\n"
    "    typedef float kiln_v16 __attribute__((vector_size(64), aligned(4), may_alias));\n"
    "    for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];\n"
    "    for (; i + 16 <= n; i += 16) __builtin_ia32_movntps512(dst + i, *(const kiln_v16 *)(src + i));\n"
    "#elif defined(__GNUC__) && !defined(__clang__) && defined(__AVX__)\n"
    "    typedef float kiln_v8 __attribute__((vector_size(32), aligned(4), may_alias));\n"
    "    for (; i < n && ((uintptr_t)(dst + i) & 31); i++) dst[i] = src[i];\n"
    "    for (; i + 8 <= n; i += 8) __builtin_ia32_movntps256(dst + i, *(const kiln_v8 *)(src + i));\n"
    "#endif\n"
    "    for (; i < n; i++) dst[i] = src[i];\n"
    "}\n"
    "/* 16 floats from src (a tile the loop just wrote, which GCC keeps in a\n"
    " * register) to dst: non-temporal where dst is on a vector boundary. */\n"
    "static inline void kiln_stream16(float *restrict dst, const float *restrict src) {\n"
    "#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)\n"
    "    typedef float kiln_v16 __attribute__((vector_size(64), aligned(4), may_alias));\n"
    "    if (((uintptr_t)dst & 63) == 0) __builtin_ia32_movntps512(dst, *(const kiln_v16 *)src);\n"
    "    else *(kiln_v16 *)dst = *(const kiln_v16 *)src;\n"
    "#elif defined(__GNUC__) && !defined(__clang__) && defined(__AVX__)\n"
    "    typedef float kiln_v8 __attribute__((vector_size(32), aligned(4), may_alias));\n"
    "    if (((uintptr_t)dst & 31) == 0) {\n"
    "        __builtin_ia32_movntps256(dst, *(const kiln_v8 *)src);\n"
    "        __builtin_ia32_movntps256(dst + 8, *(const kiln_v8 *)(src + 8));\n"
    "    } else {\n"
    "        *(kiln_v8 *)dst = *(const kiln_v8 *)src;\n"
    "        *(kiln_v8 *)(dst + 8) = *(const kiln_v8 *)(src + 8);\n"
    "    }\n"
    "#else\n"
    "    for (int i = 0; i < 16; i++) dst[i] = src[i];\n"
    "#endif\n"
    "}\n";

kiln_status cg_prelude(char **out, char *err, size_t errlen) {
    char *hdrs;
    *out = NULL;
    kiln_status st = pasted_headers(&hdrs, err, errlen);
    if (st != KILN_OK) return st;
    size_t n = strlen(prelude_head) + strlen(hdrs) + strlen(prelude_tail) + 1;
    if ((*out = kmalloc(n))) util_fmt(*out, n, "%s%s%s", prelude_head, hdrs, prelude_tail);
    else util_fmt(err, errlen, "out of memory"), st = KILN_ERR_NOMEM;
    kfree(hdrs);
    return st;
}

/* ===== generator state ========================================================== */

/* A value held by a C expression, valid at a loop depth while that depth's
 * epoch is unchanged (an inner loop's values die with it). */
typedef struct {
    const char *key;      /* CSE: the right-hand side; registers: "buf:index" */
    const char *c;        /* the C expression holding it */
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
    kiln_status status;       /* of a failure other than the pool's (cg_fail: INPUT) */
    char *owned_vm;           /* the pasted headers' text (pasted_headers) */
    const char *prefix;
    bool no_prelude;
    bool double_acc;
    const char **bufname;     /* the C name of each buffer */
    Str out;
    CgCall *calls;
    struct Epi *epi;          /* per kernel: an extern's epilogue (gen_epilogue) */
} Gen;

/* The epilogue of extern kernel k: its function, the buffer the library
 * writes, and the buffers the epilogue touches besides that one. */
typedef struct Epi {
    const char *fn;           /* <prefix>epi_<k>; NULL: the call has no epilogue */
    int target;               /* the extern's buffer, or the last member's (in place) */
    uint8_t *use;             /* per buffer: USE_READ | USE_WRITE, target excluded */
} Epi;

enum { USE_READ = 1, USE_WRITE = 2 };

/* One row scratch array. */
typedef struct {
    const char *name;
    int64_t n;
} Scratch;

/* A loop: `for (int64_t name = lo; name < hi; name += step)`. */
typedef struct {
    const char *name;
    int64_t extent;              /* the range of the dims it runs: [0, extent) */
    const char *lo, *hi;         /* NULL: 0 and extent */
    int64_t step;                /* 1, or the block size of a block loop */
} Loop;

/* Row pairs (want_pairs, make_pairs, pair_row): a row reduction over long
 * rows runs its innermost row loop two rows at a time. */
typedef struct {
    int n;                       /* rows per row-loop iteration: 1, or 2 */
    const char *row_name;        /* the row loop's own variable */
    const char *sfx;             /* "" for the first row, "_1" for the second */
} CgPairs;

/* Outer reduction (want_outer, make_outer): the contiguous parallel loop
 * moved below the reduced loops. */
typedef struct {
    int xin;                     /* the moved loop; -1: none */
    int *members;                /* members whose results the row nest stores */
    int n;
} CgOuter;

/* Streamed stores (plan_stream, stream_store): large outputs through a
 * per-thread tile and non-temporal stores. */
typedef struct {
    bool on;                     /* pointwise: large stores go through tiles */
    bool used;                   /* some store went through a tile: fence at the end */
    int64_t tile;                /* pointwise: elements per tile of a split innermost loop */
    Str post;                    /* a row stage's streamed stores: tiles copied out after it */
    Str vpost;                   /* the same per vector of the loop (kiln_stream16) */
    int vloop;                   /* the loop vpost streams from (-1: none) */
    bool vdone;                  /* that loop ran in vectors: vpost, not post */
    bool prefetch;               /* pointwise, tiles of math: prefetch large inputs ahead */
} CgStream;

/* Row prefetch (note_row_load, row_prefetch): the next row's loads asked
 * for while later stages work on this one. */
typedef struct {
    bool record;                 /* collecting the first stage's row loads */
    const char **addr;           /* their addresses (C text, in the row and r loop vars) */
    int n, cap;
} CgPrefetch;

/* Row reductions in lanes (spread_stage). */
typedef struct {
    const char *index;           /* the lane's index (C text) in a spread stage, or NULL */
} CgLanes;

/* An extern's epilogue (gen_epilogue). */
typedef struct {
    bool on;                     /* the kernel is an epilogue: loops over a flat range */
} CgEpilogue;

/* One kernel. The loops form the row nest (pnest: the parallel dims, shared
 * by every stage) and, below it, the current stage's nest (snest: the
 * reduced dims of an inner stage; nothing for a row step). Levels: 0 is
 * the function body, the body of the j-th loop of the row nest is level
 * j + 1 (npl, the row level, is the innermost), the body of the j-th loop of
 * the stage nest is level npl + 1 + j.
 *
 * Outer reduction (xin >= 0): when the reduced dims are strided in memory
 * and the innermost parallel dim is contiguous (sum(x, dim=0)), that dim's
 * loop (xin) moves below the reduced loops and runs over blocks of
 * CG_OUTER_BLOCK elements; the row nest ends in the loop over blocks, and
 * accumulators are arrays of a block.
 *
 * Row pairs (pair == 2): a row reduction kernel whose rows are long runs the
 * innermost row loop two rows at a time, each stage's loop doing the work of
 * both rows side by side: row x0 and row (x0 + 1), the second with its own
 * accumulators (suffix _1). Each row still sums in the same order, so the
 * results are bit-identical to one row at a time; but two independent
 * accumulator chains and two memory streams keep more loads in flight (at
 * 8192x4096, amax + sum of the same rows ran at 55-62% of copy bandwidth one
 * row at a time, limited by the latency of the max chain).
 *
 * Streamed stores: a buffer of at least CG_STREAM_MIN bytes is not stored
 * element by element; the innermost loop writes its values into a
 * per-thread tile (st_<buf>, in L1) and after the loop kiln_stream copies
 * the tile out with non-temporal stores, which do not read the lines they
 * write first. In a row kernel the tile is the row (an inner stage's loop,
 * up to CG_STREAM_ROW), and a later stage that reads the buffer again reads
 * the tile; a pointwise kernel's innermost loop is split into
 * blocks of CG_STREAM_TILE when it is longer (plan_stream). At 8192x4096,
 * one thread, huge-page buffers, best of 12: layer_norm 25.1 -> 23.1 ms
 * (the bound at copy bandwidth is 17.6-18.7 ms), relu(x + y) 27.5 -> 24.6.
 * The fence that orders the streamed stores runs once per thread, after
 * the row loop: a fence after each row's copy waited for that row to
 * reach memory, and layer_norm over 65536x64 took 15.4 ms instead of 1.9.
 * A row stage whose loop runs over a multiple of 16 and has no reduction
 * of its own streams vector by vector instead (nest_text): the loop in
 * groups of 16, each group's tile vector out with kiln_stream16 right
 * after it, which GCC does from the register (the tile store left only
 * where a later stage reads it), so the copy after the loop, 16 KB read
 * back from L1 per 4096-row, is gone. At 8192x4096, side by side with
 * the copy loop (bench/ktime.c --paired-copy, before and after alternated,
 * best of 9): softmax 30.98 / 23.00 -> 20.22 / 21.36 ms at 1 thread,
 * 17.40 / 16.31 -> 15.23 / 14.72 at 2; layer_norm 26.40 / 25.79 -> 22.18
 * / 24.27 and 13.96 / 13.91 -> 12.49 / 12.55.
 *
 * Row prefetch: a row kernel with several inner stages reads its row from
 * memory in the first and from L1 in the others; before the second, it
 * asks for the next row's data that the first will read (kiln_prefetch),
 * so memory works while the later passes compute. softmax and layer_norm
 * over 1024x1024 (in the L3), 1 thread: 0.95 -> 0.89 ms and 0.45 -> 0.34
 * ms. Asked for all at once, the row's prefetches wait for free line fill
 * buffers, and out of cache that made no difference (+-2%); so a second
 * pass longer than CG_ROW_PF_BLOCK runs in blocks, each asking for its part
 * of the next row while it computes (spread_stage): at 8192x4096, 1 / 2
 * threads, best of 16, softmax 41.8 -> 34.4 / 20.3 -> 17.9 ms, layer_norm
 * 24.5 -> 22.2 / 12.6 -> 11.4 ms (docs/benchmarks.md, finding 4). */
typedef struct {
    Gen *g;
    const Kernel *k;
    int ndims, npd;              /* dims: P then R; npd P dims */
    int64_t size[MAXL];
    int loop_of[MAXL];           /* dim -> loop running it */
    int64_t div[MAXL];           /* dim value = (loop var / div) % size */
    Loop loop[MAXL + 1];
    int nloops;
    int pnest[MAXL + 1], npl;    /* the row nest */
    int rl[MAXL], nrl;           /* the reduced dims' loops */
    int snest[MAXL + 1], nsn;    /* the current stage's nest */
    int level_of[MAXL + 1];      /* loop -> level while it is open, else -1 */
    int innermost;               /* the loop of the innermost open level, or -1 */
    int collapse;                /* parallel loops collapsed by OpenMP; 0: serial */
    bool full_par;               /* np == 0: the reduced loop runs in parallel */
    Str block[MAXL + 1];         /* code at each level, relative indentation */
    unsigned epoch[MAXL + 1];
    int inner;                   /* innermost level of the current stage */
    bool strided;                /* the current innermost loop has a non-unit access */
    bool far;                    /* ... one that is not `near` (IxText) */
    bool guarded;                /* the current nest has a guarded load (see emit_branch) */
    bool row_guarded;            /* a stage without loops of its own had one: it sits in the
                                  * row nest's innermost loop (see nest_text) */
    int stage_loops;             /* stages that ran loops of their own */
    Table cse, regs, rows;       /* temporaries, member values, row scratch */
    int ntmp;
    uint8_t *use;                /* per buffer: USE_READ | USE_WRITE */
    Str clauses;                 /* reduction clauses of the current stage */
    Str post;                    /* code after the current stage's loop */
    Scratch *scratch;
    int nscratch, capscratch;
    int inner_loops;
    bool has_red;                /* the current stage has a reduction */
    const char *guard;           /* inside a select's branch: when its loads are valid, or NULL */
    int guard_level;             /* deepest loop the guard uses */
    /* The strategies, each owning its state (see their types above). */
    CgPairs rp;                  /* row pairs */
    CgOuter outer;               /* outer reduction */
    CgStream st;                 /* streamed stores */
    CgPrefetch pf;               /* row prefetch, and prefetch ahead of tiles */
    CgLanes lane;                /* row reductions in lanes */
    CgEpilogue epi;              /* an extern's epilogue */
} KGen;

typedef struct {
    const char *c;               /* a temporary, a scalar or a literal */
    int level;
} Val;

typedef struct {
    const char *c;               /* C text of the index */
    int level;                   /* deepest loop it uses */
    bool unit;                   /* the innermost loop steps it by 0 or 1 */
    bool near;                   /* ... or by 2 to 4 (vector loads and permutes) */
} IxText;

static void cg_fail(Gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void cg_fail(Gen *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g->errlen) vsnprintf(g->err, g->errlen, fmt, ap);
    va_end(ap);
    longjmp(g->jb, 2);
}

static const Buffer *buf_of(const Gen *g, int b) { return g->p->bufs[b]; }
static const SNode *snode(const Gen *g, int nd) { return &g->s->nodes[nd]; }
static const Buffer *member_buf(const KGen *K, int i) {
    return buf_of(K->g, snode(K->g, K->k->members[i])->buf);
}

/* ===== small text helpers ========================================================= */

static Ent *table_find(Table *t, const char *key) {
    for (int i = t->n - 1; i >= 0; i--)
        if (!strcmp(t->e[i].key, key)) return &t->e[i];
    return NULL;
}

static void table_add(Pool *p, Table *t, const char *key, const char *c, int level, unsigned epoch) {
    t->e = pool_grow(p, t->e, &t->cap, t->n + 1, sizeof(Ent));
    t->e[t->n++] = (Ent){key, c, level, epoch};
}

/* Each line of text, indented by ind more spaces; blank lines stay blank. */
static void put_indented(Str *o, const char *text, int ind) {
    while (*text) {
        const char *nl = strchr(text, '\n');
        int len = nl ? (int)(nl - text) : (int)strlen(text);
        if (len) str_putf(o, "%*s%.*s\n", ind, "", len, text);
        else str_putf(o, "\n");
        text += len + (nl != NULL);
    }
}

/* A float literal that reads back as the same float. */
static const char *float_lit(Pool *p, double v) {
    float f = (float)v;
    if (isnan(f)) return "NAN";
    if (isinf(f)) return f > 0 ? "INFINITY" : "(-INFINITY)";
    char num[48];
    util_fmt(num, sizeof num, "%.9g", (double)f);
    if ((double)strtof(num, NULL) != (double)f) util_fmt(num, sizeof num, "%.17g", (double)f);
    bool plain = !strpbrk(num, ".en");
    return pool_printf(p, "%s%s%sf%s", f < 0 || signbit(f) ? "(" : "", num, plain ? ".0" : "",
                       f < 0 || signbit(f) ? ")" : "");
}

/* "(a + b)" -> "a + b" when the outer parentheses enclose everything. */
static const char *strip_parens(Pool *p, const char *s) {
    size_t n = strlen(s);
    if (n < 2 || s[0] != '(' || s[n - 1] != ')') return s;
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        depth += (s[i] == '(') - (s[i] == ')');
        if (depth == 0 && i < n - 1) return s;
    }
    char *d = pool_alloc(p, n - 1);
    memcpy(d, s + 1, n - 2);
    return d;
}

/* A buffer name as a C identifier (inputs and weights keep the user's
 * name behind a prefix, so they never clash with generated locals). */
static const char *c_ident(Pool *p, const char *prefix, const char *name) {
    char *s = pool_printf(p, "%s%s", prefix, name);
    for (char *c = s + strlen(prefix); *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            *c = '_';
    return s;
}

static void name_buffers(Gen *g) {
    const LoopProgram *p = g->p;
    g->bufname = pool_alloc(g->pool, sizeof(char *) * (size_t)(p->nbufs + 1));
    for (int b = 0; b < p->nbufs; b++) {
        const Buffer *B = p->bufs[b];
        const char *n = B->body == BODY_INPUT    ? c_ident(g->pool, "in_", B->name)
                        : B->body == BODY_WEIGHT ? c_ident(g->pool, "w_", B->name)
                                                 : c_ident(g->pool, "", B->name);
        for (int o = 0; o < b; o++)
            if (!strcmp(g->bufname[o], n)) n = pool_printf(g->pool, "%s_%d", n, b);
        g->bufname[b] = n;
    }
}

/* ===== levels and loops ============================================================== */

static int clamp_level(const KGen *K, int level) {
    return level > 0 && level < K->collapse ? K->collapse : level;
}

static int dims_level(const KGen *K, uint32_t vars) {
    int level = 0;
    for (int d = 0; d < K->ndims; d++) {
        if (!((vars >> d) & 1u)) continue;
        int l = K->level_of[K->loop_of[d]];
        if (l < 0) cg_fail(K->g, "codegen: %s: dim %d used outside its loop", K->k->kernel, d);
        if (l > level) level = l;
    }
    return clamp_level(K, level);
}

static void line(KGen *K, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line(KGen *K, int level, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf) {   /* long lines (big expressions) go the slow way */
        char *big = pool_alloc(K->g->pool, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        str_putf(&K->block[level], "%s\n", big);
        return;
    }
    str_putf(&K->block[level], "%s\n", buf);
}

static bool valid(const KGen *K, const Ent *e) {
    return e->level <= K->inner && K->epoch[e->level] == e->epoch;
}

/* ===== indices ======================================================================= */

/* Bounds of an index over the dims' ranges (conservative). */
static void ix_bounds(const KGen *K, const Index *ix, int64_t *lo, int64_t *hi) {
    int64_t a, b;
    switch (ix->kind) {
    case IX_VAR: *lo = 0; *hi = K->size[ix->v] - 1; return;
    case IX_CONST: *lo = *hi = ix->v; return;
    case IX_ADD:
        *lo = *hi = 0;
        for (int i = 0; i < ix->n; i++) {
            ix_bounds(K, ix->a[i], &a, &b);
            *lo += a;
            *hi += b;
        }
        return;
    case IX_MUL:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = ix->v >= 0 ? a * ix->v : b * ix->v;
        *hi = ix->v >= 0 ? b * ix->v : a * ix->v;
        return;
    case IX_FLOORDIV:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = a >= 0 ? a / ix->v : -((-a + ix->v - 1) / ix->v);
        *hi = b >= 0 ? b / ix->v : -((-b + ix->v - 1) / ix->v);
        return;
    case IX_MOD:
        ix_bounds(K, ix->a[0], &a, &b);
        *lo = a >= 0 && b < ix->v ? a : 0;
        *hi = a >= 0 && b < ix->v ? b : ix->v - 1;
        return;
    }
}

static bool ix_nonneg(const KGen *K, const Index *ix) {
    int64_t lo, hi;
    ix_bounds(K, ix, &lo, &hi);
    return lo >= 0;
}

/* The C value of dim d. */
static const char *dim_text(const KGen *K, int d) {
    int L = K->loop_of[d];
    const char *n = K->loop[L].name;
    bool whole = K->div[d] * K->size[d] == K->loop[L].extent;
    if (K->div[d] == 1) return whole ? n : pool_printf(K->g->pool, "(%s %% %lld)", n, (long long)K->size[d]);
    if (whole) return pool_printf(K->g->pool, "(%s / %lld)", n, (long long)K->div[d]);
    return pool_printf(K->g->pool, "(%s / %lld %% %lld)", n, (long long)K->div[d],
                       (long long)K->size[d]);
}

/* Precedence: 0 anywhere, 1 operand of + (no parens needed), 2 operand of * / %. */
static void print_tree(const KGen *K, Str *o, const Index *ix, int prec) {
    switch (ix->kind) {
    case IX_VAR: str_putf(o, "%s", dim_text(K, (int)ix->v)); return;
    case IX_CONST: str_putf(o, ix->v < 0 ? "(%lld)" : "%lld", (long long)ix->v); return;
    case IX_ADD:
        if (prec >= 2) str_putf(o, "(");
        for (int i = 0; i < ix->n; i++) {
            if (i) str_putf(o, " + ");
            print_tree(K, o, ix->a[i], 1);
        }
        if (prec >= 2) str_putf(o, ")");
        return;
    case IX_MUL:
        str_putf(o, ix->v < 0 ? "(%lld)*" : "%lld*", (long long)ix->v);
        print_tree(K, o, ix->a[0], 2);
        return;
    case IX_FLOORDIV:
    case IX_MOD: {
        bool floordiv = ix->kind == IX_FLOORDIV;
        if (!ix_nonneg(K, ix->a[0])) {
            str_putf(o, "%s(", floordiv ? "kiln_floordiv" : "kiln_floormod");
            print_tree(K, o, ix->a[0], 0);
            str_putf(o, ", %lld)", (long long)ix->v);
            return;
        }
        str_putf(o, "(");
        print_tree(K, o, ix->a[0], 2);
        str_putf(o, " %s %lld)", floordiv ? "/" : "%", (long long)ix->v);
        return;
    }
    }
}

/* Per-loop coefficients of an affine index, when every loop's merged dims
 * appear in it the way the merge assumed (coef[d] = c_L * div[d]). */
static bool loop_coefs(const KGen *K, const int64_t *coef, int nvars, int64_t *lc) {
    bool seen[MAXL] = {false};
    for (int d = 0; d < nvars; d++)
        if (K->div[d] == 1) lc[K->loop_of[d]] = coef[d], seen[K->loop_of[d]] = true;
    for (int d = 0; d < nvars; d++) {
        int L = K->loop_of[d];
        if (!seen[L] || coef[d] != lc[L] * K->div[d]) return false;
    }
    for (int L = 0; L < K->nloops; L++)
        if (!seen[L]) lc[L] = 0;
    return true;
}

static void print_affine(const KGen *K, Str *o, const int64_t *lc, int64_t off) {
    bool first = true;
    for (int L = 0; L < K->nloops; L++) {
        if (!lc[L]) continue;
        int64_t c = lc[L];
        if (!first) str_putf(o, c < 0 ? " - " : " + ");
        else if (c < 0) str_putf(o, "-");
        if (c < 0) c = -c;
        if (c == 1) str_putf(o, "%s", K->loop[L].name);
        else str_putf(o, "%lld*%s", (long long)c, K->loop[L].name);
        first = false;
    }
    if (first) str_putf(o, "%lld", (long long)off);
    else if (off) str_putf(o, " %s %lld", off < 0 ? "-" : "+", (long long)(off < 0 ? -off : off));
}

/* An index over dims 0..nvars-1 as C text in the kernel's loop variables. */
static IxText print_index(const KGen *K, const Index *ix, int nvars) {
    Str o;
    str_init(&o, K->g->pool);
    int64_t coef[MAXL], off, lc[MAXL];
    IxText t = {NULL, dims_level(K, ix_vars(ix)), true, false};
    int innermost = K->innermost;
    if (ix_affine(ix, nvars, coef, &off) && loop_coefs(K, coef, nvars, lc)) {
        print_affine(K, &o, lc, off);
        if (innermost >= 0) {
            t.unit = lc[innermost] == 0 || lc[innermost] == 1;
            t.near = lc[innermost] >= 2 && lc[innermost] <= 4;
        }
    } else {
        print_tree(K, &o, ix, 0);
        t.unit = t.level < K->inner;
    }
    t.c = str_get(&o);
    return t;
}

/* ===== expressions ==================================================================== */

/* A temporary holding rhs at a level, or the equal one already there. */
static Val temp(KGen *K, int level, const char *rhs) {
    Pool *P = K->g->pool;
    rhs = strip_parens(P, rhs);
    Ent *e = table_find(&K->cse, rhs);
    if (e && valid(K, e)) return (Val){e->c, e->level};
    const char *name = pool_printf(P, "tmp%d", K->ntmp++);
    line(K, level, "float %s = %s;", name, rhs);
    table_add(P, &K->cse, rhs, name, level, K->epoch[level]);
    return (Val){name, level};
}

static const char *reg_key(Pool *p, int buf, const char *ix) {
    return pool_printf(p, "%d:%s", buf, ix);
}

static void note_access(KGen *K, int buf, IxText ix, uint8_t how) {
    K->use[buf] |= how;
    if (ix.level == K->inner && !ix.unit) K->strided = true;
    if (ix.level == K->inner && !ix.unit && !ix.near) K->far = true;
}

/* Add at to K->pf.addr (row prefetch or stream prefetch text) unless there. */
static void pf_add(KGen *K, const char *at) {
    for (int i = 0; i < K->pf.n; i++)
        if (!strcmp(K->pf.addr[i], at)) return;
    K->pf.addr = pool_grow(K->g->pool, K->pf.addr, &K->pf.cap, K->pf.n + 1, sizeof *K->pf.addr);
    K->pf.addr[K->pf.n++] = at;
}

/* Row prefetch (see KGen): a load of the first inner stage that walks the
 * row with unit stride; its address at the row's start is kept once. */
static const char *subst_ident(Pool *p, const char *text, const char *name, const char *repl);
static void note_row_load(KGen *K, int buf, IxText ix) {
    if (ix.level != K->inner || !ix.unit || K->innermost < 0) return;
    Pool *P = K->g->pool;
    const char *row = K->loop[K->pnest[K->npl - 1]].name;
    const char *at = pool_printf(P, "&%s[%s]", K->g->bufname[buf], ix.c);
    if (!strcmp(subst_ident(P, at, row, "0"), at)) return;   /* the same for every row */
    pf_add(K, at);
}

static bool stream_buffer(const Buffer *b);

/* A streaming math kernel's load along its tiles, from a buffer too large
 * for the caches (stream_buffer): at the start of each tile, ask for the
 * tile's worth of it CG_STREAM_PF_AHEAD elements ahead (kiln_prefetch_ahead
 * stays inside the buffer). */
static void note_stream_load(KGen *K, int buf, IxText ix) {
    const Buffer *b = buf_of(K->g, buf);
    if (ix.level != K->inner || !ix.unit || !stream_buffer(b)) return;
    Pool *P = K->g->pool;
    const char *tile = K->loop[K->pnest[K->npl - 2]].name, *var = K->loop[K->pnest[K->npl - 1]].name;
    const char *ahead = pool_printf(P, "%s + %d", tile, CG_STREAM_PF_AHEAD);
    const char *at = pool_printf(P, "kiln_prefetch_ahead(%s, %s, %lld, %lld);", K->g->bufname[buf],
                                 subst_ident(P, ix.c, var, ahead), (long long)K->st.tile,
                                 (long long)b->numel);
    pf_add(K, at);
}

static Val emit_load(KGen *K, const Expr *e, int nvars) {
    Pool *P = K->g->pool;
    IxText ix = print_index(K, e->index, nvars);
    const char *key = reg_key(P, e->buf, ix.c);
    Ent *r = table_find(&K->regs, key);
    if (r && valid(K, r)) return (Val){r->c, r->level};
    Ent *row = table_find(&K->rows, key);
    if (row) return temp(K, ix.level, row->c);
    const Buffer *b = buf_of(K->g, e->buf);
    if (buf_computed(b) && K->g->s->node_of_buf[e->buf] >= 0) {
        /* a member of this kernel that is not in memory: a scheduler bug */
        for (int i = 0; i < K->k->n; i++)
            if (snode(K->g, K->k->members[i])->buf == e->buf && K->k->store[i] != STORE_GLOBAL)
                cg_fail(K->g, "codegen: %s reads %s[%s], which lives in registers only",
                        K->k->kernel, K->g->bufname[e->buf], ix.c);
    }
    note_access(K, e->buf, ix, USE_READ);
    if (K->pf.record && !K->guard) note_row_load(K, e->buf, ix);
    if (K->st.prefetch && !K->guard) note_stream_load(K, e->buf, ix);
    K->guarded |= K->guard != NULL;
    if (K->guard)          /* a select's branch may address outside the buffer */
        return temp(K, ix.level > K->guard_level ? ix.level : K->guard_level,
                    pool_printf(P, "%s ? %s[%s] : 0.0f", K->guard, K->g->bufname[e->buf], ix.c));
    return temp(K, ix.level, pool_printf(P, "%s[%s]", K->g->bufname[e->buf], ix.c));
}

/* A C form with each %s replaced by the next operand. */
static const char *apply_form(Pool *p, const char *form, const Val *args, int nargs) {
    Str o;
    str_init(&o, p);
    int k = 0;
    for (const char *c = form; *c; c++) {
        if (c[0] == '%' && c[1] == 's' && k < nargs) {
            str_putf(&o, "%s", args[k++].c);
            c++;
        } else {
            str_putf(&o, "%c", *c);
        }
    }
    return str_get(&o);
}

/* pow with a constant exponent avoids libm's scalar powf where it can. */
static const char *pow_form(const Expr *e) {
    const Expr *y = e->args[1];
    if (y->kind != EX_CONST) return "powf(%s, %s)";
    float f = (float)y->value;
    if (f == floorf(f) && fabsf(f) <= CG_POWI_MAX) return NULL;   /* kiln_powi */
    if (f == 0.5f) return "kiln_pow_half(%s)";
    if (f == -0.5f) return "(1.0f / kiln_pow_half(%s))";
    return "powf(%s, %s)";
}

static Val emit_expr(KGen *K, const Expr *e, int nvars);

/* a / d with d invariant in a's (deeper) loop, such as softmax's division
 * by its row sum: a * (1 / d), one divide per outer iteration instead of a
 * vector divide per element (softmax over 64x1024 in L2, 1 thread: 0.86
 * -> 0.73 ns per element; PyTorch's softmax does the same). 1.5 ulp instead
 * of 0.5. So that 1 / d cannot overflow for a tiny d (below 2^-128) while
 * a / d is finite, a divisor under 2^-100 is scaled by 2^100 first, and a
 * with it: both exactly, being powers of 2 (kiln_rcp_scale). Zero,
 * infinite and NaN divisors give what the division gives. */
static const char *div_by_invariant(KGen *K, Val a, Val d) {
    Pool *P = K->g->pool;
    Val sc = temp(K, d.level, pool_printf(P, "kiln_rcp_scale(%s)", d.c));
    Val rc = temp(K, d.level, pool_printf(P, "1.0f / (%s * %s)", d.c, sc.c));
    return pool_printf(P, "%s * %s * %s", a.c, sc.c, rc.c);
}

static Val emit_op(KGen *K, const Expr *e, int nvars) {
    Val args[MAX_IN];
    int level = 0;
    if (e->nargs > MAX_IN) cg_fail(K->g, "codegen: %d operands", e->nargs);
    for (int i = 0; i < e->nargs; i++) {
        args[i] = emit_expr(K, e->args[i], nvars);
        if (args[i].level > level) level = args[i].level;
    }
    const char *form = op_info[e->op].cform, *rhs;
    if (!form || !*form) cg_fail(K->g, "codegen: %s is not a pointwise op", op_info[e->op].name);
    if (e->op == OP_DIV && e->args[1]->kind != EX_CONST && args[1].level < args[0].level)
        return temp(K, level, div_by_invariant(K, args[0], args[1]));
    if (e->op == OP_POW && !(form = pow_form(e)))
        rhs = pool_printf(K->g->pool, "kiln_powi(%s, %d)", args[0].c, (int)(float)e->args[1]->value);
    else
        rhs = apply_form(K->g->pool, form, args, e->nargs);
    return temp(K, level, rhs);
}

/* A select's condition as an int temporary at the depth of its index, so a
 * test of an outer loop's variable is computed once per outer iteration and
 * the inner loop sees a loop-invariant mask (GCC then vectorizes the masked
 * loads of a 3-D pool's window). */
static const char *cond_temp(KGen *K, int level, const char *cond) {
    Pool *P = K->g->pool;
    const char *key = pool_printf(P, "int %s", cond);
    Ent *e = table_find(&K->cse, key);
    if (e && valid(K, e)) return e->c;
    const char *name = pool_printf(P, "c%d", K->ntmp++);
    line(K, level, "int %s = %s;", name, cond);
    table_add(P, &K->cse, key, name, level, K->epoch[level]);
    return name;
}

static void count_load(const Expr *e, void *ud) { (void)e; ++*(int *)ud; }

/* One branch of a select, its loads guarded by the conditions that choose it
 * (pad and concat read x at v - before, out of bounds in the border; the
 * guarded load `c ? x[i] : 0.0f` becomes a masked vector load). A nest with
 * a guarded load gets `omp simd` on its innermost loop even when that loop
 * is strided (K->guarded): left to choose, GCC 12 vectorized an outer loop
 * of such a nest wrongly (fuzz-diff seed 1795995102551586: max_pool3d then
 * avg_pool3d, both padded; -O3 wrong, -O1 right; reduced in
 * tests/test_fused.c, fused_guarded_outer_loop). */
static Val emit_branch(KGen *K, const Expr *e, int nvars, const char *cond, int level) {
    const char *saved = K->guard;
    int saved_level = K->guard_level;
    int nloads = 0;
    ex_loads(e, count_load, &nloads);
    K->guard_level = saved_level > level ? saved_level : level;
    if (nloads)            /* a branch without loads (a pad's value) needs no guard */
        K->guard = saved ? cond_temp(K, K->guard_level,
                                     pool_printf(K->g->pool, "%s && %s", saved, cond))
                         : cond;
    Val v = emit_expr(K, e, nvars);
    K->guard = saved;
    K->guard_level = saved_level;
    return v;
}

static Val emit_select(KGen *K, const Expr *e, int nvars) {
    Pool *P = K->g->pool;
    IxText ix = print_index(K, e->index, nvars);
    const char *lo = e->lo == EX_NOLO ? "" : pool_printf(P, "%s >= %lld", ix.c, (long long)e->lo);
    const char *hi = e->hi == EX_NOHI ? "" : pool_printf(P, "%s < %lld", ix.c, (long long)e->hi);
    const char *cond = cond_temp(K, ix.level, pool_printf(P, "%s%s%s", lo, *lo && *hi ? " && " : "", hi));
    Val a = emit_branch(K, e->args[0], nvars, cond, ix.level);
    Val b = emit_branch(K, e->args[1], nvars, pool_printf(P, "!%s", cond), ix.level);
    int level = ix.level > a.level ? ix.level : a.level;
    if (b.level > level) level = b.level;
    /* kiln_vm_sel, not ?:, for the reason vecmath.h gives (GCC threads jumps
     * through a ?: with a constant arm and the loop stays scalar) */
    return temp(K, level, pool_printf(P, "kiln_vm_sel(%s, %s, %s)", cond, a.c, b.c));
}

static Val emit_expr(KGen *K, const Expr *e, int nvars) {
    switch (e->kind) {
    case EX_SELECT: return emit_select(K, e, nvars);
    case EX_CONST: return (Val){float_lit(K->g->pool, e->value), 0};
    case EX_LOAD: return emit_load(K, e, nvars);
    case EX_OP: return emit_op(K, e, nvars);
    }
    cg_fail(K->g, "codegen: bad expression kind %d", (int)e->kind);
}

/* ===== members ======================================================================== */

/* The store index of a member: contiguous over its own loop sizes. */
static const Index *store_index(KGen *K, int nvars, const int64_t *sizes) {
    Pool *P = K->g->pool;
    Index *v[MAXL];
    for (int d = 0; d < nvars; d++) v[d] = ix_var(P, d);
    return ix_simplify(P, ix_contiguous(P, nvars, sizes, v), nvars, sizes);
}

static int member_vars(const SNode *n) {
    return n->body == BODY_REDUCTION ? n->np + n->nr : n->np;
}

/* A value to keep for later stages of this row: a scalar when it is the same
 * for the whole row, else a per-thread row of scratch. */
/* A per-thread float array of n elements for the kernel (scratch_decls). */
static void add_scratch(KGen *K, const char *name, int64_t n) {
    K->scratch = pool_grow(K->g->pool, K->scratch, &K->capscratch, K->nscratch + 1, sizeof(Scratch));
    K->scratch[K->nscratch++] = (Scratch){name, n};
}

static void keep_row_local(KGen *K, int buf, const char *key, Val v, int nvars, const int64_t *sizes) {
    Pool *P = K->g->pool;
    if (v.level <= K->npl) {
        table_add(P, &K->regs, key, v.c, v.level, K->epoch[v.level]);
        return;
    }
    const Index *six = store_index(K, nvars, sizes);
    int64_t rn = K->k->rnumel;
    const Index *rix = ix_simplify(P, ix_mod(P, (Index *)six, rn), nvars, sizes);
    IxText r = print_index(K, rix, nvars);
    const char *arr = pool_printf(P, "row_%s%s", K->g->bufname[buf], K->rp.sfx);
    add_scratch(K, arr, rn);
    const char *slot = pool_printf(P, "%s[%s]", arr, r.c);
    line(K, r.level > v.level ? r.level : v.level, "%s = %s;", slot, v.c);
    table_add(P, &K->rows, key, slot, r.level, 0);
}

/* ---- streamed stores (see KGen) ---- */

static int split_loop(KGen *K, int L, int64_t block);

static bool stream_buffer(const Buffer *b) {
    return b->numel * loop_elsize(b->dtype) >= CG_STREAM_MIN;
}

/* text with each identifier `name` in it replaced by `(repl)`. */
static const char *subst_ident(Pool *p, const char *text, const char *name, const char *repl) {
    Str o;
    str_init(&o, p);
    size_t n = strlen(name);
    for (const char *c = text; *c;) {
        bool start = c == text || !(isalnum((unsigned char)c[-1]) || c[-1] == '_');
        if (start && !strncmp(c, name, n) && !(isalnum((unsigned char)c[n]) || c[n] == '_')) {
            str_putf(&o, "(%s)", repl);
            c += n;
        } else {
            str_putf(&o, "%c", *c++);
        }
    }
    return str_get(&o);
}

/* A pointwise kernel that stores a large buffer: its innermost loop covers
 * at most CG_STREAM_ROW elements (a longer one is split into blocks of
 * CG_STREAM_TILE), so each large store can go through a tile. Not for
 * transposing tiles, whose rows are short. A kernel with expensive math
 * (exp, sin, erf, ...; random numbers) streams tiles of CG_STREAM_TILE_MATH
 * whatever its rows: its math runs between the bursts of streamed stores,
 * and a burst of a long tile stalls it (8192x4096, 1 / 2 threads, best of
 * 8-10: gelu(x + b) 1.02-1.06x faster with tiles of 256, 1.03x slower with
 * 1024, 1.11-1.13x slower with 4096; sin(relu(x + 1) * 2) 1.04-1.06x
 * faster with 256; relu(x + y), tiles of 2048, 1.10-1.12x faster; then
 * tiles of 128: 1.01-1.08x faster than 256). Such a kernel also asks for
 * its large inputs CG_STREAM_PF_AHEAD elements ahead at the start of each
 * tile (note_stream_load): the hardware prefetcher alone falls behind while
 * the core computes (best of 21 runs, interleaved, tiles of 128 without and
 * with it: gelu(x + b) 27.1 -> 23.8 ms at 1 thread, 14.1 -> 12.3 ms at 2;
 * sin(relu(x + 1) * 2) 24.3 -> 21.8 and 12.8 -> 11.2). */
static void plan_stream(KGen *K) {
    if (K->epi.on || K->k->kind != KK_POINTWISE || K->npl == 0) return;
    bool any = false, math = false;
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        math |= b->body == BODY_RAND || (b->body == BODY_POINTWISE && ex_expensive(b->expr) >= 0);
        any |= K->k->store[i] == STORE_GLOBAL && stream_buffer(b);
    }
    int L = K->pnest[K->npl - 1];
    if (!any || K->loop[L].lo || K->loop[L].step != 1) return;
    K->st.tile = math ? CG_STREAM_TILE_MATH : CG_STREAM_TILE;
    if (K->loop[L].extent > (math ? CG_STREAM_TILE_MATH : CG_STREAM_ROW)) {
        K->pnest[K->npl - 1] = split_loop(K, L, K->st.tile);
        K->pnest[K->npl++] = L;
        K->st.prefetch = math;
    }
    K->st.on = true;
}

/* The store of v to buffer b at ix through a tile, when it is a large
 * buffer stored along the innermost loop of a row stage or of a streaming
 * pointwise kernel: the tile element is written now, and the copy of the
 * tile to memory goes after the loop (K->post). false: store as usual. */
static bool stream_store(KGen *K, const Buffer *b, IxText ix, Val v) {
    if (!stream_buffer(b) || !ix.unit || ix.level != K->inner || K->guard || K->innermost < 0)
        return false;
    const Loop *l = &K->loop[K->innermost];
    if (K->k->kind == KK_POINTWISE ? !K->st.on
                                   : K->epi.on || K->outer.xin >= 0 || K->rp.n != 1 || K->nsn != 1 ||
                                         l->lo || l->extent > CG_STREAM_ROW)
        return false;
    if (l->step != 1) return false;
    Pool *P = K->g->pool;
    int64_t n = l->lo ? K->st.tile : l->extent;
    const char *lo = l->lo ? l->lo : "0";
    const char *count = l->lo ? pool_printf(P, "%s - %s", l->hi, l->lo)
                              : pool_printf(P, "%lld", (long long)n);
    const char *tile = pool_printf(P, "st_%s", K->g->bufname[b->id]);
    add_scratch(K, tile, n);
    const char *at = l->lo ? pool_printf(P, "%s - %s", l->name, lo) : l->name;
    const char *slot = pool_printf(P, "%s[%s]", tile, at);
    line(K, K->inner, "%s = %s;", slot, v.c);
    K->st.used = true;
    const char *out = K->g->bufname[b->id];
    if (K->k->kind == KK_REDUCTION) {
        /* a row stage: per vector where the loop allows (see nest_text) */
        str_putf(&K->st.post, "kiln_stream(&%s[%s], %s, %s);\n", out, subst_ident(P, ix.c, l->name, lo),
                 tile, count);
        if (n % CG_LANES == 0 && (K->st.vloop < 0 || K->st.vloop == K->innermost)) {
            const char *g = pool_printf(P, "%sv", l->name);
            K->st.vloop = K->innermost;
            str_putf(&K->st.vpost, "kiln_stream16(&%s[%s], &%s[%s]);\n", out, subst_ident(P, ix.c, l->name, g),
                     tile, g);
        }
    } else {
        str_putf(&K->post, "kiln_stream(&%s[%s], %s, %s);\n", out, subst_ident(P, ix.c, l->name, lo), tile,
                 count);
    }
    /* a later stage of the row reads the tile (in L1), not the streamed
     * copy, which the non-temporal stores sent to memory */
    if (K->k->kind == KK_REDUCTION)
        table_add(P, &K->rows, reg_key(P, b->id, ix.c), slot, ix.level, 0);
    return true;
}

static void gen_pointwise_member(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    Val v;
    const Index *six = store_index(K, n->np, n->P);
    IxText ix = print_index(K, six, n->np);
    if (b->body == BODY_RAND)
        v = temp(K, ix.level, pool_printf(P, "kiln_rand(%lluull, (uint64_t)(%s))",
                                          (unsigned long long)b->seed, ix.c));
    else
        v = emit_expr(K, b->expr, n->np);
    const char *key = reg_key(P, b->id, ix.c);
    if (K->k->store[i] == STORE_GLOBAL) {
        note_access(K, b->id, ix, USE_WRITE);
        if (!stream_store(K, b, ix, v))
            line(K, ix.level > v.level ? ix.level : v.level, "%s[%s] = %s;", K->g->bufname[b->id],
                 ix.c, v.c);
    }
    if (K->k->store[i] == STORE_ROW_LOCAL) keep_row_local(K, b->id, key, v, n->np, n->P);
    table_add(P, &K->regs, key, v.c, v.level, K->epoch[v.level]);
}

static const char *rop_identity(ReduceOp op) {
    switch (op) {
    case ROP_SUM: return "0.0f";
    case ROP_PROD: return "1.0f";
    case ROP_AMAX: return "-INFINITY";
    case ROP_AMIN: return "INFINITY";
    }
    return "0.0f";
}

/* acc[x - block] = acc[x - block] op v, for an outer reduction. */
static const char *outer_acc(KGen *K, const char *acc) {
    const Loop *x = &K->loop[K->outer.xin], *blk = &K->loop[K->pnest[K->npl - 1]];
    return pool_printf(K->g->pool, "%s[%s - %s]", acc, x->name, blk->name);
}

/* Outer reduction: one accumulator per element of the block, so the lanes
 * never combine and max/min need no NaN flag (kiln_max keeps a NaN). */
static void gen_outer_reduction_member(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    bool minmax = b->rop == ROP_AMAX || b->rop == ROP_AMIN, wide = K->g->double_acc && !minmax;
    const char *acc = pool_printf(P, "acc_%s", K->g->bufname[b->id]), *el = outer_acc(K, acc);
    int64_t block = K->loop[K->pnest[K->npl - 1]].step;
    line(K, K->npl, "%s %s[%lld];", wide ? "double" : "float", acc, (long long)block);
    line(K, K->npl, "for (int64_t i = 0; i < %lld; i++) %s[i] = %s;", (long long)block, acc,
         rop_identity(b->rop));
    Val v = emit_expr(K, b->expr, n->np + n->nr);
    switch (b->rop) {
    case ROP_SUM: line(K, K->inner, "%s += %s%s;", el, wide ? "(double)" : "", v.c); break;
    case ROP_PROD: line(K, K->inner, "%s *= %s%s;", el, wide ? "(double)" : "", v.c); break;
    case ROP_AMAX: line(K, K->inner, "%s = kiln_max(%s, %s);", el, el, v.c); break;
    case ROP_AMIN: line(K, K->inner, "%s = kiln_min(%s, %s);", el, el, v.c); break;
    }
    K->outer.members[K->outer.n++] = i;
    K->has_red = true;
}

/* In the loop over the block after the reduced loops: store the result and
 * hand it to the row steps. */
static void finish_outer_reduction(KGen *K, int i) {
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    bool wide = K->g->double_acc && b->rop != ROP_AMAX && b->rop != ROP_AMIN;
    const char *el = outer_acc(K, pool_printf(P, "acc_%s", K->g->bufname[b->id]));
    if (wide) el = pool_printf(P, "(float)%s", el);
    IxText ix = print_index(K, store_index(K, n->np, n->P), n->np);
    if (K->k->store[i] == STORE_GLOBAL) {
        note_access(K, b->id, ix, USE_WRITE);
        line(K, K->inner, "%s[%s] = %s;", K->g->bufname[b->id], ix.c, el);
    }
    table_add(P, &K->regs, reg_key(P, b->id, ix.c), el, K->inner, K->epoch[K->inner]);
}

/* acc = acc op v, inside the stage's innermost loop, with the clause that
 * lets the loop run in SIMD lanes. Sums and products accumulate in float
 * (CgOptions.double_acc: in double, like the interpreter; that costs about
 * a third of the bandwidth of an out-of-cache row sum, because the widening
 * conversions fill the reorder window and fewer loads are in flight); max
 * and min are exact and raise a NaN flag, because OpenMP combines the lanes
 * with a max that may drop a NaN; with the flag, the max in the loop may
 * drop it too (kiln_red_max: one vmaxps, not kiln_max's two compares and
 * a blend). After the loop the row's value is a float. */
static void gen_reduction_member(KGen *K, int i) {
    if (K->outer.xin >= 0) {
        gen_outer_reduction_member(K, i);
        return;
    }
    const SNode *n = snode(K->g, K->k->members[i]);
    const Buffer *b = member_buf(K, i);
    Pool *P = K->g->pool;
    const char *nm = K->g->bufname[b->id];
    const char *acc = pool_printf(P, "acc_%s%s", nm, K->rp.sfx), *nan = pool_printf(P, "nan_%s%s", nm, K->rp.sfx);
    bool minmax = b->rop == ROP_AMAX || b->rop == ROP_AMIN;
    const char *val = minmax || !K->g->double_acc ? acc : pool_printf(P, "red_%s%s", nm, K->rp.sfx);
    const char *wide = K->g->double_acc ? "(double)" : "";
    const char *type = minmax || !K->g->double_acc ? "float" : "double";
    const char *ident = minmax || !K->g->double_acc ? rop_identity(b->rop)
                                                    : b->rop == ROP_SUM ? "0.0" : "1.0";
    line(K, K->npl, "%s %s = %s;", type, acc, ident);
    if (minmax) line(K, K->npl, "int %s = 0;", nan);
    /* in lanes (see spread_stage): acc and nan stand for their lane's
     * element inside the loop, and the lanes combine after it */
    const char *el = acc, *nel = nan;
    if (K->lane.index) {
        el = pool_printf(P, "lane_%s[%s]", acc, K->lane.index);
        nel = pool_printf(P, "lane_%s[%s]", nan, K->lane.index);
        line(K, K->npl, "%s lane_%s[%d];", type, acc, CG_LANES);
        if (minmax) {
            line(K, K->npl, "int lane_%s[%d];", nan, CG_LANES);
            line(K, K->npl, "for (int l = 0; l < %d; l++) { lane_%s[l] = %s; lane_%s[l] = 0; }", CG_LANES,
                 acc, ident, nan);
        } else {
            line(K, K->npl, "for (int l = 0; l < %d; l++) lane_%s[l] = %s;", CG_LANES, acc, ident);
        }
    }
    Val v = emit_expr(K, b->expr, n->np + n->nr);
    switch (b->rop) {
    case ROP_SUM: line(K, K->inner, "%s += %s%s;", el, wide, v.c); break;
    case ROP_PROD: line(K, K->inner, "%s *= %s%s;", el, wide, v.c); break;
    case ROP_AMAX:
    case ROP_AMIN:
        line(K, K->inner, "%s = kiln_red_%s(%s, %s);", el, b->rop == ROP_AMAX ? "max" : "min", el, v.c);
        line(K, K->inner, "%s |= %s != %s;", nel, v.c, v.c);
        break;
    }
    static const char *const clause[] = {"+", "max", "min", "*"};
    if (K->lane.index) {
        static const char *const combine[] = {"%s += lane_%s[l];", "%s = kiln_red_max(%s, lane_%s[l]);",
                                              "%s = kiln_red_min(%s, lane_%s[l]);", "%s *= lane_%s[l];"};
        Str c;
        str_init(&c, P);
        if (minmax) str_putf(&c, combine[b->rop], acc, acc, acc);
        else str_putf(&c, combine[b->rop], acc, acc);
        if (minmax)
            str_putf(&K->post, "for (int l = 0; l < %d; l++) { %s %s |= lane_%s[l]; }\n", CG_LANES,
                     str_get(&c), nan, nan);
        else
            str_putf(&K->post, "for (int l = 0; l < %d; l++) %s\n", CG_LANES, str_get(&c));
    } else {
        str_putf(&K->clauses, " reduction(%s:%s)", clause[b->rop], acc);
        if (minmax) str_putf(&K->clauses, " reduction(|:%s)", nan);
    }
    if (minmax) str_putf(&K->post, "if (%s) %s = NAN;\n", nan, acc);
    else if (K->g->double_acc) str_putf(&K->post, "float %s = (float)%s;\n", val, acc);
    IxText ix = print_index(K, store_index(K, n->np, n->P), n->np);
    if (K->k->store[i] == STORE_GLOBAL) {
        note_access(K, b->id, ix, USE_WRITE);
        str_putf(&K->post, "%s[%s] = %s;\n", nm, ix.c, val);
    }
    table_add(P, &K->regs, reg_key(P, b->id, ix.c), val, K->npl, K->epoch[K->npl]);
    K->has_red = true;
}

/* ===== loop structure ================================================================= */

/* Dims d and d+1 can share one loop when every index of the kernel walks
 * them as one: coef[d] == coef[d+1] * size[d+1] (both 0 included). */
typedef struct {
    KGen *K;
    int nvars;
    bool ok[MAXL];
} MergeCheck;

static void check_index(MergeCheck *m, const Index *ix) {
    int64_t coef[MAXL], off;
    uint32_t vs = ix_vars(ix);
    bool affine = ix_affine(ix, m->nvars, coef, &off);
    for (int d = 0; d + 1 < m->nvars; d++) {
        bool uses = (vs >> d) & 3u;
        if (!uses) continue;
        if (!affine || coef[d] != coef[d + 1] * m->K->size[d + 1]) m->ok[d] = false;
    }
}

static void check_load(const Expr *e, void *ud) { check_index(ud, e->index); }

static void plan_merges(KGen *K, bool *ok) {
    MergeCheck m = {.K = K};
    for (int d = 0; d < MAXL; d++) m.ok[d] = true;
    for (int i = 0; i < K->k->n; i++) {
        const SNode *n = snode(K->g, K->k->members[i]);
        const Buffer *b = member_buf(K, i);
        m.nvars = member_vars(n);
        if (b->expr) ex_loads(b->expr, check_load, &m);
        if (b->expr) ex_selects(b->expr, check_load, &m);
        check_index(&m, store_index(K, n->np, n->P));
    }
    for (int d = 0; d + 1 < K->ndims; d++)
        ok[d] = m.ok[d] && d + 1 != K->npd;   /* never merge across P / R */
}

static int new_loop(KGen *K, const char *name, int64_t extent) {
    K->loop[K->nloops] = (Loop){name, extent, NULL, NULL, 1};
    return K->nloops++;
}

/* An epilogue runs on any flat range [start, start + count) of its output:
 * its dims become at most two loops, the innermost group of dims that merge
 * (the contiguous, vectorized loop) and one loop over all the others (a
 * "row", split into dims by division), so a range is rows clipped at both
 * ends. */
static void epilogue_merges(int ndims, bool *ok) {
    int s = ndims - 1;
    while (s > 0 && ok[s - 1]) s--;
    for (int d = 0; d + 1 < s; d++) ok[d] = true;
}

/* One loop per group of merged dims: the row nest runs the P groups, rl
 * the R groups. */
static void build_loops(KGen *K) {
    bool ok[MAXL] = {false};
    plan_merges(K, ok);
    if (K->epi.on) epilogue_merges(K->ndims, ok);
    for (int d = 0; d < K->ndims; d++) {
        if (!(d > 0 && ok[d - 1])) {
            bool red = d >= K->npd;
            int L = new_loop(K, pool_printf(K->g->pool, "%s%d", red ? "r" : "x", red ? K->nrl : K->npl), 1);
            if (red) K->rl[K->nrl++] = L;
            else K->pnest[K->npl++] = L;
        }
        K->loop_of[d] = K->nloops - 1;
        K->loop[K->nloops - 1].extent *= K->size[d];
    }
    for (int d = K->ndims - 1; d >= 0; d--)
        K->div[d] = d + 1 < K->ndims && K->loop_of[d + 1] == K->loop_of[d] ? K->div[d + 1] * K->size[d + 1] : 1;
}

/* ---- the outer-reduction order ------------------------------------------------------ */

/* How the loads of the inner stage walk the innermost reduced loop (lr) and
 * the innermost parallel loop (lp). */
typedef struct {
    KGen *K;
    int nvars, lr, lp;
    bool r_strided, r_unit, p_unit;
} Walk;

static void walk_load(const Expr *e, void *ud) {
    Walk *w = ud;
    int64_t coef[MAXL], off, lc[MAXL];
    if (!ix_affine(e->index, w->nvars, coef, &off) || !loop_coefs(w->K, coef, w->nvars, lc)) {
        w->r_strided = true;   /* div/mod: treat as scattered */
        return;
    }
    if (lc[w->lr] == 1 || lc[w->lr] == -1) w->r_unit = true;
    else if (lc[w->lr]) w->r_strided = true;
    if (lc[w->lp] == 1) w->p_unit = true;
}

/* Worth it (and possible): one inner stage followed by row steps, nothing
 * kept per row across inner loops, every load that moves with the reduced
 * loop strided, some load contiguous along the parallel loop, and that
 * loop long enough to fill vectors. */
static bool want_outer(KGen *K) {
    const Kernel *k = K->k;
    if (k->kind != KK_REDUCTION || !K->npl || !K->nrl || k->nstages < 1) return false;
    if (k->stage_kind[0] != STAGE_INNER) return false;
    for (int s = 1; s < k->nstages; s++)
        if (k->stage_kind[s] != STAGE_ROW) return false;
    Walk w = {K, 0, K->rl[K->nrl - 1], K->pnest[K->npl - 1], false, false, false};
    if (K->loop[w.lp].extent < 16) return false;
    for (int i = 0; i < k->n; i++) {
        const Buffer *b = member_buf(K, i);
        if (k->stage[i] != 0) continue;
        if (b->body != BODY_REDUCTION && k->store[i] == STORE_ROW_LOCAL) return false;
        w.nvars = member_vars(snode(K->g, k->members[i]));
        if (b->expr) ex_loads(b->expr, walk_load, &w);
    }
    return w.r_strided && !w.r_unit && w.p_unit;
}

/* Split loop L into a loop over blocks of `block` (returned) and L over one
 * block: `for (xb = 0; xb < n; xb += block)` around
 * `for (x = xb; x < min(xb + block, n); x++)`. */
static int split_loop(KGen *K, int L, int64_t block) {
    int64_t n = K->loop[L].extent;
    if (block > n) block = n;
    int b = new_loop(K, pool_printf(K->g->pool, "%sb", K->loop[L].name), n);
    K->loop[b].step = block;
    const char *bn = K->loop[b].name;
    K->loop[L].lo = bn;
    K->loop[L].hi = block == n ? pool_printf(K->g->pool, "%lld", (long long)n)
                               : pool_printf(K->g->pool, "(%s + %lld < %lld ? %s + %lld : %lld)", bn,
                                             (long long)block, (long long)n, bn, (long long)block,
                                             (long long)n);
    return b;
}

/* The innermost parallel loop becomes xin, running one block; a loop over
 * blocks takes its place at the end of the row nest. */
static void make_outer(KGen *K) {
    int xin = K->pnest[K->npl - 1];
    K->pnest[K->npl - 1] = split_loop(K, xin, CG_OUTER_BLOCK);
    K->outer.xin = xin;
}

/* ---- tiles for transposes -------------------------------------------------------------- */

/* A pointwise kernel whose innermost loop reads some buffer across rows
 * (a transpose) walks the last two loops in square tiles: the input rows a
 * tile touches stay in L1 while the tile is written row by row. */
static bool want_tiles(KGen *K) {
    if (K->k->kind != KK_POINTWISE || K->npl < 2) return false;
    Walk w = {K, K->ndims, K->pnest[K->npl - 1], K->pnest[K->npl - 2], false, false, false};
    if (K->loop[w.lr].extent < 16 || K->loop[w.lp].extent < 16) return false;
    for (int i = 0; i < K->k->n; i++) {
        const Buffer *b = member_buf(K, i);
        if (b->expr) ex_loads(b->expr, walk_load, &w);
    }
    return w.r_strided && w.p_unit;
}

/* The tiles of the column blocks (b) outside those of the row blocks (a):
 * consecutive tiles then go on along the loads' contiguous dim (a), so
 * each of the 32 rows a tile reads continues where the previous tile's
 * stopped, and the hardware prefetcher follows them; the other way round
 * every tile started 32 new rows (a 2048x2048 transpose, 1 thread: 7.2 ->
 * 6.0 ms). */
static void make_tiles(KGen *K) {
    int a = K->pnest[K->npl - 2], b = K->pnest[K->npl - 1];
    K->pnest[K->npl - 2] = split_loop(K, b, CG_TILE);
    K->pnest[K->npl - 1] = split_loop(K, a, CG_TILE);
    K->pnest[K->npl++] = a;
    K->pnest[K->npl++] = b;
}

/* Row pairs (see KGen): a row reduction that reads its long rows once (one
 * inner stage; row steps are fine), whose innermost row loop is a plain
 * loop over an even count, with enough pairs to share out (a [4, 100000]
 * sum keeps four rows for four threads). Not for several inner stages: the
 * later ones read the row again from L1, and two rows (plus a layer norm's
 * weight and bias) no longer fit there (layer_norm and softmax at 8192x4096
 * ran 5-40% slower in pairs). */
static bool want_pairs(KGen *K) {
    const Kernel *k = K->k;
    if (K->epi.on || k->kind != KK_REDUCTION || K->outer.xin >= 0 || K->npl == 0) return false;
    int inner = 0;
    for (int st = 0; st < k->nstages; st++) inner += k->stage_kind[st] == STAGE_INNER;
    if (inner != 1) return false;
    int64_t rows = 1;
    for (int j = 0; j < K->npl; j++) rows *= K->loop[K->pnest[j]].extent;
    const Loop *L = &K->loop[K->pnest[K->npl - 1]];
    return !L->lo && L->step == 1 && L->extent % 2 == 0 && k->rnumel >= CG_PAIR_MIN &&
           rows / 2 >= CG_PARALLEL_ITERS;
}

static void make_pairs(KGen *K) {
    Loop *L = &K->loop[K->pnest[K->npl - 1]];
    L->step = 2;
    K->rp.n = 2;
    K->rp.row_name = L->name;
}

/* Emit the members that follow for row p of the pair: the second row is
 * the row loop's variable plus one, with its own accumulator names. */
static void pair_row(KGen *K, int p) {
    if (K->rp.n == 1) return;
    K->loop[K->pnest[K->npl - 1]].name = p ? pool_printf(K->g->pool, "(%s + 1)", K->rp.row_name) : K->rp.row_name;
    K->rp.sfx = p ? "_1" : "";
}

/* How many outer loops OpenMP shares out (0: the kernel runs serially). */
static void plan_parallel(KGen *K) {
    int64_t work = K->k->numel * (K->k->rnumel > 0 ? K->k->rnumel : 1);
    if (work < CG_PARALLEL_MIN) return;
    int avail = K->k->kind == KK_POINTWISE && K->npl > 1 ? K->npl - 1 : K->npl;
    int64_t iters = 1;
    for (int j = 0; j < avail && iters < CG_PARALLEL_ITERS; j++) {
        const Loop *L = &K->loop[K->pnest[j]];
        if (L->lo) break;   /* inside a block: not a rectangular nest */
        iters *= (L->extent + L->step - 1) / L->step;
        K->collapse = j + 1;
    }
    if (iters < 2) K->collapse = 0;
    /* a whole-tensor reduction has no row loop: its reduced loop is shared
     * out instead, each thread with partial accumulators */
    if (K->k->kind == KK_REDUCTION && K->npl == 0 && K->nrl > 0) K->full_par = true;
}

static bool sizes_are(int n, const int64_t *a, int m, const int64_t *b) {
    return n == m && !memcmp(a, b, sizeof(int64_t) * (size_t)n);
}

/* Every member iterates the kernel's dims, as the scheduler guarantees: a
 * reduction P x R, a pointwise member P ++ R (inner) or P (row step). Member
 * variable v_i is then kernel dim i. */
static void check_members(KGen *K) {
    const Kernel *k = K->k;
    for (int i = 0; i < k->n; i++) {
        const SNode *n = snode(K->g, k->members[i]);
        bool same = n->body == BODY_REDUCTION
                        ? sizes_are(n->np, n->P, k->np, k->P) && sizes_are(n->nr, n->R, k->nr, k->R)
                        : sizes_are(n->np, n->P, K->ndims, K->size) ||
                              (k->kind == KK_REDUCTION && sizes_are(n->np, n->P, k->np, k->P));
        if (!same) cg_fail(K->g, "codegen: member %s of %s has other loops", n->name, k->kernel);
    }
}

/* Open the row nest and a stage nest: set each open loop's level. */
static void open_nest(KGen *K, const int *ids, int n) {
    for (int L = 0; L < K->nloops; L++) K->level_of[L] = -1;
    for (int j = 0; j < K->npl; j++) K->level_of[K->pnest[j]] = j + 1;
    K->nsn = n;
    for (int j = 0; j < n; j++) {
        K->snest[j] = ids[j];
        K->level_of[ids[j]] = K->npl + 1 + j;
    }
    K->inner = K->npl + n;
    K->innermost = n ? ids[n - 1] : K->npl ? K->pnest[K->npl - 1] : -1;
}

/* The epilogue's loops cover [start, start + count): one loop over the
 * range, or rows from the one holding start to the one holding the last
 * element, each clipped to the range. */
static void epilogue_bounds(KGen *K) {
    Pool *P = K->g->pool;
    if (K->npl == 0) return;   /* a scalar output: the body runs once, guarded */
    Loop *in = &K->loop[K->pnest[K->npl - 1]];
    if (K->npl == 1) {
        in->lo = "start";
        in->hi = "start + count";
        return;
    }
    Loop *row = &K->loop[K->pnest[0]];
    long long I = (long long)in->extent;
    const char *r = row->name;
    row->lo = pool_printf(P, "start / %lld", I);
    row->hi = pool_printf(P, "(start + count + %lld) / %lld", I - 1, I);
    in->lo = pool_printf(P, "(start > %s * %lld ? start - %s * %lld : 0)", r, I, r, I);
    in->hi = pool_printf(P, "(start + count < (%s + 1) * %lld ? start + count - %s * %lld : %lld)",
                         r, I, r, I, I);
}

static void setup_kernel(KGen *K) {
    const Kernel *k = K->k;
    K->npd = k->np;
    K->ndims = k->np + k->nr;
    K->outer.xin = -1;
    K->rp.n = 1;
    K->rp.sfx = "";
    if (K->ndims > MAXL) cg_fail(K->g, "codegen: %s has %d dims", k->kernel, K->ndims);
    memcpy(K->size, k->P, sizeof(int64_t) * (size_t)k->np);
    memcpy(K->size + k->np, k->R, sizeof(int64_t) * (size_t)k->nr);
    for (int l = 0; l <= MAXL; l++) str_init(&K->block[l], K->g->pool);
    str_init(&K->clauses, K->g->pool);
    str_init(&K->post, K->g->pool);
    str_init(&K->st.post, K->g->pool);
    str_init(&K->st.vpost, K->g->pool);
    K->st.vloop = -1;
    K->use = pool_alloc(K->g->pool, (size_t)K->g->p->nbufs + 1);
    K->outer.members = pool_alloc(K->g->pool, sizeof(int) * (size_t)(k->n + 1));
    check_members(K);
    build_loops(K);
    open_nest(K, NULL, 0);
    if (K->epi.on) epilogue_bounds(K);   /* serial: the library shares blocks out */
    else if (want_outer(K)) make_outer(K);
    else if (want_tiles(K)) make_tiles(K);
    plan_stream(K);
    if (want_pairs(K)) make_pairs(K);
    if (!K->epi.on) plan_parallel(K);
    open_nest(K, NULL, 0);
}

/* ===== assembling the text ============================================================ */

static bool is_parallel(const KGen *K) { return K->collapse > 0 || K->full_par; }
static bool has_scratch_region(const KGen *K) { return K->nscratch > 0 && K->collapse > 0; }

/* 8-wide vectors for an inner loop of constant trip count n where 16-wide
 * ones would leave a long scalar remainder: n / 16 vector steps and n % 16
 * scalar ones, against n / 8 and n % 8 (GCC 12 does not mask the remainder
 * of an AVX-512 loop). Rows of 14, 28 and 56 (CNN planes) run wholly in
 * vectors then. Such a loop also gets `omp simd` when its strided loads
 * are all near (2 to 4 apart), which GCC vectorizes with permutes; other
 * strided loops are left to GCC's cost model (gathers). ResNet-18's 3x3/2
 * max pool over rows of 56 (loads 2 apart): 1.17 -> 0.69 ms at 1 thread,
 * its remainder had been scalar. Elsewhere (no AVX-512) 8 floats are the
 * widest vector anyway. */
static bool want_simd8(const Loop *l) {
    int64_t n = l->extent;
    return !l->lo && !l->hi && l->step == 1 && n / 8 + n % 8 < n / 16 + n % 16;
}

/* Pragmas of loop j (loop L) of a nest (row nest or stage nest) of n loops;
 * force: `omp simd` whatever the loop (see nest_text). */
static void loop_pragmas(KGen *K, Str *o, bool row_nest, int j, int n, int L, bool innermost,
                         int ind, bool force) {
    bool simd8 = innermost && want_simd8(&K->loop[L]);
    bool simd = force || (innermost && (K->has_red || !K->strided || (simd8 && !K->far) || K->guarded));
    const char *cl = str_get(&K->clauses), *len = simd8 ? " simdlen(8)" : "";
    if (row_nest && j == 0 && K->collapse > 0) {
        bool with_simd = simd && K->collapse == 1 && j == n - 1;
        str_putf(o, "%*s#pragma omp %sfor", ind, "", has_scratch_region(K) ? "" : "parallel ");
        if (K->collapse > 1) str_putf(o, " collapse(%d)", K->collapse);
        str_putf(o, "%s\n", with_simd ? " simd" : "");
        if (with_simd) return;
    }
    if (!row_nest && j == 0 && K->full_par) {
        str_putf(o, "%*s#pragma omp parallel for%s%s\n", ind, "", innermost ? " simd" : "", cl);
        return;
    }
    if (simd) str_putf(o, "%*s#pragma omp simd%s%s\n", ind, "", len, cl);
}

static void loop_header(KGen *K, Str *o, int L, bool innermost, int ind) {
    const Loop *l = &K->loop[L];
    str_putf(o, "%*sfor (int64_t %s = %s; %s < ", ind, "", l->name, l->lo ? l->lo : "0", l->name);
    if (l->hi) str_putf(o, "%s", l->hi);
    else str_putf(o, "%lld", (long long)l->extent);
    if (l->step == 1) str_putf(o, "; %s++) {", l->name);
    else str_putf(o, "; %s += %lld) {", l->name, (long long)l->step);
    str_putf(o, "%s\n", innermost ? "  " CG_INNER_MARK : "");
    K->inner_loops += innermost;
}

/* Loops ids[j..n-1] of a nest whose first body is level level0 + 1, around
 * their bodies, at indentation ind. row_guard opens the row level's body.
 * A reduction whose stages run no loops of their own (every reduced extent
 * is 1) has its guarded loads in the row nest's last loop, and that loop
 * gets `omp simd` as an innermost one would (see emit_branch): without it
 * GCC 12 -O3 vectorized such a nest wrongly too (fuzz-diff seed
 * 1796004187422012: layer_norm over a dim of 1 of a concat; reduced in
 * tests/test_fused.c, fused_guarded_outer_loop). */
static void nest_text(KGen *K, Str *o, bool row_nest, const int *ids, int j, int n, int level0,
                      int ind, const char *row_guard) {
    if (j == n) return;
    bool innermost = j == n - 1 && (!row_nest || K->k->kind == KK_POINTWISE);
    bool row_simd = row_nest && j == n - 1 && !innermost && K->row_guarded && K->stage_loops == 0 &&
                    (j >= K->collapse || K->collapse == 1);   /* not inside collapse(2+) */
    int level = level0 + j + 1;
    Loop *l = &K->loop[ids[j]];
    /* a row stage's streamed stores per vector (stream_store): the loop in
     * groups of CG_LANES, each stored out as soon as computed */
    bool vgroup = !row_nest && innermost && K->st.vloop == ids[j] && !l->lo && !l->hi &&
                  l->step == 1 && !K->full_par && !str_get(&K->clauses)[0];
    const char *g = vgroup ? pool_printf(K->g->pool, "%sv", l->name) : NULL;
    if (vgroup) {
        str_putf(o, "%*sfor (int64_t %s = 0; %s < %lld; %s += %d) {\n", ind, "", g, g,
                 (long long)l->extent, g, CG_LANES);
        l->lo = g;
        l->hi = pool_printf(K->g->pool, "%s + %d", g, CG_LANES);
        ind += 4;
    }
    loop_pragmas(K, o, row_nest, j, n, ids[j], innermost, ind, row_simd);
    loop_header(K, o, ids[j], innermost, ind);
    if (row_nest && level == K->npl && row_guard) put_indented(o, row_guard, ind + 4);
    put_indented(o, str_get(&K->block[level]), ind + 4);
    nest_text(K, o, row_nest, ids, j + 1, n, level0, ind + 4, row_guard);
    str_putf(o, "%*s}\n", ind, "");
    if (innermost && row_nest && K->st.on) put_indented(o, str_get(&K->post), ind);
    if (vgroup) {
        put_indented(o, str_get(&K->st.vpost), ind);
        str_putf(o, "%*s}\n", ind - 4, "");
        l->lo = l->hi = NULL;
        K->st.vdone = true;
    }
}

/* ===== stages ============================================================================ */

/* A stage's loops ids[0..n) open, with no strided load or reduction seen
 * yet. */
static void open_stage(KGen *K, const int *ids, int n) {
    open_nest(K, ids, n);
    K->strided = false;
    K->far = false;
    K->guarded = false;
    K->has_red = false;
}

/* An inner stage runs the reduced loops (and, in an outer reduction, the
 * moved parallel loop below them); a row step runs nothing, or the moved
 * loop. */
static void begin_stage(KGen *K, StageKind kind) {
    int ids[MAXL + 1], n = 0;
    if (kind == STAGE_INNER && K->k->kind == KK_REDUCTION)
        for (int j = 0; j < K->nrl; j++) ids[n++] = K->rl[j];
    if (K->outer.xin >= 0) ids[n++] = K->outer.xin;
    open_stage(K, ids, n);
}

/* Close a stage: its loops go into the row body, its values die. */
static void end_stage(KGen *K) {
    K->lane.index = NULL;
    K->stage_loops += K->nsn > 0;
    K->row_guarded |= K->nsn == 0 && K->guarded;
    if (K->nsn > 0) {
        nest_text(K, &K->block[K->npl], false, K->snest, 0, K->nsn, K->npl, 0, NULL);
        for (int l = K->npl + 1; l <= K->npl + K->nsn; l++) {
            str_init(&K->block[l], K->g->pool);
            K->epoch[l]++;
        }
    }
    if (!K->st.vdone) put_indented(&K->block[K->npl], str_get(&K->st.post), 0);
    put_indented(&K->block[K->npl], str_get(&K->post), 0);
    str_init(&K->post, K->g->pool);
    str_init(&K->st.post, K->g->pool);
    str_init(&K->st.vpost, K->g->pool);
    K->st.vloop = -1;
    K->st.vdone = false;
    str_init(&K->clauses, K->g->pool);
    open_nest(K, NULL, 0);
}

static void gen_member(KGen *K, int i) {
    if (member_buf(K, i)->body == BODY_REDUCTION) gen_reduction_member(K, i);
    else gen_pointwise_member(K, i);
}

/* Outer reduction: the inner stage, then one loop over the block holding
 * the reductions' stores and every row step. */
static void gen_outer_stages(KGen *K) {
    const Kernel *k = K->k;
    begin_stage(K, STAGE_INNER);
    for (int i = 0; i < k->n; i++)
        if (k->stage[i] == 0) gen_member(K, i);
    end_stage(K);
    begin_stage(K, STAGE_ROW);
    for (int j = 0; j < K->outer.n; j++) finish_outer_reduction(K, K->outer.members[j]);
    for (int i = 0; i < k->n; i++)
        if (k->stage[i] > 0) gen_member(K, i);
    end_stage(K);
}

/* The next row's loads of the first inner stage (if this is not the row
 * loop's last iteration): the whole row before the second stage, or, when
 * that stage runs in blocks (spread_stage), the block's part of it at the
 * start of each block. */
static void row_prefetch(KGen *K, int r, int blk) {
    Pool *P = K->g->pool;
    const Loop *row = &K->loop[K->pnest[K->npl - 1]];
    const char *next = pool_printf(P, "%s + 1", row->name);
    const char *at = blk < 0 ? "0" : K->loop[blk].name, *n;
    if (blk < 0)
        n = pool_printf(P, "%lld", (long long)K->k->rnumel);
    else
        n = pool_printf(P, "%s + %d < %lld ? %d : %lld - %s", at, CG_ROW_PF_BLOCK,
                        (long long)K->loop[r].extent, CG_ROW_PF_BLOCK, (long long)K->loop[r].extent, at);
    for (int i = 0; i < K->pf.n; i++) {
        const char *p = subst_ident(P, subst_ident(P, K->pf.addr[i], K->loop[r].name, at), row->name, next);
        line(K, blk < 0 ? K->npl : K->npl + 1, "if (%s < %lld) kiln_prefetch(%s, %s);", next,
             (long long)row->extent, p, n);
    }
    K->pf.n = 0;
}

/* The second inner stage of a row kernel with row prefetch runs its loop
 * in blocks of CG_ROW_PF_BLOCK, each asking for its part of the next row
 * (see KGen): one reduced loop, longer than a block, and no member of the
 * stage stored to memory (a stored one streams whole rows). Returns the
 * block loop, or -1 (the stage runs as usual). */
static int spread_stage(KGen *K, int st) {
    if (K->nrl != 1 || K->nloops >= MAXL + 1) return -1;
    int r = K->rl[0];
    if (K->loop[r].lo || K->loop[r].step != 1 || K->loop[r].extent <= CG_ROW_PF_BLOCK) return -1;
    for (int i = 0; i < K->k->n; i++)
        if (K->k->stage[i] == st && K->k->store[i] == STORE_GLOBAL) return -1;
    int b = split_loop(K, r, CG_ROW_PF_BLOCK);
    bool red = false;
    for (int i = 0; i < K->k->n; i++)
        red |= K->k->stage[i] == st && member_buf(K, i)->body == BODY_REDUCTION;
    if (!red || K->loop[r].extent % CG_LANES || K->nloops >= MAXL || K->npl + 3 > MAXL) {
        int ids[2] = {b, r};
        open_stage(K, ids, 2);
        return b;
    }
    /* Its reductions in CG_LANES lanes, each its own accumulator across the
     * blocks: an `omp simd` reduction per block combined its vector into
     * the row's scalar one lane at a time, 16 dependent adds per block
     * (softmax over 8192x4096, generated kernels, interleaved best of 27:
     * 22.9-23.6 -> 22.3-22.8 ms at 1 thread, 11.7-11.8 -> 11.4 ms at 2;
     * layer_norm unchanged). Inside a block, groups of CG_LANES: r0 runs
     * r0v .. r0v + 16, a constant count GCC makes one vector of. */
    const char *rn = K->loop[r].name;
    int v = new_loop(K, pool_printf(K->g->pool, "%sv", rn), K->loop[r].extent);
    K->loop[v].lo = K->loop[b].name;
    K->loop[v].hi = K->loop[r].hi;
    K->loop[v].step = CG_LANES;
    K->loop[r].lo = K->loop[v].name;
    K->loop[r].hi = pool_printf(K->g->pool, "%s + %d", K->loop[v].name, CG_LANES);
    int ids[3] = {b, v, r};
    open_stage(K, ids, 3);
    K->lane.index = pool_printf(K->g->pool, "%s - %s", rn, K->loop[v].name);
    return b;
}

static void gen_stages(KGen *K) {
    const Kernel *k = K->k;
    if (k->kind == KK_POINTWISE) {
        begin_stage(K, STAGE_INNER);
        for (int i = 0; i < k->n; i++) gen_member(K, i);
        for (int i = 0; K->st.prefetch && i < K->pf.n; i++)   /* the tile loop's body */
            line(K, K->npl - 1, "%s", K->pf.addr[i]);
        K->pf.n = 0;
        return;   /* the loops are assembled with the function */
    }
    if (K->outer.xin >= 0) {
        gen_outer_stages(K);
        return;
    }
    int inner = 0;
    for (int st = 0; st < k->nstages; st++) inner += k->stage_kind[st] == STAGE_INNER;
    const Loop *row = K->npl ? &K->loop[K->pnest[K->npl - 1]] : NULL;
    bool pf = inner >= 2 && row && !row->lo && row->step == 1 && row->extent > 1 && K->rp.n == 1 &&
              !K->epi.on && k->stage_kind[0] == STAGE_INNER;
    int seen = 0;
    for (int st = 0; st < k->nstages; st++) {
        begin_stage(K, k->stage_kind[st]);
        int blk = -1;
        if (k->stage_kind[st] == STAGE_INNER && seen++ == 1 && pf && K->pf.n) {
            blk = spread_stage(K, st);
            row_prefetch(K, K->rl[0], blk);
        }
        K->pf.record = pf && st == 0 && K->nsn == 1 && !K->loop[K->innermost].lo;
        for (int p = 0; p < K->rp.n; p++) {
            pair_row(K, p);
            for (int i = 0; i < k->n; i++)
                if (k->stage[i] == st) gen_member(K, i);
        }
        pair_row(K, 0);
        end_stage(K);
        if (blk >= 0) K->loop[K->rl[0]].lo = K->loop[K->rl[0]].hi = NULL;   /* whole again */
    }
}

/* ===== functions ========================================================================= */

static void kernel_comment(KGen *K, Str *o) {
    const Kernel *k = K->k;
    Gen *g = K->g;
    str_putf(o, "/*\n * %s: %s over [", k->kernel, kernel_kind_name[k->kind]);
    for (int d = 0; d < k->np; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->P[d]);
    str_putf(o, "]");
    if (k->kind == KK_REDUCTION) {
        str_putf(o, " x reduced [");
        for (int d = 0; d < k->nr; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->R[d]);
        str_putf(o, "], %d stage%s", k->nstages, k->nstages == 1 ? "" : "s");
    }
    if (K->outer.xin >= 0)
        str_putf(o, ", outer reduction (blocks of %lld)", (long long)K->loop[K->pnest[K->npl - 1]].step);
    if (K->rp.n == 2) str_putf(o, ", row pairs");
    str_putf(o, "%s\n * origins:", is_parallel(K) ? ", parallel" : "");
    for (int i = 0; i < k->norigins; i++) str_putf(o, " %s", k->origins[i]);
    str_putf(o, "\n");
    for (int i = 0; i < k->n; i++) {
        const Buffer *b = member_buf(K, i);
        str_putf(o, " *   %s -> %s: %s", snode(g, k->members[i])->name, g->bufname[b->id],
                 b->body == BODY_REDUCTION ? rop_name[b->rop] : b->body == BODY_RAND ? "rand" : "pointwise");
        if (k->kind == KK_REDUCTION)
            str_putf(o, ", stage %d (%s)", k->stage[i], k->stage_kind[k->stage[i]] == STAGE_INNER ? "inner" : "row");
        str_putf(o, ", %s\n", store_name[k->store[i]]);
    }
    str_putf(o, " */\n");
}

static void signature(KGen *K, Str *o, bool returns_int) {
    Gen *g = K->g;
    str_putf(o, "static %s %s%s(", returns_int ? "int" : "void", g->prefix, K->k->kernel);
    bool first = true;
    for (int b = 0; b < g->p->nbufs; b++) {
        if (!K->use[b]) continue;
        str_putf(o, "%s%sfloat *restrict %s", first ? "" : ", ",
                 K->use[b] & USE_WRITE ? "" : "const ", g->bufname[b]);
        first = false;
    }
    str_putf(o, "%s)\n", first ? "void" : "");
}

static bool scratch_on_stack(const Scratch *s) {
    return s->n * (int64_t)sizeof(float) <= CG_STACK_SCRATCH;
}

static bool needs_malloc(const KGen *K) {
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i])) return true;
    return false;
}

static void scratch_frees(KGen *K, Str *o, int ind) {
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i])) str_putf(o, "%*sfree(%s);\n", ind, "", K->scratch[i].name);
}

/* Scratch rows: on the stack, or malloc'd; all allocations are made before
 * any is checked, so a failure frees what it got. */
static void scratch_decls(KGen *K, Str *o, int ind, bool in_region) {
    Str any;
    str_init(&any, K->g->pool);
    for (int i = 0; i < K->nscratch; i++) {
        const Scratch *s = &K->scratch[i];
        if (scratch_on_stack(s)) {
            str_putf(o, "%*sfloat %s[%lld];\n", ind, "", s->name, (long long)s->n);
            continue;
        }
        str_putf(o, "%*sfloat *%s = malloc(%lld * sizeof(float));\n", ind, "", s->name, (long long)s->n);
        str_putf(&any, "%s!%s", any.n ? " || " : "", s->name);
    }
    if (!any.n) return;
    str_putf(o, "%*sif (%s) {\n", ind, "", str_get(&any));
    if (in_region) {
        str_putf(o, "%*s#pragma omp atomic write\n%*sfailed = 1;\n", ind + 4, "", ind + 4, "");
    } else {
        scratch_frees(K, o, ind + 4);
        str_putf(o, "%*sreturn 1;\n", ind + 4, "");
    }
    str_putf(o, "%*s}\n", ind, "");
}


/* The row loop nest inside an explicit parallel region: each thread
 * allocates its scratch rows once; a thread without them skips its rows and
 * the kernel reports the failure. */
static void region_text(KGen *K, Str *o) {
    bool mal = needs_malloc(K);
    if (mal) str_putf(o, "    int failed = 0;\n");
    str_putf(o, "    #pragma omp parallel\n    {\n");
    scratch_decls(K, o, 8, true);
    Str guard;
    str_init(&guard, K->g->pool);
    for (int i = 0; i < K->nscratch; i++)
        if (!scratch_on_stack(&K->scratch[i]))
            str_putf(&guard, "if (!%s) continue;   /* this thread has no scratch (reported) */\n",
                     K->scratch[i].name);
    nest_text(K, o, true, K->pnest, 0, K->npl, 0, 8, mal ? str_get(&guard) : NULL);
    if (K->st.used) str_putf(o, "        kiln_stream_fence();\n");
    scratch_frees(K, o, 8);
    str_putf(o, "    }\n");
    if (mal) str_putf(o, "    return failed;\n");
}

static void function_text(KGen *K, Str *o) {
    Str body;
    str_init(&body, K->g->pool);
    put_indented(&body, str_get(&K->block[0]), 4);
    bool returns_int = needs_malloc(K);
    if (has_scratch_region(K)) {
        region_text(K, &body);
    } else {
        scratch_decls(K, &body, 4, false);
        nest_text(K, &body, true, K->pnest, 0, K->npl, 0, 4, NULL);
        if (K->st.used) str_putf(&body, "    kiln_stream_fence();\n");
        scratch_frees(K, &body, 4);
        if (returns_int) str_putf(&body, "    return 0;\n");
    }
    kernel_comment(K, o);
    signature(K, o, returns_int);
    str_putf(o, "{\n%s}\n\n", str_get(&body));
}

static CgCall make_call(Gen *g, int kidx, const uint8_t *use, bool parallel, int inner) {
    CgCall c = {.name = g->s->kernels[kidx].kernel, .kernel = kidx, .parallel = parallel,
                .inner_loops = inner};
    c.bufs = pool_alloc(g->pool, sizeof(int) * (size_t)(g->p->nbufs + 1));
    c.writes = pool_alloc(g->pool, sizeof(bool) * (size_t)(g->p->nbufs + 1));
    for (int b = 0; b < g->p->nbufs; b++)
        if (use[b]) {
            c.bufs[c.nbufs] = b;
            c.writes[c.nbufs++] = (use[b] & USE_WRITE) != 0;
        }
    return c;
}

/* Generate kernel kidx; true when its function returns a status (it
 * mallocs row scratch). */
static bool gen_kernel(Gen *g, int kidx) {
    KGen *K = pool_alloc(g->pool, sizeof *K);
    K->g = g;
    K->k = &g->s->kernels[kidx];
    setup_kernel(K);
    gen_stages(K);
    function_text(K, &g->out);
    g->calls[kidx] = make_call(g, kidx, K->use, is_parallel(K), K->inner_loops);
    return needs_malloc(K);
}

/* ===== extern epilogues ================================================================ */

/* The members after the extern, as a pointwise kernel of their own: they
 * iterate the extern's output space (the scheduler's rule), and read the
 * library's output as `out` with its write index. */
static Kernel *epilogue_kernel(Gen *g, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    Kernel *e = pool_alloc(g->pool, sizeof *e);
    *e = *k;
    e->kind = KK_POINTWISE;
    e->kernel = pool_printf(g->pool, "epi_%d", kidx);
    e->n = k->n - 1;
    e->members = k->members + 1;
    e->stage = k->stage + 1;
    e->store = k->store + 1;
    e->nr = 0;
    e->rnumel = 1;
    e->nstages = 1;
    return e;
}

static void epilogue_comment(KGen *K, Str *o, const Kernel *ext, const Epi *e) {
    Gen *g = K->g;
    const Kernel *k = K->k;
    str_putf(o, "/*\n * %s%s: epilogue of %s (%s) over [", g->prefix, k->kernel, ext->kernel,
             snode(g, ext->members[0])->name);
    for (int d = 0; d < k->np; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)k->P[d]);
    str_putf(o, "], run by the library on each output\n * block it has just computed, "
                "elements [start, start + count) of out\n * origins:");
    for (int i = 0; i < ext->norigins; i++) str_putf(o, " %s", ext->origins[i]);
    str_putf(o, "\n *   out: %s, written by %s\n", g->bufname[e->target], ext->kernel);
    for (int i = 0; i < k->n; i++) {
        int b = snode(g, k->members[i])->buf;
        str_putf(o, " *   %s -> %s: pointwise, %s%s\n", snode(g, k->members[i])->name,
                 g->bufname[b], store_name[k->store[i]], b == e->target ? " in place (out)" : "");
    }
    str_putf(o, " */\n");
}

/* The function and its callback for the library: `epi(out, start, count,
 * buffers...)` and `epi_cb(ctx, c, start, count)`, ctx being kiln_entry's
 * bufs. */
static void epilogue_text(KGen *K, Str *o, const Kernel *ext, const Epi *e) {
    Gen *g = K->g;
    Str body, args;
    str_init(&body, g->pool);
    str_init(&args, g->pool);
    epilogue_comment(K, o, ext, e);
    str_putf(o, "static void %s%s(float *restrict out, int64_t start, int64_t count", g->prefix,
             K->k->kernel);
    for (int b = 0; b < g->p->nbufs; b++) {
        if (!e->use[b]) continue;
        str_putf(o, ", %sfloat *restrict %s", e->use[b] & USE_WRITE ? "" : "const ", g->bufname[b]);
        str_putf(&args, ", bufs[%d]", b);
    }
    str_putf(o, ")\n{\n");
    if (K->npl == 0) str_putf(&body, "    if (start > 0 || count < 1) return;   /* one element */\n");
    put_indented(&body, str_get(&K->block[0]), 4);
    nest_text(K, &body, true, K->pnest, 0, K->npl, 0, 4, NULL);
    str_putf(o, "%s}\n\n", str_get(&body));
    str_putf(o, "static void %s%s_cb(void *ctx, float *c, int64_t start, int64_t count)\n{\n"
                "    float *const *bufs = ctx;\n    (void)bufs;\n"
                "    %s%s(c, start, count%s);\n}\n\n",
             g->prefix, K->k->kernel, g->prefix, K->k->kernel, str_get(&args));
}

/* An extern kernel's epilogue members become a function the library calls
 * on each output block. The library writes the extern's own buffer when
 * something else reads it, else the buffer of the last member (always
 * stored: nothing in the kernel reads it), which the epilogue then
 * overwrites in place, element by element: each element is read before it
 * is written, at the same index. */
static void gen_epilogue(Gen *g, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    Epi *e = &g->epi[kidx];
    int ext = snode(g, k->members[0])->buf, last = snode(g, k->members[k->n - 1])->buf;
    if (k->store[k->n - 1] != STORE_GLOBAL) cg_fail(g, "codegen: %s: last member not stored", k->kernel);
    e->target = k->store[0] == STORE_GLOBAL ? ext : last;
    const char *names[2] = {g->bufname[ext], g->bufname[e->target]};
    g->bufname[ext] = g->bufname[e->target] = "out";
    KGen *K = pool_alloc(g->pool, sizeof *K);
    K->g = g;
    K->k = epilogue_kernel(g, kidx);
    K->epi.on = true;
    setup_kernel(K);
    gen_stages(K);
    g->bufname[ext] = names[0];
    g->bufname[e->target] = names[1];
    e->use = K->use;
    e->use[ext] = e->use[e->target] = 0;
    e->fn = pool_printf(g->pool, "%s%s", g->prefix, K->k->kernel);
    epilogue_text(K, &g->out, k, e);
    g->calls[kidx].inner_loops = K->inner_loops;
}

/* ===== extern calls and the entry point =============================================== */

static void view_text(Gen *g, Str *o, const char *name, const BufView *v) {
    str_putf(o, "        static const KilnView %s = {%d, {", name, v->rank);
    for (int d = 0; d < v->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)v->shape[d]);
    str_putf(o, "%s}, {", v->rank ? "" : "0");   /* a scalar: {0}, not {} */
    for (int d = 0; d < v->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)v->stride[d]);
    str_putf(o, "%s}, %lld};\n", v->rank ? "" : "0", (long long)v->offset);
    (void)g;
}

static bool view_dense(const BufView *v) {
    int64_t s = 1;
    for (int d = v->rank - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != s) return false;
        s *= v->shape[d];
    }
    return true;
}

/* Conv operands: dense ones are passed as they are; others are packed
 * into malloc'd copies (all allocated before any is used, so a failure
 * frees what it got). */
typedef struct {
    Str allocs, packs, frees;
    Str any_null;
    int n;
} Packs;

static const char *conv_operand(Gen *g, Str *o, const BufView *v, int k, Packs *pk) {
    if (view_dense(v)) {
        if (!v->offset) return pool_printf(g->pool, "bufs[%d]", v->buf);
        return pool_printf(g->pool, "bufs[%d] + %lld", v->buf, (long long)v->offset);
    }
    const char *vn = pool_printf(g->pool, "v%d", k), *name = pool_printf(g->pool, "pk%d", k);
    view_text(g, o, vn, v);
    str_putf(&pk->allocs, "        float *%s = malloc(%lld * sizeof(float));\n", name,
             (long long)util_numel(v->rank, v->shape));
    str_putf(&pk->any_null, "%s!%s", pk->n ? " || " : "", name);
    str_putf(&pk->packs, "        kiln_pack(bufs[%d], &%s, %s);\n", v->buf, vn, name);
    str_putf(&pk->frees, "        free(%s);\n", name);
    pk->n++;
    return name;
}

static void shape4(Str *o, const char *name, const int64_t *s) {
    str_putf(o, "        static const int64_t %s[4] = {%lld, %lld, %lld, %lld};\n", name,
             (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
}

/* The KilnRT entry of a conv: conv2d_const when its weight is a weight
 * buffer passed as it is (dense), so its address and data are the same on
 * every call and the library may keep the weight in its own layout; never
 * for a runtime input, a computed buffer or a packed copy. */
static const char *conv_entry(const Gen *g, const Buffer *b) {
    const BufView *w = &b->opnd[1];
    if (b->ext_op == OP_CONV2D && buf_of(g, w->buf)->body == BODY_WEIGHT && view_dense(w))
        return "conv2d_const";
    return op_info[b->ext_op].name;
}

static void conv_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    Packs pk = {.n = 0};
    str_init(&pk.allocs, g->pool), str_init(&pk.packs, g->pool);
    str_init(&pk.frees, g->pool), str_init(&pk.any_null, g->pool);
    const char *x = conv_operand(g, o, &b->opnd[0], 0, &pk);
    const char *w = conv_operand(g, o, &b->opnd[1], 1, &pk);
    const char *bias = b->nopnds > 2 ? conv_operand(g, o, &b->opnd[2], 2, &pk) : "NULL";
    shape4(o, "xs", b->opnd[0].shape);
    shape4(o, "ws", b->opnd[1].shape);
    shape4(o, "ys", b->shape);
    str_putf(o, "        static const int64_t attr[%d] = {", b->nattr);
    for (int i = 0; i < b->nattr; i++) str_putf(o, "%s%lld", i ? ", " : "", (long long)b->attr[i]);
    str_putf(o, "};\n");
    if (pk.n) {
        str_putf(o, "%s        if (%s) {\n", str_get(&pk.allocs), str_get(&pk.any_null));
        put_indented(o, str_get(&pk.frees), 4);
        str_putf(o, "            return 1;\n        }\n%s", str_get(&pk.packs));
    }
    str_putf(o, "        int rc = rt->%s(%s, xs, %s, ws, %s, %s, ys, attr, %s);\n",
             conv_entry(g, b), x, w, bias, out, epi);
    str_putf(o, "%s        if (rc) return 1;\n", str_get(&pk.frees));
}

static void mm_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    view_text(g, o, "a", &b->opnd[0]);
    view_text(g, o, "b", &b->opnd[1]);
    str_putf(o, "        static const int64_t shape[%d] = {", b->rank > 0 ? b->rank : 1);
    for (int d = 0; d < b->rank; d++) str_putf(o, "%s%lld", d ? ", " : "", (long long)b->shape[d]);
    str_putf(o, "%s};\n", b->rank ? "" : "1");
    str_putf(o, "        if (rt->mm(bufs[%d], &a, bufs[%d], &b, %s, %d, shape, %s)) return 1;\n",
             b->opnd[0].buf, b->opnd[1].buf, out, b->rank, epi);
}

/* A gather's index can be out of range: its message goes to rt->err and
 * the entry returns KILN_RT_ERR_INPUT. */
static void gather_call(Gen *g, Str *o, const Buffer *b, const char *out, const char *epi) {
    view_text(g, o, "d", &b->opnd[0]);
    view_text(g, o, "ix", &b->opnd[1]);
    str_putf(o, "        int rc = rt->gather(bufs[%d], &d, bufs[%d], &ix, %d, %s, %s, rt->err, "
             "rt->errlen);\n", b->opnd[0].buf, b->opnd[1].buf, (int)b->attr[0], out, epi);
    str_putf(o, "        if (rc) return rc == %d ? %d : 1;\n", EXT_ERR_INPUT, KILN_RT_ERR_INPUT);
}

/* The library call of extern kernel kidx; with an epilogue it writes the
 * epilogue's target and calls <prefix>epi_<k>_cb on each block. */
static void extern_call(Gen *g, Str *o, int kidx) {
    const Kernel *k = &g->s->kernels[kidx];
    const Buffer *b = buf_of(g, snode(g, k->members[0])->buf);
    const Epi *e = &g->epi[kidx];
    if (k->n > 1 && !e->fn) cg_fail(g, "codegen: extern kernel %s has no epilogue", k->kernel);
    uint8_t *use = pool_alloc(g->pool, (size_t)g->p->nbufs + 1);
    int target = e->fn ? e->target : b->id;
    str_putf(o, "    {   /* %s = %s(", g->bufname[target], k->kernel);
    for (int i = 0; i < b->nopnds; i++) {
        str_putf(o, "%s%s", i ? ", " : "", g->bufname[b->opnd[i].buf]);
        use[b->opnd[i].buf] |= USE_READ;
    }
    str_putf(o, ")%s%s */\n", e->fn ? ", epilogue " : "", e->fn ? e->fn : "");
    for (int i = 0; e->fn && i < g->p->nbufs; i++) use[i] |= e->use[i];
    use[target] |= USE_WRITE;
    const char *out = pool_printf(g->pool, "bufs[%d]", target);
    const char *epi = e->fn ? pool_printf(g->pool, "%s_cb, (void *)bufs", e->fn) : "NULL, NULL";
    if (b->ext_op == OP_CONV2D || b->ext_op == OP_CONV_TRANSPOSE2D) conv_call(g, o, b, out, epi);
    else if (b->ext_op == OP_GATHER) gather_call(g, o, b, out, epi);
    else if (b->ext_op == OP_MATMUL) mm_call(g, o, b, out, epi);
    else cg_fail(g, "codegen: unknown extern %s", op_info[b->ext_op].name);
    str_putf(o, "    }\n");
    g->calls[kidx] = make_call(g, kidx, use, false, g->calls[kidx].inner_loops);
}

static void entry_text(Gen *g, const bool *returns_int) {
    Str o;
    str_init(&o, g->pool);
    str_putf(&o, "/* The program: every kernel and extern kernel in call order. */\n");
    str_putf(&o, "int %skiln_entry(float *const *bufs, const KilnRT *rt)\n{\n", g->prefix);
    bool externs = false;
    for (int k = 0; k < g->s->nkernels; k++) externs |= g->s->kernels[k].kind == KK_EXTERN;
    if (!externs) str_putf(&o, "    (void)rt;\n");
    for (int k = 0; k < g->s->nkernels; k++) {
        const CgCall *c = &g->calls[k];
        if (g->s->kernels[k].kind == KK_EXTERN) {
            extern_call(g, &o, k);
            continue;
        }
        str_putf(&o, "    %s%s%s(", returns_int[k] ? "if (" : "", g->prefix, c->name);
        for (int i = 0; i < c->nbufs; i++) str_putf(&o, "%sbufs[%d]", i ? ", " : "", c->bufs[i]);
        str_putf(&o, ")%s   /*", returns_int[k] ? ") return 1;" : ";");
        for (int i = 0; i < c->nbufs; i++) str_putf(&o, " %s", g->bufname[c->bufs[i]]);
        str_putf(&o, " */\n");
    }
    str_putf(&o, "    return 0;\n}\n");
    str_putf(&g->out, "%s", str_get(&o));
}

/* ===== entry points ======================================================================= */

/* The prelude goes before the kernels once they are written: a program
 * that calls no sine or cosine tells vecmath.h to leave out their vector
 * variants, which are compiled into every kernel that has them (about 0.1 s
 * of a cold compile); one without exp or tanh (tanh calls kiln_expf)
 * leaves out exp's AVX-512 variants (30 ms), one without gelu gelu's. */
static void prepend_prelude(Gen *g) {
    const char *body = str_get(&g->out);
    if ((g->status = pasted_headers(&g->owned_vm, g->err, g->errlen)) != KILN_OK)
        longjmp(g->jb, 2);
    bool trig = strstr(body, "kiln_sinf_v(") || strstr(body, "kiln_cosf_v(");
    bool exp = strstr(body, "kiln_expf_v(") || strstr(body, "kiln_tanhf_v(");
    bool gelu = strstr(body, "kiln_gelu_v(");
    Str o;
    str_init(&o, g->pool);
    str_putf(&o, "%s%s%s%s%s\n%s\n%s", prelude_head,
             trig ? "" : "#define KILN_VM_NO_TRIG_DISPATCH 1 /* no sin or cos here */\n",
             exp ? "" : "#define KILN_VM_NO_EXP_DISPATCH 1 /* no exp or tanh here */\n",
             gelu ? "" : "#define KILN_VM_NO_GELU_DISPATCH 1 /* no gelu here */\n",
             g->owned_vm, prelude_tail, body);
    g->out = o;
    kfree(g->owned_vm);
    g->owned_vm = NULL;
    g->status = KILN_ERR_INPUT;
}

static void generate(Gen *g) {
    name_buffers(g);
    g->calls = pool_alloc(g->pool, sizeof(CgCall) * (size_t)(g->s->nkernels + 1));
    bool *returns_int = pool_alloc(g->pool, sizeof(bool) * (size_t)(g->s->nkernels + 1));
    str_putf(&g->out, "/* ===== kernels%s%s ===== */\n\n", *g->prefix ? ": " : "", g->prefix);
    g->epi = pool_alloc(g->pool, sizeof(Epi) * (size_t)(g->s->nkernels + 1));
    for (int k = 0; k < g->s->nkernels; k++) {
        if (g->s->kernels[k].kind == KK_EXTERN) {
            if (g->s->kernels[k].n > 1) gen_epilogue(g, k);
            continue;
        }
        returns_int[k] = gen_kernel(g, k);
    }
    entry_text(g, returns_int);
    if (!g->no_prelude) prepend_prelude(g);
}

kiln_status cg_generate_opts(const Schedule *s, const CgOptions *opt, CgOutput *out, char *err,
                             size_t errlen) {
    static const CgOptions none = {NULL, false, false};
    const CgOptions *o = opt ? opt : &none;
    memset(out, 0, sizeof *out);
    if (errlen) err[0] = 0;
    Gen *g = kcalloc(1, sizeof *g);
    if (!g) {
        util_fmt(err, errlen, "out of memory");
        return KILN_ERR_NOMEM;
    }
    g->pool = &out->pool;
    g->s = s;
    g->p = s->prog;
    g->err = err;
    g->errlen = errlen;
    g->prefix = o->prefix ? o->prefix : "";
    g->no_prelude = o->no_prelude;
    g->double_acc = o->double_acc;
    g->status = KILN_ERR_INPUT;
    str_init(&g->out, g->pool);
    out->pool.oom = &g->jb;
    int r = setjmp(g->jb);
    if (r) {
        kiln_status st = r == 1 ? KILN_ERR_NOMEM : g->status;
        if (r == 1) util_fmt(err, errlen, "out of memory");
        kfree(g->owned_vm);
        kfree(g);
        cg_free(out);
        return st;
    }
    generate(g);
    out->source = str_get(&g->out);
    out->len = g->out.n;
    out->entry = pool_printf(g->pool, "%skiln_entry", g->prefix);
    out->ncalls = s->nkernels;
    out->calls = g->calls;
    out->pool.oom = NULL;
    kfree(g);
    return KILN_OK;
}

kiln_status cg_generate(const Schedule *s, CgOutput *out, char *err, size_t errlen) {
    return cg_generate_opts(s, NULL, out, err, errlen);
}

void cg_free(CgOutput *out) {
    if (!out) return;
    pool_free(&out->pool);
    memset(out, 0, sizeof *out);
}
