/*
 * copy.h -- the copy loop that is the yardstick of bench/run and
 * bench/compare, shared by bench/bw.c (the bandwidth probe) and
 * bench/ktime.c (--paired-copy: the copy timed beside a kiln program in one
 * process). Both must be built with the same flags (-O3 -march=native
 * -fopenmp) so the yardstick is the same loop.
 */
#ifndef KILN_BENCH_COPY_H
#define KILN_BENCH_COPY_H

#include <omp.h>
#include <stddef.h>

/* This thread's contiguous share of n floats, a multiple of 16 long. */
static void bench_range(size_t n, size_t *lo, size_t *hi) {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t per = (n / (size_t)nt + 15) & ~(size_t)15;
    *lo = per * (size_t)t;
    *hi = *lo + per;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* First touch of both buffers by the threads that will copy each share. */
static void bench_first_touch(float *a, float *b, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        bench_range(n, &lo, &hi);
        for (size_t i = lo; i < hi; i++) a[i] = (float)(i & 1023), b[i] = 0;
    }
}

/* dst[i] = src[i]: a plain loop the compiler vectorizes, with ordinary
 * (write-allocate) stores, like kiln's kernels. */
static void bench_copy(float *dst, const float *src, size_t n) {
#pragma omp parallel
    {
        size_t lo, hi;
        bench_range(n, &lo, &hi);
        float *restrict d = dst;
        const float *restrict s = src;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) d[i] = s[i];
    }
}

#endif
