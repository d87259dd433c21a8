/*
 * test_f64.c -- f64 values computed in double (include/kiln.h: kiln_input,
 * kiln_cast; docs/design.md, "Element types").
 *
 * The oracle is the same formula in C doubles (libm), element by element:
 * compiled kernels and the interpreter must both agree with it to a few
 * ulps of a double, far tighter than float could (the inputs are chosen so
 * that float arithmetic gives a visibly different answer: 1 + 1e-10 is 1
 * in float). Mixed programs check the rules of kiln_cast and of type
 * promotion: an op on f32 and f64 computes in f64, a scalar takes its
 * partner's type, and a cast to f32 rounds to the nearest float.
 */
#include <math.h>
#include <string.h>

#include "runtime/runtime.h"
#include "test.h"
#include "testutil.h"

#define N 96

/* Within 4 ulps of a double (relative 1e-15), or both NaN / equal. */
static bool close64(double got, double want, double rel) {
    if (isnan(want)) return isnan(got);
    if (got == want) return true;
    return fabs(got - want) <= rel * fabs(want) + 1e-300;
}

static double relu(double x) { return x < 0 ? 0 : x; }

/* The formulas, as the program below computes them. */
static double f_main(double x) {
    double s = (x - 1.0) * 1e10; /* 1 + 1e-10 - 1 is 1e-10 in double, 0 in float */
    return s + exp(x * 0.1) * sin(x) / (1.0 + x * x) + tanh(x) - relu(x - 1.5) + sqrt(fabs(x)) +
           1.0 / (1.0 + exp(-x)) + 0.5 * x * erfc(-x * M_SQRT1_2) + pow(fabs(x) + 1.0, 0.3) +
           fmod(x, 0.7) + floor(x * 3.0);
}

/* Runs g (inputs in[0..nin)) compiled and interpreted; outputs in got and
 * ref, allocated; false with a recorded failure. */
static bool run_both(kiln_graph *g, const kiln_tensor *in, kiln_tensor *got, kiln_tensor *ref,
                     kiln_program **pp) {
    kiln_program *p = NULL;
    if (kiln_compile(g, 1, &p) != KILN_OK) {
        EXPECT(false, "compile: %s", kiln_error(g));
        return false;
    }
    if (kiln_program_run(p, in, got) != KILN_OK) {
        EXPECT(false, "run: %s", kiln_program_error(p));
        kiln_program_free(p);
        return false;
    }
    if (kiln_interpret(g, in, ref) != KILN_OK) {
        EXPECT(false, "interpret: %s", kiln_error(g));
        for (int i = 0; i < kiln_num_outputs(g); i++) kiln_tensor_free(&got[i]);
        kiln_program_free(p);
        return false;
    }
    if (pp)
        *pp = p;
    else
        kiln_program_free(p);
    return true;
}

static void fill_x(double *x, int n) {
    for (int i = 0; i < n; i++) x[i] = i == 0 ? 1.0 + 1e-10 : -3.0 + 6.0 * i / (n - 1) + 1e-9 * i;
}

