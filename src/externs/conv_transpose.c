/*
 * conv_transpose.c -- conv_transpose2d (sgemm + col2im), the library kernel
 * behind the extern op. The contract is in externs.h.
 *
 * conv_transpose2d scatters instead of gathering: per (image, group),
 * col = W_g^T X_g, one sgemm of (C_out/g * kH * kW) x (H * W) over C_in/g,
 * then col2im adds each column entry into the output pixel its tap lands
 * on. Output planes are disjoint, so col2im runs one plane per thread
 * (starting from the bias) and that thread runs the epilogue of its plane.
 * Where the taps never overlap (the kernel as large as the stride, no
 * padding, dilation 1: the 2x2 stride-2 upsampling of FPN-style text
 * detectors), col2im is a shuffle, each output row its kw rows of col
 * interleaved (shuffle_plane), with the same bits: b + the one tap.
 */
#include "externs/externs.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- conv_transpose2d --------------------------------------------------------- */

typedef struct {
    int64_t n, c, h, w; /* input */
    int64_t o, kh, kw;  /* output channels (all groups); kernel */
    int64_t oh, ow;     /* output spatial */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} CtShape;

static CtShape ct_shape(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                        const int64_t attr[9]) {
    CtShape s = {xs[0], xs[1],   xs[2],   xs[3],   ys[1],   ws[2],   ws[3],   ys[2],
                 ys[3], attr[0], attr[1], attr[2], attr[3], attr[6], attr[7], attr[8]};
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

/* Do the taps tile the output with no overlap and no gap (kernel = stride,
 * no padding, dilation 1, no output padding)? */
static bool ct_disjoint(const CtShape *s) {
    return s->kh == s->sh && s->kw == s->sw && s->ph == 0 && s->pw == 0 && s->dh == 1 &&
           s->dw == 1 && s->oh == s->h * s->sh && s->ow == s->w * s->sw;
}

/* col2im_plane for a shape ct_disjoint takes: output row ih sh + i is, for
 * each input column iw, b plus col rows (i, 0), ..., (i, kw - 1) at iw in
 * turn; two taps across (kw 2) interleaved four columns at a time. */
static void shuffle_plane(const CtShape *s, const float *col, float *yp, float b) {
    int64_t hw = s->h * s->w;
    for (int64_t ih = 0; ih < s->h; ih++)
        for (int64_t i = 0; i < s->kh; i++) {
            float *yr = yp + (ih * s->sh + i) * s->ow;
            const float *cr = col + i * s->kw * hw + ih * s->w;
            int64_t iw = 0;
#if defined(__SSE2__)
            if (s->kw == 2) {
                __m128 bv = _mm_set1_ps(b);
                for (; iw + 4 <= s->w; iw += 4) {
                    __m128 a = _mm_add_ps(bv, _mm_loadu_ps(cr + iw));
                    __m128 c = _mm_add_ps(bv, _mm_loadu_ps(cr + hw + iw));
                    _mm_storeu_ps(yr + 2 * iw, _mm_unpacklo_ps(a, c));
                    _mm_storeu_ps(yr + 2 * iw + 4, _mm_unpackhi_ps(a, c));
                }
            }
#endif
            for (; iw < s->w; iw++)
                for (int64_t j = 0; j < s->kw; j++) yr[iw * s->kw + j] = b + cr[j * hw + iw];
        }
}

int ext_conv_transpose2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                         const float *bias, float *y, const int64_t ys[4], const int64_t attr[9],
                         ExtEpilogue epi, void *ctx) {
    ext_blas_init(); /* OpenBLAS's kernel choice, as every sgemm caller */
    CtShape s = ct_shape(xs, ws, ys, attr);
    int64_t cig = s.c / s.groups, cog = s.o / s.groups, taps = s.kh * s.kw;
    int64_t hw = s.h * s.w, plane = s.oh * s.ow, rows = cog * taps;
    float *col = kmalloc(sizeof(float) * (size_t)(rows * hw));
    if (!col) return -1;
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t g = 0; g < s.groups; g++) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)rows, (int)hw, (int)cig, 1.0f,
                        w + g * cig * rows, (int)rows, x + (n * s.c + g * cig) * hw, (int)hw, 0.0f,
                        col, (int)hw);
#pragma omp parallel for schedule(static) if (rows * hw + cog * plane >= EXT_EPI_PARALLEL_MIN)
            for (int64_t c = 0; c < cog; c++) {
                int64_t oc = g * cog + c, at = (n * s.o + oc) * plane;
                (ct_disjoint(&s) ? shuffle_plane : col2im_plane)(&s, col + c * taps * hw, y + at,
                                                                 bias ? bias[oc] : 0.0f);
                if (epi) epi(ctx, y, at, plane);
            }
        }
    kfree(col);
    return 0;
}

const char *ext_conv_transpose_path(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                                    const int64_t attr[9]) {
    CtShape s = ct_shape(xs, ws, ys, attr);
    return ct_disjoint(&s) ? "OpenBLAS sgemm, then a shuffle of its columns (taps that tile)"
                           : "OpenBLAS sgemm, then col2im";
}
