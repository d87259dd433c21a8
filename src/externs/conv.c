/*
 * conv.c -- conv2d: the dispatch among its backends and kiln's own paths.
 * oneDNN (conv_dnnl.c) runs most shapes; 1x1 stride-1 convolutions are
 * kiln's own GEMM (conv1x1.c; one sgemm per image without AVX2), and
 * depthwise ones with large planes run direct loops (below); im2col +
 * sgemm takes what oneDNN declines, or everything with the im2col backend
 * (a test hook, src/testing.h). The epilogue runs on each (image, group)
 * slab, or each output plane of a depthwise convolution, as it is done.
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
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- conv2d ---------------------------------------------------------------- */

typedef struct {
    int64_t n, c, h, w; /* input */
    int64_t o, kh, kw;  /* weight: o x (c/groups) x kh x kw */
    int64_t oh, ow;     /* output spatial */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} ConvShape;

static ConvShape conv_shape(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                            const int64_t attr[7]) {
    ConvShape s = {xs[0], xs[1],   xs[2],   xs[3],   ws[0],   ws[2],   ws[3],   ys[2],
                   ys[3], attr[0], attr[1], attr[2], attr[3], attr[4], attr[5], attr[6]};
    return s;
}

/* Depthwise (one input and one output channel per group): direct loops
 * on kiln's NCHW planes, no reorder. A 3x3 or 5x5 at strides 1 or 2 runs
 * in blocks of output rows: with AVX-512 from the plane itself (dw3_rows),
 * with AVX2 from a padded copy (dw8_rows). Otherwise each thread copies a
 * plane into a zero-padded buffer of its own (pad_plane), so that every
 * filter tap is a plain load without bounds tests; a 3x3 filter then
 * computes each output row in one vectorized pass with its nine taps in
 * registers; other sizes at stride 1 compute the whole plane as one
 * flattened row (dw_plane), at other strides a row in one pass per tap
 * (dw_row). The thread that computed a plane runs the epilogue on it
 * while it is in cache. */
typedef struct {
    int64_t ph, pw; /* rows and columns of the padded plane */
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

/* The library is built for any x86-64 (SSE2); these loops also get AVX2 and
 * AVX-512 versions (4-wide SSE alone leaves them slow: docs/decisions.md:
 * Depthwise rows in AVX2 and AVX-512), and the caller picks one by the
 * features the program's target tier allows (ext_cpu_features: level 2
 * AVX-512, 1 AVX2 + FMA, 0 SSE), not by the CPU alone as GCC's target_clones
 * would: no AVX-512 instruction runs under a v3 target. The three bodies are
 * the same C (not contracted to FMAs under -std=c11), so they give the same
 * bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DW_ISA2 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define DW_ISA1 __attribute__((target("avx2,fma")))
/* name##_l2, _l1 and _l0 from one body, and name(level, ...) picking one
 * (laid out by hand: one declaration per line) */
/* clang-format off */
#define DW_VERSIONS(name, params, args)                                                      \
    DW_ISA2 static void name##_l2 params DW_BODY_##name                                      \
    DW_ISA1 static void name##_l1 params DW_BODY_##name                                      \
    static void name##_l0 params DW_BODY_##name                                              \
    static void name(int level, DW_PARAMS_##name) {                                          \
        if (level >= 2) name##_l2 args;                                                      \
        else if (level == 1) name##_l1 args;                                                 \
        else name##_l0 args;                                                                 \
    }
#else
#define DW_VERSIONS(name, params, args)                                                      \
    static void name##_l0 params DW_BODY_##name                                              \
    static void name(int level, DW_PARAMS_##name) { (void)level; name##_l0 args; }
/* clang-format on */
#endif

/* One output row of a 3x3 filter: the nine taps of each output in one
 * expression, the output row written once. The column stride is a
 * constant in each instance (1 and 2 get their own, so the loads are
 * contiguous or a shuffle of two; a runtime stride would make gathers). */
#define DW_ROW3_BODY(SW)                                                                   \
    {                                                                                      \
        float k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3], k4 = k[4], k5 = k[5], k6 = k[6], \
              k7 = k[7], k8 = k[8];                                                        \
        int64_t e2 = 2 * e1;                                                               \
        (void)sw;                                                                          \
        _Pragma("omp simd") for (int64_t o = 0; o < ow; o++) {                             \
            int64_t i = o * (SW);                                                          \
            yr[o] = b + k0 * r0[i] + k1 * r0[i + e1] + k2 * r0[i + e2] + k3 * r1[i] +      \
                    k4 * r1[i + e1] + k5 * r1[i + e2] + k6 * r2[i] + k7 * r2[i + e1] +     \
                    k8 * r2[i + e2];                                                       \
        }                                                                                  \
    }
#define DW_ROW3_PARAMS                                                                      \
    const float *r0, const float *r1, const float *r2, const float *k, float b, int64_t e1, \
        int64_t ow, int64_t sw, float *restrict yr
#define DW_ROW3_ARGS (r0, r1, r2, k, b, e1, ow, sw, yr)
#define DW_BODY_dw_row3_s1 DW_ROW3_BODY(1)
#define DW_BODY_dw_row3_s2 DW_ROW3_BODY(2)
#define DW_BODY_dw_row3_sn DW_ROW3_BODY(sw)
#define DW_PARAMS_dw_row3_s1 DW_ROW3_PARAMS
#define DW_PARAMS_dw_row3_s2 DW_ROW3_PARAMS
#define DW_PARAMS_dw_row3_sn DW_ROW3_PARAMS
DW_VERSIONS(dw_row3_s1, (DW_ROW3_PARAMS), DW_ROW3_ARGS)

/* Column stride 2 without AVX-512: the padded plane is stored with each
 * row split, its even columns first (ne = (pw + 1) / 2 of them), then its
 * odd ones (pad_plane_split), so that every tap reads contiguous floats:
 * padded column 2 o + j dw is at o + t_j, t_j = j dw / 2 for even j dw,
 * ne + (j dw - 1) / 2 for odd. On the interleaved row the AVX2 loop took
 * two cross-lane permutes per tap (vpermd, slow on AMD Zen 1: MobileNetV2's
 * stride-2 layers at 3.1 GFLOP/s, docs/decisions.md: Depthwise rows). The
 * sum is dw_row3_s2's, term for term: the same bits. */
#define DW_ROW3S_PARAMS                                                                     \
    const float *r0, const float *r1, const float *r2, const float *k, float b, int64_t t1, \
        int64_t t2, int64_t ow, float *restrict yr
#define DW_PARAMS_dw_row3_split DW_ROW3S_PARAMS
#define DW_BODY_dw_row3_split                                                              \
    {                                                                                      \
        float k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3], k4 = k[4], k5 = k[5], k6 = k[6], \
              k7 = k[7], k8 = k[8];                                                        \
        _Pragma("omp simd") for (int64_t o = 0; o < ow; o++) {                             \
            yr[o] = b + k0 * r0[o] + k1 * r0[o + t1] + k2 * r0[o + t2] + k3 * r1[o] +      \
                    k4 * r1[o + t1] + k5 * r1[o + t2] + k6 * r2[o] + k7 * r2[o + t1] +     \
                    k8 * r2[o + t2];                                                       \
        }                                                                                  \
    }
