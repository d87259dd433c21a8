/*
 * externs.h -- library kernels for extern ops (matmul, conv2d), called by
 * the generated wrapper (through the runtime's function table) and by tests.
 * They return 0, or -1 when a scratch allocation fails.
 */
#ifndef KILN_EXTERNS_H
#define KILN_EXTERNS_H
#include "kiln_int.h"

/* A strided view: element (i0..ik) lives at data[offset + sum i_d*stride_d].
 * A broadcast dim has stride 0. */
typedef struct {
    int rank;
    int64_t shape[KILN_MAX_RANK];
    int64_t stride[KILN_MAX_RANK];
    int64_t offset;
} ExtView;

/* An extern's epilogue (generated code): the pointwise ops fused into the
 * call, applied to the flat output elements [start, start + count) of c,
 * the whole output. The library calls it on each block of the output right
 * after computing it, from one thread or from several on disjoint ranges;
 * it must not start threads itself. */
typedef void (*ExtEpilogue)(void *ctx, float *c, int64_t start, int64_t count);

/* c[..., M, N] = a[..., M, K] @ b[..., K, N]; batch dims of a and b
 * broadcast against c's (crank - 2) batch dims; c is dense. */
int ext_matmul(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
               int crank, const int64_t *cshape);
/* The same, with epi (NULL: none) applied to each block of rows as it is done. */
int ext_matmul_epi(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                   int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx);
/* NCHW conv2d, dense operands; attr = {sh, sw, ph, pw, dh, dw, groups};
 * bias may be NULL. */
int ext_conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
               const float *bias, float *y, const int64_t ys[4], const int64_t attr[7]);
/* The same, with epi (NULL: none) applied to each (image, group) slab of
 * output channels, or each output plane of a depthwise conv, as it is done. */
int ext_conv2d_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                   const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                   ExtEpilogue epi, void *ctx);
/* Tests: rows per matmul block when there is an epilogue, so small
 * matrices still cross block boundaries (process-wide; 0: the policy). */
void ext_set_epilogue_rows(int64_t rows);
void ext_set_threads(int n);
int ext_get_threads(void);
/* ---- externs_more.c ---- */

/* What a kernel returns when its input is wrong at run time (a gather
 * index out of range): the message is in the caller's err buffer. */
#define EXT_ERR_INPUT (-2)
/* numpy.take over strided views: out (dense; data's dims with dim `axis`
 * replaced by the indices' dims) = data[..., indices, ...]. The indices are
 * integral floats, negative ones counting from the end; all are checked
 * before anything is written, and the first bad one gives EXT_ERR_INPUT with
 * "gather: index 7 out of range for dim 1 of size 5" in err. epi (NULL:
 * none) runs on each piece of whole output rows as it is done. */
int ext_gather(const float *data, const ExtView *dv, const float *idx, const ExtView *iv,
               int axis, float *out, ExtEpilogue epi, void *ctx, char *err, size_t errlen);
/* NCHW transposed convolution, dense operands, weight (C_in, C_out/groups,
 * kH, kW); attr = {sh, sw, ph, pw, oph, opw, dh, dw, groups}; bias may be
 * NULL; epi (NULL: none) runs on each output plane as it is done. */
int ext_conv_transpose2d(const float *x, const int64_t xs[4], const float *w,
                         const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                         const int64_t attr[9], ExtEpilogue epi, void *ctx);
#endif
