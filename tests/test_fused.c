/*
 * test_fused.c -- the fused path (kiln_compile / kiln_program_run, the JIT,
 * the generated kernels) against the reference interpreter.
 *
 * Every example in examples/, every golden case in tests/golden/cases and
 * RAND_PROGRAMS random programs from tests/randprog.c (a fixed seed range)
 * run both ways on the same inputs, and every output must agree within the
 * per-op-class tolerance of rt_tolerance (src/ref/tolerance.c): pointwise programs
 * 1e-5 absolute + 1e-5 relative (vecmath.h is a few ulp from libm); programs
 * with a reduction or an extern over n elements 1e-5 sqrt(n) absolute +
 * 1e-4 relative (float sums in another order against the interpreter's
 * double accumulation). bool outputs must match exactly; NaN must meet NaN.
 *
 * Compile time: golden cases and random programs are compiled RAND_BATCH at
 * a time into one shared object (rt_compile_many), one compiler run per
 * batch instead of one per program, with up to four batches compiling at
 * once on separate threads. Examples go through the public kiln_compile one
 * by one. The JIT cache lives in this run's test_tmpdir(), so every run
 * compiles from scratch and a stale cache cannot hide a bug; set
 * KILN_TEST_CACHE_DIR to share one cache between runs (make test's normal
 * and ASan builds generate the same sources, so the second run then
 * compiles nothing).
 *
 * Set KILN_TEST_VERBOSE=1 to see per-program numbers (compile time, worst
 * error in units of the tolerance).
 */
#include "test.h"
#include "runtime/runtime.h"
#include "randprog.h"
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define RAND_PROGRAMS 500
#define RAND_BATCH 50
#define RAND_SEED0 1000 /* seeds RAND_SEED0 .. RAND_SEED0 + RAND_PROGRAMS - 1 */
#define MAX_IO 256

/* ===== environment ==================================================== */

static char saved_cache[1024];
static int had_cache;

/* Point the JIT cache at this run's scratch directory (restored by
 * leave_cache so other tests see the environment they expect). */
static void enter_cache(void) {
    const char *c = getenv("KILN_CACHE_DIR");
    had_cache = c != NULL;
    if (c) snprintf(saved_cache, sizeof saved_cache, "%s", c);
    char dir[600];
    const char *shared = getenv("KILN_TEST_CACHE_DIR");
    if (shared)
        snprintf(dir, sizeof dir, "%s", shared);
    else
        snprintf(dir, sizeof dir, "%s/fused-cache", test_tmpdir());
    setenv("KILN_CACHE_DIR", dir, 1);
}

static void leave_cache(void) {
    if (had_cache)
        setenv("KILN_CACHE_DIR", saved_cache, 1);
    else
        unsetenv("KILN_CACHE_DIR");
}