DW_VERSIONS(dw_row3_split, (DW_ROW3S_PARAMS), (r0, r1, r2, k, b, t1, t2, ow, yr))

/* xr[2 m] to ev[m], xr[2 m + 1] to od[m], for the w floats of xr: two
 * loads and two shuffles per 8 floats (baseline x86-64 has SSE2); a strided
 * loop in its place was most of the convolution's time. */
static void split_row(const float *restrict xr, int64_t w, float *restrict ev, float *restrict od) {
    int64_t m = 0;
#ifdef __SSE2__
    for (; 2 * m + 8 <= w; m += 4) {
        __m128 lo = _mm_loadu_ps(xr + 2 * m), hi = _mm_loadu_ps(xr + 2 * m + 4);
        _mm_storeu_ps(ev + m, _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm_storeu_ps(od + m, _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
    }
#endif
    for (; 2 * m < w; m++) {
        ev[m] = xr[2 * m];
        if (2 * m + 1 < w) od[m] = xr[2 * m + 1];
    }
}

static void pad_plane_split(const ConvShape *s, PadDims d, const float *xp, float *P) {
    int64_t ne = (d.pw + 1) / 2, p = s->pw;
    for (int64_t ih = 0; ih < s->h; ih++) {
        float *pr = P + (ih + s->ph) * d.pw;
        /* x's even columns land in the padded row's even ones when p is even */
        if (p % 2 == 0)
            split_row(xp + ih * s->w, s->w, pr + p / 2, pr + ne + p / 2);
        else
            split_row(xp + ih * s->w, s->w, pr + ne + (p - 1) / 2, pr + (p + 1) / 2);
    }
}
DW_VERSIONS(dw_row3_s2, (DW_ROW3_PARAMS), DW_ROW3_ARGS)
DW_VERSIONS(dw_row3_sn, (DW_ROW3_PARAMS), DW_ROW3_ARGS)

/* With AVX-512, column strides 1 and 2 run these instead: vectors of 16
 * outputs with the last one's store masked, where the loops above, with
 * GCC's scalar remainder, ran MobileNetV2's rows of 7, 14, 28 and 56
 * outputs mostly or wholly in scalar code. The loads of the last vector
 * may run up to 16 * stride floats past its row: the padded plane has
 * DW_SLACK floats more than its rows, zeroed. */
#define DW_SLACK 64

/* The shapes the row blocks (dw3_rows, dw8_rows) take, DW3_ROWS output
 * rows at a time: 3x3 and 5x5, each stride 1 or 2. */
#define DW3_ROWS 4

static bool dw3_fits(const ConvShape *s) {
    return s->kh == s->kw && (s->kh == 3 || s->kh == 5) && s->dh == 1 && s->dw == 1 &&
           (s->sh == 1 || s->sh == 2) && (s->sw == 1 || s->sw == 2);
}
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DW_AVX512 1
#define DW_TARGET __attribute__((target("avx512f")))

/* 16 floats p[0], p[sw], ..., p[15 sw], for sw 1 or 2 (the even elements
 * of 32, picked by a permute). */
static inline __attribute__((always_inline)) DW_TARGET __m512 dw_load(const float *p, int sw) {
    if (sw == 1) return _mm512_loadu_ps(p);
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
}

/* One output row of a 3x3 filter, sw a constant; three accumulators (one
 * per filter column) to shorten the chain of dependent FMAs. */
static inline __attribute__((always_inline)) DW_TARGET void
dw_row3_v(const int sw, const float *r0, const float *r1, const float *r2, const float *k, float b,
          int64_t e1, int64_t ow, float *yr) {
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
        if (ow - o >= 16)
            _mm512_storeu_ps(yr + o, acc);
        else
            _mm512_mask_storeu_ps(yr + o, (__mmask16)((1u << (ow - o)) - 1u), acc);
    }
}

static DW_TARGET void dw_row3_v1(const float *r0, const float *r1, const float *r2, const float *k,
                                 float b, int64_t e1, int64_t ow, float *yr) {
    dw_row3_v(1, r0, r1, r2, k, b, e1, ow, yr);
}
static DW_TARGET void dw_row3_v2(const float *r0, const float *r1, const float *r2, const float *k,
                                 float b, int64_t e1, int64_t ow, float *yr) {
    dw_row3_v(2, r0, r1, r2, k, b, e1, ow, yr);
}

/* 3x3 and 5x5 filters at strides of 1 or 2 each (dilation 1), with AVX-512,
 * straight from the NCHW plane: no padded copy (at stride 2 that copy took
 * as long as the arithmetic), each tap's vector a masked load that reads
 * zero where its columns fall in the padding, rows in the padding skipped.
 * A block of DW3_ROWS output rows at a time: each input row is loaded once
 * per vector of 16 outputs and used by every output row of the block it
 * serves (K at stride 1, about K / 2 at stride 2), its shifted taps made
 * by valignd (stride 1) or by permutes of its even and odd columns (stride
 * 2). dw_row3_v loads every tap of every output row, nine unaligned loads
 * per vector from a padded copy, and ran MobileNetV2's layers at 9-37
 * GFLOP/s on an AMD Zen 4 where oneDNN's blocked kernel reaches 40-80
 * (docs/decisions.md: Depthwise filters in row blocks). Each output adds
 * b, then its taps row by row, as FMAs. */

/* The lanes of 16 floats from column c on that lie in [0, w). */
static inline __attribute__((always_inline)) __mmask16 dw3_cols(int64_t c, int64_t w) {
    if (c >= 0 && c + 16 <= w) return (__mmask16)0xffff;
    int64_t lo = c < 0 ? -c : 0, hi = w - c < 16 ? w - c : 16;
    if (hi <= lo) return 0;
    return (__mmask16)((((1u << hi) - 1u) >> lo) << lo);
}

/* R output rows from input rows ih0, ih0 + 1, ... of the plane xp (h x w),
 * K, sh and sw constants: input row ih0 + t serves output row r with
 * filter row t - sh r. */
static inline __attribute__((always_inline)) DW_TARGET void
dw3_rows(const int R, const int K, const int sh, const int sw, const ConvShape *s, const float *xp,
         int64_t ih0, const float *k, __m512 bv, float *y) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    /* a vector's lanes 1..15, then lane 0 (next0) or 1 (next1) of the one
     * after; next2: lanes 2..15, then 0 and 2 of the one after */
    const __m512i next0 = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    const __m512i next1 = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17);
    const __m512i next2 = _mm512_setr_epi32(2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18);
    int64_t w = s->w, ow = s->ow;
    for (int64_t o = 0; o < ow; o += 16) {
        int64_t c0 = o * sw - s->pw; /* the column of output o's first tap */
        __mmask16 m0 = dw3_cols(c0, w), m1 = dw3_cols(c0 + 16, w), m2 = dw3_cols(c0 + 32, w);
        __m512 acc[DW3_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = bv;
#pragma GCC unroll 11
        for (int t = 0; t < sh * (R - 1) + K; t++) {
            int64_t ih = ih0 + t;
            if (ih < 0 || ih >= s->h) continue;
            const float *row = xp + ih * w;
            __m512 v[5];
            if (sw == 1) {
                __m512i a = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, row + c0));
                __m512i n = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, row + c0 + 16));
                v[0] = _mm512_castsi512_ps(a);
                v[1] = _mm512_castsi512_ps(_mm512_alignr_epi32(n, a, 1));
                v[2] = _mm512_castsi512_ps(_mm512_alignr_epi32(n, a, 2));
                if (K > 3) {
                    v[3] = _mm512_castsi512_ps(_mm512_alignr_epi32(n, a, 3));
                    v[4] = _mm512_castsi512_ps(_mm512_alignr_epi32(n, a, 4));
                }
            } else {
                __m512 a = _mm512_maskz_loadu_ps(m0, row + c0);
                __m512 b = _mm512_maskz_loadu_ps(m1, row + c0 + 16);
                __m512 c = _mm512_maskz_loadu_ps(m2, row + c0 + 32);
                v[0] = _mm512_permutex2var_ps(a, even, b);
                v[1] = _mm512_permutex2var_ps(a, odd, b);
                v[2] = _mm512_permutex2var_ps(v[0], next0, c);
                if (K > 3) {
                    v[3] = _mm512_permutex2var_ps(v[1], next1, c);
                    v[4] = _mm512_permutex2var_ps(v[0], next2, c);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                int i = t - sh * r;
                if (i < 0 || i >= K) continue;
#pragma GCC unroll 5
                for (int j = 0; j < K; j++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(k[i * K + j]), v[j], acc[r]);
            }
        }
        __mmask16 m = ow - o >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ow - o)) - 1u);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + r * ow + o, m, acc[r]);
    }
}