/* Pointwise math in f64, with constants that are not floats (0.1, 1e10). */
TEST(f64_pointwise_math) {
    test_use_shared_cache();
    const char *src = "input x: f64[96]\n"
                      "s = (x - 1.0) * 1e10\n"
                      "a = exp(x * 0.1) * sin(x) / (1.0 + x * x) + tanh(x) - relu(x - 1.5)\n"
                      "b = sqrt(abs(x)) + sigmoid(x) + gelu(x) + pow(abs(x) + 1.0, 0.3)\n"
                      "c = fmod(x, 0.7) + floor(x * 3.0)\n"
                      "y = s + a + b + c\n"
                      "m = where(x > 0.5, maximum(x, 1.25), minimum(x, -0.5))\n"
                      "output y\noutput m\n";
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse(g, src, "f64") == KILN_OK, "parse: %s", kiln_error(g));
    CHECK(kiln_output_desc(g, 0).dtype == KILN_F64);
    double x[N];
    fill_x(x, N);
    kiln_tensor in = kiln_input_desc(g, 0), got[2], ref[2];
    CHECK(in.dtype == KILN_F64);
    in.data = x;
    kiln_program *p = NULL;
    if (!run_both(g, &in, got, ref, &p)) {
        kiln_graph_free(g);
        return;
    }
    const kiln_tensor *res[2][2] = {{&got[0], &got[1]}, {&ref[0], &ref[1]}};
    for (int w = 0; w < 2; w++) {
        const char *who = w ? "interpreted" : "compiled";
        EXPECT(res[w][0]->dtype == KILN_F64, "%s: output dtype %s", who,
               kiln_dtype_name(res[w][0]->dtype));
        const double *y = res[w][0]->data, *m = res[w][1]->data;
        for (int i = 0; i < N; i++) {
            double want = f_main(x[i]);
            double wm = x[i] > 0.5 ? fmax(x[i], 1.25) : fmin(x[i], -0.5);
            EXPECT(close64(y[i], want, 1e-14), "%s y[%d] = %.17g, expected %.17g", who, i, y[i],
                   want);
            EXPECT(m[i] == wm, "%s m[%d] = %.17g, expected %.17g", who, i, m[i], wm);
        }
    }
    /* the first element's s term is 1 (float arithmetic would give 0) */
    EXPECT(fabs(((double *)got[0].data)[0] - f_main(x[0])) < 1e-6, "1 + 1e-10 lost");
    const char *code = strstr(kiln_program_source(p), "===== kernels");
    CHECK(code);
    EXPECT(strstr(code, "const double *restrict") != NULL, "no double kernel parameter");
    EXPECT(strstr(code, " exp(") != NULL && strstr(code, "kiln_expf_v(") == NULL,
           "f64 exp did not use libm's double exp");
    for (int i = 0; i < 2; i++) kiln_tensor_free(&got[i]), kiln_tensor_free(&ref[i]);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* Reductions and the composites (softmax, layer_norm, pools) in f64: sums
 * accumulate in double, a softmax row of near-equal values keeps the
 * differences float would lose. */
