/*
 * conv1x1.c -- 1x1 stride-1 convolutions as a GEMM of kiln's own:
 * y[n][O, P] = w[O, K] @ x[n][K, P] + bias, P = H * W, on NCHW as it is.
 * MobileNetV2's expansions and projections are all of this kind.
 *
 * Why not OpenBLAS's sgemm (which ran them before, and still does without
 * AVX2): OpenBLAS's sgemm packs the constant weights on every call and
 * needs the output pre-filled with the bias (docs/decisions.md: conv1x1:
 * kiln's own GEMM). Here a constant weight is packed once and kept
 * (like conv_dnnl.c's reordered copies), a runtime one is read as it is,
 * the activations are read where they are, and the bias goes in as the
 * accumulators are stored: the output is written once.
 *
 * The kernel: a tile of MR output channels by up to NR pixels in 24 AVX-512
 * accumulators (MR x NV vectors); per input channel k it loads NV vectors
 * of x's row k and broadcasts MR weights, from the packed panel
 * pw[tile][k][MR] (rows past O are zeros) or from the weight's rows (the
 * last one repeated past O, its results not stored). The last vector of a
 * row is masked, so any P works. A unit of work is one tile of channels
 * over a chunk of pixels whose K x chunk block of x stays in the L2
 * (C1_CHUNK_BYTES) while the tiles of channels run over it; units are
 * shared among the threads, and the thread that finished a unit runs its
 * epilogue at once, on the rows it just wrote (a unit's rows are whole
 * planes when the chunk is the whole plane, else one call per row). When
 * x is too large to be in the caches (C1_PREFETCH_BYTES), the first tile
 * of channels over a chunk, the one that brings it in from memory,
 * prefetches each of its K rows C1_PREFETCH_AHEAD floats ahead: K rows
 * read side by side are more streams than the hardware prefetcher follows
 * (AVX-512 and AVX2 alike; a chunk copied first, as AVX2's strips, needs
 * none).
 *
 * With AVX2 (and no AVX-512, or a program's tier below v4) the tile is MR
 * x NV2 vectors of 8 lanes (12 of the 16 ymm registers), K runs in blocks
 * of C1_KC channels so that a tile's weights stay in the L1, and when at
 * least C1_STRIP_TILES tiles of channels read a chunk it is first packed
 * as strips of NR2 pixels, k-major, so that each tile reads consecutive
 * memory (pack_strips; the copy pays for itself over that many tiles).
 *
 * One pixel per image (P = 1: the squeeze-and-excitation convs of
 * MobileNetV3-style networks, [1, K, 1, 1] -> O) is a matrix-vector
 * product, where a tile would fill one lane of each vector: instead each
 * output is a dot product of a weight row (the plain weights, read once
 * per image, rows contiguous) with x, one row after another in vectors
 * along K (gemv512, gemv256), the rows shared among the threads.
 *
 * The shapes (MR = 6, NV = 4, the chunk size, the AVX2 blocks) and the
 * measurements against the sgemm: docs/decisions.md: conv1x1: kiln's own
 * GEMM.
 *
 * Needs AVX2 + FMA at least: the kernels are compiled for AVX-512 (F) and
 * for AVX2 + FMA with target attributes and picked by what the CPU has
 * within the program's tier (ext_cpu_features); elsewhere ext_conv1x1
 * returns 1 and the caller runs the sgemm.
 */
#include "externs/externs.h"
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define C1_X86 1
#include <immintrin.h>
#else
#define C1_X86 0
#endif

enum { MR = 6, NV = 4, NR = 16 * NV, NV2 = 2, NR2 = 8 * NV2 };
/* x's block per unit: K x chunk floats, at most this (at least NR pixels) */
#define C1_CHUNK_BYTES ((int64_t)256 << 10)
/* The L2's bytes per way (2 MiB, 16 ways: this machine's, and typical of
 * server cores), and how many of x's rows may share a set of it before a
 * chunk is copied (see ext_conv1x1). */
#define C1_L2_WAY_BYTES ((int64_t)128 << 10)
#define C1_ALIAS_ROWS 8
/* Multiply-adds from which the units run on all threads. */
#define C1_PARALLEL_MIN ((int64_t)1 << 18)
/* x's bytes (all images) from which the first tile over a chunk
 * prefetches, and how far ahead in each row (see the header). */
