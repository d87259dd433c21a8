/*
 * test_epilogue.c -- extern epilogues: pointwise consumers
 * of a matmul or conv2d output run inside the library call, on each output
 * block right after the library computed it.
 *
 * Decisions: for the seed relu((x + 1) @ w), linear + bias + gelu, conv +
 * residual add + relu and conv + BN + relu with BN parameters as runtime
 * inputs, the calls, the pairs fused and the fusion log with epilogues (the
 * default) and without (--no-extern-epilogue: Inductor's walls); the rules
 * that keep reductions, other externs, other iteration spaces and other
 * index formulas out of an epilogue; chains and siblings that join.
 *
 * Results: every program is compiled both ways and compared with the
 * reference interpreter (rt_tolerance, rt_excess) at odd sizes, three ways
 * with epilogues: the library as it is; matmul blocks forced to 64 rows so
 * that 300 rows cross block boundaries (ext_set_epilogue_rows); and a
 * runtime table (rt_set_externs) that computes the whole output first and
 * then hands the epilogue ranges of 37 elements, which start and end inside
 * rows and planes, as the epilogue's contract allows.
 *
 * The library side (ext_matmul_epi, ext_conv2d_epi) is checked by a
 * recording epilogue: its ranges cover the output exactly once, are whole
 * rows (planes) inside one block (slab), and hold final values when the
 * epilogue sees them, conv bias included. Traffic of the seed program is
 * computed by hand, and GCC must vectorize every epilogue's inner loop.
 */
#include "test.h"
#include "testutil.h"
#include "runtime/runtime.h"
#include "testing.h" /* test hooks */

typedef TestProg Prog;

static kiln_value input(Prog *P, const char *name, int rank, const int64_t *shape) {
    return test_prog_input(P, name, rank, shape, 900);
}

static kiln_value weight(Prog *P, const char *name, int rank, const int64_t *shape, uint64_t seed) {
    return test_random_weight(P->g, name, rank, shape, seed);
}

static KilnConfig config(bool epilogue) {
    KilnConfig c = kiln_config_default();
    c.logs = 0;
    c.extern_epilogue = epilogue;
    return c;
}

/* Decompose, lower and schedule, with the fusion log into *log (free it). */
static Plan *plan(Prog *P, bool epilogue, char **log) {
    KilnConfig c = config(epilogue);
    size_t len = 0;
    *log = NULL;
    c.logs = LOG_FUSION;
    c.log = open_memstream(log, &len);
    Plan *p = NULL;
    char err[512];
    kiln_status st = plan_build(P->g, &c, &p, err, sizeof err);
    fclose(c.log);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "plan_build: %s", err);
    return p;
}

static bool calls_are(const Schedule *s, int n, const char *const *names) {
    if (s->nkernels != n) return false;
    for (int i = 0; i < n; i++)
        if (strcmp(s->kernels[i].kernel, names[i])) return false;
    return true;
}

static void print_calls(const Schedule *s) {
    printf("  calls:");
    for (int i = 0; i < s->nkernels; i++)
        printf(" %s (%s)", s->kernels[i].kernel, s->kernels[i].name);
    printf("\n");
}

static bool has_origin(const Kernel *k, const char *o) {
    for (int i = 0; i < k->norigins; i++)
        if (!strcmp(k->origins[i], o)) return true;
    return false;
}

/* ===== running: the library, forced blocks, odd ranges ========================= */

/* The odd-range table: the whole output first, then the epilogue on ranges
 * of ODD elements, last range first (order must not matter either). */
#define ODD 37
static int epilogue_calls; /* library calls that brought an epilogue */

static void odd_ranges(ExtEpilogue epi, void *ctx, float *c, int64_t n) {
    if (!epi) return;
    epilogue_calls++;
    for (int64_t s = (n - 1) / ODD * ODD; s >= 0; s -= ODD)
        epi(ctx, c, s, n - s < ODD ? n - s : ODD);
}

static int odd_mm(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                  int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx) {
    if (ext_matmul_epi(a, av, b, bv, c, crank, cshape, NULL, NULL)) return -1;
    int64_t n = 1;
    for (int d = 0; d < crank; d++) n *= cshape[d];
    odd_ranges(epi, ctx, c, n);
    return 0;
}

static int odd_conv(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                    const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                    ExtEpilogue epi, void *ctx) {
    if (ext_conv2d_epi(x, xs, w, ws, bias, y, ys, attr, NULL, NULL)) return -1;
    odd_ranges(epi, ctx, y, ys[0] * ys[1] * ys[2] * ys[3]);
    return 0;
}

static const KilnRT odd_rt = {.mm = odd_mm, .conv2d = odd_conv};

typedef enum { RUN_LIBRARY, RUN_BLOCKS64, RUN_ODD_RANGES } RunMode;
static const char *const mode_name[] = {"library", "blocks of 64 rows", "ranges of 37"};

static char saved_cache[1024];
static bool had_cache;

static void enter_cache(void) {
    const char *c = getenv("KILN_CACHE_DIR"), *shared = getenv("KILN_TEST_CACHE_DIR");
    had_cache = c != NULL;
    if (c) snprintf(saved_cache, sizeof saved_cache, "%s", c);
    char dir[700];
    if (shared)
        snprintf(dir, sizeof dir, "%s", shared);
    else
        snprintf(dir, sizeof dir, "%s/epilogue-cache", test_tmpdir());
    setenv("KILN_CACHE_DIR", dir, 1);
}

