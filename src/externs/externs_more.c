/*
 * externs_more.c -- more library kernels behind extern ops: gather
 * (numpy.take) and conv_transpose2d (sgemm + col2im). The contracts are in
 * externs.h; the calling conventions (views, epilogues, threads) are those
 * of externs.c.
 *
 * gather is a copy whose source rows are picked at run time, so it is the
 * one extern whose input can be wrong after compiling: every index is
 * checked (and converted to a position) before anything is written, and a
 * bad one is reported through the caller's message buffer with
 * EXT_ERR_INPUT, which the generated wrapper passes up to the runtime as
 * KILN_ERR_INPUT. The copy then runs in pieces of whole output rows (one
 * row: the elements after the gathered dims), in parallel when large, and
 * each piece's epilogue runs on the thread that wrote it, while the piece
 * is in its cache.
 *
 * conv_transpose2d scatters instead of gathering: per (image, group),
 * col = W_g^T X_g, one sgemm of (C_out/g * kH * kW) x (H * W) over C_in/g,
 * then col2im adds each column entry into the output pixel its tap lands
 * on. Output planes are disjoint, so col2im runs one plane per thread
 * (starting from the bias) and that thread runs the epilogue of its plane.
 */
#include "externs/externs.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* Output elements per piece of work (16 KiB of floats stay in L1/L2 for the
 * epilogue), and the least work worth an OpenMP fork (see externs.c). */
#define PIECE_ELEMS 4096
#define PARALLEL_MIN 32768

/* ---- gather ------------------------------------------------------------------ */

/* Offset of linear index i over dims [d0, d1) of v, C order. */
static int64_t offset_of(const ExtView *v, int d0, int d1, int64_t i) {
    int64_t off = 0;
    for (int d = d1 - 1; d >= d0; d--) {
        off += i % v->shape[d] * v->stride[d];
        i /= v->shape[d];
    }
    return off;
}

static void index_error(char *err, size_t errlen, float x, int axis, int64_t size) {
    if (!errlen) return;
    if (x != floorf(x) || isinf(x))
        snprintf(err, errlen, "gather: index %g is not an integer", (double)x);
    else
        snprintf(err, errlen, "gather: index %.0f out of range for dim %d of size %lld",
                 (double)x, axis, (long long)size);
}

/* The indices, in C order, as positions along the gathered dim; false (err
 * written) at the first one that is not an integer in [-size, size). */
static bool positions(const float *idx, const ExtView *iv, int axis, int64_t size, int64_t *pos,
                      int64_t n, char *err, size_t errlen) {
    for (int64_t j = 0; j < n; j++) {
        float x = idx[iv->offset + offset_of(iv, 0, iv->rank, j)];
        if (!(x == floorf(x) && (double)x >= -(double)size && (double)x < (double)size)) {
            index_error(err, errlen, x, axis, size);
            return false;
        }
        pos[j] = (int64_t)x < 0 ? (int64_t)x + size : (int64_t)x;
    }
    return true;
}

typedef struct {
    const float *data;
    const ExtView *dv;
    int axis;
    const int64_t *pos;
    int64_t nidx, inner;        /* indices; elements per output row */
    float *out;
    ExtEpilogue epi;
    void *ctx;
} Gather;

/* Output row r: data[o, pos[j], :] with o = r / nidx, j = r % nidx. */
static void gather_row(const Gather *G, int64_t r) {
    const ExtView *v = G->dv;
    int a = G->axis, last = v->rank - 1;
    const float *src = G->data + v->offset + offset_of(v, 0, a, r / G->nidx) +
                       G->pos[r % G->nidx] * v->stride[a];
    float *dst = G->out + r * G->inner;
    if (a == last) {
        dst[0] = src[0];
        return;
    }
    int64_t len = v->shape[last], step = v->stride[last];
    for (int64_t k = 0; k < G->inner; k += len) {
        const float *s = src + offset_of(v, a + 1, last, k / len);
        if (step == 1) memcpy(dst + k, s, sizeof(float) * (size_t)len);
        else
            for (int64_t m = 0; m < len; m++) dst[k + m] = s[m * step];
    }
}

