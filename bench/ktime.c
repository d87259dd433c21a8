/*
 * ktime.c -- time kiln's fused run through the public API, optionally with
 * output memory reused between runs (not a test; bench/run and
 * bench/compare build and use it).
 *
 *   ktime PROG [--threads N] [--repeat R] [--reuse] [--paired-copy MIB]
 *         [-i NAME=FILE.npy]...
 *
 * kiln_program_run hands back freshly allocated outputs on every call, so
 * every run of a program with a large output first faults in and zeroes
 * every page of it (4 KiB pages: 32768 faults for 128 MiB). `kiln bench`
 * measures that, as a user of the API sees it. --reuse installs an
 * allocator (kiln_set_allocator) that keeps freed blocks of 1 MiB or more
 * and hands them back for the next allocation of the same size, so the
 * kernels write into memory that is already mapped: the kernels' own speed,
 * as ONNX Runtime with preallocated outputs or an arena allocator gets.
 *
 * --paired-copy MIB times bench/bw.c's copy loop (copy.h) over two MIB
 * buffers, with the same threads, before each run of the program: the
 * yardstick measured side by side with the program in one process, so that
 * a host that is slower for a minute slows both. Adds the best and median
 * copy bandwidth of those R runs (bytes read plus written per second, as
 * bw.c counts) to the output.
 *
 * The warm-up: one run, and on more than one thread as many as the
 * runtime's choice of team size needs to measure each size (team.c: a
 * first epoch per size and 3 settling runs after each change): at least
 * 12 runs and 0.2 s, at most 2 s. With one warm-up run, 8 runs of a 39 ms
 * matmul at 2 threads had 5 on 1 thread, while the runtime measured that
 * size, and their median was the 1-thread time.
 *
 * Prints one JSON line: median and min of R runs after the warm-up,
 * and the page faults per run (getrusage minor faults).
 */
#include "kiln.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include "copy.h"

/* One run of p; 0 (and the message) on failure. */
static int run_once(kiln_program *p, const kiln_tensor *in, kiln_tensor *out) {
    if (kiln_program_run(p, in, out) == KILN_OK) return 1;
    fprintf(stderr, "ktime: %s\n", kiln_program_error(p));
    return 0;
}

