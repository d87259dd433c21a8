/*
 * externs.c -- the library kernels behind kiln's extern ops: matmul through
 * OpenBLAS cblas_sgemm; conv2d through oneDNN (conv_dnnl.c) except 1x1
 * stride-1 convolutions, which are kiln's own GEMM (conv1x1.c; one sgemm
 * per image without AVX-512), and depthwise ones with large planes (direct
 * loops); im2col + sgemm for what oneDNN declines, or everything with
 * ext_set_conv_backend(EXT_CONV_IM2COL).
 *
 * Operands arrive as strided views (ExtView), so a transposed operand is
 * passed to BLAS as a transpose flag with a leading dimension instead of
 * being copied; only a view BLAS cannot express (a non-unit stride in both
 * of the last two dims) is packed into a temporary. A batched matmul whose
 * batches share B is one GEMM over all their rows when A's rows allow it
 * ("batch folding" below).
 *
 * Threads: kiln links the OpenMP build of OpenBLAS (Debian's
 * libopenblas-openmp-dev, chosen by rpath over the pthread build that the
 * alternatives system may point to). Both BLAS and the generated kernels then
 * share one libgomp thread pool sized by omp_set_num_threads, instead of two
 * pools of busy-waiting threads fighting over the same cores. Externs are
 * called from the serial wrapper, never inside a parallel region, so BLAS
 * may use every thread.
 *
 * Epilogues: the pointwise ops fused into an extern call (ExtEpilogue, from
 * the generated code) run on each block of the output right after the
 * library computed it, while the block is still in cache: a matmul's blocks
 * of rows (per batch), a convolution's (image, group) slabs, a depthwise
 * convolution's planes. See "epilogues" below for the block sizes and the
 * threading, both chosen by measurement.
 */
#include "externs/externs.h"
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- OpenBLAS's kernels -----------------------------------------------------
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels from the CPU model
 * when it loads, and falls back to SSE3 "Prescott" kernels on a model it
 * does not know: 0.3.21 does so on this Xeon (family 6, model 207), and
 * sgemm runs about 5x slower than with the SkylakeX kernels the CPU can run.
 * OPENBLAS_CORETYPE fixes it, but OpenBLAS reads it in its constructor,
 * before any of kiln's code runs.
 *
 * So on first use kiln asks OpenBLAS which core it chose; when that is the
 * Prescott fallback, the user did not choose it (OPENBLAS_CORETYPE unset)
 * and the CPU and OS support AVX-512 (F, BW, VL, DQ: SkylakeX) or AVX2+FMA
 * (Haswell), it sets the variable and runs OpenBLAS's own selection again:
 * gotoblas_dynamic_quit() forgets the choice, gotoblas_dynamic_init() reads
 * the variable and initializes the chosen core's parameters, exactly as at
 * load time; then the variable is put back as it was. The same happens
 * when the core in use needs more than the target tier of the first
 * program to call BLAS allows (target.h): under v3 a SkylakeX core becomes
 * Haswell, under v2 any AVX core becomes Nehalem, whoever chose it, so no
 * AVX-512 instruction runs under a v3 target. Both are exported by every
 * DYNAMIC_ARCH build (`nm -D`); they are weak references here, so an
 * OpenBLAS built for one CPU (no such symbols, nothing to fix) links and
 * runs unchanged. Nothing else changes with the core: OpenBLAS allocates
 * its buffers lazily at the build's fixed size and (OpenMP build) has no
 * thread pool of its own. The alternatives were worse: loading OpenBLAS
 * with dlopen would drop the link-time dependency that `make install` and
 * kiln.pc describe and route every cblas call through a pointer; setting
 * the variable and re-executing the process is not a library's business.
 * A core OpenBLAS chose itself is kept: it knows the CPUs it names. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

/* The most a core's kernels use: 2 AVX-512, 1 AVX or AVX2, 0 SSE only. */
static int core_level(const char *core) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx[] = {"Sandybridge", "Haswell", "Zen", "Bulldozer",
                                      "Piledriver", "Steamroller", "Excavator"};
    for (size_t i = 0; core && i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcasecmp(core, avx512[i])) return 2;
    for (size_t i = 0; core && i < sizeof avx / sizeof *avx; i++)
        if (!strcasecmp(core, avx[i])) return 1;
    return 0;
}

const char *ext_blas_core_choice(const char *user, const char *current, unsigned cpu, unsigned cap) {
    int allowed = ext_isa_level(cpu & cap);
    /* above the tier (the user's choice too): the best core the tier allows */
    if (current && core_level(current) > allowed) return allowed == 1 ? "Haswell" : "Nehalem";
    if ((user && *user) || !current || strcasecmp(current, "Prescott") != 0) return NULL;
    if (allowed == 2) return "SkylakeX";
    if (allowed == 1) return "Haswell";
    return NULL;
}

/* This CPU's features, as the OS lets programs use them (target.c reads
 * cpuid and XCR0 for the AVX and AVX-512 state). */
unsigned ext_cpu_features_all(void) { return tgt_ext_of(tgt_cpu_features()); }

int ext_isa_level(unsigned f) { return (f & EXT_CPU_AVX512) ? 2 : (f & EXT_CPU_AVX2) ? 1 : 0; }

/* The cap of the program running on this thread (ext_isa_enter); ~0u
 * outside a run: whatever the CPU has. */
static _Thread_local unsigned isa_cap = ~0u;

unsigned ext_isa_enter(unsigned cap) {
    unsigned prev = isa_cap;
    isa_cap = cap;
    return prev;
}