int ext_gather(const float *data, const ExtView *dv, const float *idx, const ExtView *iv,
               int axis, float *out, ExtEpilogue epi, void *ctx, char *err, size_t errlen) {
    int64_t nidx = util_numel(iv->rank, iv->shape), outer = util_numel(axis, dv->shape);
    int64_t inner = util_numel(dv->rank - axis - 1, dv->shape + axis + 1);
    int64_t *pos = kmalloc(sizeof(int64_t) * (size_t)(nidx > 0 ? nidx : 1));
    if (!pos) return -1;
    if (!positions(idx, iv, axis, dv->shape[axis], pos, nidx, err, errlen)) {
        kfree(pos);
        return EXT_ERR_INPUT;
    }
    Gather G = {data, dv, axis, pos, nidx, inner, out, epi, ctx};
    int64_t rows = outer * nidx, per = inner >= PIECE_ELEMS ? 1 : PIECE_ELEMS / inner;
    int64_t pieces = (rows + per - 1) / per;
    #pragma omp parallel for schedule(static) if (rows * inner >= PARALLEL_MIN)
    for (int64_t p = 0; p < pieces; p++) {
        int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
        for (int64_t r = r0; r < r1; r++) gather_row(&G, r);
        if (epi) epi(ctx, out, r0 * inner, (r1 - r0) * inner);
    }
    kfree(pos);
    return 0;
}

/* ---- conv_transpose2d --------------------------------------------------------- */

typedef struct {
    int64_t n, c, h, w;         /* input */
    int64_t o, kh, kw;          /* output channels (all groups); kernel */
    int64_t oh, ow;             /* output spatial */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} CtShape;

static CtShape ct_shape(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                        const int64_t attr[9]) {
    CtShape s = {xs[0], xs[1], xs[2], xs[3], ys[1], ws[2], ws[3], ys[2], ys[3],
                 attr[0], attr[1], attr[2], attr[3], attr[6], attr[7], attr[8]};
    return s;
}

/* One output plane from its kh*kw rows of col (each h*w, one per input
 * pixel): input pixel (ih, iw) through tap (i, j) lands on output
 * (ih*sh - ph + i*dh, iw*sw - pw + j*dw) when that is inside. */
static void col2im_plane(const CtShape *s, const float *col, float *yp, float b) {
    for (int64_t k = 0; k < s->oh * s->ow; k++) yp[k] = b;
    for (int64_t i = 0; i < s->kh; i++)
        for (int64_t j = 0; j < s->kw; j++) {
            const float *cr = col + (i * s->kw + j) * s->h * s->w;
            for (int64_t ih = 0; ih < s->h; ih++) {
                int64_t oy = ih * s->sh - s->ph + i * s->dh;
                if (oy < 0 || oy >= s->oh) continue;
                float *yr = yp + oy * s->ow;
                for (int64_t iw = 0; iw < s->w; iw++) {
                    int64_t ox = iw * s->sw - s->pw + j * s->dw;
                    if (ox >= 0 && ox < s->ow) yr[ox] += cr[ih * s->w + iw];
                }
            }
        }
}

int ext_conv_transpose2d(const float *x, const int64_t xs[4], const float *w,
                         const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                         const int64_t attr[9], ExtEpilogue epi, void *ctx) {
    ext_blas_init(); /* OpenBLAS's kernel choice, as every sgemm caller */
    CtShape s = ct_shape(xs, ws, ys, attr);
    int64_t cig = s.c / s.groups, cog = s.o / s.groups, taps = s.kh * s.kw;
    int64_t hw = s.h * s.w, plane = s.oh * s.ow, rows = cog * taps;
    float *col = kmalloc(sizeof(float) * (size_t)(rows * hw));
    if (!col) return -1;
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t g = 0; g < s.groups; g++) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)rows, (int)hw, (int)cig,
                        1.0f, w + g * cig * rows, (int)rows, x + (n * s.c + g * cig) * hw,
                        (int)hw, 0.0f, col, (int)hw);
            #pragma omp parallel for schedule(static) if (rows * hw + cog * plane >= PARALLEL_MIN)
            for (int64_t c = 0; c < cog; c++) {
                int64_t oc = g * cog + c, at = (n * s.o + oc) * plane;
                col2im_plane(&s, col + c * taps * hw, y + at, bias ? bias[oc] : 0.0f);
                if (epi) epi(ctx, y, at, plane);
            }
        }
    kfree(col);
    return 0;
}