#define DW3_PLANE(K, SH, SW)                                                              \
    static DW_TARGET void dw3_plane_##K##_##SH##SW(const ConvShape *s, const float *xp,   \
                                                   const float *k, float b, float *yp) {  \
        __m512 bv = _mm512_set1_ps(b);                                                    \
        int64_t oh = 0;                                                                   \
        for (; oh + DW3_ROWS <= s->oh; oh += DW3_ROWS)                                    \
            dw3_rows(DW3_ROWS, K, SH, SW, s, xp, oh *SH - s->ph, k, bv, yp + oh * s->ow); \
        int64_t ih0 = oh * SH - s->ph;                                                    \
        float *yr = yp + oh * s->ow;                                                      \
        switch (s->oh - oh) {                                                             \
        case 3: dw3_rows(3, K, SH, SW, s, xp, ih0, k, bv, yr); break;                     \
        case 2: dw3_rows(2, K, SH, SW, s, xp, ih0, k, bv, yr); break;                     \
        case 1: dw3_rows(1, K, SH, SW, s, xp, ih0, k, bv, yr); break;                     \
        default: break;                                                                   \
        }                                                                                 \
    }
/* every stride pair: 2x1 is the text models' (PaddleOCR's recognizer and
 * direction classifier halve the height alone) */
