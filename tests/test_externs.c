/*
 * test_externs.c -- the library kernels (OpenBLAS matmul, im2col conv2d)
 * against naive loops written here, over odd sizes, transposed views,
 * batch broadcasting, and every conv2d parameter through both conv2d
 * backends (oneDNN, im2col) with an epilogue; and the choice of OpenBLAS's
 * kernels.
 */
#include "test.h"
#include "testutil.h"
#include "testing.h" /* ext_set_conv_backend */
#include <cblas.h>
#include <strings.h>

static float *randbuf(int64_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * (size_t)n);
    kiln_fill_randn(p, n, seed);
    return p;
}

static float at(const float *p, const ExtView *v, const int64_t *idx) {
    int64_t off = v->offset;
    for (int d = 0; d < v->rank; d++) off += (v->shape[d] == 1 ? 0 : idx[d]) * v->stride[d];
    return p[off];
}

/* naive batched matmul over c's index space */
static double naive_mm(const float *a, const ExtView *av, const float *b, const ExtView *bv,
                       int crank, const int64_t *ci) {
    int64_t ia[KILN_MAX_RANK] = {0}, ib[KILN_MAX_RANK] = {0};
    int64_t K = av->shape[av->rank - 1];
    for (int d = 0; d < av->rank - 2; d++) ia[d] = ci[d + crank - av->rank];
    for (int d = 0; d < bv->rank - 2; d++) ib[d] = ci[d + crank - bv->rank];
    double acc = 0;
    for (int64_t k = 0; k < K; k++) {
        ia[av->rank - 2] = ci[crank - 2];
        ia[av->rank - 1] = k;
        ib[bv->rank - 2] = k;
        ib[bv->rank - 1] = ci[crank - 1];
        acc += (double)at(a, av, ia) * at(b, bv, ib);
    }
    return acc;
}

/* check_mm runs ext_matmul_const_epi (b a constant: oneDNN where it takes
 * it) instead of ext_matmul. */
static bool mm_const_mode;

static int check_mm(const float *a, const ExtView *av, const float *b, const ExtView *bv, int crank,
                    const int64_t *cshape) {
    int64_t n = 1;
    for (int d = 0; d < crank; d++) n *= cshape[d];
    float *c = malloc(sizeof(float) * (size_t)n);
    int bad = (mm_const_mode ? ext_matmul_const_epi(a, av, b, bv, c, crank, cshape, NULL, NULL)
                             : ext_matmul(a, av, b, bv, c, crank, cshape)) != 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        int64_t ci[KILN_MAX_RANK], r = i;
        for (int d = crank - 1; d >= 0; d--) {
            ci[d] = r % cshape[d];
            r /= cshape[d];
        }
        double want = naive_mm(a, av, b, bv, crank, ci);
        if (fabs(c[i] - want) > 1e-4 + 1e-4 * fabs(want)) {
            printf("  element %lld: got %g want %g\n", (long long)i, c[i], want);
            bad = 1;
        }
    }
    free(c);
    return bad;
}

/* Dense products of sizes[n] (M, K, N), each against the naive one; with
 * dnnl, ext_matmul_path must also name oneDNN for a constant b, but sgemv
 * for one row of C (it streams b once, as stored). */
static void check_sizes(const int64_t (*sizes)[3], int n, bool dnnl) {
    for (int t = 0; t < n; t++) {
        int64_t M = sizes[t][0], K = sizes[t][1], N = sizes[t][2];
        int64_t as[2] = {M, K}, bs[2] = {K, N}, cs[2] = {M, N};
        float *a = randbuf(M * K, 1), *b = randbuf(K * N, 2);
        ExtView av = test_dense_view(2, as), bv = test_dense_view(2, bs);
        EXPECT(!check_mm(a, &av, b, &bv, 2, cs), "matmul %lldx%lldx%lld", (long long)M,
               (long long)K, (long long)N);
        const char *want = M == 1 && N > 1 ? "sgemv" : "oneDNN";
        EXPECT(!dnnl || strstr(ext_matmul_path(&av, &bv, 2, cs, true), want) != NULL,
               "path of %lldx%lldx%lld: %s", (long long)M, (long long)K, (long long)N,
               ext_matmul_path(&av, &bv, 2, cs, true));
        free(a);
        free(b);
    }
}

TEST(externs_matmul_odd_sizes) {
    static const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {1, 64, 3}, {5, 1, 9}};
    check_sizes(sizes, 5, false);
}

TEST(externs_matmul_transposed_views) {
    /* a is stored [K, M] and read transposed; b stored [N, K] read transposed */
    int64_t M = 9, K = 11, N = 6;
    int64_t ast[2] = {K, M}, bst[2] = {N, K}, cs[2] = {M, N};
    float *a = randbuf(M * K, 3), *b = randbuf(K * N, 4);
    ExtView av = test_dense_view(2, ast), bv = test_dense_view(2, bst);
    ExtView at_ = {2, {M, K}, {av.stride[1], av.stride[0]}, 0};
    ExtView bt_ = {2, {K, N}, {bv.stride[1], bv.stride[0]}, 0};
    CHECK(!check_mm(a, &at_, b, &bt_, 2, cs));
    /* a strided view neither BLAS form covers: every other column */
    int64_t wide[2] = {M, 2 * K};
    float *w = randbuf(2 * M * K, 5);
    ExtView sv = {2, {M, K}, {2 * K, 2}, 1};
    ExtView bd = test_dense_view(2, (int64_t[]){K, N});
    (void)wide;
    CHECK(!check_mm(w, &sv, b, &bd, 2, cs));
    free(a);
    free(b);
    free(w);
}

/* One row of C is an sgemv (matmul.c, gemm2d): B as stored or transposed,
 * A's row contiguous or every third element (a column of a [K, 3] matrix),
 * and batches that each have one row. */
TEST(externs_matmul_one_row) {
    int64_t K = 300, N = 257;
    float *a = randbuf(3 * K, 11), *b = randbuf(K * N, 12);
    ExtView dense_a = {2, {1, K}, {K, 1}, 0}, column_a = {2, {1, K}, {1, 3}, 1};
    ExtView dense_b = {2, {K, N}, {N, 1}, 0}, trans_b = {2, {K, N}, {1, K}, 0};
    const ExtView *as_[] = {&dense_a, &column_a}, *bs_[] = {&dense_b, &trans_b};
    int64_t cs[2] = {1, N};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            EXPECT(!check_mm(a, as_[i], b, bs_[j], 2, cs), "a %s, b %s", i ? "column" : "dense",
                   j ? "transposed" : "dense");
    /* [3, 1, 100] @ [3, 100, 257]: B differs per batch, one row each */
    ExtView ba = {3, {3, 1, 100}, {100, 100, 1}, 0}, bb = {3, {3, 100, N}, {100 * N, N, 1}, 0};
    int64_t bcs[3] = {3, 1, N};
    CHECK(!check_mm(a, &ba, b, &bb, 3, bcs));
    free(a);
    free(b);
}

/* A constant b (ext_matmul_const_epi): oneDNN with b reordered once for
 * 2-D products, batches of 1 and folded batches whose a has unit column
 * stride; the rest on OpenBLAS. Every case against the naive product. */
static void check_const_views(void);

TEST(externs_matmul_const) {
    mm_const_mode = true;
    check_const_views();
    mm_const_mode = false;
}

