/*
 * test_vecmath.c -- src/codegen/vecmath.h against libm.
 *
 * Each function is swept over every STRIDE-th float bit pattern (all signs,
 * denormals, infinities and NaNs included; STRIDE is odd so the low mantissa
 * bits vary) plus a list of special values, and compared with the double
 * libm function: the error is |got - ref| in units of the float ulp at ref
 * (a correctly rounded result scores <= 0.5). The sweep calls the function
 * through an array loop, so a vectorizing build tests the SIMD code.
 *
 * The same file builds as a standalone program (-DVECMATH_STANDALONE):
 * tests/vectorize_check.sh compiles it with -O3 -march=native, where the
 * loops are vectorized and fmaf is a real FMA, and runs the same sweep.
 *
 * STRIDE is 509 here and 1021 in vectorize_check.sh, to keep the suite
 * quick (a few seconds, also under ASan); KILN_VECMATH_STRIDE overrides it:
 * 61 takes about a minute, 1 (all 2^32 floats) about an hour per build.
 */
#include "test.h"
#include "codegen/vecmath.h"
#include <float.h>
#include <stdint.h>
#include <sys/wait.h>

#define CHUNK 4096

typedef void (*array_fn)(const float *x, float *y, int n);

#define ARRAY_FN(f)                                                          \
    static void arr_##f(const float *restrict x, float *restrict y, int n) { \
        for (int i = 0; i < n; i++) y[i] = f(x[i]);                          \
    }
ARRAY_FN(kiln_expf)
ARRAY_FN(kiln_logf)
ARRAY_FN(kiln_sinf)
ARRAY_FN(kiln_cosf)
ARRAY_FN(kiln_tanhf)
ARRAY_FN(kiln_erff)
ARRAY_FN(kiln_sigmoidf)
ARRAY_FN(kiln_sigmoid)
ARRAY_FN(kiln_gelu)

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* One function under test and its bound over the whole float range. */
typedef struct {
    const char *name;
    array_fn fn;
    double (*ref)(double);
    double max_ulp;
} Case;

static const Case cases[] = {
    {"kiln_expf", arr_kiln_expf, exp, 1.5},
    {"kiln_logf", arr_kiln_logf, log, 1.0},
    {"kiln_sinf", arr_kiln_sinf, sin, 2.0},
    {"kiln_cosf", arr_kiln_cosf, cos, 2.0},
    {"kiln_tanhf", arr_kiln_tanhf, tanh, 2.0},
    {"kiln_erff", arr_kiln_erff, erf, 2.0},
    {"kiln_sigmoidf", arr_kiln_sigmoidf, ref_sigmoid, 1.5},
    /* what generated code calls: the vector variants where they exist */
    {"kiln_sigmoid", arr_kiln_sigmoid, ref_sigmoid, 1.5},
};

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The float ulp at |r|: 2^(e-24) for r in [2^(e-1), 2^e), at least the
 * denormal spacing 2^-149, at most that of FLT_MAX. */
static double float_ulp(double r) {
    int e;
    frexp(fabs(r), &e);
    if (e - 24 < -149) e = -149 + 24;
    if (e > 128) e = 128;
    return ldexp(1.0, e - 24);
}

/* Error of got against the exact ref in float ulps. A float infinity counts
 * as 2^128 (the value after FLT_MAX) when ref is finite. */
static double ulp_error(float got, double ref) {
    if (isnan(ref)) return isnan(got) ? 0.0 : INFINITY;
    if (isnan(got)) return INFINITY;
    if (isinf(ref)) return (double)got == ref ? 0.0 : INFINITY;
    if (fabs(ref) > 0x1p128) ref = copysign(0x1p128, ref); /* float: inf */
    double g = isinf(got) ? copysign(0x1p128, got) : got;
    return fabs(g - ref) / float_ulp(ref);
}

typedef struct {
    double worst;  /* largest ulp error seen */
    float worst_x; /* where */
    long count;
} Stats;

