/*
 * fuzz_diff.c -- differential fuzzing: random programs (tests/randprog.c)
 * run fused and interpreted until stopped; any disagreement is saved.
 *
 *   fuzz_diff [-o DIR] [-s SEED] [-n PROGRAMS] [-b BATCH]
 *
 * Seeds start at SEED (default: from the clock and pid, so every run
 * explores new programs) and go up by one. BATCH programs (default 50) are
 * compiled with one compiler run (rt_compile_many); when a batch does not
 * compile, its programs are compiled one by one to find the culprit. A
 * program whose fused result is outside rt_tolerance (src/ref/tolerance.c) of the
 * interpreter's, even with the reference's own spread added
 * (rt_reference_spread: ill-conditioned elements, see docs/tolerances.md),
 * or that fails to compile or run, is written to
 * DIR/seed_<N>.kiln (default DIR fuzz-out) with the failure as comments.
 * The inputs are the ones `kiln run --seed N` generates, so
 * `kiln run --check --seed N DIR/seed_<N>.kiln` reproduces it. One line per
 * batch goes to stdout. Stops after PROGRAMS programs (default: never); the exit
 * status is 1 when anything failed.
 *
 * Every fourth seed (seed % 4 == 3) is a program with f64 inputs
 * (randprog_f64).
 *
 * The JIT cache goes to DIR/cache unless KILN_CACHE_DIR is set: fuzzed
 * programs never repeat, so they should not fill the user's cache.
 */
#include "runtime/runtime.h"
#include "randprog.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCH 256
#define MAX_IO 64
#define PROG_CAP 8192

typedef struct {
    const char *dir;
    uint64_t seed;
    long long limit; /* programs to run; < 0: until stopped */
    int batch;
    long long ran, failed, conditioned; /* conditioned: programs passed with the spread */
} Fuzz;

typedef struct {
    uint64_t seed;
    char text[PROG_CAP];
    kiln_graph *g;
    RtProgram *p;
    char why[2048];      /* empty: passed */
    int64_t conditioned; /* elements over the tolerance that the reference's spread accepted */
} Prog;

/* ===== saving a failure ================================================== */

static void save(const Fuzz *f, const Prog *pr) {
    char path[1024];
    snprintf(path, sizeof path, "%s/seed_%llu.kiln", f->dir, (unsigned long long)pr->seed);
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "fuzz_diff: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(out,
            "# fuzz_diff: fused and interpreted results differ; reproduce with\n"
            "#   kiln run --check --seed %llu %s\n# ",
            (unsigned long long)pr->seed, path);
    for (const char *c = pr->why; *c; c++) fputs(*c == '\n' ? "\n# " : (char[2]){*c, 0}, out);
    fprintf(out, "\n%s", pr->text);
    fclose(out);
    printf("fuzz_diff: seed %llu FAILED (%s)\n", (unsigned long long)pr->seed, path);
}

/* ===== one program ========================================================= */

static double value(const kiln_tensor *t, int64_t k) {
    return t->dtype == KILN_BOOL  ? ((const unsigned char *)t->data)[k]
           : t->dtype == KILN_F64 ? ((const double *)t->data)[k]
                                  : ((const float *)t->data)[k];
}

/* Compare fused float outputs with the interpreter's tensors. An element
 * over the tolerance is measured again against the reference's own spread
 * (rt_reference_spread, computed once, only then): an ill-conditioned
 * element passes with it (pr->conditioned counts them), anything else
 * fails. */