/* The same products with B held plain, held transposed and on OpenBLAS
 * (where oneDNN leaves B plain, the first call times the three:
 * matmul_dnnl.c, mm_try): each against the naive product, and the
 * kernel's note names the transposed layout and OpenBLAS. */
TEST(externs_matmul_const_layouts) {
    mm_const_mode = true;
    for (int mode = 1; mode <= 3; mode++) {
        ext_set_mm_layout(mode);
        check_const_views();
        int64_t M = 20, K = 64, N = 200, cs[2] = {M, N};
        float *a = randbuf(M * K, 31), *b = randbuf(K * N, 32);
        ExtView av = {2, {M, K}, {K, 1}, 0}, bv = {2, {K, N}, {N, 1}, 0};
        ext_dnnl_impl_reset();
        CHECK(!check_mm(a, &av, b, &bv, 2, cs));
        const char *impl = ext_dnnl_last_impl();
        bool plain = impl && (strstr(impl, "gemm") || !strncmp(impl, "OpenBLAS", 8));
        EXPECT(!plain || ((mode == 2) == (strstr(impl, "B transposed") != NULL) &&
                          (mode == 3) == !strncmp(impl, "OpenBLAS", 8)),
               "mode %d: %s", mode, impl);
        if (!plain) printf("  oneDNN blocks B on this ISA (%s): no layout to choose\n", impl);
        ext_kept_forget_all(b, sizeof(float) * (size_t)(K * N));
        free(a), free(b);
    }
    ext_set_mm_layout(0);
    mm_const_mode = false;
}

static void check_const_views(void) {
    int before = ext_matmul_dnnl_count();
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {1, 64, 3}, {40, 96, 1030}};
    check_sizes(sizes, 5, true);
    EXPECT(ext_matmul_dnnl_count() > before, "oneDNN made no primitive");
    int64_t M = 9, K = 11, N = 6, cs[2] = {M, N};
    float *a = randbuf(4 * M * K, 3), *b = randbuf(3 * K * N, 4);
    /* b stored [N, K] and read transposed (Gemm's transB); b at an offset */
    ExtView ad = {2, {M, K}, {K, 1}, 0}, bt = {2, {K, N}, {1, K}, 0}, bo = {2, {K, N}, {N, 1}, 7};
    CHECK(!check_mm(a, &ad, b, &bt, 2, cs));
    CHECK(!check_mm(a, &ad, b, &bo, 2, cs));
    /* a's rows further apart than K (a slice of wider rows); a transposed
     * (its columns dense: oneDNN reads it as it is); a's rows reversed (a
     * bidirectional RNN's backward input projection) and every other
     * column: oneDNN on a dense copy of a */
    ExtView awide = {2, {M, K}, {2 * K, 1}, 3}, at_ = {2, {M, K}, {1, M}, 0};
    ExtView arev = {2, {M, K}, {-K, 1}, (M - 1) * K}, askip = {2, {M, K}, {2 * K, 2}, 1};
    CHECK(!check_mm(a, &awide, b, &bo, 2, cs));
    CHECK(!check_mm(a, &at_, b, &bo, 2, cs));
    CHECK(!check_mm(a, &arev, b, &bo, 2, cs));
    CHECK(!check_mm(a, &askip, b, &bo, 2, cs));
    const char *pt = ext_matmul_path(&at_, &bo, 2, cs, true);
    EXPECT(strstr(pt, "oneDNN") && !strstr(pt, "packed"), "transposed a: %s", pt);
    EXPECT(strstr(ext_matmul_path(&arev, &bo, 2, cs, true), "A packed dense") != NULL,
           "reversed a");
    EXPECT(strstr(ext_matmul_path(&askip, &bo, 2, cs, true), "A packed dense") != NULL,
           "strided a");
    EXPECT(strstr(ext_matmul_path(&arev, &bo, 2, cs, false), "OpenBLAS") != NULL,
           "reversed a, b not constant");
    /* [1, 9, 11] @ [11, 6] (batch of 1) and [4, 9, 11] @ [11, 6] (folded) */
    ExtView a1 = {3, {1, M, K}, {0, K, 1}, 0}, a4 = {3, {4, M, K}, {M * K, K, 1}, 0};
    int64_t c1[3] = {1, M, N}, c4[3] = {4, M, N};
    CHECK(!check_mm(a, &a1, b, &bo, 3, c1));
    CHECK(!check_mm(a, &a4, b, &bo, 3, c4));
    EXPECT(strstr(ext_matmul_path(&a1, &bo, 3, c1, true), "oneDNN") != NULL, "batch of 1");
    EXPECT(strstr(ext_matmul_path(&a4, &bo, 3, c4, true), "oneDNN") != NULL, "folded");
    EXPECT(strstr(ext_matmul_path(&a4, &bo, 3, c4, false), "OpenBLAS") != NULL, "not constant");
    /* batches that do not fold: [3, 5, 11] seen through a transpose (the
     * batch stride 11, rows 33 apart): oneDNN's batched matmul */
    ExtView at3 = {3, {3, 5, K}, {K, 3 * K, 1}, 0};
    int64_t ct3[3] = {3, 5, N};
    CHECK(!check_mm(a, &at3, b, &bo, 3, ct3));
    EXPECT(strstr(ext_matmul_path(&at3, &bo, 3, ct3, true), "oneDNN") != NULL, "batched");
    /* b differs per batch: OpenBLAS, batch by batch */
    ExtView b3 = {3, {3, K, N}, {K * N, N, 1}, 0}, a3 = {3, {3, M, K}, {M * K, K, 1}, 0};
    int64_t c3[3] = {3, M, N};
    CHECK(!check_mm(a, &a3, b, &b3, 3, c3));
    ext_kept_forget_all(b, sizeof(float) * (size_t)(3 * K * N));
    free(a);
    free(b);
}

/* What the reports say runs a matmul (ext_matmul_path): sgemv for one row
 * of C, after batch folding, else sgemm. */
TEST(externs_matmul_path) {
    ExtView a = {2, {1, 300}, {300, 1}, 0}, b = {2, {300, 257}, {257, 1}, 0};
    int64_t one[2] = {1, 257}, many[2] = {4, 257};
    CHECK(strstr(ext_matmul_path(&a, &b, 2, one, false), "sgemv"));
    a.shape[0] = 4;
    CHECK(!strstr(ext_matmul_path(&a, &b, 2, many, false), "sgemv"));
    /* [4, 1, 300] @ [300, 257]: folded into 4 rows, one sgemm */
    ExtView a3 = {3, {4, 1, 300}, {300, 300, 1}, 0};
    int64_t c3[3] = {4, 1, 257};
    CHECK(!strstr(ext_matmul_path(&a3, &b, 3, c3, false), "sgemv"));
    /* [3, 1, 100] @ [3, 100, 257]: B per batch, one row each */
    ExtView ba = {3, {3, 1, 100}, {100, 100, 1}, 0},
            bb = {3, {3, 100, 257}, {100 * 257, 257, 1}, 0};
    int64_t bc[3] = {3, 1, 257};
    CHECK(strstr(ext_matmul_path(&ba, &bb, 3, bc, false), "sgemv"));
}

TEST(externs_matmul_batch_broadcast) {
    /* [2,1,3,4] @ [5,4,6] -> [2,5,3,6] */
    int64_t as[4] = {2, 1, 3, 4}, bs[3] = {5, 4, 6}, cs[4] = {2, 5, 3, 6};
    float *a = randbuf(24, 6), *b = randbuf(120, 7);
    ExtView av = test_dense_view(4, as), bv = test_dense_view(3, bs);
    CHECK(!check_mm(a, &av, b, &bv, 4, cs));
    free(a);
    free(b);
}

