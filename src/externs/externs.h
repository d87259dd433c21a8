/*
 * externs.h -- library kernels for extern ops (matmul, conv2d), called by
 * the generated wrapper (through the runtime's function table) and by tests.
 * They return 0, or -1 when a scratch allocation fails.
 */
#ifndef KILN_EXTERNS_H
#define KILN_EXTERNS_H
#include "graph/graph.h"
#include <pthread.h>

/* A strided view (base/kiln_rt.h's KilnView, the generated code's name):
 * element (i0..ik) lives at data[offset + sum i_d*stride_d]. */
typedef KilnView ExtView;

/* An extern's epilogue (kiln_rt.h's KilnEpilogue): the pointwise ops fused
 * into the call, applied to the flat output elements [start, start +
 * count) of c, the whole output, on each block right after the library
 * computed it. */
typedef KilnEpilogue ExtEpilogue;

/* c[..., M, N] = a[..., M, K] @ b[..., K, N]; batch dims of a and b
 * broadcast against c's (crank - 2) batch dims; c is dense. */
int ext_matmul(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
               int crank, const int64_t *cshape);
/* Does ext_matmul run this batched product as one GEMM (B shared by every
 * batch, A's rows evenly spaced: "batch folding" in matmul.c)? Depends on
 * the views and shapes only, so the scheduler can name the call. */
bool ext_matmul_folds(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape);
/* What runs such a product, for reports: "OpenBLAS sgemm", "OpenBLAS
 * sgemv (one row)" (by shape, as ext_matmul_epi decides) or, for a
 * constant B (wconst: ext_matmul_const_epi), "oneDNN matmul (...)". */
const char *ext_matmul_path(const ExtView *av, const ExtView *bv, int crank, const int64_t *cshape,
                            bool wconst);
/* ext_matmul on f64 operands and result (OpenBLAS dgemm; no epilogue). */
int ext_matmul64(const double *a, const ExtView *av, const double *b, const ExtView *bv, double *c,
                 int crank, const int64_t *cshape);
/* The same, with epi (NULL: none) applied to each block of rows as it is done. */
int ext_matmul_epi(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                   int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx);
/* The same for a b that is a compile-time constant at a fixed address (a
 * weight buffer of the program, any view of it): a 2-D product (or
 * batches folded into one) whose a has unit column stride runs on oneDNN
 * with b reordered once and kept (matmul_dnnl.c), the rest as
 * ext_matmul_epi. */
int ext_matmul_const_epi(const float *a, const ExtView *av, const float *b, const ExtView *bv,
                         float *c, int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx);
/* matmul_dnnl.c: c[M, N] = a @ b (2-D views; b constant) through oneDNN,
 * then epi over c; 0, -1 (out of memory) or 1 when declined. */
int ext_matmul_dnnl(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                    int64_t M, int64_t N, ExtEpilogue epi, void *ctx);
/* Does ext_matmul_dnnl take these views (a 2-D [M, K] or 3-D [batch, M, K]
 * with unit column stride, b 2-D with positive strides)? */
bool ext_matmul_dnnl_takes(const ExtView *av, const ExtView *bv, int64_t M);
/* Primitives matmul_dnnl.c holds (tests). */
int ext_matmul_dnnl_count(void);
/* NCHW conv2d, dense operands; attr = {sh, sw, ph, pw, dh, dw, groups};
 * bias may be NULL. */
int ext_conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
               const float *bias, float *y, const int64_t ys[4], const int64_t attr[7]);
/* The same, with epi (NULL: none) applied to each (image, group) slab of
 * output channels, or each output plane of a depthwise conv, as it is done. */
int ext_conv2d_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                   const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                   ExtEpilogue epi, void *ctx);
/* The same for a weight w that is a compile-time constant at a fixed
 * address (a kiln_weight, an ONNX initializer, folded Conv-BN weights):
 * oneDNN's reordered copy of it is kept across calls (conv_dnnl.c) until
 * ext_kept_forget_all drops it. Never for weights that can change
 * between calls (a runtime input, a computed or packed buffer). */
int ext_conv2d_const_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                         const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                         ExtEpilogue epi, void *ctx);
/* What runs a conv2d of these shapes, for reports (oneDNN, kiln's 1x1
 * GEMM, the depthwise loops, sgemm or im2col), as conv2d decides it by
 * shape, backend and CPU; a shape oneDNN declines at run time goes to
 * im2col all the same. */