static int verbose(void) { return getenv("KILN_TEST_VERBOSE") != NULL; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ===== inputs and outputs ================================================= */

/* Deterministic inputs: standard normal floats, bools from a uniform draw. */
static int fill_inputs(const kiln_graph *g, kiln_tensor *in, uint64_t seed) {
    for (int i = 0; i < kiln_num_inputs(g); i++) {
        in[i] = kiln_input_desc(g, i);
        if (kiln_tensor_alloc(&in[i]) != KILN_OK) return 0;
        int64_t n = kiln_tensor_numel(&in[i]);
        if (in[i].dtype == KILN_F32) {
            kiln_fill_randn(in[i].data, n, seed + (uint64_t)i);
            continue;
        }
        if (in[i].dtype == KILN_F64) { /* normal values near 1000, as gen.py's f64 cases */
            float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
            if (!f) return 0;
            kiln_fill_randn(f, n, seed + (uint64_t)i);
            for (int64_t k = 0; k < n; k++) ((double *)in[i].data)[k] = 1000.0 + 1e-6 * f[k];
            free(f);
            continue;
        }
        for (int64_t k = 0; k < n; k++)
            ((unsigned char *)in[i].data)[k] = ((k * 2654435761u + seed) >> 7) & 1;
    }
    return 1;
}

static void free_tensors(kiln_tensor *t, int n) {
    for (int i = 0; i < n; i++) kiln_tensor_free(&t[i]);
}

static double value_at(const kiln_tensor *t, int64_t k) {
    if (t->dtype == KILN_BOOL) return ((const unsigned char *)t->data)[k];
    if (t->dtype == KILN_F64) return ((const double *)t->data)[k];
    return ((const float *)t->data)[k];
}

/* Worst excess of got over want (1 = at the tolerance); *at its index. */
static double worst_excess(const kiln_tensor *got, const kiln_tensor *want, RtTolerance tol,
                           int64_t *at) {
    double worst = 0.0;
    int64_t n = kiln_tensor_numel(want);
    *at = 0;
    for (int64_t k = 0; k < n; k++) {
        double g = value_at(got, k), w = value_at(want, k), x;
        if (want->dtype == KILN_BOOL)
            x = (g != 0.0) != (w != 0.0) ? INFINITY : 0.0;
        else if (want->dtype == KILN_F64) /* both compute in double */
            x = rt_excess(g, w, (RtTolerance){1e-10, 1e-12, 1});
        else
            x = rt_excess((float)g, (float)w, tol);
        if (!(x <= worst)) worst = x, *at = k;
    }
    return worst;
}

/* Compare every output; report the worst one. Returns the worst excess. */
static double compare_all(const char *what, const kiln_graph *g, RtTolerance tol,
                          const kiln_tensor *got, const kiln_tensor *want) {
    double worst = 0.0;
    for (int i = 0; i < kiln_num_outputs(g); i++) {
        int64_t at;
        double x = worst_excess(&got[i], &want[i], tol, &at);
        if (x > 1.0)
            printf("  %s: output %s[%lld]: fused %.9g, interpreter %.9g (%.3g x tolerance: atol "
                   "%.2g rtol %.2g)\n",
                   what, kiln_output_name(g, i), (long long)at, value_at(&got[i], at),
                   value_at(&want[i], at), x, tol.atol, tol.rtol);
        if (!(x <= worst)) worst = x;
    }
    return worst;
}

/* Run an RtProgram on tensors: bool inputs become 0/1 floats; outputs are
 * float tensors (bool outputs stay 0/1 floats), f64 ones double tensors. */
static int run_rt(RtProgram *p, const kiln_tensor *in, kiln_tensor *out, char *err, size_t errlen) {
    const Graph *dec = rt_graph(p);
    int nin = kiln_num_inputs(dec), nout = kiln_num_outputs(dec), ok = 0;
    const float *fin[MAX_IO] = {0};
    float *fout[MAX_IO] = {0}, *owned[MAX_IO] = {0};
    for (int i = 0; i < nin; i++) {
        if (in[i].dtype == KILN_F32 || in[i].dtype == KILN_F64) {
            fin[i] = in[i].data;
            continue;
        }
        int64_t n = kiln_tensor_numel(&in[i]);
        owned[i] = malloc(sizeof(float) * (size_t)n);
        for (int64_t k = 0; owned[i] && k < n; k++) owned[i][k] = ((unsigned char *)in[i].data)[k];
        fin[i] = owned[i];
    }
    for (int i = 0; i < nout; i++) {
        out[i] = kiln_output_desc(dec, i);
        if (out[i].dtype != KILN_F64) out[i].dtype = KILN_F32;
        if (kiln_tensor_alloc(&out[i]) != KILN_OK) goto done;
        fout[i] = out[i].data;
    }
    ok = rt_run(p, fin, fout, err, errlen) == KILN_OK;
done:
    for (int i = 0; i < nin; i++) free(owned[i]);
    return ok;
}

/* ===== one program, the public way ========================================= */

/* Compile (for target tier `target`, NULL: the default) and run g fused
 * and interpreted on the same inputs; 1 if they agree. */
static int check_graph_for(const char *what, kiln_graph *g, kiln_tensor *in, const char *target) {
    kiln_program *p = NULL;
    kiln_tensor got[MAX_IO], want[MAX_IO];
    int nout = kiln_num_outputs(g), ok = 0;
    if (nout > MAX_IO) nout = MAX_IO;
    double t0 = now_ms();
    kiln_options o = kiln_default_options();
    o.target = target;
    if (kiln_compile_with(g, &o, &p) != KILN_OK) {
        printf("  %s: compile: %s\n", what, kiln_error(g));
        return 0;
    }
    double ms = now_ms() - t0;
    if (kiln_program_run(p, in, got) != KILN_OK) {
        printf("  %s: run: %s\n", what, kiln_program_error(p));
        kiln_program_free(p);
        return 0;
    }
    if (kiln_interpret(g, in, want) == KILN_OK) {
        RtTolerance tol = rt_tolerance(rt_graph(kiln_program_rt(p)));
        double x = compare_all(what, g, tol, got, want);
        ok = x <= 1.0;
        if (verbose())
            printf("%s: compile %.0f ms (%s), worst %.3g x tolerance\n", what, ms,
                   rt_stats(kiln_program_rt(p))->cache_hit ? "cached" : "cc", x);
        free_tensors(want, nout);
    } else {
        printf("  %s: interpret: %s\n", what, kiln_error(g));
    }
    free_tensors(got, nout);
    kiln_program_free(p);
    return ok;
}

/* ===== examples ================================================================ */

static int is_kiln_file(const char *name) {
    size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, ".kiln") == 0;
}

static int check_graph(const char *what, kiln_graph *g, kiln_tensor *in) {
    return check_graph_for(what, g, in, NULL);
}

/* Every example fused (for tier target, NULL: the default) against the
 * interpreter; the number that ran in *ran, returns the number that
 * failed. */
static int check_examples(const char *target, int *ran) {
    DIR *d = opendir("examples");
    int failed = 0;
    *ran = 0;
    if (!d) return 1;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_kiln_file(e->d_name)) continue;
        char path[600], what[700];
        snprintf(path, sizeof path, "examples/%s", e->d_name);
        snprintf(what, sizeof what, "%s%s%s", e->d_name, target ? " at " : "",
                 target ? target : "");
        kiln_graph *g = kiln_graph_new();
        kiln_tensor in[MAX_IO];
        if (kiln_parse_file(g, path) != KILN_OK) {
            printf("  %s: %s\n", path, kiln_error(g));
            failed++;
        } else if (kiln_num_inputs(g) <= MAX_IO && fill_inputs(g, in, 42)) {
            (*ran)++;
            failed += !check_graph_for(what, g, in, target);
            free_tensors(in, kiln_num_inputs(g));
        }
        kiln_graph_free(g);
    }
    closedir(d);
    return failed;
}

TEST(fused_examples) {
    enter_cache();
    int ran, failed = check_examples(NULL, &ran);
    leave_cache();
    EXPECT(ran >= 10, "only %d examples ran", ran);
    EXPECT(failed == 0, "%d of %d examples differ from the interpreter", failed, ran);
}

/* ===== batches: many programs, one compiler run each, on parallel threads ===== */

/* One program of a suite: its graph, inputs and compiled form. */
typedef struct {
    char name[300];
    const char *text; /* the program, printed when it fails (may be NULL) */
    kiln_graph *g;
    kiln_tensor in[MAX_IO];
    int nin;
    RtProgram *p;
} Case;

typedef struct {
    Case *cases;
    int n;
    int nbatches;
    JitLib **libs;         /* one per batch */
    char (*err)[2048];     /* per batch: why it failed to compile */
    int next;              /* the next batch to compile (atomic) */
    const KilnConfig *cfg; /* NULL: the default configuration */
} Suite;

static void *compile_worker(void *arg) {
    Suite *s = arg;
    for (int b; (b = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED)) < s->nbatches;) {
        int first = b * RAND_BATCH, n = s->n - first < RAND_BATCH ? s->n - first : RAND_BATCH;
        const Graph *gs[RAND_BATCH];
        RtProgram *ps[RAND_BATCH];
        for (int i = 0; i < n; i++) gs[i] = s->cases[first + i].g;
        if (rt_compile_many(gs, n, s->cfg, ps, &s->libs[b], s->err[b], sizeof s->err[b]) != KILN_OK)
            continue;
        for (int i = 0; i < n; i++) s->cases[first + i].p = ps[i];
    }
    return NULL;
}

