/*
 * matmul.c -- matmul through OpenBLAS cblas_sgemm (cblas_sgemv for one
 * row), with the fused epilogue run on each block of rows.
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
 * library computed it, while the block is still in cache (common.c runs
 * them); a matmul's blocks are rows (per batch), sized below.
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
 * does not know, and its sgemm is then several times slower than with the
 * kernels the CPU can run (docs/decisions.md: OpenBLAS's core choice).
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
    static const char *const avx[] = {"Sandybridge", "Haswell",     "Zen",      "Bulldozer",
                                      "Piledriver",  "Steamroller", "Excavator"};
    for (size_t i = 0; core && i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcasecmp(core, avx512[i])) return 2;
    for (size_t i = 0; core && i < sizeof avx / sizeof *avx; i++)
        if (!strcasecmp(core, avx[i])) return 1;
    return 0;
}

const char *ext_blas_core_choice(const char *user, const char *current, unsigned cpu,
                                 unsigned cap) {
    int allowed = ext_isa_level(cpu & cap);
    /* above the tier (the user's choice too): the best core the tier allows */
    if (current && core_level(current) > allowed) return allowed == 1 ? "Haswell" : "Nehalem";
    if ((user && *user) || !current || strcasecmp(current, "Prescott") != 0) return NULL;
    if (allowed == 2) return "SkylakeX";
    if (allowed == 1) return "Haswell";
    return NULL;
}