const char *ext_conv_path(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                          const int64_t attr[7]);
/* conv2d's backend: oneDNN (conv_dnnl.c, the default; a shape it declines
 * goes to im2col) or kiln's own im2col + sgemm, direct 1x1 and depthwise
 * loops (chosen by a test hook, src/testing.h). */
typedef enum { EXT_CONV_DNNL, EXT_CONV_IM2COL } ExtConvBackend;
/* conv_dnnl.c: ext_conv2d_epi through oneDNN; 0, -1 (out of memory or a
 * oneDNN failure) or 1 when oneDNN declines the shape. wconst: w is a
 * constant (see ext_conv2d_const_epi) whose reordered copy may be kept. */
int ext_conv2d_dnnl(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                    const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                    bool wconst, ExtEpilogue epi, void *ctx);
/* conv_dnnl.c: oneDNN's implementation ("jit:avx2", "brgconv:avx512_core",
 * "gemm:jit", ...) of the primitive this thread's last ext_conv2d_dnnl or
 * ext_matmul_dnnl call ran, "" when oneDNN declined it, NULL when neither
 * ran since ext_dnnl_impl_reset (the profiler resets it before each call).
 * A convolution never runs on "ref:...": a layout only oneDNN's reference
 * loops take is not asked for, and a shape only they take is declined.
 * ext_dnnl_impl_note records one; ext_dnnl_impl_of reads a primitive
 * descriptor's (a dnnl_primitive_desc_t) into impl. */
const char *ext_dnnl_last_impl(void);
void ext_dnnl_impl_reset(void);
void ext_dnnl_impl_note(const char *impl);
void ext_dnnl_impl_of(const void *pd, char impl[32]);
/* conv_dnnl.c: among how many threads ext_conv2d_dnnl splits a batch of
 * output shape ys (each thread its own images, oneDNN single-threaded in
 * each), or 0: each call of a few images runs on all the threads. */
int ext_conv_dnnl_split(const int64_t ys[4], int threads);
/* ---- common.c: kept copies of constant weights ---- */
/* A kept copy of a constant weight: the first member of conv_dnnl.c's and
 * conv1x1.c's entries, each module's list under its own lock. raw is the
 * copy's kmalloc'd block. */
typedef struct ExtKept {
    const float *w; /* the plain weights (a program's constant) */
    void *raw;
    size_t bytes; /* of the copy */
    struct ExtKept *next;
} ExtKept;
/* One module's kept copies: the list, their bytes, and the module's mutex
 * (conv_dnnl.c's also guards its primitive cache), which the module holds
 * while it adds and finds and ext_kept_forget / ext_kept_stats take. */
typedef struct ExtKeptList {
    ExtKept *head;
    size_t bytes;
    pthread_mutex_t *lock;
    struct ExtKeptList *next_list; /* common.c's registry of every list */
    bool registered;
} ExtKeptList;
/* Add e (its raw set) to l; the caller holds l->lock. The first add
 * registers l, so ext_kept_forget_all reaches it. */
void ext_kept_add(ExtKeptList *l, ExtKept *e);
/* Free one entry that is in no list (raw may be NULL). */
void ext_kept_free(ExtKept *e);
/* Under l->lock: unlink and free (raw, then the entry) the copies of
 * weights within [data, data + bytes). */
void ext_kept_forget(ExtKeptList *l, const void *data, size_t bytes);
/* Under l->lock: the number of copies, and their bytes in *bytes. */
int ext_kept_stats(ExtKeptList *l, size_t *bytes);
/* Drop every kept copy, in every backend's list, of constant weights
 * stored within [data, data + bytes) (a program's weights, when it is
 * freed: the address may next hold other data). */
void ext_kept_forget_all(const void *data, size_t bytes);
/* How many copies all the lists hold, and their bytes in *bytes. */
int ext_kept_count_all(size_t *bytes);
/* conv1x1.c: a 1x1 stride-1 convolution with one group, y[n] = w @ x[n] +
 * bias (x: N images of [K, P], w: [O, K], y: N images of [O, P]; bias may
 * be NULL), epi run on each unit's rows as it is done; wconst as for
 * ext_conv2d_dnnl (the packed weights are kept). 0, -1 (out of memory), or
 * 1 when this CPU lacks AVX-512: the caller runs the sgemm. */
int ext_conv1x1(const float *x, int64_t N, int64_t K, int64_t P, const float *w, int64_t O,
                const float *bias, float *y, bool wconst, ExtEpilogue epi, void *ctx);