DW3_PLANE(3, 1, 1)
DW3_PLANE(3, 2, 2)
DW3_PLANE(3, 2, 1)
DW3_PLANE(3, 1, 2)
DW3_PLANE(5, 1, 1)
DW3_PLANE(5, 2, 2)
DW3_PLANE(5, 2, 1)
DW3_PLANE(5, 1, 2)

/* One plane of a shape dw3_runs takes. */
static DW_TARGET void dw3_plane(const ConvShape *s, const float *xp, const float *k, float b,
                                float *yp) {
    typedef void Plane(const ConvShape *, const float *, const float *, float, float *);
    static Plane *const planes[2][2][2] = {
        {{dw3_plane_3_11, dw3_plane_3_12}, {dw3_plane_3_21, dw3_plane_3_22}},
        {{dw3_plane_5_11, dw3_plane_5_12}, {dw3_plane_5_21, dw3_plane_5_22}}};
    planes[s->kh == 5][s->sh == 2][s->sw == 2](s, xp, k, b, yp);
}

static bool dw3_runs(const ConvShape *s) {
    return ext_isa_level(ext_cpu_features()) >= 2 && dw3_fits(s);
}
#else
#define DW_AVX512 0
static bool dw3_runs(const ConvShape *s) {
    (void)s;
    return false;
}
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
    if (s->sw == 1)
        dw_row3_s1(level, r0, r1, r2, k, b, s->dw, s->ow, 1, yr);
    else if (s->sw == 2)
        dw_row3_s2(level, r0, r1, r2, k, b, s->dw, s->ow, 2, yr);
    else
        dw_row3_sn(level, r0, r1, r2, k, b, s->dw, s->ow, s->sw, yr);
}

/* One output row of any filter: a pass per tap. */
#define DW_ROW_PARAMS                                                                   \
    const ConvShape *s, PadDims d, const float *P, const float *k, float b, int64_t oh, \
        float *restrict yr
#define DW_PARAMS_dw_row DW_ROW_PARAMS
#define DW_BODY_dw_row                                                                            \
    {                                                                                             \
        for (int64_t o = 0; o < s->ow; o++) yr[o] = b;                                            \
        for (int64_t i = 0; i < s->kh; i++) {                                                     \
            const float *pr = P + (oh * s->sh + i * s->dh) * d.pw;                                \
            for (int64_t j = 0; j < s->kw; j++) {                                                 \
                float kv = k[i * s->kw + j];                                                      \
                const float *pc = pr + j * s->dw;                                                 \
                int64_t sw = s->sw;                                                               \
                _Pragma("omp simd") for (int64_t o = 0; o < s->ow; o++) yr[o] += kv * pc[o * sw]; \
            }                                                                                     \
        }                                                                                         \
    }