static void leave_cache(void) {
    if (had_cache)
        setenv("KILN_CACHE_DIR", saved_cache, 1);
    else
        unsetenv("KILN_CACHE_DIR");
}

/* Outputs of one run against the interpreter's; false (reported) on a mismatch. */
static bool compare(Prog *P, kiln_program *p, const kiln_tensor *got, const kiln_tensor *want,
                    const char *what) {
    RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(p)));
    for (int i = 0; i < kiln_num_outputs(P->g); i++) {
        const float *g = got[i].data, *w = want[i].data;
        int64_t n = kiln_tensor_numel(&want[i]);
        for (int64_t k = 0; k < n; k++)
            if (!(rt_excess(g[k], w[k], tol) <= 1.0)) {
                test_failf(__FILE__, __LINE__, "%s: %s[%lld]: fused %.8g, interpreter %.8g", what,
                           kiln_output_name(P->g, i), (long long)k, g[k], w[k]);
                return false;
            }
    }
    return true;
}

static void free_outputs(Prog *P, kiln_tensor *t) {
    for (int i = 0; i < kiln_num_outputs(P->g); i++) kiln_tensor_free(&t[i]);
}

/* Does the compiled program have an extern call with an epilogue? */
static bool has_epilogue(kiln_program *p) {
    const Schedule *s = rt_schedule(kiln_program_rt(p));
    for (int k = 0; k < s->nkernels; k++)
        if (s->kernels[k].kind == KK_EXTERN && s->kernels[k].n > 1) return true;
    return false;
}

/* Run p in one mode and compare; the odd-range table also checks that the
 * calls bring an epilogue exactly when the schedule has one. */
static bool run_mode(Prog *P, kiln_program *p, const kiln_tensor *want, RunMode m, bool epilogue,
                     const char *name) {
    kiln_tensor got[TEST_MAXIO];
    char what[200];
    snprintf(what, sizeof what, "%s, epilogues %s, %s", name, epilogue ? "on" : "off",
             mode_name[m]);
    if (m == RUN_BLOCKS64) ext_set_epilogue_rows(64);
    if (m == RUN_ODD_RANGES) rt_set_externs(&odd_rt);
    epilogue_calls = 0;
    kiln_status st = kiln_program_run(p, P->in, got);
    ext_set_epilogue_rows(0);
    rt_set_externs(NULL);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "%s: run: %s", what, kiln_program_error(p));
        return false;
    }
    bool ok = compare(P, p, got, want, what);
    if (m == RUN_ODD_RANGES && (epilogue_calls > 0) != has_epilogue(p)) {
        test_failf(__FILE__, __LINE__, "%s: %d calls brought an epilogue", what, epilogue_calls);
        ok = false;
    }
    free_outputs(P, got);
    return ok;
}

/* Compile with epilogues on or off and run every mode against the
 * interpreter. */
static bool check_runs(Prog *P, bool epilogue, const char *name) {
    kiln_options o = kiln_default_options();
    o.extern_epilogue = epilogue;
    kiln_program *p = NULL;
    enter_cache();
    kiln_status st = kiln_compile_with(P->g, &o, &p);
    leave_cache();
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "%s: compile: %s", name, kiln_error(P->g));
        return false;
    }
    kiln_tensor want[TEST_MAXIO];
    bool ok = kiln_interpret(P->g, P->in, want) == KILN_OK;
    if (!ok) test_failf(__FILE__, __LINE__, "%s: interpret: %s", name, kiln_error(P->g));
    if (!epilogue && has_epilogue(p)) {
        test_failf(__FILE__, __LINE__, "%s: an epilogue with epilogues off", name);
        ok = false;
    }
    for (int m = RUN_LIBRARY; ok && m <= RUN_ODD_RANGES; m++)
        ok = run_mode(P, p, want, (RunMode)m, epilogue, name);
    if (kiln_num_outputs(P->g) && want[0].data) free_outputs(P, want);
    kiln_program_free(p);
    return ok;
}

static void check_both(Prog *P, const char *name) {
    check_runs(P, true, name);
    check_runs(P, false, name);
}

/* ===== the seed: relu((x + 1) @ w) =============================================== */

#define SM 300 /* rows: blocks of 64 leave a partial block of 44 */
#define SK 45
#define SN 520 /* a block of 64 rows is 33280 elements: its epilogue runs in parallel pieces */

static void build_seed(Prog *P) {
    kiln_graph *g = P->g = kiln_graph_new();
    kiln_value x = input(P, "x", 2, (int64_t[]){SM, SK});
    kiln_value w = weight(P, "w", 2, (int64_t[]){SK, SN}, 7);
    kiln_output(
        g, kiln_unary(g, "relu", kiln_matmul(g, kiln_binary(g, "add", x, kiln_scalar(g, 1)), w)),
        "y");
}

/* With epilogues the relu joins the matmul: [cpp_fused_add_0,
 * extern_kernels.mm]; the matmul's output never exists in memory (the
 * library writes y, the relu overwrites it in place), so the fused traffic
 * is x, then buf0 and w, then y, and the peak holds x, w, buf0 and y. */