static void check_chunk(const Case *c, const float *x, int n, Stats *st) {
    float y[CHUNK];
    c->fn(x, y, n);
    for (int i = 0; i < n; i++) {
        st->count++;
        double e = ulp_error(y[i], c->ref((double)x[i]));
        if (e > st->worst || (isnan(e) && !isnan(st->worst))) {
            st->worst = e;
            st->worst_x = x[i];
        }
    }
}

static const float specials[] = {
    0.0f,
    -0.0f,
    0.5f,
    -0.5f,
    1.5f,
    -1.5f,
    2.5f,
    -2.5f,
    0.7f,
    -0.7f,
    8388607.0f,
    -8388607.0f,
    8388608.0f,
    -8388608.0f,
    4194303.5f,
    -4194303.5f,
    INFINITY,
    -INFINITY,
    NAN,
    -NAN,
    FLT_MIN,
    -FLT_MIN,
    FLT_TRUE_MIN,
    -FLT_TRUE_MIN,
    FLT_MAX,
    -FLT_MAX,
    1.0f,
    -1.0f,
    0.5f,
    88.72283935546875f,
    88.7228394f,
    88.72284f,
    89.0f,
    -87.33654f,
    -103.97207f,
    -103.972084f,
    -103.97283935546875f,
    -104.0f,
    0.625f,
    -0.625f,
    1.0f,
    3.9193f,
    4.0f,
    1e-20f,
    1e-40f,
    3.14159265f,
    1.57079633f,
    6.28318531f,
    1e5f,
    -1e5f,
    16777215.0f,
    0x1p-126f,
    0x1.fffffep-127f,
    0.70710677f,
    0.70710683f,
    1.4142135f,
    1.4142137f,
};

static long stride_from_env(long dflt) {
    const char *s = getenv("KILN_VECMATH_STRIDE");
    long v = s ? atol(s) : 0;
    return v > 0 ? v : dflt;
}

/* Sweep one case and report: "vecmath: kiln_expf max 0.93 ulp at x=...". */
static void sweep(const Case *c) {
    static float x[CHUNK];
    Stats st = {0, 0, 0};
    long stride = stride_from_env(509);
    int n = 0;
    check_chunk(c, specials, (int)(sizeof specials / sizeof specials[0]), &st);
    for (uint64_t u = 0; u <= 0xffffffffu; u += (uint64_t)stride) {
        x[n++] = from_bits((uint32_t)u);
        if (n == CHUNK) {
            check_chunk(c, x, n, &st);
            n = 0;
        }
    }
    if (n) check_chunk(c, x, n, &st);
    printf("vecmath: %-14s max %.3f ulp at x=%a (%ld values, stride %ld)\n", c->name, st.worst,
           (double)st.worst_x, st.count, stride);
    EXPECT(st.worst <= c->max_ulp, "%s: %.3f ulp at x=%a exceeds %.1f", c->name, st.worst,
           (double)st.worst_x, c->max_ulp);
}

TEST(vecmath_expf) { sweep(&cases[0]); }
TEST(vecmath_logf) { sweep(&cases[1]); }
TEST(vecmath_sinf) { sweep(&cases[2]); }
TEST(vecmath_cosf) { sweep(&cases[3]); }
TEST(vecmath_tanhf) { sweep(&cases[4]); }
TEST(vecmath_erff) { sweep(&cases[5]); }
TEST(vecmath_sigmoidf) { sweep(&cases[6]); }
TEST(vecmath_sigmoid) { sweep(&cases[7]); }

/* gelu(x) = x Phi(x) in double, by erfc (no cancellation for x < 0); at
 * -inf that is -inf times 0, NaN, as torch gives. */
static double ref_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }

/* kiln_gelu over x[0..n): within 2 ulp for x >= 0; for x < 0, where the
 * result is in [-0.17, 0] and the erf form (torch's float formula too)
 * cancels, within 2^-23 absolute (docs/tolerances.md). */
