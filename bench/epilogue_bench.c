/*
 * epilogue_bench.c -- what an extern epilogue costs (bench/run builds and
 * runs it; not a test).
 *
 *   epilogue_bench BARE.kiln FULL.kiln [--threads N] [--repeat R]
 *
 * BARE is the library call alone (y = x @ w, y = conv2d(x, w)); FULL is the
 * same call with a pointwise tail (bias + relu, batch norm + relu). Four
 * programs are compiled through the API and run side by side:
 *
 *   bare       BARE
 *   epilogue   FULL, the tail run on each output block inside the library
 *              call (kiln's default)
 *   separate   FULL with extern_epilogue = 0: the library call, then a
 *              kernel of its own for the tail (Inductor's schedule)
 *   control    BARE again, a program of its own: two copies of the same
 *              program differ side by side by where their buffers and kept
 *              weights landed (measured up to 7% for a conv at ResNet's
 *              layer4 shape, batch 8), the floor under the ratios above
 *
 * The inputs are generated once (kiln_fill_randn, the same seeds for both
 * programs), the outputs allocated once (kiln_program_run_into), so the
 * runs time the kernels, not page faults. After one warm-up run of each,
 * each of R rounds runs the four once, in turn, in an order shuffled
 * afresh each round (a rotation kept each program's predecessor fixed:
 * the control always ran right after the separate program, whose extra
 * pass leaves other data in the caches; with the shuffle the control
 * still measured +0.2% to +7.3% over the bare program in six runs of
 * layer4 at batch 8), so a burst of other load on a shared machine hits
 * all four alike; each time is the median of its R runs. The ratios epi/bare,
 * sep/bare and control/bare are also taken within each round and their
 * medians reported:
 * a paired comparison, which a slow stretch of the machine moves far less
 * than it moves a ratio of two medians. The epilogue and separate outputs
 * must agree (max_diff).
 *
 * The epilogue's own time: the library kernels are called through a table
 * of wrappers (rt_set_externs) that hand the library a timed epilogue, so
 * each run of `epilogue` also measures the time spent inside the epilogue
 * function itself (summed over the threads that ran pieces of it). Unlike
 * the ratios of whole runs, this does not move with where two programs'
 * buffers landed (the control's spread): it is what the epilogue costs,
 * while its output is in cache.
 *
 * Prints one JSON line: bare_ms, epi_ms, sep_ms (medians of the wall time),
 * their minimums, epi_over_bare, sep_over_bare (medians of the per-round
 * ratios), bare_cpu_ms, epi_cpu_ms, sep_cpu_ms (medians of the process CPU
 * time), control_ms and control_over_bare (the same for the control),
 * max_diff, threads, repeat, and epi_inside_ms (median time inside the
 * epilogue per run) and epi_inside_over_bare (median of that over the CPU
 * time of the bare run of the same round: both summed over the threads).
 */
#include "kiln.h"
#include "runtime/runtime.h" /* KilnRT and the library kernels: the timed epilogue */
#include "testing.h"         /* rt_set_externs */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BARE, EPI, SEP, CONTROL, VARIANTS };

typedef struct {
    kiln_graph *g;
    kiln_program *p;
    kiln_tensor *in, *out;
    int ni, no;
} Prog;

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void die(const char *what, const char *msg) {
    fprintf(stderr, "epilogue_bench: %s: %s\n", what, msg);
    exit(1);
}

/* Parse, make inputs (seeded by position) and outputs, compile. */
static void load(Prog *p, const char *file, int threads, int epilogue) {
    p->g = kiln_graph_new();
    if (!p->g || kiln_parse_file(p->g, file) != KILN_OK)
        die(file, p->g ? kiln_error(p->g) : "no memory");
    p->ni = kiln_num_inputs(p->g);
    p->no = kiln_num_outputs(p->g);
    p->in = calloc((size_t)p->ni + 1, sizeof *p->in);
    p->out = calloc((size_t)p->no + 1, sizeof *p->out);
    for (int i = 0; i < p->ni; i++) {
        p->in[i] = kiln_input_desc(p->g, i);
        if (kiln_tensor_alloc(&p->in[i]) != KILN_OK) die(file, "no memory");
        kiln_fill_randn(p->in[i].data, kiln_tensor_numel(&p->in[i]), (uint64_t)i + 1);
    }
    for (int i = 0; i < p->no; i++) {
        p->out[i] = kiln_output_desc(p->g, i);
        if (kiln_tensor_alloc(&p->out[i]) != KILN_OK) die(file, "no memory");
    }
    kiln_options o = kiln_default_options();
    o.threads = threads;
    o.extern_epilogue = epilogue;
    if (kiln_compile_with(p->g, &o, &p->p) != KILN_OK) die(file, kiln_error(p->g));
}

/* ---- the epilogue's own time ---- */

typedef struct {
    ExtEpilogue epi;
    void *ctx;
} Timed;

static double inside_ms; /* time inside epilogue calls since reset, summed over threads */

static void timed_epi(void *ctx, float *c, int64_t start, int64_t count) {
    const Timed *w = ctx;
    double t0 = clock_ms(CLOCK_MONOTONIC);
    w->epi(w->ctx, c, start, count);
    double t = clock_ms(CLOCK_MONOTONIC) - t0;
#pragma omp atomic
    inside_ms += t;
}

static int timed_mm(const float *a, const ExtView *av, const float *b, const ExtView *bv, float *c,
                    int crank, const int64_t *cshape, ExtEpilogue epi, void *ctx) {
    Timed w = {epi, ctx};
    return ext_matmul_epi(a, av, b, bv, c, crank, cshape, epi ? timed_epi : NULL, &w);
}