TEST(epilogue_seed_with) {
    const int64_t M = SM, K = SK, N = SN, F = 4;
    Prog P = {0};
    build_seed(&P);
    char *log;
    Plan *p = plan(&P, true, &log);
    CHECK(p);
    const Schedule *s = p->sched;
    static const char *const calls[] = {"cpp_fused_add_0", "extern_kernels.mm"};
    EXPECT(s->nnodes == 3 && calls_are(s, 2, calls), "calls");
    if (!calls_are(s, 2, calls)) print_calls(s);
    EXPECT(s->rounds[0].possible == 1 && s->rounds[0].nfused == 1 &&
               !strcmp(s->rounds[0].fused_a[0], "op1") && !strcmp(s->rounds[0].fused_b[0], "op2"),
           "round 1 fuses op1 with op2");
    EXPECT(strstr(log, "cannot fuse op0 with op1: node2 is extern\n") != NULL, "log: %s", log);
    EXPECT(strstr(log, "fusing op1 with op2 (epilogue of extern_kernels.mm)\n") != NULL, "log: %s",
           log);
    const Kernel *k = &s->kernels[1];
    EXPECT(k->kind == KK_EXTERN && k->n == 2 && k->loop_nests == 0 && has_origin(k, "matmul") &&
               has_origin(k, "relu") && k->norigins == 2,
           "the extern call holds the relu");
    EXPECT(k->store[0] == STORE_REGISTER && k->store[1] == STORE_GLOBAL,
           "matmul output in cache only");
    int64_t unfused = 2 * F * M * K + F * (M * K + K * N + M * N) + 2 * F * M * N;
    int64_t fused = 2 * F * M * K + F * (M * K + K * N) + F * M * N;
    EXPECT(s->unfused_bytes == unfused, "unfused %lld want %lld", (long long)s->unfused_bytes,
           (long long)unfused);
    EXPECT(s->fused_bytes == fused, "fused %lld want %lld", (long long)s->fused_bytes,
           (long long)fused);
    EXPECT(k->load_bytes == F * (M * K + K * N) && k->store_bytes == F * M * N,
           "mm traffic %lld %lld", (long long)k->load_bytes, (long long)k->store_bytes);
    int64_t peak = F * (M * K + K * N) + F * (M * K + M * N);
    EXPECT(s->peak_bytes == peak, "peak %lld want %lld", (long long)s->peak_bytes, (long long)peak);
    /* explain and JSON show the epilogue on the call */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    report_explain(f, s);
    fprintf(f, "\n----\n");
    report_json(f, s, NULL);
    fclose(f);
    EXPECT(strstr(text, "== call sequence: ['cpp_fused_add_0', 'extern_kernels.mm']") != NULL,
           "explain calls");
    EXPECT(strstr(text, "(extern; nodes op1_op2; group (156000, 1); 0 loop nests; epilogue op2)") !=
               NULL,
           "explain kernel line");
    EXPECT(strstr(text, "# epilogue, on each output block the library has just computed:") != NULL,
           "explain epilogue");
    EXPECT(strstr(text, "{\"name\": \"extern_kernels.mm\", \"kind\": \"extern\", \"origins\": "
                        "[\"matmul\", \"relu\"], \"loop_nests\": 0, \"nodes\": [\"op1\", \"op2\"], "
                        "\"epilogue\": [\"op2\"]") != NULL,
           "json kernel");
    EXPECT(strstr(text, "\"calls\": [\"cpp_fused_add_0\", \"extern_kernels.mm\"]") != NULL,
           "json calls");
    free(text);
    free(log);
    plan_free(p);
    check_runs(&P, true, "seed");
    test_prog_free(&P);
}

/* Without: Inductor's three calls, every extern pair a wall, traffic as
 * unfused (nothing to fuse: the add and the relu were inlined already). */
TEST(epilogue_seed_without) {
    const int64_t M = SM, K = SK, N = SN, F = 4;
    Prog P = {0};
    build_seed(&P);
    char *log;
    Plan *p = plan(&P, false, &log);
    CHECK(p);
    const Schedule *s = p->sched;
    static const char *const calls[] = {"cpp_fused_add_0", "extern_kernels.mm", "cpp_fused_relu_1"};
    EXPECT(calls_are(s, 3, calls), "calls");
    EXPECT(s->rounds[0].possible == 0, "found %d possible fusions", s->rounds[0].possible);
    EXPECT(strstr(log, "cannot fuse op1 with op2: node1 is extern\n") != NULL, "log: %s", log);
    EXPECT(strstr(log, "epilogue") == NULL, "log mentions an epilogue");
    int64_t bytes = 2 * F * M * K + F * (M * K + K * N + M * N) + 2 * F * M * N;
    EXPECT(s->unfused_bytes == bytes && s->fused_bytes == bytes, "traffic %lld %lld",
           (long long)s->unfused_bytes, (long long)s->fused_bytes);
    free(log);
    plan_free(p);
    check_runs(&P, false, "seed");
    test_prog_free(&P);
}

/* ===== linear + bias + gelu ======================================================= */