static void compare(Prog *pr, void **got, const kiln_tensor *in, const kiln_tensor *want) {
    RtTolerance tol = rt_tolerance(rt_graph(pr->p));
    int nout = kiln_num_outputs(pr->g);
    /* a program of f64 inputs computes wholly in double, fused and
     * interpreted: its f64 outputs must agree to 1e-9, where float math
     * anywhere would be off by 1e-7 or more */
    bool all64 = true;
    for (int i = 0; i < kiln_num_inputs(pr->g); i++) all64 &= in[i].dtype == KILN_F64;
    kiln_tensor spread[MAX_IO];
    bool have = false;
    for (int i = 0; i < nout && !pr->why[0]; i++) {
        int64_t n = kiln_tensor_numel(&want[i]);
        for (int64_t k = 0; k < n; k++) {
            double w = value(&want[i], k);
            double g = want[i].dtype == KILN_F64 ? ((const double *)got[i])[k]
                                                 : ((const float *)got[i])[k];
            bool tight = all64 && want[i].dtype == KILN_F64;
            double x = rt_check_excess(want[i].dtype, g, w, 0.0f,
                                       tight ? (RtTolerance){1e-9, 1e-9, 1} : tol);
            if (x <= 1.0) continue;
            if (tight) {
                snprintf(pr->why, sizeof pr->why,
                         "output %s[%lld]: fused %.17g, interpreter %.17g (%.3g x the f64 "
                         "tolerance 1e-9)",
                         kiln_output_name(pr->g, i), (long long)k, g, w, x);
                break;
            }
            if (!have && rt_reference_spread(pr->g, in, want, RT_SPREAD_RUNS, spread) != KILN_OK) {
                snprintf(pr->why, sizeof pr->why, "reference spread: %s", kiln_error(pr->g));
                break;
            }
            have = true;
            float s = ((const float *)spread[i].data)[k];
            x = rt_check_excess(want[i].dtype, g, w, s, tol);
            if (x <= 1.0) {
                pr->conditioned++;
                continue;
            }
            snprintf(pr->why, sizeof pr->why,
                     "output %s[%lld]: fused %.9g, interpreter %.9g (%.3g x tolerance, "
                     "with the reference's spread %.3g)",
                     kiln_output_name(pr->g, i), (long long)k, g, w, x, s);
            break;
        }
    }
    if (have)
        for (int i = 0; i < nout; i++) kiln_tensor_free(&spread[i]);
}

/* Run a compiled program both ways on seeded inputs. */
static void check(Prog *pr) {
    int nin = kiln_num_inputs(pr->g), nout = kiln_num_outputs(pr->g);
    kiln_tensor in[MAX_IO], want[MAX_IO];
    float *fin[MAX_IO];
    void *got[MAX_IO];
    char err[512];
    if (nin > MAX_IO || nout > MAX_IO) return;
    for (int i = 0; i < nin; i++) {
        in[i] = kiln_input_desc(pr->g, i);
        kiln_tensor_alloc(&in[i]);
        /* the inputs `kiln run --seed N` generates (src/cli/main.c) */
        int64_t n = kiln_tensor_numel(&in[i]);
        uint64_t s = pr->seed * 0x9E3779B97F4A7C15ull + (uint64_t)i;
        if (in[i].dtype == KILN_F64) { /* the same normal values, as doubles */
            float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
            kiln_fill_randn(f, n, s);
            for (int64_t k = 0; k < n; k++) ((double *)in[i].data)[k] = f[k];
            free(f);
        } else {
            kiln_fill_randn(in[i].data, n, s);
        }
        fin[i] = in[i].data;
    }
    for (int i = 0; i < nout; i++) {
        kiln_tensor d = kiln_output_desc(pr->g, i);
        got[i] = malloc((d.dtype == KILN_F64 ? sizeof(double) : sizeof(float)) *
                        (size_t)(kiln_tensor_numel(&d) ? kiln_tensor_numel(&d) : 1));
    }
    if (rt_run(pr->p, (const float *const *)fin, (float **)got, err, sizeof err) != KILN_OK)
        snprintf(pr->why, sizeof pr->why, "fused run: %s", err);
    else if (kiln_interpret(pr->g, in, want) != KILN_OK)
        snprintf(pr->why, sizeof pr->why, "interpreter: %s", kiln_error(pr->g));
    else {
        compare(pr, got, in, want);
        for (int i = 0; i < nout; i++) kiln_tensor_free(&want[i]);
    }
    for (int i = 0; i < nout; i++) free(got[i]);
    for (int i = 0; i < nin; i++) kiln_tensor_free(&in[i]);
}