/* naive conv2d, the definition */
static void naive_conv(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                       const float *bias, float *y, const int64_t ys[4], const int64_t at_[7]) {
    int64_t cg = xs[1] / at_[6], og = ws[0] / at_[6];
    for (int64_t n = 0; n < ys[0]; n++)
        for (int64_t o = 0; o < ys[1]; o++)
            for (int64_t oh = 0; oh < ys[2]; oh++)
                for (int64_t ow = 0; ow < ys[3]; ow++) {
                    double acc = bias ? bias[o] : 0;
                    int64_t g = o / og;
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t i = 0; i < ws[2]; i++)
                            for (int64_t j = 0; j < ws[3]; j++) {
                                int64_t ih = oh * at_[0] - at_[2] + i * at_[4];
                                int64_t iw = ow * at_[1] - at_[3] + j * at_[5];
                                if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
                                acc += (double)
                                           x[((n * xs[1] + g * cg + c) * xs[2] + ih) * xs[3] + iw] *
                                       w[((o * cg + c) * ws[2] + i) * ws[3] + j];
                            }
                    y[((n * ys[1] + o) * ys[2] + oh) * ys[3] + ow] = (float)acc;
                }
}

/* Counts each element the epilogue sees and adds 1 to it. */
typedef struct {
    unsigned char *seen;
    int64_t n;
    int bad;
} Seen;

static void plus_one(void *ctx, float *c, int64_t start, int64_t count) {
    Seen *s = ctx;
    if (start < 0 || count < 1 || start + count > s->n) {
#pragma omp atomic write
        s->bad = 1;
        return;
    }
    for (int64_t i = start; i < start + count; i++) {
        c[i] += 1.0f;
        s->seen[i]++; /* ranges are disjoint: no two threads share an element */
    }
}

