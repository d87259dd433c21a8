/*
 * vecmath.c -- ns per element of src/codegen/vecmath.h's functions as kiln's
 * kernels call them, two versions of the header side by side (not a test).
 *
 *   bench/vecmath.sh [REV] [ROUNDS]   (REV's src/codegen/vecmath.h against the working tree's;
 *                                     VB_FLAGS="-march=x86-64-v3 -mtune=native": a tier)
 *
 * Built once per header with -DVB_SIDE=old or new (the kernels: a
 * `#pragma omp simd` loop over an in-cache array calling a declare-simd
 * wrapper, as src/codegen/codegen.c emits them), and once without (main), all with
 * the JIT's flags. main alternates the two sides in rounds and prints the
 * best time of each. Inputs: sin and cos on [-10, 10] (plus one row with
 * some |x| >= 4096 lanes), exp on [-10, 0] (softmax), erf and gelu on
 * N(0, 1), tanh and sigmoid on [-5, 5], log on (0, 10].
 */
#include <stdint.h>

#define VB_NFN 9

#ifdef VB_SIDE
#include "codegen/vecmath.h"

#define VB_CAT2(a, b) a##b
#define VB_CAT(a, b) VB_CAT2(a, b)
#define VB_WRAP(f)                                                                             \
    _Pragma("omp declare simd notinbranch")                                                    \
        __attribute__((noinline)) static float f##_v(float x) {                                \
        return f(x);                                                                           \
    }                                                                                          \
    __attribute__((noinline)) static void f##_loop(const float *restrict x, float *restrict y, \
                                                   long n) {                                   \
        _Pragma("omp simd") for (long i = 0; i < n; i++) y[i] = f##_v(x[i]);                   \
    }
VB_WRAP(kiln_sinf)
VB_WRAP(kiln_cosf)
VB_WRAP(kiln_expf)
VB_WRAP(kiln_logf)
VB_WRAP(kiln_tanhf)
VB_WRAP(kiln_erff)
VB_WRAP(kiln_sigmoid)
VB_WRAP(kiln_gelu)

void VB_CAT(vb_run_, VB_SIDE)(int fn, const float *x, float *y, long n) {
    static void (*const fns[VB_NFN])(const float *restrict, float *restrict, long) = {
        kiln_sinf_loop,  kiln_sinf_loop, kiln_cosf_loop,    kiln_expf_loop, kiln_logf_loop,
        kiln_tanhf_loop, kiln_erff_loop, kiln_sigmoid_loop, kiln_gelu_loop,
    };
    fns[fn](x, y, n);
}
#else
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void vb_run_old(int fn, const float *x, float *y, long n);
void vb_run_new(int fn, const float *x, float *y, long n);

static const char *const names[VB_NFN] = {
    "sin", "sin (1/64 big)", "cos", "exp", "log", "tanh", "erf", "sigmoid", "gelu",
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
}

static float normal(void) {
    float u = uniform(1e-7f, 1.0f), v = uniform(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Inputs of function fn, as a kernel would see them. */
static void fill(int fn, float *x, long n) {
    for (long i = 0; i < n; i++) {
        switch (fn) {
        case 1: x[i] = i % 64 == 0 ? 1e5f : uniform(-10, 10); break;
        case 3: x[i] = uniform(-10, 0); break;
        case 4: x[i] = uniform(1e-3f, 10); break;
        case 5:
        case 7: x[i] = uniform(-5, 5); break;
        case 6:
        case 8: x[i] = normal(); break;
        default: x[i] = uniform(-10, 10);
        }
    }
}

/* Best ns per element over reps passes of the array. */
static double time_ns(void (*run)(int, const float *, float *, long), int fn, const float *x,
                      float *y, long n, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        for (int k = 0; k < 20; k++) run(fn, x, y, n);
        t = (now_s() - t) / 20.0;
        if (t < best) best = t;
    }
    return best / (double)n * 1e9;
}

int main(int argc, char **argv) {
    enum { N = 4096 }; /* 16 KiB in, 16 KiB out: in L1/L2 */
    static float x[N], y[N];
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    double best[VB_NFN][2];
    for (int f = 0; f < VB_NFN; f++) best[f][0] = best[f][1] = 1e30;
    for (int round = 0; round < rounds; round++) {
        for (int f = 0; f < VB_NFN; f++) {
            srand(7 + f);
            fill(f, x, N);
            double a = time_ns(vb_run_old, f, x, y, N, 10);
            double b = time_ns(vb_run_new, f, x, y, N, 10);
            if (a < best[f][0]) best[f][0] = a;
            if (b < best[f][1]) best[f][1] = b;
        }
    }
    printf("%-16s %10s %10s %8s\n", "function", "old ns/elt", "new ns/elt", "speedup");
    for (int f = 0; f < VB_NFN; f++)
        printf("%-16s %10.3f %10.3f %7.2fx\n", names[f], best[f][0], best[f][1],
               best[f][0] / best[f][1]);
    return 0;
}
#endif