TEST(f64_reductions_and_composites) {
    test_use_shared_cache();
    enum { R = 6, C = 40 };
    const char *src = "input x: f64[6, 40]\n"
                      "s = sum(x, 1)\n"
                      "mx = amax(x, 1)\n"
                      "mn = mean(x, 0)\n"
                      "pr = prod(x * 0.01 + 1.0, 1)\n"
                      "sm = softmax(x, 1)\n"
                      "ln = layer_norm(x, [40], eps=1e-12)\n"
                      "x4 = reshape(x, 1, 6, 5, 8)\n"
                      "mp = max_pool2d(x4, 2)\n"
                      "ap = avg_pool2d(x4, 3, stride=1, padding=1, count_include_pad=false)\n"
                      "output s\noutput mx\noutput mn\noutput pr\noutput sm\noutput ln\n"
                      "output mp\noutput ap\n";
    kiln_graph *g = kiln_graph_new();
    CHECKF(kiln_parse(g, src, "f64") == KILN_OK, "parse: %s", kiln_error(g));
    double x[R * C];
    for (int i = 0; i < R * C; i++) x[i] = 1000.0 + 1e-7 * (double)((i * 37) % 101) - 0.5 * (i % 3);
    kiln_tensor in = kiln_input_desc(g, 0), got[8], ref[8];
    in.data = x;
    if (!run_both(g, &in, got, ref, NULL)) {
        kiln_graph_free(g);
        return;
    }
    for (int w = 0; w < 2; w++) {
        const kiln_tensor *o = w ? ref : got;
        const char *who = w ? "interpreted" : "compiled";
        const double *s = o[0].data, *mx = o[1].data, *mn = o[2].data, *pr = o[3].data;
        const double *sm = o[4].data, *ln = o[5].data, *mp = o[6].data, *ap = o[7].data;
        for (int r = 0; r < R; r++) {
            double ws = 0, wm = -INFINITY, wp = 1, mean = 0, var = 0, den = 0;
            for (int c = 0; c < C; c++) {
                double v = x[r * C + c];
                ws += v, wm = fmax(wm, v), wp *= v * 0.01 + 1.0;
            }
            mean = ws / C;
            for (int c = 0; c < C; c++) var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
            var /= C;
            for (int c = 0; c < C; c++) den += exp(x[r * C + c] - wm);
            EXPECT(close64(s[r], ws, 1e-14), "%s sum[%d] %.17g vs %.17g", who, r, s[r], ws);
            EXPECT(mx[r] == wm, "%s amax[%d]", who, r);
            EXPECT(close64(pr[r], wp, 1e-13), "%s prod[%d] %.17g vs %.17g", who, r, pr[r], wp);
            for (int c = 0; c < C; c++) {
                double v = x[r * C + c], wsm = exp(v - wm) / den;
                double wln = (v - mean) / sqrt(var + 1e-12);
                EXPECT(close64(sm[r * C + c], wsm, 1e-13), "%s softmax[%d,%d] %.17g vs %.17g", who,
                       r, c, sm[r * C + c], wsm);
                /* values of 1000 that differ by 0.5 and 1e-7: float holds
                 * 1000 to 6e-5, so the 1e-7 parts survive only in double */
                EXPECT(fabs(ln[r * C + c] - wln) < 1e-9, "%s layer_norm[%d,%d] %.17g vs %.17g", who,
                       r, c, ln[r * C + c], wln);
            }
        }
        for (int c = 0; c < C; c++) {
            double m = 0;
            for (int r = 0; r < R; r++) m += x[r * C + c];
            EXPECT(close64(mn[c], m / R, 1e-14), "%s mean[%d]", who, c);
        }
        /* pools over [6 channels, 5, 8]: max 2x2 (stride 2, floor: 2x4
         * windows), avg 3x3 padded by 1 without the padding counted */
        for (int ch = 0; ch < 6; ch++) {
            const double *pl = x + ch * 40;
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++) {
                    double v =
                        fmax(fmax(pl[(2 * i) * 8 + 2 * j], pl[(2 * i) * 8 + 2 * j + 1]),
                             fmax(pl[(2 * i + 1) * 8 + 2 * j], pl[(2 * i + 1) * 8 + 2 * j + 1]));
                    EXPECT(mp[ch * 8 + i * 4 + j] == v, "%s max_pool[%d,%d,%d]", who, ch, i, j);
                }
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 8; j++) {
                    double t = 0;
                    int cnt = 0;
                    for (int di = -1; di <= 1; di++)
                        for (int dj = -1; dj <= 1; dj++) {
                            int a = i + di, b = j + dj;
                            if (a < 0 || a >= 5 || b < 0 || b >= 8) continue;
                            t += pl[a * 8 + b], cnt++;
                        }
                    EXPECT(close64(ap[ch * 40 + i * 8 + j], t / cnt, 1e-14),
                           "%s avg_pool[%d,%d,%d] %.17g vs %.17g", who, ch, i, j,
                           ap[ch * 40 + i * 8 + j], t / cnt);
                }
        }
    }
    for (int i = 0; i < 8; i++) kiln_tensor_free(&got[i]), kiln_tensor_free(&ref[i]);
    kiln_graph_free(g);
}

/* f32 and f64 together: promotion, a scalar's type, kiln_cast both ways,
 * an f32 op after a cast computing in float, a matmul (f32 only) whose
 * result is cast to f64 and used there (not fused into the matmul: its
 * epilogue must compute in f32). */
