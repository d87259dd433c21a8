/*
 * kiln_rt.h -- what generated code shares with the library, defined once.
 *
 * This header is real C on both sides of the JIT: the library includes it
 * (through base.h), and the code generator pastes its text into the
 * prelude of every generated source (the Makefile embeds it as
 * kiln_rt_src.inc, as it does vecmath.h), so the kernels see the very
 * declarations the runtime was compiled with. It therefore includes
 * nothing of kiln's and only <stddef.h> and <stdint.h>: generated code
 * links against libm and libgomp alone.
 *
 *   KilnView      a strided view of an extern's operand (the library calls
 *                 it ExtView)
 *   KilnEpilogue  the pointwise ops fused into an extern call (ExtEpilogue)
 *   KilnRT        the extern kernels, passed to the generated entry point
 *                 as function pointers
 *   KilnProf      the profiler's hook (NULL in KilnRT when not profiling)
 *   kiln_philox4x32, kiln_rand
 *                 the random stream: element i of rand(seed) is a function
 *                 of (seed, i) alone, so fused and interpreted random agree
 *                 bit for bit whatever the order or the thread count
 */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stddef.h>
#include <stdint.h>

/* The highest rank of a view (kiln.h's KILN_MAX_RANK; base.h asserts they
 * are equal). */
#define KILN_RT_MAX_RANK 8

/* A strided view: element (i0..ik) at data[offset + sum i_d*stride_d]. A
 * broadcast dim has stride 0. */
typedef struct {
    int rank;
    int64_t shape[KILN_RT_MAX_RANK];
    int64_t stride[KILN_RT_MAX_RANK];
    int64_t offset;
} KilnView;

/* An extern's epilogue: the fused pointwise ops on the flat output
 * elements [start, start + count) of c (the whole output), called by the
 * library on each block right after computing it, from one thread or from
 * several on disjoint ranges; it must not start threads itself. */
typedef void (*KilnEpilogue)(void *ctx, float *c, int64_t start, int64_t count);

/* The profiler (runtime/profile.c): when KilnRT.prof is set, kiln_entry
 * calls prof->hook(prof, k, KILN_PROF_BEGIN) and (..., KILN_PROF_END)
 * around call k on the thread that runs it, and every thread of a
 * generated kernel's parallel region calls it with KILN_PROF_THREAD_BEGIN
 * and KILN_PROF_THREAD_END around its share of the loop. The hook may be
 * called from several threads at once. */
typedef struct KilnProf KilnProf;
struct KilnProf {
    void (*hook)(KilnProf *self, int call, int event);
};
enum { KILN_PROF_BEGIN, KILN_PROF_END, KILN_PROF_THREAD_BEGIN, KILN_PROF_THREAD_END };

/* Extern kernels, passed in by the runtime. An extern call with fused
 * pointwise consumers passes its epilogue (`epi_<k>_cb`, with kiln_entry's
 * bufs as ctx) and the library calls it on each output block it
 * completes; without one it passes NULL, NULL. Each returns 0, or nonzero
 * on failure (KILN_RT_ERR_INPUT: bad input, err says why). */
typedef struct {
    int (*mm)(const float *a, const KilnView *av, const float *b, const KilnView *bv, float *c,
              int crank, const int64_t *cshape, KilnEpilogue epi, void *ctx);
    int (*conv2d)(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                  const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                  KilnEpilogue epi, void *ctx);
    int (*gather)(const float *data, const KilnView *dv, const float *idx, const KilnView *iv,
                  int axis, float *out, KilnEpilogue epi, void *ctx, char *err, size_t errlen);
    int (*conv_transpose2d)(const float *x, const int64_t xs[4], const float *w,
                            const int64_t ws[4], const float *bias, float *y, const int64_t ys[4],
                            const int64_t attr[9], KilnEpilogue epi, void *ctx);
    char *err;     /* a run's message buffer: where an extern that finds */
    size_t errlen; /* bad input says why */
    /* conv2d whose weight operand is a compile-time constant (a weight
     * buffer, dense): the library may keep its reordered copy across
     * calls. */
    int (*conv2d_const)(const float *x, const int64_t xs[4], const float *w, const int64_t ws[4],
                        const float *bias, float *y, const int64_t ys[4], const int64_t attr[7],
                        KilnEpilogue epi, void *ctx);
    /* mm whose b is a compile-time constant (a weight buffer, any view):
     * the library may keep b in its own layout across calls. */
    int (*mm_const)(const float *a, const KilnView *av, const float *b, const KilnView *bv,
                    float *c, int crank, const int64_t *cshape, KilnEpilogue epi, void *ctx);
    KilnProf *prof; /* NULL: not profiling */
    /* mm on f64 operands and result (no epilogue: f64 work never fuses
     * into an extern call) */
    int (*mm64)(const double *a, const KilnView *av, const double *b, const KilnView *bv, double *c,
                int crank, const int64_t *cshape);
    /* control flow: run the sub-programs of call `site` (the calling
     * buffer's id) of the running program `prog` on its packed operand in,
     * writing its packed value out (floats or doubles, by the call's
     * dtype); returns as the kernels do */
    int (*call)(void *prog, int site, const void *in, void *out, char *err, size_t errlen);
    void *prog;
} KilnRT;

/* What the generated entry point returns when an extern kernel found bad
 * input (rt->err says why); other nonzero values: an extern kernel or a
 * scratch allocation failed. */
#define KILN_RT_ERR_INPUT 2

/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1,
 * 2, 3", SC'11): four random words for (seed, counter), with no state. */
static inline void kiln_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Element `counter` of the uniform [0, 1) stream of seed: word 0's top 24
 * bits, so every value is exactly representable. */
static inline float kiln_rand(uint64_t seed, uint64_t counter) {
    uint32_t w[4];
    kiln_philox4x32(seed, counter, w);
    return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}

#endif