DW_VERSIONS(dw_row, (DW_ROW_PARAMS), (s, d, P, k, b, oh, yr))

const char *ext_path_isa(const char *path) {
    static _Thread_local char buf[96];
    static const char *const own[] = {"SSE", "AVX2 + FMA", "AVX-512 (16-wide rows)"};
    if (strstr(path, "oneDNN"))
        util_fmt(buf, sizeof buf, "oneDNN's %s kernels", ext_dnnl_isa());
    else if (strstr(path, "OpenBLAS"))
        util_fmt(buf, sizeof buf, "OpenBLAS's %s kernels", ext_blas_core());
    else if (strstr(path, "1x1 GEMM"))
        util_fmt(buf, sizeof buf, "%s",
                 ext_isa_level(ext_cpu_features()) >= 2 ? "AVX-512" : "AVX2 + FMA");
    else
        util_fmt(buf, sizeof buf, "%s", own[ext_isa_level(ext_cpu_features())]);
    return buf;
}

/* A stride-1 filter of any size other than 3x3, over the whole padded
 * plane at once: output o of the plane flattened at the padded row pitch
 * d.pw is b plus the taps k[i][j] P[o + i dh pw + j dw] in dw_row's order
 * (so the same bits), 16 outputs at a time in one vector accumulator; the
 * rows then go to y without their pw - ow padding columns. dw_row's loops
 * over rows of 7 or 14 outputs ran in scalar remainders, a pass over the
 * row per tap: a 5x5 depthwise at 14x14 ran at 3.5 GFLOP/s. The last
 * vector's loads run up to 15 floats past the plane, into DW_SLACK; Q holds
 * oh * pw + 16 floats. */
typedef float DwV16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef float DwV8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef float DwV4 __attribute__((vector_size(16), aligned(4), may_alias));
#define DW_PLANE_PARAMS \
    const ConvShape *s, PadDims d, const float *P, const float *k, float b, float *restrict Q
/* The 16 outputs in 16 / W vectors of W lanes, each as wide as the
 * version's registers: a 16-lane vector in an AVX2 function is no register
 * at all, and GCC kept it in memory, stored and reloaded in halves at
 * every tap (2.9 GFLOP/s for a 5x5 at 28x28 on a Zen 1: docs/decisions.md:
 * Depthwise rows in AVX2 and AVX-512). Each lane adds its taps in the same
 * order whatever W, so every version gives the same bits (b - 0 is b, -0
 * included). */
#define DW_PLANE_BODY(V, W)                                                                  \
    {                                                                                        \
        enum { NV = 16 / (W) };                                                              \
        int64_t len = (s->oh - 1) * d.pw + s->ow;                                            \
        for (int64_t o0 = 0; o0 < len; o0 += 16) {                                           \
            V acc[NV];                                                                       \
            _Pragma("GCC unroll 4") for (int h = 0; h < NV; h++) acc[h] = b - (V){0};        \
            for (int64_t i = 0; i < s->kh; i++)                                              \
                for (int64_t j = 0; j < s->kw; j++) {                                        \
                    const float *pc = P + o0 + i * s->dh * d.pw + j * s->dw;                 \
                    float kv = k[i * s->kw + j];                                             \
                    _Pragma("GCC unroll 4") for (int h = 0; h < NV; h++) acc[h] +=           \
                        kv * *(const V *)(pc + h * (W));                                     \
                }                                                                            \
            _Pragma("GCC unroll 4") for (int h = 0; h < NV; h++) * (V *)(Q + o0 + h * (W)) = \
                acc[h];                                                                      \
        }                                                                                    \
    }
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
/* clang-format off */
DW_ISA2 static void dw_plane_l2(DW_PLANE_PARAMS) DW_PLANE_BODY(DwV16, 16)
DW_ISA1 static void dw_plane_l1(DW_PLANE_PARAMS) DW_PLANE_BODY(DwV8, 8)
static void dw_plane_l0(DW_PLANE_PARAMS) DW_PLANE_BODY(DwV4, 4)
static void dw_plane(int level, DW_PLANE_PARAMS) {
    if (level >= 2) dw_plane_l2(s, d, P, k, b, Q);
    else if (level == 1) dw_plane_l1(s, d, P, k, b, Q);
    else dw_plane_l0(s, d, P, k, b, Q);
}
/* clang-format on */
#else
static void dw_plane(int level, DW_PLANE_PARAMS) {
    (void)level;
    DW_PLANE_BODY(DwV4, 4)
}
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
/* The row blocks of dw3_rows without AVX-512 (AVX2 + FMA, 8 lanes): the
 * same blocks of output rows, each input row loaded once per vector for
 * all of them, from the zero-padded plane (pad_plane; at stride 2 split
 * into even and odd columns, pad_plane_split, so every tap is a
 * contiguous load): AVX2 has no masked loads that are cheap on AMD nor
 * permutes across its two halves that are. The last vector's loads run up
 * to 7 + K floats past a row, into the next or DW_SLACK; its store is
 * masked. */