static void check_gelu(const float *x, int n, double *worst_ulp, double *worst_abs) {
    float y[CHUNK];
    arr_kiln_gelu(x, y, n);
    for (int i = 0; i < n; i++) {
        double r = ref_gelu((double)x[i]);
        if (x[i] < 0.0f) {
            double e = isnan(r) && isnan(y[i]) ? 0.0 : fabs((double)y[i] - r);
            EXPECT(e <= 0x1p-23, "kiln_gelu(%a) = %a, want %a (abs %.3g)", x[i], y[i], r, e);
            if (e > *worst_abs) *worst_abs = e;
        } else {
            double e = ulp_error(y[i], r);
            EXPECT(e <= 2.0, "kiln_gelu(%a) = %a, want %a (%.2f ulp)", x[i], y[i], r, e);
            if (e > *worst_ulp) *worst_ulp = e;
        }
    }
}

static int is_neg_zero(float f) { return f == 0.0f && signbit(f); }

TEST(vecmath_gelu) {
    static float x[CHUNK];
    long stride = stride_from_env(509);
    int n = 0;
    double worst_ulp = 0, worst_abs = 0;
    check_gelu(specials, (int)(sizeof specials / sizeof specials[0]), &worst_ulp, &worst_abs);
    for (uint64_t u = 0; u <= 0xffffffffu; u += (uint64_t)stride) {
        x[n++] = from_bits((uint32_t)u);
        if (n == CHUNK) {
            check_gelu(x, n, &worst_ulp, &worst_abs);
            n = 0;
        }
    }
    if (n) check_gelu(x, n, &worst_ulp, &worst_abs);
    printf("vecmath: kiln_gelu      max %.3f ulp (x >= 0), abs %.3g (x < 0), stride %ld\n",
           worst_ulp, worst_abs, stride);
    CHECK(is_neg_zero(kiln_gelu(-0.0f)) && is_neg_zero(kiln_gelu(-6.0f)));
    CHECK(kiln_gelu(INFINITY) == INFINITY && isnan(kiln_gelu(-INFINITY))); /* as torch */
    CHECK(kiln_gelu(6.0f) == 6.0f && isnan(kiln_gelu(NAN)) && isnan(kiln_gelu(-NAN)));
}

/* floor and ceil must match libm bit for bit (signed zeros included). */
static void sweep_exact(const char *name, float (*f)(float), float (*ref)(float)) {
    long stride = stride_from_env(509), bad = 0;
    uint64_t u = 0;
    for (; u <= 0xffffffffu; u += (uint64_t)stride) {
        float x = from_bits((uint32_t)u), y = f(x), r = ref(x);
        if (isnan(r) ? !isnan(y) : memcmp(&y, &r, sizeof y) != 0) {
            if (bad++ < 5) test_failf(__FILE__, __LINE__, "%s(%a) = %a, libm %a", name, x, y, r);
        }
    }
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        float x = specials[i], y = f(x), r = ref(x);
        EXPECT(isnan(r) ? isnan(y) : memcmp(&y, &r, sizeof y) == 0, "%s(%a) = %a, libm %a", name, x,
               y, r);
    }
    EXPECT(bad == 0, "%s: %ld mismatches", name, bad);
}

static float floor_fn(float x) { return kiln_floorf(x); }
static float ceil_fn(float x) { return kiln_ceilf(x); }

TEST(vecmath_floor_ceil_exact) {
    sweep_exact("kiln_floorf", floor_fn, floorf);
    sweep_exact("kiln_ceilf", ceil_fn, ceilf);
    CHECK(signbit(kiln_ceilf(-0.7f)) && signbit(kiln_floorf(-0.0f)));
}