/* Compile every case, RAND_BATCH programs per compiler run, on up to four
 * threads (the compiler runs are separate processes). Returns the number of
 * batches that failed (each reported). */
static int suite_compile(Suite *s) {
    s->nbatches = (s->n + RAND_BATCH - 1) / RAND_BATCH;
    s->libs = calloc((size_t)s->nbatches + 1, sizeof(JitLib *));
    s->err = calloc((size_t)s->nbatches + 1, sizeof *s->err);
    s->next = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus, failed = 0;
    pthread_t th[4];
    int started = 0;
    for (int t = 0; t < nt; t++)
        started += pthread_create(&th[started], NULL, compile_worker, s) == 0;
    if (!started) compile_worker(s);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    for (int b = 0; b < s->nbatches; b++)
        if (s->err[b][0]) {
            printf("  batch %d (%s...): compile: %s\n", b, s->cases[b * RAND_BATCH].name,
                   s->err[b]);
            failed++;
        }
    return failed;
}

static void suite_free(Suite *s) {
    for (int i = 0; i < s->n; i++) {
        rt_free(s->cases[i].p);
        free_tensors(s->cases[i].in, s->cases[i].nin);
        kiln_graph_free(s->cases[i].g);
    }
    for (int b = 0; s->libs && b < s->nbatches; b++) jit_close(s->libs[b]);
    free(s->libs);
    free(s->err);
    free(s->cases);
}

/* Fused vs interpreted for one compiled case; 1 when they agree. */
static int case_check(Case *c) {
    kiln_tensor got[MAX_IO], want[MAX_IO];
    char err[512];
    int nout = kiln_num_outputs(c->g), ok = 0;
    if (!c->p) return 0; /* its batch failed to compile (reported) */
    if (!run_rt(c->p, c->in, got, err, sizeof err))
        printf("  %s: run: %s\n", c->name, err);
    else if (kiln_interpret(c->g, c->in, want) != KILN_OK)
        printf("  %s: interpret: %s\n", c->name, kiln_error(c->g));
    else {
        double x = compare_all(c->name, c->g, rt_tolerance(rt_graph(c->p)), got, want);
        ok = x <= 1.0;
        free_tensors(want, nout);
        if (verbose()) printf("%s: worst %.3g x tolerance\n", c->name, x);
    }
    if (!ok && c->text) printf("  program:\n%s", c->text);
    free_tensors(got, nout);
    return ok;
}

/* Compile and check a whole suite; returns the number of failures. */
static int suite_run(Suite *s, const char *what) {
    double t0 = now_ms();
    int failed = suite_compile(s);
    double t1 = now_ms();
    for (int i = 0; i < s->n; i++) failed += s->cases[i].p && !case_check(&s->cases[i]);
    if (verbose())
        printf("%s: %d programs, compile %.1f s, check %.1f s\n", what, s->n, (t1 - t0) / 1e3,
               (now_ms() - t1) / 1e3);
    return failed;
}

/* ===== golden cases ================================================================ */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* The golden case's inputs from its .npy files (as test_golden.c reads them). */
static int read_inputs(const char *dir, Case *c) {
    for (int i = 0; i < kiln_num_inputs(c->g); i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s.npy", dir, kiln_input_name(c->g, i));
        if (kiln_npy_read(path, &c->in[i], err, sizeof err) != KILN_OK) {
            printf("  %s: %s\n", c->name, err);
            return 0;
        }
        c->nin = i + 1;
    }
    return 1;
}

/* Parse case `name` into c; 0 (reported) when its files are broken. */
static int golden_load(const char *root, const char *name, Case *c) {
    char dir[800], prog[900];
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(prog, sizeof prog, "%s/prog.kiln", dir);
    c->g = kiln_graph_new();
    if (kiln_parse_file(c->g, prog) != KILN_OK) {
        printf("  %s: %s\n", name, kiln_error(c->g));
        return 0;
    }
    return kiln_num_inputs(c->g) <= MAX_IO && read_inputs(dir, c);
}

TEST(fused_golden_cases) {
    char root[512], index[600], line[256];
    snprintf(root, sizeof root, "%s/golden/cases", test_srcdir());
    snprintf(index, sizeof index, "%s/index.txt", root);
    FILE *f = fopen(index, "r");
    CHECKF(f, "cannot open %s", index);
    Suite s = {.cases = calloc(1024, sizeof(Case))};
    int bad = 0;
    while (s.n < 1024 && fgets(line, sizeof line, f)) {
        char *name = trim(line);
        if (!*name || *name == '#') continue;
        if (golden_load(root, name, &s.cases[s.n]))
            s.n++;
        else
            bad++, kiln_graph_free(s.cases[s.n].g), free_tensors(s.cases[s.n].in, s.cases[s.n].nin),
                memset(&s.cases[s.n], 0, sizeof(Case));
    }
    fclose(f);
    enter_cache();
    int failed = suite_run(&s, "golden cases");
    leave_cache();
    EXPECT(s.n >= 50, "only %d golden cases", s.n);
    EXPECT(failed + bad == 0, "%d of %d golden cases differ fused vs interpreted", failed + bad,
           s.n + bad);
    suite_free(&s);
}

/* ===== random programs ================================================================ */

/* Random programs seeds RAND_SEED0 .. + count - 1 into a suite; the
 * number that did not parse (reported) in *bad. */
static Suite random_suite_of(size_t (*gen)(uint64_t, char *, size_t), int count, char (*text)[4096],
                             int *bad) {
    Suite s = {.cases = calloc((size_t)count, sizeof(Case))};
    *bad = 0;
    for (int i = 0; i < count; i++) {
        Case *c = &s.cases[s.n];
        uint64_t seed = RAND_SEED0 + (uint64_t)i;
        gen(seed, text[i], sizeof text[i]);
        snprintf(c->name, sizeof c->name, "seed %llu", (unsigned long long)seed);
        c->text = text[i];
        c->g = kiln_graph_new();
        if (kiln_parse(c->g, text[i], "randprog") != KILN_OK) {
            printf("  %s: %s\n%s", c->name, kiln_error(c->g), text[i]);
            kiln_graph_free(c->g);
            (*bad)++;
            continue;
        }
        c->nin = kiln_num_inputs(c->g);
        fill_inputs(c->g, c->in, seed);
        s.n++;
    }
    return s;
}

