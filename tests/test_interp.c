/*
 * test_interp.c -- the reference interpreter against analytic answers.
 *
 * The interpreter is the oracle for everything else, so its own oracle must
 * be independent of it: every expected value here is written out by hand or
 * computed by a plain loop in the test itself (a broadcast add by nested
 * loops, a conv by its textbook 7-deep sum, a softmax from its formula).
 * Random ops are checked by their contract: values in [0, 1), mean near
 * 0.5, a function of (seed, index) only. The allocation test makes the n-th
 * allocation fail for n = 0, 1, 2, ... until the run succeeds, and checks
 * that each failure reports KILN_ERR_NOMEM and leaks nothing.
 */
#include "test.h"
#include "base/base.h" /* util_rand_uniform: the documented RAND stream */

/* ---- helpers --------------------------------------------------------------- */

static kiln_tensor tensor(kiln_dtype dt, int rank, const int64_t *shape, void *data) {
    kiln_tensor t = {.dtype = dt, .rank = rank, .data = data};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d];
    return t;
}

/* Element i of a result as a float (bool bytes as 0/1). */
static float at(const kiln_tensor *t, int64_t i) {
    if (t->dtype == KILN_BOOL) return ((const unsigned char *)t->data)[i] ? 1.0f : 0.0f;
    return ((const float *)t->data)[i];
}

static int same_shape(const kiln_tensor *t, int rank, const int64_t *shape) {
    if (t->rank != rank) return 0;
    for (int d = 0; d < rank; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

/* |got - want| <= tol * max(1, |want|) for every element; NaN matches NaN. */
static int close_to(const kiln_tensor *t, const float *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++) {
        double g = at(t, i), w = want[i];
        if ((isnan(w) && isnan(g)) || g == w) /* also inf == inf */
            continue;
        if (!(fabs(g - w) <= tol * fmax(1.0, fabs(w)))) {
            printf("  element %lld: got %.9g, want %.9g\n", (long long)i, g, w);
            return 0;
        }
    }
    return 1;
}

static void free_all(kiln_tensor *t, int n) {
    for (int i = 0; i < n; i++) kiln_tensor_free(&t[i]);
}

/* Interpret g; on failure print the graph's message. */
static kiln_status interp(kiln_graph *g, const kiln_tensor *in, kiln_tensor *out) {
    kiln_status st = kiln_interpret(g, in, out);
    if (st != KILN_OK) printf("  kiln_interpret: %s\n", kiln_error(g));
    return st;
}

/* ---- pointwise --------------------------------------------------------- */

TEST(interp_broadcast_add) {
    int64_t xs[3] = {2, 3, 4}, ys[2] = {3, 1};
    float x[24], y[3], want[24];
    for (int i = 0; i < 24; i++) x[i] = (float)i;
    for (int i = 0; i < 3; i++) y[i] = 100.0f * (float)(i + 1);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) want[(a * 3 + b) * 4 + c] = x[(a * 3 + b) * 4 + c] + y[b];
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 3, xs);
    kiln_value vy = kiln_input(g, "y", KILN_F32, 2, ys);
    CHECK(kiln_output(g, kiln_binary(g, "add", vx, vy), "z") == KILN_OK);
    kiln_tensor in[2] = {tensor(KILN_F32, 3, xs, x), tensor(KILN_F32, 2, ys, y)}, out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 3, xs), "shape");
    EXPECT(close_to(&out[0], want, 24, 0), "values");
    free_all(out, 1);
    kiln_graph_free(g);
}

/* Both operands broadcast at once: [3,1] op [1,4] -> [3,4]. */
static const char *binops[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",    "lt",
                               "le",  "gt",  "ge",  "eq",  "ne",  "fmod",    "true_divide"};

static double binop_ref(int op, double a, double b) {
    switch (op) {
    case 0: return (float)a + (float)b;
    case 1: return (float)a - (float)b;
    case 2: return (float)a * (float)b;
    case 3: return (float)a / (float)b;
    case 4: return pow(a, b);
    case 5: return a > b ? a : b;
    case 6: return a < b ? a : b;
    case 7: return a < b;
    case 8: return a <= b;
    case 9: return a > b;
    case 10: return a >= b;
    case 11: return a == b;
    case 12: return a != b;
    case 13: return fmod(a, b); /* exact: C's fmod of two floats is a float */
    default: return (float)a / (float)b;
    }
}

TEST(interp_binary_ops) {
    int64_t as[2] = {3, 1}, bs[2] = {1, 4}, os[2] = {3, 4};
    float a[3] = {0.5f, 2.0f, 3.25f}, b[4] = {2.0f, 0.5f, 3.25f, 1.5f};
    for (int op = 0; op < 15; op++) {
        kiln_graph *g = kiln_graph_new();
        kiln_value va = kiln_input(g, "a", KILN_F32, 2, as);
        kiln_value vb = kiln_input(g, "b", KILN_F32, 2, bs);
        CHECK(kiln_output(g, kiln_binary(g, binops[op], va, vb), "y") == KILN_OK);
        kiln_tensor in[2] = {tensor(KILN_F32, 2, as, a), tensor(KILN_F32, 2, bs, b)}, out[1];
        CHECK(interp(g, in, out) == KILN_OK);
        float want[12];
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) want[i * 4 + j] = (float)binop_ref(op, a[i], b[j]);
        EXPECT(same_shape(&out[0], 2, os), "%s: shape", binops[op]);
        EXPECT(out[0].dtype == (op >= 7 && op <= 12 ? KILN_BOOL : KILN_F32), "%s: dtype",
               binops[op]);
        EXPECT(close_to(&out[0], want, 12, op == 4 ? 1e-6 : 0), "%s: values", binops[op]);
        free_all(out, 1);
        kiln_graph_free(g);
    }
}