/* ===== a batch ============================================================== */

/* Compile one by one, to blame the program that breaks a batch. */
static void compile_each(Prog *ps, int n) {
    for (int i = 0; i < n; i++) {
        char err[sizeof ps[i].why];
        if (rt_compile(ps[i].g, NULL, &ps[i].p, err, sizeof err) != KILN_OK)
            snprintf(ps[i].why, sizeof ps[i].why, "compile: %.2000s", err);
    }
}

static void run_batch(Fuzz *f, Prog *ps, int n) {
    const Graph *gs[MAX_BATCH];
    RtProgram *rps[MAX_BATCH];
    JitLib *lib = NULL;
    char err[4096];
    for (int i = 0; i < n; i++) {
        ps[i] = (Prog){.seed = f->seed++};
        (ps[i].seed % 4 == 3 ? randprog_f64 : randprog)(ps[i].seed, ps[i].text, sizeof ps[i].text);
        ps[i].g = kiln_graph_new();
        if (kiln_parse(ps[i].g, ps[i].text, "randprog") != KILN_OK)
            snprintf(ps[i].why, sizeof ps[i].why, "parse: %s", kiln_error(ps[i].g));
        gs[i] = ps[i].g;
    }
    if (rt_compile_many(gs, n, NULL, rps, &lib, err, sizeof err) == KILN_OK)
        for (int i = 0; i < n; i++) ps[i].p = rps[i];
    else
        compile_each(ps, n);
    for (int i = 0; i < n; i++) {
        if (ps[i].p && !ps[i].why[0]) check(&ps[i]);
        if (ps[i].why[0])
            save(f, &ps[i]), f->failed++;
        else if (ps[i].conditioned)
            f->conditioned++;
        rt_free(ps[i].p);
        kiln_graph_free(ps[i].g);
    }
    jit_close(lib);
    f->ran += n;
}

/* ===== main ================================================================== */

static int usage(void) {
    fprintf(stderr, "usage: fuzz_diff [-o DIR] [-s SEED] [-n PROGRAMS] [-b BATCH]\n");
    return 2;
}

static int parse_args(Fuzz *f, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return 0;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "-o"))
            f->dir = v;
        else if (!strcmp(argv[i - 1], "-s"))
            f->seed = strtoull(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "-n"))
            f->limit = atoll(v);
        else if (!strcmp(argv[i - 1], "-b"))
            f->batch = atoi(v);
        else
            return 0;
    }
    return f->batch >= 1 && f->batch <= MAX_BATCH;
}

int main(int argc, char **argv) {
    Fuzz f = {.dir = "fuzz-out",
              .seed = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid() * 7919u,
              .limit = -1,
              .batch = 50};
    if (!parse_args(&f, argc, argv)) return usage();
    if (mkdir(f.dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_diff: cannot create %s: %s\n", f.dir, strerror(errno));
        return 2;
    }
    char cache[1024];
    snprintf(cache, sizeof cache, "%s/cache", f.dir);
    setenv("KILN_CACHE_DIR", cache, 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    static Prog ps[MAX_BATCH];
    printf("fuzz_diff: seeds from %llu, failures go to %s/\n", (unsigned long long)f.seed, f.dir);
    while (f.limit < 0 || f.ran < f.limit) {
        int n = f.limit < 0 || f.limit - f.ran >= f.batch ? f.batch : (int)(f.limit - f.ran);
        time_t t0 = time(NULL);
        run_batch(&f, ps, n);
        printf("fuzz_diff: %lld programs, %lld failed, %lld passed with the reference's spread "
               "(last batch %lds)\n",
               f.ran, f.failed, f.conditioned, (long)(time(NULL) - t0));
    }
    return f.failed != 0;
}