#define C1_PREFETCH_BYTES ((int64_t)8 << 20)
#define C1_PREFETCH_AHEAD 512
/* Partial sums per row of the matrix-vector product (P = 1). */
#define C1_GEMV_ACC 4
/* The AVX2 kernel's block of input channels (see unit256). */
#define C1_KC 256
/* and the tiles of channels from which it packs a chunk of x (unit256) */
#define C1_STRIP_TILES 8

/* w [O, K] as panels of MR rows, k-major: p[(t * K + k) * MR + r] =
 * w[t * MR + r][k], zero past row O. */
static void pack_weights(const float *w, int64_t O, int64_t K, float *p) {
    for (int64_t t = 0; t < (O + MR - 1) / MR; t++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t r = 0; r < MR; r++) {
                int64_t o = t * MR + r;
                p[(t * K + k) * MR + r] = o < O ? w[o * K + k] : 0.0f;
            }
}

static size_t packed_bytes(int64_t O, int64_t K) {
    return sizeof(float) * (size_t)((O + MR - 1) / MR * MR * K);
}

/* ---- constant weights, packed once ---- */

typedef struct {
    ExtKept base; /* w, raw (kmalloc'd), bytes, next */
    int64_t o, k;
    float *packed; /* raw, on a cache line */
} C1Kept;

/* The kept copies together stay under this; beyond it, weights are read
 * as they are (as runtime ones). */
#define C1_KEPT_MAX ((size_t)256 << 20)
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ExtKeptList c1_kept = {.lock = &lock}; /* of C1Kept entries */

/* w packed, kept for later calls (packed now on a miss); NULL when it cannot
 * be kept (over C1_KEPT_MAX, out of memory). */
static const float *kept_packed(const float *w, int64_t O, int64_t K) {
    pthread_mutex_lock(&lock);
    C1Kept *k = NULL;
    for (ExtKept *e = c1_kept.head; e && !k; e = e->next)
        if (e->w == w && ((C1Kept *)e)->o == O && ((C1Kept *)e)->k == K) k = (C1Kept *)e;
    size_t bytes = packed_bytes(O, K);
    if (!k && c1_kept.bytes + bytes <= C1_KEPT_MAX && (k = kmalloc(sizeof *k))) {
        *k = (C1Kept){.base = {.w = w, .bytes = bytes}, .o = O, .k = K};
        if ((k->base.raw = kmalloc(bytes + KILN_ALIGN - 1))) {
            k->packed = util_on_line(k->base.raw);
            pack_weights(w, O, K, k->packed);
            ext_kept_add(&c1_kept, &k->base);
        } else {
            ext_kept_free(&k->base);
            k = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    return k ? k->packed : NULL;
}

/* ---- the kernel ---- */

#if C1_X86
#define C1_TARGET __attribute__((target("avx512f")))

/* One tile: rows [0, rows) of y (row stride P) at columns [0, 16 (nv - 1)
 * + popcount(m)) get bias + w @ x, where w's row r, element k is
 * ar[r][k * ks] (packed panels: ks = MR; a runtime weight as it is: ks = 1)
 * and x is the tile's first pixel in input row 0 (row stride xs). Written
 * for a constant nv, so the accumulators stay in registers; pf: prefetch
 * each row C1_PREFETCH_AHEAD floats ahead (a hint: past x's end too). */
static inline __attribute__((always_inline)) C1_TARGET void
tile(const int nv, const bool pf, const float *const ar[MR], int64_t ks, const float *x, int64_t xs,
     int64_t K, const float *bias, int rows, float *y, int64_t P, __mmask16 m) {
    __m512 c[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) c[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *xk = x + k * xs;
        __m512 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv - 1; v++) b[v] = _mm512_loadu_ps(xk + 16 * v);
        b[nv - 1] = _mm512_maskz_loadu_ps(m, xk + 16 * (nv - 1));
#pragma GCC unroll 4
        for (int v = 0; v < nv && pf; v++)
            _mm_prefetch((const char *)(xk + C1_PREFETCH_AHEAD + 16 * v), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(ar[r][k * ks]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) c[r][v] = _mm512_fmadd_ps(av, b[v], c[r][v]);
        }
    }
/* every row's stores under `r < rows` (not a loop to `rows`), so the
     * loop stays unrolled and c in registers */
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= rows) continue;
        __m512 bb = _mm512_set1_ps(bias[r]);
        float *yr = y + r * P;
#pragma GCC unroll 4
        for (int v = 0; v < nv - 1; v++) _mm512_storeu_ps(yr + 16 * v, _mm512_add_ps(c[r][v], bb));
        _mm512_mask_storeu_ps(yr + 16 * (nv - 1), m, _mm512_add_ps(c[r][nv - 1], bb));
    }
}