static Suite random_suite(int count, char (*text)[4096], int *bad) {
    return random_suite_of(randprog, count, text, bad);
}

TEST(fused_random_programs) {
    static char text[RAND_PROGRAMS][4096];
    int bad;
    Suite s = random_suite(RAND_PROGRAMS, text, &bad);
    EXPECT(bad == 0, "%d random programs did not parse", bad);
    enter_cache();
    int failed = suite_run(&s, "random programs");
    leave_cache();
    EXPECT(s.n == RAND_PROGRAMS, "only %d of %d random programs parsed", s.n, RAND_PROGRAMS);
    EXPECT(failed == 0, "%d random programs differ fused vs interpreted", failed);
    suite_free(&s);
}

/* The same with a dim of 0 in about half the inputs (randprog_empty):
 * every op of the generator on empty values, and the results that are not
 * empty but read one (reductions over nothing, concats with an empty
 * part), fused against interpreted. Both take decompose.c's rule for
 * empty values; tests/test_empty.c checks that rule against analytic
 * values. Here: no program is refused, none crashes, and every output of
 * the compiled program matches the interpreter's. */
#define EMPTY_PROGRAMS 100
TEST(fused_random_programs_empty) {
    static char text[EMPTY_PROGRAMS][4096];
    int bad, empties = 0;
    Suite s = random_suite_of(randprog_empty, EMPTY_PROGRAMS, text, &bad);
    EXPECT(bad == 0, "%d random programs with empty inputs did not parse", bad);
    for (int i = 0; i < s.n; i++)
        for (int k = 0; k < s.cases[i].nin; k++)
            empties += kiln_tensor_numel(&s.cases[i].in[k]) == 0;
    EXPECT(empties >= EMPTY_PROGRAMS / 4, "only %d empty inputs", empties);
    enter_cache();
    int failed = suite_run(&s, "random programs with empty inputs");
    leave_cache();
    EXPECT(failed == 0, "%d random programs with empty inputs differ fused vs interpreted", failed);
    suite_free(&s);
}

/* ===== threads ============================================================================ */

/* Run p with n threads into fresh float outputs. */
static int run_threads(RtProgram *p, int n, const kiln_tensor *in, kiln_tensor *out) {
    char err[256];
    rt_set_threads(n);
    int ok = run_rt(p, in, out, err, sizeof err);
    if (!ok) printf("  %d threads: %s\n", n, err);
    return ok;
}

static int bit_identical(const kiln_tensor *a, const kiln_tensor *b) {
    return memcmp(a->data, b->data, sizeof(float) * (size_t)kiln_tensor_numel(a)) == 0;
}

/* One program at 1 and 2 threads: within tolerance (sums may split
 * differently); random values bit for bit. */
static int thread_case(const char *src, int exact) {
    kiln_graph *g = kiln_graph_new();
    kiln_tensor in[MAX_IO], a[MAX_IO], b[MAX_IO];
    RtProgram *p = NULL;
    char err[1024];
    int ok = 0;
    if (kiln_parse(g, src, "threads") != KILN_OK || !fill_inputs(g, in, 7)) {
        printf("  %s\n", kiln_error(g));
        kiln_graph_free(g);
        return 0;
    }
    int nout = kiln_num_outputs(g);
    if (rt_compile(g, NULL, &p, err, sizeof err) != KILN_OK)
        printf("  compile: %s\n", err);
    else if (run_threads(p, 1, in, a)) {
        if (run_threads(p, 2, in, b)) {
            RtTolerance tol = rt_tolerance(rt_graph(p));
            ok = compare_all("1 vs 2 threads", g, tol, b, a) <= 1.0;
            for (int i = 0; exact && i < nout; i++) ok &= bit_identical(&a[i], &b[i]);
            free_tensors(b, nout);
        }
        free_tensors(a, nout);
    }
    rt_free(p);
    free_tensors(in, kiln_num_inputs(g));
    kiln_graph_free(g);
    return ok;
}

TEST(fused_thread_count_independent) {
    enter_cache();
    EXPECT(
        thread_case("input x: f32[256, 1000]\ny = softmax(x, dim=1)\nz = sum(x)\noutput y, z\n", 0),
        "softmax / full sum differ across thread counts");
    EXPECT(thread_case("input x: f32[300, 517]\ny = layer_norm(x, [517])\noutput y\n", 0),
           "layer_norm differs across thread counts");
    EXPECT(thread_case("input x: f32[512, 513]\nu = rand_like(x, seed=3)\n"
                       "d = dropout(x, p=0.5, seed=9)\noutput u, d\n",
                       1),
           "random values differ across thread counts");
    EXPECT(thread_case("input x: f32[1024, 64]\ny = sin(relu(x + 1) * 2)\noutput y\n", 1),
           "a pointwise chain differs across thread counts");
    rt_set_threads(0);
    leave_cache();
}

/* ===== edge cases of the runtime ============================================================= */