void ext_isa_leave(unsigned prev) { isa_cap = prev; }

unsigned ext_cpu_features(void) { return ext_cpu_features_all() & isa_cap; }

static void blas_pick_core(unsigned cap) {
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    const char *core = ext_blas_core_choice(getenv("OPENBLAS_CORETYPE"), openblas_get_corename(),
                                            ext_cpu_features_all(), cap);
    if (!core) return;
    /* the user's variable is put back as it was */
    const char *user = getenv("OPENBLAS_CORETYPE");
    char *saved = user ? strdup(user) : NULL;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) { free(saved); return; }
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    if (saved) setenv("OPENBLAS_CORETYPE", saved, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    free(saved);
}

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static bool blas_done;

const char *ext_blas_core(void) {
    ext_blas_init();
    return openblas_get_corename();
}

/* Once per process, before the first BLAS call kiln makes. */
void ext_blas_init(void) {
    if (__atomic_load_n(&blas_done, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&blas_lock);
    if (!blas_done) {
        blas_pick_core(isa_cap);
        __atomic_store_n(&blas_done, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&blas_lock);
}

void ext_set_threads(int n) {
    ext_blas_init();
    if (n < 1) return;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int ext_get_threads(void) { return omp_get_max_threads(); }

/* ---- epilogues --------------------------------------------------------------
 *
 * How big a block, and who runs it. BLAS is a black box: a block of rows is
 * one cblas_sgemm on the sub-matrix, and every call packs all of B again
 * and pays its set-up, so small blocks are expensive. Measured (one thread,
 * OpenBLAS 0.3.21 SkylakeX kernels, CPU time, best of many, square M=N=K):
 * splitting the sgemm into calls of R rows costs over one call
 *
 *     R =          64      128     256     512     1024
 *     n = 512    +20%     +13%     +5%     +2%       -
 *     n = 1024   +43%     +21%     +9%     +4%     +2%
 *     n = 2048   +40%     +22%    +10%     +9%     +4%
 *
 * while a whole second pass over C right after the call, still in the last
 * level cache, costs about 2%. Blocks sized to the L2 (256 KiB of C: 32
 * rows at n = 2048) would cost ten times what they save, so a block is
 * EXT_EPI_BLOCK_BYTES of C (it stays in the last-level cache; a C that fits
 * is one block and one call, exactly as without an epilogue), and at least
 * EXT_EPI_MIN_ROWS rows. Blocking pays where C is larger than the cache,
 * and most for a skinny K, where the library's own write of C is the cost:
 * the epilogue then reads each block from cache instead of memory.
 *
 * Threads: blocks run one after another with BLAS threading inside each
 * sgemm, and the epilogue of a block runs on every thread in pieces of
 * whole rows. The alternative, blocks in parallel each with a one-thread
 * sgemm, makes every thread pack all of B for its block (T times the
 * packing OpenBLAS's threaded sgemm shares among its threads), and its
 * blocks are M/T rows, which the table above prices at 10-20% for T >= 8;
 * it also leaves threads idle when M is not a multiple of the block.
 * Convolution slabs are fixed by im2col (one sgemm per image and group) and
 * get the same treatment; depthwise planes are computed in parallel and
 * each thread runs the epilogue of its plane. */

/* C bytes per matmul block: 16 MiB stays in the last-level cache of the
 * server parts kiln targets (32 MiB and more), beside the packed panels. */
#define EXT_EPI_BLOCK_BYTES ((int64_t)16 << 20)
/* ... but never fewer rows than this (see the table: about 5%). */
#define EXT_EPI_MIN_ROWS 512
/* A block's epilogue runs on all threads from this many elements on (an
 * OpenMP fork costs microseconds, what a core needs for ~32K floats), in
 * pieces of whole rows or planes of at least EXT_EPI_PIECE elements. */
#define EXT_EPI_PARALLEL_MIN 32768
#define EXT_EPI_PIECE 4096

/* Run epi over elements [start, start + count) of c, whose rows (or planes)
 * are `unit` elements: serially when small, else in pieces of whole units
 * shared among the threads. Called outside any parallel region. */
void ext_run_epilogue(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t count,
                      int64_t unit) {
    if (!epi || count <= 0) return;
    if (count < EXT_EPI_PARALLEL_MIN) {
        epi(ctx, c, start, count);
        return;
    }
    int64_t per = unit * ((EXT_EPI_PIECE + unit - 1) / unit), n = (count + per - 1) / per;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int64_t s = start + i * per, e = s + per < start + count ? s + per : start + count;
        epi(ctx, c, s, e - s);
    }
}

/* The epilogue of nslabs consecutive slabs of `slab` elements (an image's
 * groups), each called within its own slab: large slabs one after another,
 * each on every thread; small ones shared among the threads. */
void ext_run_epilogue_slabs(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t nslabs,
                            int64_t slab, int64_t unit) {
    if (!epi) return;
    if (nslabs == 1 || slab >= EXT_EPI_PARALLEL_MIN) {
        for (int64_t i = 0; i < nslabs; i++) ext_run_epilogue(epi, ctx, c, start + i * slab, slab, unit);
        return;
    }
    #pragma omp parallel for schedule(static) if (nslabs * slab >= EXT_EPI_PARALLEL_MIN)
    for (int64_t i = 0; i < nslabs; i++) epi(ctx, c, start + i * slab, slab);
}

/* Rows per block set by a test (ext_set_epilogue_rows); 0: the policy. */
static int64_t forced_rows;

void ext_set_epilogue_rows(int64_t rows) { forced_rows = rows > 0 ? rows : 0; }

/* Rows of C per matmul block (all of them without an epilogue). */
static int64_t block_rows(int64_t M, int64_t N, bool epi) {
    int64_t rows = N > 0 ? EXT_EPI_BLOCK_BYTES / (N * (int64_t)sizeof(float)) : M;
    if (rows < EXT_EPI_MIN_ROWS) rows = EXT_EPI_MIN_ROWS;
    if (forced_rows) rows = forced_rows;
    return !epi || rows > M ? M : rows;
}

/* ---- matmul ---------------------------------------------------------------- */

/* How one 2-D operand slice [rows, cols] reaches BLAS. */
typedef struct {
    const float *p;
    CBLAS_TRANSPOSE trans;
    int64_t ld;
} BlasOperand;

static bool as_blas(const float *p, int64_t rows, int64_t cols, int64_t srow, int64_t scol,
                    BlasOperand *o) {
    o->p = p;
    if (scol == 1 && (srow >= cols || rows == 1)) {
        o->trans = CblasNoTrans;
        o->ld = rows == 1 ? (cols > 1 ? cols : 1) : srow;
        return true;
    }
    if (srow == 1 && (scol >= rows || cols == 1)) {
        o->trans = CblasTrans;
        o->ld = cols == 1 ? (rows > 1 ? rows : 1) : scol;
        return true;
    }
    return false;
}

/* Copy a strided 2-D slice into a dense row-major buffer. */
static void pack(const float *p, int64_t rows, int64_t cols, int64_t srow, int64_t scol,
                 float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = p[r * srow + c * scol];
}

/* Offset of batch index `b` (over out's batch dims) into an operand view. */
static int64_t batch_offset(const ExtView *v, int nb, const int64_t *bshape, int64_t b) {
    int64_t off = v->offset;
    int vb = v->rank - 2;
    for (int d = nb - 1; d >= 0; d--) {
        int64_t i = b % bshape[d];
        b /= bshape[d];
        int vd = d - (nb - vb);
        if (vd >= 0 && v->shape[vd] != 1) off += i * v->stride[vd];
    }
    return off;
}

/* One row of C: a matrix-vector product. sgemm would pack all of B for
 * it, on every call (MobileNetV2's classifier, [1, 1280] @ [1280, 1000]:
 * the packing was 5% of the whole model's run); sgemv reads B once, where
 * it is. */
static bool as_gemv(int64_t M, int64_t N, int64_t K) { return M == 1 && N > 1 && K > 0; }

static bool gemm2d(const float *a, const ExtView *av, const float *b, const ExtView *bv,
                   float *c, int64_t M, int64_t N, int64_t K, float *tmp_a, float *tmp_b) {
    int ra = av->rank, rb = bv->rank;
    BlasOperand A, B;
    if (!as_blas(a, M, K, av->stride[ra - 2], av->stride[ra - 1], &A)) {
        if (!tmp_a) return false;
        pack(a, M, K, av->stride[ra - 2], av->stride[ra - 1], tmp_a);
        A = (BlasOperand){tmp_a, CblasNoTrans, K};
    }
    if (!as_blas(b, K, N, bv->stride[rb - 2], bv->stride[rb - 1], &B)) {
        if (!tmp_b) return false;
        pack(b, K, N, bv->stride[rb - 2], bv->stride[rb - 1], tmp_b);
        B = (BlasOperand){tmp_b, CblasNoTrans, N};
    }
    if (as_gemv(M, N, K)) {
        int inc = A.trans == CblasNoTrans ? 1 : (int)A.ld;
        CBLAS_TRANSPOSE t = B.trans == CblasNoTrans ? CblasTrans : CblasNoTrans;
        bool nt = B.trans == CblasNoTrans;   /* B as stored is [K, N], else [N, K] */
        cblas_sgemv(CblasRowMajor, t, (int)(nt ? K : N), (int)(nt ? N : K), 1.0f, B.p, (int)B.ld,
                    A.p, inc, 0.0f, c, 1);
        return true;
    }
    cblas_sgemm(CblasRowMajor, A.trans, B.trans, (int)M, (int)N, (int)K, 1.0f, A.p, (int)A.ld,
                B.p, (int)B.ld, 0.0f, c, (int)N);
    return true;
}

/* ---- batch folding ----------------------------------------------------------
 *
 * A batched matmul whose B is one matrix for every batch (a 2-D weight, or
 * stride 0 over the batch dims) is a single GEMM of batches * M rows when
 * A's rows, taken batch after batch, are evenly spaced in memory: C is
 * dense, so its rows already follow each other that way. One call packs B
 * once; a call per batch packs it again each time and, for small M, runs
 * sgemm far below its speed. The ONNX encoder (models/export.py) shows it:
 * the sequence-first transpose makes its QKV projection 128 batches of one
 * row, [128, 1, 256] @ [256, 768], 1.93 ms as 128 calls against 0.36 ms as
 * one (one thread; docs/benchmarks.md). A's rows must also suit BLAS as one
 * matrix (as_blas); otherwise the batches run one by one as before. */

/* B's offset is the same for every batch: its batch dims are 1 or stride 0. */
static bool b_shared(const ExtView *bv) {
    for (int d = 0; d < bv->rank - 2; d++)
        if (bv->shape[d] != 1 && bv->stride[d] != 0) return false;
    return true;
}

/* The stride between consecutive rows of A across all batches, or 0 when
 * they are not evenly spaced (or A is broadcast over a batch dim of C). */
static int64_t folded_row_stride(const ExtView *av, int nb, const int64_t *cshape, int64_t M) {
    int vb = av->rank - 2;
    int64_t step = M > 1 ? av->stride[vb] : 0, span = M;   /* step 0: not known yet */
    if (M > 1 && step <= 0) return 0;
    for (int d = nb - 1; d >= 0; d--) {
        if (cshape[d] == 1) continue;
        int vd = d - (nb - vb);
        if (vd < 0 || av->shape[vd] == 1) return 0;
        if (!step) step = av->stride[vd];
        if (av->stride[vd] != step * span) return 0;
        span *= cshape[d];
    }
    return step;
}

/* Rewrite a batched a @ b as 2-D views of batches * M rows; false when the
 * batches cannot be one GEMM. */
static bool fold_batches(const float *a, const ExtView *av, const ExtView *bv, int nb,
                         const int64_t *cshape, ExtView *a2, ExtView *b2) {
    int64_t M = cshape[nb], K = av->shape[av->rank - 1], rows = M;
    for (int d = 0; d < nb; d++) rows *= cshape[d];
    if (rows == M || rows > INT32_MAX || !b_shared(bv)) return false;   /* BLAS takes int */
    int64_t step = folded_row_stride(av, nb, cshape, M), scol = av->stride[av->rank - 1];
    BlasOperand o;
    if (step <= 0 || !as_blas(a ? a + av->offset : NULL, rows, K, step, scol, &o)) return false;
    *a2 = (ExtView){2, {rows, K}, {step, scol}, av->offset};
    *b2 = (ExtView){2, {K, bv->shape[bv->rank - 1]},
                    {bv->stride[bv->rank - 2], bv->stride[bv->rank - 1]}, bv->offset};
    return true;
}

const char *ext_matmul_path(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape) {
    int64_t M = cshape[crank - 2], N = cshape[crank - 1], K = av->shape[av->rank - 1];
    ExtView a2, b2;
    if (crank > 2 && fold_batches(NULL, av, bv, crank - 2, cshape, &a2, &b2)) M = a2.shape[0];
    return as_gemv(M, N, K) ? "OpenBLAS sgemv (one row)" : "OpenBLAS sgemm";
}

bool ext_matmul_folds(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape) {
    ExtView a2, b2;
    return crank > 2 && fold_batches(NULL, av, bv, crank - 2, cshape, &a2, &b2);
}

int ext_matmul_epi(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                   int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx) {
    ext_blas_init();
    ExtView a2, b2;
    int64_t cs2[2];
    if (crank > 2 && fold_batches(a, av, bv, crank - 2, cshape, &a2, &b2)) {
        cs2[0] = a2.shape[0];
        cs2[1] = cshape[crank - 1];
        av = &a2, bv = &b2, cshape = cs2, crank = 2;
    }
    int nb = crank - 2;
    int64_t M = cshape[crank - 2], N = cshape[crank - 1], K = av->shape[av->rank - 1];
    int64_t batches = 1, rows = block_rows(M, N, epi != NULL), arow = av->stride[av->rank - 2];
    for (int d = 0; d < nb; d++) batches *= cshape[d];
    float *ta = NULL, *tb = NULL;
    for (int64_t i = 0; i < batches; i++) {
        const float *pa = a + batch_offset(av, nb, cshape, i);
        const float *pb = b + batch_offset(bv, nb, cshape, i);
        for (int64_t r = 0; r < M; r += rows) {
            int64_t m = rows < M - r ? rows : M - r;
            float *pc = c + (i * M + r) * N;
            if (!gemm2d(pa + r * arow, av, pb, bv, pc, m, N, K, ta, tb)) {
                if (!ta && !(ta = kmalloc(sizeof(float) * (size_t)(M * K)))) goto nomem;
                if (!tb && !(tb = kmalloc(sizeof(float) * (size_t)(K * N)))) goto nomem;
                gemm2d(pa + r * arow, av, pb, bv, pc, m, N, K, ta, tb);
            }
            ext_run_epilogue(epi, ctx, c, (i * M + r) * N, m * N, N);
        }
    }
    kfree(ta);
    kfree(tb);
    return 0;
nomem:
    kfree(ta);
    kfree(tb);
    return -1;
}

int ext_matmul(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
               int crank, const int64_t *cshape) {
    return ext_matmul_epi(a, av, b, bv, c, crank, cshape, NULL, NULL);
}

/* ---- conv2d ---------------------------------------------------------------- */

typedef struct {
    int64_t n, c, h, w;         /* input */
    int64_t o, kh, kw;          /* weight: o x (c/groups) x kh x kw */
    int64_t oh, ow;             /* output spatial */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} ConvShape;

static ConvShape conv_shape(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                            const int64_t attr[7]) {
    ConvShape s = {xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], ys[2], ys[3],
                   attr[0], attr[1], attr[2], attr[3], attr[4], attr[5], attr[6]};
    return s;
}

/* Depthwise (one input and one output channel per group): direct loops
 * on kiln's NCHW planes, no reorder. Each thread copies a plane into a
 * zero-padded buffer of its own (pad_plane), so that every filter tap is a
 * plain load without bounds tests; a 3x3 filter (MobileNet's) then computes
 * each output row in one vectorized pass with its nine taps in registers,
 * other sizes in one pass per tap. The thread that computed a plane runs
 * the epilogue on it while it is in cache. */
typedef struct {
    int64_t ph, pw;            /* rows and columns of the padded plane */
} PadDims;

static PadDims pad_dims(const ConvShape *s) {
    PadDims d = {(s->oh - 1) * s->sh + (s->kh - 1) * s->dh + 1,
                 (s->ow - 1) * s->sw + (s->kw - 1) * s->dw + 1};
    /* room for every input element (some past the last tap, unread) */
    if (d.ph < s->h + s->ph) d.ph = s->h + s->ph;
    if (d.pw < s->w + s->pw) d.pw = s->w + s->pw;
    return d;
}

/* The plane xp into the interior of P (d.ph x d.pw), shifted by the
 * padding; the border of P is zero from its allocation and never written. */
static void pad_plane(const ConvShape *s, PadDims d, const float *xp, float *P) {
    for (int64_t ih = 0; ih < s->h; ih++) {
        float *restrict pr = P + (ih + s->ph) * d.pw + s->pw;
        const float *restrict xr = xp + ih * s->w;
        #pragma omp simd
        for (int64_t iw = 0; iw < s->w; iw++) pr[iw] = xr[iw];
    }
}

/* The library is built for any x86-64 (SSE2); these loops also get AVX2
 * and AVX-512 versions (4-wide SSE ran MobileNet's depthwise layers at
 * 3-17 GFLOP/s), and the caller picks one by the features the program's
 * target tier allows (ext_cpu_features: level 2 AVX-512, 1 AVX2 + FMA, 0
 * SSE), not by the CPU alone as GCC's target_clones would: no AVX-512
 * instruction runs under a v3 target. The three bodies are the same C
 * (not contracted to FMAs under -std=c11), so they give the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DW_ISA2 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define DW_ISA1 __attribute__((target("avx2,fma")))
/* name##_l2, _l1 and _l0 from one body, and name(level, ...) picking one */
#define DW_VERSIONS(name, params, args)                                                        DW_ISA2 static void name##_l2 params DW_BODY_##name                                        DW_ISA1 static void name##_l1 params DW_BODY_##name                                        static void name##_l0 params DW_BODY_##name                                                static void name(int level, DW_PARAMS_##name) {                                                if (level >= 2) name##_l2 args;                                                            else if (level == 1) name##_l1 args;                                                       else name##_l0 args;                                                                   }
#else
#define DW_VERSIONS(name, params, args)                                                        static void name##_l0 params DW_BODY_##name                                                static void name(int level, DW_PARAMS_##name) { (void)level; name##_l0 args; }
#endif

/* One output row of a 3x3 filter: the nine taps of each output in one
 * expression, the output row written once. The column stride is a
 * constant in each instance (1 and 2 get their own, so the loads are
 * contiguous or a shuffle of two; a runtime stride would make gathers). */
#define DW_ROW3_BODY(SW)                                                                       {                                                                                              float k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3], k4 = k[4], k5 = k[5], k6 = k[6],               k7 = k[7], k8 = k[8];                                                                int64_t e2 = 2 * e1;                                                                       (void)sw;                                                                                  _Pragma("omp simd")                                                                        for (int64_t o = 0; o < ow; o++) {                                                             int64_t i = o * (SW);                                                                      yr[o] = b + k0 * r0[i] + k1 * r0[i + e1] + k2 * r0[i + e2] + k3 * r1[i] +                          k4 * r1[i + e1] + k5 * r1[i + e2] + k6 * r2[i] + k7 * r2[i + e1] +                         k8 * r2[i + e2];                                                               }                                                                                      }
#define DW_ROW3_PARAMS const float *r0, const float *r1, const float *r2, const float *k, \
                       float b, int64_t e1, int64_t ow, int64_t sw, float *restrict yr
#define DW_ROW3_ARGS (r0, r1, r2, k, b, e1, ow, sw, yr)
#define DW_BODY_dw_row3_s1 DW_ROW3_BODY(1)
#define DW_BODY_dw_row3_s2 DW_ROW3_BODY(2)
#define DW_BODY_dw_row3_sn DW_ROW3_BODY(sw)
#define DW_PARAMS_dw_row3_s1 DW_ROW3_PARAMS
#define DW_PARAMS_dw_row3_s2 DW_ROW3_PARAMS
#define DW_PARAMS_dw_row3_sn DW_ROW3_PARAMS
DW_VERSIONS(dw_row3_s1, (DW_ROW3_PARAMS), DW_ROW3_ARGS)
DW_VERSIONS(dw_row3_s2, (DW_ROW3_PARAMS), DW_ROW3_ARGS)
DW_VERSIONS(dw_row3_sn, (DW_ROW3_PARAMS), DW_ROW3_ARGS)

/* With AVX-512, column strides 1 and 2 run these instead: vectors of 16
 * outputs with the last one's store masked, where the loops above, with
 * GCC's scalar remainder, ran MobileNetV2's rows of 7, 14, 28 and 56
 * outputs mostly or wholly in scalar code. The loads of the last vector
 * may run up to 16 * stride floats past its row: the padded plane has
 * DW_SLACK floats more than its rows, zeroed. */
#define DW_SLACK 64
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DW_AVX512 1
#define DW_TARGET __attribute__((target("avx512f")))

/* 16 floats p[0], p[sw], ..., p[15 sw], for sw 1 or 2 (the even elements
 * of 32, picked by a permute). */
static inline __attribute__((always_inline)) DW_TARGET __m512 dw_load(const float *p, int sw) {
    if (sw == 1) return _mm512_loadu_ps(p);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
}

/* One output row of a 3x3 filter, sw a constant; three accumulators (one
 * per filter column) to shorten the chain of dependent FMAs. */
static inline __attribute__((always_inline)) DW_TARGET void
dw_row3_v(const int sw, const float *r0, const float *r1, const float *r2, const float *k,
          float b, int64_t e1, int64_t ow, float *yr) {
    __m512 k0 = _mm512_set1_ps(k[0]), k1 = _mm512_set1_ps(k[1]), k2 = _mm512_set1_ps(k[2]);
    __m512 k3 = _mm512_set1_ps(k[3]), k4 = _mm512_set1_ps(k[4]), k5 = _mm512_set1_ps(k[5]);
    __m512 k6 = _mm512_set1_ps(k[6]), k7 = _mm512_set1_ps(k[7]), k8 = _mm512_set1_ps(k[8]);
    __m512 bv = _mm512_set1_ps(b);
    for (int64_t o = 0; o < ow; o += 16) {
        int64_t i = o * sw;
        __m512 a0 = _mm512_fmadd_ps(k0, dw_load(r0 + i, sw), bv);
        __m512 a1 = _mm512_mul_ps(k1, dw_load(r0 + i + e1, sw));
        __m512 a2 = _mm512_mul_ps(k2, dw_load(r0 + i + 2 * e1, sw));
        a0 = _mm512_fmadd_ps(k3, dw_load(r1 + i, sw), a0);
        a1 = _mm512_fmadd_ps(k4, dw_load(r1 + i + e1, sw), a1);
        a2 = _mm512_fmadd_ps(k5, dw_load(r1 + i + 2 * e1, sw), a2);
        a0 = _mm512_fmadd_ps(k6, dw_load(r2 + i, sw), a0);
        a1 = _mm512_fmadd_ps(k7, dw_load(r2 + i + e1, sw), a1);
        a2 = _mm512_fmadd_ps(k8, dw_load(r2 + i + 2 * e1, sw), a2);
        __m512 acc = _mm512_add_ps(_mm512_add_ps(a0, a1), a2);
        if (ow - o >= 16) _mm512_storeu_ps(yr + o, acc);
        else _mm512_mask_storeu_ps(yr + o, (__mmask16)((1u << (ow - o)) - 1u), acc);
    }
}

static DW_TARGET void dw_row3_v1(const float *r0, const float *r1, const float *r2,
                                 const float *k, float b, int64_t e1, int64_t ow, float *yr) {
    dw_row3_v(1, r0, r1, r2, k, b, e1, ow, yr);
}
static DW_TARGET void dw_row3_v2(const float *r0, const float *r1, const float *r2,
                                 const float *k, float b, int64_t e1, int64_t ow, float *yr) {
    dw_row3_v(2, r0, r1, r2, k, b, e1, ow, yr);
}
#else
#define DW_AVX512 0
#endif

static void dw_row3(const ConvShape *s, PadDims d, const float *P, const float *k, float b,
                    int64_t oh, int level, float *restrict yr) {
    const float *r0 = P + oh * s->sh * d.pw, *r1 = r0 + s->dh * d.pw, *r2 = r1 + s->dh * d.pw;
#if DW_AVX512
    if (level >= 2 && (s->sw == 1 || s->sw == 2)) {
        (s->sw == 1 ? dw_row3_v1 : dw_row3_v2)(r0, r1, r2, k, b, s->dw, s->ow, yr);
        return;
    }
#endif
    if (s->sw == 1) dw_row3_s1(level, r0, r1, r2, k, b, s->dw, s->ow, 1, yr);
    else if (s->sw == 2) dw_row3_s2(level, r0, r1, r2, k, b, s->dw, s->ow, 2, yr);
    else dw_row3_sn(level, r0, r1, r2, k, b, s->dw, s->ow, s->sw, yr);
}

/* One output row of any filter: a pass per tap. */
#define DW_ROW_PARAMS const ConvShape *s, PadDims d, const float *P, const float *k, float b, \
                      int64_t oh, float *restrict yr
#define DW_PARAMS_dw_row DW_ROW_PARAMS
#define DW_BODY_dw_row                                                                     \
    {                                                                                      \
        for (int64_t o = 0; o < s->ow; o++) yr[o] = b;                                     \
        for (int64_t i = 0; i < s->kh; i++) {                                              \
            const float *pr = P + (oh * s->sh + i * s->dh) * d.pw;                         \
            for (int64_t j = 0; j < s->kw; j++) {                                          \
                float kv = k[i * s->kw + j];                                               \
                const float *pc = pr + j * s->dw;                                          \
                int64_t sw = s->sw;                                                        \
                _Pragma("omp simd")                                                        \
                for (int64_t o = 0; o < s->ow; o++) yr[o] += kv * pc[o * sw];              \
            }                                                                              \
        }                                                                                  \
    }
DW_VERSIONS(dw_row, (DW_ROW_PARAMS), (s, d, P, k, b, oh, yr))

const char *ext_path_isa(const char *path) {
    static _Thread_local char buf[96];
    static const char *const own[] = {"SSE", "AVX2 + FMA", "AVX-512 (16-wide rows)"};
    if (strstr(path, "oneDNN")) util_fmt(buf, sizeof buf, "oneDNN's %s kernels", ext_dnnl_isa());
    else if (strstr(path, "OpenBLAS")) util_fmt(buf, sizeof buf, "OpenBLAS's %s kernels", ext_blas_core());
    else if (strstr(path, "1x1 GEMM")) util_fmt(buf, sizeof buf, "AVX-512");
    else util_fmt(buf, sizeof buf, "%s", own[ext_isa_level(ext_cpu_features())]);
    return buf;
}

/* 0, or -1 when a thread's padded plane cannot be allocated. */
static int conv_depthwise(const ConvShape *s, const float *x, const float *w, const float *bias,
                          float *y, ExtEpilogue epi, void *ctx) {
    PadDims d = pad_dims(s);
    int level = ext_isa_level(ext_cpu_features());
    int failed = 0;
    #pragma omp parallel
    {
        float *P = kcalloc((size_t)(d.ph * d.pw + DW_SLACK), sizeof(float));
        if (!P) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(static)
        for (int64_t n = 0; n < s->n; n++)
            for (int64_t c = 0; c < s->c; c++) {
                if (!P) continue;
                const float *k = w + c * s->kh * s->kw;
                float b = bias ? bias[c] : 0.0f, *yp = y + (n * s->c + c) * s->oh * s->ow;
                pad_plane(s, d, x + (n * s->c + c) * s->h * s->w, P);
                for (int64_t oh = 0; oh < s->oh; oh++) {
                    if (s->kh == 3 && s->kw == 3)
                        dw_row3(s, d, P, k, b, oh, level, yp + oh * s->ow);
                    else dw_row(level, s, d, P, k, b, oh, yp + oh * s->ow);
                }
                if (epi) epi(ctx, y, (n * s->c + c) * s->oh * s->ow, s->oh * s->ow);
            }
        kfree(P);
    }
    return failed ? -1 : 0;
}

/* col[(c*kh*kw + i*kw + j), (oh*ow)] = padded input patch element */
static void im2col(const ConvShape *s, const float *x, int64_t cg, float *col) {
    int64_t plane = s->oh * s->ow;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < cg * s->kh * s->kw; r++) {
        int64_t c = r / (s->kh * s->kw), i = r / s->kw % s->kh, j = r % s->kw;
        const float *xp = x + c * s->h * s->w;
        float *cp = col + r * plane;
        for (int64_t oh = 0; oh < s->oh; oh++) {
            int64_t ih = oh * s->sh - s->ph + i * s->dh;
            for (int64_t ow = 0; ow < s->ow; ow++) {
                int64_t iw = ow * s->sw - s->pw + j * s->dw;
                bool in = ih >= 0 && ih < s->h && iw >= 0 && iw < s->w;
                cp[oh * s->ow + ow] = in ? xp[ih * s->w + iw] : 0.0f;
            }
        }
    }
}

