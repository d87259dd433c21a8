/*
 * serve.c -- a soak benchmark of one compiled program shared by caller
 * threads, as a server runs a model (not a test; bench/serve builds and
 * runs it).
 *
 *   serve PROG [--callers T] [--threads N] [--fixed-threads]
 *         [--seconds S | --runs R] [--every SEC]
 *
 * Compiles PROG (.kiln, random normal inputs from fixed seeds) once with N
 * threads per run (default 1; --fixed-threads: every run on N, not fewer
 * where fewer measured faster), then T threads call kiln_program_run_into on
 * it at once, each with its own inputs and preallocated outputs, for S
 * seconds (default 10) or R runs each. Every SEC seconds (default 1) it
 * prints a line with the runs so far and the resident memory; at the end one
 * JSON line: runs, throughput (runs/s), p50 and p99 latency (ms, from a
 * histogram of 1 us buckets up to 1 s), and resident memory after the
 * first interval (the warm-up) and at the end.
 */
#include "kiln.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAXCALLERS = 64, MAXIO = 16, HIST = 1000000 }; /* 1 us buckets to 1 s */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Resident set size in KiB (/proc/self/statm), -1 if unknown. */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size, res;
    int ok = f && fscanf(f, "%ld %ld", &size, &res) == 2;
    if (f) fclose(f);
    return ok ? res * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

typedef struct {
    kiln_program *p;
    kiln_tensor in[MAXIO], out[MAXIO];
    int nin, nout;
    long runs, limit; /* limit 0: until stop */
    unsigned *hist;   /* latencies, 1 us buckets (the last: 1 s and more) */
    int failed;
} Caller;

static volatile int stop;

static void *caller(void *arg) {
    Caller *c = arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED) && (!c->limit || c->runs < c->limit)) {
        double t0 = now_s();
        if (kiln_program_run_into(c->p, c->in, c->out) != KILN_OK) {
            fprintf(stderr, "serve: run: %s\n", kiln_program_error(c->p));
            c->failed = 1;
            break;
        }
        long us = (long)((now_s() - t0) * 1e6);
        c->hist[us < HIST - 1 ? us : HIST - 1]++;
        __atomic_store_n(&c->runs, c->runs + 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* The latency (ms) at quantile q of the callers' histograms together. */
static double quantile(Caller *cs, int n, long total, double q) {
    long want = (long)ceil(q * (double)total), seen = 0;
    for (long b = 0; b < HIST; b++) {
        for (int i = 0; i < n; i++) seen += cs[i].hist[b];
        if (seen >= want && want > 0) return (double)(b + 1) / 1000.0;
    }
    return NAN;
}

static int usage(void) {
    fprintf(stderr, "usage: serve PROG [--callers T] [--threads N] [--fixed-threads] "
                    "[--seconds S | --runs R] [--every SEC]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *prog = argv[1];
    int callers = 1, threads = 1, fixed = 0;
    double seconds = 10, every = 1;
    long runs = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--fixed-threads")) {
            fixed = 1;
            continue;
        }
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--callers"))
            callers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--runs"))
            runs = atol(argv[++i]);
        else if (!strcmp(argv[i], "--every"))
            every = atof(argv[++i]);
        else
            return usage();
    }
    if (callers < 1 || callers > MAXCALLERS || threads < 1 || seconds <= 0 || every <= 0)
        return usage();
    kiln_graph *g = kiln_graph_new();
    if (kiln_parse_file(g, prog) != KILN_OK) {
        fprintf(stderr, "serve: %s\n", kiln_error(g));
        return 1;
    }
    kiln_options o = kiln_default_options();
    o.threads = threads;
    o.fixed_threads = fixed;
    kiln_program *p;
    if (kiln_compile_with(g, &o, &p) != KILN_OK) {
        fprintf(stderr, "serve: %s\n", kiln_error(g));
        return 1;
    }
    Caller *cs = calloc((size_t)callers, sizeof *cs);
    for (int c = 0; c < callers; c++) {
        Caller *k = &cs[c];
        k->p = p;
        k->limit = runs;
        k->nin = kiln_num_inputs(g);
        k->nout = kiln_num_outputs(g);
        k->hist = calloc(HIST, sizeof *k->hist);
        if (k->nin > MAXIO || k->nout > MAXIO || !k->hist) return 1;
        for (int i = 0; i < k->nin; i++) {
            k->in[i] = kiln_input_desc(g, i);
            kiln_tensor_alloc(&k->in[i]);
            kiln_fill_randn(k->in[i].data, kiln_tensor_numel(&k->in[i]),
                            100u * (uint64_t)c + (uint64_t)i);
        }
        for (int i = 0; i < k->nout; i++) {
            k->out[i] = kiln_output_desc(g, i);
            kiln_tensor_alloc(&k->out[i]);
        }
    }
    pthread_t th[MAXCALLERS];
    double t0 = now_s(), next = t0 + every;
    for (int c = 0; c < callers; c++) pthread_create(&th[c], NULL, caller, &cs[c]);
    long rss_warm = -1, rss_max = 0, rss = 0, total = 0;
    for (;;) {
        usleep(10000);
        double t = now_s();
        total = 0;
        int done = 1;
        for (int c = 0; c < callers; c++) {
            total += __atomic_load_n(&cs[c].runs, __ATOMIC_RELAXED);
            done &= cs[c].failed || (runs && cs[c].runs >= runs);
        }
        if (t >= next) {
            rss = rss_kib();
            if (rss_warm < 0) rss_warm = rss;
            if (rss > rss_max) rss_max = rss;
            printf("t=%.0fs runs=%ld rss=%.1fMiB\n", t - t0, total, (double)rss / 1024.0);
            fflush(stdout);
            next += every;
        }
        if (done || (!runs && t - t0 >= seconds)) break;
    }
    stop = 1;
    for (int c = 0; c < callers; c++) pthread_join(th[c], NULL);
    double elapsed = now_s() - t0;
    total = 0;
    int failed = 0;
    for (int c = 0; c < callers; c++) total += cs[c].runs, failed |= cs[c].failed;
    rss = rss_kib();
    if (rss_warm < 0) rss_warm = rss;
    printf("{\"program\": \"%s\", \"callers\": %d, \"threads\": %d, \"fixed\": %d, "
           "\"seconds\": %.2f, "
           "\"runs\": %ld, \"runs_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
           "\"rss_warm_mib\": %.2f, \"rss_end_mib\": %.2f, \"rss_max_mib\": %.2f, "
           "\"failed\": %d}\n",
           prog, callers, threads, fixed, elapsed, total, (double)total / elapsed,
           quantile(cs, callers, total, 0.5), quantile(cs, callers, total, 0.99),
           (double)rss_warm / 1024.0, (double)rss / 1024.0,
           (double)(rss_max > rss ? rss_max : rss) / 1024.0, failed);
    for (int c = 0; c < callers; c++) {
        for (int i = 0; i < cs[c].nin; i++) kiln_tensor_free(&cs[c].in[i]);
        for (int i = 0; i < cs[c].nout; i++) kiln_tensor_free(&cs[c].out[i]);
        free(cs[c].hist);
    }
    free(cs);
    kiln_program_free(p);
    kiln_graph_free(g);
    return failed;
}