/* tile for nv = N, out of line (a call per tile); NAME##p prefetches. */
#define C1_TILE(N)                                                                                 \
    static C1_TARGET void tile##N(const float *const ar[MR], int64_t ks, const float *x,           \
                                  int64_t xs, int64_t K, const float *bias, int rows, float *y,    \
                                  int64_t P, __mmask16 m) {                                        \
        tile(N, false, ar, ks, x, xs, K, bias, rows, y, P, m);                                     \
    }                                                                                              \
    static C1_TARGET void tile##N##p(const float *const ar[MR], int64_t ks, const float *x,        \
                                     int64_t xs, int64_t K, const float *bias, int rows, float *y, \
                                     int64_t P, __mmask16 m) {                                     \
        tile(N, true, ar, ks, x, xs, K, bias, rows, y, P, m);                                      \
    }
C1_TILE(1)
C1_TILE(2)
C1_TILE(3)
C1_TILE(4)

/* Rows [0, rows) of y = bias + w @ x over pixels [j0, j1) (w's rows as in
 * tile; x's rows xs apart, its pixel j0 at x; y's P apart, its pixel 0 at
 * y); pf: the tiles prefetch (see tile). */
static C1_TARGET void unit512(const float *const ar[MR], int64_t ks, const float *x, int64_t xs,
                              int64_t K, const float *bias, int rows, float *y, int64_t P,
                              int64_t j0, int64_t j1, bool pf) {
    for (int64_t j = j0; j < j1; j += NR) {
        int64_t n = j1 - j < NR ? j1 - j : NR;
        int nv = (int)((n + 15) / 16), last = (int)(n - 16 * (nv - 1));
        __mmask16 m = (__mmask16)((1u << last) - 1u);
        const float *xj = x + (j - j0);
        switch (nv + (pf ? 4 : 0)) {
        case 8: tile4p(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 7: tile3p(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 6: tile2p(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 5: tile1p(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 4: tile4(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 3: tile3(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        case 2: tile2(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        default: tile1(ar, ks, xj, xs, K, bias, rows, y + j, P, m); break;
        }
    }
}

#define C1_TARGET2 __attribute__((target("avx2,fma")))

/* The AVX2 tile: as tile, in MR x NV2 accumulators of 8 lanes (12 of the
 * 16 ymm registers; two more hold x's vectors, one the broadcast weight).
 * masked: the last vector is loaded and stored under m (vmaskmovps, which
 * neither reads nor writes the lanes m leaves out); otherwise every vector
 * is whole and the loads are plain ones. pf: prefetch as tile does (one
 * line per row: a tile here is 16 pixels). */
static inline __attribute__((always_inline)) C1_TARGET2 void
tile8(const int nv, const bool masked, const bool pf, const float *const ar[MR], int64_t ks,
      const float *x, int64_t xs, int64_t K, const float *bias, bool acc, int rows, float *y,
      int64_t P, __m256i m) {
    __m256 c[MR][NV2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) c[r][v] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *xk = x + k * xs;
        __m256 b[NV2];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++)
            b[v] = masked && v == nv - 1 ? _mm256_maskload_ps(xk + 8 * v, m)
                                         : _mm256_loadu_ps(xk + 8 * v);
        if (pf) _mm_prefetch((const char *)(xk + C1_PREFETCH_AHEAD), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m256 av = _mm256_broadcast_ss(&ar[r][k * ks]);
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) c[r][v] = _mm256_fmadd_ps(av, b[v], c[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= rows) continue;
        __m256 bb = _mm256_set1_ps(bias[r]);
        float *yr = y + r * P;
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            bool part = masked && v == nv - 1;
            __m256 o = _mm256_add_ps(c[r][v], !acc   ? bb
                                              : part ? _mm256_maskload_ps(yr + 8 * v, m)
                                                     : _mm256_loadu_ps(yr + 8 * v));
            if (part)
                _mm256_maskstore_ps(yr + 8 * v, m, o);
            else
                _mm256_storeu_ps(yr + 8 * v, o);
        }
    }
}

#define C1_TILE8(N, M, PF, NAME)                                                                   \
    static C1_TARGET2 void NAME(const float *const ar[MR], int64_t ks, const float *x, int64_t xs, \
                                int64_t K, const float *bias, bool acc, int rows, float *y,        \
                                int64_t P, __m256i m) {                                            \
        tile8(N, M, PF, ar, ks, x, xs, K, bias, acc, rows, y, P, m);                               \
    }
C1_TILE8(1, true, false, tile8_1m)
C1_TILE8(2, false, false, tile8_2)
C1_TILE8(2, true, false, tile8_2m)
C1_TILE8(1, true, true, tile8_1mp)
C1_TILE8(2, false, true, tile8_2p)
C1_TILE8(2, true, true, tile8_2mp)

/* x's pixels [j0, j1) (rows P apart) as strips of NR2 pixels, k-major:
 * s[(t * K + k) * NR2 + p] = x[k][j0 + t * NR2 + p], zeros past j1. */
static C1_TARGET2 void pack_strips(const float *x, int64_t P, int64_t K, int64_t j0, int64_t j1,
                                   float *s) {
    for (int64_t j = j0, t = 0; j < j1; j += NR2, t++) {
        int64_t n = j1 - j < NR2 ? j1 - j : NR2;
        for (int64_t k = 0; k < K; k++) {
            float *d = s + (t * K + k) * NR2;
            const float *r = x + k * P + j;
            if (n == NR2) {
                _mm256_storeu_ps(d, _mm256_loadu_ps(r));
                _mm256_storeu_ps(d + 8, _mm256_loadu_ps(r + 8));
                continue;
            }
            memcpy(d, r, sizeof(float) * (size_t)n);
            for (int64_t p = n; p < NR2; p++) d[p] = 0.0f;
        }
    }
}

/* unit512's loop in tiles of NR2 pixels, for AVX2, over K in blocks of
 * C1_KC input channels: the tile's MR x C1_KC weights stay in the L1 while
 * the tiles of pixels run over them, and the blocks after the first add to
 * what y holds. x is as in unit512 (xs > 0) or packed as strips (xs 0:
 * pack_strips, each tile's loads consecutive); pf as in unit512. */
static C1_TARGET2 void unit256(const float *const ar[MR], int64_t ks, const float *x, int64_t xs,
                               int64_t K, const float *bias, int rows, float *y, int64_t P,
                               int64_t j0, int64_t j1, bool pf) {
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += C1_KC) {
        int64_t kc = K - k0 < C1_KC ? K - k0 : C1_KC;
        const float *ak[MR];
        for (int r = 0; r < MR; r++) ak[r] = ar[r] + k0 * ks;
        for (int64_t j = j0; j < j1; j += NR2) {
            int64_t n = j1 - j < NR2 ? j1 - j : NR2;
            int last = (int)(n - 8 * ((n - 1) / 8));
            __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(last),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            const float *xj = xs ? x + k0 * xs + (j - j0) : x + ((j - j0) / NR2 * K + k0) * NR2;
            int64_t xr = xs ? xs : NR2;
            if (n == NR2)
                (pf ? tile8_2p : tile8_2)(ak, ks, xj, xr, kc, bias, k0 > 0, rows, y + j, P, m);
            else if (n > 8)
                (pf ? tile8_2mp : tile8_2m)(ak, ks, xj, xr, kc, bias, k0 > 0, rows, y + j, P, m);
            else
                (pf ? tile8_1mp : tile8_1m)(ak, ks, xj, xr, kc, bias, k0 > 0, rows, y + j, P, m);
        }
    }
}
#endif

#if C1_X86
/* NAME(w, x, K, bias, y, o0, o1): y[o] = bias[o] + w[o] . x for o in
 * [o0, o1), x and each row of w K floats (w's rows K apart). One row at a
 * time, front to back, so a weight that comes from memory is read as one
 * sequential stream (four rows side by side, four streams inside a few
 * pages, ran at half the bandwidth: docs/decisions.md, conv1x1 with one
 * pixel per image); C1_GEMV_ACC vectors of partial sums along K (the last
 * one masked) keep the multiply-adds independent, summed at the end. */
#define C1_GEMV(NAME, TARGET, V, LANES, ZERO, LOAD, MLOAD, FMA, SUM)                            \
    static TARGET void NAME(const float *w, const float *x, int64_t K, const float *bias,       \
                            float *y, int64_t o0, int64_t o1) {                                 \
        for (int64_t o = o0; o < o1; o++) {                                                     \
            const float *wr = w + o * K;                                                        \
            V acc[C1_GEMV_ACC];                                                                 \
            for (int a = 0; a < C1_GEMV_ACC; a++) acc[a] = ZERO;                                \
            int64_t k = 0;                                                                      \
            for (; k + C1_GEMV_ACC * LANES <= K; k += C1_GEMV_ACC * LANES)                      \
                _Pragma("GCC unroll 4") for (int a = 0; a < C1_GEMV_ACC; a++) acc[a] =          \
                    FMA(LOAD(wr + k + a * LANES), LOAD(x + k + a * LANES), acc[a]);             \
            for (; k + LANES <= K; k += LANES) acc[0] = FMA(LOAD(wr + k), LOAD(x + k), acc[0]); \
            if (k < K) acc[1] = FMA(MLOAD(wr + k, K - k), MLOAD(x + k, K - k), acc[1]);         \
            V t = acc[0];                                                                       \
            for (int a = 1; a < C1_GEMV_ACC; a++) t += acc[a];                                  \
            y[o] = (bias ? bias[o] : 0.0f) + SUM(t);                                            \
        }                                                                                       \
    }

static inline __attribute__((always_inline)) C1_TARGET __m512 gemv_mload16(const float *p,
                                                                           int64_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}

static inline __attribute__((always_inline)) C1_TARGET2 __m256 gemv_mload8(const float *p,
                                                                           int64_t n) {
    __m256i m =
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, m);
}

static inline __attribute__((always_inline)) C1_TARGET2 float gemv_sum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

C1_GEMV(gemv512, C1_TARGET, __m512, 16, _mm512_setzero_ps(), _mm512_loadu_ps, gemv_mload16,
        _mm512_fmadd_ps, _mm512_reduce_add_ps)
C1_GEMV(gemv256, C1_TARGET2, __m256, 8, _mm256_setzero_ps(), _mm256_loadu_ps, gemv_mload8,
        _mm256_fmadd_ps, gemv_sum8)

/* P = 1: y[n] = w @ x[n] + bias for every image, the rows of w in blocks
 * of 64 shared among the threads, each block over every image in turn
 * (each block's epilogue run by its thread). */
static void conv1x1_gemv(int level, const float *x, int64_t N, int64_t K, const float *w, int64_t O,
                         const float *bias, float *y, ExtEpilogue epi, void *ctx) {
    int64_t blocks = (O + 63) / 64;
#pragma omp parallel for collapse(2) schedule(static) if (N * O * K >= C1_PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; b++)  /* a block's rows stay in the L2 */
        for (int64_t n = 0; n < N; n++) { /* across the images */
            int64_t o0 = b * 64, o1 = o0 + 64 < O ? o0 + 64 : O;
            (level >= 2 ? gemv512 : gemv256)(w, x + n * K, K, bias, y + n * O, o0, o1);
            if (epi) epi(ctx, y, n * O + o0, o1 - o0);
        }
}
#endif

int ext_conv1x1(const float *x, int64_t N, int64_t K, int64_t P, const float *w, int64_t O,
                const float *bias, float *y, bool wconst, ExtEpilogue epi, void *ctx) {
#if C1_X86
    int level = ext_isa_level(ext_cpu_features());
    if (level < 1) return 1;
    if (P == 1 && K > 0) {
        conv1x1_gemv(level, x, N, K, w, O, bias, y, epi, ctx);
        return 0;
    }
    /* packed panels for a constant weight (kept); a runtime one is read as
     * it is (packing it on every call cost more than it saved) */
    const float *pw = wconst ? kept_packed(w, O, K) : NULL;
    int64_t tiles = (O + MR - 1) / MR;
    /* as few chunks as fit C1_CHUNK_BYTES, of equal size (in whole
     * vectors): chunks of 4096, 4096, 4096 and 256 pixels would give one
     * thread of two nearly twice the work of the other */
    int64_t most = K > 0 ? C1_CHUNK_BYTES / ((int64_t)sizeof(float) * K) / NR * NR : P;
    if (most < NR) most = NR;
    int64_t chunks = P > 0 ? (P + most - 1) / most : 0;
    int64_t chunk = chunks > 1 ? ((P + chunks - 1) / chunks + 15) / 16 * 16 : P;
    if (chunks > 1) chunks = (P + chunk - 1) / chunk;
    int64_t units = N * chunks * tiles;
    /* A chunk of x stays in the L2 while the tiles of channels run over it,
     * unless its K rows, P floats apart, fall into a few sets of the cache:
     * when P * 4 has a large power of two in it (32x32 planes: rows 4 KiB
     * apart; with K = 1024, 32 rows to each set of a 16-way 2 MiB L2, which
     * holds 16) the chunk went to memory for every tile (docs/decisions.md:
     * conv1x1: kiln's own GEMM). Then each thread copies its chunk
     * into a dense buffer first. */
    int64_t pow2 = (P * (int64_t)sizeof(float)) & -(P * (int64_t)sizeof(float));
    int64_t way = C1_L2_WAY_BYTES, xs = (chunk + 15) / 16 * 16;
    bool copy = K * (pow2 < way ? pow2 : way) > C1_ALIAS_ROWS * way;
    /* AVX2 packs a chunk as strips (unit256) when many tiles read it */
    bool strips = level < 2 && tiles >= C1_STRIP_TILES;
    if (strips) copy = true, xs = (chunk + NR2 - 1) / NR2 * NR2;
    /* x past the caches: the first tile over each chunk prefetches (the
     * copy, where it runs, reads the chunk row by row already) */
    bool far = !copy && N * K * P * (int64_t)sizeof(float) >= C1_PREFETCH_BYTES;
    int failed = 0;
#pragma omp parallel if (N * O * K * P >= C1_PARALLEL_MIN)
    {
        float *buf = copy ? kmalloc(sizeof(float) * (size_t)(K * xs) + 1) : NULL;
        int64_t have = -1; /* the chunk (n * chunks + c) in buf */
        if (copy && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            if (copy && !buf) continue;
            int64_t n = u / (chunks * tiles), t = u % tiles, j0 = u / tiles % chunks * chunk;
            int64_t j1 = j0 + chunk < P ? j0 + chunk : P, o0 = t * MR;
            int rows = (int)(O - o0 < MR ? O - o0 : MR);
            float b[MR] = {0};
            for (int r = 0; r < rows && bias; r++) b[r] = bias[o0 + r];
            const float *ar[MR]; /* row r of the tile's weights: see tile */
            for (int r = 0; r < MR; r++)
                ar[r] = pw ? pw + t * K * MR + r : w + (o0 + (r < rows ? r : rows - 1)) * K;
            const float *xc = x + n * K * P + j0;
            if (copy && have != u / tiles) {
                if (strips)
                    pack_strips(xc - j0, P, K, j0, j1, buf);
                else
                    for (int64_t k = 0; k < K; k++)
                        memcpy(buf + k * xs, xc + k * P, sizeof(float) * (size_t)(j1 - j0));
                have = u / tiles;
            }
            int64_t off = (n * O + o0) * P;
            int64_t xr = strips ? 0 : copy ? xs : P;
            (level >= 2 ? unit512 : unit256)(ar, pw ? MR : 1, copy ? buf : xc, xr, K, b, rows,
                                             y + off, P, j0, j1, far && t == 0);
            if (!epi) continue;
            if (j0 == 0 && j1 == P)
                epi(ctx, y, off, rows * P);
            else
                for (int r = 0; r < rows; r++) epi(ctx, y, off + r * P + j0, j1 - j0);
        }
        kfree(buf);
    }
    if (failed) return -1;
    return 0;
#else
    (void)x, (void)N, (void)K, (void)P, (void)w, (void)O, (void)bias, (void)y, (void)wconst;
    (void)epi, (void)ctx;
    return 1;
#endif
}