/* y[o][k] = bias[o] for no planes of plane elements. */
static void fill_bias(const float *bias, float *y, int64_t no, int64_t plane) {
    #pragma omp parallel for schedule(static) if (no * plane >= EXT_EPI_PARALLEL_MIN)
    for (int64_t o = 0; o < no; o++) {
        float *yp = y + o * plane, bo = bias[o];
        #pragma omp simd
        for (int64_t k = 0; k < plane; k++) yp[k] = bo;
    }
}

static ExtConvBackend conv_backend = EXT_CONV_DNNL;
/* Depthwise convolutions with output planes of at least this many elements
 * run the direct loops even on the oneDNN backend (see conv2d). */
#define DW_DIRECT_PLANE 100

void ext_set_conv_backend(ExtConvBackend b) { conv_backend = b; }

/* conv2d's paths, chosen by shape, backend and CPU (see conv2d). */
typedef enum { PATH_DNNL, PATH_C1, PATH_DEPTHWISE, PATH_SGEMM, PATH_IM2COL } ConvPath;

/* 1x1, stride 1, no padding: an sgemm (or conv1x1.c) on NCHW as it is. */
static bool conv_is_direct(const ConvShape *s) {
    return s->kh == 1 && s->kw == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0;
}

/* One input and one output channel per group. */
static bool conv_is_depthwise(const ConvShape *s) { return s->groups == s->c && s->o == s->c; }