/* Exact results the sweep cannot see as errors: signed zeros, limits. */
TEST(vecmath_special_values) {
    CHECK(is_neg_zero(kiln_sinf(-0.0f)));
    CHECK(is_neg_zero(kiln_tanhf(-0.0f)));
    CHECK(is_neg_zero(kiln_erff(-0.0f)));
    CHECK(kiln_expf(0.0f) == 1.0f && kiln_logf(1.0f) == 0.0f);
    CHECK(kiln_expf(-INFINITY) == 0.0f && kiln_expf(INFINITY) == INFINITY);
    CHECK(kiln_logf(0.0f) == -INFINITY && kiln_logf(-0.0f) == -INFINITY);
    CHECK(isnan(kiln_logf(-1.0f)) && kiln_logf(INFINITY) == INFINITY);
    CHECK(isnan(kiln_sinf(INFINITY)) && isnan(kiln_cosf(-INFINITY)));
    CHECK(kiln_tanhf(INFINITY) == 1.0f && kiln_tanhf(-INFINITY) == -1.0f);
    CHECK(kiln_erff(INFINITY) == 1.0f && kiln_erff(-INFINITY) == -1.0f);
    CHECK(kiln_sigmoid(INFINITY) == 1.0f && kiln_sigmoid(-INFINITY) == 0.0f);
    CHECK(kiln_sigmoid(-100.0f) > 0.0f); /* a denormal, not 0 */
}

TEST(vecmath_relu_max_min) {
    CHECK(kiln_relu(-2.0f) == 0.0f && kiln_relu(3.0f) == 3.0f);
    CHECK(isnan(kiln_relu(NAN)));
    CHECK(kiln_max(1.0f, 2.0f) == 2.0f && kiln_max(2.0f, 1.0f) == 2.0f);
    CHECK(kiln_min(1.0f, 2.0f) == 1.0f && kiln_min(2.0f, 1.0f) == 1.0f);
    CHECK(isnan(kiln_max(NAN, 1.0f)) && isnan(kiln_max(1.0f, NAN)));
    CHECK(isnan(kiln_min(NAN, 1.0f)) && isnan(kiln_min(1.0f, NAN)));
    CHECK(kiln_max(-INFINITY, 0.0f) == 0.0f && kiln_min(INFINITY, 0.0f) == 0.0f);
    /* bit for bit the definition, (a > b) | isnan(a) ? a : b (and < for
     * min), on every pair of signed zeros, infinities, denormals, NaNs of
     * two payloads and signs, and ordinary values: ties give b, a NaN its
     * own payload */
    static const uint32_t bits[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                    0x00000001u, 0x80000001u, 0x7fc00000u, 0xffc00001u,
                                    0x7f800001u, 0x3f800000u, 0xbf800000u, 0x7f7fffffu};
    enum { NB = sizeof bits / sizeof bits[0] };
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < NB; j++) {
            float a, b, mx, mn, wmx, wmn;
            uint32_t gx, gn;
            memcpy(&a, &bits[i], 4), memcpy(&b, &bits[j], 4);
            mx = kiln_max(a, b), mn = kiln_min(a, b);
            wmx = (a > b) || isnan(a) ? a : b;
            wmn = (a < b) || isnan(a) ? a : b;
            memcpy(&gx, &mx, 4), memcpy(&gn, &mn, 4);
            EXPECT(!memcmp(&mx, &wmx, 4) && !memcmp(&mn, &wmn, 4),
                   "max/min of 0x%08x, 0x%08x: 0x%08x 0x%08x", bits[i], bits[j], gx, gn);
        }
}

TEST(vecmath_compare_where) {
    CHECK(kiln_lt(1, 2) == 1 && kiln_lt(2, 1) == 0 && kiln_lt(NAN, 1) == 0);
    CHECK(kiln_le(2, 2) == 1 && kiln_gt(3, 2) == 1 && kiln_ge(2, 3) == 0);
    CHECK(kiln_eq(2, 2) == 1 && kiln_ne(2, 2) == 0 && kiln_ne(NAN, NAN) == 1);
    CHECK(kiln_not(0.0f) == 1 && kiln_not(-0.0f) == 1 && kiln_not(3) == 0);
    CHECK(kiln_wheref(1, 5, 6) == 5 && kiln_wheref(0, 5, 6) == 6 && kiln_wheref(NAN, 5, 6) == 5);
    CHECK(isnan(kiln_wheref(0, 5, NAN)));
}