static const char *unops[] = {"neg",   "abs",  "relu",       "sigmoid",    "tanh", "exp",
                              "log",   "sqrt", "rsqrt",      "sin",        "cos",  "erf",
                              "floor", "ceil", "reciprocal", "contiguous", "gelu", "silu"};

static double unop_ref(int op, double x) {
    switch (op) {
    case 0: return -x;
    case 1: return fabs(x);
    case 2: return x > 0 ? x : 0;
    case 3: return 1 / (1 + exp(-x));
    case 4: return tanh(x);
    case 5: return exp(x);
    case 6: return log(x);
    case 7: return sqrt(x);
    case 8: return 1 / sqrt(x);
    case 9: return sin(x);
    case 10: return cos(x);
    case 11: return erf(x);
    case 12: return floor(x);
    case 13: return ceil(x);
    case 14: return 1 / x;
    case 15: return x;
    case 16: return 0.5 * x * (1 + erf(x / sqrt(2.0))); /* torch's exact gelu */
    default: return x / (1 + exp(-x));
    }
}

TEST(interp_unary_ops) {
    int64_t s[1] = {8};
    float x[8] = {-2.5f, -1.0f, -0.3f, 0.0f, 0.4f, 1.0f, 2.7f, 7.5f};
    float pos[8] = {0.01f, 0.25f, 0.5f, 1.0f, 2.0f, 3.5f, 10.0f, 1e4f};
    for (int op = 0; op < 18; op++) {
        int positive = op >= 6 && op <= 8; /* log, sqrt, rsqrt */
        float *data = positive ? pos : x, want[8];
        kiln_graph *g = kiln_graph_new();
        kiln_value v = kiln_input(g, "x", KILN_F32, 1, s);
        CHECK(kiln_output(g, kiln_unary(g, unops[op], v), "y") == KILN_OK);
        kiln_tensor in[1] = {tensor(KILN_F32, 1, s, data)}, out[1];
        CHECK(interp(g, in, out) == KILN_OK);
        for (int i = 0; i < 8; i++) want[i] = (float)unop_ref(op, data[i]);
        /* primitives round once; gelu and silu are several float ops */
        EXPECT(close_to(&out[0], want, 8, op >= 16 ? 1e-6 : 2e-7), "%s: values", unops[op]);
        free_all(out, 1);
        kiln_graph_free(g);
    }
}

TEST(interp_where_and_bools) {
    int64_t s[1] = {5};
    float x[5] = {-2, -1, 0, 1, 2}, y[5] = {10, 20, 30, 40, 50};
    unsigned char m[5] = {1, 0, 1, 0, 1};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    kiln_value vy = kiln_input(g, "y", KILN_F32, 1, s);
    kiln_value vm = kiln_input(g, "m", KILN_BOOL, 1, s);
    kiln_value pos = kiln_binary(g, "gt", vx, kiln_scalar(g, 0));
    kiln_value w = kiln_where(g, pos, vx, vy);
    kiln_value nm = kiln_unary(g, "logical_not", vm);
    kiln_value both = kiln_where(g, nm, pos, vm); /* bool where bool: stays bool */
    CHECK(kiln_output(g, w, "w") == KILN_OK);
    CHECK(kiln_output(g, nm, "nm") == KILN_OK);
    CHECK(kiln_output(g, both, "both") == KILN_OK);
    CHECK(kiln_output(g, kiln_binary(g, "mul", vm, vy), "my") == KILN_OK);
    kiln_tensor in[3] = {tensor(KILN_F32, 1, s, x), tensor(KILN_F32, 1, s, y),
                         tensor(KILN_BOOL, 1, s, m)},
                out[4];
    CHECK(interp(g, in, out) == KILN_OK);
    float w_want[5] = {10, 20, 30, 1, 2}, nm_want[5] = {0, 1, 0, 1, 0};
    float both_want[5] = {1, 0, 1, 1, 1}, my_want[5] = {10, 0, 30, 0, 50};
    EXPECT(close_to(&out[0], w_want, 5, 0), "where");
    EXPECT(out[1].dtype == KILN_BOOL && close_to(&out[1], nm_want, 5, 0), "logical_not");
    EXPECT(out[2].dtype == KILN_BOOL && close_to(&out[2], both_want, 5, 0), "bool where");
    EXPECT(out[3].dtype == KILN_F32 && close_to(&out[3], my_want, 5, 0), "bool * f32");
    for (int i = 0; i < 5; i++)
        EXPECT(((unsigned char *)out[1].data)[i] <= 1, "bool bytes are 0 or 1");
    free_all(out, 4);
    kiln_graph_free(g);
}

/* NaN propagates through maximum, minimum and amax, as in torch. */
TEST(interp_nan_propagates) {
    int64_t s[1] = {3};
    float x[3] = {1.0f, NAN, -1.0f}, z[3] = {0, 0, 0};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    kiln_value vz = kiln_input(g, "z", KILN_F32, 1, s);
    CHECK(kiln_output(g, kiln_binary(g, "maximum", vx, vz), "mx") == KILN_OK);
    CHECK(kiln_output(g, kiln_binary(g, "minimum", vz, vx), "mn") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "amax", vx, 0, NULL, 0), "am") == KILN_OK);
    kiln_tensor in[2] = {tensor(KILN_F32, 1, s, x), tensor(KILN_F32, 1, s, z)}, out[3];
    CHECK(interp(g, in, out) == KILN_OK);
    float mx[3] = {1, NAN, 0}, mn[3] = {0, NAN, -1}, am[1] = {NAN};
    EXPECT(close_to(&out[0], mx, 3, 0), "maximum");
    EXPECT(close_to(&out[1], mn, 3, 0), "minimum");
    EXPECT(out[2].rank == 0 && close_to(&out[2], am, 1, 0), "amax");
    free_all(out, 3);
    kiln_graph_free(g);
}