static ConvPath conv_path(const ConvShape *s) {
    bool direct = conv_is_direct(s), depthwise = conv_is_depthwise(s);
    /* A 1x1 stride-1 convolution is one sgemm per image on NCHW as it is,
     * as fast as oneDNN with its reorders (0.9-1.0x, docs/benchmarks.md),
     * and with one group kiln's own GEMM where the CPU has AVX-512
     * (conv1x1.c: weights packed once, bias and epilogue as the output is
     * written; faster than that sgemm on 16 to 18 of MobileNetV2's 19
     * shapes). A depthwise one with output planes of DW_DIRECT_PLANE or
     * more runs the direct loops on NCHW: oneDNN's depthwise kernel wants
     * NHWC, and the two reorders cost more than the loops (MobileNetV2's
     * layers: the loops 1.1-2.3x oneDNN with its reorders from 14x14 up,
     * 0.6-0.9x on the 7x7 planes; make bench-conv). */
    bool dw_direct = depthwise && s->oh * s->ow >= DW_DIRECT_PLANE;
    bool dnnl = conv_backend == EXT_CONV_DNNL;
    if (dnnl && direct && s->groups == 1 && (ext_cpu_features() & EXT_CPU_AVX512)) return PATH_C1;
    if (dnnl && !direct && !dw_direct) return PATH_DNNL;
    if (depthwise) return PATH_DEPTHWISE;
    return direct ? PATH_SGEMM : PATH_IM2COL;
}