/* The floats closest to a multiple of pi/2 in each binade from 1 to 4096
 * (|x - j pi/2| down to 2^-28, found by a sweep in double), where the
 * fast float reduction of sin and cos (|x| < 4096 with FMA, see vecmath.h)
 * needs all its precision. */
static const float near_half_pi[] = {
    0x1.921fb6p+0f,  0x1.921fb6p+1f, 0x1.2d97c8p+2f, 0x1.2d97c8p+3f, 0x1.2d97c8p+4f,
    0x1.2d97c8p+5f,  0x1.2d97c8p+6f, 0x1.f9cbe2p+7f, 0x1.f9cbe2p+8f, 0x1.f9cbe2p+9f,
    0x1.f9cbe2p+10f, 0x1.17cc5p+11f, 4096.0f, /* the end of the fast path: both paths in one vector */
};

/* Every float within 2048 ulps of each hard case, both signs. */
static void sweep_near(const Case *c) {
    static float x[CHUNK];
    Stats st = {0, 0, 0};
    for (size_t k = 0; k < sizeof near_half_pi / sizeof near_half_pi[0]; k++) {
        uint32_t mid;
        memcpy(&mid, &near_half_pi[k], sizeof mid);
        for (int sign = 0; sign < 2; sign++) {
            for (int i = 0; i < CHUNK; i++)
                x[i] = from_bits((mid - CHUNK / 2 + (uint32_t)i) | (uint32_t)sign << 31);
            check_chunk(c, x, CHUNK, &st);
        }
    }
    printf("vecmath: %-14s max %.3f ulp at x=%a near multiples of pi/2\n", c->name, st.worst,
           (double)st.worst_x);
    EXPECT(st.worst <= c->max_ulp, "%s: %.3f ulp at x=%a exceeds %.1f", c->name, st.worst,
           (double)st.worst_x, c->max_ulp);
}

TEST(vecmath_trig_near_multiples) {
    sweep_near(&cases[2]);
    sweep_near(&cases[3]);
}

/* A value's result must not depend on its neighbours: with dispatch per
 * vector, a large |x| in a vector sends the whole vector down the slow
 * path, which must give the small values the same bits. */
TEST(vecmath_trig_same_with_big_neighbours) {
    static float x[CHUNK], y1[CHUNK], y2[CHUNK], c1[CHUNK], c2[CHUNK];
    long diff = 0;
    for (int i = 0; i < CHUNK; i++) x[i] = (float)(i - CHUNK / 2) * 0.37f + 0.001f * (float)(i % 7);
    arr_kiln_sinf(x, y1, CHUNK);
    arr_kiln_cosf(x, c1, CHUNK);
    for (int i = 0; i < CHUNK; i += 5) x[i] = 1e30f;
    arr_kiln_sinf(x, y2, CHUNK);
    arr_kiln_cosf(x, c2, CHUNK);
    for (int i = 0; i < CHUNK; i++)
        if (i % 5 && (memcmp(&y1[i], &y2[i], sizeof y1[i]) || memcmp(&c1[i], &c2[i], sizeof c1[i])))
            diff++;
    EXPECT(diff == 0, "%ld results changed with a large value in the same vector", diff);
}