TEST(f64_mixed_with_f32) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    int64_t s2[2] = {8, 12}, sw[2] = {12, 5}, s1[1] = {12};
    kiln_value a = kiln_input(g, "a", KILN_F32, 2, s2);
    kiln_value b = kiln_input(g, "b", KILN_F64, 2, s2);
    double wd[12];
    for (int i = 0; i < 12; i++) wd[i] = 0.1 * (i + 1);
    kiln_value w64 = kiln_weight_typed(g, "w64", KILN_F64, 1, s1, wd);
    float wm[60];
    kiln_fill_randn(wm, 60, 3);
    kiln_value wmat = kiln_weight(g, "wm", 2, sw, wm);
    /* f32 + f64 -> f64; the scalar 0.1 is the double 0.1 there */
    kiln_value sum64 = kiln_binary(g, "add", kiln_binary(g, "mul", a, b),
                                   kiln_binary(g, "mul", w64, kiln_scalar(g, 0.1)));
    /* back to f32, then float math: (float)sum64 * 3 in float */
    kiln_value back = kiln_binary(g, "mul", kiln_cast(g, sum64, KILN_F32), kiln_scalar(g, 3.0));
    kiln_value mm = kiln_matmul(g, a, wmat);
    kiln_value mm64 = kiln_binary(g, "add", kiln_cast(g, mm, KILN_F64), kiln_scalar(g, 1e-12));
    kiln_value isbig = kiln_cast(g, kiln_binary(g, "gt", b, kiln_scalar(g, 0.3)), KILN_F64);
    kiln_output(g, sum64, "sum64");
    kiln_output(g, back, "back");
    kiln_output(g, mm64, "mm64");
    kiln_output(g, isbig, "isbig");
    CHECKF(kiln_error(g)[0] == 0, "build: %s", kiln_error(g));
    CHECK(kiln_value_dtype(g, sum64) == KILN_F64 && kiln_value_dtype(g, back) == KILN_F32);
    CHECK(kiln_value_dtype(g, isbig) == KILN_F64);
    float af[96];
    double bd[96];
    kiln_fill_randn(af, 96, 1);
    for (int i = 0; i < 96; i++) bd[i] = 0.3 + 1e-12 * (i - 48) + 0.001 * (i % 5 == 0);
    kiln_tensor in[2] = {kiln_input_desc(g, 0), kiln_input_desc(g, 1)}, got[4], ref[4];
    in[0].data = af;
    in[1].data = bd;
    kiln_program *p = NULL;
    if (!run_both(g, in, got, ref, &p)) {
        kiln_graph_free(g);
        return;
    }
    for (int w = 0; w < 2; w++) {
        const kiln_tensor *o = w ? ref : got;
        const char *who = w ? "interpreted" : "compiled";
        EXPECT(o[0].dtype == KILN_F64 && o[1].dtype == KILN_F32 && o[2].dtype == KILN_F64,
               "%s: output dtypes", who);
        const double *s = o[0].data, *mm = o[2].data, *big = o[3].data;
        const float *bk = o[1].data;
        for (int i = 0; i < 96; i++) {
            double ws = (double)af[i] * bd[i] + wd[i % 12] * 0.1;
            float wb = (float)ws * 3.0f;
            EXPECT(close64(s[i], ws, 1e-15), "%s sum64[%d] %.17g vs %.17g", who, i, s[i], ws);
            EXPECT(bk[i] == wb, "%s back[%d] %.9g vs %.9g", who, i, bk[i], wb);
            EXPECT(big[i] == (bd[i] > 0.3 ? 1.0 : 0.0), "%s isbig[%d]", who, i);
        }
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 5; j++) {
                double want = 1e-12;
                for (int k = 0; k < 12; k++) want += (double)af[i * 12 + k] * wm[k * 5 + j];
                EXPECT(fabs(mm[i * 5 + j] - want) < 1e-4, "%s mm64[%d,%d]", who, i, j);
            }
    }
    /* no kernel inside the matmul's callback computes in double */
    EXPECT(strstr(kiln_program_source(p), "_cb(void *ctx, double") == NULL, "an f64 epilogue");
    for (int i = 0; i < 4; i++) kiln_tensor_free(&got[i]), kiln_tensor_free(&ref[i]);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* A large f64 softmax runs in plain loops (no float-only strategy), in
 * parallel, and matches the formula. */