/* Outputs that are inputs, repeated names for one value, scalars, bools. */
TEST(fused_outputs_copied_and_converted) {
    enter_cache();
    static const char *progs[] = {
        "input x: f32[3, 5]\noutput x\n",
        "input x: f32[3, 5]\ny = x * 2\nz = y\noutput y, z, x\n",
        "input x: f32[7]\ny = sum(x)\noutput y\n",
        "input x: f32[4, 6]\nb = x > 0\nc = logical_not(b)\noutput b, c\n",
        "input m: bool[4, 6]\ninput x: f32[4, 6]\ny = where(m, x, -x)\noutput y, m\n",
        "input x: f32[2, 3]\nweight w: f32[2, 3] = randn(5)\ny = x + w\noutput y, w\n",
        "input x: f32[1, 1, 1]\ny = exp(x)\noutput y\n",
        /* conv operands the library cannot take as they are: packed */
        "input x: f32[1, 3, 8, 9]\ninput w: f32[4, 3, 3, 3]\ninput bb: f32[8]\n"
        "y = conv2d(transpose(x, 2, 3), w, slice(bb, 0, 0, 8, step=2), padding=1)\noutput y\n",
        /* matmul of a transposed input and a broadcast batch */
        "input a: f32[3, 5]\ninput b: f32[2, 3, 4]\ny = transpose(a, 0, 1) @ b\noutput y\n",
        /* tiled transposes with partial tiles, column reductions with partial blocks */
        "input x: f32[45, 70]\ny = transpose(x, 0, 1) * 2 + 1\nc = mean(x, dim=0)\n"
        "d = amin(transpose(x, 0, 1), dim=1)\noutput y, c, d\n",
        "input x: f32[3, 130, 300]\ny = sum(x, dim=1)\nz = permute(x, [0, 2, 1]) - 1\noutput y, z\n",
        /* rows too long for scratch on the stack: malloc'd, serially and per thread */
        "input x: f32[3, 5000]\ny = softmax(x, dim=1)\noutput y\n",
        "input x: f32[64, 5000]\ny = softmax(x, dim=1)\noutput y\n",
        /* a whole-tensor reduction big enough to run in parallel, then its consumer */
        "input x: f32[300, 301]\nm = amax(x)\ns = sum(x)\ny = x * s - m\noutput y, m, s\n",
    };
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++) {
        kiln_graph *g = kiln_graph_new();
        kiln_tensor in[MAX_IO];
        char what[32];
        snprintf(what, sizeof what, "program %zu", i);
        if (kiln_parse(g, progs[i], what) != KILN_OK)
            EXPECT(0, "%s: %s", what, kiln_error(g));
        else if (fill_inputs(g, in, 3)) {
            EXPECT(check_graph(what, g, in), "%s differs", what);
            free_tensors(in, kiln_num_inputs(g));
        }
        kiln_graph_free(g);
    }
    leave_cache();
}

TEST(fused_rejects_bad_inputs) {
    enter_cache();
    kiln_graph *g = kiln_graph_new();
    kiln_program *p = NULL;
    CHECK(kiln_parse(g, "input x: f32[2, 3]\ny = x + 1\noutput y\n", "bad") == KILN_OK);
    CHECKF(kiln_compile(g, 1, &p) == KILN_OK, "%s", kiln_error(g));
    float data[6] = {0};
    kiln_tensor in = {KILN_F32, 2, {3, 2}, data}, out[1];
    EXPECT(kiln_program_run(p, &in, out) == KILN_ERR_INPUT, "a wrong shape was accepted");
    EXPECT(strstr(kiln_program_error(p), "expected f32[2, 3], got f32[3, 2]") != NULL,
           "message: %s", kiln_program_error(p));
    in.shape[0] = 2, in.shape[1] = 3;
    EXPECT(kiln_program_run(p, &in, out) == KILN_OK, "%s", kiln_program_error(p));
    EXPECT(((float *)out[0].data)[5] == 1.0f, "x + 1 of zeros");
    kiln_tensor_free(&out[0]);
    kiln_program_free(p);
    kiln_graph_free(g);
    leave_cache();
}

/* ===== row pairs ============================================================================ */

/* Compile src (one input) and run it on x into out; 1 on success. */
static int run_one(const char *src, float *x, kiln_tensor *out, kiln_graph **gout) {
    kiln_graph *g = kiln_graph_new();
    kiln_program *p = NULL;
    int ok = 0;
    if (kiln_parse(g, src, "pairs") != KILN_OK || kiln_compile(g, 0, &p) != KILN_OK) {
        printf("  %s\n", kiln_error(g));
    } else {
        kiln_tensor in = kiln_input_desc(g, 0);
        in.data = x;
        ok = kiln_program_run(p, &in, out) == KILN_OK;
        if (!ok) printf("  run: %s\n", kiln_program_error(p));
    }
    kiln_program_free(p);
    if (ok && gout)
        *gout = g;
    else
        kiln_graph_free(g);
    return ok;
}

/* Row reductions over long rows run two rows per iteration (codegen.c's row
 * pairs): NaN in the second row of a pair only (row 3), in the first only
 * (row 4), an infinity in row 1; max and min exactly the interpreter's, the
 * sums within tolerance, and every row bit for bit what the same program
 * gives over 511 rows, which runs one row at a time (an odd count). */
TEST(fused_row_pairs) {
    enter_cache();
    setenv("KILN_ROW_PAIRS", "1", 1); /* on whatever the CPU (codegen_row_pairs_switch) */
    static const char *paired = "input x: f32[512, 1024]\nm = amax(x, dim=1)\nn = amin(x, dim=1)\n"
                                "s = sum(x, dim=1)\nv = mean(x * x, dim=1)\noutput m, n, s, v\n";
    static const char *single = "input x: f32[511, 1024]\nm = amax(x, dim=1)\nn = amin(x, dim=1)\n"
                                "s = sum(x, dim=1)\nv = mean(x * x, dim=1)\noutput m, n, s, v\n";
    float *x = malloc(sizeof(float) * 512 * 1024);
    kiln_fill_randn(x, 512 * 1024, 5);
    x[3 * 1024 + 700] = NAN;
    x[4 * 1024 + 3] = NAN;
    x[1 * 1024 + 9] = INFINITY;
    kiln_graph *g = NULL;
    kiln_tensor got[4], one[4], want[4];
    CHECK(run_one(paired, x, got, &g));
    CHECK(run_one(single, x, one, NULL));
    kiln_tensor in = kiln_input_desc(g, 0);
    in.data = x;
    CHECK(kiln_interpret(g, &in, want) == KILN_OK);
    RtTolerance tol = {1e-4 * 32, 1e-4, 1024}; /* rt_tolerance for sums of 1024 */
    EXPECT(compare_all("row pairs", g, tol, got, want) <= 1.0,
           "row pairs differ from the interpreter");
    for (int o = 0; o < 4; o++)
        for (int r = 0; r < 511; r++) {
            float a = ((float *)got[o].data)[r], b = ((float *)one[o].data)[r];
            float w = ((float *)want[o].data)[r];
            EXPECT(!memcmp(&a, &b, sizeof a), "output %d row %d: %.9g in pairs, %.9g alone", o, r,
                   a, b);
            if (o < 2)
                EXPECT(a == w || (isnan(a) && isnan(w)), "max/min row %d: %.9g, want %.9g", r, a,
                       w);
        }
    EXPECT(isnan(((float *)got[0].data)[3]) && isnan(((float *)got[0].data)[4]) &&
               !isnan(((float *)got[0].data)[2]) && !isnan(((float *)got[0].data)[5]),
           "NaN rows of amax");
    EXPECT(isinf(((float *)got[0].data)[1]), "amax of the row holding +inf");
    free_tensors(got, 4);
    free_tensors(one, 4);
    free_tensors(want, 4);
    kiln_graph_free(g);
    free(x);
    unsetenv("KILN_ROW_PAIRS");
    leave_cache();
}