/* The vector variants (KILN_VM_EXP_DISPATCH, KILN_VM_GELU_DISPATCH,
 * KILN_VM_SIGMOID_DISPATCH; sin
 * and cos under KILN_VM_TRIG_DISPATCH, written in vector operations: 16
 * lanes with AVX-512, 8 with AVX2 and FMA, 4 with SSE4.1) against the C
 * functions bit for bit (any NaN matches any NaN). In a vectorizing build
 * the array loops (arr_kiln_expf, ...) run the widest variant (e at
 * x86-64-v4 with -mprefer-vector-width=512 and in the native AVX-512 build
 * of vectorize_check.sh, d at v3, b at v2; the 4-lane one on a
 * remainder), and the simdlen 8 and 4 loops the d and b ones (b twice at
 * v2), while the C function is called one value at a time through a
 * volatile pointer, so it stays scalar C code. Values: the specials, every
 * STRIDE-th float, and every float in the ranges given (exp: where 2^n is
 * a denormal or overflows, and n = -1; sin, cos: around 0, the fast
 * path's limit 4096 and the v2 quick path's 2^24; gelu: around 0 and
 * 5.5; sigmoid: where e^-|x| turns denormal and underflows, around 0, and
 * around 0.3466, where n = round(-|x| log2 e) steps from 0 to -1). Elsewhere both sides are the C function and only the specials
 * run. */
static float exp_c(float x) { return kiln_vm_expf(x); }
static float sin_c(float x) { return kiln_vm_sinf(x); }
static float cos_c(float x) { return kiln_vm_cosf(x); }
static float gelu_c(float x) { return kiln_vm_gelu(x); }
static float sigmoid_c(float x) { return kiln_sigmoidf(x); }

#define NARROW_FNS(f)                                                              \
    static void arr8_##f(const float *restrict x, float *restrict y, int n) {      \
        _Pragma("omp simd simdlen(8)") for (int i = 0; i < n; i++) y[i] = f(x[i]); \
    }                                                                              \
    static void arr4_##f(const float *restrict x, float *restrict y, int n) {      \
        _Pragma("omp simd simdlen(4)") for (int i = 0; i < n; i++) y[i] = f(x[i]); \
    }
NARROW_FNS(kiln_expf)
NARROW_FNS(kiln_sinf)
NARROW_FNS(kiln_cosf)
NARROW_FNS(kiln_gelu)
NARROW_FNS(kiln_sigmoid)

typedef struct {
    const char *name;
    array_fn lanes[3]; /* the default loop, simdlen 8 and 4 */
    float (*c)(float);
    float ranges[3][2];
} SameBits;

static long same_bits_chunk(const SameBits *t, const float *x, int n) {
    static const char *const loop[3] = {"the default loop", "simdlen 8", "simdlen 4"};
    static float y[3][CHUNK];
    float (*volatile scalar)(float) = t->c;
    long diff = 0;
    for (int v = 0; v < 3; v++) t->lanes[v](x, y[v], n);
    for (int i = 0; i < n; i++) {
        float r = scalar(x[i]);
        for (int v = 0; v < 3; v++)
            if (memcmp(&r, &y[v][i], sizeof r) && !(isnan(r) && isnan(y[v][i])) && diff++ < 5)
                EXPECT(0, "%s(%a) = %a in %s, the C function gives %a", t->name, (double)x[i],
                       (double)y[v][i], loop[v], (double)r);
    }
    return diff;
}

static void same_bits(const SameBits *t, int dispatch) {
    static float x[CHUNK];
    long stride = stride_from_env(509), diff = 0, count = 0;
    int n = 0;
    diff += same_bits_chunk(t, specials, (int)(sizeof specials / sizeof specials[0]));
    if (!dispatch) { /* both sides are the C function: the specials only */
        EXPECT(diff == 0, "%s: %ld values differ", t->name, diff);
        return;
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += (uint64_t)stride) {
        x[n++] = from_bits((uint32_t)u);
        count++;
        if (n == CHUNK) {
            diff += same_bits_chunk(t, x, n);
            n = 0;
        }
    }
    for (int k = 0; k < 3; k++)
        for (float v = t->ranges[k][0]; v <= t->ranges[k][1]; v = nextafterf(v, INFINITY)) {
            x[n++] = v;
            count++;
            if (n == CHUNK) {
                diff += same_bits_chunk(t, x, n);
                n = 0;
            }
        }
    if (n) diff += same_bits_chunk(t, x, n);
    printf("vecmath: %s vs the C function: %ld of %ld values differ (dispatch %d)\n", t->name, diff,
           count, dispatch);
    EXPECT(diff == 0, "%s: %ld values differ", t->name, diff);
}