/* ---- scalars and rank 6 -------------------------------------------------- */

TEST(interp_rank0) {
    float x = 3.0f;
    int64_t none[1] = {0}; /* rank 0: the shape is not read */
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 0, none);
    kiln_value y = kiln_binary(g, "mul", vx, kiln_scalar(g, 2.5));
    CHECK(kiln_output(g, y, "y") == KILN_OK);
    CHECK(kiln_output(g, kiln_scalar(g, -4), "c") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "sum", y, 0, NULL, 1), "s") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 0, none, &x)}, out[3];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(out[0].rank == 0 && at(&out[0], 0) == 7.5f, "x * 2.5");
    EXPECT(out[1].rank == 0 && at(&out[1], 0) == -4.0f, "constant");
    EXPECT(out[2].rank == 0 && at(&out[2], 0) == 7.5f, "sum of a scalar");
    free_all(out, 3);
    kiln_graph_free(g);
}

/* A rank-6 add where both sides broadcast, then a rank-6 permute, against
 * index arithmetic written out for these shapes. */
TEST(interp_rank6) {
    enum { NX = 24, NY = 24, NO = 288 };
    int64_t xs[6] = {2, 1, 3, 1, 2, 2}, ys[5] = {4, 1, 3, 2, 1}, os[6] = {2, 4, 3, 3, 2, 2};
    int perm[6] = {5, 3, 0, 4, 2, 1};
    float x[NX], y[NY], sum[NO], want[NO];
    for (int i = 0; i < NX; i++) x[i] = (float)i;
    for (int i = 0; i < NY; i++) y[i] = 1000.0f * (float)(i + 1);
    for (int64_t i = 0; i < NO; i++) {
        int64_t r = i, o[6];
        for (int d = 5; d >= 0; d--) {
            o[d] = r % os[d];
            r /= os[d];
        }
        int64_t xi = ((o[0] * 3 + o[2]) * 2 + o[4]) * 2 + o[5]; /* x: [2,1,3,1,2,2] */
        int64_t yi = (o[1] * 3 + o[3]) * 2 + o[4];              /* y: [4,1,3,2,1] */
        sum[i] = x[xi] + y[yi];
    }
    int64_t ps[6];
    for (int d = 0; d < 6; d++) ps[d] = os[perm[d]];
    for (int64_t i = 0; i < NO; i++) { /* permuted dim d is sum's dim perm[d] */
        int64_t r = i, src[6], k = 0;
        for (int d = 5; d >= 0; d--) {
            src[perm[d]] = r % ps[d];
            r /= ps[d];
        }
        for (int d = 0; d < 6; d++) k = k * os[d] + src[d];
        want[i] = sum[k];
    }
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 6, xs);
    kiln_value vy = kiln_input(g, "y", KILN_F32, 5, ys);
    kiln_value s = kiln_binary(g, "add", vx, vy);
    CHECK(kiln_output(g, s, "s") == KILN_OK);
    CHECK(kiln_output(g, kiln_permute(g, s, 6, perm), "p") == KILN_OK);
    kiln_tensor in[2] = {tensor(KILN_F32, 6, xs, x), tensor(KILN_F32, 5, ys, y)}, out[2];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 6, os) && close_to(&out[0], sum, NO, 0), "rank-6 add");
    EXPECT(same_shape(&out[1], 6, ps) && close_to(&out[1], want, NO, 0), "rank-6 permute");
    free_all(out, 2);
    kiln_graph_free(g);
}

/* ---- views ---------------------------------------------------------------- */

TEST(interp_transpose_2x2) {
    int64_t s[2] = {2, 2};
    float x[4] = {1, 2, 3, 4}, want[4] = {1, 3, 2, 4};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_transpose(g, vx, 0, -1), "t") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, s, x)}, out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(close_to(&out[0], want, 4, 0), "transpose");
    free_all(out, 1);
    kiln_graph_free(g);
}

TEST(interp_slice_step) {
    int64_t s1[1] = {10}, s2[2] = {3, 5};
    float x[10], m[15];
    for (int i = 0; i < 10; i++) x[i] = (float)i;
    for (int i = 0; i < 15; i++) m[i] = (float)i;
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s1);
    kiln_value vm = kiln_input(g, "m", KILN_F32, 2, s2);
    CHECK(kiln_output(g, kiln_slice(g, vx, 0, 1, 9, 3), "a") == KILN_OK);    /* 1 4 7 */
    CHECK(kiln_output(g, kiln_slice(g, vx, 0, -3, 100, 1), "b") == KILN_OK); /* 7 8 9 */
    CHECK(kiln_output(g, kiln_slice(g, vm, -1, 1, 5, 2), "c") == KILN_OK);   /* cols 1, 3 */
    kiln_value rows = kiln_slice(g, vm, 0, 0, 3, 2);                         /* rows 0, 2 */
    CHECK(kiln_output(g, kiln_slice(g, rows, 1, 4, 5, 1), "d") == KILN_OK);  /* col 4 */
    kiln_tensor in[2] = {tensor(KILN_F32, 1, s1, x), tensor(KILN_F32, 2, s2, m)}, out[4];
    CHECK(interp(g, in, out) == KILN_OK);
    float a[3] = {1, 4, 7}, b[3] = {7, 8, 9}, c[6] = {1, 3, 6, 8, 11, 13}, d[2] = {4, 14};
    int64_t cs[2] = {3, 2}, ds[2] = {2, 1};
    EXPECT(out[0].shape[0] == 3 && close_to(&out[0], a, 3, 0), "step 3");
    EXPECT(out[1].shape[0] == 3 && close_to(&out[1], b, 3, 0), "negative start");
    EXPECT(same_shape(&out[2], 2, cs) && close_to(&out[2], c, 6, 0), "inner dim step 2");
    EXPECT(same_shape(&out[3], 2, ds) && close_to(&out[3], d, 2, 0), "slice of a slice");
    free_all(out, 4);
    kiln_graph_free(g);
}

