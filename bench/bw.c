/*
 * bw.c -- copy bandwidth of this machine, the yardstick of bench/run and
 * bench/compare (not a test).
 *
 *   cc -O3 -march=native -fopenmp bench/bw.c -o bw
 *   bw [--mib 512] [--threads 1,2] [--reps 7] [--kind copy,memcpy,read,fresh] [--json]
 *
 * copy:   dst[i] = src[i] over two float buffers of --mib MiB each, a plain
 *         loop the compiler vectorizes, with ordinary (write-allocate)
 *         stores -- the same kind of loads and stores kiln's kernels do.
 * memcpy: glibc memcpy of each thread's share (may use non-temporal stores
 *         on large blocks).
 * read:   a sum over one buffer (what a row reduction does).
 *
 * Bytes counted are bytes the program reads plus bytes it writes: a copy of
 * N bytes counts 2N (the hardware's read-for-ownership of the destination
 * is not counted, as kiln's byte counts do not count it either). Each
 * thread works on its own contiguous share and first-touches it. The
 * result is the best of --reps runs after one warm-up run, in GB/s (1e9).
 */
#define _GNU_SOURCE
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static volatile float sink;

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double run(const char *kind, float *a, float *b, size_t n) {
    double t0 = now_s();
    if (!strcmp(kind, "fresh")) {
        float *f = malloc(n * sizeof(float));
        if (!f) return 1e30;
        t0 = now_s();
        bench_copy(f, a, n);
        double t = now_s() - t0;
        sink = f[n / 2];
        free(f);
        return t;
    } else if (!strcmp(kind, "copy")) {
        bench_copy(b, a, n);
    } else if (!strcmp(kind, "memcpy")) {
#pragma omp parallel
        {
            size_t lo, hi;
            bench_range(n, &lo, &hi);
            memcpy(b + lo, a + lo, (hi - lo) * sizeof(float));
        }
    } else {
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
            size_t lo, hi;
            bench_range(n, &lo, &hi);
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (size_t i = lo; i < hi; i++) acc += a[i];
            total += acc;
        }
        sink = total;
    }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    double mib = 512;
    int reps = 7;
    const char *threads = "1,2", *kinds = "copy,memcpy,read,fresh";
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = argv[++i];
        else if (!strcmp(argv[i], "--kind") && i + 1 < argc)
            kinds = argv[++i];
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(
                stderr,
                "usage: bw [--mib N] [--threads 1,2] [--reps N] [--kind copy,memcpy,read,fresh] [--json]\n");
            return 2;
        }
    }
    size_t n = (size_t)(mib * 1048576.0 / sizeof(float));
    if (n < 1024) n = 1024;
    float *a = aligned_alloc(64, n * sizeof(float)), *b = aligned_alloc(64, n * sizeof(float));
    if (!a || !b) {
        fprintf(stderr, "bw: out of memory for 2 x %.0f MiB\n", mib);
        return 4;
    }
    if (json) printf("[");
    int first = 1;
    char tbuf[256];
    snprintf(tbuf, sizeof tbuf, "%s", threads);
    for (char *tp = strtok(tbuf, ","); tp; tp = strtok(NULL, ",")) {
        int nt = atoi(tp);
        omp_set_num_threads(nt);
        /* first touch by the threads that will use each share */
        bench_first_touch(a, b, n);
        char kbuf[256];
        snprintf(kbuf, sizeof kbuf, "%s", kinds);
        char *save = NULL;
        for (char *kp = strtok_r(kbuf, ",", &save); kp; kp = strtok_r(NULL, ",", &save)) {
            double ts[256];
            if (reps > 256) reps = 256;
            if (reps < 1) reps = 1;
            run(kp, a, b, n);
            for (int r = 0; r < reps; r++) ts[r] = run(kp, a, b, n);
            qsort(ts, (size_t)reps, sizeof ts[0], cmp_d);
            double best = ts[0];
            double med = reps % 2 ? ts[reps / 2] : (ts[reps / 2 - 1] + ts[reps / 2]) / 2;
            double bytes = (double)n * sizeof(float) * (strcmp(kp, "read") ? 2.0 : 1.0);
            double gbs = bytes / best / 1e9, gbs_med = bytes / med / 1e9;
            if (json)
                printf("%s{\"kind\": \"%s\", \"threads\": %d, \"mib\": %.1f, \"bytes\": %.0f, "
                       "\"best_s\": %.6f, \"gbs\": %.3f, \"median_s\": %.6f, \"gbs_median\": %.3f}",
                       first ? "" : ", ", kp, nt, mib, bytes, best, gbs, med, gbs_med);
            else
                printf("%-7s threads %d  buffer %7.1f MiB  best %8.2f GB/s  median %8.2f GB/s  "
                       "(%d runs, best %.3f ms)\n",
                       kp, nt, mib, gbs, gbs_med, reps, best * 1e3);
            first = 0;
        }
    }
    if (json) printf("]\n");
    free(a);
    free(b);
    return 0;
}