/* R output rows from the padded rows at P on (pw floats apart; the odd
 * columns ne floats into a row at column stride 2), R, K, sh and sw
 * constants. */
static inline __attribute__((always_inline)) DW_ISA1 void
dw8_rows(const int R, const int K, const int sh, const int sw, const ConvShape *s, const float *P,
         int64_t pw, int64_t ne, const float *k, __m256 bv, float *y) {
    for (int64_t o = 0; o < s->ow; o += 8) {
        __m256 acc[DW3_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = bv;
#pragma GCC unroll 11
        for (int t = 0; t < sh * (R - 1) + K; t++) {
            const float *row = P + t * pw + o;
            __m256 v[5];
#pragma GCC unroll 5
            for (int j = 0; j < K; j++)
                v[j] = _mm256_loadu_ps(sw == 1 ? row + j
                                       : j % 2 ? row + ne + (j - 1) / 2
                                               : row + j / 2);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                int i = t - sh * r;
                if (i < 0 || i >= K) continue;
#pragma GCC unroll 5
                for (int j = 0; j < K; j++)
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(k[i * K + j]), v[j], acc[r]);
            }
        }
        if (s->ow - o >= 8) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * s->ow + o, acc[r]);
        } else {
            __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(s->ow - o)),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm256_maskstore_ps(y + r * s->ow + o, m, acc[r]);
        }
    }
}

#define DW8_PLANE(K, SH, SW)                                                                    \
    static DW_ISA1 void dw8_plane_##K##_##SH##SW(const ConvShape *s, PadDims d, const float *P, \
                                                 const float *k, float b, float *yp) {          \
        __m256 bv = _mm256_set1_ps(b);                                                          \
        int64_t ne = (d.pw + 1) / 2, oh = 0;                                                    \
        for (; oh + DW3_ROWS <= s->oh; oh += DW3_ROWS)                                          \
            dw8_rows(DW3_ROWS, K, SH, SW, s, P + oh * SH * d.pw, d.pw, ne, k, bv,               \
                     yp + oh * s->ow);                                                          \
        const float *p = P + oh * SH * d.pw;                                                    \
        float *yr = yp + oh * s->ow;                                                            \
        switch (s->oh - oh) {                                                                   \
        case 3: dw8_rows(3, K, SH, SW, s, p, d.pw, ne, k, bv, yr); break;                       \
        case 2: dw8_rows(2, K, SH, SW, s, p, d.pw, ne, k, bv, yr); break;                       \
        case 1: dw8_rows(1, K, SH, SW, s, p, d.pw, ne, k, bv, yr); break;                       \
        default: break;                                                                         \
        }                                                                                       \
    }
DW8_PLANE(3, 1, 1)
DW8_PLANE(3, 2, 2)
DW8_PLANE(3, 2, 1)
DW8_PLANE(3, 1, 2)
DW8_PLANE(5, 1, 1)
DW8_PLANE(5, 2, 2)
DW8_PLANE(5, 2, 1)
DW8_PLANE(5, 1, 2)

static void dw8_plane(const ConvShape *s, PadDims d, const float *P, const float *k, float b,
                      float *yp) {
    typedef void Plane(const ConvShape *, PadDims, const float *, const float *, float, float *);
    static Plane *const planes[2][2][2] = {
        {{dw8_plane_3_11, dw8_plane_3_12}, {dw8_plane_3_21, dw8_plane_3_22}},
        {{dw8_plane_5_11, dw8_plane_5_12}, {dw8_plane_5_21, dw8_plane_5_22}}};
    planes[s->kh == 5][s->sh == 2][s->sw == 2](s, d, P, k, b, yp);
}
#define DW8 1
#else
#define DW8 0
static void dw8_plane(const ConvShape *s, PadDims d, const float *P, const float *k, float b,
                      float *yp) {
    (void)s, (void)d, (void)P, (void)k, (void)b, (void)yp;
}
#endif

static bool dw_flat(const ConvShape *s) {
    return s->sh == 1 && s->sw == 1 && !(s->kh == 3 && s->kw == 3);
}