/* Row pairs over a merged row nest (16 x 64 rows of 1024): 1 and 2 threads
 * agree bit for bit (a row is never split between threads). */
TEST(fused_row_pairs_threads) {
    enter_cache();
    setenv("KILN_ROW_PAIRS", "1", 1);
    EXPECT(
        thread_case("input x: f32[16, 64, 1024]\nm = amax(x, dim=2)\ns = sum(relu(x + 1), dim=2)\n"
                    "output m, s\n",
                    1),
        "row pairs differ across thread counts");
    unsetenv("KILN_ROW_PAIRS");
    rt_set_threads(0);
    leave_cache();
}

/* ===== division by a loop-invariant value ====================================================== */

/* x / amax(x) per row: codegen divides by a row's value as a multiply by
 * its reciprocal (div_by_invariant), which must stay within 2 ulp of the
 * quotient and give what the division gives for every divisor, including
 * tiny ones whose reciprocal would overflow (below 2^-128), zero, infinite
 * and NaN. The oracle is the quotient in double, rounded once. */
TEST(fused_divide_by_row_value) {
    enter_cache();
    enum { R = 8, C = 64 };
    static const char *src =
        "input x: f32[8, 64]\ns = amax(x, dim=1, keepdim=true)\ny = x / s\noutput y\n";
    static float x[R * C];
    kiln_fill_randn(x, R * C, 11);
    for (int j = 0; j < C; j++) {
        x[1 * C + j] = ldexpf((float)(j % 7 + 1), -149); /* denormals: max 7 * 2^-149 */
        x[2 * C + j] = 0.0f;                             /* 0 / 0 */
        x[4 * C + j] = (float)j;
        x[5 * C + j] = -ldexpf((float)(j % 5 + 3), -110); /* max -3 * 2^-110: scaled */
        x[6 * C + j] = ldexpf((float)(j + 1), -140);      /* max 2^-134, denormal */
        x[7 * C + j] = 1e36f * (float)(j + 1);            /* max 6.4e37 */
    }
    x[3 * C + 5] = INFINITY; /* x / inf = 0, inf / inf = NaN */
    x[4 * C + 9] = NAN;      /* the max is NaN */
    kiln_tensor got[1];
    CHECK(run_one(src, x, got, NULL));
    const float *y = got[0].data;
    for (int r = 0; r < R; r++) {
        float s = -INFINITY;
        for (int j = 0; j < C; j++)
            s = isnan(x[r * C + j]) || isnan(s) ? NAN : fmaxf(s, x[r * C + j]);
        for (int j = 0; j < C; j++) {
            float q = (float)((double)x[r * C + j] / (double)s), v = y[r * C + j];
            float ulp = fabsf(nextafterf(q, INFINITY) - q);
            bool ok = isnan(q) ? isnan(v) : isinf(q) ? v == q : fabsf(v - q) <= 2.0f * ulp;
            EXPECT(ok, "row %d col %d: %.9g / %.9g = %.9g, fused %.9g", r, j, x[r * C + j], s, q,
                   v);
            if (!ok) r = R;
            if (!ok) break;
        }
    }
    free_tensors(got, 1);
    leave_cache();
}

/* ===== streamed stores ========================================================================= */

/* Outputs of at least 16 MiB go out through tiles and non-temporal stores
 * (codegen.c, streamed stores; test_codegen.c checks which kernels do):
 * a flat pointwise loop in blocks with a short last block, softmax rows of
 * an odd length (rows start unaligned), a 2-D loop whose rows are split
 * into blocks, a streamed output that a later stage of its row reads
 * again (from the tile), and row stages streamed vector by vector. Each against the interpreter, and relu(x + 1)
 * exactly against its definition. */