/* gelu(x @ w + b), b a runtime input broadcast over rows: one call. */
TEST(epilogue_linear_bias_gelu) {
    Prog P = {0};
    P.g = kiln_graph_new();
    kiln_graph *g = P.g;
    kiln_value x = input(&P, "x", 2, (int64_t[]){300, 70});
    kiln_value w = weight(&P, "w", 2, (int64_t[]){70, 77}, 3);
    kiln_value b = input(&P, "b", 1, (int64_t[]){77});
    kiln_output(g, kiln_unary(g, "gelu", kiln_binary(g, "add", kiln_matmul(g, x, w), b)), "y");
    char *log;
    Plan *p = plan(&P, true, &log);
    CHECK(p);
    static const char *const with[] = {"extern_kernels.mm"};
    const Schedule *s = p->sched;
    EXPECT(calls_are(s, 1, with), "with: %d calls", s->nkernels);
    EXPECT(s->nkernels == 1 && s->kernels[0].n == 2 && has_origin(&s->kernels[0], "gelu") &&
               has_origin(&s->kernels[0], "add"),
           "bias and gelu in the call");
    EXPECT(strstr(log, "fusing op0 with op1 (epilogue of extern_kernels.mm)\n") != NULL, "log: %s",
           log);
    free(log);
    plan_free(p);
    p = plan(&P, false, &log);
    CHECK(p);
    static const char *const without[] = {"extern_kernels.mm", "cpp_fused_add_gelu_0"};
    EXPECT(calls_are(p->sched, 2, without), "without");
    free(log);
    plan_free(p);
    check_both(&P, "linear_bias_gelu");
    test_prog_free(&P);
}

/* ===== convolutions ================================================================ */

static kiln_value conv(kiln_graph *g, kiln_value x, kiln_value w, kiln_value b, int stride, int pad,
                       int groups) {
    kiln_conv_params p = {{stride, stride}, {pad, pad}, {1, 1}, groups};
    return kiln_conv2d(g, x, w, b, &p);
}

/* The calls of a one-conv program with and without epilogues. */
static void expect_conv_calls(Prog *P, const char *kernel_without, const char *const *origins) {
    char *log;
    Plan *p = plan(P, true, &log);
    if (!p) return;
    static const char *const with[] = {"extern_kernels.conv2d"};
    const Schedule *s = p->sched;
    EXPECT(calls_are(s, 1, with) && s->kernels[0].n == 2, "with: %d calls", s->nkernels);
    if (s->nkernels != 1) print_calls(s);
    for (int i = 0; origins[i]; i++)
        EXPECT(s->nkernels && has_origin(&s->kernels[0], origins[i]), "origin %s", origins[i]);
    EXPECT(strstr(log, "fusing op0 with op1 (epilogue of extern_kernels.conv2d)\n") != NULL,
           "log: %s", log);
    free(log);
    plan_free(p);
    p = plan(P, false, &log);
    if (!p) return;
    const char *without[] = {"extern_kernels.conv2d", kernel_without};
    EXPECT(calls_are(p->sched, 2, without), "without: %s",
           p->sched->nkernels > 1 ? p->sched->kernels[1].kernel : "?");
    EXPECT(strstr(log, "cannot fuse op0 with op1: node1 is extern\n") != NULL, "log: %s", log);
    free(log);
    plan_free(p);
}

/* relu(conv2d(x, w, bias) + r): the conv's own bias (added per slab by the
 * library), then the residual add and the relu as the epilogue. */
TEST(epilogue_conv_residual_relu) {
    Prog P = {0};
    kiln_graph *g = P.g = kiln_graph_new();
    kiln_value x = input(&P, "x", 4, (int64_t[]){2, 5, 9, 11});
    kiln_value w = weight(&P, "w", 4, (int64_t[]){6, 5, 3, 3}, 21);
    kiln_value b = input(&P, "bias", 1, (int64_t[]){6});
    kiln_value r = input(&P, "r", 4, (int64_t[]){2, 6, 9, 11});
    kiln_value y = kiln_binary(g, "add", conv(g, x, w, b, 1, 1, 1), r);
    kiln_output(g, kiln_unary(g, "relu", y), "y");
    static const char *const origins[] = {"conv2d", "add", "relu", NULL};
    expect_conv_calls(&P, "cpp_fused_add_relu_0", origins);
    check_both(&P, "conv_residual_relu");
    test_prog_free(&P);
}

/* Conv-BN-ReLU with BN parameters as runtime inputs: nothing folds, and the
 * BN affine and the relu are the conv's epilogue. Dense, grouped (a slab
 * per image and group) and depthwise (a plane at a time) convolutions. */