TEST(f64_large_rows_plain_loops) {
    test_use_shared_cache();
    enum { R = 64, C = 5000 };
    kiln_graph *g = kiln_graph_new();
    int64_t shape[2] = {R, C};
    kiln_value x = kiln_input(g, "x", KILN_F64, 2, shape);
    kiln_output(g, kiln_softmax(g, kiln_binary(g, "mul", x, kiln_scalar(g, 0.5)), 1), "y");
    double *xd = malloc(sizeof(double) * R * C);
    CHECK(xd);
    for (int i = 0; i < R * C; i++) xd[i] = sin(0.001 * i) * 20.0;
    kiln_tensor in = kiln_input_desc(g, 0), got[1], ref[1];
    in.data = xd;
    kiln_program *p = NULL;
    if (run_both(g, &in, got, ref, &p)) {
        const double *y = got[0].data, *yr = ref[0].data;
        int bad = 0;
        for (int r = 0; r < R; r++) {
            double m = -INFINITY, den = 0;
            for (int c = 0; c < C; c++) m = fmax(m, xd[r * C + c] * 0.5);
            for (int c = 0; c < C; c++) den += exp(xd[r * C + c] * 0.5 - m);
            for (int c = 0; c < C; c++) {
                double want = exp(xd[r * C + c] * 0.5 - m) / den;
                bad += !close64(y[r * C + c], want, 1e-12) || !close64(yr[r * C + c], want, 1e-12);
            }
        }
        EXPECT(bad == 0, "%d elements off", bad);
        const char *code = strstr(kiln_program_source(p), "===== kernels");
        CHECK(code);
        EXPECT(strstr(code, "kiln_stream(") == NULL && strstr(code, "lane_acc") == NULL &&
                   strstr(code, "kiln_prefetch(") == NULL,
               "a float strategy in an f64 kernel");
        EXPECT(strstr(code, "double row_") != NULL || strstr(code, "double *row_") != NULL,
               "the row's exp values are not kept in doubles");
        EXPECT(strstr(code, "3 stages, f64 (plain loops), parallel") != NULL,
               "the kernel's comment does not say it runs plain f64 loops");
        kiln_tensor_free(&got[0]), kiln_tensor_free(&ref[0]);
        kiln_program_free(p);
    }
    free(xd);
    kiln_graph_free(g);
}

