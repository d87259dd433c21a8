/*
 * gather.c -- gather (numpy.take), the library kernel behind the extern op.
 * The contract is in externs.h; the calling conventions (views, epilogues,
 * threads) are those of matmul.c and common.c.
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
 */
#include "externs/externs.h"
#include <math.h>
#include <omp.h>
#include <string.h>

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
        snprintf(err, errlen, "gather: index %.0f out of range for dim %d of size %lld", (double)x,
                 axis, (long long)size);
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
    int64_t nidx, inner; /* indices; elements per output row */
    float *out;
    ExtEpilogue epi;
    void *ctx;
} Gather;

/* Output row r: data[o, pos[j], :] with o = r / nidx, j = r % nidx. */
static void gather_row(const Gather *G, int64_t r) {
    const ExtView *v = G->dv;
    int a = G->axis, last = v->rank - 1;
    const float *src =
        G->data + v->offset + offset_of(v, 0, a, r / G->nidx) + G->pos[r % G->nidx] * v->stride[a];
    float *dst = G->out + r * G->inner;
    if (a == last) {
        dst[0] = src[0];
        return;
    }
    int64_t len = v->shape[last], step = v->stride[last];
    for (int64_t k = 0; k < G->inner; k += len) {
        const float *s = src + offset_of(v, a + 1, last, k / len);
        if (step == 1)
            memcpy(dst + k, s, sizeof(float) * (size_t)len);
        else
            for (int64_t m = 0; m < len; m++) dst[k + m] = s[m * step];
    }
}

int ext_gather(const float *data, const ExtView *dv, const float *idx, const ExtView *iv, int axis,
               float *out, ExtEpilogue epi, void *ctx, char *err, size_t errlen) {
    int64_t nidx = util_numel(iv->rank, iv->shape), outer = util_numel(axis, dv->shape);
    int64_t inner = util_numel(dv->rank - axis - 1, dv->shape + axis + 1);
    int64_t *pos = kmalloc(sizeof(int64_t) * (size_t)(nidx > 0 ? nidx : 1));
    if (!pos) return -1;
    if (!positions(idx, iv, axis, dv->shape[axis], pos, nidx, err, errlen)) {
        kfree(pos);
        return EXT_ERR_INPUT;
    }
    Gather G = {data, dv, axis, pos, nidx, inner, out, epi, ctx};
    int64_t rows = outer * nidx, per = inner >= EXT_EPI_PIECE ? 1 : EXT_EPI_PIECE / inner;
    int64_t pieces = (rows + per - 1) / per;
#pragma omp parallel for schedule(static) if (rows * inner >= EXT_EPI_PARALLEL_MIN)
    for (int64_t p = 0; p < pieces; p++) {
        int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
        for (int64_t r = r0; r < r1; r++) gather_row(&G, r);
        if (epi) epi(ctx, out, r0 * inner, (r1 - r0) * inner);
    }
    kfree(pos);
    return 0;
}