/* 0, or -1 when a thread's padded plane cannot be allocated. */
static int conv_depthwise(const ConvShape *s, const float *x, const float *w, const float *bias,
                          float *y, ExtEpilogue epi, void *ctx) {
    PadDims d = pad_dims(s);
    int level = ext_isa_level(ext_cpu_features());
    int failed = 0;
    /* stride 2 in split rows (see dw_row3_split), but not where dw_row3_v2 runs */
    /* row blocks (dw8_rows) on the padded plane with AVX2 */
    bool blk8 = DW8 && level == 1 && dw3_fits(s);
    bool split = s->sw == 2 && ((s->kh == 3 && s->kw == 3 && !(DW_AVX512 && level >= 2)) || blk8);
    int64_t ne = (d.pw + 1) / 2, t1 = (s->dw & 1 ? ne : 0) + s->dw / 2, t2 = s->dw;
#if DW_AVX512
    if (dw3_runs(s)) {
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t n = 0; n < s->n; n++)
            for (int64_t c = 0; c < s->c; c++) {
                int64_t at = (n * s->c + c) * s->oh * s->ow;
                dw3_plane(s, x + (n * s->c + c) * s->h * s->w, w + c * s->kh * s->kw,
                          bias ? bias[c] : 0.0f, y + at);
                if (epi) epi(ctx, y, at, s->oh * s->ow);
            }
        return 0;
    }
#endif
#pragma omp parallel
    {
        bool flat = dw_flat(s) && !blk8;
        float *P = kcalloc((size_t)(d.ph * d.pw + DW_SLACK), sizeof(float));
        float *Q = flat ? kmalloc(sizeof(float) * (size_t)(s->oh * d.pw + 16)) : NULL;
        if (flat && !Q) kfree(P), P = NULL;
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
                const float *xp = x + (n * s->c + c) * s->h * s->w;
                (split ? pad_plane_split : pad_plane)(s, d, xp, P);
                if (blk8) {
                    dw8_plane(s, d, P, k, b, yp);
                    if (epi) epi(ctx, y, (n * s->c + c) * s->oh * s->ow, s->oh * s->ow);
                    continue;
                }
                if (flat) {
                    dw_plane(level, s, d, P, k, b, Q);
                    for (int64_t oh = 0; oh < s->oh; oh++)
                        memcpy(yp + oh * s->ow, Q + oh * d.pw, sizeof(float) * (size_t)s->ow);
                }
                for (int64_t oh = 0; !flat && oh < s->oh; oh++) {
                    const float *r0 = P + oh * s->sh * d.pw;
                    if (split)
                        dw_row3_split(level, r0, r0 + s->dh * d.pw, r0 + 2 * s->dh * d.pw, k, b, t1,
                                      t2, s->ow, yp + oh * s->ow);
                    else if (s->kh == 3 && s->kw == 3)
                        dw_row3(s, d, P, k, b, oh, level, yp + oh * s->ow);
                    else
                        dw_row(level, s, d, P, k, b, oh, yp + oh * s->ow);
                }
                if (epi) epi(ctx, y, (n * s->c + c) * s->oh * s->ow, s->oh * s->ow);
            }
        kfree(P);
        kfree(Q);
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

#ifdef KILN_TESTING
#include "testing.h"
void ext_set_conv_backend(ExtConvBackend b) { conv_backend = b; }
#endif

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
     * as fast as oneDNN with its reorders, and with one group kiln's own
     * GEMM where the CPU has AVX2 or AVX-512 (conv1x1.c: weights packed
     * once, bias and epilogue as the output is written; faster than that
     * sgemm on most shapes). A depthwise one with output planes of DW_DIRECT_PLANE
     * or more runs the direct loops on NCHW: oneDNN's depthwise kernel
     * wants NHWC, and on planes that large the two reorders cost more than
     * the loops (docs/decisions.md: conv2d paths: 1x1 and depthwise); with
     * AVX-512 a 3x3 or 5x5 at stride 1 or 2 does on any plane (dw3_rows
     * beat oneDNN with its reorders on 7x7 planes too), each stride 1 or 2. */
    bool dw_direct = depthwise && (s->oh * s->ow >= DW_DIRECT_PLANE || dw3_runs(s));
    bool dnnl = conv_backend == EXT_CONV_DNNL;
    if (dnnl && direct && s->groups == 1 && ext_isa_level(ext_cpu_features()) >= 1) return PATH_C1;
    if (dnnl && !direct && !dw_direct) return PATH_DNNL;
    if (depthwise) return PATH_DEPTHWISE;
    return direct ? PATH_SGEMM : PATH_IM2COL;
}

/* A conv along H alone (input, filter and output all 1 wide) has the
 * memory of the same conv along W: NCH1 is NC1H. oneDNN's kernels block
 * the output row, which then held one output: magika's 5x1 conv of 256
 * channels over 512 rows ran at 26 GFLOP/s on one thread. So such a conv
 * runs as its transpose: H and W swapped in every shape and attribute
 * (attr: sh sw ph pw dh dw groups). */
typedef struct {
    int64_t xs[4], ws[4], ys[4], attr[7];
} ConvDims;

static void swap64(int64_t *a, int64_t *b) {
    int64_t t = *a;
    *a = *b;
    *b = t;
}