TEST(fused_streamed_stores) {
    enter_cache();
    static const char *const progs[] = {
        "input x: f32[2049, 2049]\ny = relu(x + 1)\noutput y\n",
        "input x: f32[1025, 4099]\ny = softmax(x, dim=1)\noutput y\n",
        "input x: f32[257, 16411]\ninput b: f32[16411]\ny = x * b\noutput y\n",
        "input x: f32[1100, 4096]\nm = amax(x, dim=1, keepdim=true)\ne = exp(x - m)\n"
        "s = sum(e, dim=1, keepdim=true)\ny = e / s\noutput e, y\n",
        /* expensive math: tiles of 128, the last of each row 3 long, each
         * asking for x 1024 ahead (past the end: not) */
        "input x: f32[1025, 4099]\ny = gelu(x) + sin(x)\noutput y\n",
        "input x: f32[2049, 2049]\ny = exp(x) * 2\noutput y\n",
        /* rows of a multiple of 16: the last stage streams each vector as
         * it computes it (kiln_stream16) */
        "input x: f32[1024, 4112]\ny = layer_norm(x, [4112])\noutput y\n",
        /* not streamed; the second pass in blocks of 256, the last of 233 */
        "input x: f32[33, 1001]\ninput g: f32[1001]\ny = layer_norm(x, [1001], g)\noutput y\n",
    };
    for (int i = 0; i < (int)(sizeof progs / sizeof progs[0]); i++) {
        kiln_graph *g = kiln_graph_new();
        kiln_tensor in[MAX_IO];
        CHECK(kiln_parse(g, progs[i], "stream") == KILN_OK && fill_inputs(g, in, 40 + (uint64_t)i));
        EXPECT(check_graph(progs[i], g, in), "streamed program %d differs from the interpreter", i);
        if (i == 0) {
            kiln_program *p = NULL;
            kiln_tensor out[1];
            CHECK(kiln_compile(g, 0, &p) == KILN_OK && kiln_program_run(p, in, out) == KILN_OK);
            const float *x = in[0].data, *y = out[0].data;
            int64_t bad = -1;
            for (int64_t k = 0; k < 2049 * 2049 && bad < 0; k++) {
                float w = x[k] + 1.0f;
                if (memcmp(&y[k], &(float){w < 0.0f ? 0.0f : w}, sizeof(float))) bad = k;
            }
            EXPECT(bad < 0, "relu(x + 1)[%lld] = %.9g", (long long)bad, bad < 0 ? 0.0 : y[bad]);
            kiln_tensor_free(&out[0]);
            kiln_program_free(p);
        }
        free_tensors(in, kiln_num_inputs(g));
        kiln_graph_free(g);
    }
    leave_cache();
}

/* The blocked second pass of a row kernel in 16 lanes (codegen.c,
 * spread_stage): sum, product, max and min over rows of 1024 (lanes) and
 * 1000 (not), 600 rows (past CG_ROW_PF_MIN, so that the rows prefetch and
 * the pass runs in blocks), with NaN in two rows and -inf in one for max and min,
 * against the interpreter. */
TEST(fused_lane_reductions) {
    enter_cache();
    static const char *const red[] = {"sum", "prod", "amax", "amin"};
    for (int r = 0; r < 4; r++)
        for (int len = 1000; len <= 1024; len += 24) {
            char src[300];
            snprintf(src, sizeof src,
                     "input x: f32[600, %d]\nm = mean(x, dim=1, keepdim=true)\n"
                     "a = %s(%s, dim=1, keepdim=true)\ny = x * a\noutput y\n",
                     len, red[r], r == 1 ? "1 + (x - m) * 0.001" : "x - m");
            kiln_graph *g = kiln_graph_new();
            kiln_tensor in[MAX_IO];
            CHECK(kiln_parse(g, src, "lanes") == KILN_OK && fill_inputs(g, in, 120 + (uint64_t)r));
            float *x = in[0].data;
            if (r >= 2) {
                x[3 * len + 517] = NAN;      /* a lane in the middle of a block */
                x[40 * len + len - 1] = NAN; /* the last element */
                x[9 * len + 200] = -INFINITY;
            }
            EXPECT(check_graph(src, g, in), "%s over rows of %d differs from the interpreter",
                   red[r], len);
            free_tensors(in, kiln_num_inputs(g));
            kiln_graph_free(g);
        }
    leave_cache();
}

/* Each of the n programs, named name in messages, its inputs from seed +
 * its index, fused against the interpreter. */
static void check_programs(const char *const *progs, int n, const char *name, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        kiln_graph *g = kiln_graph_new();
        kiln_tensor in[MAX_IO];
        CHECK(kiln_parse(g, progs[i], name) == KILN_OK && fill_inputs(g, in, seed + (uint64_t)i));
        EXPECT(check_graph(progs[i], g, in), "program %d differs from the interpreter", i);
        free_tensors(in, kiln_num_inputs(g));
        kiln_graph_free(g);
    }
}
/* A padded pool whose guarded loads feed another padded pool (found by
 * make fuzz-diff, seed 1795995102551586): the second pool's kernel reads
 * the first's padded input at two depths under one guard, and GCC 12,
 * free to choose, vectorized the depth loop around it wrongly (-O3 wrong,
 * -O1 right; a whole channel came out shifted, or inf from the -inf pad).
 * Such a nest now runs its innermost loop under `omp simd` (codegen.c,
 * emit_branch). The fuzzed program, a reduction of it, and the same
 * pattern in 2-D, each against the interpreter. Then the same GCC fault
 * in a reduction kernel whose reduced extent is 1 (seed 1796004187422012:
 * layer_norm over a dim of 1 of a concat with relu), where the guarded
 * loads sit in the row nest's last loop (codegen.c, nest_text): the fuzzed
 * program and two reductions of it. */
TEST(fused_guarded_outer_loop) {
    enter_cache();
    static const char *const progs[] = {
        "input v0: f32[8, 4, 3, 2, 7]\ninput v1: f32[1]\nv3 = v1 + v0\n"
        "v4 = max_pool3d(v3, [2, 1, 1], stride=[1, 1, 2], padding=[1, 0, 0], ceil_mode=true)\n"
        "v7 = avg_pool3d(v4, [2, 1, 1], stride=[1, 2, 1], padding=[1, 0, 0], ceil_mode=true, "
        "count_include_pad=true)\nv9 = v7 * v7\noutput v9\n",
        "input v0: f32[1, 2, 3, 2, 7]\ninput v1: f32[1]\nv3 = v1 + v0\n"
        "v4 = max_pool3d(v3, [2, 1, 1], stride=[1, 1, 2], padding=[1, 0, 0], ceil_mode=true)\n"
        "v7 = avg_pool3d(v4, [2, 1, 1], stride=[1, 2, 1], padding=[1, 0, 0], ceil_mode=true, "
        "count_include_pad=true)\noutput v7\n",
        "input x: f32[3, 5, 4, 9]\ny = max_pool2d(x + 1, [2, 1], stride=[1, 2], padding=[1, 0])\n"
        "z = avg_pool2d(y, [2, 1], stride=[1, 1], padding=[1, 0], count_include_pad=true)\noutput z\n",
        "input v0: f32[33, 17, 5, 1, 1]\nv1 = cat([v0, relu(v0)], dim=-4)\n"
        "v2 = where(v1 > v1, v1, v1 * 0.5)\nv3 = layer_norm(v2, [1])\nv4 = avg_pool3d(v1, [1, 1, 1], "
        "stride=[2, 2, 2], padding=[0, 0, 0], ceil_mode=false, count_include_pad=false)\n"
        "v7 = v3 * v2\nv11 = amax(v7, dim=[0], keepdim=true)\nv12 = where(v11 > v11, v11, v11 * 0.5)\n"
        "output v12, v4\n",
        "input v0: f32[33, 17, 5, 1, 1]\nv1 = cat([v0, relu(v0)], dim=-4)\n"
        "v2 = where(v1 > v1, v1, v1 * 0.5)\nv3 = layer_norm(v2, [1])\nv7 = v3 * v2\n"
        "v11 = amax(v7, dim=[0], keepdim=true)\noutput v11\n",
        "input x: f32[8, 4, 3, 1]\ny = cat([x, relu(x)], dim=1)\nz = layer_norm(y * 0.5, [1])\n"
        "m = amax(z * y, dim=[0], keepdim=true)\noutput m\n",
    };
    check_programs(progs, (int)(sizeof progs / sizeof progs[0]), "guarded", 90);
    leave_cache();
}