TEST(vecmath_variants_same_bits) {
    static const SameBits t[] = {
        {"kiln_expf",
         {arr_kiln_expf, arr8_kiln_expf, arr4_kiln_expf},
         exp_c,
         {{-104.5f, -86.5f}, {88.0f, 89.5f}, {-0.75f, -0.625f}}},
        {"kiln_sinf",
         {arr_kiln_sinf, arr8_kiln_sinf, arr4_kiln_sinf},
         sin_c,
         {{-0x1p-146f, 0x1p-146f}, {4000.0f, 4200.0f}, {16700000.0f, 16850000.0f}}},
        {"kiln_cosf",
         {arr_kiln_cosf, arr8_kiln_cosf, arr4_kiln_cosf},
         cos_c,
         {{-0x1p-146f, 0x1p-146f}, {-4200.0f, -4000.0f}, {-16850000.0f, -16700000.0f}}},
        {"kiln_gelu",
         {arr_kiln_gelu, arr8_kiln_gelu, arr4_kiln_gelu},
         gelu_c,
         {{-6.0f, -5.0f}, {5.0f, 6.0f}, {-0x1p-140f, 0x1p-140f}}},
        {"kiln_sigmoid",
         {arr_kiln_sigmoid, arr8_kiln_sigmoid, arr4_kiln_sigmoid},
         sigmoid_c,
         {{-105.0f, -86.0f}, {-0x1p-130f, 0x1p-130f}, {0.34f, 0.36f}}},
    };
    same_bits(&t[0], KILN_VM_EXP_DISPATCH);
    same_bits(&t[1], KILN_VM_TRIG_DISPATCH);
    same_bits(&t[2], KILN_VM_TRIG_DISPATCH);
    same_bits(&t[3], KILN_VM_GELU_DISPATCH);
    same_bits(&t[4], KILN_VM_SIGMOID_DISPATCH);
}

#ifndef VECMATH_STANDALONE
#include "base/base.h"
#include "testutil.h"
/* Every function vectorizes under cc -O3 -march=native, with no libm call
 * left, and the vectorized FMA build passes the same sweep: see
 * tests/vectorize_check.sh (exit 77: no GCC, skipped). */
TEST(vecmath_vectorized) {
    char cmd[2048];
    int n = snprintf(cmd, sizeof cmd, "sh '%s/vectorize_check.sh' '%s/..' '%s/vecmath'",
                     test_srcdir(), test_srcdir(), test_tmpdir());
    /* every tier, run where this CPU can (target.c's flags, test_tier_flags) */
    for (int t = TGT_V2; t <= TGT_V4; t++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s|%s|%d'", tgt_name((TargetTier)t),
                      test_tier_flags(t), tgt_can_run((TargetTier)t, tgt_cpu_features()));
    int rc = system(cmd);
    CHECKF(rc != -1 && WIFEXITED(rc), "could not run %s", cmd);
    if (WEXITSTATUS(rc) == 77) {
        printf("vecmath: no GCC, vectorization check skipped\n");
        return;
    }
    CHECKF(WEXITSTATUS(rc) == 0, "%s exited with %d", cmd, WEXITSTATUS(rc));
}
#else
#include <stdarg.h>
/* A minimal runner for the standalone build (see the top of this file). */
#define MAX_TESTS 64
static struct {
    const char *name;
    test_fn fn;
} tests[MAX_TESTS];
static int ntests;
static const char *current;
int test_failed;

void test_register(const char *name, test_fn fn) {
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

void test_failf(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %s:%d: %s: ", file, line, current);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    test_failed = 1;
}

int main(void) {
    int failed = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < ntests; i++) {
        current = tests[i].name;
        test_failed = 0;
        tests[i].fn();
        printf("vecmath-native: %s %s\n", test_failed ? "FAIL" : "PASS", current);
        failed += test_failed;
    }
    return failed != 0;
}
#endif