static void blas_pick_core(unsigned cap) {
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    const char *core = ext_blas_core_choice(getenv("OPENBLAS_CORETYPE"), openblas_get_corename(),
                                            ext_cpu_features_all(), cap);
    if (!core) return;
    /* the user's variable is put back as it was */
    const char *user = getenv("OPENBLAS_CORETYPE");
    char *saved = user ? strdup(user) : NULL;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) {
        free(saved);
        return;
    }
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    if (saved)
        setenv("OPENBLAS_CORETYPE", saved, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
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
        blas_pick_core(ext_isa_cap());
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

/* C bytes per matmul block: 16 MiB stays in the last-level cache of the
 * server parts kiln targets (32 MiB and more), beside the packed panels. */
#define EXT_EPI_BLOCK_BYTES ((int64_t)16 << 20)
/* ... but never fewer rows than this (docs/decisions.md: Matmul epilogue
 * blocks). */
#define EXT_EPI_MIN_ROWS 512
/* Rows per block set by a test (ext_set_epilogue_rows); 0: the policy. */
static int64_t forced_rows;

#ifdef KILN_TESTING
#include "testing.h"
void ext_set_epilogue_rows(int64_t rows) { forced_rows = rows > 0 ? rows : 0; }
#endif

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

/* How BLAS reads a rows x cols slice with these strides: as stored or
 * transposed, with its leading dimension; false when neither fits. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol,
                        CBLAS_TRANSPOSE *trans, int64_t *ld) {
    if (scol == 1 && (srow >= cols || rows == 1)) {
        *trans = CblasNoTrans;
        *ld = rows == 1 ? (cols > 1 ? cols : 1) : srow;
        return true;
    }
    if (srow == 1 && (scol >= rows || cols == 1)) {
        *trans = CblasTrans;
        *ld = cols == 1 ? (rows > 1 ? rows : 1) : scol;
        return true;
    }
    return false;
}

static bool as_blas(const float *p, int64_t rows, int64_t cols, int64_t srow, int64_t scol,
                    BlasOperand *o) {
    o->p = p;
    return blas_layout(rows, cols, srow, scol, &o->trans, &o->ld);
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
 * it, on every call (docs/decisions.md: One-row matmul as sgemv); sgemv
 * reads B once, where it is. */
static bool as_gemv(int64_t M, int64_t N, int64_t K) { return M == 1 && N > 1 && K > 0; }

static bool gemm2d(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                   int64_t M, int64_t N, int64_t K, float *tmp_a, float *tmp_b) {
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
        bool nt = B.trans == CblasNoTrans; /* B as stored is [K, N], else [N, K] */
        cblas_sgemv(CblasRowMajor, t, (int)(nt ? K : N), (int)(nt ? N : K), 1.0f, B.p, (int)B.ld,
                    A.p, inc, 0.0f, c, 1);
        return true;
    }
    cblas_sgemm(CblasRowMajor, A.trans, B.trans, (int)M, (int)N, (int)K, 1.0f, A.p, (int)A.ld, B.p,
                (int)B.ld, 0.0f, c, (int)N);
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
 * row, [128, 1, 256] @ [256, 768] (docs/decisions.md: Batch folding). A's
 * rows must also suit BLAS as one matrix (as_blas); otherwise the batches
 * run one by one as before. */

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
    int64_t step = M > 1 ? av->stride[vb] : 0, span = M; /* step 0: not known yet */
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

/* The last two dims of v as a 2-D view (its other dims are 1, or B's batch dims are shared). */
static ExtView last2(const ExtView *v) {
    int r = v->rank;
    return (ExtView){
        2, {v->shape[r - 2], v->shape[r - 1]}, {v->stride[r - 2], v->stride[r - 1]}, v->offset};
}

/* Rewrite a batched a @ b as 2-D views of batches * M rows; false when the
 * batches cannot be one GEMM. */
static bool fold_batches(const float *a, const ExtView *av, const ExtView *bv, int nb,
                         const int64_t *cshape, ExtView *a2, ExtView *b2) {
    int64_t M = cshape[nb], K = av->shape[av->rank - 1], rows = M;
    for (int d = 0; d < nb; d++) rows *= cshape[d];
    if (rows == M || rows > INT32_MAX || !b_shared(bv)) return false; /* BLAS takes int */
    int64_t step = folded_row_stride(av, nb, cshape, M), scol = av->stride[av->rank - 1];
    BlasOperand o;
    if (step <= 0 || !as_blas(a ? a + av->offset : NULL, rows, K, step, scol, &o)) return false;
    *a2 = (ExtView){2, {rows, K}, {step, scol}, av->offset};
    *b2 = last2(bv);
    return true;
}

/* A product as one 2-D GEMM: 2-D already, batches of 1 (C's batch dims all
 * 1), or batches folded into rows; false otherwise. */
static bool as_2d(const float *a, const ExtView *av, const ExtView *bv, int crank,
                  const int64_t *cshape, ExtView *a2, ExtView *b2) {
    bool ones = true;
    for (int d = 0; d < crank - 2; d++) ones &= cshape[d] == 1;
    if (ones && av->rank >= 2 && bv->rank >= 2) {
        *a2 = last2(av);
        *b2 = last2(bv);
        return true;
    }
    return crank > 2 && fold_batches(a, av, bv, crank - 2, cshape, a2, b2);
}

/* Batches of A (one batch dim of C above 1, A not broadcast over it)
 * against the one B, as a 3-D view of A [batch, M, K] and B's 2-D view:
 * oneDNN's batched matmul takes A's batch stride as it is. */
static bool as_batched(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape,
                       ExtView *a3, ExtView *b2) {
    int nb = crank - 2, dim = -1;
    if (nb < 1 || av->rank != crank || bv->rank < 2 || !b_shared(bv)) return false;
    for (int d = 0; d < nb; d++)
        if (cshape[d] != 1) {
            if (dim >= 0) return false;
            dim = d;
        }
    if (dim < 0 || av->shape[dim] != cshape[dim] || av->stride[dim] <= 0) return false;
    int r = av->rank;
    *a3 = (ExtView){3,
                    {cshape[dim], av->shape[r - 2], av->shape[r - 1]},
                    {av->stride[dim], av->stride[r - 2], av->stride[r - 1]},
                    av->offset};
    *b2 = last2(bv);
    return true;
}

/* The views oneDNN runs, or false: one 2-D product (as_2d), else batches
 * against the one B (as_batched). One row of C is not oneDNN's: sgemv
 * streams B once, as it is stored (as_gemv; docs/decisions.md: One-row
 * matmul as sgemv). */
static bool dnnl_views(const float *a, const ExtView *av, const ExtView *bv, int crank,
                       const int64_t *cshape, ExtView *a2, ExtView *b2) {
    if (as_2d(a, av, bv, crank, cshape, a2, b2)) {
        if (as_gemv(a2->shape[0], cshape[crank - 1], a2->shape[1])) return false;
        if (ext_matmul_dnnl_takes(a2, b2, a2->shape[0])) return true;
    }
    return as_batched(av, bv, crank, cshape, a2, b2) && ext_matmul_dnnl_takes(a2, b2, a2->shape[1]);
}

/* A 2-D product whose A oneDNN cannot read where it is (its rows reversed:
 * a bidirectional RNN's input projection for the backward direction, A
 * the sequence with time running backwards) but could once A is dense:
 * the dense view it gets, in *ad. Packing A costs M K copies against the
 * product's 2 M K N flops. */
static bool dnnl_packed(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape,
                        ExtView *ad) {
    if (crank != 2 || av->rank != 2 || bv->rank != 2) return false;
    int64_t M = cshape[0], K = av->shape[1];
    *ad = (ExtView){2, {M, K}, {K, 1}, 0};
    return M > 0 && K > 0 && !as_gemv(M, cshape[1], K) && ext_matmul_dnnl_takes(ad, bv, M);
}

const char *ext_matmul_path(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape,
                            bool wconst) {
    int64_t M = cshape[crank - 2], N = cshape[crank - 1], K = av->shape[av->rank - 1];
    ExtView a2, b2;
    if (wconst && dnnl_views(NULL, av, bv, crank, cshape, &a2, &b2))
        return "oneDNN matmul (the constant B in the layout it picks, reordered once)";
    if (wconst && dnnl_packed(av, bv, crank, cshape, &a2))
        return "oneDNN matmul (the constant B in the layout it picks, reordered once; A packed "
               "dense first)";
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

int ext_matmul_const_epi(const float *a, const ExtView *av, const float *b, const ExtView *bv,
                         float *c, int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx) {
    ExtView a2, b2;
    if (dnnl_views(a, av, bv, crank, cshape, &a2, &b2)) {
        int r =
            ext_matmul_dnnl(a, &a2, b, &b2, c, a2.shape[a2.rank - 2], cshape[crank - 1], epi, ctx);
        if (r <= 0) return r; /* else declined: OpenBLAS */
    } else if (dnnl_packed(av, bv, crank, cshape, &a2)) {
        float *ap = kmalloc(sizeof(float) * (size_t)(a2.shape[0] * a2.shape[1]));
        if (!ap) return -1;
        pack(a + av->offset, a2.shape[0], a2.shape[1], av->stride[0], av->stride[1], ap);
        int r = ext_matmul_dnnl(ap, &a2, b, bv, c, a2.shape[0], cshape[1], epi, ctx);
        kfree(ap);
        if (r <= 0) return r;
    }
    return ext_matmul_epi(a, av, b, bv, c, crank, cshape, epi, ctx);
}

int ext_matmul(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
               int crank, const int64_t *cshape) {
    return ext_matmul_epi(a, av, b, bv, c, crank, cshape, NULL, NULL);
}

/* ---- f64 -------------------------------------------------------------------
 *
 * cblas_dgemm per batch, each operand as stored or transposed where BLAS
 * can read it, else packed dense first. No epilogue: an f64 consumer never
 * fuses into an extern (its callback takes floats). */

static const double *blas64_operand(const double *p, int64_t rows, int64_t cols, int64_t srow,
                                    int64_t scol, double **tmp, CBLAS_TRANSPOSE *trans,
                                    int64_t *ld) {
    if (blas_layout(rows, cols, srow, scol, trans, ld)) return p;
    if (!*tmp && !(*tmp = kmalloc(sizeof(double) * (size_t)(rows * cols > 0 ? rows * cols : 1))))
        return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) (*tmp)[r * cols + c] = p[r * srow + c * scol];
    *trans = CblasNoTrans;
    *ld = cols > 1 ? cols : 1;
    return *tmp;
}

int ext_matmul64(const double *a, const ExtView *av, const double *b, const ExtView *bv, double *c,
                 int crank, const int64_t *cshape) {
    ext_blas_init();
    int nb = crank - 2, ra = av->rank, rb = bv->rank;
    int64_t M = cshape[crank - 2], N = cshape[crank - 1], K = av->shape[ra - 1], batches = 1;
    for (int d = 0; d < nb; d++) batches *= cshape[d];
    double *ta = NULL, *tb = NULL;
    int rc = 0;
    for (int64_t i = 0; i < batches && !rc; i++) {
        CBLAS_TRANSPOSE tra, trb;
        int64_t lda, ldb;
        const double *pa = blas64_operand(a + batch_offset(av, nb, cshape, i), M, K,
                                          av->stride[ra - 2], av->stride[ra - 1], &ta, &tra, &lda);
        const double *pb = blas64_operand(b + batch_offset(bv, nb, cshape, i), K, N,
                                          bv->stride[rb - 2], bv->stride[rb - 1], &tb, &trb, &ldb);
        if (!pa || !pb) {
            rc = -1;
            break;
        }
        cblas_dgemm(CblasRowMajor, tra, trb, (int)M, (int)N, (int)K, 1.0, pa, (int)lda, pb,
                    (int)ldb, 0.0, c + i * M * N, (int)(N > 1 ? N : 1));
    }
    kfree(ta);
    kfree(tb);
    return rc;
}