/* reshape(transpose(x)) reads the transposed values in C order, with or
 * without an explicit contiguous() between them. */
TEST(interp_reshape_of_transpose) {
    int64_t s[2] = {2, 3}, f[1] = {6};
    float x[6] = {0, 1, 2, 3, 4, 5}, want[6] = {0, 3, 1, 4, 2, 5};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 2, s);
    kiln_value t = kiln_transpose(g, vx, 0, 1);
    CHECK(kiln_output(g, kiln_reshape(g, kiln_unary(g, "contiguous", t), 1, f), "a") == KILN_OK);
    CHECK(kiln_output(g, kiln_reshape(g, t, 1, f), "b") == KILN_OK);
    int64_t back[2] = {-1, 3};
    CHECK(kiln_output(g, kiln_reshape(g, t, 2, back), "c") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, s, x)}, out[3];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 1, f) && close_to(&out[0], want, 6, 0), "via contiguous");
    EXPECT(same_shape(&out[1], 1, f) && close_to(&out[1], want, 6, 0), "direct");
    int64_t cs[2] = {2, 3};
    EXPECT(same_shape(&out[2], 2, cs) && close_to(&out[2], want, 6, 0), "-1 dim");
    free_all(out, 3);
    kiln_graph_free(g);
}

TEST(interp_expand) {
    int64_t s[2] = {3, 1}, e[3] = {2, -1, 4}, es[3] = {2, 3, 4};
    float x[3] = {5, 6, 7}, want[24];
    for (int i = 0; i < 24; i++) want[i] = x[(i / 4) % 3];
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_expand(g, vx, 3, e), "y") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, s, x)}, out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 3, es) && close_to(&out[0], want, 24, 0), "expand");
    free_all(out, 1);
    kiln_graph_free(g);
}

/* ---- reductions ----------------------------------------------------------- */

TEST(interp_reductions) {
    int64_t s[3] = {2, 3, 4};
    float x[24];
    for (int i = 0; i < 24; i++) x[i] = (float)((i * 7) % 11) - 5.0f; /* mixed signs */
    float sum_last[6], amax_0_2[3], amin_1[8], prod_mid[8], all = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            float acc = 0;
            for (int c = 0; c < 4; c++) acc += x[(a * 3 + b) * 4 + c];
            sum_last[a * 3 + b] = acc;
        }
    for (int b = 0; b < 3; b++) {
        float m = -INFINITY;
        for (int a = 0; a < 2; a++)
            for (int c = 0; c < 4; c++) m = fmaxf(m, x[(a * 3 + b) * 4 + c]);
        amax_0_2[b] = m;
    }
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 4; c++) {
            float m = INFINITY, p = 1;
            for (int b = 0; b < 3; b++) {
                m = fminf(m, x[(a * 3 + b) * 4 + c]);
                p *= x[(a * 3 + b) * 4 + c];
            }
            amin_1[a * 4 + c] = m;
            prod_mid[a * 4 + c] = p;
        }
    for (int i = 0; i < 24; i++) all += x[i];
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 3, s);
    int last = -1, ends[2] = {-1, 0}, mid = 1;
    CHECK(kiln_output(g, kiln_reduce(g, "sum", vx, 1, &last, 1), "a") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "amax", vx, 2, ends, 0), "b") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "amin", vx, 1, &mid, 1), "c") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "prod", vx, 1, &mid, 0), "d") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "sum", vx, 0, NULL, 0), "e") == KILN_OK);
    CHECK(kiln_output(g, kiln_reduce(g, "mean", vx, 1, &last, 0), "f") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 3, s, x)}, out[6];
    CHECK(interp(g, in, out) == KILN_OK);
    int64_t as[3] = {2, 3, 1}, bs[1] = {3}, cs[3] = {2, 1, 4}, ds[2] = {2, 4}, fs[2] = {2, 3};
    float mean_last[6];
    for (int i = 0; i < 6; i++) mean_last[i] = sum_last[i] / 4.0f;
    EXPECT(same_shape(&out[0], 3, as) && close_to(&out[0], sum_last, 6, 0), "sum keepdim");
    EXPECT(same_shape(&out[1], 1, bs) && close_to(&out[1], amax_0_2, 3, 0), "amax 2 dims");
    EXPECT(same_shape(&out[2], 3, cs) && close_to(&out[2], amin_1, 8, 0), "amin keepdim");
    EXPECT(same_shape(&out[3], 2, ds) && close_to(&out[3], prod_mid, 8, 0), "prod");
    EXPECT(out[4].rank == 0 && close_to(&out[4], &all, 1, 0), "sum of all");
    EXPECT(same_shape(&out[5], 2, fs) && close_to(&out[5], mean_last, 6, 1e-7), "mean");
    free_all(out, 6);
    kiln_graph_free(g);
}

/* Sums accumulate in double: 1 + 1e-8 * 1e6 is 1.01, a float loop gives 1. */
TEST(interp_sum_accumulates_in_double) {
    enum { N = 1000001 };
    int64_t s[1] = {N};
    float *x = malloc(sizeof(float) * N);
    CHECK(x);
    x[0] = 1.0f;
    for (int i = 1; i < N; i++) x[i] = 1e-8f;
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    CHECK(kiln_output(g, kiln_reduce(g, "sum", vx, 0, NULL, 0), "s") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 1, s, x)}, out[1];
    kiln_status st = interp(g, in, out);
    free(x);
    CHECK(st == KILN_OK);
    EXPECT(fabs(at(&out[0], 0) - 1.01) < 1e-6, "got %.9g", at(&out[0], 0));
    free_all(out, 1);
    kiln_graph_free(g);
}