/* ---- common.c: epilogues ---- */
/* Epilogue work goes to every thread from this many elements on (an
 * OpenMP fork costs microseconds, what a core needs for ~32K floats), in
 * pieces of whole rows or planes of at least EXT_EPI_PIECE elements (16
 * KiB of floats stay in L1/L2 for the epilogue). */
#define EXT_EPI_PARALLEL_MIN 32768
#define EXT_EPI_PIECE 4096
/* Run epi over elements [start, start + count) of c, whose rows (or planes)
 * are `unit` elements long, on every thread when it is large; call outside
 * any parallel region. */
void ext_run_epilogue(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t count,
                      int64_t unit);
/* The same over nslabs slabs of `slab` elements from start (an image's
 * groups), each range within one slab. */
void ext_run_epilogue_slabs(ExtEpilogue epi, void *ctx, float *c, int64_t start, int64_t nslabs,
                            int64_t slab, int64_t unit);
void ext_set_threads(int n);
int ext_get_threads(void);
/* ---- gather.c, conv_transpose.c ---- */

/* What a kernel returns when its input is wrong at run time (a gather
 * index out of range): the message is in the caller's err buffer. */
#define EXT_ERR_INPUT (-2)
/* numpy.take over strided views: out (dense; data's dims with dim `axis`
 * replaced by the indices' dims) = data[..., indices, ...]. The indices are
 * integral floats, negative ones counting from the end; all are checked
 * before anything is written, and the first bad one gives EXT_ERR_INPUT with
 * "gather: index 7 out of range for dim 1 of size 5" in err. epi (NULL:
 * none) runs on each piece of whole output rows as it is done. */
int ext_gather(const float *data, const ExtView *dv, const float *idx, const ExtView *iv, int axis,
               float *out, ExtEpilogue epi, void *ctx, char *err, size_t errlen);
/* NCHW transposed convolution, dense operands, weight (C_in, C_out/groups,
 * kH, kW); attr = {sh, sw, ph, pw, oph, opw, dh, dw, groups}; bias may be
 * NULL; epi (NULL: none) runs on each output plane as it is done. */
int ext_conv_transpose2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                         const float *bias, float *y, const int64_t ys[4], const int64_t attr[9],
                         ExtEpilogue epi, void *ctx);
/* What runs a conv_transpose2d of these shapes, for reports: OpenBLAS's
 * sgemm, then col2im or, where the taps tile the output, a shuffle. */
const char *ext_conv_transpose_path(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                                    const int64_t attr[9]);

/* OpenBLAS's kernels: once per process, replace its Prescott fallback on a
 * CPU it does not know by the kernels the CPU can run (see matmul.c);
 * every extern and ext_set_threads call it first. */
void ext_blas_init(void);
/* The EXT_CPU_* features (target.h) library kernels may use on this
 * thread now: the CPU's, bounded by the cap of ext_isa_enter. */
unsigned ext_cpu_features(void);
/* The CPU's EXT_CPU_* features, whatever the cap. */
unsigned ext_cpu_features_all(void);
/* The EXT_CPU_* bits as a level: 2 AVX-512, 1 AVX2 + FMA, 0 neither. */
int ext_isa_level(unsigned features);
/* Bound the library kernels this thread runs to the EXT_CPU_* bits cap
 * (a program's Target.ext) until ext_isa_leave(the value returned). The
 * first BLAS or oneDNN use in the process also caps OpenBLAS's core and
 * oneDNN's ISA to the cap in force then (they choose once per process). */
unsigned ext_isa_enter(unsigned cap);
void ext_isa_leave(unsigned prev);
/* The cap in force on this thread (~0u outside a run). */
unsigned ext_isa_cap(void);
/* The core to force, or NULL to keep OpenBLAS's: user is OPENBLAS_CORETYPE
 * (set: the user's choice wins, unless it needs more than cap allows),
 * current the core OpenBLAS chose, cpu the EXT_CPU_* bits the CPU has and
 * cap those the tier allows. */
const char *ext_blas_core_choice(const char *user, const char *current, unsigned cpu, unsigned cap);
/* The OpenBLAS core and the oneDNN ISA in use ("Haswell", "avx2"), for
 * kiln explain; asking fixes the choice (ext_blas_init, oneDNN's cap) if
 * no call has yet. */
const char *ext_blas_core(void);
const char *ext_dnnl_isa(void);
/* What instructions a path of ext_conv_path / ext_matmul_path runs:
 * "OpenBLAS's Haswell kernels", "oneDNN's avx2 kernels", "AVX2 + FMA". */
const char *ext_path_isa(const char *path);
#endif