/* What f64 cannot do says so. */
TEST(f64_refusals) {
    kiln_graph *g = kiln_graph_new();
    int64_t s[2] = {4, 4};
    kiln_value x = kiln_input(g, "x", KILN_F64, 2, s);
    int64_t ws[4] = {4, 4, 3, 3};
    kiln_value w = kiln_weight(g, "w", 4, ws, (float[144]){0});
    CHECK(kiln_conv2d(g, x, w, KILN_NONE, NULL) == KILN_NONE);
    EXPECT(strcmp(kiln_error(g), "conv2d expects an f32 tensor, got f64 (its library computes in "
                                 "f32)") == 0,
           "got: %s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    x = kiln_input(g, "x", KILN_F64, 2, s);
    CHECK(kiln_cast(g, x, KILN_I32) == KILN_NONE);
    EXPECT(strcmp(kiln_error(g), "cast: to i32 is not supported (f32, f64 or bool)") == 0,
           "got: %s", kiln_error(g));
    kiln_graph_free(g);
    g = kiln_graph_new();
    x = kiln_input(g, "x", KILN_F64, 2, s);
    CHECK(kiln_unary(g, "cast", x) == KILN_NONE);
    EXPECT(strcmp(kiln_error(g), "cast needs a dtype (kiln_cast)") == 0, "got: %s", kiln_error(g));
    kiln_graph_free(g);
    /* an f64 input given f32 data is refused by name */
    g = kiln_graph_new();
    kiln_value y = kiln_input(g, "y", KILN_F64, 2, s);
    kiln_output(g, kiln_unary(g, "exp", y), "z");
    float data[16] = {0};
    kiln_tensor in = {KILN_F32, 2, {4, 4}, data}, out[1];
    EXPECT(kiln_interpret(g, &in, out) == KILN_ERR_INPUT, "f32 data for an f64 input ran");
    EXPECT(strstr(kiln_error(g), "expected f64[4, 4], got f32[4, 4]") != NULL, "got: %s",
           kiln_error(g));
    kiln_graph_free(g);
}

/* An f64 matmul (batched, broadcast, 1-D operands, an f32 operand cast,
 * a transposed one) runs OpenBLAS's dgemm: checked against the triple
 * loop in double. */
TEST(f64_matmul) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    int64_t sa[3] = {3, 5, 7}, sb[2] = {7, 4}, sv[1] = {7};
    kiln_value a = kiln_input(g, "a", KILN_F64, 3, sa);
    kiln_value b = kiln_input(g, "b", KILN_F32, 2, sb);
    kiln_value v = kiln_input(g, "v", KILN_F64, 1, sv);
    kiln_output(g, kiln_matmul(g, a, b), "ab");
    kiln_output(g, kiln_matmul(g, a, v), "av");
    /* a^T a: a transposed view (BLAS's Trans), and a slice of a with
     * strides BLAS cannot take (packed first) */
    kiln_output(g, kiln_matmul(g, kiln_transpose(g, a, 1, 2), a), "ata");
    kiln_value sl = kiln_slice(g, kiln_transpose(g, a, 1, 2), 1, 0, 7, 2); /* [3, 4, 5] */
    kiln_output(g, kiln_matmul(g, sl, kiln_transpose(g, sl, 1, 2)), "sls");
    CHECKF(kiln_error(g)[0] == 0, "build: %s", kiln_error(g));
    double ad[105], vd[7];
    float bf[28];
    for (int i = 0; i < 105; i++) ad[i] = 1.0 + 1e-9 * i + 0.25 * (i % 4);
    for (int i = 0; i < 28; i++) bf[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 7; i++) vd[i] = 0.1 * i - 1e-10;
    kiln_tensor in[3] = {kiln_input_desc(g, 0), kiln_input_desc(g, 1), kiln_input_desc(g, 2)};
    in[0].data = ad, in[1].data = bf, in[2].data = vd;
    kiln_tensor got[4], ref[4];
    kiln_program *p = NULL;
    if (!run_both(g, in, got, ref, &p)) {
        kiln_graph_free(g);
        return;
    }
    for (int w = 0; w < 2; w++) {
        const kiln_tensor *o = w ? ref : got;
        const char *who = w ? "interpreted" : "compiled";
        EXPECT(o[0].rank == 3 && o[0].shape[2] == 4 && o[1].rank == 2 && o[1].shape[1] == 5,
               "%s: shapes", who);
        const double *ab = o[0].data, *av = o[1].data, *ata = o[2].data, *sls = o[3].data;
        for (int bi = 0; bi < 3; bi++)
            for (int i = 0; i < 7; i++)
                for (int j = 0; j < 7; j++) {
                    double want = 0, ws = 0;
                    for (int k = 0; k < 5; k++)
                        want += ad[(bi * 5 + k) * 7 + i] * ad[(bi * 5 + k) * 7 + j];
                    EXPECT(close64(ata[(bi * 7 + i) * 7 + j], want, 1e-14), "%s ata[%d,%d,%d]", who,
                           bi, i, j);
                    if (i % 2 || j % 2) continue;
                    for (int k = 0; k < 5; k++)
                        ws += ad[(bi * 5 + k) * 7 + i] * ad[(bi * 5 + k) * 7 + j];
                    EXPECT(close64(sls[(bi * 4 + i / 2) * 4 + j / 2], ws, 1e-14),
                           "%s sls[%d,%d,%d]", who, bi, i / 2, j / 2);
                }
        for (int bi = 0; bi < 3; bi++)
            for (int i = 0; i < 5; i++) {
                double wv = 0;
                for (int k = 0; k < 7; k++) wv += ad[(bi * 5 + i) * 7 + k] * vd[k];
                EXPECT(close64(av[bi * 5 + i], wv, 1e-14), "%s av[%d,%d]", who, bi, i);
                for (int j = 0; j < 4; j++) {
                    double want = 0, mag = 0; /* sums that cancel: bound by the terms */
                    for (int k = 0; k < 7; k++) {
                        want += ad[(bi * 5 + i) * 7 + k] * bf[k * 4 + j];
                        mag += fabs(ad[(bi * 5 + i) * 7 + k] * bf[k * 4 + j]);
                    }
                    EXPECT(fabs(ab[(bi * 5 + i) * 4 + j] - want) <= 1e-15 * mag,
                           "%s ab[%d,%d,%d] %.17g vs %.17g", who, bi, i, j,
                           ab[(bi * 5 + i) * 4 + j], want);
                }
            }
    }
    const char *code = strstr(kiln_program_source(p), "===== kernels");
    CHECK(code);
    int calls = 0;
    for (const char *c = code; (c = strstr(c, "rt->mm64(")); c++) calls++;
    EXPECT(calls == 4, "%d dgemm calls, expected 4", calls);
    for (int i = 0; i < 4; i++) kiln_tensor_free(&got[i]), kiln_tensor_free(&ref[i]);
    kiln_program_free(p);
    kiln_graph_free(g);
}