/* ---- externs ---------------------------------------------------------------- */

TEST(interp_matmul_2d) {
    int64_t as[2] = {2, 3}, bs[2] = {3, 2}, os[2] = {2, 2};
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
    float want[4] = {58, 64, 139, 154};
    kiln_graph *g = kiln_graph_new();
    kiln_value va = kiln_input(g, "a", KILN_F32, 2, as);
    kiln_value vb = kiln_weight(g, "b", 2, bs, b);
    CHECK(kiln_output(g, kiln_matmul(g, va, vb), "c") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, as, a)}, out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 2, os) && close_to(&out[0], want, 4, 0), "matmul");
    free_all(out, 1);
    kiln_graph_free(g);
}

/* a [2,1,2,3] @ b [3,3,2] -> [2,3,2,2], batch dims broadcast; and 1-D. */
TEST(interp_matmul_batched) {
    int64_t as[4] = {2, 1, 2, 3}, bs[3] = {3, 3, 2}, os[4] = {2, 3, 2, 2}, vs[1] = {3};
    float a[12], b[18], v[3] = {1, -1, 2}, want[24], mv[12];
    for (int i = 0; i < 12; i++) a[i] = (float)(i % 5) - 1.0f;
    for (int i = 0; i < 18; i++) b[i] = (float)(i % 7) * 0.5f;
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    double acc = 0;
                    for (int k = 0; k < 3; k++)
                        acc += a[(p * 2 + i) * 3 + k] * b[(q * 3 + k) * 2 + j];
                    want[((p * 3 + q) * 2 + i) * 2 + j] = (float)acc;
                }
    for (int r = 0; r < 4; r++) { /* a viewed as [4, 3] rows, @ v */
        double acc = 0;
        for (int k = 0; k < 3; k++) acc += a[r * 3 + k] * v[k];
        mv[r] = (float)acc;
    }
    kiln_graph *g = kiln_graph_new();
    kiln_value va = kiln_input(g, "a", KILN_F32, 4, as);
    kiln_value vb = kiln_input(g, "b", KILN_F32, 3, bs);
    kiln_value vv = kiln_input(g, "v", KILN_F32, 1, vs);
    CHECK(kiln_output(g, kiln_matmul(g, va, vb), "c") == KILN_OK);
    CHECK(kiln_output(g, kiln_matmul(g, va, vv), "d") == KILN_OK);
    kiln_tensor in[3] = {tensor(KILN_F32, 4, as, a), tensor(KILN_F32, 3, bs, b),
                         tensor(KILN_F32, 1, vs, v)},
                out[2];
    CHECK(interp(g, in, out) == KILN_OK);
    int64_t ds[3] = {2, 1, 2};
    EXPECT(same_shape(&out[0], 4, os) && close_to(&out[0], want, 24, 0), "batched");
    EXPECT(same_shape(&out[1], 3, ds) && close_to(&out[1], mv, 4, 0), "matrix @ vector");
    free_all(out, 2);
    kiln_graph_free(g);
}

/* A 3x3 kernel that is zero except w[0][2] = 1, padding 1: out[y][x] is
 * in[y - 1][x + 1] (0 outside), i.e. the image shifted down and left. */
TEST(interp_conv_delta_shifts) {
    int64_t xs[4] = {1, 1, 4, 5}, ws[4] = {1, 1, 3, 3};
    float x[20], w[9] = {0, 0, 1, 0, 0, 0, 0, 0, 0}, want[20];
    for (int i = 0; i < 20; i++) x[i] = (float)(i + 1);
    for (int y = 0; y < 4; y++)
        for (int c = 0; c < 5; c++) {
            int iy = y - 1, ix = c + 1;
            want[y * 5 + c] = (iy >= 0 && ix < 5) ? x[iy * 5 + ix] : 0.0f;
        }
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 4, xs);
    kiln_value vw = kiln_weight(g, "w", 4, ws, w);
    kiln_conv_params p = kiln_conv_defaults();
    p.padding[0] = p.padding[1] = 1;
    CHECK(kiln_output(g, kiln_conv2d(g, vx, vw, KILN_NONE, &p), "y") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 4, xs, x)}, out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(same_shape(&out[0], 4, xs) && close_to(&out[0], want, 20, 0), "shifted image");
    free_all(out, 1);
    kiln_graph_free(g);
}

/* Stride, asymmetric padding and dilation, 2 groups, a bias: against the
 * textbook sum over (c, kh, kw) with bounds checks. */
TEST(interp_conv_general) {
    enum { N = 2, C = 4, H = 7, W = 6, O = 6, G = 2, KH = 3, KW = 2 };
    const int sh = 2, sw = 1, ph = 1, pw = 2, dh = 2, dw = 3;
    const int OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
    const int OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / G, KH, KW}, bs[1] = {O};
    static float x[N * C * H * W], w[O * (C / G) * KH * KW], want[N * O * 64];
    float b[O];
    for (int i = 0; i < N * C * H * W; i++) x[i] = (float)((i * 37) % 19) / 8.0f - 1.0f;
    for (int i = 0; i < O * (C / G) * KH * KW; i++) w[i] = (float)((i * 11) % 13) / 4.0f - 1.5f;
    for (int i = 0; i < O; i++) b[i] = 0.25f * (float)i;
    CHECK(OH * OW <= 64);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int y = 0; y < OH; y++)
                for (int z = 0; z < OW; z++) {
                    double acc = b[o];
                    int grp = o / (O / G);
                    for (int c = 0; c < C / G; c++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++) {
                                int iy = y * sh - ph + kh * dh, ix = z * sw - pw + kw * dw;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                acc += (double)x[((n * C + grp * (C / G) + c) * H + iy) * W + ix] *
                                       w[((o * (C / G) + c) * KH + kh) * KW + kw];
                            }
                    want[((n * O + o) * OH + y) * OW + z] = (float)acc;
                }
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 4, xs);
    kiln_value vw = kiln_input(g, "w", KILN_F32, 4, ws);
    kiln_value vb = kiln_input(g, "b", KILN_F32, 1, bs);
    kiln_conv_params p = {{sh, sw}, {ph, pw}, {dh, dw}, G};
    CHECK(kiln_output(g, kiln_conv2d(g, vx, vw, vb, &p), "y") == KILN_OK);
    kiln_tensor in[3] = {tensor(KILN_F32, 4, xs, x), tensor(KILN_F32, 4, ws, w),
                         tensor(KILN_F32, 1, bs, b)},
                out[1];
    CHECK(interp(g, in, out) == KILN_OK);
    int64_t os[4] = {N, O, OH, OW};
    EXPECT(same_shape(&out[0], 4, os), "shape");
    EXPECT(close_to(&out[0], want, N * O * OH * OW, 1e-6), "values");
    free_all(out, 1);
    kiln_graph_free(g);
}