TEST(epilogue_conv_bn_relu_runtime) {
    static const struct {
        int64_t cin, cout, groups, stride;
    } cases[] = {
        {8, 6, 1, 1},
        {8, 6, 2, 2},
        {8, 8, 8, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t ci = cases[c].cin, co = cases[c].cout, gr = cases[c].groups;
        Prog P = {0};
        kiln_graph *g = P.g = kiln_graph_new();
        kiln_value x = input(&P, "x", 4, (int64_t[]){3, ci, 13, 10});
        kiln_value w = weight(&P, "w", 4, (int64_t[]){co, ci / gr, 3, 3}, 30 + c);
        int64_t cs[1] = {co};
        kiln_value m = input(&P, "mean", 1, cs), v = input(&P, "var", 1, cs);
        kiln_value ga = input(&P, "gamma", 1, cs), be = input(&P, "beta", 1, cs);
        float *vd = P.in[2].data;
        for (int i = 0; i < co; i++) vd[i] = 0.5f + 0.25f * (float)i; /* a variance */
        kiln_value bn = kiln_batch_norm(
            g, conv(g, x, w, KILN_NONE, (int)cases[c].stride, 1, (int)gr), m, v, ga, be, 1e-5);
        kiln_output(g, kiln_unary(g, "relu", bn), "y");
        static const char *const origins[] = {"conv2d", "batch_norm", "relu", NULL};
        expect_conv_calls(&P, "cpp_fused_batch_norm_relu_0", origins);
        char name[64];
        snprintf(name, sizeof name, "conv_bn_relu groups=%lld", (long long)gr);
        check_both(&P, name);
        test_prog_free(&P);
    }
}

/* ===== the rules ==================================================================== */

static const char *why(Plan *p, const char *a, const char *b) {
    const char *w = sched_why_not(p->sched, a, b);
    return w ? w : "(fusible)";
}

/* What an epilogue may not hold, each with its reason; with epilogues off
 * every one of them is "node1 is extern". */
TEST(epilogue_rules) {
    Prog P = {0};
    kiln_graph *g = P.g = kiln_graph_new();
    int64_t sq[2] = {16, 16}, big[3] = {2, 16, 16};
    kiln_value x = input(&P, "x", 2, sq), w = input(&P, "w", 2, sq), z = input(&P, "z", 3, big);
    kiln_value mm = kiln_matmul(g, x, w); /* op0 */
    int d1 = 1;
    kiln_output(g, kiln_reduce(g, "sum", mm, 1, &d1, 0), "rowsum");              /* op1 */
    kiln_output(g, kiln_binary(g, "add", mm, z), "wider");                       /* op2 */
    kiln_output(g, kiln_binary(g, "mul", kiln_transpose(g, mm, 0, 1), x), "mT"); /* op3 */
    kiln_output(g, kiln_matmul(g, mm, w), "mm2");                                /* op4 */
    char *log;
    Plan *p = plan(&P, true, &log);
    CHECK(p);
    CHECK(p->sched->nnodes == 5);
    EXPECT(!strcmp(why(p, "op0", "op1"), "extern epilogue must be pointwise"), "%s",
           why(p, "op0", "op1"));
    EXPECT(!strcmp(why(p, "op0", "op2"), "extern epilogue must iterate the extern's output"), "%s",
           why(p, "op0", "op2"));
    EXPECT(!strcmp(why(p, "op0", "op3"), "memory deps did not match"), "%s", why(p, "op0", "op3"));
    EXPECT(!strcmp(why(p, "op0", "op4"), "node2 is extern"), "%s", why(p, "op0", "op4"));
    EXPECT(!strcmp(why(p, "op3", "op4"), "node2 is extern"), "%s", why(p, "op3", "op4"));
    EXPECT(p->sched->nkernels == 5, "%d kernels: nothing may fuse", p->sched->nkernels);
    free(log);
    plan_free(p);
    p = plan(&P, false, &log);
    CHECK(p);
    for (int i = 1; i <= 3; i++) {
        char b[16];
        snprintf(b, sizeof b, "op%d", i);
        EXPECT(!strcmp(why(p, "op0", b), "node1 is extern"), "off: op0 %s: %s", b,
               why(p, "op0", b));
    }
    free(log);
    plan_free(p);
    check_both(&P, "rules");
    test_prog_free(&P);
}

/* A chain of materialized pointwise nodes joins one by one (t is an output
 * and read again, so it is a node of its own); the library's output lives in
 * cache only, t is stored, and y is written in place. */
TEST(epilogue_chain) {
    Prog P = {0};
    kiln_graph *g = P.g = kiln_graph_new();
    kiln_value x = input(&P, "x", 2, (int64_t[]){130, 33}),
               w = input(&P, "w", 2, (int64_t[]){33, 41});
    kiln_value b = input(&P, "b", 1, (int64_t[]){41});
    kiln_value t = kiln_binary(g, "add", kiln_matmul(g, x, w), b);
    kiln_output(g, t, "t");
    kiln_output(g, kiln_unary(g, "sigmoid", kiln_binary(g, "mul", t, kiln_scalar(g, 3))), "y");
    char *log;
    Plan *p = plan(&P, true, &log);
    CHECK(p);
    const Schedule *s = p->sched;
    CHECK(s->nnodes == 3);
    EXPECT(s->nkernels == 1 && !strcmp(s->kernels[0].kernel, "extern_kernels.mm") &&
               s->kernels[0].n == 3,
           "one call with two epilogue members");
    EXPECT(strstr(log, "fusing op0 with op1 (epilogue of extern_kernels.mm)\n") &&
               strstr(log, "fusing op0_op1 with op2 (epilogue of extern_kernels.mm)\n"),
           "log: %s", log);
    if (s->nkernels == 1 && s->kernels[0].n == 3)
        EXPECT(s->kernels[0].store[0] == STORE_REGISTER && s->kernels[0].store[1] == STORE_GLOBAL &&
                   s->kernels[0].store[2] == STORE_GLOBAL,
               "stores");
    free(log);
    plan_free(p);
    check_both(&P, "chain");
    test_prog_free(&P);
}

/* The library's output is itself an output: the library writes it, and the
 * sibling epilogues (relu, sigmoid) write their own buffers. */
TEST(epilogue_stored_output_and_siblings) {
    Prog P = {0};
    kiln_graph *g = P.g = kiln_graph_new();
    kiln_value x = input(&P, "x", 3, (int64_t[]){3, 70, 20}),
               w = input(&P, "w", 2, (int64_t[]){20, 9});
    kiln_value mm = kiln_matmul(g, x, w); /* batched: blocks per batch */
    kiln_output(g, mm, "mm");
    kiln_output(g, kiln_unary(g, "relu", mm), "r");
    kiln_output(g, kiln_unary(g, "sigmoid", mm), "s");
    char *log;
    Plan *p = plan(&P, true, &log);
    CHECK(p);
    const Schedule *s = p->sched;
    EXPECT(s->nkernels == 1 && s->kernels[0].n == 3 && s->kernels[0].store[0] == STORE_GLOBAL,
           "%d calls", s->nkernels);
    if (s->nkernels != 1) print_calls(s);
    free(log);
    plan_free(p);
    check_both(&P, "stored_output_and_siblings");
    test_prog_free(&P);
}

/* ===== the library side ============================================================ */

/* A recording epilogue: each range must hold final values when it arrives
 * (want), every element must arrive once; it doubles what it sees. */
typedef struct {
    const float *want;
    int64_t n, unit;      /* ranges: whole units (rows, planes) ... */
    int64_t batch, block; /* ... inside one block of a batch (image) */
    unsigned char *seen;
    int bad_value, bad_range, calls;
} Rec;

static bool one_block(const Rec *r, int64_t start, int64_t count) {
    int64_t b = start / r->batch, lo = start - b * r->batch, hi = lo + count - 1;
    return hi < r->batch && lo / r->block == hi / r->block;
}

static void rec_epi(void *ctx, float *c, int64_t start, int64_t count) {
    Rec *r = ctx;
    int bad_value = 0, bad_range = 0;
    if (start < 0 || count < 1 || start + count > r->n || start % r->unit || count % r->unit ||
        !one_block(r, start, count))
        bad_range = 1;
    for (int64_t i = start; !bad_range && i < start + count; i++) {
        float d = c[i] - r->want[i];
        if (!(fabsf(d) <= 1e-4f * (1.0f + fabsf(r->want[i])))) bad_value = 1;
        c[i] *= 2.0f;
    }
#pragma omp critical
    {
        r->calls++;
        r->bad_value |= bad_value;
        r->bad_range |= bad_range;
        for (int64_t i = start; !bad_range && i < start + count; i++) r->seen[i]++;
    }
}

static void fill(float *p, int64_t n, uint64_t seed) { kiln_fill_randn(p, n, seed); }

/* After the call: every element seen once, doubled. */
static void expect_rec(Rec *r, const float *got, const char *what) {
    int64_t once = 0;
    for (int64_t i = 0; i < r->n; i++) once += r->seen[i] == 1;
    EXPECT(!r->bad_range && !r->bad_value && once == r->n,
           "%s: ranges %d values %d, %lld of %lld once", what, r->bad_range, r->bad_value,
           (long long)once, (long long)r->n);
    int bad = 0;
    for (int64_t i = 0; i < r->n && !bad && !r->bad_value; i++)
        bad = !(fabsf(got[i] - 2.0f * r->want[i]) <= 2e-4f * (1.0f + fabsf(r->want[i])));
    EXPECT(!bad, "%s: the epilogue's writes were lost", what);
}

TEST(epilogue_library_matmul_blocks) {
    /* batched, with an M that leaves a partial block, and N wide enough that
     * a block's epilogue runs in parallel pieces. A 2-D B is shared by every
     * batch, and the library folds the batches into one matrix of B * M rows
     * (ext_matmul_epi): its blocks then run across batches. A 3-D B (bb = B)
     * keeps a GEMM per batch, and blocks inside each batch. */
    static const struct {
        int64_t B, M, K, N, rows, bb;
    } cases[] = {
        {1, 300, 17, 520, 64, 1}, {2, 131, 9, 40, 64, 1}, {1, 300, 17, 33, 0, 1},
        {3, 5, 4, 3, 2, 1},       {2, 131, 9, 40, 64, 2}, {3, 5, 4, 3, 2, 3},
    };
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        int64_t B = cases[t].B, M = cases[t].M, K = cases[t].K, N = cases[t].N, bb = cases[t].bb;
        int64_t as[3] = {B, M, K}, bs[3] = {bb, K, N}, cs[3] = {B, M, N}, n = B * M * N;
        float *a = malloc(sizeof(float) * (size_t)(B * M * K)),
              *b = malloc(sizeof(float) * (size_t)(bb * K * N));
        float *want = malloc(sizeof(float) * (size_t)n), *c = malloc(sizeof(float) * (size_t)n);
        unsigned char *seen = calloc((size_t)n, 1);
        fill(a, B * M * K, 1 + t);
        fill(b, bb * K * N, 11 + t);
        ExtView av = test_dense_view(3, as);
        ExtView bv = bb > 1 ? test_dense_view(3, bs) : test_dense_view(2, bs + 1);
        CHECK(ext_matmul(a, &av, b, &bv, want, 3, cs) == 0);
        bool folded = bb == 1 && B > 1;
        int64_t m = folded ? B * M : M;                   /* rows of one GEMM */
        int64_t rows = cases[t].rows ? cases[t].rows : m; /* 0: the policy, one block here */
        Rec r = {want, n, N, m * N, rows * N, seen, 0, 0, 0};
        ext_set_epilogue_rows(cases[t].rows);
        int rc = ext_matmul_epi(a, &av, b, &bv, c, 3, cs, rec_epi, &r);
        ext_set_epilogue_rows(0);
        EXPECT(rc == 0, "case %zu: rc %d", t, rc);
        char what[64];
        snprintf(what, sizeof what, "matmul case %zu", t);
        expect_rec(&r, c, what);
        EXPECT(r.calls >= B * M / m * ((m + rows - 1) / rows), "%s: %d calls", what, r.calls);
        free(a), free(b), free(want), free(c), free(seen);
    }
}