static ConvDims conv_dims(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                          const int64_t attr[7]) {
    ConvDims d;
    memcpy(d.xs, xs, sizeof d.xs);
    memcpy(d.ws, ws, sizeof d.ws);
    memcpy(d.ys, ys, sizeof d.ys);
    memcpy(d.attr, attr, sizeof d.attr);
    if (xs[3] == 1 && ws[3] == 1 && ys[3] == 1 && xs[2] > 1) {
        swap64(&d.xs[2], &d.xs[3]);
        swap64(&d.ws[2], &d.ws[3]);
        swap64(&d.ys[2], &d.ys[3]);
        for (int i = 0; i < 6; i += 2) swap64(&d.attr[i], &d.attr[i + 1]);
    }
    return d;
}

const char *ext_conv_path(const int64_t xs_[4], const int64_t ws_[4], const int64_t ys_[4],
                          const int64_t attr_[7]) {
    ConvDims cd = conv_dims(xs_, ws_, ys_, attr_);
    const int64_t *xs = cd.xs, *ws = cd.ws, *ys = cd.ys, *attr = cd.attr;
    ConvShape s = conv_shape(xs, ws, ys, attr);
    switch (conv_path(&s)) {
    case PATH_DNNL:
        return ext_conv_dnnl_split(ys, ext_get_threads())
                   ? "oneDNN, the images split among the threads (NCHW reordered to its blocked layout and back)"
                   : "oneDNN (NCHW reordered to its blocked layout and back)";
    case PATH_C1: return "kiln's 1x1 GEMM (conv1x1.c)";
    case PATH_DEPTHWISE: return "kiln's depthwise loops on NCHW";
    case PATH_SGEMM: return "OpenBLAS sgemm per image and group";
    case PATH_IM2COL: break;
    }
    return "im2col + OpenBLAS sgemm";
}

static int conv2d(const float *x, const int64_t xs_[4], const float *w, const int64_t ws_[4],
                  const float *bias, float *y, const int64_t ys_[4], const int64_t attr_[7],
                  bool wconst, ExtEpilogue epi, void *ctx) {
    ext_blas_init();
    ConvDims cd = conv_dims(xs_, ws_, ys_, attr_);
    const int64_t *xs = cd.xs, *ws = cd.ws, *ys = cd.ys, *attr = cd.attr;
    ConvShape s = conv_shape(xs, ws, ys, attr);
    bool direct = conv_is_direct(&s), depthwise = conv_is_depthwise(&s);
    ConvPath path = conv_path(&s);
    if (path == PATH_C1) {
        int r = ext_conv1x1(x, s.n, s.c, s.oh * s.ow, w, s.o, bias, y, wconst, epi, ctx);
        if (r <= 0) return r;
    }
    if (path == PATH_DNNL) {
        int r = ext_conv2d_dnnl(x, xs, w, ws, bias, y, ys, attr, wconst, epi, ctx);
        if (r <= 0) return r; /* else oneDNN declined it: im2col */
    }
    if (depthwise) return conv_depthwise(&s, x, w, bias, y, epi, ctx);
    /* (Without AVX2, or on the im2col backend:) the bias goes into the
     * output before the sgemm, which then adds to it (beta 1): OpenBLAS
     * clears the output first when beta is 0 (a memset pass), so the fill
     * costs what that pass cost, and the separate bias pass after the call
     * goes (docs/decisions.md: Bias filled before the sgemm). The epilogue
     * runs on each image's group right after its sgemm, in pieces of whole
     * planes. */
    int64_t cg = s.c / s.groups, og = s.o / s.groups, plane = s.oh * s.ow;
    int64_t kdim = cg * s.kh * s.kw;
    float *col = direct ? NULL : kmalloc(sizeof(float) * (size_t)(kdim * plane));
    if (!direct && !col) return -1;
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t g = 0; g < s.groups; g++) {
            const float *xg = x + (n * s.c + g * cg) * s.h * s.w;
            if (!direct) im2col(&s, xg, cg, col);
            if (bias) fill_bias(bias + g * og, y + (n * s.o + g * og) * plane, og, plane);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)og, (int)plane, (int)kdim,
                        1.0f, w + g * og * kdim, (int)kdim, direct ? xg : col, (int)plane,
                        bias ? 1.0f : 0.0f, y + (n * s.o + g * og) * plane, (int)plane);
            ext_run_epilogue(epi, ctx, y, (n * s.o + g * og) * plane, og * plane, plane);
        }
    kfree(col);
    return 0;
}

int ext_conv2d_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                   const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                   ExtEpilogue epi, void *ctx) {
    return conv2d(x, xs, w, ws, bias, y, ys, attr, false, epi, ctx);
}

int ext_conv2d_const_epi(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                         const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                         ExtEpilogue epi, void *ctx) {
    return conv2d(x, xs, w, ws, bias, y, ys, attr, true, epi, ctx);
}

int ext_conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
               const float *bias, float *y, const int64_t ys[4], const int64_t attr[7]) {
    return ext_conv2d_epi(x, xs, w, ws, bias, y, ys, attr, NULL, NULL);
}