/* ---- composites, through decomposition ------------------------------------ */

TEST(interp_softmax_rows) {
    int64_t s[2] = {3, 4};
    float x[12] = {1, 2, 3, 4, -1, 0, 1, 100, 5, 5, 5, 5}, sm[12], lsm[12];
    for (int r = 0; r < 3; r++) {
        double m = -INFINITY, z = 0;
        for (int c = 0; c < 4; c++) m = fmax(m, x[r * 4 + c]);
        for (int c = 0; c < 4; c++) z += exp(x[r * 4 + c] - m);
        for (int c = 0; c < 4; c++) {
            sm[r * 4 + c] = (float)(exp(x[r * 4 + c] - m) / z);
            lsm[r * 4 + c] = (float)(x[r * 4 + c] - m - log(z));
        }
    }
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_softmax(g, vx, -1), "sm") == KILN_OK);
    CHECK(kiln_output(g, kiln_log_softmax(g, vx, 1), "lsm") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, s, x)}, out[2];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(close_to(&out[0], sm, 12, 1e-6), "softmax");
    EXPECT(close_to(&out[1], lsm, 12, 1e-6), "log_softmax");
    free_all(out, 2);
    kiln_graph_free(g);
}

TEST(interp_norms_and_clamp) {
    int64_t s[3] = {2, 3, 2}, c[1] = {3}, ln[1] = {2};
    float x[12], lw[2] = {2, -1}, lb[2] = {0.5f, 1};
    float mean[3] = {1, -1, 0}, var[3] = {4, 1, 0.25f}, bw[3] = {1, 2, 3}, bb[3] = {0, 1, -1};
    float ln_want[12], bn_want[12], cl_want[12];
    for (int i = 0; i < 12; i++) x[i] = (float)((i * 5) % 7) - 3.0f;
    for (int r = 0; r < 6; r++) {
        double m = (x[2 * r] + x[2 * r + 1]) / 2.0;
        double v = ((x[2 * r] - m) * (x[2 * r] - m) + (x[2 * r + 1] - m) * (x[2 * r + 1] - m)) / 2;
        for (int k = 0; k < 2; k++)
            ln_want[2 * r + k] = (float)((x[2 * r + k] - m) / sqrt(v + 1e-5) * lw[k] + lb[k]);
    }
    for (int i = 0; i < 12; i++) {
        int ch = (i / 2) % 3;
        bn_want[i] = (float)((x[i] - mean[ch]) / sqrt(var[ch] + 1e-5) * bw[ch] + bb[ch]);
        cl_want[i] = fminf(fmaxf(x[i], -1.5f), 2.0f);
    }
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 3, s);
    kiln_value w1 = kiln_weight(g, "lw", 1, ln, lw), b1 = kiln_weight(g, "lb", 1, ln, lb);
    kiln_value m = kiln_weight(g, "mean", 1, c, mean), v = kiln_weight(g, "var", 1, c, var);
    kiln_value w2 = kiln_weight(g, "bw", 1, c, bw), b2 = kiln_weight(g, "bb", 1, c, bb);
    CHECK(kiln_output(g, kiln_layer_norm(g, vx, 1, ln, w1, b1, 1e-5), "ln") == KILN_OK);
    CHECK(kiln_output(g, kiln_batch_norm(g, vx, m, v, w2, b2, 1e-5), "bn") == KILN_OK);
    CHECK(kiln_output(g, kiln_clamp(g, vx, 1, -1.5, 1, 2.0), "cl") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 3, s, x)}, out[3];
    CHECK(interp(g, in, out) == KILN_OK);
    EXPECT(close_to(&out[0], ln_want, 12, 1e-5), "layer_norm");
    EXPECT(close_to(&out[1], bn_want, 12, 1e-5), "batch_norm");
    EXPECT(close_to(&out[2], cl_want, 12, 0), "clamp");
    free_all(out, 3);
    kiln_graph_free(g);
}

/* ---- random ----------------------------------------------------------------- */

enum { NRAND = 100000 };

/* rand_like of a [rank, shape] input with this seed, into out (NRAND floats). */
static int rand_run(int rank, const int64_t *shape, uint64_t seed, float *out) {
    float *zeros = calloc(NRAND, sizeof(float));
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, rank, shape);
    kiln_tensor in[1] = {tensor(KILN_F32, rank, shape, zeros)}, res[1];
    int ok = zeros && kiln_output(g, kiln_rand_like(g, vx, seed), "r") == KILN_OK &&
             interp(g, in, res) == KILN_OK;
    if (ok) {
        memcpy(out, res[0].data, sizeof(float) * NRAND);
        kiln_tensor_free(&res[0]);
    }
    kiln_graph_free(g);
    free(zeros);
    return ok;
}