const char *ext_conv_path(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                          const int64_t attr[7]) {
    ConvShape s = conv_shape(xs, ws, ys, attr);
    switch (conv_path(&s)) {
    case PATH_DNNL:
        return ext_conv_dnnl_split(ys, ext_get_threads())
                   ? "oneDNN, the images split among the threads (NCHW reordered to its blocked layout and back)"
                   : "oneDNN (NCHW reordered to its blocked layout and back)";
    case PATH_C1: return "kiln's 1x1 GEMM (AVX-512, conv1x1.c)";
    case PATH_DEPTHWISE: return "kiln's depthwise loops on NCHW";
    case PATH_SGEMM: return "OpenBLAS sgemm per image and group";
    case PATH_IM2COL: break;
    }
    return "im2col + OpenBLAS sgemm";
}

static int conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                  const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                  bool wconst, ExtEpilogue epi, void *ctx) {
    ext_blas_init();
    ConvShape s = conv_shape(xs, ws, ys, attr);
    bool direct = conv_is_direct(&s), depthwise = conv_is_depthwise(&s);
    ConvPath path = conv_path(&s);
    if (path == PATH_C1) {
        int r = ext_conv1x1(x, s.n, s.c, s.oh * s.ow, w, s.o, bias, y, wconst, epi, ctx);
        if (r <= 0) return r;
    }
    if (path == PATH_DNNL) {
        int r = ext_conv2d_dnnl(x, xs, w, ws, bias, y, ys, attr, wconst, epi, ctx);
        if (r <= 0) return r;   /* else oneDNN declined it: im2col */
    }
    if (depthwise) return conv_depthwise(&s, x, w, bias, y, epi, ctx);
    /* (Without AVX-512, or on the im2col backend:) the bias goes into the
     * output before the sgemm, which then adds to it
     * (beta 1): OpenBLAS clears the output first when beta is 0 (a memset
     * pass), so the fill costs what that pass cost, and the separate bias
     * pass after the call goes (MobileNetV2, 1 thread: the bias pass was 7%
     * of the run and the memset 4.5%). The epilogue runs on each image's
     * group right after its sgemm, in pieces of whole planes. */
    int64_t cg = s.c / s.groups, og = s.o / s.groups, plane = s.oh * s.ow;
    int64_t kdim = cg * s.kh * s.kw;
    float *col = direct ? NULL : kmalloc(sizeof(float) * (size_t)(kdim * plane));
    if (!direct && !col) return -1;
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t g = 0; g < s.groups; g++) {
            const float *xg = x + (n * s.c + g * cg) * s.h * s.w;
            if (!direct) im2col(&s, xg, cg, col);
            if (bias) fill_bias(bias + g * og, y + (n * s.o + g * og) * plane, og, plane);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)og, (int)plane,
                        (int)kdim, 1.0f, w + g * og * kdim, (int)kdim, direct ? xg : col,
                        (int)plane, bias ? 1.0f : 0.0f, y + (n * s.o + g * og) * plane, (int)plane);
            ext_run_epilogue(epi, ctx, y, (n * s.o + g * og) * plane, og * plane, plane);
        }
    kfree(col);
    return 0;
}