/* c = a @ b by the definition, element by element through the views: the
 * oracle for the library's strided and folded calls. */
static void naive_matmul(const float *a, const ExtView *av, const float *b, const ExtView *bv,
                         float *c, int nb, const int64_t *cs) {
    int64_t batches = 1, M = cs[nb], N = cs[nb + 1], K = av->shape[av->rank - 1];
    for (int d = 0; d < nb; d++) batches *= cs[d];
    for (int64_t i = 0; i < batches; i++) {
        int64_t oa = av->offset, ob = bv->offset, rest = i;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t x = rest % cs[d];
            int da = d - (nb - (av->rank - 2)), db = d - (nb - (bv->rank - 2));
            if (da >= 0 && av->shape[da] != 1) oa += x * av->stride[da];
            if (db >= 0 && bv->shape[db] != 1) ob += x * bv->stride[db];
            rest /= cs[d];
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t nn = 0; nn < N; nn++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += (double)
                               a[oa + m * av->stride[av->rank - 2] + k * av->stride[av->rank - 1]] *
                           b[ob + k * bv->stride[bv->rank - 2] + nn * bv->stride[bv->rank - 1]];
                c[(i * M + m) * N + nn] = (float)acc;
            }
    }
}

TEST(matmul_library_batch_folding) {
    /* Views of a and b over 4096-float buffers: shared B folded into one
     * GEMM (the encoder's [128, 1, 256] rows of x, dense batches, a column
     * slice with row stride > K, a transposed A whose batches follow each
     * other), and views that must not fold: A broadcast over a batch,
     * padding between batches, a batched B; each against the naive loops. */
    static const struct {
        ExtView a, b;
        int nb;
        int64_t cs[4];
    } cases[] = {
        {{3, {16, 1, 12}, {12, 0, 1}, 0}, {2, {12, 10}, {10, 1}, 0}, 1, {16, 1, 10}},
        {{3, {3, 5, 7}, {35, 7, 1}, 2}, {3, {1, 7, 6}, {0, 1, 7}, 0}, 1, {3, 5, 6}},
        {{4, {2, 3, 4, 5}, {120, 40, 10, 1}, 3}, {2, {5, 9}, {9, 1}, 1}, 2, {2, 3, 4, 9}},
        {{3, {3, 4, 6}, {4, 1, 12}, 0}, {2, {6, 5}, {5, 1}, 0}, 1, {3, 4, 5}},
        {{2, {4, 6}, {6, 1}, 0}, {2, {6, 5}, {5, 1}, 0}, 1, {3, 4, 5}},
        {{3, {3, 4, 6}, {30, 6, 1}, 0}, {2, {6, 5}, {5, 1}, 0}, 1, {3, 4, 5}},
        {{3, {3, 4, 6}, {24, 6, 1}, 0}, {3, {3, 6, 5}, {30, 5, 1}, 0}, 1, {3, 4, 5}},
    };
    float *a = malloc(sizeof(float) * 4096), *b = malloc(sizeof(float) * 4096);
    float *got = malloc(sizeof(float) * 4096), *want = malloc(sizeof(float) * 4096);
    fill(a, 4096, 5);
    fill(b, 4096, 6);
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        const int64_t *cs = cases[t].cs;
        int nb = cases[t].nb;
        int64_t n = 1;
        for (int d = 0; d < nb + 2; d++) n *= cs[d];
        naive_matmul(a, &cases[t].a, b, &cases[t].b, want, nb, cs);
        EXPECT(ext_matmul(a, &cases[t].a, b, &cases[t].b, got, nb + 2, cs) == 0, "case %zu", t);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += !(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i])));
        EXPECT(bad == 0, "case %zu: %lld of %lld elements wrong", t, (long long)bad, (long long)n);
    }
    free(a), free(b), free(got), free(want);
}