/* N C H W | O KH KW | sh sw ph pw dh dw groups | bias */
static const int64_t conv_cases[][15] = {
    {1, 3, 8, 8, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},      /* 1x1 direct */
    {2, 8, 200, 180, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},  /* 1x1 direct: bias filled by threads */
    {2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0},      /* 3x3 pad 1 */
    {1, 4, 16, 16, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1},    /* 7x7 stride 2 */
    {1, 2, 11, 10, 3, 3, 3, 1, 2, 2, 1, 2, 2, 1, 1},    /* dilation 2 */
    {2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1},      /* groups 2 */
    {1, 6, 9, 9, 6, 3, 3, 2, 2, 1, 1, 1, 1, 6, 1},      /* depthwise */
    {1, 3, 5, 5, 2, 1, 1, 2, 2, 0, 0, 1, 1, 1, 0},      /* 1x1 stride 2 */
    {3, 32, 12, 12, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  /* blocked channels, batch 3 */
    {4, 8, 40, 40, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},   /* oneDNN: two calls of two images */
    {2, 3, 128, 128, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}, /* oneDNN: output back in parts */
    {1, 3, 127, 129, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0}, /* parts, rows not split evenly */
    {2, 20, 13, 11, 20, 3, 3, 1, 1, 1, 1, 1, 1, 20, 0}, /* depthwise, odd sizes */
    {1, 4, 5, 6, 4, 3, 3, 2, 1, 3, 2, 2, 3, 4, 1},      /* depthwise, strides and dilations */
    {1, 2, 5, 3, 2, 3, 3, 1, 2, 1, 3, 1, 3, 2, 1},      /* depthwise: a tap wholly in the padding */
    {1, 3, 7, 9, 3, 5, 5, 1, 2, 2, 2, 1, 1, 3, 1},      /* depthwise 5x5, column stride 2 */
    /* depthwise with output planes of 100 or more: the direct loops by default */
    {1, 8, 23, 17, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1}, /* 3x3, odd sizes */
    {2, 5, 30, 21, 5, 3, 3, 2, 2, 2, 1, 2, 1, 5, 1}, /* 3x3, stride 2, dilated rows */
    {1, 3, 20, 20, 3, 5, 5, 1, 1, 2, 2, 1, 1, 3, 0}, /* 5x5: a flat row (row blocks with AVX-512) */
    /* stride 1, not 3x3: the flat plane (dw_plane), its last vector past the plane */
    {1, 16, 14, 14, 16, 5, 5, 1, 1, 4, 4, 2, 2, 16, 1}, /* 5x5 dilated, 14x14 */
    {1, 4, 12, 40, 4, 7, 7, 1, 1, 3, 3, 1, 1, 4, 0},    /* 7x7, wide rows */
    {2, 6, 9, 8, 6, 5, 3, 1, 1, 2, 1, 1, 1, 6, 1},      /* 5x3, a small plane */
    /* 1 wide (input, filter, output): run as the same conv along W */
    {1, 16, 40, 1, 8, 5, 1, 1, 1, 2, 0, 1, 1, 1, 1}, /* 5x1 along H, padded */
    {2, 8, 33, 1, 8, 3, 1, 2, 1, 1, 0, 2, 1, 8, 0},  /* depthwise 3x1, stride and dilation 2 */
    {1, 6, 17, 1, 12, 3, 1, 1, 1, 1, 0, 1, 1, 3, 1}, /* groups 3 */
    {1, 4, 33, 34, 4, 3, 3, 3, 3, 1, 1, 1, 1, 4, 1}, /* 3x3, stride 3 */
    /* depthwise 3x3 at strides 1x1 and 2x2: row blocks of 4 from the plane
     * itself with AVX-512 (dw3_rows): 1-3 rows left over, rows of 16, 17,
     * 32 and 35 outputs, padding 0-2, planes of 7x7 */
    {1, 3, 10, 19, 3, 3, 3, 1, 1, 0, 0, 1, 1, 3, 1},  /* no padding: 8 x 17 */
    {2, 5, 13, 16, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5, 0},  /* 13 x 16: one row left */
    {1, 2, 7, 33, 2, 3, 3, 1, 1, 2, 2, 1, 1, 2, 1},   /* padding 2: 9 x 35 */
    {1, 4, 6, 32, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 1},   /* 6 x 32: two rows left */
    {1, 16, 7, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, 1}, /* 7x7 planes */
    {2, 4, 31, 45, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 1},  /* stride 2: 16 x 23 */
    {1, 3, 18, 35, 3, 3, 3, 2, 2, 0, 0, 1, 1, 3, 0},  /* stride 2, no padding: 8 x 17 */
    {1, 2, 9, 40, 2, 3, 3, 2, 2, 2, 2, 1, 1, 2, 1},   /* stride 2, padding 2: 6 x 21 */
    {1, 8, 14, 14, 8, 3, 3, 2, 2, 1, 1, 1, 1, 8, 1},  /* stride 2, 7x7 planes */
    {1, 3, 66, 66, 3, 3, 3, 2, 2, 1, 1, 1, 1, 3, 1},  /* stride 2: 33 x 33, rows of 3 vectors */
    {1, 2, 10, 63, 2, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1},  /* stride 2: a last tap on the padding */
    {1, 6, 14, 14, 6, 5, 5, 1, 1, 2, 2, 1, 1, 6, 1},  /* 5x5 at 14x14 (PP-LCNet's) */
    {2, 3, 11, 37, 3, 5, 5, 1, 1, 1, 1, 1, 1, 3, 0},  /* 5x5, padding 1: 9 x 35 */
    {1, 4, 33, 33, 4, 5, 5, 2, 2, 2, 2, 1, 1, 4, 1},  /* 5x5, stride 2: 17 x 17 */
    {1, 2, 12, 34, 2, 5, 5, 2, 2, 2, 2, 1, 1, 2, 1},  /* 5x5, stride 2: 6 x 17 */
    {1, 2, 9, 4, 2, 5, 5, 2, 2, 2, 2, 1, 1, 2,
     0}, /* 5x5, stride 2, plane narrower than the filter */
    /* strides 2x1 (PaddleOCR's recognizer and classifier) and 1x2: the same
     * row blocks with AVX-512, each stride its own */
    {1, 6, 13, 37, 6, 3, 3, 2, 1, 1, 1, 1, 1, 6, 1}, /* 3x3, 2x1: 7 x 37 */
    {2, 4, 12, 40, 4, 5, 5, 2, 1, 2, 2, 1, 1, 4, 1}, /* 5x5, 2x1: 6 x 40 */
    {1, 8, 6, 96, 8, 5, 5, 2, 1, 2, 2, 1, 1, 8, 0},  /* 5x5, 2x1 at 6x96: 3 x 96 */
    {2, 3, 11, 29, 3, 3, 3, 1, 2, 1, 1, 1, 1, 3, 0}, /* 3x3, 1x2: 11 x 15 */
    {1, 5, 9, 34, 5, 5, 5, 1, 2, 2, 2, 1, 1, 5, 1},  /* 5x5, 1x2: 9 x 17 */
    /* 1x1 stride 1, one group: conv1x1.c's kernel (tiles of 6 channels by
     * up to 64 pixels with AVX-512, 16 with AVX2; the last vector masked)
     * where the CPU has AVX2 or AVX-512 */
    {2, 600, 13, 11, 13, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, /* pixels in chunks of 48, 48, 47 */
    {1, 1, 5, 7, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},      /* one input channel */
    {3, 5, 4, 4, 17, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0},     /* 16 pixels: one whole vector */
    {1, 9, 1, 17, 12, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},    /* 17 pixels: a vector and 1 */
    {1, 2048, 3, 3, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},   /* a long K, 9 pixels */
    {1, 24, 56, 56, 144, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, /* MobileNetV2's expansion, in parallel */
    {2, 300, 32, 32, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},  /* rows 4 KiB apart: chunks copied first */
    /* AVX2: K in blocks of 256, chunks packed as strips from 8 tiles of
     * channels: 45 pixels (16 + 16 + 13), 2 blocks, 9 tiles, the last of 2
     * rows; 35 pixels (16 + 16 + 3), 3 blocks, the last tile 1 row */
    {1, 300, 5, 9, 50, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
    {2, 520, 7, 5, 49, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0},
    {1, 64, 9, 9, 48, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, /* 8 tiles exactly, 81 pixels */
    /* x of 9.2 MB, over C1_PREFETCH_BYTES: the first tile over each chunk
     * prefetches (AVX-512), 18000 pixels in 9 chunks of 2000 */
    {4, 32, 120, 150, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
    /* one pixel (squeeze-and-excitation): a dot product along K per row,
     * in 4 partial sums: K 300 (4 blocks of 64, 2 vectors of 16, a masked
     * tail of 12), 70 rows (blocks of 64 rows); K 7 (the tail alone);
     * 512 -> 1280 in parallel */
    {2, 300, 1, 1, 70, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
    {3, 7, 1, 1, 5, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0},
    {1, 512, 1, 1, 1280, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
};
#define CONV_CASES (sizeof conv_cases / sizeof conv_cases[0])

/* One case through ext_conv2d_epi (dnnl_only: through ext_conv2d_dnnl,
 * which must not decline it; wconst: ext_conv2d_const_epi, the weights
 * constant, and forgotten after) against the naive loops, with an
 * epilogue that must see every element once. */
static void check_conv_case_w(size_t t, bool dnnl_only, bool wconst, const char *backend) {
    const int64_t *c = conv_cases[t];
    int64_t xs[4] = {c[0], c[1], c[2], c[3]}, ws[4] = {c[4], c[1] / c[13], c[5], c[6]};
    int64_t at_[7] = {c[7], c[8], c[9], c[10], c[11], c[12], c[13]};
    int64_t ys[4] = {c[0], c[4], (c[2] + 2 * c[9] - c[11] * (c[5] - 1) - 1) / c[7] + 1,
                     (c[3] + 2 * c[10] - c[12] * (c[6] - 1) - 1) / c[8] + 1};
    int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
    float *x = randbuf(nx, 10 + t), *w = randbuf(nw, 20 + t), *b = randbuf(ws[0], 30 + t);
    float *y = malloc(sizeof(float) * (size_t)ny), *ref = malloc(sizeof(float) * (size_t)ny);
    Seen seen = {calloc((size_t)ny, 1), ny, 0};
    const float *bias = c[14] ? b : NULL;
    int rc = dnnl_only ? ext_conv2d_dnnl(x, xs, w, ws, bias, y, ys, at_, wconst, plus_one, &seen)
             : wconst  ? ext_conv2d_const_epi(x, xs, w, ws, bias, y, ys, at_, plus_one, &seen)
                       : ext_conv2d_epi(x, xs, w, ws, bias, y, ys, at_, plus_one, &seen);
    if (wconst) ext_kept_forget_all(w, sizeof(float) * (size_t)nw);
    EXPECT(rc == 0, "%s: case %zu: rc %d", backend, t, rc);
    naive_conv(x, xs, w, ws, bias, ref, ys, at_);
    for (int64_t i = 0; i < ny && rc == 0; i++) {
        float want = ref[i] + 1.0f;
        if (!(fabsf(y[i] - want) <= 1e-4f + 1e-4f * fabsf(want)) || seen.seen[i] != 1) {
            test_failf(__FILE__, __LINE__,
                       "%s: conv case %zu element %lld: %g vs %g, seen %d times", backend, t,
                       (long long)i, y[i], want, seen.seen[i]);
            break;
        }
    }
    EXPECT(!seen.bad, "%s: case %zu: an epilogue range out of bounds", backend, t);
    free(x);
    free(w);
    free(b);
    free(y);
    free(ref);
    free(seen.seen);
}

static void check_conv_case(size_t t, bool dnnl_only, const char *backend) {
    check_conv_case_w(t, dnnl_only, false, backend);
}

TEST(externs_conv2d_params) {
    for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, false, "default");
}

/* The same cases with kiln's own kernels held to SSE and to AVX2 (as a
 * program of tier v2 or v3 holds them): the depthwise loops of each level
 * (the AVX2 row blocks, dw8_rows, among them) on a CPU that has more. */
TEST(externs_conv2d_params_levels) {
    static const unsigned caps[] = {0, EXT_CPU_AVX2};
    for (int l = 0; l < 2; l++) {
        if ((ext_cpu_features_all() & caps[l]) != caps[l]) continue;
        unsigned prev = ext_isa_enter(caps[l]);
        for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, false, l ? "AVX2" : "SSE");
        ext_isa_leave(prev);
    }
}

/* The same cases with constant weights (packed once where the path keeps
 * a copy: conv1x1.c's panels, oneDNN's reorders), at every level this CPU
 * runs. */
TEST(externs_conv2d_params_const_weights) {
    static const unsigned caps[] = {0, EXT_CPU_AVX2, EXT_CPU_AVX2 | EXT_CPU_AVX512};
    static const char *const names[] = {"SSE, constant weights", "AVX2, constant weights",
                                        "AVX-512, constant weights"};
    for (int l = 0; l < 3; l++) {
        if ((ext_cpu_features_all() & caps[l]) != caps[l]) continue;
        unsigned prev = ext_isa_enter(caps[l]);
        for (size_t t = 0; t < CONV_CASES; t++) check_conv_case_w(t, false, true, names[l]);
        ext_isa_leave(prev);
    }
}

TEST(externs_conv2d_params_im2col) {
    ext_set_conv_backend(EXT_CONV_IM2COL);
    for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, false, "im2col");
    ext_set_conv_backend(EXT_CONV_DNNL);
}

/* What the reports say runs a conv2d (ext_conv_path), on both backends:
 * oneDNN for a 3x3 and for a depthwise conv with 7x7 planes (but for a
 * 3x3 or 5x5 one at stride 1 or 2 with AVX-512: the row blocks), kiln's
 * 1x1 GEMM (with AVX2 or AVX-512) or the sgemm for a 1x1, the loops for a
 * depthwise conv with large planes; im2col for the rest on the im2col
 * backend. */
TEST(externs_conv2d_path) {
    static const int64_t a1[7] = {1, 1, 1, 1, 1, 1, 1}, a0[7] = {1, 1, 0, 0, 1, 1, 1};
    static const int64_t dw[7] = {1, 1, 1, 1, 1, 1, 32}, dwd[7] = {1, 1, 2, 2, 2, 2, 32};
    static const int64_t xs[4] = {1, 32, 28, 28}, x7[4] = {1, 32, 7, 7};
    static const int64_t w3[4] = {16, 32, 3, 3}, w1[4] = {16, 32, 1, 1}, wd[4] = {32, 1, 3, 3};
    static const int64_t y16[4] = {1, 16, 28, 28}, y32[4] = {1, 32, 28, 28}, y7[4] = {1, 32, 7, 7};
    bool avx512 = (ext_cpu_features() & EXT_CPU_AVX512) != 0;
    bool c1 = ext_isa_level(ext_cpu_features()) >= 1;
    for (int b = 0; b < 2; b++) {
        ext_set_conv_backend(b ? EXT_CONV_IM2COL : EXT_CONV_DNNL);
        const char *p3 = ext_conv_path(xs, w3, y16, a1), *p1 = ext_conv_path(xs, w1, y16, a0);
        const char *pd = ext_conv_path(xs, wd, y32, dw), *pd7 = ext_conv_path(x7, wd, y7, dw);
        EXPECT(strstr(p3, b ? "im2col" : "oneDNN"), "backend %d, 3x3: %s", b, p3);
        EXPECT(strstr(p1, !b && c1 ? "1x1 GEMM" : "sgemm per image"), "backend %d, 1x1: %s", b, p1);
        EXPECT(strstr(pd, "depthwise loops"), "backend %d, depthwise 28x28: %s", b, pd);
        EXPECT(strstr(pd7, b || avx512 ? "depthwise loops" : "oneDNN"),
               "backend %d, depthwise 7x7: %s", b, pd7);
        const char *pdd = ext_conv_path(x7, wd, y7, dwd); /* dilated: no row blocks */
        EXPECT(strstr(pdd, b ? "depthwise loops" : "oneDNN"), "backend %d, dilated 7x7: %s", b,
               pdd);
    }
    ext_set_conv_backend(EXT_CONV_DNNL);
}

/* The target tier bounds kiln's own conv kernels (ext_isa_enter, as a run
 * of a program compiled for that tier does): the 1x1 GEMM needs AVX2, so
 * under v2 a 1x1 conv is OpenBLAS's sgemm whatever the CPU has, and under
 * v3 it runs the AVX2 kernel, as the path's kernels text says;
 * the depthwise rows run the version the tier allows, say so in the path's
 * kernels text, and match the definition at every level this CPU can run;
 * with AVX2 and AVX-512 a 3x3 and a 5x5 run as row blocks of FMAs
 * (dw8_rows, dw3_rows), so the definition, not SSE's bits, is theirs. */
TEST(externs_conv2d_within_the_tier) {
    static const int64_t a0[7] = {1, 1, 0, 0, 1, 1, 1}, dw[7] = {1, 1, 1, 1, 1, 1, 32};
    static const int64_t dw2[7] = {2, 2, 1, 1, 1, 1, 32}, dw5[7] = {1, 1, 2, 2, 1, 1, 32};
    static const int64_t xs[4] = {2, 32, 28, 28}, w1[4] = {16, 32, 1, 1}, wd[4] = {32, 1, 3, 3},
                         w5[4] = {32, 1, 5, 5};
    static const int64_t y16[4] = {2, 16, 28, 28}, y32[4] = {2, 32, 28, 28},
                         y14[4] = {2, 32, 14, 14};
    static const struct {
        unsigned cap;
        const char *isa;
    } levels[] = {
        {0, "SSE"}, {EXT_CPU_AVX2, "AVX2 + FMA"}, {EXT_CPU_AVX2 | EXT_CPU_AVX512, "AVX-512"}};
    int64_t nx = 2 * 32 * 28 * 28, ny = nx;
    float *x = randbuf(nx, 5), *w = randbuf(32 * 9, 6), *b = randbuf(32, 7);
    float *want = malloc(sizeof(float) * (size_t)ny);
    float *want2 = malloc(sizeof(float) * (size_t)ny), *got[3] = {0}, *got2[3] = {0};
    float *x5w = randbuf(32 * 25, 8), *want5 = malloc(sizeof(float) * (size_t)ny), *got5[3] = {0};
    naive_conv(x, xs, x5w, w5, b, want5, y32, dw5);
    naive_conv(x, xs, w, wd, b, want, y32, dw);
    naive_conv(x, xs, w, wd, b, want2, y14, dw2);
    unsigned have = ext_cpu_features_all();
    for (int l = 0; l < 3; l++) {
        unsigned prev = ext_isa_enter(levels[l].cap);
        const char *p1 = ext_conv_path(xs, w1, y16, a0);
        bool c1 = levels[l].cap & EXT_CPU_AVX2 && have & EXT_CPU_AVX2;
        const char *c1isa = ext_path_isa(p1);
        EXPECT(c1 ? strstr(p1, "1x1 GEMM") &&
                        !strcmp(c1isa, l == 2 && have & EXT_CPU_AVX512 ? "AVX-512" : "AVX2 + FMA")
                  : !strstr(p1, "1x1 GEMM"),
               "level %d: 1x1 conv runs on %s, on %s", l, p1, c1isa);
        const char *pd = ext_conv_path(xs, wd, y32, dw);
        const char *isa = ext_path_isa(pd);
        bool runs = (have & levels[l].cap) == levels[l].cap;
        EXPECT(strstr(pd, "depthwise loops") &&
                   (!runs || !strcmp(isa, levels[l].isa) || (l == 2 && strstr(isa, "AVX-512"))),
               "level %d: depthwise %s, on %s", l, pd, isa);
        if (runs) {
            got[l] = malloc(sizeof(float) * (size_t)ny);
            got2[l] = malloc(sizeof(float) * (size_t)ny);
            CHECK(ext_conv2d(x, xs, w, wd, b, got[l], y32, dw) == 0);
            CHECK(ext_conv2d(x, xs, w, wd, b, got2[l], y14, dw2) == 0);
            got5[l] = malloc(sizeof(float) * (size_t)ny);
            CHECK(ext_conv2d(x, xs, x5w, w5, b, got5[l], y32, dw5) == 0);
            double worst5 = 0;
            for (int64_t k = 0; k < ny; k++) worst5 = fmax(worst5, fabs(got5[l][k] - want5[k]));
            EXPECT(worst5 < 1e-4, "level %d: 5x5 depthwise off the definition by %g", l, worst5);
            double worst = 0;
            for (int64_t k = 0; k < ny; k++) worst = fmax(worst, fabs(got[l][k] - want[k]));
            for (int64_t k = 0; k < 2 * 32 * 14 * 14; k++)
                worst = fmax(worst, fabs(got2[l][k] - want2[k]));
            EXPECT(worst < 1e-4, "level %d: depthwise off the definition by %g", l, worst);
        } else {
            printf("externs: level %d (%s) not run: this CPU lacks it\n", l, levels[l].isa);
        }
        ext_isa_leave(prev);
    }
    for (int l = 0; l < 3; l++) free(got[l]), free(got2[l]), free(got5[l]);
    free(x), free(w), free(b), free(want), free(want2), free(x5w), free(want5);
}

/* Depthwise 3x3 at column stride 2 runs on rows split into even and odd
 * columns without AVX-512 (dw_row3_split, pad_plane_split): every parity
 * of the padding, dilation 1 and 2, widths odd and even, rows of 3 to 29
 * outputs, against the naive loops at each level this CPU runs. */
TEST(externs_conv2d_depthwise_stride2_split) {
    static const int64_t cases[][4] = {/* w, pad, dilation, h */
                                       {28, 1, 1, 28}, {27, 0, 1, 9}, {31, 2, 1, 7},
                                       {30, 3, 2, 8},  {57, 1, 2, 5}, {7, 1, 1, 7},
                                       {8, 0, 1, 6},   {13, 2, 2, 13}};
    unsigned have = ext_cpu_features_all();
    ext_set_conv_backend(EXT_CONV_IM2COL); /* kiln's loops at every plane size */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t w = cases[i][0], p = cases[i][1], dil = cases[i][2], h = cases[i][3];
        int64_t oh = (h + 2 * p - 2 * dil - 1) / 2 + 1, ow = (w + 2 * p - 2 * dil - 1) / 2 + 1;
        int64_t xs[4] = {1, 5, h, w}, ws[4] = {5, 1, 3, 3}, ys[4] = {1, 5, oh, ow};
        int64_t at_[7] = {2, 2, p, p, dil, dil, 5};
        int64_t nx = 5 * h * w, ny = 5 * oh * ow;
        float *x = randbuf(nx, 70 + i), *wt = randbuf(45, 80 + i), *b = randbuf(5, 90 + i);
        float *want = malloc(sizeof(float) * (size_t)ny), *got = malloc(sizeof(float) * (size_t)ny);
        naive_conv(x, xs, wt, ws, b, want, ys, at_);
        static const unsigned caps[] = {0, EXT_CPU_AVX2, EXT_CPU_AVX2 | EXT_CPU_AVX512};
        for (int l = 0; l < 3; l++) {
            if ((have & caps[l]) != caps[l]) continue;
            unsigned prev = ext_isa_enter(caps[l]);
            EXPECT(strstr(ext_conv_path(xs, ws, ys, at_), "depthwise loops"), "case %zu: %s", i,
                   ext_conv_path(xs, ws, ys, at_));
            CHECK(ext_conv2d(x, xs, wt, ws, b, got, ys, at_) == 0);
            double worst = 0;
            for (int64_t k = 0; k < ny; k++) worst = fmax(worst, fabs(got[k] - want[k]));
            EXPECT(worst < 1e-4, "case %zu (w %lld pad %lld dilation %lld) level %d: off by %g", i,
                   (long long)w, (long long)p, (long long)dil, l, worst);
            ext_isa_leave(prev);
        }
        free(x), free(wt), free(b), free(want), free(got);
    }
    ext_set_conv_backend(EXT_CONV_DNNL);
}

/* The depthwise row blocks (dw3_rows with AVX-512, dw8_rows with AVX2) on
 * 300 shapes drawn from a fixed seed: 3x3 and 5x5, strides 1 and 2,
 * padding 0 to the filter's size (rows and columns wholly in the padding),
 * planes of 1 to 40 by 1 to 70, batch 1 or 2; against the naive loops at
 * each level this CPU runs, on the im2col backend so that every plane
 * size takes kiln's loops. */
TEST(externs_conv2d_depthwise_blocks_sweep) {
    static const unsigned caps[] = {0, EXT_CPU_AVX2, EXT_CPU_AVX2 | EXT_CPU_AVX512};
    unsigned have = ext_cpu_features_all();
    uint64_t st = 0x9e3779b97f4a7c15u;
    ext_set_conv_backend(EXT_CONV_IM2COL);
    int ran = 0;
    for (int t = 0; t < 300; t++) {
        st = st * 6364136223846793005u + 1442695040888963407u;
        uint64_t r = st >> 11;
        int64_t K = r % 2 ? 5 : 3, sd = (r >> 1) % 2 + 1,
                p = (int64_t)((r >> 2) % (uint64_t)(K + 1));
        int64_t h = (int64_t)((r >> 5) % 40) + 1, w = (int64_t)((r >> 11) % 70) + 1;
        int64_t c = (int64_t)((r >> 18) % 5) + 1, nb = (int64_t)((r >> 21) % 2) + 1;
        int64_t oh = (h + 2 * p - K) / sd + 1, ow = (w + 2 * p - K) / sd + 1;
        if (h + 2 * p < K || w + 2 * p < K || oh < 1 || ow < 1) continue;
        int64_t xs[4] = {nb, c, h, w}, ws[4] = {c, 1, K, K}, ys[4] = {nb, c, oh, ow};
        int64_t at_[7] = {sd, sd, p, p, 1, 1, c};
        int64_t nx = nb * c * h * w, ny = nb * c * oh * ow;
        float *x = randbuf(nx, 200 + (uint64_t)t), *wt = randbuf(c * K * K, 500 + (uint64_t)t);
        float *b = randbuf(c, 800 + (uint64_t)t), *want = malloc(sizeof(float) * (size_t)ny);
        float *got = malloc(sizeof(float) * (size_t)ny);
        naive_conv(x, xs, wt, ws, b, want, ys, at_);
        for (int l = 0; l < 3; l++) {
            if ((have & caps[l]) != caps[l]) continue;
            unsigned prev = ext_isa_enter(caps[l]);
            CHECK(ext_conv2d(x, xs, wt, ws, b, got, ys, at_) == 0);
            double worst = 0;
            for (int64_t k = 0; k < ny; k++) worst = fmax(worst, fabs(got[k] - want[k]));
            EXPECT(worst < 1e-4,
                   "shape %d: %lldx%lld over %lldx%lld, stride %lld, pad %lld, "
                   "level %d: off by %g",
                   t, (long long)K, (long long)K, (long long)h, (long long)w, (long long)sd,
                   (long long)p, l, worst);
            ext_isa_leave(prev);
            ran++;
        }
        free(x), free(wt), free(b), free(want), free(got);
    }
    ext_set_conv_backend(EXT_CONV_DNNL);
    EXPECT(ran > 300, "only %d shape-level runs", ran);
}

/* A batch split among the threads (ext_conv_dnnl_split): decided as the
 * header says, and run against the naive loops with the epilogue seeing
 * every element once, with runtime weights (reordered once per call for
 * all the threads) and constant ones (one kept copy for all the threads'
 * entries, used again on the next call). */
TEST(externs_conv2d_dnnl_split) {
    static const int64_t xs[4] = {4, 16, 64, 64}, ws[4] = {32, 16, 3, 3}, ys[4] = {4, 32, 64, 64};
    static const int64_t at_[7] = {1, 1, 1, 1, 1, 1, 1};
    static const int64_t y1[4] = {1, 32, 64, 64}, y8[4] = {8, 64, 56, 56}, y8s[4] = {8, 512, 7, 7};
    static const int64_t x8[4] = {8, 64, 56, 56}, w8[4] = {64, 64, 3, 3};
    /* 512 KB images: calls of two, two calls */
    EXPECT(ext_conv_dnnl_split(ys, 2) == 2, "split %d", ext_conv_dnnl_split(ys, 2));
    EXPECT(ext_conv_dnnl_split(ys, 1) == 0 && ext_conv_dnnl_split(ys, 3) == 0 &&
               ext_conv_dnnl_split(ys, 4) == 0,
           "two calls split among 1, 3 or 4 threads");
    EXPECT(ext_conv_dnnl_split(y1, 2) == 0, "one image split");
    EXPECT(ext_conv_dnnl_split(y8, 2) == 2 && ext_conv_dnnl_split(y8, 4) == 4,
           "ResNet-18 layer1 at batch 8 not split");
    EXPECT(ext_conv_dnnl_split(y8s, 2) == 0, "layer4 at batch 8 (one call) split");
    int threads = ext_get_threads();
    ext_set_threads(2);
    const char *path = ext_conv_path(x8, w8, y8, at_);
    EXPECT(strstr(path, "split among the threads"), "path: %s", path);
    ext_set_threads(1);
    path = ext_conv_path(x8, w8, y8, at_);
    EXPECT(strstr(path, "oneDNN") && !strstr(path, "split"), "path at 1 thread: %s", path);
    ext_set_threads(2);

    int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
    float *x = randbuf(nx, 41), *w = randbuf(nw, 42), *b = randbuf(ws[0], 43);
    float *y = malloc(sizeof(float) * (size_t)ny), *ref = malloc(sizeof(float) * (size_t)ny);
    naive_conv(x, xs, w, ws, b, ref, ys, at_);
    int kept = ext_kept_count_all(NULL);
    for (int round = 0; round < 3; round++) {
        bool wconst = round > 0;
        Seen seen = {calloc((size_t)ny, 1), ny, 0};
        int rc = ext_conv2d_dnnl(x, xs, w, ws, b, y, ys, at_, wconst, plus_one, &seen);
        EXPECT(rc == 0, "round %d: rc %d", round, rc);
        for (int64_t i = 0; i < ny && rc == 0; i++) {
            float want = ref[i] + 1.0f;
            if (!(fabsf(y[i] - want) <= 1e-4f + 1e-4f * fabsf(want)) || seen.seen[i] != 1) {
                test_failf(__FILE__, __LINE__, "round %d element %lld: %g vs %g, seen %d times",
                           round, (long long)i, y[i], want, seen.seen[i]);
                break;
            }
        }
        EXPECT(!seen.bad, "round %d: an epilogue range out of bounds", round);
        EXPECT(ext_kept_count_all(NULL) == kept + wconst, "round %d: %d copies kept, %d before",
               round, ext_kept_count_all(NULL), kept);
        free(seen.seen);
    }
    ext_kept_forget_all(w, sizeof(float) * (size_t)nw);
    EXPECT(ext_kept_count_all(NULL) == kept, "not forgotten");
    ext_set_threads(threads);
    free(x);
    free(w);
    free(b);
    free(y);
    free(ref);
}

/* ResNet's stem (3 -> 64 channels, 7x7, stride 2, 224x224: a 3.2 MB
 * output, so oneDNN's output is asked for blocked by channels, see
 * conv_new) must run on one of oneDNN's kernels, never its reference loops:
 * asked for nChw16c on an AVX2 CPU, whose kernels block by 8, oneDNN
 * answered with ref:any, 1.05 s instead of 4 ms (docs/decisions.md). */
/* One conv2d on ext_conv2d_dnnl (bias, epilogue +1) against the naive
 * loops; oneDNN must take it, on one of its kernels, not its reference
 * loops, and where its ISA is AVX-512 on an AVX-512 kernel (`avx512` in
 * the implementation's name) when avx512 is set. */
static void check_dnnl_kernel(const char *what, const int64_t xs[4], const int64_t ws[4],
                              const int64_t ys[4], const int64_t at_[7], bool avx512) {
    int64_t nx = xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    int64_t ny = ys[1] * ys[2] * ys[3];
    float *x = randbuf(nx, 61), *w = randbuf(nw, 62), *b = randbuf(ws[0], 63);
    float *y = malloc(sizeof(float) * (size_t)ny), *ref = malloc(sizeof(float) * (size_t)ny);
    Seen seen = {calloc((size_t)ny, 1), ny, 0};
    ext_dnnl_impl_reset();
    int rc = ext_conv2d_dnnl(x, xs, w, ws, b, y, ys, at_, false, plus_one, &seen);
    const char *impl = ext_dnnl_last_impl(), *isa = ext_dnnl_isa();
    EXPECT(rc == 0, "oneDNN declined %s (rc %d)", what, rc);
    EXPECT(rc != 0 || (impl && *impl && strncmp(impl, "ref", 3)), "%s ran on '%s'", what,
           impl ? impl : "(nothing)");
    EXPECT(rc != 0 || !avx512 || strncmp(isa, "avx512", 6) || (impl && strstr(impl, "avx512")),
           "%s ran on '%s' where oneDNN's ISA is %s", what, impl ? impl : "(nothing)", isa);
    printf("externs: %s on oneDNN's %s (%s)\n", what, impl ? impl : "?", isa);
    naive_conv(x, xs, w, ws, b, ref, ys, at_);
    for (int64_t i = 0; i < ny && rc == 0; i++) {
        float want = ref[i] + 1.0f;
        if (!(fabsf(y[i] - want) <= 1e-4f + 1e-4f * fabsf(want)) || seen.seen[i] != 1) {
            test_failf(__FILE__, __LINE__, "%s: element %lld: %g vs %g, seen %d times", what,
                       (long long)i, y[i], want, seen.seen[i]);
            break;
        }
    }
    EXPECT(!seen.bad, "%s: an epilogue range out of bounds", what);
    free(seen.seen);
    free(x);
    free(w);
    free(b);
    free(y);
    free(ref);
}

TEST(externs_conv2d_dnnl_stem_not_reference) {
    static const int64_t xs[4] = {1, 3, 224, 224}, ws[4] = {64, 3, 7, 7}, ys[4] = {1, 64, 112, 112};
    static const int64_t at_[7] = {2, 2, 3, 3, 1, 1, 1};
    check_dnnl_kernel("the stem", xs, ws, ys, at_, false);
}

/* An output over CALL_BYTES whose channels are not a multiple of 16 (a
 * text detector's first conv: 24 channels at 208x208, 4.2 MB): blocked
 * by 16 with the last block padded where the CPU has AVX-512, not by 8,
 * which ran oneDNN's AVX2 kernel there (docs/decisions.md: oneDNN: never
 * its reference loops). */
TEST(externs_conv2d_dnnl_padded_blocks) {
    static const int64_t xs[4] = {1, 12, 208, 208}, ws[4] = {24, 12, 3, 3},
                         ys[4] = {1, 24, 208, 208};
    static const int64_t at_[7] = {1, 1, 1, 1, 1, 1, 1};
    check_dnnl_kernel("24 channels at 208x208", xs, ws, ys, at_, true);
}

/* One run of ext_conv2d_dnnl against the naive loops (bias, epilogue +1);
 * false on any difference. */
static bool dnnl_matches(const int64_t xs[4], const int64_t ws[4], const int64_t ys[4],
                         uint64_t seed) {
    static const int64_t at_[7] = {1, 1, 1, 1, 1, 1, 1};
    int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
    float *x = randbuf(nx, seed), *w = randbuf(nw, seed + 1), *b = randbuf(ws[0], seed + 2);
    float *y = malloc(sizeof(float) * (size_t)ny), *ref = malloc(sizeof(float) * (size_t)ny);
    Seen seen = {calloc((size_t)ny, 1), ny, 0};
    bool ok = ext_conv2d_dnnl(x, xs, w, ws, b, y, ys, at_, false, plus_one, &seen) == 0;
    naive_conv(x, xs, w, ws, b, ref, ys, at_);
    for (int64_t i = 0; i < ny && ok; i++)
        ok = fabsf(y[i] - (ref[i] + 1.0f)) <= 1e-4f + 1e-4f * fabsf(ref[i] + 1.0f) &&
             seen.seen[i] == 1;
    ok = ok && !seen.bad;
    free(x);
    free(w);
    free(b);
    free(y);
    free(ref);
    free(seen.seen);
    return ok;
}

/* The split pins its entries in conv_dnnl.c's cache of primitives (64,
 * replaced round robin): a shape split among 2 threads, then 62 other
 * shapes, so that its 2 entries are next in line, then the shape on 3
 * threads, whose third entry is made while the first two are held. It
 * must not evict them (under ASan that was a use after free). */
TEST(externs_conv2d_dnnl_split_keeps_entries) {
    static const int64_t xs[4] = {6, 2, 64, 64}, ws[4] = {48, 2, 3, 3}, ys[4] = {6, 48, 64, 64};
    CHECK(ext_conv_dnnl_split(ys, 2) == 2 && ext_conv_dnnl_split(ys, 3) == 3);
    int threads = ext_get_threads();
    ext_set_threads(2);
    EXPECT(dnnl_matches(xs, ws, ys, 51), "on 2 threads");
    ext_set_threads(1);
    for (int64_t c = 1; c <= 62; c++) {
        int64_t fx[4] = {1, c, 3, 5}, fw[4] = {3, c, 3, 3}, fy[4] = {1, 3, 3, 5};
        EXPECT(dnnl_matches(fx, fw, fy, 60 + (uint64_t)c), "filler %lld", (long long)c);
    }
    ext_set_threads(3);
    EXPECT(dnnl_matches(xs, ws, ys, 52), "on 3 threads");
    ext_set_threads(threads);
}

/* oneDNN takes every case itself (none falls back to im2col), and again
 * from its cache of primitives, at another thread count too. */
TEST(externs_conv2d_params_dnnl) {
    int threads = ext_get_threads();
    for (int round = 0; round < 2; round++)
        for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, true, "oneDNN");
    ext_set_threads(threads > 1 ? 1 : 2);
    for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, true, "oneDNN, other threads");
    ext_set_threads(3); /* the parts' rows in 3 slices: 42 + 42 + 43 of 127 */
    for (size_t t = 0; t < CONV_CASES; t++) check_conv_case(t, true, "oneDNN, 3 threads");
    ext_set_threads(threads);
}

/* OpenBLAS's core: kiln replaces the Prescott fallback (an unknown CPU) by
 * the kernels the CPU supports, and never overrides the user or a core
 * OpenBLAS chose itself, unless that core needs more than the target tier
 * allows (cap): then the best core within it, the user's choice too. */
TEST(externs_blas_core_choice) {
    unsigned avx512 = EXT_CPU_AVX2 | EXT_CPU_AVX512, all = ~0u;
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Prescott", avx512, all), "SkylakeX"));
    CHECK(!strcmp(ext_blas_core_choice("", "prescott", avx512, all), "SkylakeX"));
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Prescott", EXT_CPU_AVX2, all), "Haswell"));
    CHECK(!ext_blas_core_choice(NULL, "Prescott", 0, all));
    CHECK(!ext_blas_core_choice("Prescott", "Prescott", avx512, all)); /* the user's choice */
    CHECK(!ext_blas_core_choice("Haswell", "Prescott", avx512, all));
    CHECK(!ext_blas_core_choice(NULL, "Zen", avx512, all)); /* OpenBLAS knew the CPU */
    CHECK(!ext_blas_core_choice(NULL, "Haswell", avx512, all));
    /* a v3 tier (AVX2 only) on an AVX-512 CPU: no SkylakeX kernels */
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Prescott", avx512, EXT_CPU_AVX2), "Haswell"));
    CHECK(!strcmp(ext_blas_core_choice(NULL, "SkylakeX", avx512, EXT_CPU_AVX2), "Haswell"));
    CHECK(!strcmp(ext_blas_core_choice("SkylakeX", "SkylakeX", avx512, EXT_CPU_AVX2), "Haswell"));
    CHECK(!strcmp(ext_blas_core_choice(NULL, "cooperlake", avx512, EXT_CPU_AVX2), "Haswell"));
    CHECK(!ext_blas_core_choice(NULL, "Zen", avx512, EXT_CPU_AVX2)); /* AVX2: within v3 */
    /* v2 (no AVX): any AVX core becomes Nehalem's SSE kernels */
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Zen", EXT_CPU_AVX2, 0), "Nehalem"));
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Haswell", avx512, 0), "Nehalem"));
    CHECK(!strcmp(ext_blas_core_choice(NULL, "Sandybridge", EXT_CPU_AVX2, 0), "Nehalem"));
    CHECK(!ext_blas_core_choice(NULL, "Prescott", avx512, 0));
    CHECK(!ext_blas_core_choice(NULL, "Nehalem", avx512, 0));
}

/* The real library after kiln's first BLAS use: on a CPU with AVX2 the core
 * is not the SSE3 Prescott fallback, whose sgemm is several times slower
 * (docs/decisions.md: OpenBLAS's core choice). Skipped on other
 * CPUs and when the user set OPENBLAS_CORETYPE. */
TEST(externs_blas_core_not_prescott) {
    const char *user = getenv("OPENBLAS_CORETYPE");
    if (!(ext_cpu_features() & EXT_CPU_AVX2) || (user && *user)) {
        printf("  skipped: %s\n", user && *user ? "OPENBLAS_CORETYPE is set" : "no AVX2");
        return;
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4];
    int64_t s[2] = {2, 2};
    ExtView v = test_dense_view(2, s);
    CHECK(ext_matmul(a, &v, b, &v, c, 2, s) == 0);
    CHECK(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50);
    const char *core = openblas_get_corename();
    CHECKF(strcasecmp(core, "Prescott") != 0, "OpenBLAS core is %s on a CPU with AVX2", core);
}