static void free_outputs(kiln_tensor *out, int no) {
    for (int i = 0; i < no; i++) kiln_tensor_free(&out[i]);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static long minor_faults(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

enum { SLOTS = 32, BIG = 1 << 20 };
static void *slot_p[SLOTS];
static size_t slot_n[SLOTS];

static void *reuse_alloc_locked(void *ud, void *ptr, size_t old, size_t n) {
    (void)ud;
    if (n == 0) {
        if (ptr && old >= BIG)
            for (int i = 0; i < SLOTS; i++)
                if (!slot_p[i]) {
                    slot_p[i] = ptr, slot_n[i] = old;
                    return NULL;
                }
        free(ptr);
        return NULL;
    }
    if (!ptr && n >= BIG)
        for (int i = 0; i < SLOTS; i++)
            if (slot_p[i] && slot_n[i] == n) {
                void *q = slot_p[i];
                slot_p[i] = NULL;
                return q;
            }
    return realloc(ptr, n);
}

static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

/* kiln calls the hook from several threads at once (kiln.h): the slots
 * under a lock. */
static void *reuse_alloc(void *ud, void *ptr, size_t old, size_t n) {
    pthread_mutex_lock(&slot_lock);
    void *r = reuse_alloc_locked(ud, ptr, old, n);
    pthread_mutex_unlock(&slot_lock);
    return r;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *prog = NULL, *bind[64];
    int threads = 1, repeat = 10, reuse = 0, nbind = 0;
    double copy_mib = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reuse"))
            reuse = 1;
        else if (!strcmp(argv[i], "--paired-copy") && i + 1 < argc)
            copy_mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "-i") && i + 1 < argc && nbind < 64)
            bind[nbind++] = argv[++i];
        else if (!prog && argv[i][0] != '-')
            prog = argv[i];
        else {
            fprintf(stderr,
                    "usage: ktime PROG [--threads N] [--repeat R] [--reuse] [--paired-copy MIB] "
                    "[-i NAME=FILE.npy]...\n");
            return 2;
        }
    }
    if (!prog) {
        fprintf(stderr, "ktime: no program\n");
        return 2;
    }
    if (repeat < 1) repeat = 1;
    if (repeat > 1000) repeat = 1000;
    if (reuse) kiln_set_allocator(reuse_alloc, NULL);
    kiln_graph *g = kiln_graph_new();
    if (!g || kiln_parse_file(g, prog) != KILN_OK) {
        fprintf(stderr, "ktime: %s\n", g ? kiln_error(g) : "out of memory");
        return 1;
    }
    int ni = kiln_num_inputs(g), no = kiln_num_outputs(g);
    kiln_tensor *in = calloc((size_t)ni + 1, sizeof *in),
                *out = calloc((size_t)no + 1, sizeof *out);
    for (int i = 0; i < ni; i++) {
        const char *name = kiln_input_name(g, i), *file = NULL;
        for (int b = 0; b < nbind; b++) {
            size_t l = strlen(name);
            if (!strncmp(bind[b], name, l) && bind[b][l] == '=') file = bind[b] + l + 1;
        }
        char err[1024];
        if (file) {
            if (kiln_npy_read(file, &in[i], err, sizeof err) != KILN_OK) {
                fprintf(stderr, "ktime: %s: %s\n", file, err);
                return 1;
            }
        } else {
            in[i] = kiln_input_desc(g, i);
            if (kiln_tensor_alloc(&in[i]) != KILN_OK) return 4;
            if (in[i].dtype == KILN_F32)
                kiln_fill_randn(in[i].data, kiln_tensor_numel(&in[i]), (uint64_t)i + 1);
            else
                memset(in[i].data, 0, kiln_tensor_numel(&in[i]) * kiln_dtype_size(in[i].dtype));
        }
    }
    kiln_options o = kiln_default_options();
    o.threads = threads;
    kiln_program *p = NULL;
    if (kiln_compile_with(g, &o, &p) != KILN_OK) {
        fprintf(stderr, "ktime: %s\n", kiln_error(g));
        return 3;
    }
    double *t = calloc((size_t)repeat, sizeof *t), *ct = calloc((size_t)repeat, sizeof *ct);
    size_t cn = copy_mib > 0 ? (size_t)(copy_mib * 1048576.0 / sizeof(float)) : 0;
    float *ca = NULL, *cb = NULL;
    if (cn) {
        ca = aligned_alloc(64, cn * sizeof(float));
        cb = aligned_alloc(64, cn * sizeof(float));
        if (!ca || !cb) {
            fprintf(stderr, "ktime: out of memory for the paired copy (2 x %.0f MiB)\n", copy_mib);
            return 4;
        }
        omp_set_num_threads(threads);
        bench_first_touch(ca, cb, cn);
    }
    long faults = 0;
    double w0 = now_ms();
    for (int w = 1; threads > 1 && (w < 12 || now_ms() - w0 < 200) && now_ms() - w0 < 2000; w++) {
        if (!run_once(p, in, out)) return 1;
        free_outputs(out, no);
    }
    for (int r = -1; r < repeat; r++) {
        if (cn) {
            double c0 = now_ms();
            bench_copy(cb, ca, cn);
            if (r >= 0) ct[r] = now_ms() - c0;
        }
        long f0 = minor_faults();
        double t0 = now_ms();
        if (!run_once(p, in, out)) return 1;
        double t1 = now_ms();
        if (r >= 0) t[r] = t1 - t0, faults += minor_faults() - f0;
        free_outputs(out, no);
    }
    qsort(t, (size_t)repeat, sizeof *t, cmp_d);
    double med = repeat % 2 ? t[repeat / 2] : (t[repeat / 2 - 1] + t[repeat / 2]) / 2;
    printf("{\"median_ms\": %.4f, \"min_ms\": %.4f, \"faults_per_run\": %.1f, \"threads\": %d, "
           "\"repeat\": %d, \"reuse\": %s",
           med, t[0], (double)faults / repeat, threads, repeat, reuse ? "true" : "false");
    if (cn) {
        qsort(ct, (size_t)repeat, sizeof *ct, cmp_d);
        double bytes = 2.0 * (double)cn * sizeof(float);
        double cmed = repeat % 2 ? ct[repeat / 2] : (ct[repeat / 2 - 1] + ct[repeat / 2]) / 2;
        printf(", \"copy_mib\": %.1f, \"copy_gbs\": %.3f, \"copy_gbs_median\": %.3f", copy_mib,
               bytes / (ct[0] * 1e6), bytes / (cmed * 1e6));
    }
    printf("}\n");
    kiln_program_free(p);
    for (int i = 0; i < ni; i++) kiln_tensor_free(&in[i]);
    kiln_graph_free(g);
    free(in);
    free(out);
    free(t);
    free(ct);
    free(ca);
    free(cb);
    return 0;
}