TEST(epilogue_library_conv_slabs) {
    /* dense (one slab per image), grouped (per image and group), depthwise
     * (per plane), 1x1 (no im2col); all with a bias the epilogue must see */
    static const struct {
        int64_t n, c, o, k, groups, stride;
    } cases[] = {
        {2, 6, 4, 3, 1, 1}, {3, 6, 4, 3, 2, 2},   {2, 5, 5, 3, 5, 1},
        {2, 7, 3, 1, 1, 1}, {1, 16, 64, 3, 1, 1}, /* 64 planes of 40x40: the slab's epilogue in parallel pieces */
    };
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        int64_t N = cases[t].n, C = cases[t].c, O = cases[t].o, k = cases[t].k, G = cases[t].groups;
        int64_t H = 40, W = 40, st = cases[t].stride, pad = k / 2;
        int64_t oh = (H + 2 * pad - k) / st + 1, ow = (W + 2 * pad - k) / st + 1;
        int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / G, k, k}, ys[4] = {N, O, oh, ow};
        int64_t attr[7] = {st, st, pad, pad, 1, 1, G}, n = N * O * oh * ow;
        float *x = malloc(sizeof(float) * (size_t)(N * C * H * W));
        float *w = malloc(sizeof(float) * (size_t)(O * (C / G) * k * k)),
              *bias = malloc(sizeof(float) * (size_t)O);
        float *want = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        unsigned char *seen = calloc((size_t)n, 1);
        fill(x, N * C * H * W, 3 + t);
        fill(w, O * (C / G) * k * k, 13 + t);
        fill(bias, O, 23 + t);
        CHECK(ext_conv2d(x, xs, w, ws, bias, want, ys, attr) == 0);
        int64_t plane = oh * ow, slab = G == C && O == C ? plane : O / G * plane;
        Rec r = {want, n, plane, O * plane, slab, seen, 0, 0, 0};
        EXPECT(ext_conv2d_epi(x, xs, w, ws, bias, y, ys, attr, rec_epi, &r) == 0, "case %zu", t);
        char what[64];
        snprintf(what, sizeof what, "conv case %zu", t);
        expect_rec(&r, y, what);
        free(x), free(w), free(bias), free(want), free(y), free(seen);
    }
}