TEST(interp_rand_like) {
    int64_t flat[1] = {NRAND}, grid[3] = {250, 4, 100};
    float *a = malloc(sizeof(float) * NRAND), *b = malloc(sizeof(float) * NRAND);
    float *c = malloc(sizeof(float) * NRAND);
    CHECK(a && b && c);
    int ok = rand_run(1, flat, 42, a) && rand_run(3, grid, 42, b) && rand_run(1, flat, 43, c);
    double sum = 0;
    int in_range = 1, same = 1, differ = 0, stream = 1;
    for (int i = 0; ok && i < NRAND; i++) {
        in_range &= a[i] >= 0.0f && a[i] < 1.0f;
        sum += a[i];
        same &= a[i] == b[i];
        differ += a[i] != c[i];
        stream &= a[i] == util_rand_uniform(42, (uint64_t)i);
    }
    EXPECT(ok, "rand_like ran");
    EXPECT(in_range, "values in [0, 1)");
    EXPECT(fabs(sum / NRAND - 0.5) < 0.005, "mean %g", sum / NRAND);
    EXPECT(same, "same seed, other shape: same values");
    EXPECT(differ > NRAND * 0.99, "another seed: other values (%d differ)", differ);
    EXPECT(stream, "element i is util_rand_uniform(seed, i)");
    free(a);
    free(b);
    free(c);
}

/* dropout of x = 1 + i % 7 with probability p: returns the zero fraction,
 * and whether every kept value is x / (1 - p) within tol (relative). */
static int dropout_run(double p, uint64_t seed, double tol, double *zero_frac, float *keep) {
    int64_t s[1] = {NRAND};
    float *x = malloc(sizeof(float) * NRAND);
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    kiln_tensor in[1] = {tensor(KILN_F32, 1, s, x)}, out[1];
    for (int i = 0; x && i < NRAND; i++) x[i] = 1.0f + (float)(i % 7);
    int ran = x && kiln_output(g, kiln_dropout(g, vx, p, seed), "y") == KILN_OK &&
              interp(g, in, out) == KILN_OK;
    int ok = ran;
    int64_t zeros = 0;
    for (int i = 0; ok && i < NRAND; i++) {
        float y = at(&out[0], i), want = (float)(x[i] / (1.0 - p));
        zeros += y == 0.0f;
        if (y != 0.0f && !(fabs(y - want) <= tol * fabs(want))) {
            printf("  p=%g element %d: got %.9g, want %.9g\n", p, i, y, want);
            ok = 0;
        }
        if (keep) keep[i] = y;
    }
    *zero_frac = (double)zeros / NRAND;
    if (ran) kiln_tensor_free(&out[0]);
    kiln_graph_free(g);
    free(x);
    return ok;
}

TEST(interp_dropout) {
    double frac;
    const double ps[3] = {0.5, 0.75, 0.3};
    for (int k = 0; k < 3; k++) {
        /* 1/(1-p) is a power of two for 0.5 and 0.75: exact whatever the
         * decomposition; for 0.3 allow one rounding */
        double tol = k < 2 ? 0 : 1.2e-7;
        EXPECT(dropout_run(ps[k], 7, tol, &frac, NULL), "p=%g: kept values", ps[k]);
        EXPECT(fabs(frac - ps[k]) < 0.01, "p=%g: zero fraction %g", ps[k], frac);
    }
    float *a = malloc(sizeof(float) * NRAND), *b = malloc(sizeof(float) * NRAND);
    CHECK(a && b);
    EXPECT(dropout_run(0.5, 9, 0, &frac, a) && dropout_run(0.5, 9, 0, &frac, b), "runs");
    EXPECT(memcmp(a, b, sizeof(float) * NRAND) == 0, "two runs agree");
    free(a);
    free(b);
}

/* ---- the public entry point -------------------------------------------- */

TEST(interp_input_mismatch) {
    int64_t s[2] = {2, 3}, bad[2] = {3, 2};
    float x[6] = {0};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_unary(g, "neg", vx), "y") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 2, bad, x)}, out[1];
    CHECK(kiln_interpret(g, in, out) == KILN_ERR_INPUT);
    CHECKF(strcmp(kiln_error(g), "input 'x': expected f32[2, 3], got f32[3, 2]") == 0,
           "message: %s", kiln_error(g));
    kiln_graph_free(g);

    g = kiln_graph_new();
    vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_unary(g, "neg", vx), "y") == KILN_OK);
    in[0] = tensor(KILN_BOOL, 2, s, x);
    CHECK(kiln_interpret(g, in, out) == KILN_ERR_INPUT);
    CHECKF(strcmp(kiln_error(g), "input 'x': expected f32[2, 3], got bool[2, 3]") == 0,
           "message: %s", kiln_error(g));
    kiln_graph_free(g);

    g = kiln_graph_new(); /* a right type without data */
    vx = kiln_input(g, "x", KILN_F32, 2, s);
    CHECK(kiln_output(g, kiln_unary(g, "neg", vx), "y") == KILN_OK);
    in[0] = tensor(KILN_F32, 2, s, NULL);
    CHECK(kiln_interpret(g, in, out) == KILN_ERR_INPUT);
    CHECKF(strcmp(kiln_error(g), "input 'x': no data") == 0, "message: %s", kiln_error(g));
    kiln_graph_free(g);
}

/* A graph whose build failed reports that failure again. */
TEST(interp_build_error_is_returned) {
    int64_t s[1] = {3};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    CHECK(kiln_binary(g, "nosuchop", vx, vx) == KILN_NONE);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kiln_error(g));
    float x[3] = {0};
    kiln_tensor in[1] = {tensor(KILN_F32, 1, s, x)}, out[1];
    CHECK(kiln_interpret(g, in, out) == KILN_ERR_INPUT);
    CHECK(strcmp(kiln_error(g), msg) == 0);
    kiln_graph_free(g);
}