void ext_kept_add(ExtKeptList *l, ExtKept *e) {
    e->next = l->head;
    l->head = e;
    l->bytes += e->bytes;
}

void ext_kept_free(ExtKept *e) {
    kfree(e->raw);
    kfree(e);
}

void ext_kept_forget(ExtKeptList *l, const void *data, size_t bytes) {
    const char *lo = data, *hi = lo + bytes;
    pthread_mutex_lock(l->lock);
    for (ExtKept **pe = &l->head; *pe;) {
        ExtKept *e = *pe;
        if ((const char *)e->w < lo || (const char *)e->w >= hi) {
            pe = &e->next;
            continue;
        }
        *pe = e->next;
        l->bytes -= e->bytes;
        ext_kept_free(e);
    }
    pthread_mutex_unlock(l->lock);
}

int ext_kept_stats(ExtKeptList *l, size_t *bytes) {
    int n = 0;
    pthread_mutex_lock(l->lock);
    for (const ExtKept *e = l->head; e; e = e->next) n++;
    if (bytes) *bytes = l->bytes;
    pthread_mutex_unlock(l->lock);
    return n;
}

void ext_conv_forget_weights(const void *data, size_t bytes) {
    ext_kept_forget(&ext_dnnl_kept, data, bytes);
    ext_kept_forget(&ext_c1_kept, data, bytes);
}

int ext_conv_kept_weights(size_t *bytes) {
    size_t a = 0, b = 0;
    int n = ext_kept_stats(&ext_dnnl_kept, &a) + ext_kept_stats(&ext_c1_kept, &b);
    if (bytes) *bytes = a + b;
    return n;
}

int ext_conv2d_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                   const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                   ExtEpilogue epi, void *ctx) {
    return conv2d(x, xs, w, ws, bias, y, ys, attr, false, epi, ctx);
}

int ext_conv2d_const_epi(const float *x, const int64_t xs[4], const float *w,
                         const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                         const int64_t attr[7], ExtEpilogue epi, void *ctx) {
    return conv2d(x, xs, w, ws, bias, y, ys, attr, true, epi, ctx);
}

int ext_conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
               const float *bias, float *y, const int64_t ys[4], const int64_t attr[7]) {
    return ext_conv2d_epi(x, xs, w, ws, bias, y, ys, attr, NULL, NULL);
}