/* ===== vectorization =================================================================== */

/* The inner loops of the epilogue functions in source that GCC did not
 * vectorize (-1: the compile failed); *marks counts them. */
static int epilogue_loops_missed(const char *name, int tier, const char *source, int *marks) {
    char c[600], o[600], ename[300];
    char *report = NULL;
    snprintf(ename, sizeof ename, "epi_%s_t%d", name, tier);
    if (test_compile_report_with(ename, source, test_tier_flags(tier), c, o, &report) != 0)
        return -1;
    int missed = 0, line = 1;
    bool in_epi = false;
    *marks = 0;
    for (const char *p = source; *p; p++) {
        if (*p == '\n') {
            line++;
            if (!strncmp(p + 1, "static void epi_", 16))
                in_epi = true;
            else if (!strncmp(p + 1, "static ", 7) || !strncmp(p + 1, "int ", 4))
                in_epi = false;
            continue;
        }
        if (!in_epi || strncmp(p, CG_INNER_MARK, strlen(CG_INNER_MARK))) continue;
        (*marks)++;
        if (!test_vectorized_at(report, c, line, false)) {
            printf("  %s: epilogue loop at %s:%d not vectorized (%s)\n", name, c, line,
                   test_tier_flags(tier));
            missed++;
        }
    }
    free(report);
    return missed;
}

TEST(epilogue_inner_loops_vectorized) {
    static const struct {
        const char *name, *src;
    } progs[] = {
        {"seed", "input x: f32[300, 45]\nweight w: f32[45, 520] = randn(1)\n"
                 "y = relu((x + 1) @ w)\noutput y\n"},
        {"linear", "input x: f32[300, 70]\nweight w: f32[70, 77] = randn(1)\ninput b: f32[77]\n"
                   "y = gelu(x @ w + b)\noutput y\n"},
        {"conv_bn_relu",
         "input x: f32[2, 8, 13, 10]\nweight w: f32[6, 8, 3, 3] = randn(2)\n"
         "input m: f32[6]\ninput v: f32[6]\ninput g: f32[6]\ninput b: f32[6]\n"
         "input r: f32[2, 6, 13, 10]\n"
         "y = relu(batch_norm(conv2d(x, w, padding=1), m, v, g, b) + r)\noutput y\n"},
    };
    int total = 0, missed = 0;
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++) {
        kiln_graph *g = kiln_graph_new();
        CHECKF(kiln_parse(g, progs[i].src, progs[i].name) == KILN_OK, "%s", kiln_error(g));
        Plan *p = NULL;
        char err[512];
        KilnConfig cfg = config(true);
        CHECKF(plan_build(g, &cfg, &p, err, sizeof err) == KILN_OK, "%s", err);
        CgOutput out;
        CHECKF(cg_generate(p->sched, &out, err, sizeof err) == KILN_OK, "%s", err);
        /* at every tier, whether this CPU runs it or not */
        for (int t = TGT_V2; t <= TGT_V4; t++) {
            int marks = 0, m = epilogue_loops_missed(progs[i].name, t, out.source, &marks);
            EXPECT(m >= 0 && marks == 1, "%s: compile failed or %d epilogue loops (%s)",
                   progs[i].name, marks, test_tier_flags(t));
            total += marks;
            missed += m > 0 ? m : 0;
        }
        EXPECT(strstr(out.source, "static void epi_") != NULL, "%s: no epilogue", progs[i].name);
        cg_free(&out);
        plan_free(p);
        kiln_graph_free(g);
    }
    EXPECT(missed == 0, "%d of %d epilogue loops not vectorized", missed, total);
}