/* Serial kernels whose first loop is split where a concat's guards change
 * (codegen.c, row_nest_text), against the interpreter: concats along dim
 * 0, one seen reversed, one under a padded dim 0, a BiLSTM's output (the
 * forward steps in order, the backward ones reversed, side by side). */
TEST(fused_outer_loop_split) {
    enter_cache();
    static const char *const progs[] = {
        "input a: f32[3, 40]\ninput b: f32[5, 40]\ninput c: f32[2, 40]\n"
        "y = exp(cat([a, b * 2, c], dim=0))\noutput y\n",
        "input a: f32[3, 40]\ninput b: f32[5, 40]\ninput c: f32[2, 40]\n"
        "y = slice(cat([a, b, c], dim=0), 0, -1, -1000, step=-1) + 1\noutput y\n",
        "input a: f32[2, 7, 9]\ninput b: f32[3, 7, 9]\n"
        "y = pad(cat([a, b], dim=0), [0, 0, 0, 0, 2, 1]) * 0.5\noutput y\n",
        "input f0: f32[1, 16]\ninput f1: f32[1, 16]\ninput f2: f32[1, 16]\n"
        "input r0: f32[1, 16]\ninput r1: f32[1, 16]\ninput r2: f32[1, 16]\n"
        "y = cat([cat([f0, f1, f2], dim=0), cat([r2, r1, r0], dim=0)], dim=1)\noutput y\n",
    };
    check_programs(progs, (int)(sizeof progs / sizeof progs[0]), "split", 120);
    leave_cache();
}

/* The inner loops split where their guards change (codegen.c,
 * inner_splits), fused against the interpreter: a pool's padded input, a
 * pad on each side alone, a concat along the last dim, a reflect pad. */
TEST(fused_inner_loop_split) {
    enter_cache();
    static const char *const progs[] = {
        "input x: f32[2, 8, 64, 60]\ny = max_pool2d(relu(x), 3, stride=2, padding=1)\noutput y\n",
        "input x: f32[40, 50]\ny = pad(x, [3, 0]) * 2\noutput y\n",
        "input x: f32[40, 50]\ny = pad(x, [0, 5], value=-1) + 1\noutput y\n",
        "input a: f32[3, 40]\ninput b: f32[3, 24]\ny = cat([a, b], dim=1)\noutput y\n",
        "input a: f32[6, 7]\ninput b: f32[6, 30]\ninput c: f32[6, 1]\n"
        "y = exp(cat([a, b, c], dim=1))\noutput y\n",
        "input x: f32[5, 33]\ny = pad(x, [2, 2], mode=\"reflect\") * 3\noutput y\n",
    };
    check_programs(progs, (int)(sizeof progs / sizeof progs[0]), "inner", 121);
    leave_cache();
}

/* ===== every target tier =============================================================== */

/* The examples and the first TIER_PROGRAMS random programs again at every
 * tier this CPU runs besides the default one (the tests above ran that),
 * fused against the interpreter. A tier this CPU cannot run is only
 * compiled and checked for vectorization (test_codegen.c, vectorize_check.sh);
 * the output says so. */
#define TIER_PROGRAMS 100

TEST(fused_every_tier) {
    static char text[TIER_PROGRAMS][4096];
    KilnConfig def = kiln_config_default();
    unsigned have = tgt_cpu_features();
    int tested = 0;
    for (int t = TGT_V2; t <= TGT_V4; t++) {
        char err[512], miss[400];
        KilnConfig cfg = def;
        const char *name = tgt_name((TargetTier)t);
        if (tgt_make((TargetTier)t, have, &cfg.target, err, sizeof err) != KILN_OK) {
            printf("fused_every_tier: %s not run: this CPU lacks %s\n", name,
                   tgt_missing(tgt_tier_needs((TargetTier)t), have, miss, sizeof miss));
            continue;
        }
        if ((int)def.target.tier == t) {
            printf("fused_every_tier: %s is the default tier: fused_examples and "
                   "fused_random_programs ran it\n",
                   name);
            tested++;
            continue;
        }
        enter_cache();
        int ran, failed = check_examples(name, &ran), bad;
        Suite s = random_suite(TIER_PROGRAMS, text, &bad);
        s.cfg = &cfg;
        int rfailed = suite_run(&s, name);
        leave_cache();
        printf("fused_every_tier: %s: %d examples and %d random programs against the interpreter, "
               "%d differ\n",
               name, ran, s.n, failed + rfailed);
        EXPECT(ran >= 10 && s.n == TIER_PROGRAMS, "%s: only %d examples and %d programs ran", name,
               ran, s.n);
        EXPECT(failed + rfailed + bad == 0, "%s: %d examples and %d random programs differ", name,
               failed, rfailed + bad);
        suite_free(&s);
        tested++;
    }
    EXPECT(tested >= 1, "no tier ran on this CPU");
}