/* Inputs, weights and repeated values as outputs are copies the caller owns. */
TEST(interp_outputs_alias) {
    int64_t s[1] = {3};
    float x[3] = {1, 2, 3}, w[3] = {4, 5, 6}, y_want[3] = {5, 7, 9};
    kiln_graph *g = kiln_graph_new();
    kiln_value vx = kiln_input(g, "x", KILN_F32, 1, s);
    kiln_value vw = kiln_weight(g, "w", 1, s, w);
    kiln_value y = kiln_binary(g, "add", vx, vw);
    CHECK(kiln_output(g, vx, "x_out") == KILN_OK);
    CHECK(kiln_output(g, vw, "w_out") == KILN_OK);
    CHECK(kiln_output(g, y, "y1") == KILN_OK);
    CHECK(kiln_output(g, y, "y2") == KILN_OK);
    CHECK(kiln_output(g, kiln_binary(g, "mul", y, y), "yy") == KILN_OK);
    kiln_tensor in[1] = {tensor(KILN_F32, 1, s, x)}, out[5];
    CHECK(interp(g, in, out) == KILN_OK);
    float yy[3] = {25, 49, 81};
    EXPECT(out[0].data != (void *)x && close_to(&out[0], x, 3, 0), "input copied");
    EXPECT(close_to(&out[1], w, 3, 0), "weight copied");
    EXPECT(out[2].data != out[3].data, "distinct buffers");
    EXPECT(close_to(&out[2], y_want, 3, 0) && close_to(&out[3], y_want, 3, 0), "y twice");
    EXPECT(close_to(&out[4], yy, 3, 0), "y * y");
    free_all(out, 5);
    kiln_graph_free(g);
}

/* ---- allocation failures ------------------------------------------------- */

static struct {
    long budget; /* allocations still allowed; < 0: unlimited */
    long live;   /* blocks allocated and not yet freed */
} hook_state;

static void *failing_alloc(void *ud, void *ptr, size_t oldsize, size_t newsize) {
    (void)ud;
    (void)oldsize;
    if (newsize == 0) {
        if (ptr) hook_state.live--;
        free(ptr);
        return NULL;
    }
    if (hook_state.budget == 0) return NULL;
    if (hook_state.budget > 0) hook_state.budget--;
    void *p = realloc(ptr, newsize);
    if (p && !ptr) hook_state.live++;
    return p;
}

/* A graph that takes every path with an allocation in it: bool input,
 * weight, matmul, conv, reduction, composite, input and repeated outputs. */
static kiln_graph *nomem_graph(void) {
    static const float w[6] = {1, 2, 3, 4, 5, 6}, k[4] = {1, 0, 0, 1};
    int64_t xs[2] = {2, 3}, ws[2] = {3, 2}, ms[2] = {2, 2}, is[4] = {1, 1, 2, 2};
    int64_t ks[4] = {1, 1, 2, 2};
    kiln_graph *g = kiln_graph_new();
    kiln_value x = kiln_input(g, "x", KILN_F32, 2, xs);
    kiln_value m = kiln_input(g, "m", KILN_BOOL, 2, ms);
    kiln_value y = kiln_matmul(g, x, kiln_weight(g, "w", 2, ws, w));
    y = kiln_where(g, m, kiln_unary(g, "relu", y), kiln_scalar(g, 0));
    kiln_value c =
        kiln_conv2d(g, kiln_reshape(g, y, 4, is), kiln_weight(g, "k", 4, ks, k), KILN_NONE, NULL);
    int one = 1;
    kiln_output(g, kiln_softmax(g, y, 1), "sm");
    kiln_output(g, kiln_reduce(g, "sum", y, 1, &one, 0), "s");
    kiln_output(g, c, "c");
    kiln_output(g, x, "x");
    kiln_output(g, y, "y1");
    kiln_output(g, y, "y2");
    return g;
}

TEST(interp_nomem_leaks_nothing) {
    float x[6] = {1, -2, 3, -4, 5, -6};
    unsigned char m[4] = {1, 1, 0, 1};
    int64_t xs[2] = {2, 3}, ms[2] = {2, 2};
    kiln_tensor in[2] = {tensor(KILN_F32, 2, xs, x), tensor(KILN_BOOL, 2, ms, m)}, out[6];
    int failures = 0, done = 0;
    hook_state.budget = -1;
    hook_state.live = 0;
    kiln_set_allocator(failing_alloc, NULL);
    for (long n = 0; n < 100000 && !done && !test_failed; n++) {
        kiln_graph *g = nomem_graph();
        EXPECT(g && kiln_error(g)[0] == 0, "graph built");
        if (!g || test_failed) break;
        long before = hook_state.live;
        hook_state.budget = n;
        kiln_status st = kiln_interpret(g, in, out);
        hook_state.budget = -1;
        if (st == KILN_OK) {
            done = 1;
            float c_want[1] = {at(&out[4], 0) + at(&out[4], 3)}; /* y1: diagonal kernel */
            EXPECT(out[2].rank == 4 && close_to(&out[2], c_want, 1, 0), "conv after retries");
            free_all(out, 6);
        } else {
            failures++;
            EXPECT(st == KILN_ERR_NOMEM, "n=%ld: status %d", n, (int)st);
            EXPECT(strstr(kiln_error(g), "out of memory") != NULL, "n=%ld: %s", n, kiln_error(g));
            EXPECT(hook_state.live == before, "n=%ld: %ld blocks leaked", n,
                   hook_state.live - before);
        }
        kiln_graph_free(g);
        EXPECT(hook_state.live == 0, "n=%ld: %ld blocks live after free", n, hook_state.live);
    }
    kiln_set_allocator(NULL, NULL);
    EXPECT(done, "never succeeded");
    EXPECT(failures > 10, "only %d failing runs", failures);
}