/* A gather of f64 data (the library copies each double as two floats),
 * from a transposed view and along the last dim, then f64 math on it. */
TEST(f64_gather) {
    test_use_shared_cache();
    kiln_graph *g = kiln_graph_new();
    int64_t sx[2] = {5, 6}, si[2] = {2, 3};
    kiln_value x = kiln_input(g, "x", KILN_F64, 2, sx);
    kiln_value ix = kiln_input(g, "ix", KILN_F32, 2, si);
    kiln_value t = kiln_gather(g, kiln_transpose(g, x, 0, 1), ix, 0); /* [2, 3, 5] */
    kiln_value l = kiln_gather(g, x, ix, 1);                          /* [5, 2, 3] */
    kiln_output(g, kiln_binary(g, "add", t, kiln_scalar(g, 1e-12)), "t");
    kiln_output(g, l, "l");
    CHECKF(kiln_error(g)[0] == 0, "build: %s", kiln_error(g));
    CHECK(kiln_value_dtype(g, l) == KILN_F64);
    double xd[30];
    float id[6] = {0, 5, -1, 2, 3, -6};
    for (int i = 0; i < 30; i++) xd[i] = 1.0 + 1e-13 * i;
    kiln_tensor in[2] = {kiln_input_desc(g, 0), kiln_input_desc(g, 1)}, got[2], ref[2];
    in[0].data = xd, in[1].data = id;
    if (!run_both(g, in, got, ref, NULL)) {
        kiln_graph_free(g);
        return;
    }
    for (int w = 0; w < 2; w++) {
        const kiln_tensor *o = w ? ref : got;
        const char *who = w ? "interpreted" : "compiled";
        const double *tv = o[0].data, *lv = o[1].data;
        for (int j = 0; j < 6; j++) {
            int c = (int)id[j] < 0 ? (int)id[j] + 6 : (int)id[j];
            for (int r = 0; r < 5; r++) {
                EXPECT(tv[j * 5 + r] == xd[r * 6 + c] + 1e-12, "%s t[%d,%d]", who, j, r);
                EXPECT(lv[r * 6 + j] == xd[r * 6 + c], "%s l[%d,%d] %.17g vs %.17g", who, r, j,
                       lv[r * 6 + j], xd[r * 6 + c]);
            }
        }
    }
    for (int i = 0; i < 2; i++) kiln_tensor_free(&got[i]), kiln_tensor_free(&ref[i]);
    kiln_graph_free(g);
}