static int timed_conv2d(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                        const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                        ExtEpilogue epi, void *ctx) {
    Timed t = {epi, ctx};
    return ext_conv2d_epi(x, xs, w, ws, bias, y, ys, attr, epi ? timed_epi : NULL, &t);
}

static int timed_conv2d_const(const float *x, const int64_t xs[4], const float *w,
                              const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                              const int64_t attr[7], ExtEpilogue epi, void *ctx) {
    Timed t = {epi, ctx};
    return ext_conv2d_const_epi(x, xs, w, ws, bias, y, ys, attr, epi ? timed_epi : NULL, &t);
}

/* gather and conv_transpose2d: NULL, the library's (rt_run fills them in) */
static const KilnRT timed_externs = {timed_mm, timed_conv2d,      NULL, NULL, NULL,
                                     0,        timed_conv2d_const};

/* One run: wall time, and in *cpu the CPU time of all threads (with
 * OMP_WAIT_POLICY=passive idle threads sleep, so this is the work done;
 * unlike the wall time it does not grow while other jobs hold the cores). */
static double run_ms(Prog *p, double *cpu) {
    double c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID), t0 = clock_ms(CLOCK_MONOTONIC);
    if (kiln_program_run_into(p->p, p->in, p->out) != KILN_OK) die("run", kiln_program_error(p->p));
    double t = clock_ms(CLOCK_MONOTONIC) - t0;
    *cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return t;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static double max_diff(const kiln_tensor *a, const kiln_tensor *b) {
    const float *x = a->data, *y = b->data;
    double m = 0;
    for (int64_t i = 0; i < kiln_tensor_numel(a); i++) {
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

int main(int argc, char **argv) {
    const char *files[2] = {NULL, NULL};
    int threads = 1, repeat = 11, nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (nf < 2 && argv[i][0] != '-')
            files[nf++] = argv[i];
        else
            nf = 3;
    }
    if (nf != 2 || threads < 1 || repeat < 1 || repeat > 1000) {
        fprintf(stderr, "usage: epilogue_bench BARE.kiln FULL.kiln [--threads N] [--repeat R]\n");
        return 2;
    }
    rt_set_externs(&timed_externs);
    Prog p[VARIANTS];
    load(&p[BARE], files[0], threads, 1);
    load(&p[EPI], files[1], threads, 1);
    load(&p[SEP], files[1], threads, 0);
    load(&p[CONTROL], files[0], threads, 1);
    double *t[VARIANTS], *c[VARIANTS], med[VARIANTS], min[VARIANTS], cpu[VARIANTS], unused;
    for (int v = 0; v < VARIANTS; v++) {
        t[v] = calloc((size_t)repeat, sizeof(double));
        c[v] = calloc((size_t)repeat, sizeof(double));
        run_ms(&p[v], &unused);
    }
    double *ratio[4], *inside = calloc((size_t)repeat, sizeof(double));
    for (int i = 0; i < 4; i++) ratio[i] = calloc((size_t)repeat, sizeof(double));
    uint64_t rng = 0x9E3779B97F4A7C15u; /* fixed: the same orders every run */
    for (int r = 0; r < repeat; r++) {
        int order[VARIANTS];
        for (int k = 0; k < VARIANTS; k++) order[k] = k;
        for (int k = VARIANTS - 1; k > 0; k--) { /* Fisher-Yates, xorshift64 */
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            int j = (int)(rng % (uint64_t)(k + 1)), tmp = order[k];
            order[k] = order[j], order[j] = tmp;
        }
        for (int k = 0; k < VARIANTS; k++) {
            inside_ms = 0;
            t[order[k]][r] = run_ms(&p[order[k]], &c[order[k]][r]);
            if (order[k] == EPI) inside[r] = inside_ms;
        }
        ratio[3][r] = inside[r] / c[BARE][r]; /* both summed over the threads */
        ratio[0][r] = t[EPI][r] / t[BARE][r];
        ratio[1][r] = t[SEP][r] / t[BARE][r];
        ratio[2][r] = t[CONTROL][r] / t[BARE][r];
    }
    double epi_over = median(ratio[0], repeat), sep_over = median(ratio[1], repeat);
    double control_over = median(ratio[2], repeat), inside_over = median(ratio[3], repeat);
    double inside_med = median(inside, repeat);
    for (int v = 0; v < VARIANTS; v++) {
        med[v] = median(t[v], repeat);
        min[v] = t[v][0];
        cpu[v] = median(c[v], repeat);
    }
    printf("{\"bare_ms\": %.4f, \"epi_ms\": %.4f, \"sep_ms\": %.4f, \"bare_min_ms\": %.4f, "
           "\"epi_min_ms\": %.4f, \"sep_min_ms\": %.4f, \"epi_over_bare\": %.4f, "
           "\"sep_over_bare\": %.4f, \"bare_cpu_ms\": %.4f, \"epi_cpu_ms\": %.4f, "
           "\"sep_cpu_ms\": %.4f, \"control_ms\": %.4f, \"control_over_bare\": %.4f, "
           "\"max_diff\": %.3g, \"threads\": %d, \"repeat\": %d, \"epi_inside_ms\": %.4f, "
           "\"epi_inside_over_bare\": %.5f}\n",
           med[BARE], med[EPI], med[SEP], min[BARE], min[EPI], min[SEP], epi_over, sep_over,
           cpu[BARE], cpu[EPI], cpu[SEP], med[CONTROL], control_over,
           max_diff(&p[EPI].out[0], &p[SEP].out[0]), threads, repeat, inside_med, inside_over);
    return 0;
}
